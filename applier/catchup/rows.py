"""Decoded events as Arrow columns, and back: the data the catch-up's Spark stages pass around.

The executors decode Kafka records with the daemon's :func:`decode_record` and append each event
to a :class:`BatchBuilder`; the writers rebuild :class:`RowEvent` objects from the columns and hand
them to ``sqlgen.plan_table``. In between, Spark only filters, shuffles and caches rows, so row
images travel as opaque pickled blobs: nothing in the JVM needs to understand them.

One Arrow row per event (:data:`SPARK_SCHEMA`):

- ``kind``: ROW, DDL, RESOLVED, or STATS (one per input range: ``off`` = records read there,
  ``ts`` = row events decoded, so the driver counts what was read without another pass; and one
  with ``scm``/``tbl`` and zero counts per table the table filter dropped events of, so the
  driver says once which tables were filtered out);
- ``part``, ``off``, ``idx``: where the event came from (partition id, offset, index in the record;
  the partition id is a slot with several topics: ``applier.catchup.offsets``, and events rebuilt
  from the columns get the real topic and partition back from ``places``);
- rows: ``ts`` (commit ts), ``scm``/``tbl``, ``op`` (RowKind), ``keyed`` (some image has a
  handle-key column), ``hkey`` (the handle key, pickled (names, values): what the writers are
  partitioned by) and ``img`` (pickled images: the new image of an upsert, the handle-key
  columns of a delete's old image, both full images of a keyless row);
- DDLs: ``ts``, ``scm``, ``tbl``, ``ddl_q``, ``ddl_t``;
- ``skel``: the row belongs to the *skeleton* the driver replays through the daemon's
  ``PartitionListener`` (see :mod:`applier.catchup.replay`): every control event, every keyless
  row, and for keyed rows the first and last of each table in each record (all of them when their
  commit ts decrease inside the record) — enough for the listener to know whether a record still
  holds a row above R (its resume offset), at a fraction of the volume;
- ``rec``: a digest of a record holding keyless rows (the listener's byte-identical-record rule);
- ``lo``: the smallest commit ts of the ops a collapsed row stands for (its own ts otherwise).

A keyed row at or below the highest resolved ts already read from its partition is a replayed
copy of a row read before: the daemon's listener drops it (its rule 2), and so do the readers,
keeping only its skeleton stub. A DDL implies nothing about other tables' rows.

Skeleton stubs of keyed rows never carry images: the rows the writers apply are separate rows
(``skel`` false). With ``collapse_upto`` B, the reader already keeps only the last op of each
handle key among the ops at or below B it read (its share of the stream): picking the last op is
associative, so the writers, picking among those winners, reach the same final state, and Spark
moves a fraction of the rows. B must be at or below the window's end R (the driver takes the
smallest partition resolved ts found in the partitions' tails before the scan), or an op above
R could hide the last op at or below R of the same key. Ops above B travel one by one. Ops are
never merged across a DDL record of the range; should a range still hold rows of two epochs
without the DDL between them (a replay sent out of order), ``lo`` shows it and the driver reads
the backlog again without collapsing (see ``job``).

An UPDATE that moves a row to another handle key becomes a DELETE of the old key and an INSERT of
the new one at the same commit ts: exactly the two ops ``sqlgen.plan_table`` makes of it, but now
each belongs to one key, so the writers can be partitioned by key. Keyed rows at or below the
catch-up's lower bound are never applied: they are sent only when they are part of the skeleton,
and without their images.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

import applier.codec.events as codec_events
from applier.codec.events import Position, RowEvent, RowKind
from applier.large_messages.errors import LargeMessageNotConfigured
from applier.stream.window import is_keyless

if TYPE_CHECKING:  # annotations only
    from applier.codec.events import Event, Row

ROW, DDL, RESOLVED, STATS = 1, 2, 3, 0

SPARK_SCHEMA = (
    "kind tinyint, part int, off bigint, idx int, ts bigint, scm string, tbl string, op tinyint, "
    "keyed boolean, skel boolean, hkey binary, img binary, ddl_q string, ddl_t int, rec binary, lo bigint"
)
ARROW_SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),
        ("part", pa.int32()),
        ("off", pa.int64()),
        ("idx", pa.int32()),
        ("ts", pa.int64()),
        ("scm", pa.string()),
        ("tbl", pa.string()),
        ("op", pa.int8()),
        ("keyed", pa.bool_()),
        ("skel", pa.bool_()),
        ("hkey", pa.binary()),
        ("img", pa.binary()),
        ("ddl_q", pa.string()),
        ("ddl_t", pa.int32()),
        ("rec", pa.binary()),
        ("lo", pa.int64()),
    ]
)
_COLUMNS = tuple(ARROW_SCHEMA.names)
_PICKLE = pickle.HIGHEST_PROTOCOL
_INSERT, _UPDATE, _DELETE = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE
_MAX_TS = (1 << 63) - 1

Places = Mapping[int, tuple[str, int]]
"""Several topics: the Kafka topic and partition of each partition id (slot) the job reads."""


def position(topic: str, part: int, off: int, idx: int, places: Places | None = None) -> Position:
    """Where an event was read, for messages and the daemon's order of ops: the real topic and
    partition of ``part`` when ``places`` names it, else ``topic`` and ``part`` (one topic)."""
    where = places.get(part) if places else None
    return Position(topic, part, off, idx) if where is None else Position(where[0], where[1], off, idx)


def dump_images(new: Row | None, old: Row | None, row_id: int | None = None) -> bytes:
    """Both images, pickled as they are (dicts of Column dicts): C-speed both ways, and the
    writers get back exactly the objects ``plan_table`` takes, with no conversion. A keyless row's
    ``rid`` travels along: it is what tells a replayed copy from a second identical row."""
    return pickle.dumps((new, old) if row_id is None else (new, old, row_id), _PICKLE)


def load_images(blob: bytes) -> tuple[Row | None, Row | None, int | None]:
    """(new, old, rid) of a blob made by ``dump_images`` (or a bare ``(new, old)`` pickle)."""
    images = pickle.loads(blob)
    return images[0], images[1], images[2] if len(images) > 2 else None


def handle_key(row: Row) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """(names, values) of the handle-key columns of an image, in image order."""
    names = tuple(codec_events.handle_key_names(row))
    return names, tuple(row[n]["v"] for n in names)


def old_handle_key(old: Row, new: Row, new_key: tuple[tuple[str, ...], tuple[Any, ...]]) -> tuple:
    """The key of an update's old image; key columns it lacks come from the new image.

    The same rule ``sqlgen.collapse`` applies to updates, so a key change is recognised alike.
    """
    key = handle_key(old)
    if key[0] == new_key[0] or not new_key[0]:
        return key
    return new_key[0], tuple(old[n]["v"] if n in old else new[n]["v"] for n in new_key[0])


def key_only(row: Row, names: Sequence[str]) -> Row:
    """The handle-key columns of ``row`` (all a keyed delete needs), key columns it lacks skipped."""
    return {n: row[n] for n in names if n in row}


def record_digest(key: bytes | None, value: bytes | None) -> bytes:
    """What identifies a byte-identical copy of a record (the listener hashes what it is given)."""
    h = hashlib.blake2b(key or b"", digest_size=16)
    h.update(b"\x00")
    h.update(value or b"")
    return h.digest()


class BatchBuilder:
    """Accumulates events as Arrow columns; ``flush()`` returns a RecordBatch and starts anew.

    ``lower_ts``: keyed rows at or below it are not applied by this catch-up, so they are only
    emitted as skeleton rows, without images or key (see the module docstring).
    """

    def __init__(self, lower_ts: int, *, collapse_upto: int | None = None, max_keys: int = 200_000) -> None:
        self.lower_ts = lower_ts
        self.collapse_upto = collapse_upto
        self.max_keys = max_keys
        self._rows: list[tuple[Any, ...]] = []
        # collapse: (segment, schema, table) -> key -> [ts, prio, part, off, idx, op, new, old, lo]
        self._best: dict[tuple[int, str, str], dict[tuple[Any, ...], list[Any]]] = {}
        self._best_keys = 0
        self._segment = 0
        # per partition: highest resolved ts read so far
        self._obs: dict[int, int] = {}
        self._key_names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.records = 0
        self.row_events = 0

    def __len__(self) -> int:
        """Rows ready to flush (collapse winners join them when written out)."""
        return len(self._rows)

    def _append(
        self,
        kind: int,
        part: int,
        off: int,
        idx: int,
        ts: int,
        scm: str | None = None,
        tbl: str | None = None,
        op: int | None = None,
        keyed: bool | None = None,
        skel: bool = True,
        hkey: bytes | None = None,
        img: bytes | None = None,
        ddl_q: str | None = None,
        ddl_t: int | None = None,
        rec: bytes | None = None,
    ) -> None:
        self._rows.append(
            (kind, part, off, idx, ts, scm, tbl, op, keyed, skel, hkey, img, ddl_q, ddl_t, rec, ts)
        )

    def _key(self, row: Row) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """``handle_key(row)`` with the key column names cached per image column list (the flags
        only change with a DDL, so a column list identifies its key columns)."""
        cols = tuple(row)
        names = self._key_names.get(cols)
        if names is None:
            names = self._key_names[cols] = handle_key(row)[0]
        return names, tuple([row[n]["v"] for n in names])

    def add_record(
        self, partition: int, offset: int, events: Sequence[Event], raw: tuple[bytes | None, bytes | None]
    ) -> None:
        """Append the events of one decoded record (raises LargeMessageNotConfigured like the daemon)."""
        self.records += 1
        rows: list[tuple[int, RowEvent, bool]] = []
        replayed: list[bool] = []
        obs = self._obs.get(partition)
        for i, ev in enumerate(events):
            if isinstance(ev, RowEvent):
                if ev.commit_ts > _MAX_TS:
                    raise ValueError(f"commit ts {ev.commit_ts} at partition {partition} offset {offset}")
                rows.append((i, ev, not is_keyless(ev)))
                replayed.append(obs is not None and ev.commit_ts <= obs)
            elif isinstance(ev, codec_events.ResolvedEvent):
                if obs is None or ev.ts > obs:
                    obs = ev.ts
                self._append(RESOLVED, partition, offset, i, min(ev.ts, _MAX_TS))
            elif isinstance(ev, codec_events.DDLEvent):
                # No resolved ts implied: rows of tables the DDL does not block may still follow
                # with a smaller ts (docs/open-protocol.md §5.4).
                self._segment += 1  # never collapse across a DDL record (see module docstring)
                self._append(DDL, partition, offset, i, ev.commit_ts, ev.schema, ev.table,
                             ddl_q=ev.query, ddl_t=ev.ddl_type)  # fmt: skip
            elif isinstance(ev, codec_events.LargeMessageEvent):
                raise LargeMessageNotConfigured(ev)
            else:  # pragma: no cover - the decoder returns nothing else
                raise TypeError(f"not a decoded event: {type(ev).__name__}")
        if obs is not None:
            self._obs[partition] = obs
        if not rows:
            return
        self.row_events += len(rows)
        skel = _skeleton_marks(rows)
        digest = record_digest(*raw) if any(not keyed for _i, _ev, keyed in rows) else None
        for (i, ev, keyed), in_skel, replay in zip(rows, skel, replayed, strict=True):
            if keyed:
                self._add_keyed(partition, offset, i, ev, in_skel, replay)
            else:
                img = dump_images(ev.new, ev.old, ev.row_id) if ev.commit_ts > self.lower_ts else None
                self._append(
                    ROW,
                    partition,
                    offset,
                    i,
                    ev.commit_ts,
                    ev.schema,
                    ev.table,
                    int(ev.kind),
                    False,
                    True,
                    None,
                    img,
                    rec=digest,
                )

    def _add_keyed(
        self, part: int, off: int, i: int, ev: RowEvent, in_skel: bool, replay: bool = False
    ) -> None:
        ts = ev.commit_ts
        if in_skel:  # a stub: the skeleton needs no image
            self._rows.append(
                (ROW, part, off, i, ts, ev.schema, ev.table, int(ev.kind), True, True,
                 None, None, None, None, None, ts)
            )  # fmt: skip
        if ts <= self.lower_ts or replay:
            return  # already downstream, or a replayed copy of a row read before (the daemon's rule 2)
        kind, new, old = ev.kind, ev.new, ev.old
        if kind is _DELETE:
            assert old is not None, "the decoder always gives a delete its old image"
            key = self._key(old)
            self._op(part, off, i, ev, _DELETE, key, None, key_only(old, key[0]))
            return
        assert new is not None, "the decoder always gives an insert/update its new image"
        key = self._key(new)
        if kind is _UPDATE and old is not None:
            okey = self._key(old)
            if okey[0] != key[0] and key[0]:
                okey = old_handle_key(old, new, key)
            if okey != key:
                # The same two ops plan_table makes of a key change, now one per key.
                self._op(part, off, i, ev, _DELETE, okey, None, key_only(old, okey[0]))
                self._op(part, off, i, ev, _INSERT, key, new, None)
                return
        self._op(part, off, i, ev, kind, key, new, None)

    def _op(
        self,
        part: int,
        off: int,
        i: int,
        ev: RowEvent,
        kind: RowKind,
        key: tuple,
        new: Row | None,
        old: Row | None,
    ) -> None:
        """One op on one key: written out as a row, or (collapse) kept if it wins over the key's last.

        The winner of a key is its op with the greatest (commit ts, delete 0 / upsert 1), a later
        arrival winning ties: the op ``plan_table``'s stable sort puts last. Keeping only winners of
        a part of the stream and letting the writers pick among them gives the same final state.
        """
        ts = ev.commit_ts
        if self.collapse_upto is None or ts > self.collapse_upto:
            self._rows.append(
                (ROW, part, off, i, ts, ev.schema, ev.table, int(kind), True, False,
                 pickle.dumps(key, _PICKLE), pickle.dumps((new, old), _PICKLE), None, None, None, ts)
            )  # fmt: skip
            return
        prio = 0 if kind is _DELETE else 1
        group = (self._segment, ev.schema, ev.table)
        best = self._best.get(group)
        if best is None:
            best = self._best[group] = {}
        cur = best.get(key)
        if cur is None:
            best[key] = [ts, prio, part, off, i, kind, new, old, ts]
            self._best_keys += 1
            if self._best_keys >= self.max_keys:
                self._flush_best()
        elif ts > cur[0] or (ts == cur[0] and prio >= cur[1]):
            lo = cur[8]
            cur[:] = [ts, prio, part, off, i, kind, new, old, lo if lo < ts else ts]
        elif ts < cur[8]:
            cur[8] = ts

    def _flush_best(self) -> None:
        dumps = pickle.dumps
        append = self._rows.append
        for (_seg, scm, tbl), best in self._best.items():
            for key, (ts, _prio, part, off, i, kind, new, old, lo) in best.items():
                append(
                    (ROW, part, off, i, ts, scm, tbl, int(kind), True, False,
                     dumps(key, _PICKLE), dumps((new, old), _PICKLE), None, None, None, lo)
                )  # fmt: skip
        self._best = {}
        self._best_keys = 0

    def add_stats(self, partition: int, filtered: Iterable[tuple[str, str]] = ()) -> None:
        """The range's counters row (kind STATS): ``off`` = records read, ``ts`` = row events; and
        a STATS row with zero counts naming each table (``tbl`` empty: schema) ``filtered`` out."""
        self._append(STATS, partition, self.records, 0, self.row_events)
        for schema, table in sorted(filtered):
            self._append(STATS, partition, 0, 0, 0, schema, table)

    def flush(self, final: bool = False) -> pa.RecordBatch:
        """The rows so far as one batch; ``final`` also writes out the collapse winners."""
        if final and self._best:
            self._flush_best()
        rows, self._rows = self._rows, []
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in _COLUMNS]
        arrays = [pa.array(col, type=field.type) for col, field in zip(columns, ARROW_SCHEMA, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _skeleton_marks(rows: Sequence[tuple[int, RowEvent, bool]]) -> list[bool]:
    """Which rows of one record go into the skeleton (module docstring): keyless rows always;
    per table the first and last keyed row when their commit ts never decrease, else all."""
    marks = [not keyed for _i, _ev, keyed in rows]
    by_table: dict[tuple[str, str], list[int]] = {}
    for j, (_i, ev, keyed) in enumerate(rows):
        if keyed:
            by_table.setdefault((ev.schema, ev.table), []).append(j)
    for positions in by_table.values():
        ordered = all(
            rows[positions[k]][1].commit_ts <= rows[positions[k + 1]][1].commit_ts
            for k in range(len(positions) - 1)
        )
        if ordered:
            marks[positions[0]] = True
            marks[positions[-1]] = True
        else:
            for j in positions:
                marks[j] = True
    return marks


def rebuild_row_events(
    batch: pa.RecordBatch | pa.Table, topic: str, places: Places | None = None
) -> Iterable[tuple[tuple[str, str], RowEvent]]:
    """((schema, table), RowEvent) of every ROW row that carries images, in batch order (positions:
    :func:`position`)."""
    names = ("part", "off", "idx", "ts", "scm", "tbl", "op", "img")
    kinds = {int(k): RowKind(k) for k in RowKind}
    for part, off, idx, ts, scm, tbl, op, img in zip(
        *(batch.column(name).to_pylist() for name in names), strict=True
    ):
        if img is None:
            continue
        new, old, rid = load_images(img)
        yield (
            (scm, tbl),
            RowEvent(ts, scm, tbl, kinds[op], new, old, None, position(topic, part, off, idx, places), rid),
        )

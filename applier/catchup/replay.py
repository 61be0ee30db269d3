"""The driver's pass over the skeleton: the daemon's own replay rules, per Kafka partition, in order.

Keyed rows need no replay detection here: a replayed copy carries the same image at the same
commit ts, and the writers collapse every key to its last op by (commit ts, delete before insert),
so copies change nothing. Keyless rows are different: an INSERT applied twice leaves two rows, and
telling a replayed copy from a second identical row needs the resolved ts read so far and the
row's ``rid`` (docs/open-protocol.md §5.3, §5.6; ``applier.stream.listener`` rules 2-4). Rather than
re-implement that, the driver feeds each partition's skeleton (:mod:`applier.catchup.rows`) to a
real :class:`~applier.stream.listener.PartitionListener`, record by record in offset order:

- keyless rows come with their images and are kept or dropped exactly as the daemon would;
- keyed rows come as light stubs (real commit ts and table, a one-column handle-key image) so the
  resolved-horizon and resume-offset bookkeeping sees every record that holds a row. Their
  tables' skip threshold is set to R, so stubs at or below R are counted and forgotten; stubs
  above R stay cached, which is what makes ``resume_offset`` point at the first record holding an
  unapplied keyed row.

With several topics, a partition that counts as resolved at a ts at its end (``drained``: a
quiet topic, :mod:`applier.catchup.offsets`) is told so after its last record, as the daemon's
drain probe tells its listener (``PartitionListener.observe_drained``).

After the pass, the kept keyless rows at or below R are the ones to apply, and marking R applied
(with the DDLs up to R) gives each listener's ``resume_offset``: the daemon's own answer to "where
does a restarted daemon read from so that nothing above R is skipped", moved back to the record
of the resolved ts in force there so that a daemon started there drops the same copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from applier.catchup.epochs import Control, ddl_event
from applier.catchup.rows import DDL, RESOLVED, ROW, STATS, Places, load_images, position
from applier.codec.events import FLAG_HANDLE_KEY, ROW_KINDS, Event, ResolvedEvent, Row, RowEvent
from applier.stream.listener import PartitionListener
from applier.stream.progress import DDLKey, SharedProgress, TableKey
from checkpoint import Checkpoint

_KEYED_STUB: Row = {"_": {"t": 3, "f": FLAG_HANDLE_KEY, "v": None}}
_KEYLESS_STUB: Row = {"_": {"t": 3, "f": 0, "v": None}}
SKELETON_COLUMNS = (
    "kind",
    "part",
    "off",
    "idx",
    "ts",
    "scm",
    "tbl",
    "op",
    "keyed",
    "img",
    "ddl_q",
    "ddl_t",
    "rec",
)


@dataclass
class Skeleton:
    """The skeleton rows collected from the scan, sorted by (partition, offset, index).

    ``table`` is read only by :func:`replay_skeleton`; :meth:`drop_rows` frees it after that pass
    (at 10M events it is the driver's largest object, and the writers run next).
    """

    table: pa.Table | None
    controls: list[Control] = field(default_factory=list)
    records_read: int = 0
    row_events: int = 0
    data_rows: int = 0  # rows the readers wrote for the writers
    keyed_tables: set[TableKey] = field(default_factory=set)
    keyless_tables: set[TableKey] = field(default_factory=set)
    filtered_tables: set[TableKey] = field(default_factory=set)  # by the table filter (tbl '': schema)

    @classmethod
    def from_arrow(cls, table: pa.Table, topic: str, places: Places | None = None) -> Skeleton:
        """The skeleton of ``table`` (skeleton rows, in any order, in any number of chunks).

        One copy of the rows is made (the sorted body, by one ``take``); the caller's ``table`` can
        go once this returns. Tables and controls are read with Arrow, never row by row in Python.
        """
        is_stats = pc.equal(table["kind"], STATS)
        stats = table.filter(is_stats)
        order = pc.sort_indices(table, [("part", "ascending"), ("off", "ascending"), ("idx", "ascending")])
        order = order.filter(pc.invert(pc.take(is_stats, order)))
        body = table.select(list(SKELETON_COLUMNS)).take(order)
        del order, is_stats
        sk = cls(body)
        sk.records_read = int(pc.sum(stats["off"]).as_py() or 0)
        sk.row_events = int(pc.sum(stats["ts"]).as_py() or 0)
        sk.data_rows = int(pc.sum(stats["idx"]).as_py() or 0)
        named = stats.filter(pc.is_valid(stats["scm"]))
        sk.filtered_tables = set(zip(named["scm"].to_pylist(), named["tbl"].to_pylist(), strict=True))
        ctl = body.filter(pc.not_equal(body["kind"], ROW))
        c = {
            name: ctl[name].to_pylist()
            for name in ("kind", "part", "off", "idx", "ts", "scm", "tbl", "ddl_q", "ddl_t")
        }
        for i in range(ctl.num_rows):
            p, off, idx, ts = c["part"][i], c["off"][i], c["idx"][i], c["ts"][i]
            ddl = None
            if c["kind"][i] == DDL:
                ddl = ddl_event(
                    p, off, idx, ts, c["scm"][i], c["tbl"][i], c["ddl_q"][i], c["ddl_t"][i], topic, places
                )
            sk.controls.append(Control(p, off, idx, ts, ddl))
        rows = body.filter(pc.equal(body["kind"], ROW)).select(["scm", "tbl", "keyed"])
        seen = rows.group_by(["scm", "tbl", "keyed"]).aggregate([])
        for scm, tbl, keyed in zip(*(seen[n].to_pylist() for n in ("scm", "tbl", "keyed")), strict=True):
            (sk.keyed_tables if keyed else sk.keyless_tables).add((scm, tbl))
        return sk

    def drop_rows(self) -> None:
        """Free the skeleton rows (after :func:`replay_skeleton`); the counts, tables and controls stay."""
        self.table = None
        pa.default_memory_pool().release_unused()


@dataclass
class ReplayResult:
    """What the pass decided."""

    keyless_rows: list[RowEvent]  # kept keyless rows with commit ts <= R: ts order, then partition order
    resume_offsets: dict[int, int]
    partition_resolved: dict[int, int]
    replayed_keyless: int = 0


def replay_skeleton(
    skeleton: Skeleton,
    *,
    topic: str,
    starts: Mapping[int, int],
    lower: int,
    upper: int,
    table_floor: Mapping[TableKey, int],
    applied_ddls: Iterable[DDLKey],
    executed_ddls: Iterable[DDLKey],
    drained: Mapping[int, tuple[int, int]] | None = None,
    places: Places | None = None,
) -> ReplayResult:
    """Run the partitions' skeletons through listeners (module docstring).

    ``starts``: the offset each partition was read from; ``lower``: rows at or below it are already
    downstream; ``upper``: R; ``table_floor``: per-table checkpoint ts (rows at or below skipped);
    ``applied_ddls``: DDLs recorded before this run; ``executed_ddls``: the DDLs this run executes;
    ``drained``: partition -> (the end it was read to, the resolved ts it counts as there);
    ``places``: the topic and partition of each partition id, for positions (several topics).
    """
    mixed = skeleton.keyed_tables & skeleton.keyless_tables
    if mixed:
        names = ", ".join(f"{s}.{t}" for s, t in sorted(mixed))
        raise ValueError(
            f"tables with and without a handle key in the same backlog ({names}): a DDL changed their "
            "key; apply this backlog with `applier run` instead"
        )
    table_ts = dict(table_floor)
    for t in skeleton.keyed_tables:
        table_ts[t] = max(table_ts.get(t, 0), upper)
    progress = SharedProgress(
        Checkpoint(resolved_ts=lower, tables=table_ts, applied_ddls=frozenset(applied_ddls))
    )
    listeners = {p: PartitionListener(p, progress, off) for p, off in starts.items()}
    tab = skeleton.table
    if tab is None:
        raise ValueError("the skeleton's rows were dropped before its replay")
    kinds = ROW_KINDS
    for (part, off), rows in groupby(_skeleton_rows(tab), key=_record_of):
        pos = position(topic, part, off, 0, places)
        events: list[Event] = []
        digest = None
        for kind, _part, _off, idx, ts, scm, tbl, op, keyed, img, ddl_q, ddl_t, rec in rows:
            if kind == ROW:
                if keyed:
                    events.append(RowEvent(ts, scm, tbl, kinds[op], _KEYED_STUB, None, None, pos))
                else:
                    new, old, rid = load_images(img) if img is not None else (_KEYLESS_STUB, None, None)
                    events.append(RowEvent(ts, scm, tbl, kinds[op], new, old, None, pos, rid))
                    digest = rec
            elif kind == RESOLVED:
                events.append(ResolvedEvent(ts, pos))
            elif kind == DDL:
                events.append(ddl_event(part, off, idx, ts, scm, tbl, ddl_q, ddl_t, topic, places))
        listener = listeners.get(part)
        if listener is None:
            raise ValueError(f"skeleton holds partition {part}, which was not planned")
        listener.feed(off, events, 0, (digest, b"") if digest is not None else None)
    for p, (end, ts) in sorted((drained or {}).items()):
        listeners[p].observe_drained(end, ts)  # after its last record, as the daemon's probe

    kept: list[RowEvent] = []
    for p in sorted(listeners):
        kept.extend(listeners[p].rows_upto(upper))
    kept.sort(key=lambda r: r.commit_ts)
    replayed = sum(lst.stats.rows_replayed for lst in listeners.values())
    progress.applied_ts = max(progress.applied_ts, upper)
    progress.applied_ddls.update(executed_ddls)
    progress.prune()
    for lst in listeners.values():
        lst.discard_applied()
    resume: dict[int, int] = {}
    for p, lst in listeners.items():
        r = lst.resume_offset()
        resume[p] = starts[p] if r is None else r
    return ReplayResult(
        keyless_rows=kept,
        resume_offsets=resume,
        partition_resolved={p: lst.resolved for p, lst in listeners.items()},
        replayed_keyless=replayed,
    )


REPLAY_CHUNK_ROWS = 65_536
"""Skeleton rows turned into Python objects at a time: the whole skeleton at once (13 columns of
640,000 rows at 10M events) took the driver's memory up by hundreds of MB."""


def _skeleton_rows(tab: pa.Table) -> Iterator[tuple[Any, ...]]:
    """The rows of ``tab`` (the skeleton's columns, :data:`SKELETON_COLUMNS`) as tuples, a chunk at a time."""
    for batch in tab.to_batches(max_chunksize=REPLAY_CHUNK_ROWS):
        yield from zip(*(col.to_pylist() for col in batch.columns), strict=True)


def _record_of(row: tuple[Any, ...]) -> tuple[int, int]:
    """The (partition, offset) of a skeleton row: the record it came from."""
    return row[1], row[2]

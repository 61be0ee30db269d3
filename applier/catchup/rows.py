"""Decoded events as Arrow columns, and back: the data the catch-up's Spark stages pass around.

The executors decode Kafka records with the daemon's :func:`decode_record` and append each event
to a ``BatchBuilder`` (:mod:`applier.catchup._batch_builder`, compiled: it is the scan's hot loop);
the writers rebuild :class:`RowEvent` objects and hand them to ``sqlgen.plan_table``. In between,
Spark only filters, caches and shuffles rows, and it does that row by row in the JVM: so what it
carries in bulk travels as a few large opaque rows (pickles, Arrow IPC streams) that nothing in the
JVM needs to understand, and Python handles the contents at C speed on both ends.

One Arrow row per item (:data:`SPARK_SCHEMA`):

- ``kind`` ROWS: the rows for the writers of one flush of a reader that fall in one *writer
  bucket*, as one pickled list of writer rows (:data:`WRITER_ROW`) in ``img``; ``idx`` = the
  bucket, ``off`` = how many rows, ``ts``/``lo`` = their highest commit ts and lowest ``lo``
  (an epoch's writers skip the ROWS rows outside it unread). A row's bucket comes from a CRC of
  its pickled (schema, table, handle key), or, for a key of one integer column, of the run of
  1,024 consecutive values it is in (neighbouring keys share a bucket and are written together:
  ``_batch_builder._bucket``), the same in every reader, so a key's rows from every reader meet
  in one bucket, and the writers are partitioned by bucket. A writer row holds an
  upsert's new image as its layout and a tuple of values (an ``ImageShape``, shared by the
  bucket's rows and so pickled once, as ``CompactImage`` holds it), a delete's handle-key
  columns as a small image;
- ``kind`` BUNDLE: the skeleton rows of one flush of a reader, as one Arrow IPC stream (of this
  schema) in ``img``; the skeleton is only ever collected by the driver. :func:`unbundle` opens
  them. The rows inside a bundle, one per event:
- ``kind`` ROW, DDL, RESOLVED, or STATS (one per input range: ``off`` = records read there,
  ``ts`` = row events decoded, ``idx`` = rows it wrote for the writers, so the driver counts what
  was read and sizes the writers without another pass; and one
  with ``scm``/``tbl`` and zero counts per table the table filter dropped events of, so the
  driver says once which tables were filtered out);
- ``part``, ``off``, ``idx``: where the event came from (partition id, offset, index in the record;
  the partition id is a slot with several topics: ``applier.catchup.offsets``, and events rebuilt
  from the columns get the real topic and partition back from ``places``);
- rows: ``ts`` (commit ts), ``scm``/``tbl``, ``op`` (RowKind), ``keyed`` (some image has a
  handle-key column) and, for keyless rows only, ``img`` (both images pickled);
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

Skeleton stubs of keyed rows never carry images: the rows the writers apply are the writer rows.
With ``collapse_upto`` B, the reader already keeps only the last op of each
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

import bisect
import hashlib
import pickle
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

import applier.codec.events as codec_events
from applier.codec.events import ROW_KINDS, CompactImage, Position, RowEvent

if TYPE_CHECKING:  # annotations only
    from applier.codec.events import Row

ROW, DDL, RESOLVED, STATS, BUNDLE, ROWS = 1, 2, 3, 0, 4, 5

SPARK_SCHEMA = (
    "kind tinyint, part int, off bigint, idx int, ts bigint, scm string, tbl string, op tinyint, "
    "keyed boolean, skel boolean, img binary, ddl_q string, ddl_t int, rec binary, lo bigint"
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
        ("img", pa.binary()),
        ("ddl_q", pa.string()),
        ("ddl_t", pa.int32()),
        ("rec", pa.binary()),
        ("lo", pa.int64()),
    ]
)
_COLUMNS = tuple(ARROW_SCHEMA.names)

WRITER_ROW = (
    "ts", "prio", "part", "off", "idx", "scm", "tbl", "op",
    "key_names", "key_values", "shape", "values", "old", "lo",
)  # fmt: skip
"""The fields of a writer row, a plain tuple in a ROWS row's pickled list (module docstring):
``prio`` 0 for a delete, 1 for an upsert; ``shape`` and ``values`` the new image (an
``ImageShape`` and a tuple of values; None for a delete); ``old`` the delete's handle-key
columns as a decoded image (None for an upsert); ``lo`` as the column of that name."""
_PICKLE = pickle.HIGHEST_PROTOCOL

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


def record_digest(key: bytes | None, value: bytes | None) -> bytes:
    """What identifies a byte-identical copy of a record (the listener hashes what it is given)."""
    h = hashlib.blake2b(key or b"", digest_size=16)
    h.update(b"\x00")
    h.update(value or b"")
    return h.digest()


def rows_batch(rows: Sequence[tuple[Any, ...]]) -> pa.RecordBatch:
    """Tuples in the column order of :data:`ARROW_SCHEMA` as one record batch."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in _COLUMNS]
    arrays = [pa.array(col, type=field.type) for col, field in zip(columns, ARROW_SCHEMA, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def bundle_row(part: int, rows: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """One BUNDLE row holding ``rows`` (skeleton rows) as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ARROW_SCHEMA) as writer:
        writer.write_batch(rows_batch(rows))
    blob = sink.getvalue().to_pybytes()
    return (BUNDLE, part, 0, 0, 0, None, None, None, None, True, blob, None, None, None, 0)


def unbundle(table: pa.Table) -> pa.Table:
    """``table`` with each BUNDLE row replaced by the rows it holds (those first, then the rest).

    The result is chunked (a chunk per bundle): copying it into one chunk would hold the skeleton
    twice in the driver at once, and whoever reads it next sorts it (a copy anyway) or reads it
    chunk by chunk.
    """
    bundled = pc.equal(table["kind"], BUNDLE)
    inner = [pa.ipc.open_stream(blob).read_all() for blob in table.filter(bundled)["img"].to_pylist()]
    return pa.concat_tables([*inner, table.filter(pc.invert(bundled))])


def writer_rows(batch: pa.RecordBatch | pa.Table) -> Iterable[tuple[Any, ...]]:
    """The writer rows (:data:`WRITER_ROW`) of every ROWS row of ``batch``, in batch order."""
    for kind, img in zip(batch.column("kind").to_pylist(), batch.column("img").to_pylist(), strict=True):
        if kind == ROWS:
            yield from pickle.loads(img)


def rebuild_row_events(
    batch: pa.RecordBatch | pa.Table, topic: str, places: Places | None = None
) -> Iterable[tuple[tuple[str, str], RowEvent]]:
    """((schema, table), RowEvent) of every writer row (ROWS) and every ROW row that carries
    images, in batch order (positions: :func:`position`). A writer row's new image comes back as a
    :class:`CompactImage` of its layout and values, which planning reads directly."""
    names = ("kind", "part", "off", "idx", "ts", "scm", "tbl", "op", "img")
    kinds = ROW_KINDS
    for kind, part, off, idx, ts, scm, tbl, op, img in zip(
        *(batch.column(name).to_pylist() for name in names), strict=True
    ):
        if img is None or kind not in (ROW, ROWS):
            continue
        if kind == ROWS:
            yield from rebuild_writer_events([img], topic, places)
            continue
        new, old, rid = load_images(img)
        yield (
            (scm, tbl),
            RowEvent(ts, scm, tbl, kinds[op], new, old, None, position(topic, part, off, idx, places), rid),
        )


def rebuild_writer_events(
    blobs: Iterable[bytes], topic: str, places: Places | None = None
) -> Iterable[tuple[tuple[str, str], RowEvent]]:
    """((schema, table), RowEvent) of the writer rows pickled in ``blobs`` (ROWS rows' ``img``). A
    new image comes back as a :class:`CompactImage` of its layout and values, which planning reads
    directly."""
    for blob in blobs:
        for row in pickle.loads(blob):
            yield (row[5], row[6]), writer_event(row, topic, places)


def writer_event(row: tuple[Any, ...], topic: str, places: Places | None = None) -> RowEvent:
    """The :class:`RowEvent` of one writer row (:data:`WRITER_ROW`), its new image a
    :class:`CompactImage` of its layout and values."""
    ts, _prio, part, off, idx, scm, tbl, op, _kn, _kv, shape, vals, old, _lo = row
    new = None if shape is None else CompactImage(shape, vals)
    pos = position(topic, part, off, idx, places)
    return RowEvent(ts, scm, tbl, ROW_KINDS[op], new, old, None, pos, None, vals)


def straddling_rows(batch: pa.RecordBatch | pa.Table, uppers: Sequence[int]) -> int:
    """How many writer rows stand for ops of two epochs (``lo`` and ``ts`` on both sides of an
    epoch's upper bound, ``uppers`` ascending): see ``job``'s check after the scan."""
    count = 0
    for row in writer_rows(batch):
        ts, lo = row[0], row[13]
        if lo < ts and bisect.bisect_left(uppers, lo) != bisect.bisect_left(uppers, ts):
            count += 1
    return count

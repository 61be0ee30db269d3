"""Executor-side writes: one epoch's rows of one Spark partition, with the daemon's SQL and retry rules.

Keyed tables. The rows reach a writer partitioned by (schema, table, handle key), so every op of a
key (or, when the readers collapsed, every reader's last op of the key) is in one task. The task
rebuilds the events, orders them as the daemon does (commit ts; the
stable sort inside ``plan_table`` puts deletes before inserts at equal ts; Kafka position breaks
the remaining ties) and calls ``sqlgen.plan_table``, which collapses each key to its final state:
multi-row DELETEs, then multi-row REPLACEs (``sqlgen.table_statements``). Tasks run in parallel
and commit every ``commit_rows`` rows. That is safe because final states of one epoch are one
upstream snapshot: whatever subset of them is already written, by whichever task, writing the rest
(or all of them again) converges to the same table (``sqlgen.collapse`` explains why REPLACE of
final states cannot be broken by unique-key swaps or key changes). A transient error (deadlock
between two writers, lost connection) replays the current transaction after a reconnect; anything
else fails the task, and with it the job, naming the table, the statement kind and the first key.

Keyless tables. Their ops are not idempotent (an INSERT applied twice leaves two rows), so each
table's ops of an epoch are one transaction that also moves that table's checkpoint to the epoch's
end. Before writing, the transaction checks that checkpoint: if a previous attempt (or run) already
committed it, nothing is written. This makes a keyless table's epoch exactly-once even when a
COMMIT's outcome was lost with the connection.
"""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pymysql

from applier.apply.transaction import TransactionRunner
from applier.catchup.rows import writer_event
from applier.codec.events import FLAG_HANDLE_KEY, CompactImage, RowEvent
from applier.downstream.errors import error_code, is_transient
from applier.downstream.url import DownstreamConfig
from applier.errors import FatalError
from checkpoint import CheckpointStore
from checkpoint.schema import quote_ident
from sqlgen import (
    DeleteGroup,
    Dialect,
    Router,
    Statement,
    TablePlan,
    UpsertGroup,
    plan_table,
    statement_too_large,
    table_statements,
    upsert_group,
)

TableKey = tuple[str, str]


class WriteError(FatalError):
    """A permanent downstream error: retrying cannot help, the message says what was refused."""


@dataclass(frozen=True)
class WriteSpec:
    """What every writer task of one epoch needs (pickled into the tasks; holds no connection)."""

    downstream: DownstreamConfig
    dialect: Dialect
    topic: str
    epoch: int
    lower: int
    upper: int
    table_floor: dict[TableKey, int] = field(default_factory=dict)
    commit_rows: int = 20_000
    retry_seconds: float = 600.0
    checkpoint_schema: str = "ticdc_applier"
    changefeed: str = ""
    owner: str | None = None
    router: Router = field(default_factory=Router)
    """Route rules: rows go to the routed names; the table checkpoints keep the upstream ones."""
    places: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Several topics: the topic and partition of each partition id (rows' positions, messages)."""

    def skip(self, table: TableKey, ts: int) -> bool:
        """Is a row of ``table`` at ``ts`` outside this epoch or already applied?"""
        return not self.lower < ts <= self.upper or ts <= self.table_floor.get(table, 0)


@dataclass
class WriteStats:
    """What writer tasks did: row events planned, rows written by statement kind, transactions replayed."""

    events: int = 0
    deletes: int = 0
    replaces: int = 0
    inserts: int = 0
    retries: int = 0

    @property
    def rows(self) -> int:
        return self.deletes + self.replaces + self.inserts

    def add(self, other: Mapping[str, Any] | WriteStats) -> None:
        """Add another task's counters (a WriteStats, or its fields as a row)."""
        values = other.__dict__ if isinstance(other, WriteStats) else other
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + int(values.get(f.name) or 0))

    def add_plan(self, tp: TablePlan) -> None:
        counts = tp.row_counts()
        self.events += tp.events
        self.deletes += counts["delete"]
        self.replaces += counts["replace"]
        self.inserts += counts["insert"]


def _runner(spec: WriteSpec, stats: WriteStats) -> TransactionRunner:
    """The shared transaction unit (``applier.apply.transaction``), its retries counted in ``stats``."""

    def on_retry(_info: Any) -> None:
        stats.retries += 1

    return TransactionRunner(spec.downstream, max_time=spec.retry_seconds, on_retry=on_retry)


def _execute(cur: pymysql.cursors.Cursor, st: Statement, spec: WriteSpec) -> None:
    query = st.bound(cur.connection.escape)  # what execute() would bind, measured before it is sent
    too_large = statement_too_large(st, query, spec.dialect)
    if too_large is not None:  # the server would drop the session: a retry loop, not an error
        raise WriteError(f"{too_large}; epoch {spec.epoch} up to ts {spec.upper} is not checkpointed")
    try:
        cur.execute(query)
    except pymysql.MySQLError as exc:
        if is_transient(exc):
            raise
        raise WriteError(
            f"downstream refused {st.kind.upper()} on {st.schema}.{st.table} (first key {st.first_key!r}, "
            f"{st.rows} rows, epoch {spec.epoch} up to ts {spec.upper}): MySQL error {error_code(exc)}: "
            f"{exc.args[-1]}"
        ) from None


def _chunks(stmts: list[Statement], commit_rows: int, *, whole: bool = True) -> Iterator[list[Statement]]:
    """Statements taken from the front of ``stmts`` in transactions of ``commit_rows`` rows or
    more; ``whole``: the rest too, else it stays in ``stmts`` for the next group's statements."""
    chunk: list[Statement] = []
    rows = 0
    taken = 0
    for st in stmts:
        chunk.append(st)
        rows += st.rows
        if rows >= commit_rows:
            taken += len(chunk)
            yield chunk
            chunk, rows = [], 0
    if chunk and whole:
        taken += len(chunk)
        yield chunk
    del stmts[:taken]


def plan_keyed_events(by_table: dict[TableKey, list[RowEvent]]) -> list[TablePlan]:
    """Plans of one writer partition's events: the daemon's order, then ``plan_table``."""
    plans = []
    for (schema, table), events in by_table.items():
        events.sort(key=_order)
        plans.append(plan_table(schema, table, events))
    return plans


def _order(ev: RowEvent) -> tuple[int, int, int, int]:
    p = ev.pos
    return ev.commit_ts, p.partition, p.offset, p.index


def write_keyed(batches: Iterator[Any], spec: WriteSpec) -> WriteStats:
    """Apply one writer partition's keyed rows (ROWS rows of rows.SPARK_SCHEMA) downstream.

    The rows arrive as pickled lists, one per writer bucket and reader flush, sorted by bucket,
    and no key has rows in two buckets: so the task rebuilds, plans and writes a group of whole
    buckets of about ``GROUP_ROWS`` rows at a time, while the group before is committed
    (:class:`_CommitPipe`). Its memory is a few groups' worth, whatever its share of the epoch.
    """
    stats = WriteStats()
    # Millions of live objects and no reference cycles: the cyclic collector would only re-scan them.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    session = _runner(spec, stats)
    commits = _CommitPipe(session, spec)
    try:
        pending: list[Statement] = []
        for group in _bucket_groups(batches):
            plans = _plan_group(group, spec)
            del group
            for tp in plans:
                stats.add_plan(tp)
                pending.extend(table_statements(tp, spec.dialect, spec.router))
            for chunk in _chunks(pending, spec.commit_rows, whole=False):
                commits.put(chunk)
        for chunk in _chunks(pending, spec.commit_rows):
            commits.put(chunk)
        commits.finish()
    finally:
        commits.close()
        session.close()
        if gc_was_enabled:
            gc.enable()
    return stats


class _CommitPipe:
    """A writer task's transactions, committed one after another on a thread of their own.

    While the database runs one transaction's statements, the task rebuilds and plans the next:
    done in turn, the database would sit idle while the task planned and the task while the
    database wrote. The transactions keep their order and the session its single thread. A
    transaction is handed over only once the one before has committed, so a task holds at most
    two transactions' statements (the one running and the one it builds). The first error of a
    transaction is raised by the next ``put`` or by ``finish``, and nothing after it is committed.
    """

    def __init__(self, session: TransactionRunner, spec: WriteSpec) -> None:
        self._session = session
        self._spec = spec
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="catchup-writer")
        self._running: Future[None] | None = None

    def put(self, chunk: list[Statement]) -> None:
        self.finish()
        self._running = self._pool.submit(_commit, self._session, chunk, self._spec)

    def finish(self) -> None:
        """Wait for the transaction put last; raise its error."""
        running, self._running = self._running, None
        if running is not None:
            running.result()

    def close(self) -> None:
        """Wait for the transaction running, if any (after an error of the task's own)."""
        self._pool.shutdown(wait=True)


GROUP_ROWS = 20_000
"""Rows a writer task rebuilds, plans and binds at once (whole buckets, see :func:`write_keyed`).

About one transaction's worth (``WriteSpec.commit_rows``): larger groups hold more memory in
each writer and write no faster."""


def _bucket_groups(batches: Iterator[Any]) -> Iterator[list[bytes]]:
    """The pickled writer-row lists (``img``) of the ROWS rows of ``batches``, in groups of whole
    buckets of about ``GROUP_ROWS`` rows each.

    The job sorts each writer partition by bucket, so a group leaves as soon as the bucket after
    it begins: the task holds one group's pickles rather than its whole share, and its first
    transaction starts after one group is read, not all of them. A bucket met again after another
    would have its keys' rows planned in two groups (two final states for one key): that fails.
    """
    group: list[bytes] = []
    rows = 0
    current: int | None = None
    seen: set[int] = set()
    for batch in batches:
        for bucket, count, blob in zip(
            *(batch.column(name).to_pylist() for name in ("idx", "off", "img")), strict=True
        ):
            if bucket != current:
                if bucket in seen:
                    raise RuntimeError(f"writer rows not sorted by bucket: bucket {bucket} met again")
                seen.add(bucket)
                current = bucket
                if rows >= GROUP_ROWS:
                    yield group
                    group, rows = [], 0
            group.append(blob)
            rows += count
        del batch
        pa.default_memory_pool().release_unused()  # the batch's rows are Python bytes now
    if group:
        yield group


def _plan_group(blobs: list[bytes], spec: WriteSpec) -> list[TablePlan]:
    """Plans of the writer rows in ``blobs`` that belong to this epoch (``rows.writer_rows``)."""
    by_table: dict[TableKey, list[tuple[Any, ...]]] = {}
    skip = spec.skip
    for blob in blobs:
        for row in pickle.loads(blob):
            table = (row[5], row[6])
            if skip(table, row[0]):
                continue
            lst = by_table.get(table)
            if lst is None:
                by_table[table] = [row]
            else:
                lst.append(row)
    plans = []
    for (schema, table), rows in by_table.items():
        tp = plan_final_rows(schema, table, rows)
        if tp is None:
            events = [writer_event(row, spec.topic, spec.places) for row in rows]
            (tp,) = plan_keyed_events({(schema, table): events})
        plans.append(tp)
    return plans


def plan_final_rows(schema: str, table: str, rows: list[tuple[Any, ...]]) -> TablePlan | None:
    """The plan of one table's writer rows (``rows.WRITER_ROW``) when each handle key has one row,
    else None (then the rows are planned as events, :func:`plan_keyed_events`).

    Why: the readers already keep only the last op of each key among the ops they read
    (``rows`` module docstring), and TiCDC's dispatchers by table or by key write all the changes
    of a key to one partition, which one reader reads unless the partition was split into several
    ranges. So a writer usually gets a single row per key, and that row is the key's final state
    in the epoch: rebuilding it as a :class:`RowEvent`, sorting the events by commit ts and
    collapsing them (``sqlgen.plan_table``) found the same rows in about four times the CPU time
    (most of a writer task's own work). The plan is the one ``plan_table`` makes of the same rows:
    deletes of the key columns, upserts grouped by written (non-generated) columns, both in key
    order. Rows it does not know to be planned alike go the long way: two rows of a key, several
    key-column lists in one table, a delete whose image is not exactly its handle-key columns (a
    key change's old image lacking a key column), keys that do not compare (a NULL).
    """
    knames = rows[0][8]
    if not knames:
        return None  # planning says what is wrong with such a row
    keys = set()
    for row in rows:
        kn = row[8]
        if kn != knames:
            return None
        keys.add(row[9])
    if len(keys) != len(rows):
        return None  # a key has several rows: the daemon's order decides
    del keys
    try:
        rows = sorted(rows, key=_KEY_VALUES)
    except TypeError:
        return None
    tp = TablePlan(schema=schema, table=table, keyed=True, events=len(rows))
    deletes: DeleteGroup | None = None
    shapes: dict[tuple[str, ...], tuple[UpsertGroup, list[int] | None]] = {}  # image columns -> group
    by_columns: dict[tuple[str, ...], UpsertGroup] = {}  # written columns -> group
    for row in rows:
        shape = row[10]
        if shape is None:
            old = row[12]
            if tuple(old) != knames or not all(col["f"] & FLAG_HANDLE_KEY for col in old.values()):
                return None
            if deletes is None:
                deletes = DeleteGroup(knames, tuple(old[n]["t"] for n in knames))
                tp.deletes.append(deletes)
            deletes.keys.append(row[9])
            continue
        if shape.key_names != knames:
            return None
        values = row[11]
        entry = shapes.get(shape.names)
        if entry is None:
            entry = shapes[shape.names] = upsert_group(CompactImage(shape, values), by_columns, tp.upserts)
        group, keep = entry
        group.rows.append(values if keep is None else tuple([values[i] for i in keep]))
        group.keys.append(row[9])
    return tp


_KEY_VALUES = itemgetter(9)


def _commit(session: TransactionRunner, chunk: list[Statement], spec: WriteSpec) -> None:
    """One transaction of ``chunk`` (replayed by ``session`` after a transient error)."""

    def unit(conn: pymysql.connections.Connection) -> None:
        with conn.cursor() as cur:
            for st in chunk:
                _execute(cur, st, spec)
        conn.commit()

    session.run(unit)


def write_keyless(tp: TablePlan, spec: WriteSpec) -> WriteStats:
    """Apply one keyless table's ops of one epoch, exactly once (module docstring)."""
    stats = WriteStats()
    store = CheckpointStore(spec.checkpoint_schema, spec.changefeed)
    table = (tp.schema, tp.table)
    stmts = list(table_statements(tp, spec.dialect, spec.router))
    session = _runner(spec, stats)
    written = [False]

    def unit(conn: pymysql.connections.Connection) -> None:
        written[0] = False
        with conn.cursor() as cur:
            if _table_checkpoint(cur, store, table) >= spec.upper:
                conn.rollback()
                return  # committed by an earlier attempt or run
            for st in stmts:
                _execute(cur, st, spec)
            store.write(
                cur,
                topic=None,
                resolved_ts=0,
                tables={table: spec.upper},
                offsets={},
                partition_resolved={},
                owner=spec.owner,
            )
        conn.commit()
        written[0] = True

    try:
        session.run(unit)
    finally:
        session.close()
    if written[0]:
        stats.add_plan(tp)
    return stats


def _table_checkpoint(cur: pymysql.cursors.Cursor, store: CheckpointStore, table: TableKey) -> int:
    """The ts up to which ``table`` is applied, read with row locks held until the commit."""
    q = quote_ident(store.schema)
    cur.execute(
        f"SELECT `resolved_ts` FROM {q}.`changefeed` WHERE `changefeed` = %s FOR UPDATE", (store.changefeed,)
    )
    row = cur.fetchone()
    applied = int(row[0]) if row else 0
    cur.execute(
        f"SELECT `checkpoint_ts` FROM {q}.`table_checkpoint` "
        "WHERE `changefeed` = %s AND `schema_name` = %s AND `table_name` = %s FOR UPDATE",
        (store.changefeed, table[0], table[1]),
    )
    row = cur.fetchone()
    return max(applied, int(row[0]) if row else 0)

"""Reading and writing one changefeed's checkpoint.

What is stored (see ``schema.py`` for the layout):

* ``resolved_ts`` — the global resolved ts applied: every row with commit ts <= it is in the
  downstream, for every table;
* per-table ``checkpoint_ts`` — a table may be ahead of the global value (e.g. right after its
  DDL); rows of that table at or below ``Checkpoint.table_ts`` are already applied and skipped;
* per-partition ``next_offset`` (where to resume reading) and that partition's resolved ts;
* the DDLs already executed, keyed by (commit_ts, sha256 of the query), because a DDL is not
  transactional: it is recorded in the transaction that moves the checkpoint past it, and a
  replayed DDL is recognised instead of being run twice.

Bounded on purpose: a daemon runs for months, and every DDL adds a row. Whatever is at or below
the stored ``resolved_ts`` is already said by it (every row and every DDL at or below it counts as
applied, in the daemon and in the catch-up alike), so :meth:`CheckpointStore.prune`, run in the
transaction that records each DDL, forgets such rows: ``applied_ddl`` keeps the DDLs above the
resolved ts and the newest ``DDL_HISTORY`` rows (for operators: ``applier status``), and a DROP
TABLE / DROP DATABASE removes its tables' ``table_checkpoint`` rows. A row above the resolved ts
is never removed: it is what a restart needs (a DDL step leaves the resolved ts just below its
DDL). ``partition_offset`` is left alone: a row per partition read, bounded by the topics'
partitions (a changefeed may read several topics: every one of their rows is live).

Monotonic on purpose: :meth:`CheckpointStore.write` never moves a value backwards (``GREATEST``
in SQL). A replay after an ambiguous commit, or a late writer, can then only re-state progress,
never erase it. Rewinding is an operator action: :meth:`CheckpointStore.reset`.

Values are validated in Python before they reach SQL because the applier's session runs with a
non-strict ``sql_mode``, where an out-of-range number or an over-long name would be silently
clipped — and a clipped checkpoint is a wrong checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict, Unpack

import pymysql

from applier.errors import FatalError
from checkpoint.schema import (
    DEFAULT_SCHEMA,
    NAME_MAX_CHARS,
    ensure_schema,
    quote_ident,
    validate_schema_name,
)
from sqlgen.dml import literal_bytes

UINT64_MAX: Final = (1 << 64) - 1
INT64_MAX: Final = (1 << 63) - 1
INT32_MAX: Final = (1 << 31) - 1
_INT32_MIN: Final = -(1 << 31)

_ROWS_PER_STATEMENT: Final = 500
_STATEMENT_BYTES: Final = 64 << 10
"""Most bytes of bound values one checkpoint statement carries. A window may touch thousands of
tables and a topic may have hundreds of partitions, and names can be 255 characters of any
script, so the multi-row upserts are cut by size as well as by rows: 64 KiB stays far below any
``max_allowed_packet`` a server runs with (the applier's own data statements are sized to the
server's value, see ``sqlgen.dml``)."""
_ROW_TEMPLATE_BYTES: Final = 48  # "(%s, %s, %s, %s, %s, UTC_TIMESTAMP(6)), " less its placeholders

DDL_HISTORY: Final = 100
"""How many ``applied_ddl`` rows :meth:`CheckpointStore.prune` keeps at least, newest first, once
the resolved ts has passed them: no restart needs them, an operator may (``applier status``)."""

_DROP_SCHEMA, _DROP_TABLE = 2, 4  # DDL type codes (docs/open-protocol.md §8)


class FencedOut(FatalError):
    """Another instance has claimed this changefeed since we did: we must stop applying.

    Not a transient error: replaying the transaction cannot help.
    """


def ddl_digest(query: str) -> str:
    """SHA-256 (hex) of the DDL text as UTF-8: part of the key that recognises a replayed DDL."""
    return hashlib.sha256(query.encode("utf-8")).hexdigest()


@dataclass
class Checkpoint:
    """One changefeed's progress: as loaded at start-up (empty for a new changefeed), and what the
    stream stages start from and report (``applier.stream.barrier``, ``Barrier.checkpoint``).

    ``resolved_ts``: every row with commit ts <= this value is applied (the global applied resolved
    ts). ``tables``: a per-table floor above it when a table was loaded further by other means (a
    catch-up to a later snapshot); rows at or below it are skipped. ``applied_ddls``: DDLs already
    executed whose commit ts is above ``resolved_ts`` (a DDL step leaves the resolved ts at
    ``commit_ts - 1``, so the key is needed to not run it twice). ``offsets``: per partition, the
    Kafka offset to resume from; a missing partition resumes wherever the daemon's start policy
    says.
    """

    resolved_ts: int = 0
    topic: str | None = None
    tables: dict[tuple[str, str], int] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    """Partition -> next offset to read: a partition of ``topic`` as loaded; the stream's partition
    id (a slot with several topics, applier.kafka.topics) in the stream stages."""
    partition_resolved: dict[int, int] = field(default_factory=dict)  # partition -> resolved ts
    partition_applied: dict[Any, int] = field(default_factory=dict)
    """Row mode: every row of a partition at or below this ts is applied (``resolved_ts`` is then
    at most the lowest of them); keyed by (topic, partition) as loaded, by the stream's partition
    id in the stream stages (as ``offsets``); only values above ``resolved_ts``."""
    row_hold: int | None = None
    """Row mode: the partitions release together until this ts (``ROW_HOLD_OPEN``: a ts not known
    yet); None: each on its own."""
    # (topic, partition) -> next offset, for every topic the changefeed has offsets of: with
    # several topics ``topic`` describes the set (applier.kafka.topics) and these are the offsets
    topic_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    applied_ddls: AbstractSet[tuple[int, str]] = field(default_factory=set)  # (commit_ts, ddl_digest)
    owner: str | None = None  # fence token of the instance that last claimed the changefeed

    def table_ts(self, schema: str, table: str) -> int:
        """Rows of this table with commit ts at or below this value are already applied."""
        return max(self.resolved_ts, self.tables.get((schema, table), 0))


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A DDL that was about to run when the journal entry was committed (``catalogue``: JSON)."""

    commit_ts: int
    schema: str
    table: str
    ddl_type: int
    query: str
    catalogue: str


class DDLFields(TypedDict):
    """The fields that describe a DDL in the checkpoint schema: the keyword arguments of
    :meth:`CheckpointStore.record_ddl` and ``begin_ddl``, written once for both."""

    commit_ts: int
    schema: str
    table: str
    ddl_type: int
    query: str


def ddl_fields(ddl: Any) -> DDLFields:
    """The keyword arguments :meth:`CheckpointStore.record_ddl` and ``begin_ddl`` take, from
    anything that describes a DDL event (a decoded event, a journal entry)."""
    return {
        "commit_ts": ddl.commit_ts,
        "schema": ddl.schema,
        "table": ddl.table,
        "ddl_type": ddl.ddl_type,
        "query": ddl.query,
    }


def _check_ts(what: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= UINT64_MAX:
        raise ValueError(f"{what} must be an int in [0, 2^64-1], got {value!r}")
    return value


def _check_name(what: str, value: object, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > NAME_MAX_CHARS or (not value and not allow_empty):
        raise ValueError(f"{what} must be a string of at most {NAME_MAX_CHARS} characters, got {value!r}")
    return value


def _check_ddl(commit_ts: object, schema: object, table: object, ddl_type: object, query: object) -> None:
    """The fields of a DDL row (``applied_ddl``, ``ddl_journal``), checked before they reach SQL."""
    _check_ts("commit_ts", commit_ts)
    _check_name("schema name", schema)
    _check_name("table name", table)
    if type(ddl_type) is not int or not _INT32_MIN <= ddl_type <= INT32_MAX:
        raise ValueError(f"ddl_type must be a 32-bit int, got {ddl_type!r}")
    if not isinstance(query, str):
        raise ValueError(f"query must be a string, got {type(query).__name__}")


def _upsert_forward(
    cur: pymysql.cursors.Cursor,
    table: str,
    columns: Sequence[str],
    forward: Sequence[str],
    rows: Sequence[tuple],
) -> list[str]:
    """The statements that write ``rows`` (the values of ``columns``) into ``table`` (quoted),
    ``updated_at`` now, a multi-row statement per chunk, values bound by ``cur``'s session. On an
    existing key the columns of ``forward`` only move forward (``GREATEST``): a checkpoint never
    goes back, even when a late writer repeats an older one."""
    names = ", ".join(f"`{c}`" for c in (*columns, "updated_at"))
    row_sql = "(" + "%s, " * len(columns) + "UTC_TIMESTAMP(6))"
    updates = "".join(f"`{c}` = GREATEST(`{c}`, VALUES(`{c}`)), " for c in forward)
    return [
        cur.mogrify(
            f"INSERT INTO {table} ({names}) VALUES "
            + ", ".join([row_sql] * len(chunk))
            + f" ON DUPLICATE KEY UPDATE {updates}`updated_at` = VALUES(`updated_at`)",
            [v for r in chunk for v in r],
        )
        for chunk in _chunks(rows)
    ]


def _check_partition(value: object) -> int:
    if type(value) is not int or not 0 <= value <= INT32_MAX:
        raise ValueError(f"partition must be an int in [0, 2^31-1], got {value!r}")
    return value


def _check_offset(value: object) -> int:
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        raise ValueError(f"offset must be an int in [0, 2^63-1], got {value!r}")
    return value


def _chunks(
    rows: Sequence[tuple], size: int = _ROWS_PER_STATEMENT, max_bytes: int = _STATEMENT_BYTES
) -> Iterable[Sequence[tuple]]:
    """Runs of ``rows`` of at most ``size`` rows and about ``max_bytes`` bound (a bigger row alone)."""
    start = 0
    total = 0
    for i, row in enumerate(rows):
        n = _ROW_TEMPLATE_BYTES + sum(map(literal_bytes, row))
        if i > start and (i - start >= size or total + n > max_bytes):
            yield rows[start:i]
            start, total = i, 0
        total += n
    if start < len(rows):
        yield rows[start:]


ROW_HOLD_OPEN: Final = (1 << 64) - 1
"""``Checkpoint.row_hold`` of a hold whose end is not known yet (stored as NULL)."""


class Progress(TypedDict, total=False):
    """What :meth:`CheckpointStore.write` records (every key but ``owner`` is required)."""

    topic: str | None
    resolved_ts: int
    tables: Mapping[tuple[str, str], int]
    offsets: Mapping[int, int] | Mapping[tuple[str, int], int]
    partition_resolved: Mapping[int, int] | Mapping[tuple[str, int], int]
    owner: str | None
    partition_applied: Mapping[int, int] | Mapping[tuple[str, int], int]
    """Row mode: per partition, the ts its rows are applied up to (optional)."""
    shared: bool
    """Row mode's partition sessions: the fence takes a shared lock and the changefeed row is not
    written, so that the partitions' transactions never wait for each other (optional)."""
    row_hold: int | None
    """Row mode, on the apply session: the hold to keep (a ts, or ``ROW_HOLD_OPEN``), or None to
    end it (optional: absent, the stored one stays)."""


@dataclass(frozen=True, slots=True)
class ProgressWrite:
    """The statements of a checkpoint write (:meth:`CheckpointStore.progress_write`), values
    bound; with an owner, the first one is the fence's read, which :meth:`check` judges."""

    texts: list[str]
    owner: str | None
    changefeed: str

    @property
    def fetch(self) -> tuple[int, ...]:
        """The indexes of the statements whose rows :meth:`check` needs."""
        return () if self.owner is None else (0,)

    def check(self, rows: Mapping[int, tuple[Any, ...]], offset: int = 0) -> None:
        """Raise :class:`FencedOut` unless the fence read (statement ``offset`` of the batch the
        texts were run in) found ``owner`` as the changefeed's claimant."""
        if self.owner is not None:
            _check_owner(self.changefeed, self.owner, rows.get(offset, ()))


def _stored_ts(cur: pymysql.cursors.Cursor, sql: str, args: tuple[Any, ...]) -> int:
    """The one ts ``sql`` reads (0 when it finds no row)."""
    cur.execute(sql, args)
    row = cur.fetchone()
    return int(row[0]) if row else 0


def _journal_entry(row: Sequence[Any]) -> JournalEntry:
    """A journal entry from the columns commit_ts, schema_name, table_name, ddl_type, query, catalogue."""
    return JournalEntry(int(row[0]), row[1], row[2], int(row[3]), row[4], row[5])


def _check_owner(changefeed: str, owner: str, rows: Sequence[tuple[Any, ...]]) -> None:
    current = rows[0][0] if rows else None
    if current != owner:
        raise FencedOut(
            f"changefeed {changefeed!r} is now owned by {current!r}, not {owner!r}: "
            "another instance took over; stop applying"
        )


class CheckpointStore:
    """The checkpoint of one changefeed in schema ``schema`` of the downstream.

    Methods taking ``conn`` run their own short transaction and end it with a commit: call them
    with no transaction open. Methods taking ``cur`` run inside the caller's transaction, which
    the caller commits together with its data rows.
    """

    def __init__(self, schema: str = DEFAULT_SCHEMA, changefeed: str = "") -> None:
        self.schema = validate_schema_name(schema)
        self.changefeed = _check_name("changefeed", changefeed, allow_empty=False)
        self._q = quote_ident(schema)

    def __repr__(self) -> str:
        return f"CheckpointStore(schema={self.schema!r}, changefeed={self.changefeed!r})"

    def _t(self, table: str) -> str:
        return f"{self._q}.`{table}`"

    # -- schema -------------------------------------------------------------------------------

    def ensure_schema(self, conn: pymysql.connections.Connection) -> None:
        """Create the checkpoint schema/tables if missing (idempotent; DDL, so no open transaction)."""
        ensure_schema(conn, self.schema)

    # -- reading ------------------------------------------------------------------------------

    def load(self, conn: pymysql.connections.Connection) -> Checkpoint:
        """This changefeed's checkpoint; an empty one if it has never written any.

        ``offsets`` are those of the changefeed's current topic: offsets of a topic it used to read
        mean nothing for another one. ``topic_offsets`` has every topic's (the caller picks those
        of its topic set).
        """
        cf = (self.changefeed,)
        ckpt = Checkpoint()
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT `topic`, `resolved_ts`, `owner` FROM {self._t('changefeed')} "
                "WHERE `changefeed` = %s",
                cf,
            )
            row = cur.fetchone()
            if row is not None:
                ckpt.topic, ckpt.resolved_ts, ckpt.owner = row[0], int(row[1]), row[2]
            cur.execute(
                f"SELECT `schema_name`, `table_name`, `checkpoint_ts` FROM {self._t('table_checkpoint')} "
                "WHERE `changefeed` = %s",
                cf,
            )
            ckpt.tables = {(s, t): int(ts) for s, t, ts in cur.fetchall()}
            if ckpt.topic is not None:
                cur.execute(
                    f"SELECT `topic`, `partition_id`, `next_offset`, `resolved_ts` "
                    f"FROM {self._t('partition_offset')} WHERE `changefeed` = %s",
                    cf,
                )
                for topic, partition, offset, resolved in cur.fetchall():
                    ckpt.topic_offsets[(topic, int(partition))] = int(offset)
                    if topic == ckpt.topic:
                        ckpt.offsets[int(partition)] = int(offset)
                        ckpt.partition_resolved[int(partition)] = int(resolved)
                cur.execute(
                    f"SELECT `topic`, `partition_id`, `applied_ts` FROM {self._t('partition_applied')} "
                    "WHERE `changefeed` = %s AND `applied_ts` > %s",
                    (self.changefeed, ckpt.resolved_ts),
                )
                ckpt.partition_applied = {(t, int(p)): int(ts) for t, p, ts in cur.fetchall()}
                cur.execute(f"SELECT `until_ts` FROM {self._t('row_hold')} WHERE `changefeed` = %s", cf)
                hold = cur.fetchone()
                if hold is not None:
                    ckpt.row_hold = ROW_HOLD_OPEN if hold[0] is None else int(hold[0])
            cur.execute(
                f"SELECT `commit_ts`, `query_digest` FROM {self._t('applied_ddl')} WHERE `changefeed` = %s",
                cf,
            )
            ckpt.applied_ddls = {(int(ts), digest) for ts, digest in cur.fetchall()}
        conn.commit()  # end the read transaction: it would hold metadata locks on our tables
        return ckpt

    def ddl_applied(self, ckpt: Checkpoint, commit_ts: int, query: str) -> bool:
        """Whether this exact DDL (same commit ts, same text) was already executed."""
        return (commit_ts, ddl_digest(query)) in ckpt.applied_ddls

    def committed_resolved_ts(self, cur: pymysql.cursors.Cursor) -> int:
        """The stored global resolved ts, read in the caller's session (0 for a new changefeed).

        Used after a lost connection to learn whether an ambiguous COMMIT actually landed.
        """
        cur.execute(
            f"SELECT `resolved_ts` FROM {self._t('changefeed')} WHERE `changefeed` = %s", (self.changefeed,)
        )
        row = cur.fetchone()
        return int(row[0]) if row else 0

    def committed_table_ts(self, cur: pymysql.cursors.Cursor, schema: str, table: str) -> int:
        """A table's stored checkpoint ts (0 without one), read in the caller's session: whether
        an ambiguous COMMIT of a window that left the resolved ts where it was landed."""
        return _stored_ts(
            cur,
            f"SELECT `checkpoint_ts` FROM {self._t('table_checkpoint')} WHERE `changefeed` = %s "
            "AND `schema_name` = %s AND `table_name` = %s",
            (self.changefeed, schema, table),
        )

    def committed_partition_ts(self, cur: pymysql.cursors.Cursor, topic: str, partition: int) -> int:
        """A partition's stored applied ts in row mode (0 without one), read in the caller's
        session: whether an ambiguous COMMIT of that partition's transaction landed."""
        return _stored_ts(
            cur,
            f"SELECT `applied_ts` FROM {self._t('partition_applied')} WHERE `changefeed` = %s "
            "AND `topic` = %s AND `partition_id` = %s",
            (self.changefeed, topic, partition),
        )

    def ddl_recorded(self, cur: pymysql.cursors.Cursor, commit_ts: int, query: str) -> bool:
        """Whether this exact DDL is recorded as executed, read in the caller's session."""
        cur.execute(
            f"SELECT 1 FROM {self._t('applied_ddl')} WHERE `changefeed` = %s AND `commit_ts` = %s "
            "AND `query_digest` = %s",
            (self.changefeed, commit_ts, ddl_digest(query)),
        )
        return cur.fetchone() is not None

    # -- writing inside the caller's transaction ----------------------------------------------

    def claim(self, conn: pymysql.connections.Connection, owner: str) -> None:
        """Make ``owner`` the changefeed's active instance (commits).

        Call right after taking the single-active lock and *before* :meth:`load`. The claim waits
        on the row lock of any in-flight :meth:`write` of the previous owner, so that write either
        commits before our load (and we see it) or, run after the claim, is fenced out.
        """
        _check_name("owner", owner, allow_empty=False)
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self._t('changefeed')} "
                "(`changefeed`, `topic`, `resolved_ts`, `owner`, `updated_at`) "
                "VALUES (%s, NULL, 0, %s, UTC_TIMESTAMP(6)) "
                "ON DUPLICATE KEY UPDATE `owner` = VALUES(`owner`), `updated_at` = VALUES(`updated_at`)",
                (self.changefeed, owner),
            )
        conn.commit()

    def write(self, cur: pymysql.cursors.Cursor, **progress: Unpack[Progress]) -> None:
        """Record progress inside the caller's open transaction (commit it with the data rows):
        the statements of :meth:`progress_write`, one at a time (the daemon sends them in the
        packets of its windows instead, ``applier.downstream.batch``)."""
        write = self.progress_write(cur, **progress)
        rows = {}
        for i, text in enumerate(write.texts):
            cur.execute(text)
            if i in write.fetch:
                rows[i] = cur.fetchall()
        write.check(rows)

    def progress_write(self, cur: pymysql.cursors.Cursor, **progress: Unpack[Progress]) -> ProgressWrite:
        """The statements that record progress, values bound by ``cur``'s session; run them in the
        caller's open transaction and :meth:`ProgressWrite.check` what the fence read, before the
        commit that makes them hold together with the data rows.

        Only the tables and partitions given are touched. Every value moves forward only
        (``GREATEST``). ``partition_resolved`` may only name partitions that are in ``offsets``.
        A partition is a partition number of ``topic``, or ``(topic, partition)`` when the
        changefeed reads several topics (``topic`` then describes the set).
        ``topic=None`` keeps the stored topic. With ``owner``, the first statement locks the
        changefeed row, and the check raises :class:`FencedOut` unless ``owner`` is its last
        claimant (see :meth:`claim`); the row lock is held until the caller commits, which is what
        makes the fence airtight.
        """
        topic, resolved_ts = progress["topic"], progress["resolved_ts"]
        tables, offsets = progress["tables"], progress["offsets"]
        partition_resolved, owner = progress["partition_resolved"], progress.get("owner")
        applied, shared = progress.get("partition_applied", {}), progress.get("shared", False)
        if topic is not None:
            _check_name("topic", topic, allow_empty=False)
        _check_ts("resolved_ts", resolved_ts)
        table_rows = sorted(
            (
                self.changefeed,
                _check_name("schema name", s),
                _check_name("table name", t),
                _check_ts("table ts", ts),
            )
            for (s, t), ts in tables.items()
        )
        extra = set(partition_resolved) - set(offsets)
        if extra:
            raise ValueError(f"partition_resolved names partitions without an offset: {sorted(extra)}")
        if offsets and topic is None:
            raise ValueError("offsets need the topic they belong to")
        partition_rows = sorted(
            (
                self.changefeed,
                _check_name("topic", p[0], allow_empty=False) if isinstance(p, tuple) else topic,
                _check_partition(p[1] if isinstance(p, tuple) else p),
                _check_offset(off),
                _check_ts("partition resolved ts", partition_resolved.get(p, 0)),  # type: ignore[call-overload]
            )
            for p, off in offsets.items()
        )
        texts = [] if owner is None else [cur.mogrify(self._fence_sql(shared=shared), (self.changefeed,))]
        if not shared:
            texts.append(self._changefeed_upsert(cur, topic, resolved_ts))
        columns = ("changefeed", "schema_name", "table_name", "checkpoint_ts")
        texts += _upsert_forward(cur, self._t("table_checkpoint"), columns, ("checkpoint_ts",), table_rows)
        columns = ("changefeed", "topic", "partition_id", "next_offset", "resolved_ts")
        texts += _upsert_forward(
            cur, self._t("partition_offset"), columns, ("next_offset", "resolved_ts"), partition_rows
        )
        if applied:
            applied_rows = sorted(
                (
                    self.changefeed,
                    _check_name("topic", p[0], allow_empty=False) if isinstance(p, tuple) else topic,
                    _check_partition(p[1] if isinstance(p, tuple) else p),
                    _check_ts("partition applied ts", ts),
                )
                for p, ts in applied.items()
            )
            columns = ("changefeed", "topic", "partition_id", "applied_ts")
            texts += _upsert_forward(
                cur, self._t("partition_applied"), columns, ("applied_ts",), applied_rows
            )
        if "row_hold" in progress:
            texts.append(self._row_hold_sql(cur, progress["row_hold"]))
        return ProgressWrite(texts, owner, self.changefeed)

    def _row_hold_sql(self, cur: pymysql.cursors.Cursor, until: int | None) -> str:
        if until is None:
            return str(
                cur.mogrify(f"DELETE FROM {self._t('row_hold')} WHERE `changefeed` = %s", (self.changefeed,))
            )
        value = None if until == ROW_HOLD_OPEN else _check_ts("row hold", until)
        return str(
            cur.mogrify(
                f"INSERT INTO {self._t('row_hold')} (`changefeed`, `until_ts`, `updated_at`) "
                "VALUES (%s, %s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE `until_ts` = VALUES(`until_ts`), "
                "`updated_at` = VALUES(`updated_at`)",
                (self.changefeed, value),
            )
        )

    def _changefeed_upsert(self, cur: pymysql.cursors.Cursor, topic: str | None, resolved_ts: int) -> str:
        return str(
            cur.mogrify(
                f"INSERT INTO {self._t('changefeed')} (`changefeed`, `topic`, `resolved_ts`, `updated_at`) "
                "VALUES (%s, %s, %s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE "
                "`topic` = COALESCE(VALUES(`topic`), `topic`), "
                "`resolved_ts` = GREATEST(`resolved_ts`, VALUES(`resolved_ts`)), "
                "`updated_at` = VALUES(`updated_at`)",
                (self.changefeed, topic, resolved_ts),
            )
        )

    def forget_partition_applied(self, cur: pymysql.cursors.Cursor) -> None:
        """Drop row mode's per-partition applied ts and hold (in the caller's transaction): a
        hand-off sets one ts for every partition."""
        for table in ("partition_applied", "row_hold"):
            cur.execute(f"DELETE FROM {self._t(table)} WHERE `changefeed` = %s", (self.changefeed,))

    def _fence_sql(self, *, shared: bool) -> str:
        lock = "LOCK IN SHARE MODE" if shared else "FOR UPDATE"
        return f"SELECT `owner` FROM {self._t('changefeed')} WHERE `changefeed` = %s {lock}"

    def fence(self, cur: pymysql.cursors.Cursor, owner: str | None, *, shared: bool = False) -> None:
        """Lock the changefeed row and raise :class:`FencedOut` unless ``owner`` is its last
        claimant (no-op for ``owner`` None). The row lock lasts until the caller's commit, which
        is what makes the fence airtight for everything written in that transaction. ``shared``:
        a shared lock, for sessions that write rows beside the one that writes the checkpoint
        (applier.apply.workers): they do not wait for each other, and a :meth:`claim` waits for
        all of them."""
        if owner is None:
            return
        cur.execute(self._fence_sql(shared=shared), (self.changefeed,))
        self.check_fence(owner, cur.fetchall())

    def fence_statement(self, cur: pymysql.cursors.Cursor) -> str:
        """The exclusive fence's read, bound, to be sent with other statements; judge the rows it
        returns with :meth:`check_fence` before the commit."""
        return cur.mogrify(self._fence_sql(shared=False), (self.changefeed,))

    def check_fence(self, owner: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Raise :class:`FencedOut` unless the fence read's ``rows`` name ``owner`` as the claimant."""
        _check_owner(self.changefeed, owner, rows)

    def _ddl_row(self, ddl: DDLFields) -> tuple[Any, ...]:
        """The values of the columns that describe a DDL in ``applied_ddl`` and ``ddl_journal``
        (changefeed, commit ts, query digest, schema, table, type, query), checked first. A call
        with a field missing or unknown fails as it would against an explicit signature."""
        _check_ddl(**ddl)
        query = ddl["query"]
        return (
            self.changefeed,
            ddl["commit_ts"],
            ddl_digest(query),
            ddl["schema"],
            ddl["table"],
            ddl["ddl_type"],
            query,
        )

    def record_ddl(self, cur: pymysql.cursors.Cursor, **ddl: Unpack[DDLFields]) -> None:
        """Remember that a DDL was executed; in the transaction that moves the checkpoint past it.

        Recording the same DDL again is a no-op (keeps the first ``applied_at``).
        """
        cur.execute(
            f"INSERT INTO {self._t('applied_ddl')} "
            "(`changefeed`, `commit_ts`, `query_digest`, `schema_name`, `table_name`, `ddl_type`, `query`, "
            "`applied_at`) VALUES (%s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6)) "
            "ON DUPLICATE KEY UPDATE `query_digest` = `query_digest`",
            self._ddl_row(ddl),
        )

    def prune(self, cur: pymysql.cursors.Cursor, **ddl: Unpack[DDLFields]) -> None:
        """Forget the rows the stored resolved ts makes redundant, in the caller's transaction:
        call it in the one that records ``ddl`` (the only kind that adds rows for good), after
        its checkpoint is written.

        The rule: ``applied_ddl`` rows at or below the resolved ts, except the newest
        ``DDL_HISTORY``; with a DROP TABLE (DROP DATABASE) the ``table_checkpoint`` row of that
        table (the schema's rows) at or below the resolved ts. Rows above the resolved ts stay,
        whatever their age: a DDL step leaves the resolved ts at ``commit_ts - 1``, so its own
        record is one of them. ``partition_offset`` is never touched here. Cheap: one or two
        statements on the changefeed's primary-key range, once per DDL; they only write, so they
        can be sent with others (``applier.downstream.batch.Statements``).
        """
        _check_ddl(**ddl)
        cf = self.changefeed
        # Statements that read what they compare with, so that they can go in one packet with the
        # checkpoint they follow: no changefeed row, or fewer records than the history, delete nothing.
        resolved = f"(SELECT `resolved_ts` FROM {self._t('changefeed')} WHERE `changefeed` = %s)"
        cur.execute(
            f"DELETE FROM {self._t('applied_ddl')} WHERE `changefeed` = %s AND `commit_ts` <= {resolved} "
            "AND `commit_ts` < (SELECT `commit_ts` FROM (SELECT `commit_ts` FROM "
            f"{self._t('applied_ddl')} WHERE `changefeed` = %s ORDER BY `commit_ts` DESC LIMIT 1 OFFSET %s) "
            "AS `oldest_kept`)",
            (cf, cf, cf, DDL_HISTORY - 1),
        )
        if ddl["ddl_type"] == _DROP_TABLE and ddl["table"]:
            cur.execute(
                f"DELETE FROM {self._t('table_checkpoint')} WHERE `changefeed` = %s AND `schema_name` = %s "
                f"AND `table_name` = %s AND `checkpoint_ts` <= {resolved}",
                (cf, ddl["schema"], ddl["table"], cf),
            )
        elif ddl["ddl_type"] == _DROP_SCHEMA:
            cur.execute(
                f"DELETE FROM {self._t('table_checkpoint')} WHERE `changefeed` = %s AND `schema_name` = %s "
                f"AND `checkpoint_ts` <= {resolved}",
                (cf, ddl["schema"], cf),
            )

    # -- the DDL journal (applier/apply/ddl.py) ------------------------------------------------

    def begin_ddl(self, cur: pymysql.cursors.Cursor, *, catalogue: str, **ddl: Unpack[DDLFields]) -> None:
        """Write the journal entry of a DDL about to run: the caller commits it *before* the DDL.

        ``catalogue`` is the JSON fingerprint of the objects the DDL touches, taken before it ran;
        a restart compares it with the catalogue to learn whether the DDL took effect. One entry
        per changefeed: a newer one replaces an older (settled) one.
        """
        cur.execute(
            f"REPLACE INTO {self._t('ddl_journal')} (`changefeed`, `commit_ts`, `query_digest`, "
            "`schema_name`, `table_name`, `ddl_type`, `query`, `catalogue`, `started_at`) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))",
            (*self._ddl_row(ddl), catalogue),
        )

    def pending_ddl(self, cur: pymysql.cursors.Cursor) -> JournalEntry | None:
        """The journal entry of a DDL that started and was not recorded (a crash in between)."""
        cur.execute(
            f"SELECT `commit_ts`, `schema_name`, `table_name`, `ddl_type`, `query`, `catalogue` "
            f"FROM {self._t('ddl_journal')} WHERE `changefeed` = %s",
            (self.changefeed,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        return _journal_entry(row)

    def ddl_state(
        self, cur: pymysql.cursors.Cursor, commit_ts: int, query: str
    ) -> tuple[bool, JournalEntry | None]:
        """:meth:`ddl_recorded` and :meth:`pending_ddl` in one read (one round trip)."""
        cur.execute(
            f"SELECT (SELECT 1 FROM {self._t('applied_ddl')} WHERE `changefeed` = %s AND `commit_ts` = %s "
            "AND `query_digest` = %s), j.`commit_ts`, j.`schema_name`, j.`table_name`, j.`ddl_type`, "
            f"j.`query`, j.`catalogue` FROM (SELECT 1) AS `one` LEFT JOIN {self._t('ddl_journal')} AS j "
            "ON j.`changefeed` = %s",
            (self.changefeed, commit_ts, ddl_digest(query), self.changefeed),
        )
        row = cur.fetchone()
        entry = None if row[1] is None else _journal_entry(row[1:])
        return row[0] is not None, entry

    def end_ddl(self, cur: pymysql.cursors.Cursor) -> None:
        """Remove the journal entry, in the transaction that records the DDL (or settles it)."""
        cur.execute(f"DELETE FROM {self._t('ddl_journal')} WHERE `changefeed` = %s", (self.changefeed,))

    # -- DDLs that run beside the stream (applier/apply/online_ddl.py) ---------------------------

    def begin_online_ddl(
        self, cur: pymysql.cursors.Cursor, *, catalogue: str, **ddl: Unpack[DDLFields]
    ) -> None:
        """Journal a DDL that runs beside the stream, in the transaction that records it as applied;
        the row stays until the DDL has taken effect (:meth:`end_online_ddl`)."""
        cur.execute(
            f"INSERT INTO {self._t('ddl_online')} (`changefeed`, `commit_ts`, `query_digest`, "
            "`schema_name`, `table_name`, `ddl_type`, `query`, `catalogue`, `started_at`) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6)) "
            "ON DUPLICATE KEY UPDATE `query_digest` = `query_digest`",
            (*self._ddl_row(ddl), catalogue),
        )

    def online_ddls(self, cur: pymysql.cursors.Cursor) -> list[JournalEntry]:
        """The DDLs recorded as applied that have not taken effect yet, oldest first."""
        cur.execute(
            f"SELECT `commit_ts`, `schema_name`, `table_name`, `ddl_type`, `query`, `catalogue` "
            f"FROM {self._t('ddl_online')} WHERE `changefeed` = %s ORDER BY `commit_ts`",
            (self.changefeed,),
        )
        return [_journal_entry(r) for r in cur.fetchall()]

    def end_online_ddl(self, cur: pymysql.cursors.Cursor, commit_ts: int, query: str) -> None:
        """Forget a DDL that runs beside the stream once it has taken effect."""
        cur.execute(
            f"DELETE FROM {self._t('ddl_online')} WHERE `changefeed` = %s AND `commit_ts` = %s "
            "AND `query_digest` = %s",
            (self.changefeed, _check_ts("commit_ts", commit_ts), ddl_digest(query)),
        )

    # -- operator actions ---------------------------------------------------------------------

    def reset(self, conn: pymysql.connections.Connection) -> None:
        """Forget everything about this changefeed (commits); other changefeeds are untouched."""
        with conn.cursor() as cur:
            tables = (
                "table_checkpoint",
                "partition_offset",
                "partition_applied",
                "row_hold",
                "applied_ddl",
                "ddl_journal",
                "ddl_online",
            )
            for table in (*tables, "changefeed"):
                cur.execute(f"DELETE FROM {self._t(table)} WHERE `changefeed` = %s", (self.changefeed,))
        conn.commit()

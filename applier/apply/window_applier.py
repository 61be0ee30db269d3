"""Apply one window downstream: its rows (or its DDL) and the checkpoint, in one transaction.

This is the "plan -> SQL -> database + checkpoint" end of the data flow. A window is immutable,
so a transient error (deadlock, lost connection, server restart) simply replays the whole
transaction from memory after a reconnect; a permanent error stops the daemon with a message that
names the table, the statement kind and the first offending key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pymysql

from applier.apply.ddl import Bookkeeping, DDLExecutor, DDLFailed, DDLOutcome
from applier.apply.early import EarlyWriter, EarlyWrites
from applier.apply.online_ddl import OnlineDDLs, beside_scope, runs_online
from applier.apply.transaction import TransactionRunner
from applier.apply.workers import MIN_ROWS, WorkerFailed, WorkerSessions
from applier.codec.events import RowEvent, tso_physical_ms
from applier.downstream.batch import BatchFailed, execute_batch
from applier.downstream.errors import error_code, is_transient
from applier.downstream.retry import Backoff, RetryInfo, RetryLog
from applier.downstream.url import DownstreamConfig
from applier.downstream.watch import StatementWatch, Watched
from applier.errors import FatalError
from applier.ops.logs import get_logger
from applier.ops.redact import redact_text
from applier.stream.window import Window
from checkpoint import CheckpointStore, FencedOut, Progress, ProgressWrite
from sqlgen import (
    BINLOG_CACHE_FULL,
    Dialect,
    Router,
    Statement,
    WindowPlan,
    plan_window,
    route_ddl,
    statement_too_large,
    statements,
)


class ApplyError(FatalError):
    """A permanent downstream error: replaying cannot help, an operator must look."""


class Stopping(Exception):
    """The daemon was asked to stop (SIGTERM/SIGINT) while a unit waited to be replayed, or its
    statement was killed for the stop (``StatementWatch.interrupt``); nothing was committed."""


@dataclass
class ApplyStats:
    """What this applier committed (the demo prints it; the metrics follow the observer hooks)."""

    windows: int = 0
    transactions: int = 0
    ddls: int = 0
    rows_by_table_op: dict[tuple[str, str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PreparedWindow:
    """A window and its SQL, built by :meth:`WindowApplier.prepare` (``plan`` None: DDL or empty)."""

    window: Window
    plan: WindowPlan | None
    statements: list[Statement]
    plan_seconds: float
    queries: list[str] | None = None
    """The statements with their values bound by pymysql, when a session to bind with existed."""
    bind_seconds: float = 0.0
    early: EarlyWrites | None = None
    """Set when the window commits the early writes open on the apply session (applier.apply.early):
    ``plan``, ``statements`` and ``queries`` are then those of the rows after them only."""
    parts: tuple[PreparedWindow, ...] = ()
    """Row mode: each part of the window, prepared by its partition's applier."""


class PendingApply:
    """A window being applied on a background thread (:meth:`WindowApplier.apply_async`).

    Why a thread: most of a window's wall time is spent waiting for the database, and the daemon
    can read and decode the next records meanwhile (the Kafka client, orjson and the socket wait
    all let the other thread run). Only one window is ever in flight, and the daemon marks it
    applied in the barrier only after :meth:`result` returned, so the order of commits, the
    checkpoint and every guarantee stay exactly those of the synchronous :meth:`WindowApplier.apply`.
    """

    def __init__(
        self,
        window: Window,
        run: Callable[[Window], dict[tuple[str, str, str], int]],
        ready_at: float | None = None,
        early: bool = False,
    ) -> None:
        self.window = window
        self.early = early
        """An early piece (applier.apply.early): written, not committed; nothing to mark applied."""
        self.ready_at = ready_at
        """When the daemon read what let the window be released (wall clock; None: not known)."""
        self.started = time.monotonic()
        self._run = run
        self._done = threading.Event()
        self._result: dict[tuple[str, str, str], int] = {}
        self._error: BaseException | None = None
        self.committed_at: float | None = None
        """Wall-clock time (``time.time()``) just after the transaction committed, taken on the
        apply thread: the daemon's thread may notice the commit only after decoding a few more
        records, and the commit lag metric is about the commit, not the noticing."""
        self._thread = threading.Thread(target=self._body, name="applier-apply", daemon=True)
        self._thread.start()

    def _body(self) -> None:
        try:
            self._result = self._run(self.window)
            self.committed_at = time.time()
        except BaseException as exc:  # handed to the daemon's thread by result()
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the transaction is committed or has failed; False on timeout."""
        return self._done.wait(timeout)

    def result(self) -> dict[tuple[str, str, str], int]:
        """Wait, then return what :meth:`WindowApplier.apply` returned, or raise what it raised."""
        self._done.wait()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def _partition_number(partition: int) -> int | tuple[str, int]:
    return partition


@dataclass(frozen=True, slots=True)
class ApplySettings:
    """What a :class:`WindowApplier` writes where, and how."""

    topic: str
    """The checkpoint's topic (the set's name with several topics)."""
    dialect: Dialect
    owner: str | None = None
    """The fence token the checkpoint is written with (the single-active lock's)."""
    router: Router | None = None
    """Route rules: rows are written to the routed names; the checkpoint keeps upstream ones."""
    partition_key: Callable[[int], int | tuple[str, int]] = _partition_number
    """How the checkpoint names a window's partition: ``(topic, partition)`` of a slot with
    several topics (applier.kafka.topics); a partition number of ``topic`` by default."""
    workers: int = 0
    """Worker sessions for the keyed rows of large windows (applier.apply.workers)."""
    worker_min_rows: int = MIN_ROWS
    """Windows with fewer rows stay on the apply session alone (``WorkerSessions.split``)."""
    early_rows: int = 0
    """Rows an early piece needs at least (applier.apply.early; 0: no early writes)."""
    early_piece_rows: int = 5_000
    """Rows an early piece holds at most: a window released while a piece is being written waits
    for it, so pieces stay short."""
    retry_report_seconds: float = 60.0
    ddl_blocking: str = "all"
    """"tables": a DDL of a known set of tables runs beside the stream and holds only their rows
    (applier.apply.online_ddl); "all": every DDL but an index one stops every table."""
    consistency: str = "transaction"
    """"row": windows of parts (applier.stream.row_release), each part written on a session of its
    partition's, with that partition's progress, in a transaction of its own."""
    summary_seconds: float = 1.0
    """Row mode: how often the changefeed row's resolved ts (the lowest partition's applied ts, what
    ``applier status`` and a restart read first) is written, on the apply session."""


def _never() -> bool:
    return False


def _nothing() -> None:
    pass


def _ignore_retry(_exc: BaseException) -> None:
    pass


@dataclass(frozen=True, slots=True)
class ApplyHooks:
    """The daemon's hooks: whether to stop (while a unit fails or waits to be replayed), each
    retry (delivered on the daemon's thread, see ``deliver_notifications``), and one call just
    before COMMIT (the single-active lock's check)."""

    stop_requested: Callable[[], bool] = _never
    on_retry: Callable[[BaseException], None] = _ignore_retry
    before_commit: Callable[[], None] = _nothing


class WindowApplier:
    """Owns the apply connection; turns windows into committed transactions.

    A DDL executor given here reports the statements it runs on the lock's session to this
    applier's statement watch (``watch_also``), so a DDL waiting on a lock is reported and killed
    on stop like the applier's own statements.

    In row mode (``ApplySettings.consistency``) it keeps one applier of the same kind per partition
    (``partition``: the one such an applier writes), created when the partition first has a part
    to write: each writes its partition's part of a window on its own session, in its own
    transaction with its partition's offset and applied ts (fenced under a shared lock, so that the
    partitions never wait for each other there); the window is applied once every part committed.
    DDLs stay on this applier's session.
    """

    def __init__(
        self,
        downstream: DownstreamConfig,
        store: CheckpointStore,
        settings: ApplySettings,
        *,
        hooks: ApplyHooks = ApplyHooks(),
        ddl_executor: DDLExecutor | None = None,
        online_ddls: OnlineDDLs | None = None,
        watch: StatementWatch | None = None,
        backoff: Backoff | None = None,
        partition: int | None = None,
    ) -> None:
        # The checkpoint committed with each window, and the fence token it is written with.
        self._store = store
        self._topic = settings.topic
        self._owner = owner = settings.owner
        self._partition_key = settings.partition_key
        # How a window becomes statements: rows through sqlgen, a DDL through its executor.
        self._dialect = settings.dialect
        self._router = settings.router or Router()
        self._ddl = ddl_executor
        if ddl_executor is not None:
            ddl_executor.on_statement = self.watch_also
        self.online_ddls = online_ddls
        """Index DDLs run beside the stream (applier.apply.online_ddl); None: every DDL in its window."""
        self._holds_tables = settings.ddl_blocking == "tables"
        self._stop_requested = hooks.stop_requested
        self._notify_retry = hooks.on_retry
        self._before_commit = hooks.before_commit
        self._connection_id: int | None = None
        self._maybe_committed = False
        self.watch = watch
        """Lock waits of the statements registered here are reported; the daemon kills them on stop."""
        self._watched: Watched | None = None  # the registrations of the unit in flight
        self.stats = ApplyStats()
        self.log = get_logger(component="apply")
        self._retry_log = RetryLog(self.log, report_seconds=settings.retry_report_seconds)
        # Retry notifications raised on the apply thread wait here for the daemon's thread
        # (observer hooks run on the daemon's thread only); see deliver_notifications().
        self._home_thread = threading.get_ident()
        self._deferred_retries: list[BaseException] = []
        self._bind_seconds = 0.0
        self._escape: Callable[[Any], str] | None = None  # a session's value escaping (Statement.bound)
        workers = settings.workers
        self._workers = (
            WorkerSessions(
                downstream,
                workers,
                fence=lambda cur: store.fence(cur, owner, shared=True),
                min_rows=settings.worker_min_rows,
            )
            if workers > 0
            else None
        )
        """Sessions that write the keyed rows of large windows beside this one (applier.apply.workers)."""
        self._workers_used = 0  # workers that wrote part of the last window
        # Row mode: the partitions' appliers (``partition`` is set on those), made on first use.
        self._partition = partition
        self._parts: dict[int, WindowApplier] = {}
        self._part_pool: ThreadPoolExecutor | None = None
        self._new_part = lambda p: WindowApplier(
            downstream, store, settings, hooks=hooks, watch=watch, backoff=backoff, partition=p
        )
        self._summary_seconds = settings.summary_seconds
        self._summary_at: float | None = None  # when the changefeed row was last written (row mode)
        self._summary_due: Window | None = None  # the last window of parts, when it does not say it yet
        self._last_window: Window | None = None  # the last row mode window applied
        # Early writes: off with workers, whose sessions could not see them, and in row mode, where
        # a partition's rows are written as soon as they can be released.
        early_rows = settings.early_rows if workers == 0 and settings.consistency != "row" else 0
        self.early = EarlyWriter(early_rows, settings.early_piece_rows)
        self._tx = TransactionRunner(
            downstream,
            max_time=None,
            backoff=backoff,
            on_retry=self._on_retry,
            sleep=self._sleep,
            on_connect=self._on_connect,
            on_reconnect=self._on_reconnect,
            multi_statements=True,  # rows and checkpoint in few packets (applier.downstream.batch)
        )

    # -- connection ----------------------------------------------------------------------------
    @property
    def conn(self) -> pymysql.connections.Connection:
        return self._tx.conn

    def _on_connect(self, conn: pymysql.connections.Connection) -> None:
        assert self._tx.session is not None  # set before on_connect is called
        self._connection_id = self._tx.session.id  # for the statement watch
        if self._escape is None:
            # Only ever used to escape values (no I/O), so any session of ours will do, even
            # after it is closed by a reconnect.
            self._escape = conn.escape

    def _on_reconnect(self) -> None:
        # The lost connection may have died during COMMIT, after the server committed: the next
        # attempt must first ask the checkpoint whether the transaction landed (keyless INSERTs
        # are not idempotent, so replaying a committed window would duplicate rows).
        self._maybe_committed = True
        self.early.open = None  # the old session's transaction, early writes and all, is gone

    def _already_committed(self, window: Window) -> bool:
        """After a reconnect: did the previous attempt of ``window`` commit after all?"""
        if not self._maybe_committed:
            return False
        self._maybe_committed = False
        with self.conn.cursor() as cur:
            if self._partition is not None:
                landed = self._partition_landed(cur, self._partition, window)
            elif window.parts and window.ddl is None:
                # Partitions written together: the lowest partition's ts may not move, the
                # partitions' own do, in the one transaction.
                landed = any(self._partition_landed(cur, part.partition, part) for part in window.parts)
            elif window.ddl is not None:
                landed = self._store.ddl_recorded(cur, window.ddl.commit_ts, window.ddl.query)
            elif window.floor_ts is None:
                landed = self._store.committed_resolved_ts(cur) >= window.target_ts > window.base_ts
            else:  # tables wait for a DDL: the resolved ts stays, the tables' own ts moved
                landed = any(
                    self._store.committed_table_ts(cur, *table) >= window.target_ts for table in window.tables
                )
        if landed:
            # End the read transaction: idle, it would keep a metadata lock on the checkpoint tables.
            self.early.open = None
            self.conn.rollback()
            self.log.info(
                "the transaction committed before the connection was lost; not replaying it",
                resolved_ts=window.target_ts,
            )
        return landed

    def _partition_landed(self, cur: pymysql.cursors.Cursor, partition: int, part: Window) -> bool:
        """Whether the checkpoint says ``partition`` is applied up to the target of ``part``, a
        window that moves it."""
        if part.target_ts <= part.base_ts:
            return False
        key = self._partition_key(partition)
        topic, number = key if isinstance(key, tuple) else (self._topic, key)
        return self._store.committed_partition_ts(cur, topic, number) >= part.target_ts

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
        for part in self._parts.values():
            part.close()
        if self._part_pool is not None:
            self._part_pool.shutdown(wait=False)
        self.early.open = None  # closing the session rolls its transaction back
        self._tx.close()
        self._connection_id = None

    def _sleep(self, seconds: float) -> None:
        """Backoff wait that gives up as soon as a stop is requested (exit within seconds)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._stop_requested():
                raise Stopping()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _on_retry(self, info: RetryInfo) -> None:
        if threading.get_ident() == self._home_thread:
            self._notify_retry(info.error)
        else:
            self._deferred_retries.append(info.error)
        self._retry_log.failed(info)

    def _retry(self, unit: Callable[[], None], window: Window | None = None) -> None:
        """Run ``unit`` until it commits: transient errors replay it (without end: a daemon rides out
        a database restart, and says so, see ``RetryLog``), permanent ones propagate at once.

        Each attempt is registered with the statement watch, which reports a lock wait of the
        apply session and kills its statement on stop. A transient error once a stop was requested
        (the statement killed for the stop: 1317, a killed session: 1927/2013) is not replayed:
        the transaction is rolled back and :class:`Stopping` says so, not as an error.
        """
        description, tables = _unit_description(window, self._router)

        def attempt(_conn: pymysql.connections.Connection) -> None:
            watch = self.watch
            try:
                with self._watching(description, tables):
                    unit()
            except Exception as exc:
                if self._stop_requested() and (
                    is_transient(exc) or (watch is not None and watch.interrupted)
                ):
                    raise Stopping() from exc
                raise

        try:
            self._tx.run(attempt)
        except pymysql.MySQLError as exc:
            setting = BINLOG_CACHE_FULL.get(error_code(exc) or 0)
            if setting is None:
                raise
            raise ApplyError(_cache_full_line(window, setting, exc)) from None
        self._retry_log.succeeded()

    @contextlib.contextmanager
    def _watching(self, description: str, tables: Any) -> Iterator[None]:
        """The statements run inside, watched for lock waits under ``description`` (the unit in
        flight: ``watch_also`` adds the sessions it uses besides the apply session)."""
        watch = self.watch
        watching = watch.statement(self._connection_id, description, tables) if watch else _NOT_WATCHED
        try:
            with watching as watched:
                self._watched = watched
                yield
        finally:
            self._watched = None

    def watch_also(self, connection_id: int, sql: str) -> None:
        """Watch a statement the unit in flight runs on another session until the unit ends (the
        DDL executor's ``on_statement``: the DDL runs on the single-active lock's session)."""
        del sql  # the unit's description names the DDL already
        watched = self._watched
        if watched is not None:
            watched.also(connection_id)

    def deliver_notifications(self) -> None:
        """Pass retries that happened on the apply thread to ``on_retry`` (call from the daemon's thread)."""
        while self._deferred_retries:
            self._notify_retry(self._deferred_retries.pop(0))
        for part in self._parts.values():
            part.deliver_notifications()

    # -- windows -------------------------------------------------------------------------------
    def prepare(self, window: Window) -> PreparedWindow:
        """Collapse ``window`` and build its SQL (pure CPU work, no database).

        The daemon calls this on its own thread for the next window while the apply thread
        waits for the database on the current one. Raises ``PlanError`` for a row that cannot be
        applied safely (nothing is written then).
        """
        if window.parts and window.ddl is None and not window.joint:
            started = time.monotonic()
            parts = tuple(self._part(part.partition).prepare(part) for part in window.parts)
            return PreparedWindow(window, None, [], time.monotonic() - started, parts=parts)
        if window.ddl is not None or not window.rows:
            return PreparedWindow(window, None, [], 0.0)
        early = self.early.open
        if early is not None:
            rest = early.remainder(window)
            if rest is not None:
                return self._prepare(window, rest, None, early)
        return self._prepare(window, window.rows, window.tables, None)

    def _prepare(
        self,
        window: Window,
        rows: list[RowEvent],
        tables: frozenset[tuple[str, str]] | None,
        early: EarlyWrites | None,
    ) -> PreparedWindow:
        """Plan ``rows`` (the window's, or those after its early writes) and bind their SQL."""
        started = time.monotonic()
        plan = plan_window(rows, tables)
        stmts = list(statements(plan, self._dialect, self._router))
        planned = time.monotonic()
        queries = None
        escape = self._escape
        if escape is not None:
            # pymysql's own escaping (Statement.bound), on this thread rather than the apply thread.
            # It depends only on the session's character set and sql_mode, which every session of
            # this applier shares, so the text is valid for whichever session executes it.
            queries = [st.bound(escape) for st in stmts]
        done = time.monotonic()
        return PreparedWindow(window, plan, stmts, planned - started, queries, done - planned, early)

    def apply_async(self, window: Window | PreparedWindow, ready_at: float | None = None) -> PendingApply:
        """Start :meth:`apply` on a background thread. One at a time: the caller waits for the
        returned handle's ``result()`` before it starts the next window or closes the applier."""
        prepared = window if isinstance(window, PreparedWindow) else self.prepare(window)
        return PendingApply(prepared.window, lambda _w: self.apply(prepared, ready_at), ready_at)

    def apply(
        self, window: Window | PreparedWindow, ready_at: float | None = None
    ) -> dict[tuple[str, str, str], int]:
        """Commit a window (rows or DDL) together with its checkpoint; raise ApplyError if impossible.

        Takes the window itself or what :meth:`prepare` made of it. Returns the row operations
        written, by (schema, table, op), for metrics. ``ready_at``: when the daemon read what let
        the window be released (wall clock); its log line then says how long that was before the
        commit (``ready_s``: the daemon's own share of the lag, Kafka's delivery left out).
        """
        started = time.monotonic()
        prepared = window if isinstance(window, PreparedWindow) else self.prepare(window)
        window = prepared.window
        counts: dict[tuple[str, str, str], int] = {}
        self.early.window_started()
        if self.online_ddls is not None:
            try:
                self.online_ddls.check()
            except DDLFailed as exc:  # one beside the stream failed for good: the daemon stops
                raise ApplyError(str(exc)) from None
        if window.ddl is not None:
            self._drop_early()  # the DDL runs on another session: no row lock of ours may wait for it
            self._apply_ddl(window)
        elif window.parts and not window.joint:
            counts = self._apply_parts(prepared)
        else:
            counts = self._apply_rows(prepared)
        if window.parts:
            self._last_window = window
        if window.parts and (window.ddl is not None or window.joint):
            # Written with this session's own checkpoint, the changefeed row and the hold included.
            self._summary_at, self._summary_due = time.monotonic(), None
        self.stats.windows += 1
        now = time.time()
        lag = now - tso_physical_ms(window.target_ts) / 1000.0 if window.target_ts else None
        if window.ddl is None:
            # A partition's part is one line of its window's (``partitions``), at debug level.
            (self.log.info if self._partition is None else self.log.debug)(
                "window applied",
                rows=window.row_count,
                tables=len(window.tables),
                resolved_ts=window.target_ts,
                lag_s=round(lag, 3) if lag is not None else None,
                ready_s=round(now - ready_at, 3) if ready_at is not None else None,
                seconds=round(time.monotonic() - started, 3),
                **({"workers": self._workers_used} if self._workers is not None else {}),
                **({"partitions": len(window.parts)} if window.parts else {}),
                **({"partition": self._partition} if self._partition is not None else {}),
                **({"early_rows": self.early.used} if self.early.used else {}),
                # tables whose rows wait for a DDL beside the stream: the checkpoint stays below them
                **(
                    {"held_tables": len(window.held), "checkpoint_ts": window.resolved_ts}
                    if window.held
                    else {}
                ),
                # collapse + SQL text, done before (possibly while the previous window was applied)
                plan_s=round(prepared.plan_seconds, 3),
                bind_s=round(self._bind_seconds, 3),  # values escaped into the SQL text by pymysql
            )
        return counts

    def _progress(self, window: Window) -> Progress:
        key = self._partition_key
        offsets = {p: o for p, o in window.resume_offsets.items() if o is not None}
        progress = Progress(
            topic=self._topic,
            resolved_ts=window.resolved_ts,
            tables=dict.fromkeys(window.tables, window.target_ts),
            offsets={key(p): o for p, o in offsets.items()},
            partition_resolved={key(p): ts for p, ts in window.resolved.items() if p in offsets},
            owner=self._owner,
        )
        if self._partition is not None:
            # One partition's part: its own rows only (the changefeed row and the tables' rows are
            # shared by every partition; a restart skips this partition's rows by its applied ts).
            progress.update(
                tables={}, partition_applied={key(self._partition): window.target_ts}, shared=True
            )
        elif window.parts:  # a DDL, or parts written together (``Window.joint``)
            progress["partition_applied"] = {key(part.partition): part.target_ts for part in window.parts}
            progress["row_hold"] = window.row_hold
        return progress

    # -- row mode ----------------------------------------------------------------------------
    def _part(self, partition: int) -> WindowApplier:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = self._new_part(partition)
        if part._escape is None:
            part._escape = self._escape  # the same character set and sql_mode on every session
        return part

    def _apply_parts(self, prepared: PreparedWindow) -> dict[tuple[str, str, str], int]:
        """Row mode: every part of the window on its partition's session at once; the window is
        applied once they all committed. When one fails the others still finish (each commits or
        rolls back on its own, with its own progress), then the first error is raised."""
        window = prepared.window
        parts = prepared.parts or tuple(self._part(part.partition).prepare(part) for part in window.parts)
        if self._summary_at is None:
            # The changefeed row names the topic the partitions' offsets belong to: written
            # before any of them, or a restart would not read them.
            self._write_summary(window.base_ts, window.row_hold)
        pool = self._part_pool
        if pool is None:
            pool = self._part_pool = ThreadPoolExecutor(256, thread_name_prefix="applier-partition")
        futures = [pool.submit(self._part(part.window.partition).apply, part) for part in parts]
        counts: dict[tuple[str, str, str], int] = {}
        error: BaseException | None = None
        for future in futures:
            try:
                for key, n in future.result().items():
                    counts[key] = counts.get(key, 0) + n
            except BaseException as exc:  # the first one is raised once every part is done
                error = error if error is not None else exc
        if error is not None:
            raise error
        self.stats.transactions += len(parts)
        for key, n in counts.items():
            self.stats.rows_by_table_op[key] = self.stats.rows_by_table_op.get(key, 0) + n
        self._summary_due = window
        if time.monotonic() - self._summary_at >= self._summary_seconds:
            self._write_summary(window.target_ts, window.row_hold)
        return counts

    def summary_async(self) -> PendingApply | None:
        """Row mode, while nothing can be released: write the changefeed row's resolved ts on the
        apply thread if it is behind and was last written ``summary_seconds`` ago (else None)."""
        due = self._summary_due
        if due is None or self._summary_at is None:
            return None
        if time.monotonic() - self._summary_at < self._summary_seconds:
            return None
        return PendingApply(due, lambda _w: self._summarise(due), early=True)

    def _summarise(self, window: Window) -> dict[tuple[str, str, str], int]:
        self._write_summary(window.target_ts, window.row_hold)
        return {}

    def hold_ended(self) -> None:
        """Row mode: the partitions release on their own from now on; the next summary says so
        (the checkpoint's hold is removed), at once."""
        last = self._last_window
        if last is not None and self._summary_at is not None:
            self._summary_due = dataclasses.replace(last, row_hold=None)
            self._summary_at = 0.0

    def flush_summary(self) -> None:
        """Row mode, on the way out: the changefeed row says what the last window applied."""
        due = self._summary_due
        if due is not None:
            self._write_summary(due.target_ts, due.row_hold)

    def _write_summary(self, resolved_ts: int, row_hold: int | None) -> None:
        """Row mode: the changefeed row's topic and resolved ts (every partition applied up to it),
        and the partitions' joint release (``Window.row_hold``)."""

        def unit() -> None:
            with self.conn.cursor() as cur:
                progress = Progress(
                    topic=self._topic,
                    resolved_ts=resolved_ts,
                    tables={},
                    offsets={},
                    partition_resolved={},
                    owner=self._owner,
                    row_hold=row_hold,
                )
                self._store.write(cur, **progress)
            self._before_commit()
            self.conn.commit()

        self._maybe_committed = False  # moving forward only: writing it twice is harmless
        self._retry(unit)
        self._summary_at = time.monotonic()
        self._summary_due = None

    def _apply_rows(self, prepared: PreparedWindow) -> dict[tuple[str, str, str], int]:
        """One transaction: deletes, replaces and keyless ops of the window, then the checkpoint.

        The barrier already bounds a window to about ``max_txn_rows`` rows by whole upstream
        transactions, so a window is never split over transactions here and the checkpoint always
        moves with it. A window with spilled rows (``window.streamed``: one upstream transaction
        larger than the row cache) is planned and executed piece by piece inside that one
        transaction (``applier.stream.spill`` says why the pieces converge).
        A statement too large for the server's ``max_allowed_packet`` (only a single huge row can
        be: ``sqlgen.dml`` cuts the others to it) is an ApplyError before it is sent; the
        transaction rolls back, so nothing of the window is written.
        With early writes open on the session (applier.apply.early), a window prepared on top of
        them writes only the rows after them; any other window, and every replay after an error
        (which rolled them back), writes the whole window.
        """
        window = prepared.window
        streamed_counts: dict[tuple[str, str, str], int] = {}
        plans: list[WindowPlan] = []  # what the committed attempt wrote

        def unit() -> None:
            if self._already_committed(window):
                return
            conn = self.conn
            early = self.early.open
            takes_early = early is not None and prepared.early is early
            bind = 0.0
            plans.clear()
            try:
                if not takes_early:
                    self._drop_early()
                with conn.cursor() as cur:
                    # The checkpoint goes in the last packet of the window's statements.
                    checkpoint = self._store.progress_write(cur, **self._progress(window))
                    if takes_early:
                        bind = self._execute(cur, prepared.statements, prepared.queries, window, checkpoint)
                        plans.extend(early.plans)
                        if prepared.plan is not None:
                            plans.append(prepared.plan)
                    elif window.streamed is None:
                        whole = prepared
                        if prepared.early is not None:  # planned on top of early writes now gone
                            whole = self._prepare(window, window.rows, window.tables, None)
                        bind = self._execute_window(cur, whole, checkpoint)
                        if whole.plan is not None:
                            plans.append(whole.plan)
                    else:
                        streamed_counts.clear()  # a replayed attempt starts from the first piece
                        for chunk in window.streamed.chunks():
                            chunk_plan = plan_window(chunk)
                            chunk_stmts = list(statements(chunk_plan, self._dialect, self._router))
                            bind += self._execute(cur, chunk_stmts, None, window)
                            _add_counts(streamed_counts, chunk_plan)
                        self._execute(cur, [], [], window, checkpoint)
                self._before_commit()
                conn.commit()
            except BaseException:
                self.early.open = None
                _rollback_quietly(conn)
                raise
            self.early.committed(early if takes_early else None)
            self._bind_seconds = bind + prepared.bind_seconds

        self._retry(unit, window)
        self.stats.transactions += 1
        counts: dict[tuple[str, str, str], int] = streamed_counts
        for plan in plans:
            _add_counts(counts, plan)
        for key, n in counts.items():
            self.stats.rows_by_table_op[key] = self.stats.rows_by_table_op.get(key, 0) + n
        return counts

    # -- early writes (applier.apply.early: EarlyWriter decides, this writes) --------------------
    def write_early_async(self, window: Window) -> PendingApply:
        """Plan ``window`` (``EarlyWriter.next_piece``, on top of the open pieces) here and write it
        into the open transaction on the apply thread, without committing it."""
        prepared = self._prepare(window, window.rows, window.tables, None)
        return PendingApply(window, lambda _w: self._write_early(prepared), early=True)

    def _write_early(self, prepared: PreparedWindow) -> dict[tuple[str, str, str], int]:
        """Write an early piece; on any error roll the open transaction back instead (the window
        is then written whole once released, where errors are retried or reported)."""
        window, plan = prepared.window, prepared.plan
        early = self.early.open
        if plan is None or self._stop_requested():
            return {}
        if (early.target_ts if early is not None else window.base_ts) != window.base_ts:
            self._drop_early()  # not the piece after the open ones: never expected
            return {}
        try:
            conn = self.conn
            description, tables = _unit_description(window, self._router)
            with self._watching("early " + description, tables), conn.cursor() as cur:
                self._execute(cur, prepared.statements, prepared.queries, window)
        except Exception as exc:
            self.early.open = early or EarlyWrites((window,), (plan,))  # what may be written: roll it back
            self._drop_early(redact_text(str(exc)))
            return {}
        self.early.open = EarlyWrites((window,), (plan,)) if early is None else early.then(window, plan)
        return {}

    def _drop_early(self, error: str | None = None) -> None:
        """Roll back the early writes open on the apply session (apply thread); ``EarlyWriter``
        pauses them for a while."""
        if self.early.open is None:
            return
        self.early.open = None
        self._tx.rollback_quietly()
        self.early.missed(error)

    def _execute_window(
        self, cur: pymysql.cursors.Cursor, prepared: PreparedWindow, checkpoint: ProgressWrite
    ) -> float:
        """Run a window's statements and then ``checkpoint`` on this session, or, when it is large
        enough and workers are configured, its keyed statements on the workers and the rest here
        (applier.apply.workers), the checkpoint once every worker committed (its fence's row lock
        would hold up theirs); returns the seconds spent binding values here."""
        window, stmts, queries = prepared.window, prepared.statements, prepared.queries
        workers = self._workers
        self._workers_used = 0
        split = None
        if workers is not None and queries is not None and prepared.plan is not None:
            split = workers.split(prepared.plan, stmts, self._router)
        if split is None or queries is None or workers is None:
            return self._execute(cur, stmts, queries, window, checkpoint)
        own, shares = split
        for st, query in zip(stmts, queries, strict=True):
            # As on one session: a statement the server would refuse fails the window before any is sent.
            self._check_size(st, query, window)
        started = workers.start(shares, stmts, queries, lambda c, s, q: self._execute(c, s, q, window))
        watched = self._watched
        if watched is not None:
            for session_id, _future in started:
                watched.also(session_id)  # reported when they wait on a lock, killed on stop
        failed: WorkerFailed | None = None
        try:
            self._execute(cur, [stmts[i] for i in own], [queries[i] for i in own], window)
        finally:
            try:
                workers.wait(started)  # never leave a worker running into the next attempt
            except WorkerFailed as exc:
                failed = exc
        if failed is None:
            self._workers_used = len(started)
            return self._execute(cur, [], [], window, checkpoint)
        cause = failed.__cause__
        if isinstance(cause, FencedOut):
            raise cause
        if self._stop_requested():
            raise Stopping() from cause
        self.log.warning(
            "a worker session failed: writing the whole window on its own session",
            error=str(cause),
            resolved_ts=window.target_ts,
        )
        cur.connection.rollback()
        return self._execute(cur, stmts, queries, window, checkpoint)

    def _execute(
        self,
        cur: pymysql.cursors.Cursor,
        stmts: list[Statement],
        queries: list[str] | None,
        window: Window,
        checkpoint: ProgressWrite | None = None,
    ) -> float:
        """Run the statements of a window (``queries``: their text, already bound), then those of
        ``checkpoint``, in as few packets as the session takes (applier.downstream.batch); returns
        the seconds spent binding values. A permanent error becomes an ``ApplyError`` naming the row."""
        bind = 0.0
        if queries is None:
            started = time.monotonic()
            queries = [st.bound(cur.connection.escape) for st in stmts]
            bind = time.monotonic() - started
        for st, query in zip(stmts, queries, strict=True):
            self._check_size(st, query, window)  # before anything is sent
        texts = queries if checkpoint is None else [*queries, *checkpoint.texts]
        fetch = () if checkpoint is None else [len(queries) + i for i in checkpoint.fetch]
        try:
            rows = execute_batch(cur, texts, fetch=fetch)
        except BatchFailed as failed:
            exc = failed.error
            if failed.index >= len(stmts) or is_transient(exc) or error_code(exc) in BINLOG_CACHE_FULL:
                raise exc from None  # the checkpoint's, replayed, or said by _retry for the whole window
            st = stmts[failed.index]
            raise ApplyError(
                f"downstream refused {st.kind.upper()} on {st.schema}.{st.table} "
                f"(first key {st.first_key!r}, {st.rows} rows, window up to ts "
                f"{window.target_ts}): MySQL error {error_code(exc)}: {exc.args[-1]}"
            ) from None
        if checkpoint is not None:
            checkpoint.check(rows, len(queries))
        return bind

    def _check_size(self, st: Statement, query: str, window: Window) -> None:
        """An ApplyError for a statement larger than the server's ``max_allowed_packet`` (the
        server would drop the session), raised before anything of the window is sent."""
        too_large = statement_too_large(st, query, self._dialect)
        if too_large is not None:
            raise ApplyError(
                f"{too_large}; window up to ts {window.target_ts}: nothing of it "
                "is written, the checkpoint stays before it"
            )

    def _apply_ddl(self, window: Window) -> None:
        """Run the window's DDL exactly once (:mod:`applier.apply.ddl`: journal, fenced execution
        on the lock's session, record) with the window's checkpoint in the recording transaction."""
        ddl = window.ddl
        assert ddl is not None
        if self._ddl is None:
            raise ApplyError("no DDL executor configured: cannot apply a DDL window")
        executor = self._ddl
        online = self.online_ddls
        outcome: list[DDLOutcome] = []
        beside = online is not None and (
            runs_online(ddl) or (self._holds_tables and beside_scope(ddl, self._router) is not None)
        )

        bookkeeping = Bookkeeping(
            progress=lambda cur: self._store.progress_write(cur, **self._progress(window)),
            before_commit=self._before_commit,
        )

        def unit() -> None:
            self._maybe_committed = False  # the executor asks the journal and applied_ddl itself
            if online is None:
                outcome[:] = [executor.apply(self.conn, ddl, bookkeeping)]
                return
            # A DDL beside the stream that shares an object with this one finishes first: its
            # journal decides from the catalogue, which nothing else may change meanwhile.
            self.conn.rollback()  # no metadata lock of ours may be what that DDL waits for
            if not online.wait_for(ddl, self._stop_requested):
                raise Stopping()
            if not beside:
                outcome[:] = [executor.apply(self.conn, ddl, bookkeeping)]
                return
            result, entry = executor.record_online(self.conn, ddl, bookkeeping)
            outcome[:] = [result]
            if entry is not None:
                online.start(entry)
            elif result.note == "recorded before":  # its journal row, if any, runs now
                online.resume(self.conn)

        started = time.monotonic()
        try:
            self._retry(unit, window)
        except DDLFailed as exc:
            raise ApplyError(str(exc)) from None
        self.stats.ddls += 1
        self.stats.transactions += 1
        result = outcome[0]
        self.log.info(
            ("DDL recorded, running beside the stream" if beside else "DDL applied")
            if result.plan.execute
            else "DDL skipped",
            ts=ddl.commit_ts,
            schema=ddl.schema,
            table=ddl.table,
            ddl_type=ddl.ddl_type,
            reason=result.plan.reason,
            note=result.note or None,
            query=" ".join(ddl.query.split())[:200],
            seconds=round(time.monotonic() - started, 3),
        )


_NOT_WATCHED = contextlib.nullcontext()


def _cache_full_line(window: Window | None, setting: str, exc: pymysql.MySQLError) -> str:
    """The one line that stops the daemon when a window is larger than the server's binary log
    cache allows: permanent, since the same window fails the same way on every replay.

    Splitting the window instead would commit parts of upstream transactions (and, for keyless
    tables, rows a crash could not tell apart from their replay), so the operator decides: raise
    the server's limit, or cut windows smaller when the window holds several upstream
    transactions (a single upstream transaction is never cut)."""
    what = "the window"
    advice = f"raise the server's {setting} (SET GLOBAL {setting} = ...; new sessions use it)"
    if window is not None:
        what = f"the window up to ts {window.target_ts}"
        if window.ddl is None:
            txns = len({r.commit_ts for r in window.rows}) if window.streamed is None else 1
            what += f" ({window.row_count} rows of {txns} upstream transaction{'s' if txns != 1 else ''})"
            if txns > 1:
                advice += f", or lower max_txn_rows below {window.row_count}"
    return (
        f"{what} does not fit the downstream's binary log cache (MySQL error {error_code(exc)}: "
        f"{exc.args[-1]}): {advice}; nothing of it is written, the checkpoint stays before it"
    )


def _unit_description(window: Window | None, router: Router) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What the statement watch says a unit is, and the (downstream) tables it needs locks on."""
    if window is None:
        return "a downstream transaction", ()
    if window.ddl is not None:
        ddl = window.ddl
        what = f"DDL at ts {ddl.commit_ts} on {ddl.schema}.{ddl.table}: {ddl.query}"
        target = route_ddl(ddl, router)
        return what, ((target.schema, target.table),)
    tables = tuple(sorted(router.table(*t) for t in window.tables) if router else sorted(window.tables))
    names = ", ".join(f"{s}.{t}" for s, t in tables[:5]) + (", ..." if len(tables) > 5 else "")
    return f"rows of the window up to ts {window.target_ts} ({window.row_count} rows; {names})", tables


def _add_counts(counts: dict[tuple[str, str, str], int], plan: WindowPlan) -> None:
    """Add a plan's rows by (schema, table, op) to ``counts`` (zero counts left out)."""
    for tid, by_op in plan.row_counts().items():
        for op, n in by_op.items():
            if n:
                key = (tid[0], tid[1], op)
                counts[key] = counts.get(key, 0) + n


def _rollback_quietly(conn: pymysql.connections.Connection) -> None:
    # The connection may be gone; the server then rolls back on its own.
    with contextlib.suppress(Exception):
        conn.rollback()

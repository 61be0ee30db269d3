"""Apply one window downstream: its rows (or its DDL) and the checkpoint, in one transaction.

This is the "plan -> SQL -> database + checkpoint" end of the data flow. A window is immutable,
so a transient error (deadlock, lost connection, server restart) simply replays the whole
transaction from memory after a reconnect; a permanent error stops the daemon with a message that
names the table, the statement kind and the first offending key.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pymysql

from applier.codec.events import tso_physical_ms
from applier.downstream.errors import error_code, is_transient
from applier.downstream.retry import Backoff, RetryInfo, run_with_retry
from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig
from applier.logs import get_logger
from applier.window import Window
from checkpoint import CheckpointStore
from sqlgen import Dialect, ErrorClass, classify_ddl_error, plan_ddl, plan_window, statements


class ApplyError(RuntimeError):
    """A permanent downstream error: replaying cannot help, an operator must look."""


class Stopping(Exception):
    """Raised inside a retry wait when the daemon was asked to stop (SIGTERM/SIGINT)."""


@dataclass
class ApplyStats:
    """Counters the daemon logs (and, later, exports as metrics)."""

    windows: int = 0
    transactions: int = 0
    ddls: int = 0
    retries: int = 0
    rows_by_table_op: dict[tuple[str, str, str], int] = field(default_factory=dict)


class WindowApplier:
    """Owns the apply connection; turns windows into committed transactions."""

    def __init__(
        self,
        downstream: DownstreamConfig,
        store: CheckpointStore,
        *,
        topic: str,
        dialect: Dialect,
        owner: str | None = None,
        stop_requested: Callable[[], bool] = lambda: False,
        on_retry: Callable[[BaseException], None] = lambda exc: None,
        before_commit: Callable[[], None] = lambda: None,
        backoff: Backoff | None = None,
    ) -> None:
        self._cfg = downstream
        self._store = store
        self._topic = topic
        self._dialect = dialect
        self._owner = owner
        self._stop_requested = stop_requested
        self._notify_retry = on_retry
        self._before_commit = before_commit
        self._backoff = backoff or Backoff(initial=0.2, maximum=10.0)
        self._conn: pymysql.connections.Connection | None = None
        self.stats = ApplyStats()
        self.log = get_logger(component="apply")

    # -- connection ----------------------------------------------------------------------------
    @property
    def conn(self) -> pymysql.connections.Connection:
        if self._conn is None:
            self._conn = connect(self._cfg)
        return self._conn

    def _reconnect(self) -> None:
        close_quietly(self._conn)
        self._conn = None
        _ = self.conn

    def close(self) -> None:
        close_quietly(self._conn)
        self._conn = None

    def _sleep(self, seconds: float) -> None:
        """Backoff wait that gives up as soon as a stop is requested (exit within seconds)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._stop_requested():
                raise Stopping()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _on_retry(self, info: RetryInfo) -> None:
        self.stats.retries += 1
        self._notify_retry(info.error)
        self.log.warning(
            "transient downstream error, replaying the transaction",
            attempt=info.attempt,
            error=str(info.error),
            code=error_code(info.error),
            wait_s=round(info.wait, 2),
        )

    def _retry(self, unit: Callable[[], None]) -> None:
        run_with_retry(
            unit,
            reconnect=self._reconnect,
            max_attempts=None,
            max_time=None,
            backoff=self._backoff,
            on_retry=self._on_retry,
            sleep=self._sleep,
        )

    # -- windows -------------------------------------------------------------------------------
    def apply(self, window: Window) -> dict[tuple[str, str, str], int]:
        """Commit ``window`` (rows or DDL) together with its checkpoint; raise ApplyError if impossible.

        Returns the row operations written, by (schema, table, op), for metrics.
        """
        started = time.monotonic()
        counts: dict[tuple[str, str, str], int] = {}
        if window.ddl is not None:
            self._apply_ddl(window)
        else:
            counts = self._apply_rows(window)
        self.stats.windows += 1
        lag = time.time() - tso_physical_ms(window.target_ts) / 1000.0 if window.target_ts else None
        if window.ddl is None:
            self.log.info(
                "window applied",
                rows=len(window.rows),
                tables=len(window.tables),
                resolved_ts=window.target_ts,
                lag_s=round(lag, 3) if lag is not None else None,
                seconds=round(time.monotonic() - started, 3),
            )
        return counts

    def _write_checkpoint(self, cur: pymysql.cursors.Cursor, window: Window) -> None:
        offsets = {p: o for p, o in window.resume_offsets.items() if o is not None}
        self._store.write(
            cur,
            topic=self._topic,
            resolved_ts=window.target_ts,
            tables=dict.fromkeys(window.tables, window.target_ts),
            offsets=offsets,
            partition_resolved={p: ts for p, ts in window.resolved.items() if p in offsets},
            owner=self._owner,
        )

    def _apply_rows(self, window: Window) -> dict[tuple[str, str, str], int]:
        """One transaction: deletes, replaces and keyless ops of the window, then the checkpoint.

        The barrier already bounds a window to about ``max_txn_rows`` rows by whole upstream
        transactions, so a window is never split here and the checkpoint always moves with it.
        """
        plan = plan_window(window.rows)
        stmts = list(statements(plan, self._dialect))

        def unit() -> None:
            conn = self.conn
            try:
                with conn.cursor() as cur:
                    for st in stmts:
                        try:
                            cur.execute(st.sql, st.params)
                        except pymysql.MySQLError as exc:
                            if is_transient(exc):
                                raise
                            raise ApplyError(
                                f"downstream refused {st.kind.upper()} on {st.schema}.{st.table} "
                                f"(first key {st.first_key!r}, {st.rows} rows, window up to ts "
                                f"{window.target_ts}): MySQL error {error_code(exc)}: {exc.args[-1]}"
                            ) from None
                    self._write_checkpoint(cur, window)
                self._before_commit()
                conn.commit()
            except BaseException:
                _rollback_quietly(conn)
                raise

        self._retry(unit)
        self.stats.transactions += 1
        counts: dict[tuple[str, str, str], int] = {}
        for tid, by_op in plan.row_counts().items():
            for op, n in by_op.items():
                if n:
                    key = (tid[0], tid[1], op)
                    counts[key] = n
                    self.stats.rows_by_table_op[key] = self.stats.rows_by_table_op.get(key, 0) + n
        return counts

    def _apply_ddl(self, window: Window) -> None:
        ddl = window.ddl
        assert ddl is not None
        plan = plan_ddl(ddl.query, ddl.ddl_type, ddl.schema, self._dialect)

        def unit() -> None:
            conn = self.conn
            try:
                with conn.cursor() as cur:
                    for sql in plan.statements():
                        try:
                            cur.execute(sql)
                        except pymysql.MySQLError as exc:
                            code = error_code(exc)
                            cls = classify_ddl_error(code)
                            if cls is ErrorClass.ALREADY_APPLIED:
                                self.log.info("DDL already applied downstream", code=code, ts=ddl.commit_ts)
                                continue
                            if is_transient(exc):
                                raise
                            raise ApplyError(
                                f"DDL at ts {ddl.commit_ts} on {ddl.schema}.{ddl.table} failed with MySQL "
                                f"error {code}: {exc.args[-1]}; query: {ddl.query[:300]}"
                            ) from None
                    self._store.record_ddl(
                        cur,
                        commit_ts=ddl.commit_ts,
                        schema=ddl.schema,
                        table=ddl.table,
                        ddl_type=ddl.ddl_type,
                        query=ddl.query,
                    )
                    self._write_checkpoint(cur, window)
                self._before_commit()
                conn.commit()
            except BaseException:
                _rollback_quietly(conn)
                raise

        self._retry(unit)
        self.stats.ddls += 1
        self.stats.transactions += 1
        self.log.info(
            "DDL applied" if plan.execute else "DDL skipped",
            ts=ddl.commit_ts,
            schema=ddl.schema,
            table=ddl.table,
            ddl_type=ddl.ddl_type,
            reason=plan.reason,
            query=" ".join(ddl.query.split())[:200],
        )


def _rollback_quietly(conn: pymysql.connections.Connection) -> None:
    # The connection may be gone; the server then rolls back on its own.
    with contextlib.suppress(Exception):
        conn.rollback()

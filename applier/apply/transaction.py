"""The transaction unit: one downstream session that runs units of work until each commits.

A unit is a function of the connection that runs its statements, writes its checkpoint rows,
checks the single-active lock and commits. The rule, the same for the daemon's windows and the
catch-up's epochs, writers and DDLs: a transient error (``applier.downstream.errors.is_transient``:
deadlock, lock wait timeout, lost connection) rolls the unit back, reconnects and replays it whole
after a backoff; any other error rolls back and propagates at once. Replaying is safe only
because a unit is all in memory and either committed whole or not at all; a unit whose COMMIT
may have landed before the connection died must check that itself on its next attempt (the
daemon's windows and the catch-up's keyless tables do, through the checkpoint).

A lost connection may be lost on our side only (a read timeout, a network path that stopped
forwarding): the server then keeps the old session, inside its transaction and holding its row
locks, for as long as its ``wait_timeout``. So the new session first ends the old one and waits
until it is gone (``applier.downstream.session.end_session``): the replay does not wait on the old
session's locks, and the old transaction's outcome is final before anyone asks the checkpoint
whether it committed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pymysql

from applier.downstream.retry import Backoff, RetryInfo, run_with_retry
from applier.downstream.session import SessionRef, close_quietly, connect, end_session, session_ref
from applier.downstream.url import DownstreamConfig
from applier.ops.logs import get_logger

Unit = Callable[[pymysql.connections.Connection], None]


class TransactionRunner:
    """Runs units on one session, reconnecting and replaying them on transient errors.

    ``max_time``: how long one unit may keep failing before its last error propagates (None: for
    ever, what a daemon riding out a database restart wants). ``on_connect`` is called with each
    new session; ``on_reconnect`` after a reconnect, once the previous session is ended.
    ``session`` names the current session on the server (the statement watch looks for its id).
    ``multi_statements``: its sessions take several statements a packet (``applier.downstream.batch``),
    for units that run the applier's own statements only.
    """

    def __init__(
        self,
        downstream: DownstreamConfig,
        *,
        max_time: float | None,
        backoff: Backoff | None = None,
        on_retry: Callable[[RetryInfo], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        on_connect: Callable[[pymysql.connections.Connection], None] | None = None,
        on_reconnect: Callable[[], None] | None = None,
        multi_statements: bool = False,
    ) -> None:
        self.downstream = downstream
        self.multi_statements = multi_statements
        self.max_time = max_time
        self.backoff = backoff or Backoff(initial=0.2, maximum=10.0)
        self.on_retry = on_retry
        self.sleep = sleep
        self.on_connect = on_connect
        self.on_reconnect = on_reconnect
        self.session: SessionRef | None = None
        self.log = get_logger(component="transaction")
        self._conn: pymysql.connections.Connection | None = None

    @property
    def conn(self) -> pymysql.connections.Connection:
        """The session, opened when first needed."""
        if self._conn is None:
            conn = connect(self.downstream, multi_statements=self.multi_statements)
            try:
                self.session = session_ref(conn)
                if self.on_connect is not None:
                    self.on_connect(conn)
            except BaseException:
                close_quietly(conn)
                raise
            self._conn = conn
        return self._conn

    def reconnect(self) -> None:
        previous = self.session
        self.close()
        conn = self.conn
        if previous is not None and not end_session(conn, previous):
            self.log.warning(
                "the lost session could not be ended; the server keeps it until its wait_timeout",
                session_id=previous.id,
            )
        if self.on_reconnect is not None:
            self.on_reconnect()

    def run(self, unit: Unit) -> None:
        """Run ``unit(conn)`` until it returns (it commits itself); see the module docstring."""

        def attempt() -> None:
            conn = self.conn
            try:
                unit(conn)
            except BaseException:
                with contextlib.suppress(Exception):  # the session may be gone; the server rolls back
                    conn.rollback()
                raise

        run_with_retry(
            attempt,
            reconnect=self.reconnect,
            max_attempts=None,
            max_time=self.max_time,
            backoff=self.backoff,
            on_retry=self.on_retry,
            sleep=self.sleep,
        )

    def rollback_quietly(self) -> None:
        """Roll back the open session's transaction, if a session is open; a dead session is left
        to the server, which rolls back on its own."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.rollback()

    def close(self) -> None:
        close_quietly(self._conn)
        self._conn = None

"""The transaction unit: one downstream session that runs units of work until each commits.

A unit is a function of the connection that runs its statements, writes its checkpoint rows,
checks the single-active lock and commits. The rule, the same for the daemon's windows and the
catch-up's epochs, writers and DDLs: a transient error (``applier.downstream.errors.is_transient``:
deadlock, lock wait timeout, lost connection) rolls the unit back, reconnects and replays it whole
after a backoff; any other error rolls back and propagates at once. Replaying is safe only
because a unit is all in memory and either committed whole or not at all; a unit whose COMMIT
may have landed before the connection died must check that itself on its next attempt (the
daemon's windows and the catch-up's keyless tables do, through the checkpoint).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pymysql

from applier.downstream.retry import Backoff, RetryInfo, run_with_retry
from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig

Unit = Callable[[pymysql.connections.Connection], None]


class TransactionRunner:
    """Runs units on one session, reconnecting and replaying them on transient errors.

    ``max_time``: how long one unit may keep failing before its last error propagates (None: for
    ever, what a daemon riding out a database restart wants). ``on_connect`` is called with each
    new session (the daemon learns its connection id there); ``on_reconnect`` after a reconnect.
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
    ) -> None:
        self.downstream = downstream
        self.max_time = max_time
        self.backoff = backoff or Backoff(initial=0.2, maximum=10.0)
        self.on_retry = on_retry
        self.sleep = sleep
        self.on_connect = on_connect
        self.on_reconnect = on_reconnect
        self.transactions = 0
        self._conn: pymysql.connections.Connection | None = None

    @property
    def conn(self) -> pymysql.connections.Connection:
        """The session, opened when first needed."""
        if self._conn is None:
            conn = connect(self.downstream)
            if self.on_connect is not None:
                try:
                    self.on_connect(conn)
                except BaseException:
                    close_quietly(conn)
                    raise
            self._conn = conn
        return self._conn

    def reconnect(self) -> None:
        self.close()
        _ = self.conn
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
        self.transactions += 1

    def close(self) -> None:
        close_quietly(self._conn)
        self._conn = None

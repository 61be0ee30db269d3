"""Worker sessions: extra downstream sessions that write the keyed rows of a large window beside the
window's own session (``apply_workers``).

One session per window made the database's single thread the pace of the daemon: the server has
cores to spare while one session executes a 5,000-row REPLACE. Workers split a window's keyed
statements among themselves; the window's own session (the one that writes the checkpoint) keeps
the rest and commits last. Why the guarantees hold:

- **What a worker may write.** Only statements whose replay leaves the same rows: keyed ``DELETE``
  by handle key and ``REPLACE`` of final images, of tables whose keys hold no NULL. Each sets its
  rows to their state at the window's resolved ts, whatever ran before it and in whatever order
  (:mod:`sqlgen.collapse` says why any order converges). Keyless tables' ``INSERT`` and ``DELETE
  ... LIMIT 1``, and keys with a NULL, stay on the window's own session: they commit with the
  checkpoint or not at all, as without workers.
- **The checkpoint.** The window's own session writes it after every worker committed, so it never
  moves past rows not written. A worker whose commit lands while the window's transaction does not
  (a crash, an error elsewhere) is harmless: the window is applied again from the checkpoint and
  its statements write the same rows.
- **The fence.** Each worker checks, under a shared lock on the changefeed row, that this instance
  is still its owner before it commits (:meth:`checkpoint.CheckpointStore.fence`); an instance that
  lost the changefeed to another writes nothing more, as its own session's exclusive check ensures
  for the checkpoint.
- **No stall.** A worker commits as soon as its statements are done and never waits for another
  session while it holds locks, so a lock wait between two workers ends with a commit or with a
  deadlock the server detects. The window's own session holds no lock a worker needs (other
  tables, the checkpoint tables; ``foreign_key_checks=0``).
- **Errors.** When a worker fails, the window's own session rolls back its part and writes the
  whole window itself (:class:`WorkerFailed`), so a permanent error is reported exactly as
  without workers and a deadlock between workers costs one pass on one session.

What it gives up: between the first worker's commit and the checkpoint's, a reader of the
downstream can see some keys of the window at the new resolved ts and others still at the
previous one (TiCDC's own MySQL sink, with its several workers, behaves so too). With no
workers (the default), every window is one transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pymysql

from applier.apply.transaction import TransactionRunner
from applier.downstream.url import DownstreamConfig
from sqlgen import Router, Statement, WindowPlan

MIN_ROWS = 5_000
"""Windows with fewer rows are written by their own session alone: the workers' round trips and
commits would cost more than they save."""


class WorkerFailed(Exception):
    """A worker's statements failed (its error is the cause): the window is written on its own
    session instead."""


Execute = Callable[[pymysql.cursors.Cursor, list[Statement], list[str]], object]
"""Runs statements (with their bound text) on a cursor; raises what the window's own session would."""


class WorkerSessions:
    """``count`` sessions and the threads that drive them; see the module docstring."""

    def __init__(
        self,
        downstream: DownstreamConfig,
        count: int,
        *,
        fence: Callable[[pymysql.cursors.Cursor], None],
        min_rows: int = MIN_ROWS,
    ) -> None:
        self.min_rows = min_rows
        self._runners = [
            TransactionRunner(downstream, max_time=None, multi_statements=True) for _ in range(count)
        ]
        self._lost = [False] * count  # the session failed: end it and open a new one before its next use
        self._fence = fence
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="applier-worker")

    def split(
        self, plan: WindowPlan, statements: Sequence[Statement], router: Router
    ) -> tuple[list[int], list[list[int]]] | None:
        """Indexes into ``statements``: those the window's own session keeps, and each worker's
        share (balanced by rows, in statement order); None when the window is not worth splitting."""
        if sum(st.rows for st in statements) < self.min_rows:
            return None
        shareable = {
            router.table(*tid) if router else tid
            for tid, tp in plan.tables.items()
            if tp.keyed
            and not any(None in k for g in tp.upserts for k in g.keys)
            and not any(None in k for g in tp.deletes for k in g.keys)
        }
        own: list[int] = []
        shares: list[list[int]] = [[] for _ in self._runners]
        loads = [0] * len(shares)
        for i, st in enumerate(statements):
            if st.first_key is None or (st.schema, st.table) not in shareable:
                own.append(i)
                continue
            w = loads.index(min(loads))
            shares[w].append(i)
            loads[w] += st.rows
        busy = sum(1 for s in shares if s)
        if busy == 0 or (busy == 1 and not own):
            return None  # nothing for the workers, or one would only do what the window's own session does
        return own, shares

    def start(
        self, shares: list[list[int]], statements: list[Statement], queries: list[str], execute: Execute
    ) -> list[tuple[int, Future[None]]]:
        """Start each non-empty share on its worker; returns (session id, future) of each started.

        Every session is opened first: when one cannot be (the server is down), nothing is started
        and the error goes to the caller, which replays the window as for any transient error."""
        busy = [w for w, share in enumerate(shares) if share]
        conns = {w: self._session(w) for w in busy}
        started = []
        for w in busy:
            stmts = [statements[i] for i in shares[w]]
            texts = [queries[i] for i in shares[w]]
            session = self._runners[w].session
            future = self._pool.submit(self._write, w, conns[w], stmts, texts, execute)
            started.append((session.id if session else 0, future))
        return started

    @staticmethod
    def wait(started: list[tuple[int, Future[None]]]) -> None:
        """Wait for every started worker; raise :class:`WorkerFailed` (from the first error) if any failed."""
        first: BaseException | None = None
        for _sid, fut in started:
            exc = fut.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise WorkerFailed(str(first)) from first

    def _session(self, w: int) -> pymysql.connections.Connection:
        runner = self._runners[w]
        if self._lost[w]:
            runner.reconnect()  # ends the old session first: its locks are gone before we write
            self._lost[w] = False
        return runner.conn

    def _write(
        self,
        w: int,
        conn: pymysql.connections.Connection,
        stmts: list[Statement],
        texts: list[str],
        execute: Execute,
    ) -> None:
        try:
            with conn.cursor() as cur:
                execute(cur, stmts, texts)
                self._fence(cur)
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback()
            self._lost[w] = True  # whatever happened, the next window starts on a fresh session
            raise

    def close(self) -> None:
        # Not waiting: a daemon that leaves a window in flight to the server (applier.daemon.windows,
        # WindowPipeline.wait) has killed the workers' statements already, and closes their sessions here.
        self._pool.shutdown(wait=False, cancel_futures=True)
        for runner in self._runners:
            with contextlib.suppress(Exception):
                runner.close()

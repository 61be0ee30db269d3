"""The windows the daemon has in the works: the one in flight and the one prepared after it.

A two-stage pipeline: the apply thread executes window N (``inflight``) while the daemon's thread
reads records and builds the SQL of window N+1 (``prepared``, built by the barrier as if N were
applied). Windows are still committed one at a time in barrier order, and a window is marked
applied (and the group offsets committed) only after its transaction committed. While nothing
can be released and the daemon follows the stream, the apply thread writes early pieces instead
(``applier.apply.early``).

It also keeps when each window could first be released (``ready_at``): the read that moved the
barrier's global resolved ts past its base, so that a window's log line and metrics can say how
long the daemon itself took from then to the commit, apart from Kafka's delivery.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from applier.apply.window_applier import PendingApply, PreparedWindow, Stopping, WindowApplier
from applier.daemon.tuning import Tuning
from applier.downstream.watch import StatementWatch
from applier.kafka.reader import PartitionReader
from applier.ops.observer import Observer, WindowApplied
from applier.stream.barrier import Barrier
from applier.stream.window import Window


class WindowPipeline:
    """The window in flight, the one prepared after it, and when each could first be released."""

    def __init__(
        self,
        reader: PartitionReader,
        barrier: Barrier,
        applier: WindowApplier,
        *,
        tuning: Tuning,
        max_txn_rows: int,
        observer: Observer,
        stop: threading.Event,
        statements: StatementWatch | None,
        may_write_early: Callable[[], bool],
        log: Any,
    ) -> None:
        self.reader, self.barrier, self.applier = reader, barrier, applier
        self.tuning = tuning
        self.max_rows = min(max_txn_rows, tuning.merge_max_rows)
        """Merge ready windows into one transaction up to this many rows."""
        self.observer = observer
        self._stop = stop
        self.statements = statements
        self._may_write_early = may_write_early
        self.log = log
        self.inflight: PendingApply | None = None
        """The window (or early piece) the apply thread works on."""
        self.prepared: PreparedWindow | None = None
        """The next one, its SQL built ahead."""
        self._ready: collections.deque[tuple[int, float]] = (
            collections.deque()
        )  # (global resolved ts, read at)
        self.read_at = 0.0
        """Wall-clock time the batch being fed was read."""

    # -- when windows could be released ----------------------------------------------------------
    def note_ready(self) -> None:
        """Remember when the barrier's global resolved ts moved (when the batch that moved it was
        read), so that each window can say how long it took from the moment it could be released
        to its commit (``ready_s`` of its log line). Called after each batch is fed and before each
        window starts (windows are also handed over mid-batch: ``hand_over``)."""
        ts = self.barrier.global_resolved()
        if not self._ready or ts > self._ready[-1][0]:
            self._ready.append((ts, self.read_at))

    def ready_at(self, window: Window) -> float | None:
        """When ``window`` could first be released: the read that moved the global resolved ts
        past its base. Entries the window covers are dropped (the next window's base is its target)."""
        ready = self._ready
        while ready and ready[0][0] <= window.base_ts:
            ready.popleft()
        at = ready[0][1] if ready else None
        while ready and ready[0][0] <= window.target_ts:
            ready.popleft()
        return at

    # -- applying --------------------------------------------------------------------------------
    def apply_ready(self, drain: bool = False) -> bool:
        """Collect the window in flight if it is done, start the next one, prepare the one after;
        True when a window was marked applied.

        ``drain=True`` waits instead: for the window in flight and then for every window that can
        be released now (or, once a stop is requested, only for the one in flight).
        """
        applier = self.applier
        applied = False
        while True:
            pending = self.inflight
            if pending is not None and pending.early:
                # An early piece: nothing to mark applied; a window released meanwhile starts as
                # soon as it is written.
                if not drain and not pending.done():
                    break
                if not self.wait(pending):
                    self.inflight = None
                    raise Stopping()
                self.inflight = None
                pending.result()
                pending = None
            if pending is not None:
                if not drain and not pending.done():
                    if self.prepared is None:
                        self.prepare_next(pending)
                    applier.deliver_notifications()  # retries of a window that is still failing
                    break
                if not self.wait(pending):
                    self.inflight = None
                    raise Stopping()
                try:
                    rows = pending.result()
                finally:
                    self.inflight = None
                    applier.deliver_notifications()
                self._applied(pending, rows)
                applied = True
            if self._stop.is_set():
                self.prepared = None
                break
            prepared, self.prepared = self.prepared, None
            if prepared is None:
                window = self.barrier.next_window(self.max_rows, merge=True)
                if window is None:
                    if not drain:
                        # Row mode: the changefeed row's resolved ts, if behind; else early rows.
                        self.inflight = applier.summary_async()
                        if self.inflight is None:
                            self._write_early()
                    break
                prepared = applier.prepare(window)
            self.note_ready()
            self.observer.on_apply_start(prepared.window)
            self.inflight = applier.apply_async(prepared, ready_at=self.ready_at(prepared.window))
        return applied

    def _applied(self, pending: PendingApply, rows: dict[tuple[str, str, str], int]) -> None:
        """A window committed: mark it applied, tell the observers, commit the group offsets."""
        window = pending.window
        self.barrier.mark_applied(window)
        self.observer.on_window(
            WindowApplied(
                window=window,
                seconds=time.monotonic() - pending.started,
                rows=rows,
                commit_time=pending.committed_at,
                ready_at=pending.ready_at,
            )
        )
        self.reader.commit({p: o for p, o in window.resume_offsets.items() if o is not None})

    def hand_over(self) -> None:
        """Inside a batch: hand the database its next window as soon as the one in flight is done,
        else build a full one ahead (``prepare_next``)."""
        pending = self.inflight
        if pending is None:
            return
        if pending.done():
            self.apply_ready()
        elif self.prepared is None:
            self.prepare_next(pending, full_only=True)

    def prepare_next(self, pending: PendingApply, full_only: bool = False) -> None:
        """Build the window after ``pending`` (a row window being applied) while the database works.

        After each batch (``apply_ready``) it takes whatever can be released. Inside a batch
        (``hand_over``, ``full_only``) only a full window: one built there with fewer rows would
        be cut short of the rows the rest of the batch releases (more, smaller windows), while a
        full one holds the rows the end of the batch would put in it. Without it, a window that
        became releasable while a batch was decoded, behind one that committed before the batch
        ended, would be planned after that commit with the database idle.
        """
        if pending.early or self._stop.is_set():
            return
        if full_only and self.barrier.rows_ready_after(pending.window) < self.max_rows:
            return
        ahead = self.barrier.next_window(self.max_rows, merge=True, after=pending.window)
        if ahead is not None:
            self.prepared = self.applier.prepare(ahead)

    def _write_early(self) -> None:
        """Nothing can be released: write the next early piece, if the daemon follows the stream
        (the next window is only a read away while it works through a backlog, and pieces would
        only cut it into more, smaller statements) and ``EarlyWriter`` has one."""
        if not self._may_write_early():
            return
        window = self.applier.early.next_piece(self.barrier, self.max_rows)
        if window is not None:
            self.inflight = self.applier.write_early_async(window)

    # -- the way out -----------------------------------------------------------------------------
    def finish(self) -> None:
        """On the way out: wait for the window in flight, whatever its outcome.

        Its transaction either commits (with its checkpoint: a restart resumes after it) or rolls
        back; both are consistent. Its own error, if any, is dropped: the error that is already
        stopping the daemon is the one to report. Bounded: leaving for an error is a stop too,
        and a statement waiting on a lock is killed.
        """
        pending, self.inflight, self.prepared = self.inflight, None, None
        if pending is not None:
            if self.wait(pending, stopping=True):
                with contextlib.suppress(BaseException):
                    pending.result()
            self.applier.deliver_notifications()

    def wait(self, pending: PendingApply, stopping: bool = False) -> bool:
        """Wait for the window in flight; False when the daemon leaves without it.

        Waits as long as the window takes, until a stop is requested (or ``stopping``): then
        the window gets ``stop_grace_seconds`` to finish, after which its statement is killed
        from the watch's session, first ``KILL QUERY`` (the apply thread rolls back and raises
        ``Stopping``), then ``KILL CONNECTION``. A window still running after that is left to the
        server: its transaction commits together with its checkpoint or not at all, as after a
        SIGKILL, so a restart resumes at the right place either way.
        """
        grace = self.tuning.stop_grace_seconds
        while not pending.wait(self.tuning.poll_timeout):
            if stopping or self._stop.is_set():
                break
        else:
            return True
        if pending.wait(grace):
            return True
        for connection in (False, True):
            killed = self.statements.interrupt(connection=connection) if self.statements else []
            self.log.warning(
                "stop: the window in flight did not finish; killing its statement",
                kill="connection" if connection else "query",
                connections=killed,
            )
            if pending.wait(grace):
                return True
        self.log.warning(
            "stop: leaving without the window in flight; the server commits it with its checkpoint "
            "or rolls it back"
        )
        return False

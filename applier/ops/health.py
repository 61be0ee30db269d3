"""Liveness and readiness of the daemon, decided in one place for /healthz, /readyz and systemd.

The daemon's hooks (applier.ops.observer) feed a :class:`Health` object on the daemon's thread; the
HTTP server and the systemd watchdog read it from theirs. Only plain attribute assignments cross
threads, which the GIL makes atomic, so no lock is needed.

Definitions (the operations documentation repeats them):

* **alive** — the process runs and its loop turns: the state is ``starting``/``standby``/
  ``stopping``, or the loop ticked within :attr:`Health.loop_timeout` seconds, or a window is being
  applied (a long DDL can run for hours; the database is working, so the daemon is waiting
  healthily). ``failed`` is not alive.
* **ready** — active; not failing for ``retry_report_seconds`` (transient downstream errors,
  replayed, with no committed window for that long); no statement of the daemon waiting on a lock
  for longer than ``stall_seconds`` (``applier.downstream.watch``); and not stalled: something was
  read or applied, or every partition was read to its end, within ``stall_seconds``. A standby is
  alive but not ready, and says so. Not ready either while no Kafka broker is reachable
  (``applier.kafka.client_log``: from librdkafka's "all brokers down" until a broker answers
  again), however short the outage; nor while the start-up waits for the database, a broker or
  the topic (the reason says which and since when). A single deadlock or a reconnect that succeeds at once is
  normal operation and does not make the daemon unready.
* **waiting healthily** (the systemd watchdog criterion) — alive, and in the active loop also not
  stalled: a loop that spins without reading or applying anything for ``stall_seconds`` while
  records are waiting gets restarted by systemd.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from applier.downstream.errors import describe, retry_class
from applier.ops.observer import Observer, WindowApplied

if TYPE_CHECKING:
    from applier.downstream.watch import StatementWait
    from applier.kafka.reader import PartitionReader
    from applier.stream.barrier import Barrier
    from applier.stream.window import Window


@dataclass(frozen=True)
class Verdict:
    """One health answer: ``ok`` and a JSON-ready explanation."""

    ok: bool
    status: str
    detail: dict[str, Any]


class Health(Observer):
    """Tracks what the daemon does; answers "alive?" and "ready?" from any thread."""

    def __init__(
        self,
        stall_seconds: float = 300.0,
        loop_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        retry_report_seconds: float = 60.0,
    ) -> None:
        self.stall_seconds = float(stall_seconds)
        self.retry_report_seconds = float(retry_report_seconds)
        self.loop_timeout = float(loop_timeout)
        self._clock = clock
        self.state = "starting"
        self.loop_started = False
        self.last_tick: float | None = None
        self.last_healthy: float | None = None  # last progress, or last tick with everything read
        self.applying_since: float | None = None
        self.last_error: str | None = None
        self.failing_since: float | None = None  # first transient error since the last committed window
        self.retries: dict[str, int] = {}  # by class, since then
        self.last_retry_error: str | None = None
        self.waits: Sequence[StatementWait] = ()
        self.applied_ts = 0
        self.kafka_unreachable_since: float | None = None  # the reader's clock: monotonic, as ours
        self.kafka_error: str | None = None
        self.waiting: str | None = None  # what the start-up waits for (``on_waiting``)
        self.waiting_since: float | None = None

    # -- hooks (daemon thread) ----------------------------------------------------------------
    def on_state(self, state: str) -> None:
        self.state = state
        if state != "active":
            self.loop_started = False

    def on_waiting(self, reason: str | None) -> None:
        if reason is None:
            self.waiting = self.waiting_since = None
            return
        if self.waiting_since is None:
            self.waiting_since = self._clock()
        self.waiting = reason

    def on_ready(self) -> None:
        now = self._clock()
        self.loop_started = True
        self.last_tick = self.last_healthy = now
        # Transient errors the start-up rode out are over: it got through.
        self.failing_since = self.last_retry_error = None
        self.retries = {}

    def on_apply_start(self, window: Window) -> None:
        self.applying_since = self._clock()

    def on_window(self, applied: WindowApplied) -> None:
        now = self._clock()
        self.applying_since = None
        self.failing_since = self.last_retry_error = None
        self.retries = {}
        self.last_healthy = now
        self.applied_ts = max(self.applied_ts, applied.window.resolved_ts)

    def on_retry(self, error: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = self._clock()
        cls = retry_class(error)
        self.retries = {**self.retries, cls: self.retries.get(cls, 0) + 1}
        self.last_retry_error = describe(error)

    def on_statement_waits(self, waits: Sequence[StatementWait]) -> None:
        self.waits = tuple(waits)

    def on_error(self, kind: str) -> None:
        self.last_error = kind

    def on_tick(self, barrier: Barrier, reader: PartitionReader, progressed: bool) -> None:
        now = self._clock()
        self.last_tick = now
        # applying_since stays: the loop ticks while a window is applied on the apply thread, and a
        # long statement (an index built on a big table) is the daemon at work, not a stall.
        self.kafka_unreachable_since = reader.unreachable_since
        self.kafka_error = reader.last_kafka_error
        if progressed or reader.all_at_end():
            self.last_healthy = now

    # -- questions (any thread) ---------------------------------------------------------------
    def _ages(self, now: float) -> dict[str, float | None]:
        def age(t: float | None) -> float | None:
            return None if t is None else round(now - t, 3)

        return {
            "seconds_since_tick": age(self.last_tick),
            "seconds_since_progress": age(self.last_healthy),
            "applying_for_seconds": age(self.applying_since),
        }

    def alive(self) -> Verdict:
        now = self._clock()
        detail: dict[str, Any] = {"state": self.state, **self._ages(now)}
        if self.state == "failed":
            return Verdict(False, "failed", {**detail, "error": self.last_error})
        if self.state in ("starting", "standby", "stopping") or not self.loop_started:
            return Verdict(True, self.state, detail)
        if self.applying_since is not None:
            return Verdict(True, "applying", detail)
        if self.last_tick is not None and now - self.last_tick <= self.loop_timeout:
            return Verdict(True, "alive", detail)
        return Verdict(False, "loop stuck", {**detail, "loop_timeout_seconds": self.loop_timeout})

    def stalled(self, now: float | None = None) -> bool:
        """Active loop with nothing read or applied for ``stall_seconds`` while data is pending."""
        now = self._clock() if now is None else now
        if not self.loop_started or self.applying_since is not None:
            return False
        return self.last_healthy is None or now - self.last_healthy > self.stall_seconds

    def ready(self) -> Verdict:
        live = self.alive()
        now = self._clock()
        failing = None if self.failing_since is None else round(now - self.failing_since, 3)
        detail: dict[str, Any] = {
            **live.detail,
            "failing_for_seconds": failing,
            "applied_ts": self.applied_ts,
        }
        if not live.ok:
            return Verdict(False, live.status, detail)
        if self.state == "standby":
            return Verdict(False, "standby", {**detail, "reason": "another instance is active"})
        if self.waiting is not None and self.waiting_since is not None:
            reason = f"{self.waiting} (for {now - self.waiting_since:.0f} s)"
            return Verdict(False, "waiting", {**detail, "reason": reason})
        if self.state != "active" or not self.loop_started:
            return Verdict(False, self.state, detail)
        wait = min(self.waits, key=lambda w: w.since, default=None)  # the longest
        if wait is not None and now - wait.since > self.stall_seconds:
            reason = (
                f"a statement has waited {now - wait.since:.0f} s on a {wait.kind} lock "
                f"({wait.description[:200]}); {wait.blocked_by()}"
            )
            return Verdict(False, "waiting on a lock", {**detail, "reason": reason})
        unreachable = self.kafka_unreachable_since
        if unreachable is not None:
            reason = (
                f"no Kafka broker reachable for {now - unreachable:.0f} s; last error: {self.kafka_error}"
            )
            return Verdict(False, "kafka unreachable", {**detail, "reason": reason})
        if failing is not None and failing >= self.retry_report_seconds:
            errors = ", ".join(f"{cls}={n}" for cls, n in sorted(self.retries.items()))
            reason = (
                f"no downstream transaction committed for {failing:.0f} s: transient errors replayed "
                f"({errors}), last {self.last_retry_error}"
            )
            return Verdict(False, "retrying", {**detail, "reason": reason})
        if self.stalled(now):
            return Verdict(False, "stalled", {**detail, "stall_seconds": self.stall_seconds})
        return Verdict(True, "ready", detail)

    def waiting_healthily(self) -> bool:
        """Whether the systemd watchdog may be fed now (see module doc)."""
        return self.alive().ok and not self.stalled()

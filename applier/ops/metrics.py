"""Prometheus metrics of the daemon (prometheus-client), fed by the observer hooks.

Each daemon gets its own ``CollectorRegistry`` (not the library's global one) so that tests can run
several in one process and nothing registered by an imported library leaks into the scrape.

Names follow the Prometheus conventions: ``applier_`` prefix, base units (seconds), ``_total`` for
counters. TSO values are exported twice: the raw TSO (what TiCDC tools print, for exact
comparison) and its physical time in Unix seconds (what alert rules compute with). The lag gauge
is evaluated at scrape time, so it keeps growing while the daemon is stuck, which is the point.

Per-partition gauges are refreshed from ``on_tick`` at most every :attr:`MetricsObserver.REFRESH`
seconds (every 0.1 s while records arrive): a scrape every 15 s needs no more than that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from applier import __version__
from applier.codec.events import tso_physical_ms
from applier.downstream.errors import TRANSIENT_CLASSES, retry_class
from applier.ops.observer import Observer, WindowApplied

if TYPE_CHECKING:
    from applier.codec.events import DDLEvent
    from applier.downstream.watch import StatementWait
    from applier.kafka.reader import PartitionReader
    from applier.stream.barrier import Barrier
    from applier.stream.window import Window
    from checkpoint import JournalEntry

STATES = ("starting", "standby", "active", "stopping", "failed")

# From 5 ms (a small window on a fast link) to 30 min (a DDL rebuilding a big table).
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
WINDOW_ROW_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)
"""Rows of one window: from a quiet stream (a few rows a second) to a backlog released at once."""

# From 10 ms (a window committed right after its resolved ts) to a minute (a daemon far behind);
# finest around the 0.3 s and 1 s that a daemon keeping up should stay under.
COMMIT_LAG_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60,
)  # fmt: skip

# Every name here is a classic one, so the 0.0.4 text format, which every Prometheus reads, suffices.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


def tso_seconds(ts: int) -> float:
    """Physical time of a TSO in Unix seconds (``ts >> 18`` milliseconds)."""
    return tso_physical_ms(ts) / 1000.0


class MetricsObserver(Observer):
    """Owns the registry and every metric; ``render()`` returns the exposition text."""

    REFRESH = 0.5
    REFRESH_BUSY = 0.1

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        process_metrics: bool = True,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._monotonic = monotonic  # the clock of failing and waiting times (health's too)
        self._failing_since: float | None = None
        self._waits: Sequence[StatementWait] = ()
        self._waits_counted: set[int] = set()  # StatementWait.seq of the waits counted and still on
        self._checkpoint_ts = 0
        self._kafka_unreachable_since: float | None = None  # monotonic, from the reader
        self._ddl: tuple[DDLEvent, float] | None = None  # the DDL being applied, since (monotonic)
        self._online: Sequence[tuple[JournalEntry, float]] = ()  # running beside the stream, since (clock)
        self._label: Callable[[int], str] = str  # a partition's label, from the reader
        self._last_refresh = -1e18
        r = self.registry
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        # The metrics, in the order of the exposition. The gauges evaluated at scrape time are not
        # kept: their function is all they need.
        gauge = partial(Gauge, registry=r)
        counter = partial(Counter, registry=r)
        histogram = partial(Histogram, registry=r)
        Info("applier_build", "Version of ticdc-applier.", registry=r).info({"version": __version__})
        self.state = Enum(
            "applier_state",
            "Daemon state; a standby waits for the active instance.",
            states=list(STATES),
            registry=r,
        )
        self.state.state("starting")
        self.active = gauge("applier_active", "1 while this instance holds the single-active lock.")
        self.ready = gauge(
            "applier_ready", "1 once the broker and the database answered and the checkpoint is loaded."
        )
        self.global_resolved_ts = gauge(
            "applier_global_resolved_ts", "Minimum resolved ts (TSO) over all partitions read."
        )
        self.checkpoint_ts = gauge(
            "applier_checkpoint_ts", "Global resolved ts (TSO) applied and checkpointed downstream."
        )
        self.checkpoint_time = gauge(
            "applier_checkpoint_timestamp_seconds",
            "Physical time of the applied checkpoint ts, Unix seconds.",
        )
        gauge(
            "applier_lag_seconds",
            "Replication lag: wall clock minus the physical time of the applied checkpoint ts "
            "(NaN before the first checkpoint).",
        ).set_function(self._lag)
        by_partition = ["partition"]
        self.partition_resolved_ts = gauge(
            "applier_partition_resolved_ts", "Resolved ts (TSO) of a partition.", by_partition
        )
        self.partition_read_offset = gauge(
            "applier_partition_read_offset", "Offset of the last record read from a partition.", by_partition
        )
        self.partition_checkpoint_offset = gauge(
            "applier_partition_checkpoint_offset",
            "Offset a restart resumes a partition at (stored with the checkpoint).",
            by_partition,
        )
        self.partition_cached_bytes = gauge(
            "applier_partition_cached_bytes",
            "Bytes of rows read from a partition and held until the barrier releases them.",
            by_partition,
        )
        self.partition_paused = gauge(
            "applier_partition_paused",
            "1 while reading a partition is paused (row cache full or bad input).",
            by_partition,
        )
        self.rows = counter(
            "applier_rows_applied_total",
            "Row operations written downstream, by table and operation.",
            ["schema", "table", "op"],
        )
        self.transactions = counter(
            "applier_transactions_total", "Windows committed downstream together with their checkpoint."
        )
        self.ddls = counter("applier_ddls_applied_total", "DDL statements executed downstream.")
        self.batch_seconds = histogram(
            "applier_batch_seconds",
            "Time to apply and commit one window (rows or a DDL), retries included.",
            buckets=BATCH_BUCKETS,
        )
        self.window_rows = histogram(
            "applier_window_rows",
            "Row operations written by one committed window of rows (DDL windows are not counted).",
            buckets=WINDOW_ROW_BUCKETS,
        )
        self.commit_lag = histogram(
            "applier_commit_lag_seconds",
            "Per committed row window: wall-clock time of its commit minus the physical time of the "
            "resolved ts it was applied up to (so it includes how late TiCDC sent that resolved ts).",
            buckets=COMMIT_LAG_BUCKETS,
        )
        self.ready_to_commit = histogram(
            "applier_ready_to_commit_seconds",
            "Per committed row window: from the daemon's read of the records that let it be released "
            "(its resolved ts on every partition) to its commit: the applier's own share of the "
            "commit lag (TiCDC's and Kafka's delivery left out).",
            buckets=COMMIT_LAG_BUCKETS,
        )
        self.retries = counter(
            "applier_downstream_retries_total",
            "Transient downstream errors whose transaction was replayed, by class (lock_wait, "
            "deadlock, connection, interrupted, server_shutdown).",
            ["class"],
        )
        gauge(
            "applier_downstream_failing_seconds",
            "How long the transaction being applied has been failing with transient errors (0: it is not).",
        ).set_function(self._failing)
        self.lock_waits = counter(
            "applier_lock_waits_total",
            "Statements of the daemon found waiting on a lock for seconds, by kind (metadata, row).",
            ["kind"],
        )
        gauge(
            "applier_lock_wait_seconds",
            "How long the longest lock wait of the daemon's statements lasts now (0: none waits).",
        ).set_function(self._waiting)
        # Every series exists from the start at 0, so that rate() and alerts see the first increase.
        for cls in sorted({*TRANSIENT_CLASSES.values(), "connection"}):
            self.retries.labels(cls)
        for kind in ("metadata", "row"):
            self.lock_waits.labels(kind)
        gauge(
            "applier_kafka_unreachable_seconds", "How long no Kafka broker has been reachable (0: one is)."
        ).set_function(self._kafka_unreachable)
        gauge(
            "applier_ddl_in_progress_seconds",
            "How long the longest-running DDL (in its window, or beside the stream) has run (0: none "
            "runs); which ones: applier_ddl_in_progress_info.",
        ).set_function(self._ddl_seconds)
        r.register(_DDLInProgress(self._ddls_running))
        self.errors = counter("applier_errors_total", "Fatal errors that stopped the daemon.", ["kind"])
        self.last_progress = gauge(
            "applier_last_progress_timestamp_seconds", "Unix time of the last record read or window applied."
        )

    # -- rendering -------------------------------------------------------------------------------
    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _lag(self) -> float:
        if self._checkpoint_ts <= 0:
            return math.nan
        return self._clock() - tso_seconds(self._checkpoint_ts)

    def _failing(self) -> float:
        since = self._failing_since
        return 0.0 if since is None else self._monotonic() - since

    def _waiting(self) -> float:
        since = min((w.since for w in self._waits), default=None)
        return 0.0 if since is None else self._monotonic() - since

    def _kafka_unreachable(self) -> float:
        since = self._kafka_unreachable_since
        return 0.0 if since is None else self._monotonic() - since

    def _ddl_seconds(self) -> float:
        own = 0.0 if self._ddl is None else self._monotonic() - self._ddl[1]
        beside = max((self._clock() - started for _entry, started in self._online), default=0.0)
        return max(own, beside)

    def _ddls_running(self) -> list[tuple[DDLEvent | JournalEntry, str]]:
        """The DDLs running now and how: ``window`` (the stream waits) or ``beside`` (it goes on)."""
        running: list[tuple[DDLEvent | JournalEntry, str]] = [(e, "beside") for e, _started in self._online]
        if self._ddl is not None:
            running.insert(0, (self._ddl[0], "window"))
        return running

    def _set_checkpoint(self, ts: int) -> None:
        if ts > self._checkpoint_ts:
            self._checkpoint_ts = ts
            self.checkpoint_ts.set(ts)
            self.checkpoint_time.set(tso_seconds(ts))

    # -- hooks -----------------------------------------------------------------------------------
    def on_state(self, state: str) -> None:
        if state in STATES:
            self.state.state(state)
        self.active.set(1 if state == "active" else 0)
        if state != "active":
            self.ready.set(0)

    def on_ready(self) -> None:
        self.ready.set(1)
        self._failing_since = None  # transient errors of the start-up are over

    def on_apply_start(self, window: Window) -> None:
        self._ddl = None if window.ddl is None else (window.ddl, self._monotonic())

    def on_online_ddls(self, running: Sequence[tuple[JournalEntry, float]]) -> None:
        self._online = tuple(running)

    def on_window(self, applied: WindowApplied) -> None:
        window, rows = applied.window, applied.rows
        self._ddl = None
        self.transactions.inc()
        self.batch_seconds.observe(applied.seconds)
        if window.ddl is not None:
            self.ddls.inc()
        else:
            self.window_rows.observe(sum(rows.values()))
            if window.target_ts > 0:
                at = self._clock() if applied.commit_time is None else applied.commit_time
                self.commit_lag.observe(at - tso_seconds(window.target_ts))
                if applied.ready_at is not None:
                    self.ready_to_commit.observe(max(0.0, at - applied.ready_at))
        for (schema, table, op), n in rows.items():
            if n:
                self.rows.labels(schema, table, op).inc(n)
        self._set_checkpoint(window.resolved_ts)
        for p, offset in window.resume_offsets.items():
            if offset is not None:
                self.partition_checkpoint_offset.labels(self._label(p)).set(offset)
        self.last_progress.set(self._clock())
        self._failing_since = None

    def on_retry(self, error: BaseException) -> None:
        self.retries.labels(retry_class(error)).inc()
        if self._failing_since is None:
            self._failing_since = self._monotonic()

    def on_statement_waits(self, waits: Sequence[StatementWait]) -> None:
        self._waits = tuple(waits)
        for w in self._waits:
            if w.seq not in self._waits_counted:
                self.lock_waits.labels(w.kind).inc()
        self._waits_counted = {w.seq for w in self._waits}

    def on_error(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def on_tick(self, barrier: Barrier, reader: PartitionReader, progressed: bool) -> None:
        now = self._clock()
        slots = getattr(reader, "slots", None)
        self._label = slots.label if slots is not None else str  # "topic/partition": several topics
        self._kafka_unreachable_since = reader.unreachable_since
        if progressed:
            self.last_progress.set(now)
        if now - self._last_refresh < (self.REFRESH_BUSY if progressed else self.REFRESH):
            return
        self._last_refresh = now
        self._set_checkpoint(barrier.applied_ts)
        self.global_resolved_ts.set(barrier.global_resolved())
        paused = reader.paused
        for p, lst in barrier.listeners.items():
            label = self._label(p)
            self.partition_resolved_ts.labels(label).set(lst.resolved)
            if lst.last_offset is not None:
                self.partition_read_offset.labels(label).set(lst.last_offset)
            self.partition_cached_bytes.labels(label).set(lst.cached_bytes)
            self.partition_paused.labels(label).set(1 if p in paused else 0)


class _DDLInProgress:
    """``applier_ddl_in_progress_info``: the DDLs running now (schema, table, commit ts, and
    ``mode``: ``window`` when the stream waits for it, ``beside`` for an index DDL the stream goes on
    beside; 1 while it runs, no series otherwise), beside ``applier_ddl_in_progress_seconds``."""

    def __init__(self, running: Callable[[], list[tuple[DDLEvent | JournalEntry, str]]]) -> None:
        self._running = running

    def describe(self) -> list:
        return [self._family()]

    def collect(self) -> list:
        family = self._family()
        for ddl, mode in self._running():
            family.add_metric([ddl.schema, ddl.table, str(ddl.commit_ts), mode], 1)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "applier_ddl_in_progress_info",
            "The DDLs running: schema, table, commit ts, and mode (window: the stream waits for it; "
            "beside: an index DDL the stream goes on beside); 1 while it runs.",
            labels=["schema", "table", "commit_ts", "mode"],
        )

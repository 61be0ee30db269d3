"""``applier run``: the streaming daemon's main loop.

Kafka -> decode -> listeners/barrier -> window -> SQL -> database + checkpoint. The main thread
reads, decodes and builds (and binds) the next window while an apply thread commits the
previous one; a window is marked applied only after its commit.
The loop reads a batch of records, feeds each partition's listener, applies every window the
barrier releases (each in one downstream transaction with its checkpoint), commits the group
offsets for monitoring, and applies back-pressure. Signals only set a flag: the window in flight
is finished (or rolled back) and the process exits 0. A window that does not finish within
seconds of the signal (a statement waiting on a lock) has its statement killed
(``StatementWatch.interrupt``) and rolls back, so the daemon exits 0 within 10 s.

Partitions: every partition resumes at the offset stored in the checkpoint. One without a stored
offset starts at ``--start`` when the changefeed has no checkpoint yet, else at its beginning
(it was added while the daemon was stopped, or never delivered a record: starting at its end
would lose rows). An offset Kafka no longer has stops the daemon (``OffsetOutOfRange``, with
what the operator can do), never a silent jump. Partitions the topic gains while the daemon runs
are added, and partitions that stay empty are reported to the barrier
(``applier.stream.partition_watch``).

Several topics (one changefeed written by a topic dispatcher): every partition of every topic of
the set is read under the one barrier; the stream stages name partitions by slot
(``applier.kafka.topics``), the checkpoint by topic and partition. Topics appearing while running
join, and partitions that get no resolved events are given one by drain probes
(``applier.stream.partition_watch``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import TypeVar

from applier.apply.ddl import DDLExecutor
from applier.apply.handoff import start_at_ts
from applier.apply.startup import load_checkpoint, prepare_downstream, run_startup_step
from applier.apply.window_applier import PendingApply, PreparedWindow, Stopping, WindowApplier
from applier.codec.decoder import decode_record
from applier.codec.events import Event
from applier.downstream.lock import ActiveLock, LockSuspended, LockWait
from applier.downstream.retry import RetryLog
from applier.downstream.watch import StatementWatch
from applier.errors import EXIT_FATAL, EXIT_OK, FatalError, InputError
from applier.kafka.reader import (
    BrokerUnreachable,
    PartitionReader,
    Record,
    TopicMissing,
    check_consumer_config,
)
from applier.large_messages.resolver import LargeMessageError, LargeMessageQueue
from applier.large_messages.settings import LargeMessageSettings
from applier.ops.logs import get_logger
from applier.ops.observer import Observer, Observers
from applier.ops.redact import redact_text
from applier.settings.downstream import downstream_config
from applier.settings.schema import Config
from applier.stream.barrier import Barrier
from applier.stream.listener import cache_bytes
from applier.stream.partition_watch import PartitionWatch
from applier.stream.progress import CheckpointState
from applier.stream.spill import SpillDir, default_spill_root
from applier.stream.table_filter import EventFilter, table_event_filter
from applier.stream.window import Window
from checkpoint import CheckpointStore

T = TypeVar("T")


def start_offsets(
    partitions: Iterable[int], stored: Mapping[int, int], has_checkpoint: bool, start: str
) -> dict[int, int | str]:
    """Where each partition is read from at start-up: its stored offset, else ``start`` or earliest.

    ``--start`` (earliest/latest) is for a changefeed's very first run. Once it has a checkpoint,
    a partition without a stored offset was added while the daemon was stopped, or has not
    delivered a record yet: starting at its end would lose the rows written there meanwhile,
    while starting at its beginning loses nothing (what the checkpoint covers is skipped).
    """
    unread = "earliest" if has_checkpoint else start
    return {p: stored.get(p, unread) for p in partitions}


class Daemon:
    """One running ``applier run``; ``run()`` returns the process exit code."""

    POLL_RECORDS = 500
    """Records per read: about 8,000 rows of the benchmark's records (16 events each), which is
    also how far one read can overshoot ``READ_AHEAD_ROWS`` (2,000 overshot by 32,000 rows)."""
    POLL_TIMEOUT = 0.1
    LOCK_CHECK_SECONDS = 5.0
    DRAIN_SECONDS = 30.0
    MERGE_MAX_ROWS = 25_000
    """Merge ready windows into one transaction up to about this many rows (``--max-txn-rows``
    caps it further): big enough that commits cost nothing, small enough that the window in
    flight, the one prepared after it and the rows read meanwhile fit in ``READ_AHEAD_ROWS``,
    and that applying and reading overlap in steps of half a second or so."""
    EARLY_PIECE_ROWS = 5_000
    """At most this many rows in one early piece (``_write_early``): a window released while a piece
    is being written waits for it, so pieces stay short (tens of milliseconds). With pieces of up to
    25,000 rows the 30K rows/s lag's p95 grew from 677-805 to 915 ms (benchmarks/lag.py --rate
    30000 --private-db)."""
    READ_AHEAD_ROWS = 80_000
    """Rows in memory, the window in flight and the one prepared after it included: while the
    barrier can release a window after the one in flight, reading stops once this many rows are
    cached; while it cannot (nothing in flight, or a partition holds it back at or below the
    window in flight), the partitions ahead of the barrier are paused at this many and the ones
    holding it back keep being read. (Stopping all reading then left the database idle after
    each such commit while those records were read: 62-65k -> 68-70k rows/s in
    benchmarks/apply.py.) Rows, not bytes, because they are what costs: a decoded row is 1-2 KB
    of Python objects whatever its size on the wire, and the process's peak RSS follows the peak
    of this count (``--max-cached-bytes`` still bounds wide rows). When applying is the
    bottleneck, reading further would only grow memory. Before it bounded the start too, the
    partitions far ahead (``AHEAD_ROWS`` each) filled ~130,000 rows before the first window.
    Measured in benchmarks/apply.py, once the cache kept only the old-image columns planning
    reads: 90,000 rows took peak RSS 306 MiB and 80,000 rows 295 MiB (medians of six and seven
    runs) at the same rate within the noise (73.5k and 72.5k rows/s); 60,000 rows (and windows of
    20,000) had cost about a tenth of the rate before that."""
    GC_THRESHOLDS = (1_000_000, 50, 100)
    """Cyclic-GC thresholds for the loop (see ``_loop``): a young collection every million
    allocations, older generations almost never. None of the hot-path objects (events, rows,
    plans) form reference cycles, so reference counting frees them; the cyclic collector only
    has rare garbage to find, and scanning the row cache over and over cost more than any other
    single step (benchmarks/apply.py: 33k rows/s with Python's defaults, 43-47k with 50,000
    young allocations, ~50k with a million)."""
    AHEAD_ROWS = 16_000
    """A partition ahead of the barrier with this many rows above the global resolved ts is
    paused until the others catch up (see ``Barrier.partitions_far_ahead``)."""
    HANDOFF_RECORDS = 64
    """While decoding a batch, look every this many records whether the window in flight is done
    (a batch of 2000 records is a few hundred milliseconds of decoding: too long for the
    database to wait for its next window)."""
    SWITCH_INTERVAL = 0.001
    """``sys.setswitchinterval`` for the daemon (see ``_loop``)."""
    STOP_GRACE_SECONDS = 2.0
    """On stop, how long the window in flight may take before its statement is killed (``KILL
    QUERY``), and each further step waits (``KILL CONNECTION``, then leaving without it): three
    steps stay well within the 10 s a stop may take (systemd's ``TimeoutStopSec`` is 30 s)."""
    _inflight: PendingApply | None = None  # the window the apply thread works on
    statements: StatementWatch | None = None  # lock waits of our statements (set once active)
    _waits_seen = 0  # StatementWatch.version last passed to the observers
    # loop state (``_start_loop_state``): bad input seen, partitions refused or empty, pacing
    _bad_input: InputError | None = None
    _bad_partitions: set[int]
    _flagged: set[int]
    _drain_deadline = 0.0
    _next_lock_check = 0.0
    _last_holdback_log = 0.0
    _last_spill_log = 0.0
    _spilled_total = 0
    _prepared: PreparedWindow | None = None  # the next one, its SQL built ahead
    _ready: collections.deque[tuple[int, float]]  # (global resolved ts, when read): see _note_ready
    _read_at = 0.0  # wall-clock time the batch being fed was read
    _at_tail = False  # the last read found the reader at the end of the topic (``_poll``)
    large: LargeMessageQueue | None = None  # the large-message stage, when a source is configured
    tables: EventFilter | None = None  # the table filter stage, when rules are configured

    def __init__(self, cfg: Config, observers: Sequence[Observer] = ()) -> None:
        self.cfg = cfg
        self.observer = Observers(observers)
        self.log = get_logger(changefeed=cfg.group_id, topic=cfg.topic)
        self._stop = threading.Event()
        self.options = cfg.decoder_options()
        self.downstream = downstream_config(cfg)  # raises ConfigurationError
        self.large = LargeMessageSettings.from_config(cfg).queue(self.options)
        self.tables = table_event_filter(cfg.table_filter(), self.log)
        self.store = CheckpointStore(cfg.checkpoint_schema, cfg.group_id)
        self.router = cfg.router()  # route rules; raises ConfigurationError
        check_consumer_config(cfg.group_id, cfg.kafka_config)  # raises ConfigurationError
        self.lock: ActiveLock | None = None
        self.reader: PartitionReader | None = None
        self.applier: WindowApplier | None = None
        self.barrier: Barrier | None = None
        self.watch: PartitionWatch | None = None
        self.spill: SpillDir | None = None

    # -- signals -------------------------------------------------------------------------------
    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        if not self._stop.is_set():
            self.log.info("stop requested", signal=signal.Signals(signum).name if signum else None)
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    # -- lifecycle -----------------------------------------------------------------------------
    def run(self) -> int:
        self.observer.on_state("starting")
        try:
            return self._run()
        except Stopping:
            self.log.info("stopped")
            return EXIT_OK
        except FatalError as exc:
            self.log.error("fatal: " + redact_text(str(exc)), error_type=type(exc).__name__)
            self.observer.on_error(type(exc).__name__)
            self.observer.on_state("failed")
            return exc.exit_code
        except Exception as exc:  # a bug: say so in one line plus the traceback, exit non-zero
            self.log.error("fatal: unexpected error: " + redact_text(repr(exc)), exc_info=True)
            self.observer.on_error(type(exc).__name__)
            self.observer.on_state("failed")
            return EXIT_FATAL
        finally:
            if self._stop.is_set():
                self.observer.on_state("stopping")
            self._close()

    def _close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self.large is not None:
            self.large.close()
        if self.statements is not None:
            self.statements.close()
        if self.applier is not None:
            self.applier.close()
        if self.spill is not None:
            self.spill.remove()  # the window in flight is finished: nothing reads the files any more
        if self.lock is not None:
            self.lock.release()

    def _become_active(self) -> None:
        """Take the single-active lock; as a standby, wait (and say so) until the holder is gone."""
        self.lock = ActiveLock(
            self.downstream,
            schema=self.cfg.checkpoint_schema,
            changefeed=self.cfg.group_id,
            poll=float(self.cfg.standby_poll_seconds),
        )
        said = False

        def waiting(w: LockWait) -> bool:
            nonlocal said
            if not said:
                self.observer.on_state("standby")
                self.log.info(
                    "standby: another instance is active; waiting to take over",
                    holder_connection=w.holder_connection_id,
                )
                said = True
            return not self._stop.is_set()

        if not self.lock.acquire(waiting):
            raise Stopping()
        self.observer.on_state("active")
        self.log.info("active: holding the single-active lock", took_over=said)

    def _run(self) -> int:
        cfg = self.cfg
        router = self.router
        startup_log = RetryLog(
            self.log,
            report_seconds=float(cfg.retry_report_seconds),
            action="retrying the start-up",
            recovered="the start-up goes on after transient errors",
        )

        def startup_step(step: Callable[[], T]) -> T:
            """A downstream that does not answer, or is read-only or full, at start is waited out
            (``run_startup_step``)."""
            return run_startup_step(
                step,
                retry_log=startup_log,
                on_retry=self.observer.on_retry,
                on_waiting=self.observer.on_waiting,
                sleep=self._startup_sleep,
            )

        dialect = startup_step(lambda: prepare_downstream(self.downstream, self.store))
        self._become_active()
        assert self.lock is not None
        ddl_executor = DDLExecutor(
            self.store,
            dialect,
            self.lock,
            owner=self.lock.owner_token,
            on_statement=self._watch_ddl,
            router=router,
        )
        owner = self.lock.owner_token
        ckpt = startup_step(
            lambda: load_checkpoint(self.downstream, self.store, ddl_executor, owner=owner, topic=cfg.topic)
        )
        ckpt = startup_step(  # --from-ts: a restored downstream's first start (applier.apply.handoff)
            functools.partial(
                start_at_ts,
                self.downstream,
                self.store,
                ckpt,
                from_ts=cfg.values.get("from_ts"),
                topic=cfg.topic,
                owner=owner,
                before_commit=self.lock.ensure_held,
                log=self.log,
            )
        )

        topics = cfg.topics()
        self.reader = PartitionReader(
            cfg.kafka_bootstrap,
            topics,
            cfg.group_id,
            cfg.kafka_config,
            lost_offset_advice=self._lost_offset_advice(),
        )
        partitions = self._wait_for_topic(self.reader)
        key = self.reader.slots.key
        stored = {tp: o for tp, o in ckpt.topic_offsets.items() if topics.matches(tp[0])}
        has_checkpoint = ckpt.topic is not None or bool(ckpt.resolved_ts or stored)  # a window written
        start = start_offsets(
            partitions,
            {p: o for p in partitions if (o := stored.get(key(p))) is not None},
            has_checkpoint,
            cfg.start,
        )
        state = CheckpointState(
            applied_ts=ckpt.resolved_ts,
            table_ts=ckpt.tables,
            applied_ddls=frozenset(ckpt.applied_ddls),
            offsets={p: o for p, o in start.items() if isinstance(o, int)},
        )
        # Spill files of an earlier run are never trusted: the topic is re-read from the
        # checkpoint's offsets. Emptied only now that this instance holds the lock.
        spill = self.spill = SpillDir(cfg.spill_dir or default_spill_root(), cfg.group_id).open()
        self.barrier = Barrier(partitions, state, spill)
        if topics.single is None:  # the listing just made was started before anything was seen
            self.barrier.cap = ckpt.resolved_ts
        self.statements = StatementWatch(self.downstream)
        self.statements.start()
        self.applier = WindowApplier(
            self.downstream,
            self.store,
            topic=cfg.topic,
            dialect=dialect,
            owner=self.lock.owner_token,
            stop_requested=self._stop.is_set,
            on_retry=self.observer.on_retry,
            before_commit=self.lock.ensure_held,
            ddl_executor=ddl_executor,
            watch=self.statements,
            retry_report_seconds=float(cfg.retry_report_seconds),
            router=router,
            partition_key=key,
            workers=int(cfg.apply_workers),
            early_rows=int(cfg.early_rows),
        )
        unsettled = [p for p in partitions if key(p) not in stored]
        self.watch = PartitionWatch(self.reader, self.barrier, self.log, stored, unsettled)
        self.reader.assign(start)
        self.log.info(
            "started",
            partitions=len(partitions),
            resolved_ts=ckpt.resolved_ts,
            resume_offsets={self.reader.slots.label(p): o for p, o in start.items()},
            dialect=dialect.name,
            max_allowed_packet=dialect.max_allowed_packet,
            spill_dir=str(spill.path),
            large_messages=self.large.resolver.describe() if self.large is not None else "refused",
            routes=router.describe() or None,
        )
        self.observer.on_ready()
        return self._loop()

    def _wait_for_topic(self, reader: PartitionReader) -> list[int]:
        """The topic's partitions, once a broker answers and the topic exists: at boot the broker
        may come up after the daemon, and TiCDC creates the topic only when the changefeed first
        writes. Waited out like the database (capped backoff, one line then summaries)."""
        log = RetryLog(
            self.log,
            report_seconds=float(self.cfg.retry_report_seconds),
            action="waiting for the broker and the topic",
            recovered="the topic is readable",
            subject="Kafka",
            classify=lambda exc: "topic_missing" if isinstance(exc, TopicMissing) else "broker_unreachable",
        )

        def discover() -> list[int]:
            try:
                return reader.discover_partitions(reader.METADATA_TIMEOUT)
            except BrokerUnreachable:
                reader.check_refused()  # a refused login looks the same: that one is not waited for
                raise

        return run_startup_step(
            discover,
            retry_log=log,
            on_waiting=self.observer.on_waiting,
            waiting_for=f"Kafka (topic {reader.topic!r})",
            retryable=lambda exc: isinstance(exc, (BrokerUnreachable, TopicMissing)),
            sleep=self._startup_sleep,
        )

    def _startup_sleep(self, seconds: float) -> None:
        """The pause between start-up attempts; a stop request ends it (and the start-up) at once."""
        if self._stop.wait(seconds):
            raise Stopping()

    def _lost_offset_advice(self) -> str:
        """What the operator can do about a lost offset (docs/operations.md, "Lost Kafka offsets")."""
        table = f"`{self.cfg.checkpoint_schema.replace('`', '``')}`.`partition_offset`"
        group = self.cfg.group_id.replace("'", "''")
        return (
            "to go on: if the topic holds every change after the checkpoint's resolved ts (applier "
            f"status), run DELETE FROM {table} WHERE changefeed = '{group}' and start again "
            "(partitions without a stored offset are read from their beginning); otherwise restore "
            "the downstream from a backup and run applier catchup --from-ts with the checkpoint "
            'cleared (docs/operations.md, "Lost Kafka offsets")'
        )

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> int:
        """The stages, once per batch of records: read, feed, apply ready windows, report, pace.

        Applying runs on a background thread, one window at a time (``_apply_ready``), so the
        next records are read and decoded while the database works on the current window. The
        in-flight window is always finished (committed or rolled back) before this returns or
        raises, so nothing is left half-done and the apply connection is idle when closed.
        """
        assert self.barrier is not None
        self._tune_runtime()
        self._start_loop_state()
        try:
            while not self._stop.is_set():
                records = self._read()
                self._read_at = time.time()
                self._feed(records)
                self._note_ready()
                applied = self._apply_ready()
                self._report(active=bool(records) or applied)
                self._stop_on_bad_input()
                self._pace()
                if self._caught_up(records):
                    self.log.info(
                        "caught up: every partition read to its end and applied",
                        resolved_ts=self.barrier.applied_ts,
                    )
                    return EXIT_OK
            self._apply_ready(drain=True)  # stop requested: finish (or roll back) the window in flight
        finally:
            self._finish_inflight()
        self.log.info("stopped", resolved_ts=self.barrier.applied_ts)
        return EXIT_OK

    def _tune_runtime(self) -> None:
        """Garbage collection and thread switching set for a loop that holds millions of rows."""
        # Cyclic GC: the row cache keeps millions of small containers alive, which the default
        # thresholds rescan over and over (it was a third of the CPU time in the benchmark). The
        # objects of start-up never become garbage: freeze them; collect the young ones rarely.
        gc.freeze()
        gc.set_threshold(*self.GC_THRESHOLDS)
        # The apply thread mostly waits for the database; when an answer arrives it needs the GIL
        # back from this (CPU-bound) thread. Python hands it over after the switch interval, once
        # per statement: 5 ms by default, which added seconds per million rows.
        sys.setswitchinterval(self.SWITCH_INTERVAL)

    def _start_loop_state(self) -> None:
        self._next_lock_check = time.monotonic() + self.LOCK_CHECK_SECONDS
        self._last_holdback_log = 0.0
        self._bad_input = None
        self._bad_partitions = set()
        self._flagged = set()  # bad or empty partitions: the only per-record check
        self._drain_deadline = 0.0
        self._last_spill_log = 0.0
        self._inflight = self._prepared = None
        self._ready = collections.deque()

    def _note_ready(self) -> None:
        """Remember when the barrier's global resolved ts moved (when the batch that moved it was
        read), so that each window can say how long it took from the moment it could be released
        to its commit (``ready_s`` of its log line): the daemon's own share of the replication lag,
        apart from Kafka's delivery. Called after each batch is fed and before each window starts
        (``_feed`` also hands windows over mid-batch, every ``HANDOFF_RECORDS`` records)."""
        assert self.barrier is not None
        ts = self.barrier.global_resolved()
        if not self._ready or ts > self._ready[-1][0]:
            self._ready.append((ts, self._read_at))

    def _ready_at(self, window: Window) -> float | None:
        """When ``window`` could first be released: the read that moved the global resolved ts
        past its base. Entries the window covers are dropped (the next window's base is its target)."""
        ready = self._ready
        while ready and ready[0][0] <= window.base_ts:
            ready.popleft()
        at = ready[0][1] if ready else None
        while ready and ready[0][0] <= window.target_ts:
            ready.popleft()
        return at

    # -- stage: read ---------------------------------------------------------------------------
    def _read(self) -> list[Record]:
        """The next batch of records, or none while enough is cached for the window in flight."""
        barrier = self.barrier
        assert barrier is not None
        pending = self._inflight
        if pending is None:
            return self._poll(self.POLL_TIMEOUT)
        if self._waits_for_input():
            # No window can follow the one in flight before the partitions holding the barrier
            # back are read further (``_pace`` pauses the others once READ_AHEAD_ROWS are
            # cached). Waiting for the window in flight instead would leave the database idle
            # after its commit while those records are read and decoded.
            return self._poll(self.POLL_TIMEOUT)
        if barrier.total_cached_rows() > self.READ_AHEAD_ROWS:
            # Enough is cached for the next window: let the one in flight finish first rather
            # than grow memory (applying is the bottleneck right now).
            pending.wait(self.POLL_TIMEOUT)
            return []
        # Read what has arrived; with nothing to read, wait for the window in flight (not for the
        # broker), so the next window starts as soon as it committed.
        records = self._poll(0)
        if not records:
            pending.wait(self.POLL_TIMEOUT)
        return records

    def _poll(self, timeout: float) -> list[Record]:
        """One read; notes whether it found the reader at the end of what the broker holds (fewer
        records than asked for): early writes are only for a daemon that follows the stream, not
        for one working through a backlog, whose windows come one after the other anyway."""
        assert self.reader is not None
        records = self.reader.poll(self.POLL_RECORDS, timeout)
        self._at_tail = len(records) < self.POLL_RECORDS
        return records

    def _waits_for_input(self) -> bool:
        """True while the barrier cannot release anything after the window in flight (or with none
        in flight) until more records are read: its global resolved ts is not past that window."""
        assert self.barrier is not None
        pending = self._inflight
        return pending is None or self.barrier.global_resolved() <= pending.window.target_ts

    # -- stage: decode and feed ----------------------------------------------------------------
    def _feed(self, records: list[Record]) -> None:
        """Decode each record and feed it to its partition's listener (via the large-message stage
        when it holds one); then move what memory cannot hold to disk.

        Flat on purpose: this runs once per record, and a window that finished meanwhile is
        handed its successor every ``HANDOFF_RECORDS`` records.
        """
        watch, large, options = self.watch, self.large, self.options
        tables = self.tables
        assert watch is not None
        flagged = self._flagged  # the same set _refuse adds to; rebound together below
        for n, rec in enumerate(records, 1):
            if n % self.HANDOFF_RECORDS == 0:
                self._spill_over()  # memory stays bounded within a batch too
                if self._inflight is not None:
                    if self._inflight.done():
                        self._apply_ready()  # keep the database busy: hand it the next window now
                    elif self._prepared is None:
                        self._prepare_next(self._inflight, full_only=True)
            if rec.partition in flagged:
                if rec.partition in self._bad_partitions:
                    continue  # after a bad record: never applied (a restart stops at the same record)
                watch.record_arrived(rec.partition)  # was empty: the barrier waits for it again
                flagged = self._flagged = self._bad_partitions | watch.empty
            try:
                events = decode_record(
                    rec.key,
                    rec.value,
                    topic=rec.topic,
                    partition=rec.kafka_partition,
                    offset=rec.offset,
                    options=options,
                    old_keys_only=True,  # all the listener and planning read of an update's old image
                )
                if tables is not None:  # filtered tables' rows and DDLs dropped; the record still counts
                    events = tables.keep(events)
            except InputError as exc:  # a malformed record, or a DDL the filter cannot follow
                self._refuse(rec.partition, exc)
                continue
            if large is not None and (large.holds(rec.partition) or large.holds_large(events)):
                # Its rows are fetched off this thread; it (and what follows it on its partition)
                # is fed once they are there (applier.large_messages).
                try:
                    large.add(rec.partition, rec, events, len(rec.value or b"") + len(rec.key or b""))
                except LargeMessageError as exc:
                    self._refuse(rec.partition, exc)
                continue
            self._feed_one(rec, events)
        if large is not None and large.busy():
            self._feed_fetched()
        if watch.settle():
            self._flagged = self._bad_partitions | watch.empty
        if watch.several:
            watch.settle_drained(self._unfed())
        self._spill_over()

    def _unfed(self) -> set[int]:
        """Partitions with records read but not fed (refused, or large messages being fetched)."""
        large = self.large
        assert self.reader is not None
        held = {p for p in self.reader.partitions if large.holds(p)} if large is not None else set()
        return self._bad_partitions | held

    def _feed_one(self, rec: Record, events: Sequence[Event], fetched: int = 0) -> None:
        assert self.barrier is not None
        try:
            size = cache_bytes(len(rec.value or b"") + len(rec.key or b"") + fetched, events)
            self.barrier.feed(rec.partition, rec.offset, events, size, (rec.key, rec.value))
        except InputError as exc:  # refused by the listener (a row below its watermark, a large message)
            self._refuse(rec.partition, exc)

    def _feed_fetched(self) -> None:
        """Records whose large messages were fetched meanwhile, in offset order per partition."""
        assert self.large is not None
        done, failures = self.large.ready()
        for rec, events, fetched in done:
            if rec.partition not in self._bad_partitions:
                self._feed_one(rec, events, fetched)
        for exc in failures:
            self._refuse(exc.position.partition, exc)

    def _refuse(self, partition: int, exc: InputError) -> None:
        """Bad input at ``partition``: nothing of it or after it is fed; stop once drained."""
        assert self.reader is not None
        if self._bad_input is None:
            self._bad_input, self._drain_deadline = exc, time.monotonic() + self.DRAIN_SECONDS
        self._bad_partitions.add(partition)
        self._flagged.add(partition)
        self.reader.pause([partition])
        if self.large is not None:
            self.large.drop(partition)

    # -- stages: report, stop on bad input, pace ------------------------------------------------
    def _report(self, active: bool) -> None:
        """Tell the observers (metrics, health, systemd) how the loop is doing."""
        self.observer.on_tick(self.barrier, self.reader, active)
        self._report_waits()

    def _stop_on_bad_input(self) -> None:
        """After bad input, once the healthy partitions are drained: apply what can be, then raise.

        Everything the barrier could release before the bad record is applied and checkpointed;
        nothing at or after it is. A restart stops at the same record.
        """
        if self._bad_input is not None and self._drained(self._drain_deadline, self._bad_partitions):
            self._apply_ready(drain=True)
            raise self._bad_input

    def _pace(self) -> None:
        """Lock check, new partitions, and back-pressure on the reading."""
        reader, barrier, cfg, large = self.reader, self.barrier, self.cfg, self.large
        assert reader is not None and barrier is not None and self.watch is not None
        now = time.monotonic()
        if now >= self._next_lock_check:
            # Suspended (the server restarts): the reading goes on, the commits wait for the lock
            # to be taken again (the apply thread replays until then); lost: stop.
            with contextlib.suppress(LockSuspended):
                self.lock.ensure_held(check=True)  # type: ignore[union-attr]
            self._next_lock_check = now + self.LOCK_CHECK_SECONDS
        self.watch.add_new(now)  # paced by the reader: one metadata request every 30 s (1 s: several topics)
        if self.watch.several:
            self.watch.probe_quiet(self._unfed(), now)
        # Back-pressure: stop reading the partitions that are ahead of the barrier when the cache
        # is over --max-cached-bytes (or over READ_AHEAD_ROWS while the barrier waits for input:
        # else ``_read`` stops reading instead), or when one of them alone is AHEAD_ROWS ahead;
        # the ones holding the barrier back keep being read, so it always moves.
        ahead = barrier.partitions_far_ahead(self.AHEAD_ROWS, reader.paused)
        if large is not None:
            ahead |= large.over_limit()  # fetched rows wait in memory: bounded too
        rows = self.READ_AHEAD_ROWS if self._waits_for_input() else None
        to_pause = barrier.partitions_to_pause(cfg.max_cached_bytes, rows) | ahead
        if to_pause - reader.paused:
            reader.pause(to_pause)
            if now - self._last_holdback_log > 10 and barrier.total_cached_bytes() > cfg.max_cached_bytes:
                self.log.warning(
                    "row cache full: pausing partitions ahead of the barrier",
                    cached_bytes=barrier.total_cached_bytes(),
                    paused=sorted(reader.paused),
                    holding_back=barrier.holding_back(),
                    global_resolved_ts=barrier.global_resolved(),
                )
                self._last_holdback_log = now
        if reader.paused:
            resume = barrier.partitions_to_resume(reader.paused, cfg.max_cached_bytes, max_cached_rows=rows)
            reader.resume(resume - ahead - self._bad_partitions)

    def _caught_up(self, records: list[Record]) -> bool:
        """``--exit-when-caught-up``: every partition read to its end and everything applied."""
        reader, barrier, large = self.reader, self.barrier, self.large
        assert reader is not None and barrier is not None
        return (
            self.cfg.exit_when_caught_up
            and not records
            and self._inflight is None
            and (large is None or not large.busy())
            and reader.all_at_end()
            and barrier.next_window() is None
            # several topics: quiet partitions and new topics catch up with probes and listings
            and (
                self.watch is None
                or not self.watch.several
                or barrier.global_resolved() >= (barrier.max_observed() or 0)
            )
        )

    def _finish_inflight(self) -> None:
        """On the way out: wait for the window in flight, whatever its outcome.

        Its transaction either commits (with its checkpoint: a restart resumes after it) or rolls
        back; both are consistent. Its own error, if any, is dropped: the error that is already
        stopping the daemon is the one to report. Bounded: leaving for an error is a stop too,
        and a statement waiting on a lock is killed.
        """
        assert self.applier is not None
        pending, self._inflight, self._prepared = self._inflight, None, None
        if pending is not None:
            if self._wait_inflight(pending, stopping=True):
                with contextlib.suppress(BaseException):
                    pending.result()
            self.applier.deliver_notifications()

    def _spill_over(self) -> None:
        """Move rows the barrier cannot release yet to disk when memory is over its bound (a
        transaction larger than ``max_cached_bytes``: see ``applier.stream.spill``)."""
        assert self.barrier is not None
        try:
            moved = self.barrier.spill_over(self.cfg.max_cached_bytes)
        except OSError as exc:  # a full or read-only disk: nothing of it was applied
            raise FatalError(
                f"cannot spill rows to {exc.filename or 'the spill directory'}: {exc.strerror or exc}; "
                'free disk space there or set spill_dir (docs/operations.md, "Disk for huge transactions")'
            ) from None
        if moved:
            self._spilled_total += moved
            now = time.monotonic()
            if now - self._last_spill_log > 10:
                self.log.info(
                    "row cache full: rows of transactions the barrier cannot release yet moved to disk",
                    rows=moved,
                    rows_since_start=self._spilled_total,
                    spilled_bytes=self.barrier.total_spilled_bytes(),
                    global_resolved_ts=self.barrier.global_resolved(),
                )
                self._last_spill_log = now

    def _drained(self, deadline: float, bad: set[int]) -> bool:
        """After bad input: have the healthy partitions been read far enough (or long enough)?

        The barrier can only release rows up to the bad partition's resolved ts; reading the
        other partitions up to their end lets it get there, so everything before the bad record
        that can be applied is applied before the daemon stops.
        """
        assert self.reader is not None
        healthy = set(self.reader.partitions) - bad
        return time.monotonic() >= deadline or healthy <= self.reader.at_end

    def _apply_ready(self, drain: bool = False) -> bool:
        """Collect the window in flight if it is done, start the next one, prepare the one after.

        A two-stage pipeline: the apply thread executes window N (``_inflight``) while this
        thread reads records and builds the SQL of window N+1 (``_prepared``, built by the barrier
        as if N were applied). Windows are still committed one at a time in barrier order, and a
        window is marked applied (and the group offsets committed) only after its transaction
        committed. ``drain=True`` waits instead: for the window in flight and then for every
        window that can be released now (or, once a stop is requested, only for the one in flight).
        """
        assert self.reader is not None and self.barrier is not None and self.applier is not None
        applied = False
        max_rows = self._max_window_rows()
        while True:
            pending = self._inflight
            if pending is not None and pending.early:
                # An early piece (applier.apply.early): nothing to mark applied; a window released
                # meanwhile starts as soon as it is written.
                if not drain and not pending.done():
                    break
                if not self._wait_inflight(pending):
                    self._inflight = None
                    raise Stopping()
                self._inflight = None
                pending.result()
                pending = None
            if pending is not None:
                if not drain and not pending.done():
                    if self._prepared is None:
                        self._prepare_next(pending)
                    self.applier.deliver_notifications()  # retries of a window that is still failing
                    break
                if not self._wait_inflight(pending):
                    self._inflight = None
                    raise Stopping()
                try:
                    rows = pending.result()
                finally:
                    self._inflight = None
                    self.applier.deliver_notifications()
                window = pending.window
                self.barrier.mark_applied(window)
                seconds = time.monotonic() - pending.started
                self.observer.on_window(window, seconds, rows, pending.committed_at, pending.ready_at)
                applied = True
                self.reader.commit({p: o for p, o in window.resume_offsets.items() if o is not None})
            if self._stop.is_set():
                self._prepared = None
                break
            prepared, self._prepared = self._prepared, None
            if prepared is None:
                window = self.barrier.next_window(max_rows, merge=True)
                if window is None:
                    if not drain:
                        self._write_early(max_rows)
                    break
                prepared = self.applier.prepare(window)
            self._note_ready()
            self.observer.on_apply_start(prepared.window)
            self._inflight = self.applier.apply_async(prepared, ready_at=self._ready_at(prepared.window))
        return applied

    def _max_window_rows(self) -> int:
        return min(self.cfg.max_txn_rows, self.MERGE_MAX_ROWS)

    def _prepare_next(self, pending: PendingApply, full_only: bool = False) -> None:
        """Build the window after ``pending`` (a row window being applied) while the database works.

        After each batch (``_apply_ready``) it takes whatever can be released. Inside a batch
        (``_feed``, ``full_only``) only a full window: one built there with fewer rows would be
        cut short of the rows the rest of the batch releases (more, smaller windows: tried, no
        gain), while a full one holds the rows the end of the batch would put in it. Without it,
        a window that became releasable while a batch was decoded, behind one that committed
        before the batch ended, was planned after that commit with the database idle (15 of 65
        windows, 0.05-0.13 s each, in benchmarks/apply.py; 6-9 with it). The daemon's time for the
        benchmark's million events went from 30.4 / 40.6 / 31.9 s to 27.0 / 32.9 / 30.0 s (runs
        taken in turns, ``--skip-raw``).
        """
        assert self.barrier is not None and self.applier is not None
        if pending.early or self._stop.is_set():
            return
        max_rows = self._max_window_rows()
        if full_only and self.barrier.rows_ready_after(pending.window) < max_rows:
            return
        ahead = self.barrier.next_window(max_rows, merge=True, after=pending.window)
        if ahead is not None:
            self._prepared = self.applier.prepare(ahead)

    def _write_early(self, max_rows: int) -> None:
        """Nothing can be released while the daemon follows the stream: start writing the rows that
        have most likely all arrived into the open transaction, so that their window has less left
        to write once its resolved ts comes (applier.apply.early). Not while working through a
        backlog (the last read was full): the next window is then only a read away, and pieces
        would only cut it into more, smaller statements (benchmarks/apply.py wrote 12 of its 70
        windows partly early, at no measurable gain). Up to ``max_rows`` in all: the window
        released later is cut at the highest commit ts with at most that many rows below it,
        which is at or above the early rows' target unless rows below it arrived late (then they
        are rolled back anyway)."""
        applier, barrier = self.applier, self.barrier
        assert applier is not None and barrier is not None
        if not self._at_tail or not applier.early_allowed() or self._bad_input is not None:
            return
        early = applier.early_writes
        held = early.rows if early is not None else 0
        base = early.target_ts if early is not None else barrier.applied_ts
        if max_rows - held < applier.early_rows:
            return
        window = barrier.early_window(base, applier.early_rows, min(max_rows - held, self.EARLY_PIECE_ROWS))
        if window is not None:
            self._inflight = applier.write_early_async(window)

    def _watch_ddl(self, connection_id: int, sql: str) -> None:
        """A DDL starts on the lock's session: watch it for lock waits (and kill it on stop) with
        the window it belongs to."""
        if self.applier is not None:
            self.applier.watch_also(connection_id, sql)

    def _report_waits(self) -> None:
        """Pass the statement watch's lock waits to the observers when they changed (health, metrics)."""
        watch = self.statements
        if watch is not None and watch.version != self._waits_seen:
            self._waits_seen = watch.version
            self.observer.on_statement_waits(watch.waits())

    def _wait_inflight(self, pending: PendingApply, stopping: bool = False) -> bool:
        """Wait for the window in flight; False when the daemon leaves without it.

        Waits as long as the window takes, until a stop is requested (or ``stopping``): then
        the window gets ``STOP_GRACE_SECONDS`` to finish, after which its statement is killed
        from the watch's session, first ``KILL QUERY`` (the apply thread rolls back and raises
        ``Stopping``), then ``KILL CONNECTION``. A window still running after that is left to the
        server: its transaction commits together with its checkpoint or not at all, as after a
        SIGKILL, so a restart resumes at the right place either way.
        """
        while not pending.wait(self.POLL_TIMEOUT):
            if stopping or self._stop.is_set():
                break
        else:
            return True
        if pending.wait(self.STOP_GRACE_SECONDS):
            return True
        for connection in (False, True):
            killed = self.statements.interrupt(connection=connection) if self.statements else []
            self.log.warning(
                "stop: the window in flight did not finish; killing its statement",
                kill="connection" if connection else "query",
                connections=killed,
            )
            if pending.wait(self.STOP_GRACE_SECONDS):
                return True
        self.log.warning(
            "stop: leaving without the window in flight; the server commits it with its checkpoint "
            "or rolls it back"
        )
        return False

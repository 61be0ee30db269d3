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

The parts, one owner each: the start-up (``applier.daemon.startup``: database, lock, checkpoint,
broker and topic, where each partition starts), the windows in flight and prepared
(``applier.daemon.windows``), flow control (``applier.daemon.pacing``), early writes
(``applier.apply.early``) and the tuning values (``applier.daemon.tuning``). This module keeps
the loop itself: one call per stage, and the stages that need the loop's own state (decoding
and feeding, bad input, spilling, reporting).

Partitions: an offset Kafka no longer has stops the daemon (``OffsetOutOfRange``, with what the
operator can do), never a silent jump. Partitions the topic gains while the daemon runs are
added, and partitions that stay empty are reported to the barrier
(``applier.stream.partition_watch``).

Several topics (one changefeed written by a topic dispatcher): every partition of every topic of
the set is read under the one barrier; the stream stages name partitions by slot
(``applier.kafka.topics``), the checkpoint by topic and partition. Topics appearing while running
join, and partitions that get no resolved events are given one by drain probes
(``applier.stream.partition_watch``).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

import pymysql

from applier.apply.window_applier import Stopping, WindowApplier
from applier.codec.decoder import decode_record
from applier.codec.events import Event
from applier.daemon.pacing import FlowControl
from applier.daemon.startup import NewReader, Stages, Startup
from applier.daemon.tuning import Tuning
from applier.daemon.windows import WindowPipeline
from applier.downstream.lock import LockSuspended
from applier.errors import EXIT_FATAL, EXIT_OK, FatalError, InputError
from applier.kafka.reader import PartitionReader, Record
from applier.large_messages.resolver import LargeMessageError
from applier.ops.logs import get_logger
from applier.ops.observer import Observer, Observers
from applier.ops.redact import redact_text
from applier.settings.schema import Config
from applier.stream.listener import cache_bytes
from applier.stream.row_release import PartitionBarriers
from applier.stream.table_filter import EventFilter, table_event_filter


class Daemon:
    """One running ``applier run``; ``run()`` returns the process exit code.

    ``tuning`` sizes the reading, caching and merging (``Tuning()`` by default); ``new_reader``
    builds the Kafka reader (``PartitionReader``; an in-process test passes one over a fake
    consumer).
    """

    tables: EventFilter | None = None  # the table filter stage, when rules are configured
    # loop state (``_start_loop``): the parts, bad input seen, partitions refused or empty
    windows: WindowPipeline
    flow: FlowControl
    _bad_input: InputError | None = None
    _bad_partitions: set[int]
    _flagged: set[int]
    _drain_deadline = 0.0
    _next_lock_check = 0.0
    _last_spill_log = 0.0
    _spilled_total = 0
    _waits_seen = 0  # StatementWatch.version last passed to the observers
    _online_seen = 0  # OnlineDDLs.version last passed to the observers

    def __init__(
        self,
        cfg: Config,
        observers: Sequence[Observer] = (),
        *,
        tuning: Tuning | None = None,
        new_reader: NewReader = PartitionReader,
    ) -> None:
        self.cfg = cfg
        self.tuning = tuning or Tuning()
        self.observer = Observers(observers)
        self.log = get_logger(changefeed=cfg.group_id, topic=cfg.topic)
        self._stop = threading.Event()
        self.options = cfg.decoder_options()
        self.stages = Stages()
        self.startup = Startup(cfg, self.stages, self.observer, self._stop, self.log, self.tuning, new_reader)
        self.tables = table_event_filter(cfg.table_filter(), self.log)  # raises ConfigurationError

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
            self.stages.close()

    @property
    def applier(self) -> WindowApplier | None:
        """The window applier, once started (its ``stats``: what was committed)."""
        return self.stages.applier

    def _run(self) -> int:
        self.startup.run()
        self.observer.on_ready()
        return self._loop()

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> int:
        """The stages, once per batch of records: read, feed, apply ready windows, report, pace.

        Applying runs on a background thread, one window at a time (``WindowPipeline``), so the
        next records are read and decoded while the database works on the current window. The
        in-flight window is always finished (committed or rolled back) before this returns or
        raises, so nothing is left half-done and the apply connection is idle when closed.
        """
        self._tune_runtime()
        self._start_loop()
        windows, flow, barrier = self.windows, self.flow, self.stages.barrier
        assert barrier is not None
        try:
            while not self._stop.is_set():
                records = flow.read(windows.inflight)
                windows.read_at = time.time()
                self._feed(records)
                windows.note_ready()
                applied = windows.apply_ready()
                self._report(active=bool(records) or applied)
                self._stop_on_bad_input()
                self._pace()
                if self._caught_up(records):
                    self._flush_summary()
                    self.log.info(
                        "caught up: every partition read to its end and applied",
                        resolved_ts=barrier.applied_ts,
                    )
                    return EXIT_OK
            windows.apply_ready(drain=True)  # stop requested: finish (or roll back) the window in flight
            self._flush_summary()
        finally:
            windows.finish()
        self.log.info("stopped", resolved_ts=barrier.applied_ts)
        return EXIT_OK

    def _flush_summary(self) -> None:
        """Row mode, leaving cleanly: the changefeed row's resolved ts says the last window's. Best
        effort (a stop gives up on a database that is down): a restart reads every partition's own."""
        applier = self.stages.applier
        assert applier is not None
        with contextlib.suppress(Stopping, pymysql.MySQLError):
            applier.flush_summary()

    def _tune_runtime(self) -> None:
        """Garbage collection and thread switching set for a loop that holds millions of rows."""
        # Cyclic GC: the row cache keeps millions of small containers alive, which the default
        # thresholds rescan over and over. The objects of start-up never become garbage: freeze
        # them; collect the young ones rarely.
        gc.freeze()
        gc.set_threshold(*self.tuning.gc_thresholds)
        # The apply thread mostly waits for the database; when an answer arrives it needs the GIL
        # back from this (CPU-bound) thread. Python hands it over after the switch interval, once
        # per statement.
        sys.setswitchinterval(self.tuning.switch_interval)

    def _start_loop(self) -> None:
        """The loop's parts over the stages the start-up built, and its state."""
        stages, cfg, tuning = self.stages, self.cfg, self.tuning
        reader, barrier, observer, log = stages.reader, stages.barrier, self.observer, self.log
        assert reader is not None and barrier is not None and stages.applier is not None
        self.flow = FlowControl(reader, barrier, stages.large, tuning, cfg.max_cached_bytes, observer, log)
        self.windows = WindowPipeline(
            reader,
            barrier,
            stages.applier,
            tuning=tuning,
            max_txn_rows=cfg.max_txn_rows,
            observer=self.observer,
            stop=self._stop,
            statements=stages.statements,
            may_write_early=lambda: self.flow.at_tail and self._bad_input is None,
            log=self.log,
        )
        self._next_lock_check = time.monotonic() + tuning.lock_check_seconds
        self._joint: bool | None = None  # row mode: whether the partitions release together (logged)
        self._bad_input = None
        self._bad_partitions = set()
        self._flagged = set()  # bad or empty partitions: the only per-record check
        self._drain_deadline = 0.0
        self._last_spill_log = 0.0

    # -- stage: decode and feed ----------------------------------------------------------------
    def _feed(self, records: list[Record]) -> None:
        """Decode each record and feed it to its partition's listener (via the large-message stage
        when it holds one); then move what memory cannot hold to disk.

        Flat on purpose: this runs once per record, and a window that finished meanwhile is
        handed its successor every ``Tuning.handoff_records`` records.
        """
        watch, large, options = self.stages.watch, self.stages.large, self.options
        tables, windows = self.tables, self.windows
        handoff = self.tuning.handoff_records
        assert watch is not None
        flagged = self._flagged  # the same set _refuse adds to; rebound together below
        for n, rec in enumerate(records, 1):
            if n % handoff == 0:
                self._spill_over()  # memory stays bounded within a batch too
                windows.hand_over()  # keep the database busy: hand it the next window now
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
        large, reader = self.stages.large, self.stages.reader
        assert reader is not None
        held = {p for p in reader.partitions if large.holds(p)} if large is not None else set()
        return self._bad_partitions | held

    def _feed_one(self, rec: Record, events: Sequence[Event], fetched: int = 0) -> None:
        barrier = self.stages.barrier
        assert barrier is not None
        try:
            size = cache_bytes(len(rec.value or b"") + len(rec.key or b"") + fetched, events)
            barrier.feed(rec.partition, rec.offset, events, size, (rec.key, rec.value))
        except InputError as exc:  # refused by the listener (a row below its watermark, a large message)
            self._refuse(rec.partition, exc)

    def _feed_fetched(self) -> None:
        """Records whose large messages were fetched meanwhile, in offset order per partition."""
        large = self.stages.large
        assert large is not None
        done, failures = large.ready()
        for rec, events, fetched in done:
            if rec.partition not in self._bad_partitions:
                self._feed_one(rec, events, fetched)
        for exc in failures:
            self._refuse(exc.position.partition, exc)

    def _refuse(self, partition: int, exc: InputError) -> None:
        """Bad input at ``partition``: nothing of it or after it is fed; stop once drained."""
        reader, large = self.stages.reader, self.stages.large
        assert reader is not None
        if self._bad_input is None:
            self._bad_input, self._drain_deadline = exc, time.monotonic() + self.tuning.drain_seconds
        self._bad_partitions.add(partition)
        self._flagged.add(partition)
        reader.pause([partition])
        if large is not None:
            large.drop(partition)

    # -- stages: report, stop on bad input, pace ------------------------------------------------
    def _report(self, active: bool) -> None:
        """Tell the observers (metrics, health, systemd) how the loop is doing."""
        self.observer.on_tick(self.stages.barrier, self.stages.reader, active)
        self._report_waits()
        online = self.stages.online
        if online is not None and online.version != self._online_seen:
            self._online_seen = online.version
            self.observer.on_online_ddls(online.running())

    def _stop_on_bad_input(self) -> None:
        """After bad input, once the healthy partitions are drained: apply what can be, then raise.

        Everything the barrier could release before the bad record is applied and checkpointed;
        nothing at or after it is. A restart stops at the same record.
        """
        if self._bad_input is not None and self._drained(self._drain_deadline, self._bad_partitions):
            self.windows.apply_ready(drain=True)
            raise self._bad_input

    def _pace(self) -> None:
        """Lock check, new partitions, and back-pressure on the reading (``FlowControl``)."""
        stages = self.stages
        watch, lock = stages.watch, stages.lock
        assert watch is not None and lock is not None
        now = time.monotonic()
        if now >= self._next_lock_check:
            # Suspended (the server restarts): the reading goes on, the commits wait for the lock
            # to be taken again (the apply thread replays until then); lost: stop.
            with contextlib.suppress(LockSuspended):
                lock.ensure_held(check=True)
            self._next_lock_check = now + self.tuning.lock_check_seconds
        watch.add_new(now)  # paced by the reader: one metadata request every 30 s (1 s: several topics)
        if watch.several:
            watch.probe_quiet(self._unfed(), now)
        self.flow.pace(now, self.windows.inflight, self._bad_partitions)
        barrier = stages.barrier
        if isinstance(barrier, PartitionBarriers):
            barrier.settle(stages.reader.at_end)
            joint = barrier.joint()
            if joint != self._joint:
                if self._joint and barrier.hold is None:
                    stages.applier.hold_ended()
                self._joint = joint
                self.log.info(
                    "row mode: the partitions release together (docs/operations.md, choosing the consistency)"
                    if joint
                    else "row mode: each partition releases its rows on its own",
                    resolved_ts=barrier.applied_ts,
                )

    def _caught_up(self, records: list[Record]) -> bool:
        """``--exit-when-caught-up``: every partition read to its end and everything applied."""
        reader, barrier, large, watch = (
            self.stages.reader,
            self.stages.barrier,
            self.stages.large,
            self.stages.watch,
        )
        assert reader is not None and barrier is not None
        online = self.stages.online
        if self.cfg.exit_when_caught_up and online is not None:
            online.check()  # a DDL beside the stream that failed for good: the daemon stops, naming it
        return (
            self.cfg.exit_when_caught_up
            and not records
            and (online is None or not online.running())
            and self.windows.inflight is None
            and (large is None or not large.busy())
            and reader.all_at_end()
            and barrier.next_window() is None
            # several topics: quiet partitions and new topics catch up with probes and listings
            and (
                watch is None
                or not watch.several
                or barrier.global_resolved() >= (barrier.max_observed() or 0)
            )
        )

    def _spill_over(self) -> None:
        """Move rows the barrier cannot release yet to disk when memory is over its bound (a
        transaction larger than ``max_cached_bytes``: see ``applier.stream.spill``)."""
        barrier = self.stages.barrier
        assert barrier is not None
        try:
            moved = barrier.spill_over(self.cfg.max_cached_bytes)
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
                    spilled_bytes=barrier.total_spilled_bytes(),
                    global_resolved_ts=barrier.global_resolved(),
                )
                self._last_spill_log = now

    def _drained(self, deadline: float, bad: set[int]) -> bool:
        """After bad input: have the healthy partitions been read far enough (or long enough)?

        The barrier can only release rows up to the bad partition's resolved ts; reading the
        other partitions up to their end lets it get there, so everything before the bad record
        that can be applied is applied before the daemon stops.
        """
        reader = self.stages.reader
        assert reader is not None
        healthy = set(reader.partitions) - bad
        return time.monotonic() >= deadline or healthy <= reader.at_end

    def _report_waits(self) -> None:
        """Pass the statement watch's lock waits to the observers when they changed (health, metrics)."""
        watch = self.stages.statements
        if watch is not None and watch.version != self._waits_seen:
            self._waits_seen = watch.version
            self.observer.on_statement_waits(watch.waits())

"""``applier run``: the streaming daemon's main loop.

Kafka -> decode -> listeners/barrier -> window -> SQL -> database + checkpoint, in one thread.
The loop reads a batch of records, feeds each partition's listener, applies every window the
barrier releases (each in one downstream transaction with its checkpoint), commits the group
offsets for monitoring, and applies back-pressure. Signals only set a flag: the window in flight
is finished (or rolled back) and the process exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from applier.apply import ApplyError, Stopping, WindowApplier
from applier.barrier import Barrier
from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.errors import MalformedRecordError
from applier.config import Config
from applier.downstream.errors import DownstreamConnectError
from applier.downstream.lock import ActiveLock, LockLost, LockWait
from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig, DownstreamConfigError
from applier.kafka.reader import KafkaReadError, PartitionReader
from applier.listener import LargeMessageNotSupported
from applier.logs import configure, get_logger
from applier.observer import Observer, Observers
from applier.progress import CheckpointState
from applier.redact import redact_text
from checkpoint import CheckpointStore, FencedOut
from sqlgen import MARIADB, MYSQL, Dialect

EXIT_OK = 0
EXIT_FATAL = 1


class Fatal(RuntimeError):
    """Stop the daemon with one clear log line and a non-zero exit (systemd restarts it)."""


def _detect_dialect(conn) -> Dialect:
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        (version,) = cur.fetchone()
    return MARIADB if "mariadb" in str(version).lower() else MYSQL


class Daemon:
    """One running ``applier run``; ``run()`` returns the process exit code."""

    POLL_RECORDS = 2000
    POLL_TIMEOUT = 0.1
    LOCK_CHECK_SECONDS = 5.0
    DRAIN_SECONDS = 30.0

    def __init__(self, cfg: Config, observers: Sequence[Observer] = ()) -> None:
        self.cfg = cfg
        self.observer = Observers(observers)
        self.log = get_logger(changefeed=cfg.group_id, topic=cfg.topic)
        self._stop = threading.Event()
        self.options = DecoderOptions(
            legacy_base64_strings=bool(cfg.legacy_base64_strings),
            compression=None if cfg.compression == "none" else cfg.compression,
        )
        self.downstream = DownstreamConfig.from_url(cfg.downstream).with_options(
            time_zone=cfg.time_zone,
            **({"password_file": cfg.downstream_password_file} if cfg.downstream_password_file else {}),
        )
        self.store = CheckpointStore(cfg.checkpoint_schema, cfg.group_id)
        self.lock: ActiveLock | None = None
        self.reader: PartitionReader | None = None
        self.applier: WindowApplier | None = None
        self.barrier: Barrier | None = None

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
        except (
            Fatal,
            ApplyError,
            MalformedRecordError,
            LargeMessageNotSupported,
            KafkaReadError,
            DownstreamConnectError,
            DownstreamConfigError,
            LockLost,
            FencedOut,
        ) as exc:
            self.log.error("fatal: " + redact_text(str(exc)), error_type=type(exc).__name__)
            self.observer.on_error(type(exc).__name__)
            self.observer.on_state("failed")
            return EXIT_FATAL
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
        if self.applier is not None:
            self.applier.close()
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
        conn = connect(self.downstream, autocommit=False)
        try:
            self.store.ensure_schema(conn)
            dialect = _detect_dialect(conn)
        finally:
            close_quietly(conn)
        self._become_active()
        assert self.lock is not None
        conn = connect(self.downstream, autocommit=False)
        try:
            self.store.claim(conn, self.lock.owner_token)
            ckpt = self.store.load(conn)
        finally:
            close_quietly(conn)
        if ckpt.topic is not None and ckpt.topic != cfg.topic and ckpt.resolved_ts:
            raise Fatal(
                f"changefeed {cfg.group_id!r} has a checkpoint for topic {ckpt.topic!r}, not {cfg.topic!r}; "
                "use another --group-id or reset the checkpoint"
            )

        self.reader = PartitionReader(cfg.kafka_bootstrap, cfg.topic, cfg.group_id, cfg.kafka_config)
        partitions = self.reader.discover_partitions()
        start: dict[int, int | str] = {p: ckpt.offsets.get(p, cfg.start) for p in partitions}
        state = CheckpointState(
            applied_ts=ckpt.resolved_ts,
            table_ts=ckpt.tables,
            applied_ddls=frozenset(ckpt.applied_ddls),
            offsets={p: o for p, o in start.items() if isinstance(o, int)},
        )
        self.barrier = Barrier(partitions, state)
        self.applier = WindowApplier(
            self.downstream,
            self.store,
            topic=cfg.topic,
            dialect=dialect,
            owner=self.lock.owner_token,
            stop_requested=self._stop.is_set,
            on_retry=self.observer.on_retry,
            before_commit=self.lock.ensure_held,
        )
        self.reader.assign(start)
        self.log.info(
            "started",
            partitions=len(partitions),
            resolved_ts=ckpt.resolved_ts,
            resume_offsets={str(p): o for p, o in start.items()},
            dialect=dialect.name,
        )
        self.observer.on_ready()
        return self._loop()

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> int:
        assert self.reader is not None and self.barrier is not None and self.applier is not None
        reader, barrier, cfg = self.reader, self.barrier, self.cfg
        topic, options = cfg.topic, self.options
        next_lock_check = time.monotonic() + self.LOCK_CHECK_SECONDS
        last_holdback_log = 0.0
        bad_input: Exception | None = None
        bad_partitions: set[int] = set()
        drain_deadline = 0.0
        while not self._stop.is_set():
            records = reader.poll(self.POLL_RECORDS, self.POLL_TIMEOUT)
            for rec in records:
                if rec.partition in bad_partitions:
                    continue  # after a bad record: never applied (a restart stops at the same record)
                try:
                    events = decode_record(
                        rec.key,
                        rec.value,
                        topic=topic,
                        partition=rec.partition,
                        offset=rec.offset,
                        options=options,
                    )
                except MalformedRecordError as exc:
                    bad_input, drain_deadline = exc, time.monotonic() + self.DRAIN_SECONDS
                    bad_partitions.add(rec.partition)
                    reader.pause([rec.partition])
                    continue
                try:
                    size = len(rec.value or b"") + len(rec.key or b"")
                    barrier.feed(rec.partition, rec.offset, events, size, (rec.key, rec.value))
                except LargeMessageNotSupported as exc:
                    bad_input, drain_deadline = exc, time.monotonic() + self.DRAIN_SECONDS
                    bad_partitions.add(rec.partition)
                    reader.pause([rec.partition])
            applied = self._apply_ready()
            self.observer.on_tick(barrier, reader, bool(records) or applied)
            if bad_input is not None and self._drained(drain_deadline, bad_partitions):
                # Everything the barrier could release before the bad record is applied and
                # checkpointed; nothing at or after it is. A restart stops at the same record.
                raise bad_input
            now = time.monotonic()
            if now >= next_lock_check:
                self.lock.ensure_held(check=True)  # type: ignore[union-attr]
                next_lock_check = now + self.LOCK_CHECK_SECONDS
            to_pause = barrier.partitions_to_pause(cfg.max_cached_bytes)
            if to_pause - reader.paused:
                reader.pause(to_pause)
                if now - last_holdback_log > 10:
                    self.log.warning(
                        "row cache full: pausing partitions ahead of the barrier",
                        cached_bytes=barrier.total_cached_bytes(),
                        paused=sorted(reader.paused),
                        holding_back=barrier.holding_back(),
                        global_resolved_ts=barrier.global_resolved(),
                    )
                    last_holdback_log = now
            if reader.paused:
                resume = barrier.partitions_to_resume(reader.paused, cfg.max_cached_bytes) - bad_partitions
                reader.resume(resume)
            idle = not records and reader.all_at_end() and barrier.next_window() is None
            if cfg.exit_when_caught_up and idle:
                self.log.info(
                    "caught up: every partition read to its end and applied", resolved_ts=barrier.applied_ts
                )
                return EXIT_OK
        self.log.info("stopped", resolved_ts=barrier.applied_ts)
        return EXIT_OK

    def _drained(self, deadline: float, bad: set[int]) -> bool:
        """After bad input: have the healthy partitions been read far enough (or long enough)?

        The barrier can only release rows up to the bad partition's resolved ts; reading the
        other partitions up to their end lets it get there, so everything before the bad record
        that can be applied is applied before the daemon stops.
        """
        assert self.reader is not None
        healthy = set(self.reader.partitions) - bad
        return time.monotonic() >= deadline or healthy <= self.reader.at_end

    def _apply_ready(self) -> bool:
        """Apply every window the barrier releases now, committing group offsets after each."""
        assert self.reader is not None and self.barrier is not None and self.applier is not None
        applied = False
        while not self._stop.is_set():
            window = self.barrier.next_window(self.cfg.max_txn_rows, merge=True)
            if window is None:
                break
            started = time.monotonic()
            rows = self.applier.apply(window)
            self.barrier.mark_applied(window)
            self.observer.on_window(window, time.monotonic() - started, rows)
            applied = True
            self.reader.commit({p: o for p, o in window.resume_offsets.items() if o is not None})
        return applied


def run_daemon(cfg: Config) -> int:
    configure(cfg.log_format, cfg.log_level)
    try:
        daemon = Daemon(cfg)
    except DownstreamConfigError as exc:
        print(f"applier: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    daemon.install_signal_handlers()
    return daemon.run()

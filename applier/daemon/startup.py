"""The daemon's start-up: from a configuration to a loop ready to read.

In this order, each step needing the one before: the checkpoint schema and the server's dialect
(``applier.apply.startup``), the single-active lock (a standby waits here), the claimed and
settled checkpoint (and ``--from-ts`` on a restored downstream's first start,
``applier.apply.handoff``), the broker and the topic, where each partition starts, and the stages
the loop drives (barrier, statement watch, window applier, partition watch).

What is not there yet is waited for, saying so (``on_waiting``): a database that does not answer
or is read-only or full, a broker that is down, a topic TiCDC has not created yet (it creates it
when the changefeed first writes). What only the configuration can fix stops the start-up at once
with its one line (a refused login, a missing privilege, a checkpoint of another topic). A stop
request ends any wait at once.

Partitions: every partition resumes at the offset stored in the checkpoint. One without a stored
offset starts at ``--start`` when the changefeed has no checkpoint yet, else at its beginning
(it was added while the daemon was stopped, or never delivered a record: starting at its end
would lose rows).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from applier.apply.ddl import DDLExecutor
from applier.apply.handoff import start_at_ts
from applier.apply.online_ddl import OnlineDDLs, TableHolds
from applier.apply.startup import load_checkpoint, prepare_downstream, run_startup_step
from applier.apply.window_applier import ApplyHooks, ApplySettings, Stopping, WindowApplier
from applier.daemon.tuning import Tuning
from applier.downstream.lock import ActiveLock, LockWait
from applier.downstream.retry import RetryLog
from applier.downstream.watch import StatementWatch
from applier.kafka.reader import BrokerUnreachable, PartitionReader, TopicMissing, check_consumer_config
from applier.large_messages.resolver import LargeMessageQueue
from applier.large_messages.settings import LargeMessageSettings
from applier.ops.observer import Observers
from applier.settings.downstream import downstream_config
from applier.settings.schema import Config
from applier.stream.barrier import Barrier
from applier.stream.partition_watch import PartitionWatch
from applier.stream.row_release import PartitionBarriers
from applier.stream.spill import SpillDir, default_spill_root
from checkpoint import CheckpointStore
from sqlgen.quoting import quote_table

T = TypeVar("T")

NewReader = Callable[..., PartitionReader]
"""Builds the reader: ``PartitionReader`` (bootstrap, topics, group, Kafka settings, advice)."""


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


@dataclass
class Stages:
    """What the start-up built, filled in as it goes so that a start-up that fails half-way is
    closed as far as it got (``close``)."""

    lock: ActiveLock | None = None
    reader: PartitionReader | None = None
    barrier: Barrier | PartitionBarriers | None = None
    applier: WindowApplier | None = None
    online: OnlineDDLs | None = None
    watch: PartitionWatch | None = None
    spill: SpillDir | None = None
    statements: StatementWatch | None = None
    large: LargeMessageQueue | None = None

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self.large is not None:
            self.large.close()
        if self.statements is not None:
            self.statements.close()
        if self.online is not None:
            self.online.close()  # killed on the server: they run again after the restart
        if self.applier is not None:
            self.applier.close()
        if self.spill is not None:
            self.spill.remove()  # the window in flight is finished: nothing reads the files any more
        if self.lock is not None:
            self.lock.release()


class Startup:
    """The start-up steps of one daemon; :meth:`run` fills ``stages``.

    Built with the daemon, so that what only the configuration can fix (the downstream's
    settings, the large-message source, route rules, the Kafka client's settings) raises its
    ``ConfigurationError`` before anything is connected to.
    """

    def __init__(
        self,
        cfg: Config,
        stages: Stages,
        observer: Observers,
        stop: threading.Event,
        log: Any,
        tuning: Tuning,
        new_reader: NewReader = PartitionReader,
    ) -> None:
        self.cfg, self.stages, self.observer, self._stop, self.log = cfg, stages, observer, stop, log
        self.tuning = tuning
        self._new_reader = new_reader
        self.downstream = downstream_config(cfg)  # raises ConfigurationError
        stages.large = LargeMessageSettings.from_config(cfg).queue(cfg.decoder_options())
        self.store = CheckpointStore(cfg.checkpoint_schema, cfg.group_id)
        self.router = cfg.router()  # route rules; raises ConfigurationError
        check_consumer_config(cfg.group_id, cfg.kafka_config)  # raises ConfigurationError

    def run(self) -> None:
        """Every step; the stages are ready for the loop once this returns. Raises ``Stopping``
        when a stop is requested meanwhile."""
        cfg, stages = self.cfg, self.stages
        router = self.router
        startup_log = RetryLog(
            self.log,
            report_seconds=cfg.retry_report_seconds,
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
                sleep=self._sleep,
            )

        dialect = startup_step(lambda: prepare_downstream(self.downstream, self.store))
        lock = self._become_active()
        owner = lock.owner_token
        ddl_executor = DDLExecutor(self.store, dialect, lock, owner=owner, router=router)
        ckpt = startup_step(
            lambda: load_checkpoint(self.downstream, self.store, ddl_executor, owner=owner, topic=cfg.topic)
        )
        online = stages.online = OnlineDDLs(self.downstream, self.store, ddl_executor, router=router)
        startup_step(online.resume)  # index DDLs that were building beside the stream go on
        ckpt = startup_step(  # --from-ts: a restored downstream's first start (applier.apply.handoff)
            functools.partial(
                start_at_ts,
                self.downstream,
                self.store,
                ckpt,
                from_ts=cfg.values.get("from_ts"),
                topic=cfg.topic,
                owner=owner,
                before_commit=lock.ensure_held,
                log=self.log,
            )
        )

        topics = cfg.topics()
        reader = stages.reader = self._new_reader(
            cfg.kafka_bootstrap,
            topics,
            cfg.group_id,
            cfg.kafka_config,
            lost_offset_advice=self._lost_offset_advice(),
        )
        partitions, created_meanwhile = self._wait_for_topic(reader)
        key = reader.slots.key
        stored = {tp: o for tp, o in ckpt.topic_offsets.items() if topics.matches(tp[0])}
        has_checkpoint = ckpt.topic is not None or bool(ckpt.resolved_ts or stored)  # a window written
        start = start_offsets(
            partitions,
            {p: o for p in partitions if (o := stored.get(key(p))) is not None},
            has_checkpoint,
            # A topic made while this start waited holds nothing older than the start: its end
            # would skip what the changefeed wrote first, whatever `start` says.
            "earliest" if created_meanwhile else cfg.start,
        )
        # The barrier names partitions by slot (applier.kafka.topics): the offsets it starts from.
        state = dataclasses.replace(
            ckpt,
            offsets={p: o for p, o in start.items() if isinstance(o, int)},
            partition_applied={p: ts for p in partitions if (ts := ckpt.partition_applied.get(key(p)))},
        )
        # Spill files of an earlier run are never trusted: the topic is re-read from the
        # checkpoint's offsets. Emptied only now that this instance holds the lock.
        spill = stages.spill = SpillDir(cfg.spill_dir or default_spill_root(), cfg.group_id).open()
        barrier = stages.barrier = (
            PartitionBarriers(
                partitions,
                state,
                spill,
                settle_seconds=cfg.row_settle_seconds,
                # A partition read from its beginning may hold keys hashed over another count.
                hold=any(key(p) not in stored for p in partitions),
            )
            if cfg.consistency == "row"
            else Barrier(partitions, state, spill)
        )
        # Always: a DDL journaled by a run with ddl_blocking = "tables" holds its tables after a
        # restart whatever the setting is now.
        barrier.holds = TableHolds(online, router)
        if topics.single is None:  # the listing just made was started before anything was seen
            barrier.cap = ckpt.resolved_ts
        statements = stages.statements = StatementWatch(self.downstream)
        statements.start()
        stages.applier = WindowApplier(
            self.downstream,
            self.store,
            ApplySettings(
                topic=cfg.topic,
                dialect=dialect,
                owner=owner,
                router=router,
                partition_key=key,
                workers=cfg.apply_workers,
                worker_min_rows=self.tuning.worker_min_rows,
                early_rows=cfg.early_rows,
                early_piece_rows=self.tuning.early_piece_rows,
                ddl_blocking=cfg.ddl_blocking,
                consistency=cfg.consistency,
                retry_report_seconds=cfg.retry_report_seconds,
            ),
            hooks=ApplyHooks(
                stop_requested=self._stop.is_set,
                on_retry=self.observer.on_retry,
                before_commit=lock.ensure_held,
            ),
            ddl_executor=ddl_executor,
            online_ddls=online,
            watch=statements,
        )
        unsettled = [p for p in partitions if key(p) not in stored]
        stages.watch = PartitionWatch(reader, barrier, self.log, stored, unsettled)
        reader.assign(start)
        large = stages.large
        self.log.info(
            "started",
            partitions=len(partitions),
            resolved_ts=ckpt.resolved_ts,
            resume_offsets={reader.slots.label(p): o for p, o in start.items()},
            dialect=dialect.name,
            consistency=cfg.consistency,
            max_allowed_packet=dialect.max_allowed_packet,
            spill_dir=str(spill.path),
            large_messages=large.resolver.describe() if large is not None else "refused",
            routes=router.describe() or None,
        )

    def _become_active(self) -> ActiveLock:
        """Take the single-active lock; as a standby, wait (and say so) until the holder is gone."""
        lock = self.stages.lock = ActiveLock(
            self.downstream,
            schema=self.cfg.checkpoint_schema,
            changefeed=self.cfg.group_id,
            poll=self.cfg.standby_poll_seconds,
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

        if not lock.acquire(waiting):
            raise Stopping()
        self.observer.on_state("active")
        self.log.info("active: holding the single-active lock", took_over=said)
        return lock

    def _wait_for_topic(self, reader: PartitionReader) -> tuple[list[int], bool]:
        """The topic's partitions, once a broker answers and the topic exists: at boot the broker
        may come up after the daemon, and TiCDC creates the topic only when the changefeed first
        writes. Waited out like the database (capped backoff, one line then summaries). Also
        whether the topic was missing at some attempt (it was created while this start waited)."""
        missing = False
        log = RetryLog(
            self.log,
            report_seconds=self.cfg.retry_report_seconds,
            action="waiting for the broker and the topic",
            recovered="the topic is readable",
            subject="Kafka",
            classify=lambda exc: "topic_missing" if isinstance(exc, TopicMissing) else "broker_unreachable",
        )

        def discover() -> list[int]:
            nonlocal missing
            try:
                return reader.discover_partitions(reader.METADATA_TIMEOUT)
            except BrokerUnreachable:
                reader.check_refused()  # a refused login looks the same: that one is not waited for
                raise
            except TopicMissing:
                missing = True
                raise

        partitions = run_startup_step(
            discover,
            retry_log=log,
            on_waiting=self.observer.on_waiting,
            waiting_for=f"Kafka (topic {reader.topic!r})",
            retryable=lambda exc: isinstance(exc, (BrokerUnreachable, TopicMissing)),
            sleep=self._sleep,
        )
        return partitions, missing

    def _sleep(self, seconds: float) -> None:
        """The pause between start-up attempts; a stop request ends it (and the start-up) at once."""
        if self._stop.wait(seconds):
            raise Stopping()

    def _lost_offset_advice(self) -> str:
        """What the operator can do about a lost offset (docs/operations.md, "Lost Kafka offsets")."""
        table = quote_table(self.cfg.checkpoint_schema, "partition_offset")
        group = self.cfg.group_id.replace("'", "''")
        return (
            "to go on: if the topic holds every change after the checkpoint's resolved ts (applier "
            f"status), run DELETE FROM {table} WHERE changefeed = '{group}' and start again "
            "(partitions without a stored offset are read from their beginning); otherwise restore "
            "the downstream from a backup and run applier catchup --from-ts with the checkpoint "
            'cleared (docs/operations.md, "Lost Kafka offsets")'
        )

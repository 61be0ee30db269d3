"""The catch-up's driver: plan the read, run the Spark stages, execute DDLs, hand over to the daemon.

Order of work (each step's reasons are in the module it uses):

1. Downstream: checkpoint schema, SQL dialect, the changefeed's single-active lock (a catch-up and
   a daemon must never write the same changefeed at once), claim, load the checkpoint.
2. Kafka: start offsets (:mod:`.offsets`), end offsets learned by fetching, input ranges.
3. Scan (Spark): read and decode every range (:mod:`.source`), cache the decoded rows, collect the
   skeleton; the driver derives R, the DDLs to run and the epochs (:mod:`.epochs`) and replays the
   skeleton through the daemon's listeners (:mod:`.replay`): keyless rows to apply, resume offsets.
4. Per epoch: keyed rows shuffled by handle key to parallel writers, keyless tables one
   transaction each (:mod:`.writer`); the checkpoint moves to the epoch's end; then its DDL runs on
   the driver with the daemon's rules (:mod:`applier.apply.ddl`) and is recorded.
5. Hand-off: one transaction writes the daemon's checkpoint at R: global ts, every table, every
   partition's resume offset and resolved ts.

Several topics (a topic dispatcher's changefeed, the setting ``topic`` naming a set): partitions
are slots inside the job (:mod:`.offsets`), quiet partitions count as resolved at the highest
resolved ts seen once read to an end learned after it, and the checkpoint names each partition
by topic and partition, as the daemon's does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pymysql

from applier.apply.ddl import Bookkeeping, DDLExecutor
from applier.apply.handoff import write_handoff
from applier.apply.online_ddl import OnlineDDLs
from applier.apply.startup import load_checkpoint, prepare_downstream
from applier.apply.transaction import TransactionRunner
from applier.catchup.class_archive import ClassArchive, class_archive
from applier.catchup.epochs import Epoch, epoch_of, plan_catchup
from applier.catchup.offsets import KafkaOffsets, OffsetSource, ReadPlan, plan_reads
from applier.catchup.ranges import ranges_per_task, split_ranges
from applier.catchup.replay import ReplayResult, Skeleton, replay_skeleton
from applier.catchup.report import Progress, Summary, partition_label
from applier.catchup.rows import (
    BUNDLE,
    DDL,
    RESOLVED,
    ROW,
    ROWS,
    SPARK_SCHEMA,
    STATS,
    unbundle,
)
from applier.catchup.source import SOURCE_NAME, ReadSpec, source_options
from applier.catchup.spark_home import spark_home_links
from applier.catchup.tasks import WRITE_STATS_SCHEMA, keyed_task, keyless_task, straddling_task
from applier.catchup.writer import WriteSpec, WriteStats
from applier.codec.events import DDLEvent, RowEvent
from applier.downstream.lock import ActiveLock
from applier.errors import ConfigurationError, FatalError, task_error_line
from applier.kafka.client_log import KafkaClientLog
from applier.kafka.reader import base_consumer_config, new_consumer
from applier.large_messages.settings import LargeMessageSettings
from applier.large_messages.storage import open_store
from applier.ops.logs import get_logger
from applier.settings.downstream import downstream_config
from applier.settings.schema import Config
from applier.stream.progress import ddl_key
from applier.stream.table_filter import table_event_filter
from checkpoint import Checkpoint, CheckpointStore
from checkpoint import Progress as StoredProgress
from sqlgen import Dialect, TablePlan, plan_table

# Writer buckets: the readers spread the rows for the writers over this many buckets by handle key
# and send each bucket's rows of a flush as one Spark row (rows.py); each writer task takes a range
# of buckets, so more buckets than writer tasks even out the tasks' shares.
WRITER_BUCKETS = 256


class CatchupError(FatalError):
    """The catch-up cannot proceed; the message says why (no traceback for the operator)."""


@dataclasses.dataclass(frozen=True)
class _Read:
    """The planned read: the window's lower bound, the offsets per partition, the ranges; with
    several topics, ``places`` names each partition slot by topic and partition."""

    lower: int
    plan: ReadPlan
    ranges: list
    places: dict
    several: bool

    @property
    def partitions(self) -> list[int]:
        return sorted(self.plan.bounds)

    @property
    def total(self) -> int:
        return sum(r.size for r in self.ranges)

    def label(self, partition: int) -> str:
        return partition_label(self.places[partition]) if self.several else str(partition)


class CatchupJob:
    """One ``applier catchup`` run; :meth:`run` returns its :class:`Summary`."""

    def __init__(
        self,
        cfg: Config,
        *,
        spark: Any = None,
        offsets: OffsetSource | None = None,
        progress_interval: float = 5.0,
    ) -> None:
        self.cfg = cfg
        self.topics = cfg.topics()
        self.topic: str = cfg.topic  # the set's description with several topics
        self.from_ts: int = cfg.from_ts
        self.until: int | None = cfg.until
        self.downstream = downstream_config(cfg)
        self.store = CheckpointStore(cfg.checkpoint_schema, cfg.group_id)
        self.options = cfg.decoder_options()
        self.router = cfg.router()
        self.large = LargeMessageSettings.from_config(cfg)
        if self.large.claim_check_storage_uri:
            open_store(self.large.claim_check_storage_uri)  # a bad URI fails here, not in every task
        self._spark = spark
        self._offsets = offsets
        self._progress_interval = progress_interval
        self.log = get_logger(component="catchup", changefeed=cfg.group_id, topic=cfg.topic)
        self.summary = Summary(from_ts=self.from_ts)
        self.tables = table_event_filter(cfg.table_filter(), self.log)  # applied in the reading tasks
        self.lock: ActiveLock | None = None
        self.dialect: Dialect | None = None
        self.ddl_executor: DDLExecutor | None = None
        self._session_thread: threading.Thread | None = None
        self._archive: ClassArchive | None = None
        self._spark_home: Path | None = None
        self._session_error: BaseException | None = None

    # -- downstream helpers --------------------------------------------------------------------
    def _retry(self, unit) -> None:
        """Run one unit of the driver (epoch checkpoint, DDL, hand-off) with the shared retry rule."""
        runner = TransactionRunner(self.downstream, max_time=self.cfg.catchup_retry_seconds)
        try:
            runner.run(unit)
        finally:
            runner.close()

    def _owner(self) -> str:
        assert self.lock is not None
        return self.lock.owner_token

    def _start(self) -> Checkpoint:
        self.dialect = prepare_downstream(self.downstream, self.store)
        self.lock = ActiveLock(
            self.downstream, schema=self.cfg.checkpoint_schema, changefeed=self.cfg.group_id
        )
        if not self.lock.acquire(lambda _w: False):
            self.lock = None
            raise CatchupError(
                f"another applier instance is active for changefeed {self.cfg.group_id!r}; stop it first "
                "(a catch-up and a daemon must not write the same changefeed at once)"
            )
        self.ddl_executor = DDLExecutor(
            self.store, self.dialect, self.lock, owner=self._owner(), router=self.router
        )
        ckpt = load_checkpoint(
            self.downstream, self.store, self.ddl_executor, owner=self._owner(), topic=self.topic
        )
        # Index DDLs a daemon left building beside the stream finish before the epochs: the
        # catch-up runs every DDL in its place (applier.apply.online_ddl).
        online = OnlineDDLs(self.downstream, self.store, self.ddl_executor, router=self.router)
        try:
            online.resume()
            online.wait_for(None, lambda: False)
        finally:
            online.close()
        return ckpt

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> Summary:
        started = time.monotonic()
        source: OffsetSource | None = self._offsets
        own_source = source is None
        archive = None
        if self._spark is None:
            archive = self._archive = class_archive(self.cfg.catchup_class_archive)
            self._spark_home = spark_home_links(self.cfg.catchup_class_archive)
            if archive is not None:
                action = "read" if archive.part is None else "written after the job ends"
                self.log.info("JVM class archive", path=str(archive.path), action=action)
            # The JVM takes seconds to start: let it while the downstream and Kafka are planned.
            self._session_thread = threading.Thread(target=self._build_session, daemon=True)
            self._session_thread.start()
        try:
            ckpt = self._start()
            if source is None:
                cfg = self.cfg
                conf = base_consumer_config(cfg.kafka_bootstrap, cfg.group_id, cfg.kafka_config)
                source = KafkaOffsets(new_consumer(KafkaClientLog().install(conf)), self.topics)
            self._run(ckpt, source, started)
        finally:
            if own_source and isinstance(source, KafkaOffsets):
                source.close()
            if self.lock is not None:
                self.lock.release()
        self.summary.seconds = time.monotonic() - started
        for line in self.summary.lines():
            self.log.info(line)
        if archive is not None and self._spark is not None:
            archive.finish(self._spark)  # written by the JVM as it exits, when this run writes it
        return self.summary

    def _build_session(self) -> None:
        from applier.catchup.session import build_session

        try:
            self._spark = build_session(
                self.cfg.spark_master, self.cfg.spark_conf, archive=self._archive, spark_home=self._spark_home
            )
        except BaseException as exc:  # reported by _session() in the main thread
            self._session_error = exc

    def _session(self) -> Any:
        """The SparkSession: the one given, or the one started in the background by :meth:`run`."""
        if self._session_thread is not None:
            self._session_thread.join()
            self._session_thread = None
        if self._session_error is not None:
            raise self._session_error
        if self._spark is None:
            self._build_session()
            if self._session_error is not None:
                raise self._session_error
        from applier.catchup.session import register

        register(self._spark)
        return self._spark

    def _run(self, ckpt: Checkpoint, source: OffsetSource, started: float) -> None:
        """The stages in order: plan the read, scan, derive the window, replay the skeleton, apply
        the epochs, hand over (the module docstring says what each does)."""
        read = self._plan(ckpt, source)
        collapse_upto = self._collapse_bound(source, read.plan, read.lower)  # while the JVM starts
        spark = self._session()
        progress = Progress(spark, self.log, self._progress_interval)
        # Until here: the downstream's and Kafka's planning while the JVM started (reported alone:
        # it does not grow with the backlog).
        progress.stage_seconds["start-up"] = time.monotonic() - started
        progress.start()
        decoded = None
        try:
            spec = self._read_spec(read.lower, collapse_upto)
            decoded, skeleton = self._scan(spec, read, progress)
            r, epochs = self._window(skeleton, read, ckpt)
            ddls = [e.ddl for e in epochs if e.ddl is not None]  # in the order they run
            if decoded is not None and spec.collapse_upto is not None and len(epochs) > 1:
                decoded = self._uncollapse_if_needed(decoded, spec, read.ranges, epochs)
            table_floor = {t: ts for t, ts in ckpt.tables.items() if ts > read.lower}
            replay = self._replay(skeleton, read, r, ckpt, table_floor, ddls, progress)
            self._apply_epochs(epochs, decoded, replay, table_floor, progress, read.places)
            self._hand_over(r, skeleton, ckpt, ddls, replay, read, progress)
        finally:
            progress.stop()
            self.summary.stage_seconds = dict(progress.stage_seconds)
            if decoded is not None:
                with contextlib.suppress(Exception):  # the session may be gone after a failure
                    decoded.unpersist()

    def _plan(self, ckpt: Checkpoint, source: OffsetSource) -> _Read:
        """Where the window starts and what to read: offsets per partition, cut into ranges."""
        cfg = self.cfg
        g = ckpt.resolved_ts
        if ckpt.partition_applied:
            raise ConfigurationError(
                f"changefeed {cfg.group_id!r} was last applied with consistency = row and some of "
                f"its partitions are applied beyond its resolved ts {g}: the catch-up starts from one "
                "ts for every partition; let `applier run` go on, or run it once with consistency = "
                "transaction until it has caught up, then start the catch-up"
            )
        lower = max(self.from_ts, g)
        self.summary.lower_ts = lower
        margin = cfg.catchup_time_lookup_margin_seconds
        several = self.topics.single is None
        plan = plan_reads(
            source,
            self._stored_offsets(ckpt),
            from_ts=lower,
            time_margin_ms=None if margin is None else margin * 1000,
            several=several,
            options=self.options,
        )
        bounds = plan.bounds
        # Several topics: slots inside, topic and partition wherever Kafka or the checkpoint sees them.
        places = {p: source.key(p) for p in sorted(bounds)} if several else {}
        key = places.__getitem__ if several else None
        read = _Read(lower, plan, split_ranges(bounds, cfg.catchup_split_records, key=key), places, several)
        label = read.label
        quiet = {"quiet_partitions": [label(p) for p in sorted(plan.drained)], "seen_ts": plan.top}
        self.log.info(
            "planned",
            lower_ts=lower,
            checkpoint_ts=g,
            partitions=len(bounds),
            ranges=len(read.ranges),
            records=read.total,
            start_offsets={label(p): b[0] for p, b in sorted(bounds.items())},
            end_offsets={label(p): b[1] for p, b in sorted(bounds.items())},
            **(quiet if several else {}),
        )
        return read

    def _read_spec(self, lower: int, collapse_upto: int | None) -> ReadSpec:
        cfg = self.cfg
        return ReadSpec(
            bootstrap=cfg.kafka_bootstrap,
            topic=self.topic,
            group_id=cfg.group_id,
            kafka_config=dict(cfg.kafka_config or {}),
            options=self.options,
            lower_ts=lower,
            collapse_upto=collapse_upto,
            buckets=WRITER_BUCKETS,
            large=self.large if self.large.configured else None,
            filter=self.tables.tables.rules if self.tables is not None else (),
        )

    def _scan(self, spec: ReadSpec, read: _Read, progress: Progress) -> tuple[Any, Skeleton]:
        """Read and decode every range (cached), and collect the skeleton."""
        s = self.summary
        progress.stage("scan", total_records=read.total, plan_apart=True)
        decoded = None
        if read.ranges:
            decoded = self._read(spec, read.ranges)
            skeleton = self._collect_skeleton(decoded, read.places)
        else:
            skeleton = Skeleton.from_arrow(self._empty_skeleton(), self.topic, read.places)
        s.records, s.events = skeleton.records_read, skeleton.row_events
        if self.tables is not None:  # the reading tasks dropped them; said here, once each
            for schema, table in sorted(skeleton.filtered_tables):
                self.tables.note_skipped(schema, table)
        progress.records_read = s.records
        return decoded, skeleton

    def _window(self, skeleton: Skeleton, read: _Read, ckpt: Checkpoint) -> tuple[int, list[Epoch]]:
        """R, the end of the window, and the epochs between the DDLs to run (:mod:`.epochs`)."""
        r, epochs = plan_catchup(
            skeleton.controls,
            read.partitions,
            read.lower,
            drained=read.plan.drained,
            until=self.until,
            applied=ckpt.applied_ddls,
        )
        if r < read.lower:
            raise CatchupError(
                f"the backlog read only reaches resolved ts {r}, below the window's start {read.lower}: "
                "the topic does not hold the changes up to --from-ts yet (or --until is below it)"
            )
        self.summary.resolved_ts = r
        self.summary.epochs = len(epochs)
        return r, epochs

    def _replay(
        self,
        skeleton: Skeleton,
        read: _Read,
        r: int,
        ckpt: Checkpoint,
        table_floor: dict,
        ddls: list[DDLEvent],
        progress: Progress,
    ) -> ReplayResult:
        """The daemon's listeners over the skeleton: the keyless rows to apply and the resume
        offsets (:mod:`.replay`); the skeleton's rows are dropped after."""
        bounds = read.plan.bounds
        progress.stage("replay")
        replay = replay_skeleton(
            skeleton,
            topic=self.topic,
            starts={p: b[0] for p, b in bounds.items()},
            lower=read.lower,
            upper=r,
            table_floor=table_floor,
            applied_ddls=ckpt.applied_ddls,
            executed_ddls=[ddl_key(d) for d in ddls],
            drained={p: (bounds[p][1], ts) for p, ts in read.plan.drained.items()},
            places=read.places,
        )
        skeleton.drop_rows()  # the writers' turn: their rows are in the JVM and the workers
        self.summary.keyless_replays_dropped = replay.replayed_keyless
        self.log.info(
            "window",
            resolved_ts=r,
            epochs=self.summary.epochs,
            ddls=len(ddls),
            row_events=self.summary.events,
            writer_rows=skeleton.data_rows,  # after the readers' collapse (before a re-read)
            keyless_rows=len(replay.keyless_rows),
        )
        return replay

    def _apply_epochs(
        self,
        epochs: list[Epoch],
        decoded: Any,
        replay: ReplayResult,
        table_floor: dict,
        progress: Progress,
        places: dict,
    ) -> None:
        """Each epoch's rows (keyed by the writers, keyless in order), then its DDL on the driver."""
        keyless = _keyless_by_epoch(replay.keyless_rows, epochs)
        for epoch in epochs:
            if epoch.has_rows and decoded is not None:
                plans = keyless.get(epoch.number, {})
                self._apply_epoch(epoch, decoded, plans, table_floor, progress, places)
            if epoch.ddl is not None:
                progress.stage("ddl")
                self._apply_ddl(epoch)
                self.summary.ddls += 1

    def _hand_over(
        self,
        r: int,
        skeleton: Skeleton,
        ckpt: Checkpoint,
        ddls: list[DDLEvent],
        replay: ReplayResult,
        read: _Read,
        progress: Progress,
    ) -> None:
        """The daemon's checkpoint at R: every table, every partition's resume offset, the DDLs."""
        progress.stage("handoff")
        tables = set(skeleton.keyed_tables) | set(skeleton.keyless_tables) | set(ckpt.tables)
        tables |= {(d.schema, d.table) for d in ddls if d.table}
        # The checkpoint names partitions as the daemon reads it: by topic with several topics.
        places = read.places
        named: Any = (lambda m: {places[p]: v for p, v in m.items()}) if read.several else dict
        offsets = named(replay.resume_offsets)
        self._handoff(r, tables, offsets, named(replay.partition_resolved), ddls)
        self.summary.resume_offsets = offsets

    def _stored_offsets(self, ckpt: Checkpoint) -> dict[tuple[str, int], int]:
        """The checkpoint's offsets of this job's topics, by topic and partition: one topic's only
        when the checkpoint is that topic's; several topics' those of every topic of the set (the
        set may have changed since: ``load_checkpoint`` accepted it)."""
        if self.topics.single is None:
            return {tp: o for tp, o in ckpt.topic_offsets.items() if self.topics.matches(tp[0])}
        return {(self.topic, p): o for p, o in ckpt.offsets.items()} if ckpt.topic == self.topic else {}

    def _collapse_bound(self, source: OffsetSource, plan: ReadPlan, lower: int) -> int | None:
        """The ts the readers may collapse up to: the smallest resolved ts near the partitions' ends
        (a quiet partition's: the one it counts as, ``plan.drained``).

        It is at most R (each is at most its partition's resolved ts over the range), so no op
        above the window can hide one inside it. None (no collapsing) when disabled or unknown.
        """
        bounds = plan.bounds
        if not self.cfg.catchup_collapse_in_reader or not bounds:
            return None
        tails = plan.tails if plan.tails is not None else source.tail_resolved(bounds, self.options)
        tails = {p: plan.drained.get(p, tails.get(p)) for p in bounds}
        if any(v is None for v in tails.values()):
            return None
        bound = min(v for v in tails.values() if v is not None)
        if self.until is not None:
            bound = min(bound, self.until)
        self.log.info("reader collapse bound", collapse_upto=bound)
        return bound if bound > lower else None

    def _uncollapse_if_needed(self, decoded: Any, spec: ReadSpec, ranges: list, epochs: list[Epoch]) -> Any:
        """Read again without collapsing if some collapsed row stands for ops of two epochs.

        A reader never merges ops across a DDL record it saw, and by the protocol the rows of a
        partition on both sides of a DDL are separated by that DDL's record; this check makes
        the result right even for a stream that breaks that rule.
        """
        from pyspark.sql import functions as F

        uppers = [e.upper for e in epochs[:-1]]
        counts = decoded.filter(F.col("kind") == F.lit(ROWS)).mapInArrow(
            functools.partial(straddling_task, uppers=uppers), "rows long"
        )
        straddling = sum(row.rows for row in _spark_call(counts.collect))
        if not straddling:
            return decoded
        self.log.warning(
            "collapsed rows span a DDL that their range did not hold; reading the backlog again "
            "without collapsing",
            rows=straddling,
        )
        decoded.unpersist()
        return self._read(dataclasses.replace(spec, collapse_upto=None), ranges)

    def _read(self, spec: ReadSpec, ranges: list) -> Any:
        """The decoded backlog of ``ranges``, cached (memory, spilling to disk) when first computed.

        The schema is given, not asked of the source: asking starts a Python worker in the
        driver's JVM just to answer it (about a second in local mode, where workers are not
        forked from a daemon).

        A task may read two ranges in turn (``ranges.ranges_per_task`` says when and why)."""
        from pyspark import StorageLevel

        cores = self._spark.sparkContext.defaultParallelism
        per_task = ranges_per_task(ranges, cores, self.cfg.catchup_split_records)
        return (
            self._spark.read.format(SOURCE_NAME)
            .schema(SPARK_SCHEMA)
            .options(**source_options(spec, ranges, per_task))
            .load()
            .persist(StorageLevel.MEMORY_AND_DISK)
        )

    def _collect_skeleton(self, decoded: Any, places: dict) -> Skeleton:
        """The skeleton of the scan: the readers bundle their skeleton rows (``rows.BUNDLE``, a few
        large rows), the driver collects and opens the bundles and sorts the rows once. Only the
        sorted copy outlives this call (at 10M events each copy is about 90 MB of Arrow)."""
        from pyspark.sql import functions as F

        bundles = _spark_call(lambda: decoded.filter(F.col("kind") == F.lit(BUNDLE)).toArrow())
        rows = unbundle(bundles)
        del bundles
        return Skeleton.from_arrow(rows, self.topic, places)

    @staticmethod
    def _empty_skeleton() -> pa.Table:
        from applier.catchup.rows import ARROW_SCHEMA

        return ARROW_SCHEMA.empty_table()

    # -- epochs --------------------------------------------------------------------------------
    def _write_spec(self, epoch: Epoch, table_floor: dict, places: dict) -> WriteSpec:
        assert self.dialect is not None
        return WriteSpec(
            downstream=self.downstream,
            dialect=self.dialect,
            topic=self.topic,
            epoch=epoch.number,
            lower=epoch.lower,
            upper=epoch.upper,
            table_floor=dict(table_floor),
            commit_rows=self.cfg.max_txn_rows,
            retry_seconds=self.cfg.catchup_retry_seconds,
            checkpoint_schema=self.cfg.checkpoint_schema,
            changefeed=self.cfg.group_id,
            owner=self._owner(),
            router=self.router,
            places=places,
        )

    def _apply_epoch(
        self,
        epoch: Epoch,
        decoded: Any,
        keyless_plans: dict[tuple[str, str], TablePlan],
        table_floor: dict,
        progress: Progress,
        places: dict,
    ) -> None:
        from pyspark.sql import functions as F

        s = self.summary
        spark = self._spark
        spec = self._write_spec(epoch, table_floor, places)
        progress.stage(f"epoch{epoch.number}")
        started = time.monotonic()
        parallel = self.cfg.catchup_parallelism or spark.sparkContext.defaultParallelism
        # One round of tasks: a writer holds a group of buckets at a time, not its whole share
        # (writer.write_keyed), so a huge epoch needs no more tasks than there are cores.
        parts = min(parallel, WRITER_BUCKETS)
        rows = (
            # A ROWS row holds one bucket's rows of a reader's flush, their commit ts from lo to ts.
            # Ranges of buckets, not a hash of them: every bucket's rows still meet in one task, and
            # the tasks get even shares (hashing 256 bucket numbers into 2 tasks gave one of them 57%
            # of the rows). Sorted by bucket: a writer plans and writes a group of buckets as soon
            # as it has read it (writer._bucket_groups).
            decoded.filter(
                (F.col("kind") == F.lit(ROWS))
                & (F.col("ts") > F.lit(epoch.lower))
                & (F.col("lo") <= F.lit(epoch.upper))
            )
            .repartitionByRange(parts, "idx")
            .sortWithinPartitions("idx")
            .mapInArrow(functools.partial(keyed_task, spec=spec), WRITE_STATS_SCHEMA)
        )
        totals = WriteStats()
        for row in _spark_call(rows.collect):
            totals.add(row.asDict())
        progress.rows_written += totals.rows
        if keyless_plans:
            plans = list(keyless_plans.values())
            task = functools.partial(keyless_task, spec=spec)
            results = _spark_call(
                lambda: spark.sparkContext.parallelize(plans, min(len(plans), parallel)).map(task).collect()
            )
            for st in results:
                totals.add(st)
            progress.rows_written += sum(st.rows for st in results)
        s.writes.add(totals)

        def unit(conn: pymysql.connections.Connection) -> None:
            with conn.cursor() as cur:
                self._write_checkpoint(cur, epoch.upper)
            conn.commit()

        self._retry(unit)
        self.log.info(
            "epoch applied",
            epoch=epoch.number,
            up_to_ts=epoch.upper,
            ops=totals.events,
            rows_written=totals.rows,
            keyless_tables=len(keyless_plans),
            seconds=round(time.monotonic() - started, 2),
        )

    def _write_checkpoint(
        self,
        cur: pymysql.cursors.Cursor,
        resolved_ts: int,
        *,
        tables: Iterable[tuple[str, str]] = (),
        topic: str | None = None,
        offsets: dict | None = None,
        partition_resolved: dict | None = None,
    ) -> None:
        """The checkpoint rows of a driver unit, then the lock check its COMMIT must follow."""
        self.store.write(cur, **self._progress(resolved_ts, tables, topic, offsets, partition_resolved))
        self._ensure_locked()

    def _progress(
        self,
        resolved_ts: int,
        tables: Iterable[tuple[str, str]],
        topic: str | None = None,
        offsets: dict | None = None,
        partition_resolved: dict | None = None,
    ) -> StoredProgress:
        return StoredProgress(
            topic=topic,
            resolved_ts=resolved_ts,
            tables=dict.fromkeys(tables, resolved_ts),
            offsets=offsets or {},
            partition_resolved=partition_resolved or {},
            owner=self._owner(),
        )

    def _ensure_locked(self) -> None:
        assert self.lock is not None
        self.lock.ensure_held()

    def _apply_ddl(self, epoch: Epoch) -> None:
        ddl = epoch.ddl
        assert ddl is not None and self.dialect is not None
        plan_box: list[Any] = [None]

        tables = {(ddl.schema, ddl.table)} if ddl.table else ()
        bookkeeping = Bookkeeping(
            progress=lambda cur: self.store.progress_write(cur, **self._progress(epoch.upper, tables)),
            before_commit=self._ensure_locked,
        )

        def unit(conn: pymysql.connections.Connection) -> None:
            assert self.ddl_executor is not None
            plan_box[0] = self.ddl_executor.apply(conn, ddl, bookkeeping).plan

        self._retry(unit)
        plan = plan_box[0]
        self.log.info(
            "DDL applied" if plan is not None and plan.execute else "DDL skipped",
            ts=ddl.commit_ts,
            schema=ddl.schema,
            table=ddl.table,
            ddl_type=ddl.ddl_type,
            reason=plan.reason if plan is not None else None,
            query=" ".join(ddl.query.split())[:200],
        )

    def _handoff(
        self,
        r: int,
        tables: set[tuple[str, str]],
        offsets: dict[int, int] | dict[tuple[str, int], int],
        resolved: dict[int, int] | dict[tuple[str, int], int],
        ddls: list[DDLEvent],
    ) -> None:
        """``offsets`` and ``resolved`` by partition of the topic, or by (topic, partition)."""

        def unit(conn: pymysql.connections.Connection) -> None:
            with conn.cursor() as cur:
                write_handoff(
                    cur,
                    self.store,
                    resolved_ts=r,
                    topic=self.topic,
                    owner=self._owner(),
                    tables=tables,
                    offsets=offsets,
                    partition_resolved=resolved,
                    ddls=ddls,
                )
                assert self.lock is not None
                self.lock.ensure_held()
            conn.commit()

        self._retry(unit)
        self.log.info(
            "hand-off checkpoint written",
            resolved_ts=r,
            tables=len(tables),
            resume_offsets={partition_label(p): o for p, o in sorted(offsets.items())},
        )


def _keyless_by_epoch(
    rows: list[RowEvent], epochs: list[Epoch]
) -> dict[int, dict[tuple[str, str], TablePlan]]:
    """Keyless rows grouped per epoch and table, planned (ordered ops) with ``sqlgen.plan_table``."""
    grouped: dict[int, dict[tuple[str, str], list[RowEvent]]] = {}
    for ev in rows:
        epoch = epoch_of(epochs, ev.commit_ts)
        if epoch is None:
            continue
        grouped.setdefault(epoch.number, {}).setdefault((ev.schema, ev.table), []).append(ev)
    return {n: {t: plan_table(t[0], t[1], evs) for t, evs in tables.items()} for n, tables in grouped.items()}


def _spark_call(fn):
    """Run a Spark action; a task's ``FatalError`` (bad record, refused statement) becomes one line."""
    try:
        return fn()
    except Exception as exc:
        line = task_error_line(str(exc))
        if line is not None:
            raise CatchupError(line) from None
        raise


def run_catchup(cfg: Config, *, spark: Any = None, offsets: OffsetSource | None = None) -> Summary:
    """Run one catch-up (see :class:`CatchupJob`)."""
    return CatchupJob(cfg, spark=spark, offsets=offsets).run()


# Kinds re-exported for callers inspecting decoded frames.
__all__ = ["DDL", "RESOLVED", "ROW", "STATS", "CatchupError", "CatchupJob", "run_catchup"]

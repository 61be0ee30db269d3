"""A PySpark Python Data Source that reads Kafka offset ranges and decodes them with the project's codec.

No JVM Kafka connector is involved (none can be downloaded where this runs, and the daemon's
decoder must be the one used): each input partition is one or a few
:class:`~applier.catchup.offsets.OffsetRange` s (``ranges_per_task``,
:func:`~applier.catchup.offsets.task_groups`), each read in turn by confluent-kafka inside the
executor's Python worker with ``assign()`` (never a consumer group), decoded record by record with
:func:`decode_record` and returned as Arrow record batches (:mod:`applier.catchup.rows`). The
ranges are fixed by the driver before the job starts, so a retried task re-reads exactly the
same records.

Options (strings, as Spark passes them): ``bootstrap``, ``topic``, ``group_id``, ``ranges`` (JSON
list of ``[partition, start, end]``, with several topics ``[slot, start, end, topic, partition]``:
the task reads that topic and partition and names the rows' partition by the slot, which is what
the driver keys partitions by), ``lower_ts``, ``legacy_base64_strings``, ``compression``,
``reserved_schemas`` (JSON list, see :mod:`sqlgen.ddl_guard`), ``filter`` (JSON list of the
table-filter rules, see :mod:`applier.stream.table_filter`), ``ranges_per_task``,
``batch_rows``, ``collapse_upto`` (keep only the last op per handle key among the ops at or below
this ts a task reads; empty: keep every op), ``buckets`` (writer buckets, :mod:`applier.catchup.rows`),
``secret.kafka_config`` (JSON of librdkafka settings; the ``secret`` prefix
makes Spark redact it in plans and the UI, since it may hold SASL credentials) and
``secret.large_messages`` (the pickled :class:`LargeMessageSettings`, base64: claim-check storage
and upstream, whose URIs and password it holds).

Large-message events are resolved in the task, as the daemon does (:mod:`applier.large_messages`):
a record waits while its objects or upstream rows are fetched, the next ones of the range are read
meanwhile (several fetches at once), and the records are added to the batch in offset order. A
fetch that fails fails the task with the error naming the record; the catch-up then stops before
writing anything.
"""

from __future__ import annotations

import base64
import gc
import json
import pickle
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from applier.catchup.offsets import OffsetRange, task_groups
from applier.catchup.rows import SPARK_SCHEMA
from applier.codec.decoder import DecoderOptions, decode_record
from applier.errors import fatal_in_task
from applier.kafka.client_log import KafkaClientLog
from applier.kafka.reader import KafkaReadError, base_consumer_config, is_fatal_kafka_error
from applier.large_messages.resolver import LargeMessageQueue
from applier.large_messages.settings import LargeMessageSettings
from applier.stream.table_filter import EventFilter, TableFilter

try:
    from applier.catchup.batch_builder import BatchBuilder
except ImportError as _e:  # an install from before the module existed: one clear line
    raise ImportError(
        f"the catch-up readers' compiled loop (applier/catchup/batch_builder.pyx) cannot be imported "
        f"({_e}): rebuild it with `pip install -e .` in the checkout (needs a C compiler and the "
        "Python headers)"
    ) from _e

SOURCE_NAME = "ticdc_open_protocol"
STALL_SECONDS = 120.0  # no record for this long inside a range that should hold more: give up


@dataclass(frozen=True)
class ReadSpec:
    """Everything a task needs to read and decode one range."""

    bootstrap: str
    topic: str
    group_id: str
    kafka_config: Mapping[str, str]
    options: DecoderOptions
    lower_ts: int
    batch_rows: int = 20_000
    collapse_upto: int | None = None  # collapse ops at or below this ts in the reader (rows.py)
    buckets: int = 1  # writer buckets the rows for the writers are spread over by handle key (rows.py)
    large: LargeMessageSettings | None = None  # where large messages are read from, if anywhere
    filter: tuple[str, ...] = ()  # table-filter rules (applier.stream.table_filter); none: every table


class RangePartition(InputPartition):
    """One Spark input partition: the :class:`OffsetRange` s one task reads in turn
    (:func:`~applier.catchup.offsets.task_groups`)."""

    def __init__(self, ranges: tuple[OffsetRange, ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


def read_range(spec: ReadSpec, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Read and decode one range; yields Arrow batches, the last one ending with the STATS row."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    conf = base_consumer_config(spec.bootstrap, spec.group_id, spec.kafka_config)
    conf.setdefault("fetch.max.bytes", 52428800)
    conf.setdefault("max.partition.fetch.bytes", 8388608)
    # Executors log nothing of librdkafka (nobody configures their output): its last error is
    # quoted by the exception that fails the task instead.
    client_log = KafkaClientLog(quiet=True)
    client_log.install(conf)
    builder = BatchBuilder(spec.lower_ts, collapse_upto=spec.collapse_upto, buckets=spec.buckets)
    large = spec.large.queue(spec.options) if spec.large is not None else None
    tables = EventFilter(TableFilter(spec.filter)) if spec.filter else None
    consumer = Consumer(conf)
    # Decoding allocates millions of short-lived dicts and creates no reference cycles; the cyclic
    # collector would only re-scan the live ones (collapse winners) over and over.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    topic, kafka_partition = rng.where(spec.topic)
    try:
        consumer.assign([TopicPartition(topic, kafka_partition, rng.start)])
        next_offset = rng.start
        last_progress = time.monotonic()
        while next_offset < rng.end:
            msgs = consumer.consume(1000, 0.5)
            if not msgs and time.monotonic() - last_progress > STALL_SECONDS:
                raise KafkaReadError(
                    f"topic {topic!r} partition {kafka_partition}: no record at offset {next_offset} "
                    f"for {STALL_SECONDS:.0f}s (range ends at {rng.end}; last Kafka client error: "
                    f"{client_log.last_error})"
                )
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() < rng.end:
                            raise KafkaReadError(
                                f"topic {topic!r} partition {kafka_partition} ended at offset "
                                f"{msg.offset()}, before the planned end {rng.end} (retention? truncation?)"
                            )
                        continue
                    if is_fatal_kafka_error(err):
                        raise KafkaReadError(f"Kafka error on topic {topic!r}: {err.str()}")
                    continue
                off = msg.offset()
                if off >= rng.end:
                    next_offset = rng.end
                    break
                key, value = msg.key(), msg.value()
                events = decode_record(
                    key,
                    value,
                    topic=topic,
                    partition=kafka_partition,
                    offset=off,
                    options=spec.options,
                    old_keys_only=True,  # all the builder reads of an update's old image
                )
                if tables is not None:  # as the daemon: the record still counts, without those events
                    events = tables.keep(events)
                if large is not None and (large.holds(rng.partition) or large.holds_large(events)):
                    large.add(rng.partition, (off, key, value), events, len(key or b"") + len(value or b""))
                    _add_resolved(builder, large, rng.partition)
                    while large.over_limit():
                        large.wait(1.0)
                        _add_resolved(builder, large, rng.partition)
                else:
                    builder.add_record(rng.partition, off, events, (key, value))
                next_offset = off + 1
                last_progress = time.monotonic()
                if len(builder) >= spec.batch_rows:
                    yield builder.flush()
        while large is not None and large.busy():
            large.wait(1.0)
            _add_resolved(builder, large, rng.partition)
        builder.add_stats(rng.partition, tables.skipped if tables is not None else ())
        # The collapse winners are written out here, with the collector still off: each becomes a
        # tuple, and with it on, every few hundred of them would re-scan all the winners still held.
        last = builder.flush(final=True)
    finally:
        consumer.close()
        if large is not None:
            large.close()
        if gc_was_enabled:
            gc.enable()
    yield last


def _add_resolved(builder: BatchBuilder, large: LargeMessageQueue, partition: int) -> None:
    """Add the records whose large messages are fetched; raise the first failure."""
    done, failures = large.ready()
    for (off, key, value), events, _fetched in done:
        builder.add_record(partition, off, events, (key, value))
    if failures:
        raise failures[0]


class _Reader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.spec = ReadSpec(
            bootstrap=options["bootstrap"],
            topic=options["topic"],
            group_id=options["group_id"],
            kafka_config=json.loads(options.get("secret.kafka_config", "{}")),
            options=DecoderOptions(
                legacy_base64_strings=options.get("legacy_base64_strings", "false") == "true",
                compression=options.get("compression") or None,
                reserved_schemas=frozenset(json.loads(options.get("reserved_schemas", "[]"))),
            ),
            lower_ts=int(options["lower_ts"]),
            batch_rows=int(options.get("batch_rows", "20000")),
            collapse_upto=int(options["collapse_upto"]) if options.get("collapse_upto") else None,
            buckets=int(options.get("buckets", "1")),
            filter=tuple(json.loads(options.get("filter", "[]"))),
            large=pickle.loads(base64.b64decode(options["secret.large_messages"]))
            if options.get("secret.large_messages")
            else None,
        )
        self.ranges = [
            OffsetRange(int(p), int(s), int(e), *([str(r[0]), int(r[1])] if r else []))
            for p, s, e, *r in json.loads(options["ranges"])
        ]
        self.per_task = int(options.get("ranges_per_task", "1"))

    def partitions(self) -> list[InputPartition]:
        return [RangePartition(group) for group in task_groups(self.ranges, self.per_task)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        with fatal_in_task():
            for rng in partition.ranges:  # each with a builder of its own (read_range)
                yield from read_range(self.spec, rng)


class OpenProtocolSource(DataSource):
    """``spark.read.format("ticdc_open_protocol").options(...).load()`` (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SPARK_SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return _Reader(self.options)


def source_options(spec: ReadSpec, ranges: list[OffsetRange], per_task: int = 1) -> dict[str, str]:
    """The options that make the source read ``ranges`` as ``spec`` says, ``per_task`` of them a
    task (:func:`~applier.catchup.offsets.task_groups`)."""
    return {
        "bootstrap": spec.bootstrap,
        "topic": spec.topic,
        "group_id": spec.group_id,
        "ranges": json.dumps([_range_item(r) for r in ranges]),
        "lower_ts": str(spec.lower_ts),
        "legacy_base64_strings": "true" if spec.options.legacy_base64_strings else "false",
        "compression": spec.options.compression or "",
        "reserved_schemas": json.dumps(sorted(spec.options.reserved_schemas)),
        "filter": json.dumps(list(spec.filter)),
        "batch_rows": str(spec.batch_rows),
        "collapse_upto": "" if spec.collapse_upto is None else str(spec.collapse_upto),
        "buckets": str(spec.buckets),
        "ranges_per_task": str(per_task),
        "secret.kafka_config": json.dumps(dict(spec.kafka_config)),
        "secret.large_messages": base64.b64encode(pickle.dumps(spec.large)).decode() if spec.large else "",
    }


def _range_item(rng: OffsetRange) -> list:
    """A range as the ``ranges`` option lists it: the topic and partition only with several topics."""
    where = [rng.topic, rng.kafka_partition] if rng.topic else []
    return [rng.partition, rng.start, rng.end, *where]

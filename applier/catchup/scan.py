"""What a reading task does with its ranges: fetch each from Kafka, decode it, build Arrow batches.

The Spark side (options, input partitions) is :mod:`applier.catchup.source`; this module holds
what only a reading task needs, so that Spark's planning workers never import it: the decoder,
confluent-kafka, Arrow, the compiled :class:`~applier.catchup._batch_builder.BatchBuilder`.

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

import pyarrow as pa

from applier.catchup.ranges import OffsetRange
from applier.catchup.source import ReadSpec
from applier.codec.decoder import DecoderOptions, decode_record
from applier.errors import compiled_module_missing
from applier.kafka.client_log import KafkaClientLog
from applier.kafka.reader import KafkaReadError, base_consumer_config, is_fatal_kafka_error
from applier.large_messages.resolver import LargeMessageQueue
from applier.stream.table_filter import EventFilter, TableFilter

try:
    from applier.catchup._batch_builder import BatchBuilder
except ImportError as _e:  # an install from before the module existed: one clear line
    raise compiled_module_missing(
        "the catch-up readers' compiled loop", "applier/catchup/_batch_builder.pyx", _e
    ) from _e

STALL_SECONDS = 120.0  # no record for this long inside a range that should hold more: give up


def read_spec(options: Mapping[str, str]) -> ReadSpec:
    """The :class:`ReadSpec` that ``source.source_options`` wrote as the source's options."""
    return ReadSpec(
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

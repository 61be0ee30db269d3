"""A PySpark Python Data Source that reads Kafka offset ranges and decodes them with the project's codec.

No JVM Kafka connector is involved (none can be downloaded where this runs, and the daemon's
decoder must be the one used): each input partition is one or a few
:class:`~applier.catchup.ranges.OffsetRange` s (``ranges_per_task``,
:func:`~applier.catchup.ranges.task_groups`), each read in turn by confluent-kafka inside the
executor's Python worker with ``assign()`` (never a consumer group), decoded record by record with
the project's decoder and returned as Arrow record batches (:mod:`applier.catchup.rows`). The
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

This module is what Spark's planning workers import (the driver's JVM starts one to create the
data source and one to plan its read, one after the other, before the first reading task): it
imports PySpark's data source classes and the ranges, nothing else. The reading itself, with the
decoder, Kafka, Arrow and the compiled builder, is in :mod:`applier.catchup.scan`, imported by the
reading tasks only: importing both in each planning worker would cost CPU, twice, on the way to
the scan.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from applier.catchup.ranges import OffsetRange, task_groups
from applier.errors import fatal_in_task

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.codec.decoder import DecoderOptions
    from applier.large_messages.settings import LargeMessageSettings

SOURCE_NAME = "ticdc_open_protocol"


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
    (:func:`~applier.catchup.ranges.task_groups`)."""

    def __init__(self, ranges: tuple[OffsetRange, ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


class _Reader(DataSourceReader):
    """Planned in a planning worker, pickled into the reading tasks: it keeps the options as they
    are and the reading task turns them into a :class:`ReadSpec` (``scan.read_spec``)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        self.ranges = [
            OffsetRange(int(p), int(s), int(e), *([str(r[0]), int(r[1])] if r else []))
            for p, s, e, *r in json.loads(options["ranges"])
        ]
        self.per_task = int(options.get("ranges_per_task", "1"))

    def partitions(self) -> list[InputPartition]:
        return [RangePartition(group) for group in task_groups(self.ranges, self.per_task)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from applier.catchup.scan import read_range, read_spec  # the reading tasks' own imports

        assert isinstance(partition, RangePartition)
        with fatal_in_task():
            spec = read_spec(self.options)
            for rng in partition.ranges:  # each with a builder of its own (read_range)
                yield from read_range(spec, rng)


class OpenProtocolSource(DataSource):
    """``spark.read.format("ticdc_open_protocol").options(...).load()`` (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        from applier.catchup.rows import SPARK_SCHEMA  # (asked only when the reader gives none)

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

"""Which Kafka offsets the catch-up reads: start and end per partition, split into input ranges.

Where a partition *ends* is learned by fetching: the driver assigns every partition at its start
offset, takes one message (or the end-of-partition event) from each, and reads the high watermark
librdkafka cached from that fetch response. ``ListOffsets`` (``get_watermark_offsets`` without
``cached``) is never trusted: some Kafka-protocol brokers (the embedded one included) answer it
wrongly for batched records, while their fetch responses are right. The broker's idea of record
*times* (``offsets_for_times``) is only used when the operator asks for it (a start offset found
from ``--from-ts`` minus a margin) and sits behind :class:`OffsetSource`, so tests use a fake.

Where a partition *starts*: the stored checkpoint offset when the changefeed has one (a re-run,
or a catch-up on top of an earlier hand-off), else a time lookup when enabled, else the earliest
offset. Starting early is always safe (rows at or below the checkpoint are skipped); starting
late would lose rows, hence the margin on time lookups.

Nothing here imports pyspark: the driver plans ranges before Spark reads them, and the unit
tests exercise the planning without a JVM.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from applier.catchup.tso import PHYSICAL_SHIFT
from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import ResolvedEvent
from applier.kafka.reader import KafkaReadError, is_fatal_kafka_error, topic_partitions

EARLIEST = "earliest"
END = "end"
StartSpec = int | str  # an offset, EARLIEST or END


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``start <= offset < end`` of one partition: one Spark input partition."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(bounds: Mapping[int, tuple[int, int]], max_records: int) -> list[OffsetRange]:
    """Cut each partition's ``[start, end)`` into nearly equal ranges of at most ``max_records``.

    Empty partitions give no range. Ranges are ordered by partition, then offset, so the input
    partitions' order is deterministic (a retried Spark task re-reads exactly the same records).
    """
    if max_records < 1:
        raise ValueError("max_records must be at least 1")
    out: list[OffsetRange] = []
    for p in sorted(bounds):
        start, end = bounds[p]
        if end < start:
            raise ValueError(f"partition {p}: end offset {end} is before start offset {start}")
        total = end - start
        if total == 0:
            continue
        pieces = -(-total // max_records)
        base, extra = divmod(total, pieces)
        s = start
        for i in range(pieces):
            e = s + base + (1 if i < extra else 0)
            out.append(OffsetRange(p, s, e))
            s = e
    return out


class OffsetSource(Protocol):
    """What the driver asks the broker. The real one is :class:`KafkaOffsets`; tests use fakes."""

    def partitions(self) -> list[int]:
        """Partition ids of the topic."""
        ...

    def bounds(self, starts: Mapping[int, StartSpec]) -> dict[int, tuple[int, int]]:
        """Per partition ``(first offset to read, end offset)``, the end learned by fetching."""
        ...

    def offsets_for_time(self, partitions: Iterable[int], ms: int) -> dict[int, int | None]:
        """Per partition the first offset whose record time is >= ``ms`` (None: no such record)."""
        ...

    def tail_resolved(
        self, bounds: Mapping[int, tuple[int, int]], options: DecoderOptions
    ) -> dict[int, int | None]:
        """Per partition a resolved ts found near the end of ``[start, end)`` (None: none found).

        A lower bound of the partition's resolved ts over the range: the driver uses the smallest
        as a bound the readers may collapse up to, which must not exceed the window's end.
        """
        ...


def choose_starts(
    partitions: Iterable[int],
    stored: Mapping[int, int],
    *,
    from_ts: int,
    source: OffsetSource | None = None,
    time_margin_ms: int | None = None,
) -> dict[int, StartSpec]:
    """Where to start reading each partition (see the module docstring).

    ``time_margin_ms`` None disables time lookups (the default: record times are the producer's
    clock, not PD's, and a broker may not index them). With a margin, a partition without a stored
    offset starts at the first record written at or after ``physical(from_ts) - margin``.
    """
    parts = sorted(set(partitions))
    starts: dict[int, StartSpec] = {}
    need_lookup = []
    for p in parts:
        if p in stored:
            starts[p] = stored[p]
        elif time_margin_ms is not None and source is not None:
            need_lookup.append(p)
        else:
            starts[p] = EARLIEST
    if need_lookup:
        assert source is not None and time_margin_ms is not None
        ms = max(0, (from_ts >> PHYSICAL_SHIFT) - time_margin_ms)
        found = source.offsets_for_time(need_lookup, ms)
        for p in need_lookup:
            off = found.get(p)
            # No record written after that time: nothing of the window is in this partition yet.
            starts[p] = END if off is None else (off if off >= 0 else EARLIEST)
    return starts


class KafkaOffsets:
    """:class:`OffsetSource` over a confluent-kafka consumer (never joins a group: assign only)."""

    def __init__(self, consumer: Any, topic: str, *, timeout: float = 30.0) -> None:
        """``consumer``: a confluent-kafka consumer made from :func:`base_consumer_config`; closed by
        :meth:`close`."""
        self.topic = topic
        self.timeout = timeout
        self._consumer = consumer

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing after a broker failure must not hide the real error
            self._consumer.close()

    def partitions(self) -> list[int]:
        return topic_partitions(self._consumer, self.topic, self.timeout)

    def bounds(self, starts: Mapping[int, StartSpec]) -> dict[int, tuple[int, int]]:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, TopicPartition

        def logical(spec: StartSpec) -> int:
            if spec == EARLIEST:
                return OFFSET_BEGINNING
            if spec == END:
                return OFFSET_END
            return int(spec)

        c = self._consumer
        c.assign([TopicPartition(self.topic, p, logical(s)) for p, s in sorted(starts.items())])
        first: dict[int, int] = {}
        deadline = time.monotonic() + self.timeout
        try:
            while len(first) < len(starts):
                if time.monotonic() > deadline:
                    missing = sorted(set(starts) - set(first))
                    raise KafkaReadError(
                        f"topic {self.topic!r}: partitions {missing} gave neither a record nor their end "
                        f"within {self.timeout:.0f}s (start offsets {[starts[p] for p in missing]}: "
                        "beyond the end of the partition?)"
                    )
                for msg in c.consume(500, 0.2):
                    p = msg.partition()
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            first.setdefault(p, msg.offset())
                            continue
                        if is_fatal_kafka_error(err):
                            raise KafkaReadError(f"Kafka error on topic {self.topic!r}: {err.str()}")
                        continue
                    first.setdefault(p, msg.offset())
            out: dict[int, tuple[int, int]] = {}
            for p, spec in starts.items():
                _low, high = c.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                start = spec if isinstance(spec, int) else first[p]
                if spec == END or high < start:
                    high = max(high, first[p])
                    start = high if spec == END else start
                out[p] = (start, max(high, start))
            return out
        finally:
            c.unassign()

    def tail_resolved(
        self,
        bounds: Mapping[int, tuple[int, int]],
        options: DecoderOptions,
        lookback: tuple[int, ...] = (256, 4096, 65536),
    ) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for p, (start, end) in sorted(bounds.items()):
            found: int | None = None
            upto = end
            for n in lookback:
                frm = max(start, end - n)
                if frm >= upto:
                    break
                found = self._max_resolved(p, frm, upto, options)
                if found is not None or frm == start:
                    break
                upto = frm  # nothing in [frm, upto): look further back
            out[p] = found
        return out

    def _max_resolved(self, partition: int, start: int, end: int, options: DecoderOptions) -> int | None:
        """Highest resolved ts in records ``[start, end)``.

        A DDL implies none (docs/open-protocol.md §5.4)."""
        from confluent_kafka import KafkaError, TopicPartition

        c = self._consumer
        c.assign([TopicPartition(self.topic, partition, start)])
        best: int | None = None
        deadline = time.monotonic() + self.timeout
        try:
            nxt = start
            while nxt < end:
                if time.monotonic() > deadline:
                    raise KafkaReadError(
                        f"topic {self.topic!r} partition {partition}: offsets {nxt}..{end} not readable "
                        f"within {self.timeout:.0f}s"
                    )
                for msg in c.consume(500, 0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF and err.fatal():
                            raise KafkaReadError(f"Kafka error on topic {self.topic!r}: {err.str()}")
                        continue
                    off = msg.offset()
                    if off >= end:
                        nxt = end
                        break
                    nxt = off + 1
                    for ev in decode_record(
                        msg.key(),
                        msg.value(),
                        topic=self.topic,
                        partition=partition,
                        offset=off,
                        options=options,
                    ):
                        if isinstance(ev, ResolvedEvent) and (best is None or ev.ts > best):
                            best = ev.ts
            return best
        finally:
            c.unassign()

    def offsets_for_time(self, partitions: Iterable[int], ms: int) -> dict[int, int | None]:
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(self.topic, p, ms) for p in sorted(partitions)]
        found = self._consumer.offsets_for_times(tps, timeout=self.timeout)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}

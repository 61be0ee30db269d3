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

Several topics (one changefeed written by a topic dispatcher, docs/open-protocol.md §5.10). The
catch-up names partitions by slot (``applier.kafka.topics.TopicSlots``: the partition number for
one topic, a dense int per ``(topic, partition)`` for several), so the window, the epochs and the
replay stay keyed by one int; ranges carry the real topic and partition. A topic whose tables do
not change gets no resolved events, which would hold R at the lowest such partition's last one.
TiCDC writes a resolved ts R only once every row and DDL at or below R is in Kafka, in every
topic, so :func:`plan_reads` takes the highest resolved ts T found near the partitions' ends,
then lists the topics again (a topic listed only now joins, from its beginning or its stored
offset: it may hold rows at or below T) and learns again, by fetching, the end of every
partition whose own resolved ts near its end is below T: read up to that end, such a partition
holds nothing more at or below T but copies, so it counts as resolved at T there
(``ReadPlan.drained``). One plain topic needs none of this (every partition gets every resolved
event) and asks Kafka exactly what it did.

Nothing here imports pyspark: the driver plans ranges before Spark reads them, and the unit
tests exercise the planning without a JVM. The bounds become input ranges, and the ranges tasks,
in :mod:`applier.catchup.ranges`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from applier.catchup.tso import PHYSICAL_SHIFT
from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import ResolvedEvent
from applier.kafka.reader import KafkaReadError, is_fatal_kafka_error, set_partitions, topic_partitions
from applier.kafka.topics import TopicSet, TopicSlots

EARLIEST = "earliest"
END = "end"
StartSpec = int | str  # an offset, EARLIEST or END


class OffsetSource(Protocol):
    """What the driver asks the broker. The real one is :class:`KafkaOffsets`; tests use fakes."""

    def partitions(self) -> list[int]:
        """Partition ids of the topic (several topics: slots of every existing topic of the set,
        a pair keeping its slot from one call to the next)."""
        ...

    def key(self, partition: int) -> tuple[str, int]:
        """The Kafka topic and partition of a partition id."""
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


@dataclass
class ReadPlan:
    """What the scan reads, per partition id ``(start, end)``, and what the driver knows of it.

    ``tails``: the resolved ts found near each partition's end (None: none found), when the plan
    had to read them (several topics); ``top``: the highest of them. ``drained``: partitions whose
    end was learned by a fetch made after ``top`` was read, which count as resolved at it there
    (module docstring): :func:`applier.catchup.epochs.partition_resolved` and the replay take it.
    """

    bounds: dict[int, tuple[int, int]]
    tails: dict[int, int | None] | None = None
    top: int | None = None
    drained: dict[int, int] = field(default_factory=dict)


def plan_reads(
    source: OffsetSource,
    stored: Mapping[tuple[str, int], int],
    *,
    from_ts: int,
    time_margin_ms: int | None = None,
    several: bool = False,
    options: DecoderOptions | None = None,
) -> ReadPlan:
    """Start and end offsets of every partition (``stored``: the checkpoint's offsets by topic and
    partition), and with ``several`` topics the quiet partitions (module docstring).

    One topic: one listing and one round of fetches. Several: then the tails' resolved ts, one
    more listing and one more round of fetches, for the partitions that lag and those listed
    only now. Both come after the tails were read, which is what makes them count.
    """

    def starts_of(partitions: list[int]) -> dict[int, StartSpec]:
        known = {p: o for p in partitions if (o := stored.get(source.key(p))) is not None}
        return choose_starts(partitions, known, from_ts=from_ts, source=source, time_margin_ms=time_margin_ms)

    bounds = source.bounds(starts_of(source.partitions()))
    if not several:
        return ReadPlan(bounds)
    tails = source.tail_resolved(bounds, options or DecoderOptions())
    top = max((ts for ts in tails.values() if ts is not None), default=None)
    if top is None:  # no resolved ts anywhere near the ends: R is what the scan finds
        return ReadPlan(bounds, tails)
    joined = [p for p in source.partitions() if p not in bounds]
    lagging = sorted(p for p, ts in tails.items() if ts is None or ts < top)
    again: dict[int, StartSpec] = {p: bounds[p][1] for p in lagging}
    again.update(starts_of(joined))
    if again:
        ends = source.bounds(again)
        for p in lagging:
            bounds[p] = (bounds[p][0], max(bounds[p][1], ends[p][1]))
        bounds.update({p: ends[p] for p in joined})
    return ReadPlan(bounds, tails, top, dict.fromkeys([*lagging, *joined], top))


class KafkaOffsets:
    """:class:`OffsetSource` over a confluent-kafka consumer (never joins a group: assign only).

    ``topic``: one topic, or a :class:`TopicSet`; partitions are named by slot (module docstring).
    """

    def __init__(self, consumer: Any, topic: str | TopicSet, *, timeout: float = 30.0) -> None:
        """``consumer``: a confluent-kafka consumer made from :func:`base_consumer_config`; closed by
        :meth:`close`."""
        self.topics = topic if isinstance(topic, TopicSet) else TopicSet((topic,))
        self.topic = self.topics.describe()
        self.slots = TopicSlots(self.topics)
        self.timeout = timeout
        self._consumer = consumer

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing after a broker failure must not hide the real error
            self._consumer.close()

    def partitions(self) -> list[int]:
        if self.slots.single is not None:
            return topic_partitions(self._consumer, self.slots.single, self.timeout)
        found = set_partitions(self._consumer, self.topics, self.timeout)
        if not found:
            raise KafkaReadError(f"no topic of {self.topic!r} exists (or none has partitions)")
        # Slots in topic order the first time: DDLs of one commit ts run in that order (epochs).
        return sorted(self.slots.slot(t, p) for t in sorted(found) for p in found[t])

    def key(self, partition: int) -> tuple[str, int]:
        return self.slots.key(partition)

    def _tp(self, partition: int, offset: int | None = None) -> Any:
        from confluent_kafka import TopicPartition

        topic, kafka_partition = self.slots.key(partition)
        if offset is None:
            return TopicPartition(topic, kafka_partition)
        return TopicPartition(topic, kafka_partition, offset)

    def _named(self, partitions: Iterable[int]) -> list[int] | list[str]:
        """Partition ids as messages name them: numbers for one topic, ``topic/partition`` else."""
        if self.slots.single is not None:
            return list(partitions)
        return [self.slots.label(p) for p in partitions]

    def bounds(self, starts: Mapping[int, StartSpec]) -> dict[int, tuple[int, int]]:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError

        def logical(spec: StartSpec) -> int:
            if spec == EARLIEST:
                return OFFSET_BEGINNING
            if spec == END:
                return OFFSET_END
            return int(spec)

        c, slot = self._consumer, self.slots.slot
        c.assign([self._tp(p, logical(s)) for p, s in sorted(starts.items())])
        first: dict[int, int] = {}
        deadline = time.monotonic() + self.timeout
        try:
            while len(first) < len(starts):
                if time.monotonic() > deadline:
                    missing = sorted(set(starts) - set(first))
                    shown = [starts[p] for p in missing]
                    raise KafkaReadError(
                        f"topic {self.topic!r}: partitions {self._named(missing)} gave neither a record nor "
                        f"their end within {self.timeout:.0f}s (start offsets {shown}: "
                        "beyond the end of the partition?)"
                    )
                for msg in c.consume(500, 0.2):
                    err = msg.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        if is_fatal_kafka_error(err):
                            where = msg.topic() or self.topic
                            raise KafkaReadError(f"Kafka error on topic {where!r}: {err.str()}")
                        continue
                    p = slot(msg.topic(), msg.partition())
                    if p in starts:  # a record or the end-of-partition event: this fetch's first
                        first.setdefault(p, msg.offset())
            out: dict[int, tuple[int, int]] = {}
            for p, spec in starts.items():
                _low, high = c.get_watermark_offsets(self._tp(p), cached=True)
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
        from confluent_kafka import KafkaError

        c = self._consumer
        topic, kafka_partition = self.slots.key(partition)
        c.assign([self._tp(partition, start)])
        best: int | None = None
        deadline = time.monotonic() + self.timeout
        try:
            nxt = start
            while nxt < end:
                if time.monotonic() > deadline:
                    raise KafkaReadError(
                        f"topic {topic!r} partition {kafka_partition}: offsets {nxt}..{end} not readable "
                        f"within {self.timeout:.0f}s"
                    )
                for msg in c.consume(500, 0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF and err.fatal():
                            raise KafkaReadError(f"Kafka error on topic {topic!r}: {err.str()}")
                        continue
                    off = msg.offset()
                    if off >= end:
                        nxt = end
                        break
                    nxt = off + 1
                    for ev in decode_record(
                        msg.key(),
                        msg.value(),
                        topic=topic,
                        partition=kafka_partition,
                        offset=off,
                        options=options,
                    ):
                        if isinstance(ev, ResolvedEvent) and (best is None or ev.ts > best):
                            best = ev.ts
            return best
        finally:
            c.unassign()

    def offsets_for_time(self, partitions: Iterable[int], ms: int) -> dict[int, int | None]:
        tps = [self._tp(p, ms) for p in sorted(partitions)]
        found = self._consumer.offsets_for_times(tps, timeout=self.timeout)
        slot = self.slots.slot
        return {slot(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}

"""A consumer and an offset oracle for PartitionReader, answering what each test sets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

TOPIC = "orders"


@dataclass
class Msg:
    """What ``Consumer.consume`` returns: a record, or an event carrying an error."""

    part: int
    off: int
    err: KafkaError | None = None
    k: bytes | None = b"k"
    val: bytes | None = b"v"
    top: str = TOPIC

    def error(self) -> KafkaError | None:
        return self.err

    def topic(self) -> str:
        return self.top

    def partition(self) -> int:
        return self.part

    def offset(self) -> int:
        return self.off

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.val


def event(code: int, partition: int, offset: int, *, fatal: bool = False) -> Msg:
    return Msg(partition, offset, KafkaError(code, "from the fake", fatal=fatal))


@dataclass
class FakeTopicMetadata:
    partitions: dict[int, object]
    error: object = None


@dataclass
class FakeMetadata:
    topics: dict[str, FakeTopicMetadata]


@dataclass
class FakeConsumer:
    """A consumer whose answers the test sets: batches to deliver, watermarks, partitions."""

    batches: list[list[Msg]] = field(default_factory=list)
    watermarks: dict[int, tuple[int, int]] = field(default_factory=dict)  # cached, from fetches
    topic_partitions: list[int] = field(default_factory=lambda: [0, 1])
    metadata_fails: bool = False
    assigned: list[TopicPartition] = field(default_factory=list)
    added: list[list[TopicPartition]] = field(default_factory=list)
    delivered: dict[int, int] = field(default_factory=dict)  # partition -> next offset after a record
    metadata_requests: int = 0
    on_consume: Callable[[FakeConsumer], None] | None = None  # runs before each batch is taken

    def consume(self, _max: int, _timeout: float) -> list[Msg]:
        if self.on_consume is not None:
            self.on_consume(self)
        batch = self.batches.pop(0) if self.batches else []
        for m in batch:
            if m.err is None:
                self.delivered[m.part] = m.off + 1
        return batch

    def list_topics(self, topic: str, timeout: float) -> FakeMetadata:
        self.metadata_requests += 1
        if self.metadata_fails:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return FakeMetadata({topic: FakeTopicMetadata({p: None for p in self.topic_partitions})})

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = list(tps)

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.added.append(list(tps))

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(TOPIC, tp.partition, self.delivered.get(tp.partition, OFFSET_INVALID))
            for tp in tps
        ]

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = 0, cached: bool = False
    ) -> tuple[int, int]:
        assert cached, "the reader must not list offsets itself: that goes through the oracle"
        return self.watermarks.get(tp.partition, (OFFSET_INVALID, OFFSET_INVALID))

    def pause(self, tps: list[TopicPartition]) -> None:
        pass

    def resume(self, tps: list[TopicPartition]) -> None:
        pass

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


class FakeOracle:
    def __init__(self, earliest: dict[int, int] | None = None, end: dict[int, int] | None = None) -> None:
        self.earliest, self.end = earliest, end

    def earliest_offset(self, partition: int) -> int:
        if self.earliest is None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return self.earliest[partition]

    def end_offset(self, partition: int) -> int:
        if self.end is None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return self.end[partition]

"""Read every partition of one topic with ``assign()``, at offsets the caller chooses.

The daemon owns all partitions of its topic (the barrier needs all of them in one process), so
it never joins a consumer group's rebalancing: it assigns partitions itself and resumes from the
offsets stored in the downstream checkpoint. The group id is still used to commit offsets after
each database commit, for monitoring tools only.

"End of partition" is learned by fetching (librdkafka's partition EOF events), never from the
watermark offsets, which some Kafka-protocol brokers get wrong. The only place that needs the
broker's idea of offsets (``--start latest``) goes through ``OffsetOracle`` so it can be faked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition


class KafkaReadError(RuntimeError):
    """A fatal error from the Kafka client (unknown topic, authentication, ...)."""


@dataclass(slots=True)
class Record:
    """One Kafka record, detached from the client's message object."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class OffsetOracle(Protocol):
    """Where a partition ends, as the broker tells it (only used for ``--start latest``)."""

    def end_offset(self, partition: int) -> int: ...


def base_consumer_config(bootstrap: str, group_id: str, extra: Mapping[str, str] | None = None) -> dict:
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "queued.max.messages.kbytes": 65536,
        # The daemon reads slower than the broker serves, so the prefetch queue is often full;
        # librdkafka then postpones a partition's next fetch by this much (default 1 s). The
        # partition holding the barrier back must not wait that long: it stalled the whole
        # pipeline (benchmarks/apply.py: ~42k -> ~51k rows/s with 20 ms).
        "fetch.queue.backoff.ms": 20,
        "client.id": "ticdc-applier",
        "log.connection.close": False,
    }
    conf.update(extra or {})
    return conf


class PartitionReader:
    """A consumer assigned to every partition of ``topic``; tracks which partitions reached their end."""

    def __init__(
        self, bootstrap: str, topic: str, group_id: str, extra: Mapping[str, str] | None = None
    ) -> None:
        self.topic = topic
        self._consumer = Consumer(base_consumer_config(bootstrap, group_id, extra))
        self.partitions: list[int] = []
        self.at_end: set[int] = set()
        self._paused: set[int] = set()

    # -- metadata ---------------------------------------------------------------------------
    def discover_partitions(self, timeout: float = 15.0) -> list[int]:
        """Partition ids of the topic; a clear error when it does not exist."""
        md = self._consumer.list_topics(self.topic, timeout=timeout)
        tmd = md.topics.get(self.topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            reason = tmd.error if tmd is not None and tmd.error is not None else "no partitions"
            raise KafkaReadError(f"topic {self.topic!r} is not available: {reason}")
        return sorted(tmd.partitions)

    def end_offset(self, partition: int) -> int:
        """High watermark (real Kafka). Part of OffsetOracle."""
        _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=10)
        return high

    # -- assignment -------------------------------------------------------------------------
    def assign(self, offsets: Mapping[int, int | str]) -> None:
        """Assign every partition in ``offsets``; a value is an offset or 'earliest'/'latest'."""
        tps = []
        for p, off in sorted(offsets.items()):
            if off == "earliest":
                off = OFFSET_BEGINNING
            elif off == "latest":
                off = OFFSET_END
            tps.append(TopicPartition(self.topic, p, int(off)))
        self.partitions = sorted(offsets)
        self.at_end.clear()
        self._consumer.assign(tps)

    def pause(self, partitions: Iterable[int]) -> None:
        new = set(partitions) - self._paused
        if new:
            self._consumer.pause([TopicPartition(self.topic, p) for p in sorted(new)])
            self._paused |= new

    def resume(self, partitions: Iterable[int]) -> None:
        back = set(partitions) & self._paused
        if back:
            self._consumer.resume([TopicPartition(self.topic, p) for p in sorted(back)])
            self._paused -= back

    @property
    def paused(self) -> frozenset[int]:
        return frozenset(self._paused)

    # -- reading ----------------------------------------------------------------------------
    def poll(self, max_records: int = 1000, timeout: float = 0.2) -> list[Record]:
        """Up to ``max_records`` records; EOF events update ``at_end``, errors raise KafkaReadError."""
        out: list[Record] = []
        for msg in self._consumer.consume(max_records, timeout):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.at_end.add(msg.partition())
                    continue
                if err.fatal() or err.code() in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    KafkaError.TOPIC_AUTHORIZATION_FAILED,
                ):
                    raise KafkaReadError(f"Kafka error on topic {self.topic!r}: {err.str()}")
                continue  # transient (the client retries by itself)
            p = msg.partition()
            self.at_end.discard(p)
            out.append(Record(p, msg.offset(), msg.key(), msg.value()))
        return out

    def all_at_end(self) -> bool:
        return bool(self.partitions) and self.at_end.issuperset(self.partitions)

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit group offsets for monitoring; failures are not fatal (the database is the truth)."""
        if not offsets:
            return
        with contextlib.suppress(KafkaException):
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()], asynchronous=True
            )

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()


def read_all(reader: PartitionReader, offsets: Mapping[int, int | str], idle_polls: int = 3) -> list[Record]:
    """Read every partition from ``offsets`` to its end (learned by fetching): for summaries and tests."""
    reader.assign(offsets)
    records: list[Record] = []
    quiet = 0
    while quiet < idle_polls:
        batch = reader.poll(1000, 0.5)
        records.extend(batch)
        quiet = quiet + 1 if (not batch and reader.all_at_end()) else 0
    return records

"""Read every partition of one topic with ``assign()``, at offsets the caller chooses.

The daemon owns all partitions of its topic (the barrier needs all of them in one process), so
it never joins a consumer group's rebalancing: it assigns partitions itself and resumes from the
offsets stored in the downstream checkpoint. The group id is still used to commit offsets after
each database commit, for monitoring tools only.

"End of partition" is learned by fetching (librdkafka's partition EOF events), never from the
watermark offsets, which some Kafka-protocol brokers get wrong. The reader asks the broker's
offset listing itself only through ``OffsetOracle`` (so tests can fake it), and only to describe
a lost offset (``--start latest`` is resolved by librdkafka).

Lost offsets. A stored offset that Kafka no longer has (retention deleted it, or the topic was
deleted and recreated) must stop the daemon, never move it silently: moving forward would skip
changes, moving back to the start of a recreated topic would mix two streams. So the consumer
runs with ``auto.offset.reset=error``: Kafka answers such a fetch with OFFSET_OUT_OF_RANGE and
librdkafka delivers ``_AUTO_OFFSET_RESET`` for the partition, which ``poll`` turns into
``OffsetOutOfRange`` (topic, partition, offset, earliest and end offset). The same holds for a
position that retention overtakes while the daemon lags. Some Kafka-protocol brokers (the
embedded test broker among them) answer a fetch beyond the end with an empty response and no
error; for those, a partition assigned at a stored offset that has delivered neither a record
nor its end is compared with the high watermark of the fetch responses, and an offset beyond it
(or below the log start) for ``LOST_OFFSET_CONFIRM_SECONDS`` is reported the same way. The
delay keeps a new leader's briefly lagging high watermark from being taken for a lost offset.

Partitions added while running. TiCDC notices a larger partition count of its topic and re-hashes
keys onto the new partitions, so the daemon must read every partition the topic has, not only
those it found at start. ``new_partitions`` looks the topic up again (one metadata request,
at most every ``PARTITION_CHECK_SECONDS``) and ``add_partitions`` assigns the new ones without
touching the others. Whether a partition has delivered anything yet (``has_delivered``) lets the
daemon tell the barrier about partitions that stay empty.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from applier.errors import FatalError
from applier.kafka.client_log import KafkaClientLog


class KafkaReadError(FatalError, RuntimeError):
    """A fatal error from the Kafka client (unknown topic, authentication, ...)."""


class OffsetOutOfRange(KafkaReadError):
    """Kafka no longer has the offset a partition is read from: stop rather than jump elsewhere.

    ``earliest`` and ``end`` are what the partition holds now (``end`` is the offset the next
    record will get), None when the broker could not tell. ``advice`` is what the operator can
    do; it depends on who reads (the daemon names its checkpoint), so the caller supplies it.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        earliest: int | None,
        end: int | None,
        advice: str = "",
    ) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self.earliest, self.end, self.advice = earliest, end, advice

        def shown(value: int | None) -> str:
            return "unknown" if value is None else str(value)

        message = (
            f"topic {topic!r} partition {partition}: offset {offset} is not in Kafka any more "
            f"(earliest available offset {shown(earliest)}, end offset {shown(end)}): retention "
            "deleted it, or the topic was deleted and recreated; reading never jumps to another offset"
        )
        super().__init__(message + (f"; {advice}" if advice else ""))


@dataclass(slots=True)
class Record:
    """One Kafka record, detached from the client's message object."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class OffsetOracle(Protocol):
    """Where a partition starts and ends, as the broker's offset listing tells it.

    Only used to describe a lost offset. Behind an interface because some Kafka-protocol brokers
    (the embedded test broker) list wrong offsets for batched records: tests use a fake.
    """

    def earliest_offset(self, partition: int) -> int: ...

    def end_offset(self, partition: int) -> int: ...


def base_consumer_config(bootstrap: str, group_id: str, extra: Mapping[str, str] | None = None) -> dict:
    """librdkafka settings of every consumer of the project (daemon, catch-up, decode): offsets are
    the checkpoint's business, never the group's, and a start offset the partition no longer holds
    is an error, never a silent move (whatever the pass-through ``extra`` says)."""
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 100,
        # librdkafka's prefetch: one queue for every partition of the consumer, held as fetched
        # record batches outside Python's heap. 64 MiB (the earlier setting) cost about 80 MiB of
        # the daemon's ~600 MiB peak RSS in benchmarks/apply.py; 16 MiB is still most of a second
        # of input at the apply rate there, and the rate stayed the same.
        "queued.max.messages.kbytes": 16384,
        # The daemon reads slower than the broker serves, so the prefetch queue is often full;
        # librdkafka then postpones a partition's next fetch by this much (default 1 s). The
        # partition holding the barrier back must not wait that long: it stalled the whole
        # pipeline (benchmarks/apply.py: ~42k -> ~51k rows/s with 20 ms).
        "fetch.queue.backoff.ms": 20,
        "client.id": "ticdc-applier",
        "log.connection.close": False,
    }
    conf.update(extra or {})
    conf["auto.offset.reset"] = "error"
    return conf


def topic_partitions(consumer: Any, topic: str, timeout: float) -> list[int]:
    """Partition ids of ``topic`` from the broker's metadata; a clear error when it cannot be read."""
    try:
        md = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise KafkaReadError(
            f"topic {topic!r}: no broker answered a metadata request within {timeout:.0f}s "
            f"({exc.args[0].str() if exc.args else exc})"
        ) from None
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        reason = tmd.error if tmd is not None and tmd.error is not None else "no partitions"
        raise KafkaReadError(f"topic {topic!r} is not available: {reason}")
    return sorted(tmd.partitions)


LOST_OFFSET_CODES = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})
"""The partition no longer holds the offset asked for (retention, truncation)."""
FATAL_TOPIC_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED})
"""The topic cannot be read at all; librdkafka would retry forever."""


def is_fatal_kafka_error(err: KafkaError) -> bool:
    """An error event of a consumer that reading on cannot get past (the one set of such codes).

    Everything else (broker down, leader moves, timeouts) librdkafka retries by itself.
    """
    return err.fatal() or err.code() in FATAL_TOPIC_CODES or err.code() in LOST_OFFSET_CODES


class PartitionReader:
    """A consumer assigned to every partition of ``topic``; tracks which partitions reached their end.

    ``consumer`` and ``oracle`` replace the librdkafka consumer and the offset listing in tests.
    ``lost_offset_advice`` ends the message of ``OffsetOutOfRange`` (what the operator can do).
    ``client_log`` receives librdkafka's log and error events (applier/kafka/client_log.py) and
    says whether a broker is reachable (``unreachable_since``).
    """

    PARTITION_CHECK_SECONDS = 30.0
    """How often ``new_partitions`` asks the broker for the topic's partitions: TiCDC itself only
    notices a new partition count every few minutes, and one metadata request is cheap."""
    METADATA_TIMEOUT = 5.0
    OFFSET_CHECK_SECONDS = 0.5
    """How often partitions assigned at a stored offset, and not yet seen readable, are compared
    with the high watermark of the fetch responses (local calls; only until they are readable)."""
    LOST_OFFSET_CONFIRM_SECONDS = 5.0
    """How long such an offset must stay outside the fetched watermarks before it counts as lost."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group_id: str,
        extra: Mapping[str, str] | None = None,
        *,
        lost_offset_advice: str = "",
        consumer: Any = None,
        oracle: OffsetOracle | None = None,
        client_log: KafkaClientLog | None = None,
    ) -> None:
        self.topic = topic
        self.client_log = client_log if client_log is not None else KafkaClientLog()
        if consumer is None:
            consumer = Consumer(self.client_log.install(base_consumer_config(bootstrap, group_id, extra)))
        self._consumer = consumer
        self.oracle: OffsetOracle = oracle if oracle is not None else self
        self.lost_offset_advice = lost_offset_advice
        self.partitions: list[int] = []
        self.at_end: set[int] = set()
        self._paused: set[int] = set()
        self._unconfirmed: dict[int, int] = {}  # assigned at this stored offset, not yet seen readable
        self._outside_since: dict[int, float] = {}
        self._next_offset_check = 0.0
        self._next_partition_check = 0.0

    # -- metadata ---------------------------------------------------------------------------
    def discover_partitions(self, timeout: float = 15.0) -> list[int]:
        """Partition ids of the topic; a clear error when it does not exist."""
        return topic_partitions(self._consumer, self.topic, timeout)

    def new_partitions(self, now: float | None = None) -> list[int]:
        """Partitions the topic has now and that are not assigned, at most every PARTITION_CHECK_SECONDS.

        Between checks it returns [] at once. A failed lookup also returns [] (the next check tries
        again): a broker that is really gone shows up as errors in ``poll``.
        """
        now = time.monotonic() if now is None else now
        if now < self._next_partition_check:
            return []
        self._next_partition_check = now + self.PARTITION_CHECK_SECONDS
        try:
            found = self.discover_partitions(self.METADATA_TIMEOUT)
        except (KafkaException, KafkaReadError):
            return []
        return sorted(set(found) - set(self.partitions))

    def earliest_offset(self, partition: int) -> int:
        """Log start offset (offset listing). Part of OffsetOracle."""
        low, _high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=5)
        return low

    def end_offset(self, partition: int) -> int:
        """High watermark (offset listing). Part of OffsetOracle."""
        _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=5)
        return high

    # -- assignment -------------------------------------------------------------------------
    def assign(self, offsets: Mapping[int, int | str]) -> None:
        """Assign every partition in ``offsets``; a value is an offset or 'earliest'/'latest'."""
        self.partitions = []
        self.at_end.clear()
        self._unconfirmed.clear()
        self._outside_since.clear()
        self._consumer.assign(self._track(offsets))

    def add_partitions(self, offsets: Mapping[int, int | str]) -> None:
        """Assign more partitions (as ``assign`` does) and keep reading the others where they are."""
        tps = self._track({p: o for p, o in offsets.items() if p not in self.partitions})
        if tps:
            self._consumer.incremental_assign(tps)

    def _track(self, offsets: Mapping[int, int | str]) -> list[TopicPartition]:
        tps = []
        now = time.monotonic()
        for p, off in sorted(offsets.items()):
            if off == "earliest":
                off = OFFSET_BEGINNING
            elif off == "latest":
                off = OFFSET_END
            else:
                self._unconfirmed[p] = int(off)
                self._next_offset_check = now + self.OFFSET_CHECK_SECONDS
            tps.append(TopicPartition(self.topic, p, int(off)))
        self.partitions = sorted({*self.partitions, *offsets})
        self._next_partition_check = now + self.PARTITION_CHECK_SECONDS
        return tps

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
        """Up to ``max_records`` records; EOF events update ``at_end``, errors raise KafkaReadError.

        An offset Kafka no longer has raises ``OffsetOutOfRange`` (module docstring).
        """
        out: list[Record] = []
        consume = self._consumer.consume
        # What has arrived, without waiting; else wait for the first record only. librdkafka's
        # consume(n, timeout) returns when it has n records or the timeout passed: with a batch
        # size the stream never fills, every read waited the whole timeout, and a resolved event
        # with it (benchmarks/lag.py: 0-100 ms added to every window's latency).
        msgs = consume(max_records, 0)
        if not msgs and timeout > 0:
            msgs = consume(1, timeout)
            if msgs and max_records > 1:
                msgs.extend(consume(max_records - 1, 0))
        self.client_log.tick()
        for msg in msgs:
            err = msg.error()
            if err is not None:
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    self.at_end.add(msg.partition())
                    continue
                if code in LOST_OFFSET_CODES:
                    raise self._lost(msg.partition(), msg.offset())
                if is_fatal_kafka_error(err):
                    raise KafkaReadError(f"Kafka error on topic {self.topic!r}: {err.str()}")
                continue  # transient (the client retries by itself)
            p = msg.partition()
            self.at_end.discard(p)
            out.append(Record(p, msg.offset(), msg.key(), msg.value()))
        if self._unconfirmed:
            self._check_unconfirmed()
        return out

    def _check_unconfirmed(self) -> None:
        """Partitions assigned at a stored offset: readable yet, or outside what the broker holds?

        Readable once a record was delivered (the position moved) or the end was reached there.
        Otherwise the high watermark and log start of the last fetch response (cached locally
        by librdkafka, so this costs no request) show an offset the broker does not hold, for
        brokers that answer such a fetch with nothing instead of OFFSET_OUT_OF_RANGE.
        """
        now = time.monotonic()
        if now < self._next_offset_check:
            return
        self._next_offset_check = now + self.OFFSET_CHECK_SECONDS
        asked = [TopicPartition(self.topic, p) for p in sorted(self._unconfirmed)]
        for tp in self._consumer.position(asked):
            p = tp.partition
            if tp.offset >= 0 or p in self.at_end:
                del self._unconfirmed[p]
                self._outside_since.pop(p, None)
                continue
            wanted = self._unconfirmed[p]
            low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
            if 0 <= high < wanted or wanted < low:
                since = self._outside_since.setdefault(p, now)
                if now - since >= self.LOST_OFFSET_CONFIRM_SECONDS:
                    raise self._lost(p, wanted, end=high if high >= 0 else None)
            else:
                self._outside_since.pop(p, None)

    def _lost(self, partition: int, offset: int, end: int | None = None) -> OffsetOutOfRange:
        """The error for a lost offset, with what the broker still holds ("unknown" if it cannot say)."""

        def ask(question: Any) -> int | None:
            try:
                value = int(question(partition))
            except Exception:  # the lost offset is the error to report, not why this lookup failed
                return None
            return value if value >= 0 else None

        if end is None:
            with contextlib.suppress(Exception):
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), cached=True
                )
                end = high if high >= 0 else None
        if end is None:
            end = ask(self.oracle.end_offset)
        earliest = ask(self.oracle.earliest_offset)
        return OffsetOutOfRange(self.topic, partition, offset, earliest, end, self.lost_offset_advice)

    def has_delivered(self, partition: int) -> bool:
        """Whether a record of ``partition`` was returned by ``poll`` since it was assigned."""
        (tp,) = self._consumer.position([TopicPartition(self.topic, partition)])
        return tp.offset >= 0

    @property
    def unreachable_since(self) -> float | None:
        """Monotonic time since which no broker is reachable; None while one is."""
        return self.client_log.unreachable_since

    @property
    def last_kafka_error(self) -> str | None:
        """The text of the client's last error event (what a broker that is down said last)."""
        return self.client_log.last_error

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

"""Read every partition of the changefeed's topics with ``assign()``, at offsets the caller chooses.

Partitions are named by the stream's partition id (``applier.kafka.topics.TopicSlots``): the
partition number for one topic, a slot per ``(topic, partition)`` for several; records carry the
real topic and partition too, for positions and messages.

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
at most every ``PARTITION_CHECK_SECONDS``; for several topics every ``TOPIC_CHECK_SECONDS``, and
new topics of the set join the same way) and ``add_partitions`` assigns the new ones without
touching the others. Whether a partition has delivered anything yet (``has_delivered``) lets the
daemon tell the barrier about partitions that stay empty.

Drain probes (several topics). A topic whose tables do not change gets no resolved events
(docs/open-protocol.md §5.10). ``probe`` seeks partitions to where they are read, which drops their
prefetched data and starts a new fetch; the end-of-partition event that follows comes from a fetch
made after the probe, which the caller turns into a resolved ts (``drained``).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from applier.errors import ConfigurationError, FatalError
from applier.kafka.client_log import KafkaClientLog
from applier.kafka.topics import TopicSet, TopicSlots


class KafkaReadError(FatalError):
    """A fatal error from the Kafka client (unknown topic, authentication, ...)."""


class BrokerUnreachable(KafkaReadError):
    """No broker answered a metadata request: fatal where it is raised; the daemon's start-up
    waits it out (a broker that is not up yet at boot)."""


class TopicMissing(KafkaReadError):
    """The broker answered, but the topic (or every topic of the set) does not exist yet: TiCDC
    creates it when the changefeed first writes. The daemon's start-up waits for it."""


class KafkaConfigError(ConfigurationError):
    """librdkafka refused a setting (``--kafka-config``, ``[kafka]``): an unknown key or a bad value."""


class KafkaRefused(ConfigurationError):
    """A broker refused the client's authentication (SASL): the settings must change."""


def new_consumer(conf: Mapping[str, Any]) -> Consumer:
    """A librdkafka consumer; a setting it refuses is a configuration error naming the setting
    (librdkafka checks every key when the client is made, before it connects)."""
    try:
        return Consumer(dict(conf))
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError._INVALID_ARG:
            raise KafkaConfigError(f"kafka_config: {_refused_setting(err.str())}") from None
        raise


_PROPERTY = re.compile(r'configuration property:? "([^"]*)"')


def _refused_setting(text: str) -> str:
    """librdkafka's complaint about a setting, without the value it quotes: the value may be a
    password (``sasl.password``, a key's passphrase), and the name is what the operator needs."""
    found = _PROPERTY.search(text)
    if found is None:
        return "librdkafka refuses a setting (check the names and values of [kafka] and --kafka-config)"
    name = found.group(1)
    if text.startswith("No such configuration property"):
        return f"librdkafka knows no setting {name!r} (a typo, or a setting of another client)"
    return f"librdkafka refuses the value of {name!r}"


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
    """One Kafka record, detached from the client's message object.

    ``partition`` is the stream's partition id (the Kafka partition for one topic, a slot for
    several: ``applier.kafka.topics``); ``topic`` and ``kafka_partition`` say where it was read.
    """

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    topic: str = ""
    kafka_partition: int = -1


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
        # record batches outside Python's heap, so it counts fully in the daemon's memory. 8 MiB
        # is still a fraction of a second of input at the apply rate, and a larger queue applied
        # no faster (docs/performance.md).
        "queued.max.messages.kbytes": 8192,
        # The daemon reads slower than the broker serves, so the prefetch queue is often full;
        # librdkafka then postpones a partition's next fetch by this much (default 1 s). The
        # partition holding the barrier back must not wait that long: it stalls the whole
        # pipeline (docs/performance.md).
        "fetch.queue.backoff.ms": 20,
        "client.id": "ticdc-applier",
        "log.connection.close": False,
    }
    conf.update(extra or {})
    conf["auto.offset.reset"] = "error"
    return conf


_MISSING_TOPIC_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE})
"""Metadata errors of a topic that does not exist yet, or is being created (no leader yet)."""


def topic_partitions(consumer: Any, topic: str, timeout: float) -> list[int]:
    """Partition ids of ``topic`` from the broker's metadata; a clear error when it cannot be read."""
    try:
        md = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnreachable(
            f"topic {topic!r}: no broker answered a metadata request within {timeout:.0f}s "
            f"({exc.args[0].str() if exc.args else exc})"
        ) from None
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        error = None if tmd is None else tmd.error
        if error is None or error.code() in _MISSING_TOPIC_CODES:
            why = "does not exist" if error is None else f"does not exist yet ({error.str()})"
            raise TopicMissing(f"topic {topic!r} {why}")
        raise KafkaReadError(f"topic {topic!r} is not available: {error.str()}")
    return sorted(tmd.partitions)


def set_partitions(consumer: Any, topics: TopicSet, timeout: float) -> dict[str, list[int]]:
    """Partition ids of every existing topic of ``topics`` (one metadata request for all topics:
    naming a missing one could create it on brokers that create topics on first use)."""
    try:
        md = consumer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnreachable(
            f"topics {topics.describe()!r}: no broker answered a metadata request within {timeout:.0f}s "
            f"({exc.args[0].str() if exc.args else exc})"
        ) from None
    return {
        name: sorted(tmd.partitions)
        for name, tmd in md.topics.items()
        if topics.matches(name) and tmd.error is None and tmd.partitions
    }


LOST_OFFSET_CODES = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})
"""The partition no longer holds the offset asked for (retention, truncation)."""
FATAL_TOPIC_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED})
"""The topic cannot be read at all; librdkafka would retry forever."""


def is_fatal_kafka_error(err: KafkaError) -> bool:
    """An error event of a consumer that reading on cannot get past (the one set of such codes).

    Everything else (broker down, leader moves, timeouts) librdkafka retries by itself.
    """
    return err.fatal() or err.code() in FATAL_TOPIC_CODES or err.code() in LOST_OFFSET_CODES


def check_consumer_config(group_id: str, extra: Mapping[str, str] | None) -> None:
    """Raise ``KafkaConfigError`` when librdkafka refuses a pass-through setting, before anything
    is read or written: a client made without brokers checks every key and connects nowhere
    (``log_level`` 0: it has nothing to say about the missing brokers)."""
    conf = base_consumer_config("", group_id, extra)
    del conf["bootstrap.servers"]
    new_consumer({**conf, "log_level": 0}).close()


class PartitionReader:
    """A consumer assigned to every partition of ``topic`` (a name, or a ``TopicSet``); tracks which
    partitions reached their end.

    ``consumer`` and ``oracle`` replace the librdkafka consumer and the offset listing in tests.
    ``lost_offset_advice`` ends the message of ``OffsetOutOfRange`` (what the operator can do).
    ``client_log`` receives librdkafka's log and error events (applier/kafka/client_log.py) and
    says whether a broker is reachable (``unreachable_since``).
    """

    PARTITION_CHECK_SECONDS = 30.0
    """How often ``new_partitions`` asks the broker for the topic's partitions: TiCDC itself only
    notices a new partition count every few minutes, and one metadata request is cheap."""
    TOPIC_CHECK_SECONDS = 1.0
    """How often, for several topics, the topics are listed: a topic created after a resolved ts R
    was written may hold rows at or below R, so the barrier may pass R only once a listing made
    after R was seen has been joined (``listed_at``)."""
    METADATA_TIMEOUT = 5.0
    OFFSET_CHECK_SECONDS = 0.5
    """How often partitions assigned at a stored offset, and not yet seen readable, are compared
    with the high watermark of the fetch responses (local calls; only until they are readable)."""
    LOST_OFFSET_CONFIRM_SECONDS = 5.0
    """How long such an offset must stay outside the fetched watermarks before it counts as lost."""

    def __init__(
        self,
        bootstrap: str,
        topic: str | TopicSet,
        group_id: str,
        extra: Mapping[str, str] | None = None,
        *,
        lost_offset_advice: str = "",
        consumer: Any = None,
        oracle: OffsetOracle | None = None,
        client_log: KafkaClientLog | None = None,
    ) -> None:
        self.topics = topic if isinstance(topic, TopicSet) else TopicSet((topic,))
        self.topic = self.topics.describe()
        self.slots = TopicSlots(self.topics)
        self.client_log = client_log if client_log is not None else KafkaClientLog()
        if consumer is None:
            consumer = new_consumer(self.client_log.install(base_consumer_config(bootstrap, group_id, extra)))
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
        self._eof_offsets: dict[int, int] = {}  # the end offset of the last EOF of each partition
        self._probing: set[int] = set()
        self.drained: dict[int, int] = {}  # probed partitions that reached their end since: end offset
        self.listed_at: float | None = None  # monotonic start of the last completed topic listing

    def _tp(self, slot: int, offset: int | None = None) -> TopicPartition:
        topic, partition = self.slots.key(slot)
        return (
            TopicPartition(topic, partition) if offset is None else TopicPartition(topic, partition, offset)
        )

    # -- metadata ---------------------------------------------------------------------------
    def discover_partitions(self, timeout: float = 15.0) -> list[int]:
        """Stream partition ids of the topic(s); a clear error when none exists.

        Several topics: those of the set that exist now (topics are created by TiCDC on first
        use, so a named one may be missing yet; it joins when it appears).
        """
        if self.slots.single is not None:
            return topic_partitions(self._consumer, self.slots.single, timeout)
        started = time.monotonic()
        found = set_partitions(self._consumer, self.topics, timeout)
        if not found:
            raise TopicMissing(f"no topic of {self.topic!r} exists (or none has partitions)")
        self.listed_at = started
        return sorted(self.slots.slot(t, p) for t, parts in sorted(found.items()) for p in parts)

    def check_refused(self) -> None:
        """Serve the client's pending events (nothing is assigned yet: no record is fetched) and
        raise ``KafkaRefused`` when a broker refused its authentication: to a metadata request
        that looks like no broker answering, and waiting would never end."""
        self._consumer.poll(0)
        if self.client_log.refused is not None:
            raise KafkaRefused(
                f"Kafka refused the client's authentication ({self.client_log.refused}); check "
                "security.protocol and the sasl.* settings of [kafka] / --kafka-config"
            )

    def new_partitions(self, now: float | None = None) -> list[int]:
        """Partitions the topic has now and that are not assigned, at most every PARTITION_CHECK_SECONDS.

        Between checks it returns [] at once. A failed lookup also returns [] (the next check tries
        again): a broker that is really gone shows up as errors in ``poll``.
        """
        now = time.monotonic() if now is None else now
        if now < self._next_partition_check:
            return []
        several = self.slots.single is None
        self._next_partition_check = now + (
            self.TOPIC_CHECK_SECONDS if several else self.PARTITION_CHECK_SECONDS
        )
        try:
            found = self.discover_partitions(self.METADATA_TIMEOUT)
        except (KafkaException, KafkaReadError):
            return []
        return sorted(set(found) - set(self.partitions))

    def earliest_offset(self, partition: int) -> int:
        """Log start offset (offset listing). Part of OffsetOracle."""
        low, _high = self._consumer.get_watermark_offsets(self._tp(partition), timeout=5)
        return low

    def end_offset(self, partition: int) -> int:
        """High watermark (offset listing). Part of OffsetOracle."""
        _low, high = self._consumer.get_watermark_offsets(self._tp(partition), timeout=5)
        return high

    # -- assignment -------------------------------------------------------------------------
    def assign(self, offsets: Mapping[int, int | str]) -> None:
        """Assign every partition in ``offsets``; a value is an offset or 'earliest'/'latest'."""
        self.partitions = []
        self.at_end.clear()
        self._eof_offsets.clear()
        self._probing.clear()
        self.drained.clear()
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
            tps.append(self._tp(p, int(off)))
        self.partitions = sorted({*self.partitions, *offsets})
        if self.slots.single is not None:  # just looked up; several topics are listed every second
            self._next_partition_check = now + self.PARTITION_CHECK_SECONDS
        return tps

    def pause(self, partitions: Iterable[int]) -> None:
        new = set(partitions) - self._paused
        if new:
            self._consumer.pause([self._tp(p) for p in sorted(new)])
            self._paused |= new

    def resume(self, partitions: Iterable[int]) -> None:
        back = set(partitions) & self._paused
        if back:
            self._consumer.resume([self._tp(p) for p in sorted(back)])
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
        # size the stream never fills, every read would wait the whole timeout, and a resolved
        # event with it: that wait would add to every window's latency.
        msgs = consume(max_records, 0)
        if not msgs and timeout > 0:
            msgs = consume(1, timeout)
            if msgs and max_records > 1:
                msgs.extend(consume(max_records - 1, 0))
        self.client_log.tick()
        slot = self.slots.slot
        for msg in msgs:
            err = msg.error()
            if err is not None:
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    p = slot(msg.topic(), msg.partition())
                    self.at_end.add(p)
                    self._eof_offsets[p] = msg.offset()
                    if p in self._probing:
                        self._probing.discard(p)
                        self.drained[p] = msg.offset()
                    continue
                if code in LOST_OFFSET_CODES:
                    raise self._lost(slot(msg.topic(), msg.partition()), msg.offset())
                if is_fatal_kafka_error(err):
                    where = msg.topic() or self.topic
                    raise KafkaReadError(f"Kafka error on topic {where!r}: {err.str()}")
                continue  # transient (the client retries by itself)
            p = slot(msg.topic(), msg.partition())
            self.at_end.discard(p)
            out.append(Record(p, msg.offset(), msg.key(), msg.value(), msg.topic(), msg.partition()))
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
        asked = [self._tp(p) for p in sorted(self._unconfirmed)]
        for tp in self._consumer.position(asked):
            p = self.slots.slot(tp.topic, tp.partition)
            if tp.offset >= 0 or p in self.at_end:
                del self._unconfirmed[p]
                self._outside_since.pop(p, None)
                continue
            wanted = self._unconfirmed[p]
            low, high = self._consumer.get_watermark_offsets(self._tp(p), cached=True)
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
                _low, high = self._consumer.get_watermark_offsets(self._tp(partition), cached=True)
                end = high if high >= 0 else None
        if end is None:
            end = ask(self.oracle.end_offset)
        earliest = ask(self.oracle.earliest_offset)
        topic, kafka_partition = self.slots.key(partition)
        return OffsetOutOfRange(topic, kafka_partition, offset, earliest, end, self.lost_offset_advice)

    def has_delivered(self, partition: int) -> bool:
        """Whether a record of ``partition`` was returned by ``poll`` since it was assigned."""
        (tp,) = self._consumer.position([self._tp(partition)])
        return tp.offset >= 0

    def probe(self, partitions: Iterable[int]) -> list[int]:
        """Start a drain probe of each partition (module docstring); returns those probed.

        A partition is sought to where the daemon has read it (the position, or the end its last
        end-of-partition event named when it delivered nothing); one with neither is skipped.
        Its next end-of-partition event lands in ``drained``.
        """
        asked = [p for p in partitions if p not in self._paused]
        if not asked:
            return []
        probed = []
        for tp in self._consumer.position([self._tp(p) for p in asked]):
            p = self.slots.slot(tp.topic, tp.partition)
            offset = tp.offset if tp.offset >= 0 else self._eof_offsets.get(p)
            if offset is None:
                continue
            try:
                self._consumer.seek(self._tp(p, offset))
            except KafkaException:  # not fetching yet (just assigned): the next probe tries again
                continue
            self.at_end.discard(p)
            self._probing.add(p)
            probed.append(p)
        return probed

    def take_drained(self) -> dict[int, int]:
        """Probed partitions that reached their end since the last call, with their end offsets."""
        out, self.drained = self.drained, {}
        return out

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
            self._consumer.commit(offsets=[self._tp(p, o) for p, o in offsets.items()], asynchronous=True)

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

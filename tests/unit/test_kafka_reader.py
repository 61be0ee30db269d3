"""PartitionReader: lost offsets, partitions added while running, with a fake consumer.

The last test runs the real reader against librdkafka's in-process mock cluster, which answers
like Kafka (OFFSET_OUT_OF_RANGE), to pin down what confluent-kafka actually delivers then.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError

from applier.kafka.reader import KafkaReadError, OffsetOutOfRange, PartitionReader
from tests.unit.kafka_fakes import TOPIC, FakeConsumer, FakeOracle, Msg, event


def reader(consumer: FakeConsumer, oracle: FakeOracle | None = None, advice: str = "") -> PartitionReader:
    r = PartitionReader(
        "unused:9092",
        TOPIC,
        "g",
        consumer=consumer,
        oracle=oracle or FakeOracle({}, {}),
        lost_offset_advice=advice,
    )
    r.OFFSET_CHECK_SECONDS = 0.0
    return r


def facts(exc: OffsetOutOfRange) -> tuple[int, int, int | None, int | None]:
    return exc.partition, exc.offset, exc.earliest, exc.end


# -- Kafka says the offset is out of range -----------------------------------------------------------


@pytest.mark.parametrize("code", [KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE])
def test_out_of_range_event_is_a_lost_offset_naming_everything(code: int) -> None:
    consumer = FakeConsumer(batches=[[Msg(0, 7), event(code, 1, 120)]], watermarks={1: (40, 90)})
    r = reader(consumer, FakeOracle(earliest={1: 40}), advice="restore the downstream")
    r.assign({0: 7, 1: 120})
    with pytest.raises(OffsetOutOfRange) as caught:
        r.poll()
    exc = caught.value
    assert isinstance(exc, KafkaReadError)  # the daemon's fatal path already handles these
    assert (exc.topic, exc.partition, exc.offset, exc.earliest, exc.end) == (TOPIC, 1, 120, 40, 90)
    assert str(exc) == (
        "topic 'orders' partition 1: offset 120 is not in Kafka any more (earliest available offset 40, "
        "end offset 90): retention deleted it, or the topic was deleted and recreated; reading never jumps "
        "to another offset; restore the downstream"
    )
    assert "\n" not in str(exc)


def test_end_offset_comes_from_the_oracle_when_no_fetch_told_it() -> None:
    consumer = FakeConsumer(batches=[[event(KafkaError._AUTO_OFFSET_RESET, 0, 3)]])
    r = reader(consumer, FakeOracle(earliest={0: 10}, end={0: 25}))
    r.assign({0: 3})
    with pytest.raises(OffsetOutOfRange) as caught:
        r.poll()
    assert (caught.value.earliest, caught.value.end) == (10, 25)
    assert "(earliest available offset 10, end offset 25)" in str(caught.value)


def test_a_failing_oracle_says_unknown_instead_of_crashing() -> None:
    consumer = FakeConsumer(batches=[[event(KafkaError._AUTO_OFFSET_RESET, 0, 3)]])
    r = reader(consumer, FakeOracle(earliest=None, end=None))
    r.assign({0: 3})
    with pytest.raises(OffsetOutOfRange) as caught:
        r.poll()
    assert (caught.value.earliest, caught.value.end) == (None, None)
    assert "(earliest available offset unknown, end offset unknown)" in str(caught.value)


def test_other_errors_keep_their_meaning() -> None:
    consumer = FakeConsumer(
        batches=[
            [event(KafkaError._TRANSPORT, 0, -1), Msg(0, 0), event(KafkaError._PARTITION_EOF, 0, 1)],
            [event(KafkaError.UNKNOWN_TOPIC_OR_PART, 0, -1)],
        ]
    )
    r = reader(consumer)
    r.assign({0: "earliest"})
    assert [rec.offset for rec in r.poll()] == [0]  # transient: ignored, the client retries
    assert r.at_end == {0}
    with pytest.raises(KafkaReadError) as caught:
        r.poll()
    assert not isinstance(caught.value, OffsetOutOfRange)


# -- brokers that answer a fetch beyond the end with nothing -------------------------------------------


def test_silent_broker_offset_beyond_the_fetched_end_is_lost_after_the_confirmation_delay() -> None:
    consumer = FakeConsumer(watermarks={0: (0, 5), 1: (0, 0)})
    r = reader(consumer, FakeOracle(earliest={0: 0, 1: 0}))
    r.LOST_OFFSET_CONFIRM_SECONDS = 0.3
    r.assign({0: 100, 1: 0})
    assert r.poll() == []  # first seen outside: not yet (a new leader's watermark may lag)
    time.sleep(0.35)
    with pytest.raises(OffsetOutOfRange) as caught:
        r.poll()
    assert facts(caught.value) == (0, 100, 0, 5)


def test_silent_broker_offset_below_the_log_start_is_lost() -> None:
    consumer = FakeConsumer(watermarks={0: (50, 80)})
    r = reader(consumer, FakeOracle(earliest={0: 50}))
    r.LOST_OFFSET_CONFIRM_SECONDS = 0.0
    r.assign({0: 20})
    with pytest.raises(OffsetOutOfRange) as caught:
        r.poll()
    assert facts(caught.value) == (0, 20, 50, 80)


def test_a_watermark_that_catches_up_is_not_a_lost_offset() -> None:
    consumer = FakeConsumer(watermarks={0: (0, 5)})
    r = reader(consumer)
    r.LOST_OFFSET_CONFIRM_SECONDS = 0.2
    r.assign({0: 9})
    assert r.poll() == []
    consumer.watermarks[0] = (0, 12)  # the fetch responses now reach past the offset
    time.sleep(0.25)
    assert r.poll() == []
    consumer.watermarks[0] = (0, 5)  # outside again: the delay starts over
    assert r.poll() == []


def test_no_watermark_fetched_yet_is_not_a_lost_offset() -> None:
    r = reader(FakeConsumer())
    r.LOST_OFFSET_CONFIRM_SECONDS = 0.0
    r.assign({0: 9, 1: 4})
    assert r.poll() == [] and r.poll() == []


def test_a_readable_offset_is_not_checked_any_more() -> None:
    consumer = FakeConsumer(batches=[[Msg(0, 9), event(KafkaError._PARTITION_EOF, 1, 4)]], watermarks={})
    r = reader(consumer)
    r.LOST_OFFSET_CONFIRM_SECONDS = 0.0
    r.assign({0: 9, 1: 4})
    assert len(r.poll()) == 1
    consumer.watermarks = {0: (0, 1), 1: (0, 1)}  # even a (stale) watermark below it changes nothing now
    assert r.poll() == []


def test_partitions_started_at_earliest_or_latest_are_never_checked() -> None:
    consumer = FakeConsumer(watermarks={0: (0, 0), 1: (7, 7)})
    r = reader(consumer)
    r.LOST_OFFSET_CONFIRM_SECONDS = 0.0
    r.assign({0: "earliest", 1: "latest"})
    assert r.poll() == []


def test_the_consumer_never_resets_offsets_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    monkeypatch.setattr("applier.kafka.reader.Consumer", lambda conf: seen.append(conf) or FakeConsumer())
    PartitionReader("k:9092", TOPIC, "g", {"auto.offset.reset": "earliest", "client.id": "x"})
    assert seen[0]["auto.offset.reset"] == "error"  # even when the pass-through says otherwise
    assert seen[0]["client.id"] == "x"
    # librdkafka's log and error events go to the structured log, never to stderr directly
    assert seen[0]["logger"] is not None and seen[0]["error_cb"] is not None


def test_a_broker_that_does_not_answer_the_metadata_request_is_one_clear_error() -> None:
    r = reader(FakeConsumer(topic_partitions=[0], metadata_fails=True))
    with pytest.raises(KafkaReadError, match="no broker answered a metadata request within 15s"):
        r.discover_partitions()


# -- partitions added while running -----------------------------------------------------------------


def test_new_partitions_are_looked_up_at_most_every_check_period() -> None:
    consumer = FakeConsumer(topic_partitions=[0, 1])
    r = reader(consumer)
    r.assign({0: 5, 1: "earliest"})
    start = time.monotonic()
    consumer.topic_partitions = [0, 1, 2, 3]
    assert r.new_partitions(start + 1) == []
    assert consumer.metadata_requests == 0
    assert r.new_partitions(start + r.PARTITION_CHECK_SECONDS + 1) == [2, 3]
    assert consumer.metadata_requests == 1
    assert r.new_partitions(start + r.PARTITION_CHECK_SECONDS + 2) == []  # paced again
    assert consumer.metadata_requests == 1


def test_a_failed_lookup_is_tried_again_at_the_next_check() -> None:
    consumer = FakeConsumer(topic_partitions=[0, 1, 2], metadata_fails=True)
    r = reader(consumer)
    r.assign({0: "earliest", 1: "earliest"})
    later = time.monotonic() + r.PARTITION_CHECK_SECONDS + 1
    assert r.new_partitions(later) == []
    consumer.metadata_fails = False
    assert r.new_partitions(later + r.PARTITION_CHECK_SECONDS) == [2]


def test_added_partitions_join_the_assignment_without_touching_the_others() -> None:
    consumer = FakeConsumer(batches=[[event(KafkaError._PARTITION_EOF, 0, 5)]], watermarks={3: (0, 1)})
    r = reader(consumer)
    r.LOST_OFFSET_CONFIRM_SECONDS = 0.0
    r.assign({0: 5, 1: "earliest"})
    r.poll()
    r.add_partitions({1: "earliest", 2: "earliest", 3: 9})
    assert [(tp.partition, tp.offset) for tp in consumer.added[0]] == [(2, OFFSET_BEGINNING), (3, 9)]
    assert r.partitions == [0, 1, 2, 3]
    assert r.at_end == {0}
    assert not r.all_at_end()
    with pytest.raises(OffsetOutOfRange):  # an added partition at a stored offset is checked as well
        r.poll()


def test_has_delivered_says_whether_a_record_came_since_the_assignment() -> None:
    consumer = FakeConsumer(batches=[[Msg(1, 0), event(KafkaError._PARTITION_EOF, 0, 0)]])
    r = reader(consumer)
    r.assign({0: "earliest", 1: "earliest"})
    r.poll()
    assert not r.has_delivered(0) and r.has_delivered(1)


# -- the real client against a broker that answers like Kafka ---------------------------------------


def test_real_client_against_a_kafka_like_broker_reports_the_lost_offset() -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": "unused", "test.mock.num.brokers": 1, "linger.ms": 1})
    brokers = producer.list_topics(timeout=10).brokers.values()
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in brokers)
    for i in range(5):
        producer.produce(TOPIC, value=b"v%d" % i, partition=0)
    assert producer.flush(10) == 0
    r = PartitionReader(bootstrap, TOPIC, "g", lost_offset_advice="advice")
    try:
        r.assign({0: 100})
        deadline = time.monotonic() + 20
        with pytest.raises(OffsetOutOfRange) as caught:
            while time.monotonic() < deadline:
                r.poll(100, 0.2)
        assert facts(caught.value) == (0, 100, 0, 5)
    finally:
        r.close()

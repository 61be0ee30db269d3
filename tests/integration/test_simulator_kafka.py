"""The simulator's records reach a real Kafka-protocol broker unchanged, partition for partition.

Records are read back with assign() from the beginning of every partition until as many records
as were produced have arrived (the end of a partition is learned by fetching, never from
watermarks, which the embedded broker reports wrongly for multi-record batches).
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from applier.simulator import (
    PRODUCER_MODES,
    ProduceError,
    StreamConfig,
    produce_simulation,
    run_simulate,
    simulate,
)
from applier.simulator.producer import ensure_topic

pytestmark = pytest.mark.integration


def read_back(bootstrap: str, topic: str, expected: dict[int, int], timeout: float = 30.0) -> dict[int, list]:
    """(key, value) of every record of each partition, in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sim-readback-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.max.bytes": 16 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "receive.message.max.bytes": 20 * 1024 * 1024,
        }
    )
    got: dict[int, list] = {p: [] for p in expected}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in expected])
        deadline = time.monotonic() + timeout
        while any(len(got[p]) < n for p, n in expected.items()):
            assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
        # Nothing beyond what was produced: one more short poll must come back empty.
        extra = consumer.poll(1.0)
        assert extra is None or extra.error() is not None, "more records than produced"
    finally:
        consumer.close()
    out = {}
    for p, rows in got.items():
        offsets = [o for o, _, _ in rows]
        assert offsets == sorted(offsets)
        out[p] = [(k, v) for _, k, v in rows]
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        StreamConfig(seed=61, transactions=120, partitions=4),
        StreamConfig(seed=62, transactions=60, partitions=3, compression="snappy", dispatcher="table"),
        StreamConfig(seed=65, transactions=80, partitions=3, **PRODUCER_MODES["all-new"]),
    ],
    ids=["index-value", "snappy-table", "all-new"],
)
def test_records_arrive_byte_for_byte_per_partition(broker, cfg: StreamConfig) -> None:
    topic = f"sim-{cfg.seed}-{time.monotonic_ns()}"
    sim = run_simulate(broker.bootstrap, topic, cfg)  # creates the topic with cfg.partitions
    expected = sim.records_by_partition()
    got = read_back(broker.bootstrap, topic, {p: len(recs) for p, recs in expected.items()})
    for p, recs in expected.items():
        assert got[p] == [(r.key, r.value) for r in recs], f"partition {p}"
    assert any(r.replay for r in sim.records) and any(r.duplicate for r in sim.records)


def test_produce_into_an_existing_topic(broker, make_topic) -> None:
    topic = make_topic(2)
    sim = simulate(StreamConfig(seed=63, transactions=20, partitions=2, replays=False))
    assert produce_simulation(broker.bootstrap, topic, sim) == len(sim.records)
    got = read_back(broker.bootstrap, topic, {p: len(r) for p, r in sim.records_by_partition().items()})
    assert sum(len(v) for v in got.values()) == len(sim.records)


def test_refuses_a_topic_with_too_few_partitions(broker, make_topic) -> None:
    topic = make_topic(2)
    with pytest.raises(ProduceError, match="has 2 partitions"):
        ensure_topic(broker.bootstrap, topic, 4)


def test_delivery_failures_raise(broker, make_topic) -> None:
    topic = make_topic(1)
    sim = simulate(StreamConfig(seed=64, transactions=10, partitions=3, replays=False))
    # Partitions 1 and 2 do not exist in this topic: the producer cannot deliver those records.
    from applier.simulator.producer import produce_records

    with pytest.raises(ProduceError):
        produce_records(
            broker.bootstrap, topic, sim.records, timeout=10, extra_config={"message.timeout.ms": 3000}
        )

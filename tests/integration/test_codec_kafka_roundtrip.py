"""The simulator's stream through the real broker and back through the decoder, record for record.

The simulator and the decoder are written independently from the protocol description, so equal
events on both sides check both of them (and the framing through a real Kafka-protocol broker).
"""

from __future__ import annotations

import pytest

from applier.codec.decoder import DecoderOptions, decode_record
from applier.kafka.reader import PartitionReader, read_all
from applier.simulator import StreamConfig, produce_simulation, simulate
from tests.simulated import assert_decoded_matches

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "cfg",
    [
        StreamConfig(seed=61, partitions=3, transactions=150),
        StreamConfig(seed=62, partitions=4, transactions=150, only_updated_columns=True, compression="lz4"),
        StreamConfig(
            seed=63,
            partitions=2,
            transactions=150,
            dispatcher="table",
            compression="snappy",
            delete_only_handle_key=True,
        ),
    ],
    ids=["plain", "only-updated-lz4", "table-snappy-handle-deletes"],
)
def test_decoded_events_equal_the_produced_ones(broker, cfg: StreamConfig) -> None:
    sim = simulate(cfg)
    topic = f"roundtrip_{cfg.seed}"
    produce_simulation(broker.bootstrap, topic, sim)
    reader = PartitionReader(broker.bootstrap, topic, "roundtrip")
    try:
        records = read_all(reader, dict.fromkeys(range(cfg.partitions), "earliest"))
    finally:
        reader.close()
    by_partition = sim.records_by_partition()
    assert sorted({r.partition for r in records}) == sorted(p for p, recs in by_partition.items() if recs)
    options = DecoderOptions(compression=cfg.compression)
    checked = 0
    for p, sent_records in by_partition.items():
        got = [r for r in records if r.partition == p]
        assert [r.offset for r in got] == list(range(len(sent_records)))
        for rec, sent in zip(got, sent_records, strict=True):
            assert (rec.key, rec.value) == (sent.key, sent.value)
            events = decode_record(
                rec.key, rec.value, topic=topic, partition=p, offset=rec.offset, options=options
            )
            assert len(events) == len(sent.events)
            for ev, sent_ev in zip(events, sent.events, strict=True):
                assert ev.pos.partition == p and ev.pos.offset == rec.offset
                assert_decoded_matches(ev, sent_ev, cfg)
                checked += 1
    assert checked == sum(len(r.events) for r in sim.records)

"""The simulator's stream through the real broker and back through the decoder, record for record.

The simulator and the decoder are written independently from the protocol description, so equal
events on both sides check both of them (and the framing through a real Kafka-protocol broker).
"""

from __future__ import annotations

import pytest

from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import FLAG_HANDLE_KEY, DDLEvent, ResolvedEvent, RowEvent
from applier.kafka.reader import PartitionReader, read_all
from applier.simulator import StreamConfig, produce_simulation, simulate

pytestmark = pytest.mark.integration


def _image(row) -> dict:
    return {name: (col["t"], col["f"], col["v"]) for name, col in row.items()}


def _check_row(ev: RowEvent, sent, cfg: StreamConfig) -> None:
    assert (ev.commit_ts, ev.schema, ev.table) == (sent.commit_ts, sent.schema, sent.table)
    assert ev.kind.name.lower() == sent.wire_kind
    if sent.new is not None:
        assert _image(ev.new) == sent.new
    if sent.old is not None:
        got_old = _image(ev.old)
        for name, value in sent.old.items():
            assert got_old[name] == value, name
        if cfg.only_updated_columns and sent.row_kind == "update":
            # Columns missing from "p" were filled from the new image.
            for name in set(got_old) - set(sent.old):
                assert got_old[name] == sent.new[name], name
        else:
            assert set(got_old) == set(sent.old)
    # The handle key survives on every image.
    for image in (ev.new, ev.old):
        if image and sent.new and any(f & FLAG_HANDLE_KEY for _, f, _ in sent.new.values()):
            assert any(col["f"] & FLAG_HANDLE_KEY for col in image.values())


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
                if sent_ev.kind == "resolved":
                    assert isinstance(ev, ResolvedEvent) and ev.ts == sent_ev.commit_ts
                elif sent_ev.kind == "ddl":
                    assert isinstance(ev, DDLEvent)
                    assert (ev.commit_ts, ev.query, ev.ddl_type) == (
                        sent_ev.commit_ts,
                        sent_ev.ddl_query,
                        sent_ev.ddl_type,
                    )
                else:
                    assert isinstance(ev, RowEvent)
                    _check_row(ev, sent_ev, cfg)
                checked += 1
    assert checked == sum(len(r.events) for r in sim.records)

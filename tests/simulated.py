"""What the decoder must give back for an event the simulator sent.

The simulator and the decoder are written independently from the protocol description, so an
event decoded from the simulator's bytes that equals the simulated one checks both of them.
Shared by the tests that decode simulated records, with or without a broker in between.
"""

from __future__ import annotations

from applier.codec.events import FLAG_HANDLE_KEY, DDLEvent, ResolvedEvent, RowEvent
from applier.simulator import SimEvent, StreamConfig


def _image(row) -> dict:
    return {name: (col["t"], col["f"], col["v"]) for name, col in row.items()}


def assert_decoded_matches(got, sent: SimEvent, cfg: StreamConfig) -> None:
    """``got``, decoded from the record, is the event ``sent`` under the settings ``cfg``."""
    if sent.kind == "resolved":
        assert isinstance(got, ResolvedEvent) and got.ts == sent.commit_ts
        return
    if sent.kind == "ddl":
        assert isinstance(got, DDLEvent)
        assert (got.commit_ts, got.query, got.ddl_type) == (sent.commit_ts, sent.ddl_query, sent.ddl_type)
        return
    assert isinstance(got, RowEvent)
    assert (got.commit_ts, got.schema, got.table) == (sent.commit_ts, sent.schema, sent.table)
    assert got.kind.name.lower() == sent.wire_kind
    assert got.partition_id == sent.partition_id
    if sent.new is not None:
        assert _image(got.new) == sent.new
    if sent.old is not None:
        got_old = _image(got.old)
        for name, value in sent.old.items():
            assert got_old[name] == value, name
        if cfg.only_updated_columns and sent.row_kind == "update":
            # Columns missing from "p" were filled from the new image.
            for name in set(got_old) - set(sent.old):
                assert got_old[name] == sent.new[name], name
        else:
            assert set(got_old) == set(sent.old)
    # The handle key survives on every image.
    for image in (got.new, got.old):
        if image and sent.new and any(f & FLAG_HANDLE_KEY for _, f, _ in sent.new.values()):
            assert any(col["f"] & FLAG_HANDLE_KEY for col in image.values())

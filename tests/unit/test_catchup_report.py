"""The catch-up's summary lines read back: what a test or benchmark running it as a process learns."""

from __future__ import annotations

from applier.catchup.report import Summary
from applier.catchup.writer import WriteStats


def test_the_printed_summary_reads_back_as_it_was() -> None:
    s = Summary(
        from_ts=100,
        lower_ts=120,
        resolved_ts=480,
        records=37,
        events=512,
        writes=WriteStats(events=512, deletes=3, replaces=200, inserts=7, retries=1),
        ddls=1,
        epochs=2,
        keyless_replays_dropped=4,
        seconds=12.5,
        stage_seconds={"start-up": 5.2, "scan": 4.0, "epoch1": 2.1, "handoff": 0.0},
        resume_offsets={0: 11, 1: 26},
    )
    got = Summary.parse("noise before\n" + "\n".join(s.lines()) + "\nnoise after\n")
    assert got is not None
    assert (got.from_ts, got.lower_ts, got.resolved_ts, got.records, got.events) == (100, 120, 480, 37, 512)
    assert (got.rows_written, got.ddls, got.epochs, got.keyless_replays_dropped) == (210, 1, 2, 4)
    assert got.writes.retries == 1 and got.seconds == 12.5
    assert got.stage_seconds == s.stage_seconds


def test_no_summary_without_its_lines() -> None:
    assert Summary.parse("catch-up failed: topic 't' partition 0 offset 5: not JSON") is None

"""Large messages in ``applier catchup``: claim-check references resolved inside the Spark reading
tasks (then handed over to the daemon), a missing object failing the job before anything is
written, and handle-key-only rows read upstream by the tasks' reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.catchup.ranges import OffsetRange
from applier.catchup.rows import rebuild_row_events
from applier.catchup.scan import read_range
from applier.catchup.source import ReadSpec
from applier.codec.decoder import DecoderOptions
from applier.large_messages.settings import LargeMessageSettings, upstream_config
from applier.simulator import write_claim_check_objects
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration import versioned_upstream
from tests.integration.catchup_support import global_resolved_of, restore_backup, run_catchup_here
from tests.integration.harness import Changefeed
from tests.integration.test_large_messages_daemon import WIDE, expected_digests, large_stream, wide_digests

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _sim(feed: Changefeed, seed: int, large: str, compression: str):
    return large_stream(
        feed, seed, large, compression, partitions=2, transactions=60, resolved_every=6,
        claim_check_uri="s3://producer-bucket/cc",
    )  # fmt: skip


def test_catchup_reads_claim_check_objects_and_hands_over(feed: Changefeed, tmp_path: Path) -> None:
    sim = _sim(feed, 11, "claim-check", "lz4")
    root = tmp_path / "cc"
    root.mkdir()
    write_claim_check_objects(sim, root)
    x = sim.resolved_points[1]
    restore_backup(feed, sim, x)
    cut = (len(sim.records) * 3) // 4
    first, rest = sim.records[:cut], sim.records[cut:]
    ensure_topic(feed.bootstrap, feed.topic, sim.config.partitions)
    produce_records(feed.bootstrap, feed.topic, first)
    options = ("--compression", "lz4", "--claim-check-storage-uri", f"file://{root}")

    summary = run_catchup_here(feed, x, *options)
    r = global_resolved_of(first)
    assert summary.resolved_ts == r
    assert feed.compare(sim, r) == []
    assert wide_digests(feed, sim.schema) == expected_digests(sim, r)

    produce_records(feed.bootstrap, feed.topic, rest)
    done = feed.run_to_end(*options)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert wide_digests(feed, sim.schema) == expected_digests(sim, sim.final_resolved_ts)


def test_catchup_stops_at_a_missing_object_without_writing(feed: Changefeed, tmp_path: Path) -> None:
    from applier.catchup.job import CatchupError

    sim = _sim(feed, 12, "claim-check", "snappy")
    root = tmp_path / "cc"
    root.mkdir()
    write_claim_check_objects(sim, root)
    gone = sorted(sim.claim_check_objects)[0]
    (root / gone).unlink()
    x = sim.resolved_points[0]
    restore_backup(feed, sim, x)
    ensure_topic(feed.bootstrap, feed.topic, sim.config.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    with pytest.raises(CatchupError, match=gone):
        run_catchup_here(feed, x, "--compression", "snappy", "--claim-check-storage-uri", f"file://{root}")
    assert feed.checkpoint() == (0, {})
    assert feed.compare(sim, x) == []


def test_the_reading_task_reads_handle_key_only_rows_upstream(
    feed: Changefeed, downstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import applier.large_messages.upstream as upstream

    sim = _sim(feed, 13, "handle-key-only", "lz4")
    conn = feed.connect()
    try:
        versioned_upstream.load_history(conn, sim, {WIDE})
    finally:
        conn.close()
    monkeypatch.setattr(upstream, "select_as_of", versioned_upstream.select_as_of_system_time)
    ensure_topic(feed.bootstrap, feed.topic, sim.config.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    spec = ReadSpec(
        bootstrap=feed.bootstrap,
        topic=feed.topic,
        group_id=feed.group_id,
        kafka_config={},
        options=DecoderOptions(compression="lz4"),
        lower_ts=0,
        large=LargeMessageSettings(
            upstream=upstream_config(downstream_url, password_file=None, time_zone="+00:00")
        ),
    )
    expected = {
        (ev.commit_ts, ev.new["id"][2]): ev.new
        for rec in sim.records
        for ev in rec.events
        if ev.kind == "row" and ev.table == WIDE and ev.new is not None
    }
    # Every insert or update sent as handle-key-only must come out of the reader as a full row.
    reduced = {
        (ev.commit_ts, ev.new["id"][2])
        for rec in sim.records
        for ev, lm in zip(rec.events, rec.large or (), strict=False)
        if lm is not None and ev.table == WIDE and ev.new is not None
    }
    assert reduced
    seen: set[tuple[int, int]] = set()
    for p in range(sim.config.partitions):
        end = sum(1 for rec in sim.records if rec.partition == p)
        for batch in read_range(spec, OffsetRange(p, 0, end)):
            for (_schema, tbl), ev in rebuild_row_events(batch, "x"):
                ts, new = ev.commit_ts, ev.new
                if tbl != WIDE or new is None:
                    continue  # a delete: by key, nothing read upstream
                want = expected[(ts, new["id"]["v"])]
                for name in ("body", "data", "note"):
                    assert new[name]["v"] == want[name][2], (ts, name)
                seen.add((ts, new["id"]["v"]))
    assert reduced <= seen

"""Large messages end to end: claim-check references (file and S3, lz4 and snappy) and
handle-key-only events, with replays, duplicated records and re-encoded copies, over several
partitions; the downstream checked byte for byte (values, and LENGTH + SHA2 of the wide columns)
at every resolved ts; a missing object stops the daemon before it and a restart after the object
is back converges."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from applier.simulator import PRODUCER_MODES, Simulation, StreamConfig, simulate, write_claim_check_objects
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.harness import Changefeed
from tests.integration.s3_server import make_bucket, put_objects
from tests.integration.versioned_upstream import load_history

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WIDE = "wide"
WIDE_COLUMNS = ("body", "data", "note")
MAX_MESSAGE_BYTES = 256 << 10  # every wide row (300 KB and more) goes as a large message


def large_stream(feed: Changefeed, seed: int, large: str, compression: str | None, **more: Any) -> Simulation:
    """A stream with wide rows sent as large messages. The workload depends on the schema name
    (a fresh one per test), so the first seed from ``seed`` on giving at least four large
    events is taken."""
    schema = feed.new_schema()
    key = "claim_check_references" if large == "claim-check" else "handle_key_only_events"
    for attempt in range(seed, seed + 30):
        settings: dict[str, Any] = {
            "partitions": 3,
            "transactions": 48,
            "resolved_every": 8,
            "claim_check_uri": "file:///producer/mount/claim-check",  # not where the consumer reads
            "max_message_bytes": MAX_MESSAGE_BYTES,
            **more,
        }
        cfg = StreamConfig(
            seed=attempt,
            schema=schema,
            compression=compression,
            large_message=large,
            wide_rows=True,
            **settings,
        )
        sim = simulate(cfg)
        if sim.summary()[key] >= 4:
            return sim
    raise AssertionError(f"no seed from {seed} gives four large events")


def _resolved_cuts(sim: Simulation) -> list[tuple[int, int]]:
    """(records to produce, resolved ts): the prefix of the stream up to each original resolved
    broadcast, so that the daemon, run to the end of it, stops at exactly that resolved ts.

    The first copies only: a duplicated record (a producer retry) can follow up to two later
    records of its partition, so the duplicate of a resolved event may come after the next
    broadcast has reached every partition, and a prefix ending there lets the daemon go on to that
    next resolved ts."""
    cuts: list[tuple[int, int]] = []
    for ts in sim.resolved_points:
        last = max(
            i
            for i, rec in enumerate(sim.records)
            if not rec.replay
            and not rec.duplicate
            and any(e.kind == "resolved" and e.commit_ts == ts for e in rec.events)
        )
        if not cuts or last + 1 > cuts[-1][0]:
            cuts.append((last + 1, ts))
    return cuts


def wide_digests(feed: Changefeed, schema: str) -> dict[int, tuple]:
    conn = feed.connect()
    try:
        with conn.cursor() as cur:
            parts = ", ".join(f"LENGTH(`{c}`), SHA2(`{c}`, 256)" for c in WIDE_COLUMNS)
            cur.execute(f"SELECT id, {parts} FROM `{schema}`.`{WIDE}` ORDER BY id")
            return {int(r[0]): tuple(r[1:]) for r in cur.fetchall()}
    finally:
        conn.close()


def expected_digests(sim: Simulation, ts: int) -> dict[int, tuple]:
    out: dict[int, tuple] = {}
    for row in sim.expected_snapshot(ts).get((sim.schema, WIDE), []):
        digest: list[Any] = []
        for c in WIDE_COLUMNS:
            v = row[c]
            raw = v.encode() if isinstance(v, str) else v
            digest += [None, None] if raw is None else [len(raw), hashlib.sha256(raw).hexdigest()]
        out[int(row["id"])] = tuple(digest)
    return out


def _check_every_resolved_ts(feed: Changefeed, sim: Simulation, *args: str) -> int:
    """Produce the stream resolved ts by resolved ts; after each, run the daemon to the end and
    compare. Returns how many resolved ts were checked."""
    ensure_topic(feed.bootstrap, feed.topic, sim.config.partitions)
    produced = 0
    checked = 0
    for upto, ts in _resolved_cuts(sim):
        produce_records(feed.bootstrap, feed.topic, sim.records[produced:upto])
        produced = upto
        done = feed.run_to_end(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        resolved, _ = feed.checkpoint()
        assert resolved == ts
        at = feed.snapshot_ts(resolved)
        assert feed.compare(sim, at) == [], f"at resolved ts {ts}"
        assert wide_digests(feed, sim.schema) == expected_digests(sim, at), f"at resolved ts {ts}"
        checked += 1
    produce_records(feed.bootstrap, feed.topic, sim.records[produced:])
    done = feed.run_to_end(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert wide_digests(feed, sim.schema) == expected_digests(sim, sim.final_resolved_ts)
    return checked


@pytest.mark.parametrize(
    ("compression", "mode"),
    [("lz4", "all-classic"), ("snappy", "all-new")],
    ids=["lz4-classic", "snappy-new"],
)
def test_claim_check_from_files(feed: Changefeed, tmp_path: Path, compression: str, mode: str) -> None:
    sim = large_stream(feed, 5, "claim-check", compression, **PRODUCER_MODES[mode])
    root = tmp_path / "consumer-mount"
    root.mkdir()
    assert write_claim_check_objects(sim, root) == len(sim.claim_check_objects)
    feed.extra_args += ["--compression", compression, "--claim-check-storage-uri", f"file://{root}"]
    assert _check_every_resolved_ts(feed, sim) >= 4


@pytest.mark.parametrize("compression", ["lz4", "snappy"])
def test_claim_check_from_s3(
    feed: Changefeed, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, compression: str
) -> None:
    sim = large_stream(feed, 6, "claim-check", compression, replays=True)
    bucket = f"cc-{feed.group_id.replace('_', '-')}"
    make_bucket(s3_endpoint, bucket)
    put_objects(s3_endpoint, bucket, "changefeed/cc", sim.claim_check_objects)
    # Credentials and region from the standard AWS environment, the endpoint from the URI.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    uri = f"s3://{bucket}/changefeed/cc?endpoint={s3_endpoint}&force-path-style=true"
    feed.extra_args += ["--compression", compression, "--claim-check-storage-uri", uri]
    assert _check_every_resolved_ts(feed, sim) >= 4


def test_a_missing_object_stops_before_it_and_a_restart_after_restoring_it_converges(
    feed: Changefeed, tmp_path: Path
) -> None:
    sim = large_stream(feed, 7, "claim-check", "lz4", replays=False)
    root = tmp_path / "objects"
    root.mkdir()
    write_claim_check_objects(sim, root)
    # The object of a reference in the middle of the stream goes missing.
    refs = [
        (i, lm.object_name)
        for i, rec in enumerate(sim.records)
        for lm in rec.large or ()
        if lm is not None and lm.object_name is not None
    ]
    index, name = refs[len(refs) // 2]
    (root / name).rename(tmp_path / name)
    ensure_topic(feed.bootstrap, feed.topic, sim.config.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    feed.extra_args += ["--compression", "lz4", "--claim-check-storage-uri", f"file://{root}"]

    stopped = feed.run_to_end()
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode == 1, out
    rec = sim.records[index]
    assert f"partition {rec.partition}" in out and name in out and "restore the object" in out
    resolved, _ = feed.checkpoint()
    missing_ts = min(e.commit_ts for e in rec.events if e.kind == "row")
    assert resolved < missing_ts
    assert feed.compare(sim, feed.snapshot_ts(resolved)) == []
    again = feed.run_to_end()  # still missing: stops at the same record, checkpoint unchanged
    assert again.returncode == 1 and feed.checkpoint()[0] == resolved

    (tmp_path / name).rename(root / name)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert wide_digests(feed, sim.schema) == expected_digests(sim, sim.final_resolved_ts)


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_handle_key_only_rows_are_read_upstream_as_of_their_commit_ts(
    feed: Changefeed, mode: str, downstream_url: str
) -> None:
    sim = large_stream(feed, 9, "handle-key-only", "snappy", **PRODUCER_MODES[mode])
    conn = feed.connect()
    try:
        load_history(conn, sim, {WIDE})
    finally:
        conn.close()
    feed.module = "tests.integration.versioned_upstream"
    feed.extra_args += ["--compression", "snappy", "--upstream", downstream_url]
    assert _check_every_resolved_ts(feed, sim) >= 4


@pytest.mark.parametrize(
    ("large", "setting"),
    [("claim-check", "--claim-check-storage-uri"), ("handle-key-only", "APPLIER_UPSTREAM_PASSWORD")],
)
def test_without_the_setting_it_stops_naming_it(feed: Changefeed, large: str, setting: str) -> None:
    sim = large_stream(feed, 5, large, None, replays=False)
    ensure_topic(feed.bootstrap, feed.topic, sim.config.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    done = feed.run_to_end()
    out = done.stdout + done.stderr
    assert done.returncode == 1 and setting in out and "offset" in out, out
    resolved, _ = feed.checkpoint()
    first_large = min(
        ev.commit_ts
        for rec in sim.records
        for ev, lm in zip(rec.events, rec.large or (), strict=False)
        if lm is not None
    )
    assert resolved < first_large
    assert feed.compare(sim, feed.snapshot_ts(resolved)) == []


def _changed_later(sim: Simulation) -> bool:
    """Whether some handle-key-only row of the stream changes again later: its version at its
    commit ts is then history, which a collected upstream no longer has."""
    later: dict[Any, int] = {}
    for step in sim.steps:
        for change in step.changes:
            if change.table == WIDE:
                for img in (change.old, change.new):
                    if img is not None:
                        later[img["id"]] = max(later.get(img["id"], 0), step.ts)
    return any(
        later.get(ev.new["id"][2], 0) > ev.commit_ts
        for rec in sim.records
        for ev, lm in zip(rec.events, rec.large or (), strict=False)
        if lm is not None and ev.table == WIDE and ev.new is not None
    )


def test_a_row_gone_upstream_stops_before_it_and_a_restart_after_it_is_back_converges(
    feed: Changefeed, downstream_url: str
) -> None:
    for seed in range(11, 41):  # a stream where some reduced row has history to lose
        sim = large_stream(feed, seed, "handle-key-only", "lz4", replays=False)
        if _changed_later(sim):
            break
    conn = feed.connect()
    try:
        up = load_history(conn, sim, {WIDE})
        with conn.cursor() as cur:  # as a GC would: only the rows as they are now remain
            cur.execute(f"DELETE HISTORY FROM `{up}`.`{WIDE}`")
    finally:
        conn.close()
    ensure_topic(feed.bootstrap, feed.topic, sim.config.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    feed.module = "tests.integration.versioned_upstream"
    feed.extra_args += ["--compression", "lz4", "--upstream", downstream_url]
    stopped = feed.run_to_end()
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode == 1, out
    assert f"`{sim.schema}`.`{WIDE}`" in out and "nothing from this record on is applied" in out
    resolved, _ = feed.checkpoint()
    assert feed.compare(sim, feed.snapshot_ts(resolved)) == []

    conn = feed.connect()
    try:
        load_history(conn, sim, {WIDE})  # the history is back (a restored upstream)
    finally:
        conn.close()
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert wide_digests(feed, sim.schema) == expected_digests(sim, sim.final_resolved_ts)

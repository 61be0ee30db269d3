"""``applier run --from-ts X``: a downstream restored from a backup at X, then the daemon, no Spark.

The downstream starts as the simulator's model at X (tables and rows, no checkpoint:
``restore_backup``), the topic holds the whole stream (rows and DDLs on both sides of X, replays,
the keyless table). The daemon must skip everything at or below X and apply everything above it:
a row at or below X applied again would duplicate a keyless row or undo a later change, a DDL at
or below X run again would fail or change the table twice, so the exact comparison with the model
at the final resolved ts is the check. Then what a checkpoint does to the setting: ignored at or
above it, refused below it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from applier.simulator import StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.catchup_support import restore_backup
from tests.integration.harness import Changefeed

pytestmark = pytest.mark.integration

ADD_COLUMN = 5  # DDL type of the simulator's mid-stream ALTER TABLE ... ADD COLUMN


def _restored_at(feed: Changefeed, *, seed: int, after_alter: bool):
    """A stream in the topic and a downstream restored at a resolved ts X of it, before or after its
    ALTER TABLE; rows of both sides of X are in the topic. Returns (simulation, X)."""
    cfg = StreamConfig(seed=seed, partitions=3, transactions=160, schema=feed.new_schema())
    sim = simulate(cfg)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == ADD_COLUMN)
    points = sim.resolved_points
    if after_alter:
        x = next(ts for ts in points if ts > alter.commit_ts and ts < sim.final_resolved_ts)
    else:
        x = max(ts for ts in points if ts < alter.commit_ts - 1 and ts <= points[len(points) // 3])
    assert any(ts <= x for ts in sim.commit_ts)
    assert any(x < ts <= sim.final_resolved_ts for ts in sim.commit_ts)
    restore_backup(feed, sim, x)
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    return sim, x


@pytest.mark.parametrize("after_alter", [False, True], ids=["ddl-above-x", "ddl-below-x"])
def test_a_restored_downstream_converges_from_its_backup_ts(feed: Changefeed, after_alter: bool) -> None:
    sim, x = _restored_at(feed, seed=31 if after_alter else 17, after_alter=after_alter)
    assert feed.compare(sim, x) == []  # the restore is the model at X

    done = feed.run_to_end("--from-ts", str(x))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting at from_ts" in done.stdout + done.stderr
    resolved, offsets = feed.checkpoint()
    assert resolved == sim.final_resolved_ts and sorted(offsets) == [0, 1, 2]
    assert feed.compare(sim, sim.final_resolved_ts) == []
    above = [ev for ev in sim.ddl_events if ev.commit_ts > x]
    assert bool([ev for ev in above if ev.ddl_type == ADD_COLUMN]) != after_alter
    assert feed.applied_ddls() == len(above)  # only the DDLs above X ran


def test_from_ts_is_also_read_from_the_environment_and_a_changefeed_with_a_checkpoint_ignores_it(
    feed: Changefeed,
) -> None:
    sim, x = _restored_at(feed, seed=5, after_alter=False)
    done = subprocess.run(
        feed.args("--exit-when-caught-up"),
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "APPLIER_FROM_TS": str(x)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []

    # The checkpoint is now above X: the same setting on a restart is ignored, with a line saying so.
    again = feed.run_to_end("--from-ts", str(x))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "from_ts ignored" in again.stdout + again.stderr
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == []


def test_from_ts_above_the_checkpoint_is_refused_in_one_line(feed: Changefeed) -> None:
    sim, x = _restored_at(feed, seed=9, after_alter=False)
    assert feed.run_to_end("--from-ts", str(x)).returncode == 0
    later = sim.final_resolved_ts + (1 << 18)  # a millisecond after everything the checkpoint covers

    refused = feed.run_to_end("--from-ts", str(later), timeout=60)
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2, out
    lines = [ln for ln in out.splitlines() if f"from_ts {later} is above the checkpoint" in ln]
    assert len(lines) == 1, out
    assert "Traceback" not in out
    assert feed.checkpoint()[0] == sim.final_resolved_ts  # nothing written

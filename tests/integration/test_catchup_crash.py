"""A catch-up killed midway (SIGKILL: no clean-up at all) and run again converges to the model.

The first run is a real ``python -m applier catchup`` process with its own Spark; it is killed as
soon as it reports its first epoch applied, so the downstream holds a partial catch-up (the first
epoch's rows, maybe the DDL, maybe part of the next epoch) and a checkpoint in the middle of the
window. The second run (in process) must finish the job exactly: keyless rows not doubled, the DDL
not failing as "already applied", and the daemon must then continue from the hand-off.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from applier.simulator import StreamConfig, produce_simulation, simulate
from tests.integration.catchup_support import (
    global_resolved_of,
    restore_backup,
    run_catchup_here,
    start_catchup_process,
)
from tests.integration.harness import Changefeed, read_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _kill_at(proc, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = read_log(proc)
        if needle in log:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return log
        if proc.poll() is not None:
            raise AssertionError(f"catch-up ended (code {proc.returncode}) before {needle!r}:\n{log}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    raise AssertionError(f"{needle!r} not seen within {timeout}s:\n{read_log(proc)}")


def test_a_killed_catchup_run_again_converges(feed: Changefeed) -> None:
    cfg = StreamConfig(seed=33, partitions=3, transactions=240, schema=feed.new_schema())
    sim = simulate(cfg)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    x = sim.resolved_points[3]
    assert x < alter.commit_ts
    restore_backup(feed, sim, x)
    produce_simulation(feed.bootstrap, feed.topic, sim)
    r = global_resolved_of(sim.records)
    assert r == sim.final_resolved_ts

    proc = start_catchup_process(feed, x, start_new_session=True)
    log = _kill_at(proc, "epoch applied", timeout=240)
    assert "hand-off checkpoint written" not in log
    partial, _ = feed.checkpoint()
    assert x < partial < r, "the killed run left a checkpoint inside the window"

    summary = run_catchup_here(feed, x)
    assert summary.resolved_ts == r
    assert summary.lower_ts == partial, "the second run resumes from the last completed epoch"
    assert feed.compare(sim, r) == []

    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []

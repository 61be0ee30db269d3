"""The daemon under process failures: SIGKILL at random points, SIGTERM, a hot standby."""

from __future__ import annotations

import random
import signal
import time

import pytest

from applier.simulator import PRODUCER_MODES, Simulation, StreamConfig, produce_simulation, simulate
from tests.integration import eager_workers, tight_read_ahead
from tests.integration.harness import Changefeed, kill_loop, read_log, stop, wait_for_output
from tests.integration.lock_holder import holding_tables

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _produced_for_small_transactions(feed: Changefeed, max_txn_rows: int, **stream) -> Simulation:
    """A simulated stream in the changefeed's topic, to be applied in transactions of at most
    ``max_txn_rows`` rows: many commits, so that a signal lands before, inside and after them."""
    sim = simulate(StreamConfig(schema=feed.new_schema(), **stream))
    produce_simulation(feed.bootstrap, feed.topic, sim)
    feed.extra_args += ["--max-txn-rows", str(max_txn_rows)]
    return sim


def _killed_then_run_to_the_end(
    feed: Changefeed, sim: Simulation, tmp_path, rng: random.Random, *, runs: int, delay: tuple[float, float]
) -> str:
    """``kill_loop``, then a run to the end that must converge to the model; returns the log."""
    log_path = str(tmp_path / "daemon.log")
    progress = kill_loop(feed, log_path, rng, runs=runs, delay=delay)
    assert progress[-1] > 0, "the daemon never committed between the kills"
    proc = feed.start("--exit-when-caught-up", log_path=log_path)
    assert proc.wait(timeout=180) == 0, read_log(proc)[-3000:]
    assert feed.compare(sim, sim.final_resolved_ts) == []
    return read_log(proc)


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_kill_loop_converges(feed: Changefeed, tmp_path, mode: str) -> None:
    """At least 10 SIGKILLs at random points of one stream, each followed by a restart, with every
    producer order of the architecture on (docs/open-protocol.md §5.1-§5.4)."""
    sim = _produced_for_small_transactions(
        feed, 5, seed=21, partitions=4, transactions=3000, **PRODUCER_MODES[mode]
    )
    progress = kill_loop(feed, str(tmp_path / "daemon.log"), random.Random(7), runs=12, delay=(0.2, 2.4))
    kills = len(progress)
    assert kills >= 10
    assert progress[-1] > 0, "the daemon never committed between the kills"
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert len(set(progress)) > 3, f"kills did not land at different points: {progress}"


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_kill_loop_converges_with_read_ahead_back_pressure(feed: Changefeed, tmp_path, mode: str) -> None:
    """The same with the read-ahead limits shrunk to a few hundred rows (``tight_read_ahead``): the
    partitions ahead of the barrier are paused and resumed while windows are in flight, over and
    over, through kills and restarts, and nothing is lost or applied twice."""
    sim = _produced_for_small_transactions(
        feed, 5, seed=24, partitions=4, transactions=1500, **PRODUCER_MODES[mode]
    )
    feed.module = tight_read_ahead.__name__
    log = _killed_then_run_to_the_end(feed, sim, tmp_path, random.Random(8), runs=6, delay=(0.2, 2.0))
    assert log.count(tight_read_ahead.MARK) >= 3, "the back-pressure branch never ran"


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_kill_loop_converges_with_worker_sessions(feed: Changefeed, tmp_path, mode: str) -> None:
    """The same with two worker sessions writing the keyed rows of every window
    (``eager_workers``; applier.apply.workers): a kill between a worker's commit and the window's
    own (with the checkpoint) leaves rows ahead of the checkpoint, which the restart writes again
    to the same values; keyless rows stay with the checkpoint, so none is applied twice."""
    sim = _produced_for_small_transactions(
        feed, 5, seed=27, partitions=4, transactions=2000, **PRODUCER_MODES[mode]
    )
    feed.module = eager_workers.__name__
    feed.extra_args += ["--apply-workers", "2"]
    log = _killed_then_run_to_the_end(feed, sim, tmp_path, random.Random(9), runs=10, delay=(0.2, 2.4))
    assert "workers=2" in log, "no window was written by the workers"


@pytest.mark.parametrize("workers", [0, 2])
def test_sigterm_exits_zero_quickly_and_restart_carries_on(feed: Changefeed, workers: int) -> None:
    """With ``workers``, worker sessions write the keyed rows of every window (``eager_workers``):
    their threads and sessions must not hold the exit up either."""
    sim = _produced_for_small_transactions(feed, 20, seed=22, partitions=3, transactions=800)
    if workers:
        feed.module = eager_workers.__name__
        feed.extra_args += ["--apply-workers", str(workers)]
    proc = feed.start()
    wait_for_output(proc, "window applied", timeout=60)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=15)
    assert code == 0
    assert time.monotonic() - started < 10
    mid, _ = feed.checkpoint()
    assert mid > 0
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []


def test_standby_takes_over_when_the_active_instance_dies(feed: Changefeed) -> None:
    sim = _produced_for_small_transactions(feed, 20, seed=23, partitions=3, transactions=800)
    first = feed.start()
    wait_for_output(first, "active: holding", timeout=60)
    second = feed.start("--exit-when-caught-up")
    out = wait_for_output(second, "standby", timeout=60)
    assert "window applied" not in out
    time.sleep(1.0)
    stop(first, signal.SIGKILL)
    took_over = time.monotonic()
    wait_for_output(second, "active: holding", timeout=30)
    assert time.monotonic() - took_over < 15
    assert second.wait(timeout=180) == 0
    assert feed.compare(sim, sim.final_resolved_ts) == []


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_kill_loop_converges_with_ddls_holding_only_their_tables(
    feed: Changefeed, tmp_path, mode: str
) -> None:
    """The same with ddl_blocking = "tables" and DDLs made to last (``lock_holder``): kills land
    while tables wait for a DDL beside the stream, with the checkpoint below the DDL and the other
    tables' per-table ts past it; the restart runs the DDL again and applies each row once."""
    sim = _produced_for_small_transactions(
        feed, 5, seed=29, partitions=4, transactions=1200, **PRODUCER_MODES[mode]
    )
    feed.extra_args += ["--ddl-blocking", "tables"]
    with holding_tables(feed.mariadb_params, sim.config.schema, seed=29) as held:
        log = _killed_then_run_to_the_end(feed, sim, tmp_path, random.Random(10), runs=6, delay=(0.2, 2.4))
    assert held, "the lock holder never held a table"
    assert "held_tables=" in log, "no window went on past a DDL still running"

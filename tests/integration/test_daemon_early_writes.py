"""The daemon following a live stream, with early writes (applier.apply.early) and kills.

Early writes only happen while the daemon waits for a resolved ts with rows already read: a
stream produced whole before the daemon starts is a backlog, whose windows are always ready. So
here the simulated stream is produced a few records at a time while the daemon runs, with every
producer order of each architecture on (docs/open-protocol.md §5.1-§5.4: late first copies and
the physical partitions of one table are the rows that arrive after their piece was written).
The daemon is stopped at random moments, by SIGKILL or SIGTERM; each time the downstream must be
exactly the upstream at the checkpoint's ts (nothing written early is ever committed without its
window), and the last run must converge exactly.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time

import pytest

from applier.simulator import PRODUCER_MODES, StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.ops_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_a_live_stream_with_early_writes_converges_through_kills_and_stops(
    feed: Changefeed, mode: str, tmp_path
) -> None:
    seed = 410 + ["all-classic", "all-new"].index(mode)
    cfg = StreamConfig(
        seed=seed, partitions=4, transactions=400, schema=feed.new_schema(), **PRODUCER_MODES[mode]
    )
    sim = simulate(cfg)
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    records = list(sim.records)
    # The stream's last tenth is produced slowly to a daemon that is left running: the killed runs
    # may all fall behind on a loaded machine (behind, a daemon works through a backlog and writes
    # nothing early), this one follows the stream.
    records, tail = records[: len(records) * 9 // 10], records[len(records) * 9 // 10 :]
    failure: list[BaseException] = []

    def produce_live() -> None:
        try:
            for i in range(0, len(records), 40):  # a few hundred records a second
                produce_records(feed.bootstrap, feed.topic, records[i : i + 40])
                time.sleep(0.1)
        except BaseException as exc:  # reported by the test's thread
            failure.append(exc)

    producer = threading.Thread(target=produce_live, daemon=True)
    producer.start()
    rng = random.Random(seed)
    logs: list[str] = []
    run = 0
    while producer.is_alive():
        proc = feed.start(log_path=str(tmp_path / f"daemon{run}.log"))
        # Timed from its first window, not from its start: on a loaded machine a daemon stopped
        # 0.8-2.5 s after its start may not have applied anything, and then no run of the loop
        # commits rows written early (the path under test).
        with contextlib.suppress(AssertionError):  # the stream may be over already
            wait_for_output(proc, "window applied", 20)
        time.sleep(rng.uniform(0.8, 2.5))
        sig = signal.SIGTERM if run % 2 else signal.SIGKILL
        stop(proc, sig)
        if sig == signal.SIGTERM:
            assert proc.returncode == 0, read_log(proc)[-3000:]
        logs.append(read_log(proc))
        resolved, _ = feed.checkpoint()
        if resolved:
            feed.assert_snapshot(sim, resolved, f"after {sig.name}")
        run += 1
    producer.join()
    assert not failure, failure
    assert run >= 2, "the stream was produced before the daemon was stopped twice"
    proc = feed.start(log_path=str(tmp_path / "daemon-follows.log"))
    wait_for_output(proc, "started", 60)
    for i in range(0, len(tail), 5):  # a few dozen records a second: the daemon keeps up
        produce_records(feed.bootstrap, feed.topic, tail[i : i + 5])
        time.sleep(0.1)
    wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 120, "the tail applied", proc)
    stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)[-3000:]
    logs.append(read_log(proc))
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert any("early_rows=" in log for log in logs), "no window committed rows written early"

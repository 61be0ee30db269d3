"""One changefeed written into several topics by TiCDC's topic dispatcher, read under one barrier.

The simulator writes each table's rows and DDLs to a topic of its own, CREATE DATABASE to the
default topic, and resolved events only to the default topic and the topics of tables that
changed since the last one (docs/open-protocol.md §5.10): tables that do not change make quiet
topics, which must neither stall the barrier nor let it pass their rows. The daemon is killed at
random moments: after each kill the downstream must be exactly the upstream at the checkpoint's
ts (never a row above the global watermark), and the last run must converge exactly.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

import pymysql
import pytest

from applier.simulator import PRODUCER_MODES, StreamConfig, produce_simulation, simulate
from applier.simulator.producer import ensure_topic, produce_records, simulation_topics
from tests.integration.harness import Changefeed, read_log, stop
from tests.integration.ops_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODES = ["all-classic", "all-new"]


def dispatched(feed: Changefeed, *, seed: int, transactions: int, **options: object) -> StreamConfig:
    """A topic dispatcher's changefeed into ``feed``'s topics: two partitions each, one transaction
    per resolved interval, so most table topics are quiet in each; ``options``: producer modes."""
    return StreamConfig(
        seed=seed,
        partitions=2,
        transactions=transactions,
        resolved_every=1,
        schema=feed.new_schema(),
        topic_dispatcher=True,
        **options,  # type: ignore[arg-type]
    )


def _topic_args(feed: Changefeed, form: str, topics: list[str]) -> list[str]:
    if form == "list":
        return ["--topic", ",".join(topics[1:])]  # with the default topic from the harness
    return ["--topic", f"/{feed.topic}_.*/"]  # the pattern: table topics join as they are found


@pytest.mark.parametrize(("mode", "form"), [("all-classic", "list"), ("all-new", "pattern")])
def test_topic_dispatched_changefeed_converges_under_kills_and_never_passes_the_watermark(
    feed: Changefeed, mode: str, form: str, tmp_path
) -> None:
    seed = 900 + MODES.index(mode)
    options = {**PRODUCER_MODES[mode], "replays": True}
    cfg = dispatched(feed, seed=seed, transactions=400, **options)
    sim = simulate(cfg)
    topics = simulation_topics(sim, feed.topic)
    assert len(topics) >= 4
    produce_simulation(feed.bootstrap, feed.topic, sim)
    feed.extra_args += [*_topic_args(feed, form, topics), "--max-txn-rows", "5"]
    points = feed.kill_repeatedly(sim, kills=3, rng=random.Random(seed), log_dir=tmp_path, first_window_s=30)
    done = feed.run_to_end(timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert any(p < sim.final_resolved_ts for p in points), f"no kill landed mid-stream: {points}"


def test_quiet_topics_produced_while_the_daemon_reads_never_let_the_watermark_pass_their_rows(
    feed: Changefeed, tmp_path
) -> None:
    """The stream is produced in pieces while the daemon reads it, in the simulator's order, each
    topic created just before its first record: a quiet topic's partition is only taken as
    resolved at R from an end fetched after R was seen (an end learned earlier would let the
    watermark pass rows written to it meanwhile, which would then be skipped), and a topic that
    appears joins before the watermark passes what was seen before it was listed. Every
    checkpoint seen on the way is an exact snapshot."""
    # all-new: a table (and its topic) created mid-stream
    cfg = dispatched(feed, seed=913, transactions=500, **{**PRODUCER_MODES["all-new"], "replays": True})
    sim = simulate(cfg)
    place = lambda slot: sim.topic_of(slot, feed.topic)  # noqa: E731
    pieces = [sim.records[i : i + 150] for i in range(0, len(sim.records), 150)]
    created: set[str] = set()

    def produce(piece: list) -> None:
        """As TiCDC does: a topic is created when its first record is about to be written."""
        for name in sorted({place(rec.partition)[0] for rec in piece} - created):
            ensure_topic(feed.bootstrap, name, cfg.partitions)
            created.add(name)
        produce_records(feed.bootstrap, feed.topic, piece, place=place)

    produce(pieces[0])
    feed.extra_args += ["--topic", f"/{feed.topic}_.*/", "--max-txn-rows", "5"]
    proc = feed.start(log_path=str(tmp_path / "daemon.log"))
    seen = set()
    try:
        for piece in pieces[1:]:
            produce(piece)
            os.kill(proc.pid, signal.SIGSTOP)  # what is committed stays put while it is compared
            try:
                time.sleep(0.3)  # a COMMIT the server was working on when the daemon stopped
                resolved = _checkpoint_or_zero(feed)
                if resolved and resolved not in seen:
                    seen.add(resolved)
                    feed.assert_snapshot(sim, resolved, "mid-stream")
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        wait_until(lambda: _checkpoint_or_zero(feed) == sim.final_resolved_ts, 120, "the end", proc)
    finally:
        stop(proc, signal.SIGTERM)
    log = read_log(proc)
    assert "fatal" not in log
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert len(seen) >= 3, seen
    added = [line for line in log.splitlines() if "partition added" in line]
    joined = {name for name in created if any(line.endswith(f"topic={name}") for line in added)}
    assert len(created) == len(simulation_topics(sim, feed.topic))
    assert joined, "no topic joined while the daemon ran"


def _checkpoint_or_zero(feed: Changefeed) -> int:
    with contextlib.suppress(pymysql.err.ProgrammingError):  # checkpoint tables not created yet
        return feed.checkpoint()[0]
    return 0

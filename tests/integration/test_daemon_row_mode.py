"""Row mode (``consistency = "row"``, applier.stream.row_release) end to end: simulated TiCDC
streams through the real broker into MariaDB, every partition applying on its own session.

The daemon runs with its joint release after start-up kept short (``--row-settle-seconds 0.5``).
A third of each stream is in the topic before it starts; the rest is produced in pieces while it
runs, so that most of it goes through each partition's own release once the partitions have been
read to their end.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import threading
import time

import pytest

from applier.simulator import PRODUCER_MODES, Simulation, StreamConfig, produce_simulation, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.harness import Changefeed, kill_loop, read_log, stop
from tests.integration.ops_support import wait_until

pytestmark = pytest.mark.integration

ON_ITS_OWN = "each partition releases its rows on its own"


def row_mode(feed: Changefeed) -> None:
    feed.extra_args += ["--consistency", "row", "--row-settle-seconds", "0.5"]


def follow(feed: Changefeed, sim: Simulation, partitions: int, pieces: int = 20) -> str:
    """Produce a third of ``sim``, start the daemon, produce the rest in ``pieces`` while it runs,
    wait until it has applied everything, stop it (SIGTERM); its log."""
    ensure_topic(feed.bootstrap, feed.topic, partitions)
    records = sim.records
    head = len(records) // 3
    produce_records(feed.bootstrap, feed.topic, records[:head])
    proc = feed.start()
    try:
        step = max(1, (len(records) - head) // pieces)
        for i in range(head, len(records), step):
            time.sleep(0.25)
            produce_records(feed.bootstrap, feed.topic, records[i : i + step])
        wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 120, "the final resolved ts", proc)
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)
    return read_log(proc)


@pytest.mark.parametrize(
    "options",
    [
        dict(seed=11, partitions=4, dispatcher="index-value", **PRODUCER_MODES["all-classic"]),
        dict(seed=12, partitions=6, dispatcher="table", **PRODUCER_MODES["all-new"]),
        dict(seed=13, partitions=4, dispatcher="index-value", **PRODUCER_MODES["classic-partition-growth"]),
        dict(seed=14, partitions=4, dispatcher="index-value", **PRODUCER_MODES["new-partition-growth"]),
    ],
    ids=["4p-classic", "6p-new-table", "classic-growth", "new-growth"],
)
def test_row_mode_converges_to_the_model(feed: Changefeed, options: dict) -> None:
    """Every producer order of an architecture on, most of the stream read as the daemon follows it."""
    row_mode(feed)
    cfg = StreamConfig(transactions=400, schema=feed.new_schema(), **options)
    sim = simulate(cfg)
    log = follow(feed, sim, cfg.partitions)
    assert ON_ITS_OWN in log, log[-3000:]
    assert "partitions=" in log.split(ON_ITS_OWN, 1)[1], "no window of parts after the joint release"
    assert feed.compare(sim, sim.final_resolved_ts) == []


def _last_resolved(records: list) -> dict[int, int]:
    last: dict[int, int] = {}
    for rec in records:
        for ev in rec.events:
            if ev.kind == "resolved":
                last[rec.partition] = max(last.get(rec.partition, 0), ev.commit_ts)
    return last


def _applied(feed: Changefeed) -> dict[int, int]:
    rows = feed.checkpoint_rows(
        "SELECT partition_id, applied_ts FROM {schema}.partition_applied WHERE changefeed=%s"
    )
    return {int(p): int(ts) for p, ts in rows}


# Tables with a unique key besides the handle key: in row mode their rows wait for the lowest
# partition's resolved ts (applier.stream.row_release), so a stalled partition holds them back
# everywhere; the tests of what a partition does on its own leave them out.
UNIQUE_TABLES = ("composite", "uniq_only")


def _stalled(feed: Changefeed, cfg: StreamConfig, check, cut: float = 2 / 3) -> None:
    """``cut`` of the stream produced in pieces while the daemon follows it, then the rest of
    every partition but 0 (as if partition 0's fetches were held): ``check(sim, rest, proc)`` waits
    for what the other partitions must reach; then partition 0's rest, and the whole converges.
    The tables with a second unique key are filtered out (``UNIQUE_TABLES``)."""
    row_mode(feed)
    feed.extra_args += ["--filter", "*.*"]
    for table in UNIQUE_TABLES:
        feed.extra_args += ["--filter", f"!{cfg.schema}.{table}"]
    sim = simulate(cfg)
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    records = sim.records
    head = int(len(records) * cut)
    proc = feed.start()
    try:
        step = max(1, head // 16)
        for i in range(0, head, step):
            produce_records(feed.bootstrap, feed.topic, records[i : min(i + step, head)])
            time.sleep(0.25)
        wait_until(lambda: ON_ITS_OWN in read_log(proc), 60, "the partitions' own release", proc)
        rest = records[head:]
        produce_records(feed.bootstrap, feed.topic, [r for r in rest if r.partition != 0])
        check(sim, rest, proc)
        assert proc.poll() is None, read_log(proc)
        produce_records(feed.bootstrap, feed.topic, [r for r in rest if r.partition == 0])
        wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 120, "the final resolved ts", proc)
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)
    missing = [f"{cfg.schema}.{table}: table missing downstream" for table in UNIQUE_TABLES]
    assert sorted(feed.compare(sim, sim.final_resolved_ts)) == sorted(missing)


def test_a_stalled_partition_holds_back_only_itself(feed: Changefeed) -> None:
    cfg = StreamConfig(
        seed=15,
        partitions=4,
        transactions=450,
        dispatcher="index-value",
        ddl_mid_stream=False,
        index_ddls=False,
        schema=feed.new_schema(),
        **PRODUCER_MODES["all-classic"],
    )

    def others_applied(sim: Simulation, rest: list, proc) -> None:
        last = _last_resolved(sim.records)
        want = {p: ts for p, ts in last.items() if p != 0}
        wait_until(
            lambda: all(_applied(feed).get(p, 0) >= ts for p, ts in want.items()),
            60,
            "every partition but the stalled one applied to its end",
            proc,
        )
        assert _applied(feed).get(0, 0) < last[0]
        assert feed.checkpoint()[0] < last[0]  # the changefeed's resolved ts: the lowest partition's

    _stalled(feed, cfg, others_applied)


def test_a_ddl_waits_for_a_partition_far_behind(feed: Changefeed) -> None:
    """The DROP INDEX three quarters in: the partitions that have it apply their rows below it and
    stop there, the DDL is recorded once partition 0 has caught up, then every partition goes on."""
    cfg = StreamConfig(
        seed=16,
        partitions=4,
        transactions=450,
        dispatcher="index-value",
        ddl_mid_stream=False,
        schema=feed.new_schema(),
        **PRODUCER_MODES["all-classic"],
    )
    sim = simulate(cfg)
    cut = len(sim.records) * 2 // 3
    head = {ev.commit_ts for rec in sim.records[:cut] for ev in rec.events if ev.kind == "ddl"}
    later = [
        ev.commit_ts
        for rec in sim.records[cut:]
        for ev in rec.events
        if ev.kind == "ddl" and ev.commit_ts not in head and ev.table not in UNIQUE_TABLES
    ]
    assert later, "the DROP INDEX should come after the cut"
    ddl_ts = min(later)

    def stopped_below_the_ddl(sim: Simulation, rest: list, proc) -> None:
        wait_until(
            lambda: all(_applied(feed).get(p, 0) == ddl_ts - 1 for p in (1, 2, 3)),
            60,
            "the other partitions at the DDL",
            proc,
        )
        time.sleep(1.0)
        applied = _applied(feed)
        assert all(applied[p] == ddl_ts - 1 for p in (1, 2, 3)), applied
        assert applied.get(0, 0) < ddl_ts - 1
        assert feed.applied_ddls(commit_ts=ddl_ts) == 0

    _stalled(feed, cfg, stopped_below_the_ddl)
    assert feed.applied_ddls(commit_ts=ddl_ts) == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_kill_loop_in_row_mode_converges(feed: Changefeed, tmp_path, mode: str) -> None:
    """SIGKILLs at random points while the partitions commit their parts on their own sessions
    (windows of at most 5 rows a part, the stream produced as the kills go on): each partition
    resumes from its own offset and applied ts, and nothing is lost or applied twice."""
    row_mode(feed)
    feed.extra_args += ["--max-txn-rows", "5"]
    cfg = StreamConfig(
        seed=17,
        partitions=4,
        transactions=1500,
        dispatcher="index-value",
        schema=feed.new_schema(),
        **PRODUCER_MODES[mode],
    )
    sim = simulate(cfg)
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    records = sim.records
    head = len(records) // 4
    produce_records(feed.bootstrap, feed.topic, records[:head])

    def produce_the_rest() -> None:
        step = max(1, (len(records) - head) // 40)
        for i in range(head, len(records), step):
            produce_records(feed.bootstrap, feed.topic, records[i : i + step])
            time.sleep(0.25)

    producer = threading.Thread(target=produce_the_rest)
    producer.start()
    log_path = str(tmp_path / "daemon.log")
    try:
        progress = kill_loop(feed, log_path, random.Random(17), runs=10, delay=(0.3, 1.8))
    finally:
        producer.join()
    assert len(progress) >= 8 and progress[-1] > 0, progress
    proc = feed.start("--exit-when-caught-up", log_path=log_path)
    assert proc.wait(timeout=180) == 0, read_log(proc)[-3000:]
    log = read_log(proc)
    assert ON_ITS_OWN in log and "partitions=" in log.split(ON_ITS_OWN, 1)[1], (
        "no part was written on its own"
    )
    assert feed.compare(sim, sim.final_resolved_ts) == []


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_row_mode_with_a_topic_per_table_converges(feed: Changefeed, mode: str) -> None:
    """TiCDC's topic dispatcher (docs/open-protocol.md §5.10): quiet topics, a topic per table
    found by pattern as it appears; a third in the topics before the start, the rest while the
    daemon runs."""
    row_mode(feed)
    cfg = StreamConfig(
        seed=18,
        partitions=2,
        transactions=300,
        resolved_every=1,
        schema=feed.new_schema(),
        topic_dispatcher=True,
        **PRODUCER_MODES[mode],
    )
    sim = simulate(cfg)
    records = sim.records
    head = len(records) // 3
    produce_simulation(feed.bootstrap, feed.topic, dataclasses.replace(sim, records=records[:head]))
    feed.extra_args += ["--topic", f"/{feed.topic}_.*/"]
    proc = feed.start()
    try:
        step = max(1, (len(records) - head) // 12)
        for i in range(head, len(records), step):
            time.sleep(0.25)
            piece = dataclasses.replace(sim, records=records[i : i + step])
            produce_simulation(feed.bootstrap, feed.topic, piece, create=False)
        wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 180, "the final resolved ts", proc)
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)
    assert feed.compare(sim, sim.final_resolved_ts) == []

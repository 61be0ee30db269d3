"""``applier catchup`` end to end: real broker, real MariaDB, Spark local[2], the simulator's model as truth.

The downstream starts as a restored backup (the model's snapshot at X), the topic holds the
backlog (a DDL, replays, duplicated records, unique-value swaps, primary-key changes, the keyless
table); the catch-up applies it up to the backlog's global resolved ts R and hands over; the daemon
then applies the rest of the stream. Nothing trusts the catch-up's own account: every check
compares the downstream with the model.
"""

from __future__ import annotations

import pytest

from applier.simulator import StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.catchup_support import (
    global_resolved_of,
    restore_backup,
    run_catchup_here,
    run_catchup_process,
    table_checksums,
)
from tests.integration.harness import Changefeed
from tests.integration.spark_cluster import standalone_cluster
from tests.integration.test_daemon_filter import filter_args

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark_cluster_url():
    with standalone_cluster() as cluster:
        yield cluster.master_url


@pytest.fixture(params=["local", "standalone"])
def run_catchup(request):
    """The catch-up in local mode (this process's session), or as its own process on a real standalone
    cluster (a master and a worker started from the PySpark installation): the same test, both ways."""
    if request.param == "local":
        return run_catchup_here
    url = request.getfixturevalue("spark_cluster_url")
    return lambda cf, from_ts, *more: run_catchup_process(cf, from_ts, *more, master=url)


def _checkpoint_rows(cf: Changefeed) -> dict[str, list[tuple]]:
    conn = cf.connect()
    try:
        out = {}
        with conn.cursor() as cur:
            for table, cols in (
                ("changefeed", "`topic`, `resolved_ts`"),
                ("table_checkpoint", "`schema_name`, `table_name`, `checkpoint_ts`"),
                ("partition_offset", "`partition_id`, `next_offset`, `resolved_ts`"),
                ("applied_ddl", "`commit_ts`, `query_digest`"),
            ):
                cur.execute(
                    f"SELECT {cols} FROM `{cf.checkpoint_schema}`.`{table}` "
                    "WHERE `changefeed` = %s ORDER BY 1, 2",
                    (cf.group_id,),
                )
                out[table] = [tuple(r) for r in cur.fetchall()]
        return out
    finally:
        conn.close()


def _rows_above_r(records) -> bool:
    r = global_resolved_of(records)
    return any(ev.commit_ts > r for rec in records for ev in rec.events if ev.kind == "row")


def test_backlog_with_ddl_is_applied_and_handed_over_to_the_daemon(feed: Changefeed, run_catchup) -> None:
    cfg = StreamConfig(seed=21, partitions=3, transactions=260, schema=feed.new_schema())
    sim = simulate(cfg)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    # The backup was taken well before the ALTER: the backlog holds rows, the DDL, more rows.
    x = max(ts for ts in sim.resolved_points if ts < alter.commit_ts - 1 and ts < sim.resolved_points[8])
    restore_backup(feed, sim, x)

    # The topic holds about 80% of the stream when the catch-up runs, cut where some rows above the
    # prefix's global resolved ts R are already in it: those must wait for the daemon.
    cut = next(
        c for c in range((len(sim.records) * 4) // 5, len(sim.records)) if _rows_above_r(sim.records[:c])
    )
    first, rest = sim.records[:cut], sim.records[cut:]
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, first)
    expected_r = global_resolved_of(first)
    assert x < alter.commit_ts <= expected_r, "the window must contain the DDL"
    assert any(x < ts <= expected_r for ts in sim.commit_ts)

    summary = run_catchup(feed, x)
    assert summary.resolved_ts == expected_r
    window_ddls = [ev for ev in sim.ddl_events if x < ev.commit_ts <= expected_r]  # the ALTER, index DDLs
    assert summary.ddls == len(window_ddls) and summary.epochs == len(window_ddls) + 1
    assert summary.events > 0 and 0 < summary.rows_written <= summary.events
    assert feed.compare(sim, expected_r) == []
    resolved, offsets = feed.checkpoint()
    assert resolved == expected_r and sorted(offsets) == list(range(cfg.partitions))

    # Running it again changes nothing: same rows, same checkpoint.
    before = (table_checksums(feed, sim.schema), _checkpoint_rows(feed))
    again = run_catchup(feed, x)
    assert again.rows_written == 0 and again.ddls == 0
    assert (table_checksums(feed, sim.schema), _checkpoint_rows(feed)) == before

    # The daemon continues from the hand-off: the rest of the stream, up to the final resolved ts.
    produce_records(feed.bootstrap, feed.topic, rest)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    resolved, _ = feed.checkpoint()
    assert resolved == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == []


def test_catchup_with_a_filter_skips_the_filtered_tables_rows_and_ddl(feed: Changefeed, capfd) -> None:
    """The rules reach the reading tasks: the filtered table's rows and its ALTER are skipped, the
    others converge, the driver says once which table was filtered out, and the daemon goes on."""
    cfg = StreamConfig(seed=23, partitions=3, transactions=200, schema=feed.new_schema())
    sim = simulate(cfg)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    assert alter.table == "composite"
    x = max(ts for ts in sim.resolved_points if ts < alter.commit_ts - 1 and ts < sim.resolved_points[8])
    restore_backup(feed, sim, x)  # a backup restored with the same filter: no composite
    conn = feed.connect()
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE `{sim.schema}`.composite")
    conn.close()
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    rules = filter_args(sim.schema)

    summary = run_catchup_here(feed, x, *rules)
    assert summary.resolved_ts == sim.final_resolved_ts
    # Every DDL of the window but the filtered ALTER (the index DDLs of another table)
    assert summary.ddls == len([ev for ev in sim.ddl_events if ev.commit_ts > x and ev.table != "composite"])
    assert feed.compare(sim, sim.final_resolved_ts) == [f"{sim.schema}.composite: table missing downstream"]
    said = capfd.readouterr()
    assert (said.out + said.err).count(f"table {sim.schema}.composite filtered out") == 1

    feed.extra_args += rules
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == [f"{sim.schema}.composite: table missing downstream"]


def test_rows_collapsed_across_a_ddl_their_partition_did_not_carry_are_read_again_whole(
    feed: Changefeed, capfd
) -> None:
    """A stream that breaks the protocol's rule (a partition's rows on both sides of a DDL without
    the DDL's record between them): a reader's collapsing would merge ops of two epochs into one
    row. The driver sees such rows and reads the backlog again without collapsing; the result
    still equals the model."""
    cfg = StreamConfig(seed=21, partitions=3, transactions=260, schema=feed.new_schema())
    sim = simulate(cfg)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    x = max(ts for ts in sim.resolved_points if ts < alter.commit_ts - 1 and ts < sim.resolved_points[8])
    restore_backup(feed, sim, x)

    def straddles(p: int) -> bool:
        """Does partition ``p`` hold ops of one row on both sides of the ALTER, within the window
        the catch-up applies (above x, at or below the final resolved ts)?"""
        before, after = set(), set()
        for rec in sim.records:
            for ev in rec.events if rec.partition == p else ():
                if ev.kind == "row" and ev.table == alter.table and x < ev.commit_ts <= sim.final_resolved_ts:
                    image = ev.new or ev.old or {}
                    side = before if ev.commit_ts < alter.commit_ts else after
                    side.add(tuple(sorted((c, v[2]) for c, v in image.items() if v[1] & 0x02)))  # handle key
        return bool((before & after) - {()})

    p = next(p for p in range(cfg.partitions) if straddles(p))
    broken = [
        rec
        for rec in sim.records
        if not (
            rec.partition == p
            and any(ev.kind == "ddl" and ev.commit_ts == alter.commit_ts for ev in rec.events)
        )
    ]
    assert len(broken) < len(sim.records)
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, broken)

    # One range per partition: the reader of partition p then sees both sides (with the test's
    # usual small ranges they may fall into two ranges, and no collapsed row spans the ALTER).
    summary = run_catchup_here(feed, x, "--catchup-split-records", "100000")
    said = capfd.readouterr()
    assert "reading the backlog again without collapsing" in said.out + said.err, said.out + said.err
    assert summary.resolved_ts == sim.final_resolved_ts
    assert summary.ddls == len([ev for ev in sim.ddl_events if ev.commit_ts > x])
    assert feed.compare(sim, sim.final_resolved_ts) == []

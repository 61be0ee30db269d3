"""Routing end to end: a simulated stream of schema ``src`` (rows, CREATE DATABASE, CREATE TABLE, a
mid-stream ALTER) written into another schema by ``--route``, through the real broker into MariaDB,
by the daemon and by the catch-up. The downstream is compared with the simulator's model under the
routed names; nothing may appear under the upstream names, and the checkpoint keeps them.
"""

from __future__ import annotations

import pymysql
import pytest

from applier.simulator import PRODUCER_MODES, StreamConfig, compare_downstream, produce_simulation, simulate
from applier.simulator.producer import ensure_topic, produce_records
from applier.simulator.tables import quote_ident
from tests.integration.catchup_support import global_resolved_of, load_state, run_catchup_here
from tests.integration.harness import Changefeed

pytestmark = pytest.mark.integration


def _rows(feed: Changefeed, sql: str, *args: object) -> list[tuple]:
    conn = feed.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def _schema_exists(feed: Changefeed, schema: str) -> bool:
    return bool(_rows(feed, "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", schema))


def _checkpoint_schemas(feed: Changefeed) -> set[str]:
    """The schema names the checkpoint's table floors are kept under."""
    table = f"`{feed.checkpoint_schema}`.`table_checkpoint`"
    sql = f"SELECT DISTINCT `schema_name` FROM {table} WHERE `changefeed` = %s"
    return {r[0] for r in _rows(feed, sql, feed.group_id)}


def _compare(feed: Changefeed, sim, ts: int, dst: str) -> list[str]:
    conn = feed.connect()
    try:
        return compare_downstream(conn, sim, ts, {sim.schema: dst}, keyless_rows=sim.exact_keyless)
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("mode", "consistency"), [("all-classic", "transaction"), ("all-new", "transaction"), ("all-new", "row")]
)
def test_a_routed_stream_converges_in_the_target_schema(
    feed: Changefeed, mode: str, consistency: str
) -> None:
    """Also in row mode: its second run resumes every partition from its own offset and applied ts."""
    feed.extra_args += ["--consistency", consistency, "--row-settle-seconds", "0.5"]
    src, dst = feed.new_schema("src"), feed.new_schema("dst")
    cfg = StreamConfig(seed=31, partitions=3, transactions=220, schema=src, **PRODUCER_MODES[mode])
    sim = simulate(cfg)
    assert {ev.ddl_type for ev in sim.ddl_events} >= {1, 3, 5}  # CREATE DATABASE, CREATE TABLE, ALTER
    cut = len(sim.records) // 2
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, sim.records[:cut])
    route = ("--route", f"{src}.*={dst}.{{table}}")
    done = feed.run_to_end(*route)
    assert done.returncode == 0, done.stdout + done.stderr
    produce_records(feed.bootstrap, feed.topic, sim.records[cut:])
    done = feed.run_to_end(*route)  # restarts from the checkpoint kept under the upstream names
    assert done.returncode == 0, done.stdout + done.stderr

    resolved, _ = feed.checkpoint()
    assert resolved == sim.final_resolved_ts
    assert _compare(feed, sim, sim.final_resolved_ts, dst) == []
    assert not _schema_exists(feed, src), "nothing may be written under the upstream schema"
    assert _checkpoint_schemas(feed) == {src}


def test_a_table_rule_wins_over_the_schema_rule(feed: Changefeed) -> None:
    """One table goes elsewhere by the first rule, the others follow the schema rule."""
    src, dst, side = feed.new_schema("src"), feed.new_schema("dst"), feed.new_schema("side")
    sim = simulate(StreamConfig(seed=32, partitions=2, transactions=120, schema=src, ddl_mid_stream=False))
    produce_simulation(feed.bootstrap, feed.topic, sim)
    moved = "composite"  # a keyed table: its rows can be counted exactly
    assert moved in sim.tables_at(sim.final_resolved_ts)
    conn = pymysql.connect(**feed.mariadb_params, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {quote_ident(side)}")  # a table rule does not create schemas
    finally:
        conn.close()
    done = feed.run_to_end(
        "--route", f"{src}.{moved}={side}.{moved}_moved", "--route", f"{src}.*={dst}.{{table}}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    diffs = _compare(feed, sim, sim.final_resolved_ts, dst)
    assert diffs and all(moved in d for d in diffs)  # only the moved table is missing from dst
    ((n,),) = _rows(feed, f"SELECT COUNT(*) FROM {quote_ident(side)}.{quote_ident(moved + '_moved')}")
    assert n == len(sim.expected_snapshot(sim.final_resolved_ts)[(src, moved)])
    assert not _schema_exists(feed, src)


@pytest.mark.slow
def test_a_routed_catch_up_hands_over_to_a_routed_daemon(feed: Changefeed) -> None:
    src, dst = feed.new_schema("src"), feed.new_schema("dst")
    cfg = StreamConfig(seed=33, partitions=3, transactions=240, schema=src)
    sim = simulate(cfg)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    x = max(ts for ts in sim.resolved_points if ts < alter.commit_ts - 1 and ts < sim.resolved_points[8])
    # The backup restored under the routed name.
    conn = pymysql.connect(**feed.mariadb_params, charset="utf8mb4", autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {quote_ident(dst)}")
        load_state(conn, sim, x, dst)
    finally:
        conn.close()
    cut = (len(sim.records) * 4) // 5
    first, rest = sim.records[:cut], sim.records[cut:]
    ensure_topic(feed.bootstrap, feed.topic, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, first)
    expected_r = global_resolved_of(first)
    assert x < alter.commit_ts <= expected_r, "the window must contain the DDL"

    route = ("--route", f"{src}.*={dst}.{{table}}")
    summary = run_catchup_here(feed, x, *route)
    window_ddls = [ev for ev in sim.ddl_events if x < ev.commit_ts <= expected_r]
    assert summary.resolved_ts == expected_r and summary.ddls == len(window_ddls)
    assert _compare(feed, sim, expected_r, dst) == []
    assert not _schema_exists(feed, src)

    produce_records(feed.bootstrap, feed.topic, rest)
    done = feed.run_to_end(*route)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    assert _compare(feed, sim, sim.final_resolved_ts, dst) == []
    assert not _schema_exists(feed, src)
    assert _checkpoint_schemas(feed) <= {src}

"""compare_downstream against a real MariaDB: the simulator's DDL must be valid there, the expected
state must round-trip through the server unchanged, and real differences must be reported.

No applier is involved: a small loader below executes the stream's DDL events (as the applier
would, with the schema selected) and writes the expected rows directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pymysql
import pytest

from applier.simulator import PRODUCER_MODES, Simulation, StreamConfig, compare_downstream, simulate
from applier.simulator.tables import LATE_TABLE, PARTITIONED_TABLE, quote_ident
from tests.integration.catchup_support import load_state

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim() -> Simulation:
    return simulate(StreamConfig(seed=11, transactions=120, partitions=3))


@pytest.fixture
def conn(mariadb_params: dict, fresh_db: str) -> Iterator[pymysql.connections.Connection]:
    c = pymysql.connect(**mariadb_params, database=fresh_db, charset="utf8mb4", autocommit=False)
    with c.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    try:
        yield c
    finally:
        c.close()


def drop_tables(conn: pymysql.connections.Connection, sim: Simulation) -> None:
    with conn.cursor() as cur:
        for table in sim.tables_at(sim.final_resolved_ts):
            cur.execute(f"DROP TABLE IF EXISTS {quote_ident(table)}")
    conn.commit()


def test_expected_state_round_trips_at_several_points(conn, sim: Simulation, fresh_db: str) -> None:
    alter_ts = next(ev.commit_ts for ev in sim.ddl_events if ev.ddl_type == 5)
    before_alter = max(r for r in sim.resolved_points if r < alter_ts)
    points = [sim.resolved_points[0], before_alter, sim.final_resolved_ts]
    mapping = {sim.schema: fresh_db}
    for ts in points:
        drop_tables(conn, sim)
        load_state(conn, sim, ts, fresh_db)
        assert compare_downstream(conn, sim, ts, mapping) == [], f"at ts {ts}"
    # The final state is not the state before the ALTER: the comparison must see the difference.
    diffs = compare_downstream(conn, sim, before_alter, mapping)
    assert any("unexpected columns downstream: extra" in d for d in diffs)


def test_reports_differences(conn, sim: Simulation, fresh_db: str) -> None:
    ts = sim.final_resolved_ts
    mapping = {sim.schema: fresh_db}
    drop_tables(conn, sim)
    load_state(conn, sim, ts, fresh_db)
    snapshot = sim.expected_snapshot(ts)
    victim = snapshot[(sim.schema, "all_types")][0]
    dup = snapshot[(sim.schema, "keyless")][0]
    uniq = next(r for r in snapshot[(sim.schema, "uniq_only")] if r["v2"] != "changed")
    with conn.cursor() as cur:
        cur.execute("DELETE FROM `all_types` WHERE `id` = %s", (victim["id"],))
        cur.execute("UPDATE `composite` SET `val` = 'tampered' ORDER BY `a`, `b` LIMIT 1")
        cols = list(dup)
        names, marks = ", ".join(quote_ident(c) for c in cols), ", ".join(["%s"] * len(cols))
        cur.execute(f"INSERT INTO `keyless` ({names}) VALUES ({marks})", [dup[c] for c in cols])
        cur.execute("UPDATE `uniq_only` SET `v2` = 'changed' WHERE `u` = %s", (uniq["u"],))
    conn.commit()
    diffs = compare_downstream(conn, sim, ts, mapping)
    text = "\n".join(diffs)
    assert f"all_types: row (id={victim['id']!r}) missing downstream" in text
    assert "column val: expected" in text and "'tampered'" in text
    assert "keyless: 1 x unexpected row" in text
    assert f"uniq_only (u={uniq['u']!r}): column v2: expected {uniq['v2']!r}"[:60] in text
    assert len(diffs) == 4, text


def test_missing_table_is_reported(conn, sim: Simulation, fresh_db: str) -> None:
    drop_tables(conn, sim)
    diffs = compare_downstream(conn, sim, sim.final_resolved_ts, {sim.schema: fresh_db})
    assert sorted(diffs) == sorted(
        f"{fresh_db}.{t}: table missing downstream" for t in sim.tables_at(sim.final_resolved_ts)
    )


def test_partitioned_and_late_tables_round_trip_and_keyless_copies_are_tolerated_on_request(
    conn, fresh_db: str
) -> None:
    sim = simulate(StreamConfig(seed=12, transactions=120, partitions=3, **PRODUCER_MODES["all-new"]))
    assert not sim.exact_keyless  # no rid, and rows are sent more than once
    mapping = {sim.schema: fresh_db}
    create_ts = next(ev.commit_ts for ev in sim.ddl_events if ev.table == LATE_TABLE)
    before_create = max(r for r in sim.resolved_points if r < create_ts)
    for ts in (before_create, sim.final_resolved_ts):
        drop_tables(conn, sim)
        load_state(conn, sim, ts, fresh_db)
        assert compare_downstream(conn, sim, ts, mapping) == [], f"at ts {ts}"
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (fresh_db, PARTITIONED_TABLE),
        )
        assert cur.fetchone()[0] == 4  # PARTITION BY HASH ... PARTITIONS 4 ran on the server
        dup = sim.expected_snapshot(sim.final_resolved_ts)[(sim.schema, "keyless")][0]
        names, marks = ", ".join(quote_ident(c) for c in dup), ", ".join(["%s"] * len(dup))
        cur.execute(f"INSERT INTO `keyless` ({names}) VALUES ({marks})", list(dup.values()))
    conn.commit()
    ts = sim.final_resolved_ts
    assert [d for d in compare_downstream(conn, sim, ts, mapping) if "1 x unexpected row" in d]
    assert compare_downstream(conn, sim, ts, mapping, keyless_rows=False) == []
    with conn.cursor() as cur:
        cur.execute("DELETE FROM `keyless`")
    conn.commit()
    diffs = compare_downstream(conn, sim, ts, mapping)
    assert diffs and all("keyless" in d and "missing downstream" in d for d in diffs)
    assert compare_downstream(conn, sim, ts, mapping, keyless_rows=False) == []

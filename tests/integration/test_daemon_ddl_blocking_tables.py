"""ddl_blocking = "tables": a DDL that changes a table's shape holds only that table's rows while
it runs; the other tables go on, the checkpoint stays below the DDL until the held rows are
applied, and a SIGKILL while it waits loses and doubles nothing.

The DDL is made to last by another session holding a metadata lock on its table (as in
test_daemon_online_ddl.py).
"""

from __future__ import annotations

import signal

import pytest

from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.ops_support import wait_until
from tests.integration.test_daemon_online_ddl import columns, holding, online_rows, setup, table_rows

pytestmark = pytest.mark.integration

ADD_C = "ALTER TABLE big ADD COLUMN c BIGINT"


@pytest.fixture
def feed(feed: Changefeed) -> Changefeed:
    feed.extra_args += ["--http-listen", "off", "--ddl-blocking", "tables"]
    return feed


def table_ts(feed: Changefeed, table: str) -> int:
    rows = feed.checkpoint_rows(
        "SELECT checkpoint_ts FROM {schema}.table_checkpoint WHERE changefeed=%s AND table_name='"
        + table
        + "'"
    )
    return int(rows[0][0]) if rows else 0


def test_other_tables_go_on_while_a_ddl_changes_one_and_a_kill_meanwhile_loses_nothing(
    feed: Changefeed, mariadb_params: dict
) -> None:
    script, db = setup(feed)
    first = len(script.steps)
    add_ts = script.ddl(db, "big", 5, ADD_C)
    script.rows(db, "big", insert=[{"a": 100, "b": 1, "c": 7}])
    script.rows(db, "big", update=[({"a": 1, "b": 1}, {"a": 1, "b": 1, "c": 8})])
    for i in range(1, 4):
        script.rows(db, "hot", insert=[{"a": i, "b": i}])
    hot_ts = script.rows(db, "hot", delete=[{"a": 0, "b": 0}])
    with holding(mariadb_params, db, "big") as holder:
        script.produce(feed.bootstrap, feed.topic, first)
        proc = feed.start()
        try:
            # What a reader sees meanwhile: hot as of the newest resolved ts, big as of before the
            # DDL (its shape; its rows cannot be read while the DDL waits for its lock, the
            # checkpoint says none after it is applied), and a resolved ts that says the latter.
            wait_until(lambda: table_ts(feed, "hot") >= hot_ts, 60, "hot's rows after the held DDL", proc)
            assert table_rows(feed, db, "hot") == 3
            assert columns(feed, db, "big") == ["a", "b"]
            assert table_ts(feed, "big") < add_ts
            assert online_rows(feed) == [(add_ts, ADD_C)]
            assert feed.checkpoint()[0] == add_ts - 1
            # SIGKILL while it waits; the next start runs it again and holds big again.
            stop(proc, signal.SIGKILL)
            more = len(script.steps)
            script.rows(db, "hot", insert=[{"a": 10, "b": 10}])
            script.produce(feed.bootstrap, feed.topic, more)
            proc = feed.start()
            wait_for_output(proc, "DDL started beside the stream", 60)
            wait_until(lambda: table_rows(feed, db, "hot") == 4, 60, "hot's row after the restart", proc)
            assert table_ts(feed, "big") < add_ts
            assert feed.checkpoint()[0] == add_ts - 1
            holder.rollback()
            wait_until(lambda: table_rows(feed, db, "big") == 51, 60, "big's rows once its DDL ran", proc)
            wait_until(lambda: feed.checkpoint()[0] > hot_ts, 60, "the checkpoint past the held rows", proc)
        finally:
            stop(proc, signal.SIGTERM)
    log = read_log(proc)
    assert "Traceback" not in log
    # A later DDL of big waits for the rows before it; one of another table does not.
    more = len(script.steps)
    script.ddl(db, "big", 6, "ALTER TABLE big DROP COLUMN b")
    script.rows(db, "big", insert=[{"a": 101, "c": 9}])
    script.rows(db, "hot", insert=[{"a": 11, "b": 11}])
    script.produce(feed.bootstrap, feed.topic, more)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert columns(feed, db, "big") == ["a", "c"]
    conn = feed.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT a, c FROM `{db}`.big WHERE a IN (1, 100, 101) ORDER BY a")
            assert cur.fetchall() == ((1, 8), (100, 7), (101, 9))
            cur.execute(f"SELECT COUNT(*) FROM `{db}`.big")
            assert cur.fetchone()[0] == 52
            cur.execute(f"SELECT a FROM `{db}`.hot ORDER BY a")
            assert [r[0] for r in cur.fetchall()] == [1, 2, 3, 10, 11]
    finally:
        conn.close()
    assert not online_rows(feed)

"""Index DDLs run beside the stream (applier.apply.online_ddl): the other tables go on while one
builds, a later DDL of its table waits for it, and a stop or a SIGKILL during the build leaves
the index built exactly once after the restart.

A build is made to last by another session that holds a metadata lock on the table (an open
transaction that read it): the DDL waits for the lock for as long as the test needs. The rows
of that table then wait too (a waiting DDL queues the table's writers behind it), so the
streams below write the other table while the lock is held; that the table's own writers go on
during a real build is what ``benchmarks/long_ddl.py`` measures.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pymysql
import pytest

from applier.kafka.embedded_broker import create_topic
from tests.integration.ddl_script import Script
from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.ops_support import wait_until

pytestmark = pytest.mark.integration

ADD_I = "ALTER TABLE big ADD INDEX ib (b)"


@pytest.fixture
def feed(feed: Changefeed) -> Changefeed:
    feed.extra_args += ["--http-listen", "off"]
    return feed


@contextlib.contextmanager
def holding(mariadb_params: dict, db: str, table: str) -> Iterator[pymysql.connections.Connection]:
    """A session whose open transaction read ``db.table``: a DDL of that table waits until the
    transaction ends (``conn.rollback()``, or leaving the block)."""
    with contextlib.closing(pymysql.connect(**mariadb_params, autocommit=False)) as conn:
        conn.cursor().execute(f"SELECT COUNT(*) FROM `{db}`.`{table}`")
        yield conn


def setup(feed: Changefeed) -> tuple[Script, str]:
    db = feed.new_schema("online")
    script = Script(partitions=2)
    script.ddl(db, "", 1, f"CREATE DATABASE `{db}`")
    script.ddl(db, "big", 3, "CREATE TABLE big (a BIGINT PRIMARY KEY, b BIGINT)")
    script.ddl(db, "hot", 3, "CREATE TABLE hot (a BIGINT PRIMARY KEY, b BIGINT)")
    script.rows(db, "big", insert=[{"a": i, "b": i % 7} for i in range(50)])
    script.rows(db, "hot", insert=[{"a": 0, "b": 0}])
    create_topic(feed.bootstrap, feed.topic, 2)
    script.produce(feed.bootstrap, feed.topic)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    return script, db


def table_rows(feed: Changefeed, db: str, table: str) -> int:
    """The table's row count downstream (-1 while it does not exist yet)."""
    conn = feed.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM `{db}`.`{table}`")
            return int(cur.fetchone()[0])
    except pymysql.err.ProgrammingError as exc:
        if exc.args[0] in (1049, 1146):  # unknown database, unknown table
            return -1
        raise
    finally:
        conn.close()


def hot_rows(feed: Changefeed, db: str) -> int:
    return table_rows(feed, db, "hot")


def indexes(feed: Changefeed, db: str, table: str) -> list[str]:
    return sorted(set(catalogue(feed, "INDEX_NAME", "STATISTICS", db, table)))


def columns(feed: Changefeed, db: str, table: str) -> list[str]:
    return catalogue(feed, "COLUMN_NAME", "COLUMNS", db, table)


def catalogue(feed: Changefeed, column: str, view: str, db: str, table: str) -> list[str]:
    """One column of an information_schema view for a table, in the view's order."""
    conn = feed.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT {column} FROM information_schema.{view} WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME = %s ORDER BY " + ("ORDINAL_POSITION" if view == "COLUMNS" else "1"),
                (db, table),
            )
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def online_rows(feed: Changefeed) -> list[tuple]:
    return feed.checkpoint_rows("SELECT commit_ts, query FROM {schema}.ddl_online WHERE changefeed=%s")


def status_json(feed: Changefeed) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "applier", "status", "--json", "--downstream", feed.downstream,
         "--group-id", feed.group_id, "--checkpoint-schema", feed.checkpoint_schema],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_the_other_table_goes_on_while_an_index_builds_and_a_later_ddl_of_its_table_waits(
    feed: Changefeed, mariadb_params: dict
) -> None:
    script, db = setup(feed)
    proc = None
    with holding(mariadb_params, db, "big") as holder:
        first = len(script.steps)
        add_ts = script.ddl(db, "big", 7, ADD_I)
        for i in range(1, 6):
            script.rows(db, "hot", insert=[{"a": i, "b": i}])
        script.produce(feed.bootstrap, feed.topic, first)
        proc = feed.start()
        try:
            # The rows after the DDL are applied while it waits, and the checkpoint passes it.
            wait_until(lambda: hot_rows(feed, db) == 6, 60, "hot's rows after the held DDL", proc)
            assert indexes(feed, db, "big") == ["PRIMARY"]
            assert online_rows(feed) == [(add_ts, ADD_I)]
            assert feed.checkpoint()[0] > add_ts
            report = status_json(feed)
            assert [(d["commit_ts"], d["query"]) for d in report["ddls_online"]] == [(add_ts, ADD_I)]
            assert report["ddl_in_progress"] is None
            # A second DDL of the same table waits for the first: the rows after it wait too.
            second = len(script.steps)
            script.ddl(db, "big", 8, "DROP INDEX ib ON big")
            script.rows(db, "hot", insert=[{"a": 100, "b": 100}])
            script.ddl(db, "big", 7, "CREATE INDEX ib2 ON big (b, a)")
            script.rows(db, "hot", insert=[{"a": 101, "b": 101}])
            script.produce(feed.bootstrap, feed.topic, second)
            time.sleep(2.0)
            assert hot_rows(feed, db) == 6
            holder.rollback()
            wait_until(lambda: hot_rows(feed, db) == 8, 60, "the rows after the later DDLs", proc)
            wait_until(lambda: not online_rows(feed), 60, "every DDL beside the stream finished", proc)
            assert indexes(feed, db, "big") == ["PRIMARY", "ib2"]
        finally:
            stop(proc, signal.SIGTERM)
    log = read_log(proc)
    assert log.count("DDL applied beside the stream") == 3, log
    assert "Traceback" not in log


def test_a_stop_and_a_kill_during_a_build_leave_the_index_built_once(
    feed: Changefeed, mariadb_params: dict
) -> None:
    script, db = setup(feed)
    with holding(mariadb_params, db, "big") as holder:
        first = len(script.steps)
        add_ts = script.ddl(db, "big", 7, ADD_I)
        script.rows(db, "hot", insert=[{"a": 1, "b": 1}])
        script.produce(feed.bootstrap, feed.topic, first)
        proc = feed.start()
        try:
            wait_until(lambda: hot_rows(feed, db) == 2, 60, "hot's row after the held DDL", proc)
            # SIGTERM: the waiting DDL is killed on the server, its journal row stays.
            asked = time.monotonic()
            stop(proc, signal.SIGTERM)
            assert proc.returncode == 0, read_log(proc)
            assert time.monotonic() - asked < 10
            assert online_rows(feed) == [(add_ts, ADD_I)]
            # The next start runs it again beside the stream; SIGKILL leaves its statement waiting
            # on the server, so two builds of the same index meet once the lock is released.
            proc = feed.start()
            wait_for_output(proc, "DDL started beside the stream", 60)
            time.sleep(0.5)
        finally:
            stop(proc, signal.SIGKILL)
        holder.rollback()
    more = len(script.steps)
    script.rows(db, "hot", insert=[{"a": 2, "b": 2}])
    script.ddl(db, "hot", 7, "CREATE INDEX hb ON hot (b)")
    script.ddl(db, "hot", 4, "DROP TABLE hot")  # waits for the index DDL of its table
    script.produce(feed.bootstrap, feed.topic, more)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert indexes(feed, db, "big") == ["PRIMARY", "ib"]
    assert indexes(feed, db, "hot") == []
    assert not online_rows(feed)

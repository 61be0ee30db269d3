"""``applier status`` against the real checkpoint, with the daemon stopped and while it runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import pymysql
import pytest

from applier.codec.events import tso_physical_ms
from applier.kafka.embedded_broker import create_topic
from applier.simulator import StreamConfig, produce_simulation, simulate
from tests.integration.ddl_script import Script
from tests.integration.harness import Changefeed, read_log, stop
from tests.integration.ops_support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def feed(feed: Changefeed) -> Changefeed:
    """The suite's changefeed, its daemon without the HTTP listener: these tests do not probe it."""
    feed.extra_args += ["--http-listen", "off"]
    return feed


def status(feed: Changefeed, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "applier",
            "status",
            "--downstream",
            feed.downstream,
            "--group-id",
            feed.group_id,
            "--checkpoint-schema",
            feed.checkpoint_schema,
            *more,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def wall(ts: int) -> str:
    return datetime.fromtimestamp(tso_physical_ms(ts) / 1000, tz=UTC).isoformat(timespec="milliseconds")[:23]


def test_status_text_and_json_when_stopped_and_while_running(feed: Changefeed) -> None:
    missing = status(feed)
    assert missing.returncode == 1
    assert "no checkpoint" in missing.stdout

    sim = simulate(StreamConfig(seed=31, partitions=3, transactions=120, schema=feed.new_schema()))
    produce_simulation(feed.bootstrap, feed.topic, sim)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stderr
    resolved, offsets = feed.checkpoint()

    # Stopped: JSON for scripts.
    out = status(feed, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["found"] is True and doc["running"] is False and doc["active_instance"] is None
    assert doc["changefeed"] == feed.group_id and doc["topic"] == feed.topic
    assert doc["resolved_ts"] == resolved == sim.final_resolved_ts
    assert doc["resolved_time"].startswith(wall(resolved))
    assert doc["lag_seconds"] > 0
    assert {p["partition"]: p["next_offset"] for p in doc["partitions"]} == offsets
    tables = {(t["schema"], t["table"]) for t in doc["tables"]}
    assert {t for t in tables if t[0] == sim.schema}, tables
    for t in doc["tables"]:
        assert t["effective_ts"] >= resolved and t["checkpoint_time"].startswith(wall(t["effective_ts"]))
    assert doc["applied_ddls"] >= 1 and doc["last_ddl"]["commit_ts"] > 0
    assert doc["downstream"] == feed.downstream

    # Stopped: text for people.
    out = status(feed)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "active instance: none (stopped)" in text
    assert f"resolved ts:     {resolved}  {wall(resolved)}" in text
    for p, offset in offsets.items():
        assert any(line.split()[:2] == [str(p), str(offset)] for line in text.splitlines()), text
    for t in doc["tables"]:
        assert f"{t['schema']}.{t['table']}" in text

    # Running: the same checkpoint, and the active instance is named.
    proc = feed.start()
    try:
        running = wait_until(
            lambda: (d := json.loads(status(feed, "--json").stdout))["running"] and d,
            30,
            "status to see the running daemon",
            proc,
        )
        assert running["active_instance"]["connection_id"] > 0
        assert running["resolved_ts"] == resolved
        text = status(feed).stdout
        assert "active instance: yes (database connection" in text
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0


def test_status_of_an_unreachable_database_is_one_clear_line(feed: Changefeed) -> None:
    feed.downstream = "mysql://root:hunter2-status@127.0.0.1:1/"
    out = status(feed)
    assert out.returncode == 2
    assert out.stderr.startswith("applier status: cannot reach the downstream database")
    assert "hunter2-status" not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr


COLUMN_DDL = "ALTER TABLE t ADD COLUMN c BIGINT"


def test_a_ddl_that_waits_shows_as_in_progress_until_it_is_recorded(feed: Changefeed, mariadb_params) -> None:
    """A column DDL held back by another session's metadata lock: ``status`` shows it in
    progress (statement, started, elapsed) while it waits, and as the last DDL once it ran."""
    db = feed.new_schema("inprogress")
    script = Script(partitions=1)
    script.ddl(db, "", 1, f"CREATE DATABASE `{db}`")
    script.ddl(db, "t", 3, "CREATE TABLE t (a BIGINT PRIMARY KEY, b BIGINT)")
    script.rows(db, "t", insert=[{"a": 1, "b": 10}])
    create_topic(feed.bootstrap, feed.topic, 1)
    script.produce(feed.bootstrap, feed.topic)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    holder = pymysql.connect(**mariadb_params, autocommit=False)
    proc = None
    try:
        with holder.cursor() as cur:
            cur.execute(f"SELECT * FROM `{db}`.t")  # holds a metadata lock until the rollback
        first = len(script.steps)
        script.ddl(db, "t", 5, COLUMN_DDL)
        script.produce(feed.bootstrap, feed.topic, first)
        proc = feed.start()

        def in_progress() -> dict | None:
            out = status(feed, "--json")
            return json.loads(out.stdout).get("ddl_in_progress") if out.returncode == 0 else None

        wait_until(lambda: in_progress() is not None, 60, "the DDL journaled", proc)
        time.sleep(1.2)
        doc = json.loads(status(feed, "--json").stdout)
        pending = doc["ddl_in_progress"]
        assert pending["query"] == COLUMN_DDL and pending["table"] == "t"
        assert pending["elapsed_seconds"] >= 1.0 and pending["started_at"].endswith("Z")
        text = status(feed).stdout
        assert f"DDL in progress: {pending['commit_ts']} {db}.t: {COLUMN_DDL}; started" in text
        holder.rollback()
        wait_until(lambda: in_progress() is None, 60, "the DDL recorded", proc)
        assert json.loads(status(feed, "--json").stdout)["last_ddl"]["query"] == COLUMN_DDL
        log = read_log(proc)
        assert "DDL started" in log and "DDL applied" in log, log
    finally:
        holder.close()
        if proc is not None:
            stop(proc, signal.SIGTERM)

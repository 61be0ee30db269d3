"""The daemon's statements against other sessions' locks: reported, stopped on SIGTERM, never silent.

Each test applies the first part of a simulated stream, then takes a lock from a test session and
lets the daemon run into it with the rest: a row lock (``SELECT ... FOR UPDATE``), a metadata lock
(an open transaction that read the table a DDL alters), a storm of transient errors. And the
other way round: an idle daemon holds no lock that a DDL of someone else would wait for.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pymysql
import pytest

from applier.downstream.lock import lock_name
from applier.simulator import Simulation, StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from checkpoint.schema import TABLES
from tests.integration.harness import Changefeed, DatabaseUser, read_log, stop, wait_for_output
from tests.integration.ops_support import http_base, http_get, scrape, value, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 2


def _first_part_applied(feed: Changefeed, sim: Simulation, cut: int) -> None:
    """Produce ``sim.records[:cut]`` and apply it (the daemon exits once caught up)."""
    ensure_topic(feed.bootstrap, feed.topic, PARTITIONS)
    produce_records(feed.bootstrap, feed.topic, sim.records[:cut])
    done = feed.run_to_end(timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _half_applied_rows_locked(
    feed: Changefeed, seed: int
) -> tuple[Simulation, int, int, pymysql.connections.Connection]:
    """A stream of rows only, its first half applied, every row of its schema locked by a test
    session: returns the simulation, where its second half starts, the session and its id."""
    schema = feed.new_schema()
    sim = simulate(
        StreamConfig(
            seed=seed,
            partitions=PARTITIONS,
            transactions=200,
            schema=schema,
            ddl_mid_stream=False,
            index_ddls=False,
        )
    )
    cut = len(sim.records) // 2
    _first_part_applied(feed, sim, cut)
    holder, holder_id = _lock_every_row(feed, schema)
    return sim, cut, holder_id, holder


def _session(feed: Changefeed) -> tuple[pymysql.connections.Connection, int]:
    conn = pymysql.connect(**feed.mariadb_params, charset="utf8mb4", autocommit=False)
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cur.execute("SELECT CONNECTION_ID()")
        return conn, int(cur.fetchone()[0])


def _lock_every_row(feed: Changefeed, schema: str) -> tuple[pymysql.connections.Connection, int]:
    """A session holding a row lock on every row of ``schema`` (its transaction stays open)."""
    conn, conn_id = _session(feed)
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (schema,))
        tables = [r[0] for r in cur.fetchall()]
        assert tables
        cur.execute("BEGIN")
        for table in tables:
            cur.execute(f"SELECT * FROM `{schema}`.`{table}` FOR UPDATE")
    return conn, conn_id


def _caught_up(feed: Changefeed, sim: Simulation) -> bool:
    try:
        return feed.checkpoint()[0] >= sim.final_resolved_ts
    except pymysql.err.ProgrammingError:  # the daemon has not created the checkpoint tables yet
        return False


def _not_ready(base: str) -> dict | None:
    """The body of /readyz when it answers 503 (for wait_until)."""
    status, body = http_get(base + "/readyz")
    return json.loads(body) if status == 503 else None


def _recovers(feed: Changefeed, sim: Simulation, proc: subprocess.Popen, says: str, gauge: str) -> None:
    """Once the test lets go, the daemon ``says`` so, applies the rest of the stream and is ready again,
    its ``gauge`` of the trouble back at 0: the trouble left nothing behind."""
    base = http_base(proc)
    wait_for_output(proc, says, timeout=30)
    wait_until(lambda: _caught_up(feed, sim), 60, "the end of the stream", proc)
    wait_until(lambda: http_get(base + "/readyz")[0] == 200, 20, "/readyz 200 again", proc)
    assert value(scrape(base), gauge) == 0


def _log_lines(proc, needle: str) -> list[dict]:
    return [json.loads(line) for line in read_log(proc).splitlines() if needle in line]


def _sigterm_stops_within_10_s_and_keeps_the_checkpoint(feed: Changefeed, proc: subprocess.Popen) -> str:
    """SIGTERM while the window in flight waits on a lock; returns the daemon's log."""
    before = feed.checkpoint()  # the window in flight waits: nothing commits now
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=15)
    took = time.monotonic() - started
    log = read_log(proc)
    assert code == 0, log
    assert took < 10, f"stopped after {took:.1f} s"
    assert "killing its statement" in log and "fatal" not in log
    assert feed.checkpoint() == before  # the window was rolled back with its checkpoint
    return log


def _sigterm_while_the_rest_waits_on_a_lock(
    feed: Changefeed, sim: Simulation, cut: int, session: pymysql.connections.Connection, lock: str
) -> list[dict]:
    """Start the daemon on ``sim.records[cut:]``, wait until its statement waits on the ``lock`` lock
    that ``session`` holds, then stop it with SIGTERM (see the helper above); once the session lets go,
    a daemon run to the end still applies the whole stream. Returns the daemon's log lines about the
    wait, as they stood before the SIGTERM."""
    proc = None
    try:
        produce_records(feed.bootstrap, feed.topic, sim.records[cut:])
        proc = feed.start("--log-format", "json", "--http-listen", "off")
        needle = f"statement waits on a {lock} lock"
        wait_for_output(proc, needle, timeout=60)
        waits = _log_lines(proc, needle)
        _sigterm_stops_within_10_s_and_keeps_the_checkpoint(feed, proc)
    finally:
        session.rollback()
        session.close()
        if proc is not None:
            stop(proc)
    done = feed.run_to_end(timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []
    return waits


def test_sigterm_while_a_window_waits_on_a_row_lock_exits_zero_within_10_s(feed: Changefeed) -> None:
    sim, cut, holder_id, holder = _half_applied_rows_locked(feed, seed=61)
    # The watch names the session holding the lock, once.
    (line,) = _sigterm_while_the_rest_waits_on_a_lock(feed, sim, cut, holder, "row")
    assert f"blocked by session {holder_id} (" in line["event"], line
    assert "idle in an open transaction" in line["event"]
    assert line["statement"].startswith("rows of the window up to ts ")


def _applied_up_to_the_alter_table_read(
    feed: Changefeed, seed: int
) -> tuple[Simulation, int, pymysql.connections.Connection, int]:
    """The stream applied up to its ALTER TABLE, whose table a test session has read in a
    transaction that stays open (it keeps a metadata lock on the table until it ends): returns the
    simulation, where the ALTER starts, the session and its id."""
    schema = feed.new_schema()
    sim = simulate(StreamConfig(seed=seed, partitions=PARTITIONS, transactions=160, schema=schema))
    cut, alter = next(
        (i, ev)
        for i, rec in enumerate(sim.records)
        for ev in rec.events
        if ev.kind == "ddl" and (ev.ddl_query or "").startswith("ALTER")
    )
    _first_part_applied(feed, sim, cut)
    reader, reader_id = _session(feed)
    with reader.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"SELECT * FROM `{schema}`.`{alter.table}` LIMIT 1")
    return sim, cut, reader, reader_id


def test_a_ddl_waiting_on_a_metadata_lock_is_reported_then_applied(feed: Changefeed) -> None:
    sim, cut, reader, reader_id = _applied_up_to_the_alter_table_read(feed, seed=62)
    proc = None
    try:
        produce_records(feed.bootstrap, feed.topic, sim.records[cut:])
        proc = feed.start("--log-format", "json", "--http-listen", "127.0.0.1:0", "--stall-seconds", "3")
        base = http_base(proc)
        wait_for_output(proc, "statement waits on a metadata lock", timeout=60)
        (line,) = _log_lines(proc, "statement waits on a metadata lock")
        # MariaDB without the metadata_lock_info plugin: the sessions with an open transaction
        # (other clients of the test server among them) are the candidates.
        assert "likely blocked by one of: " in line["event"] and f"session {reader_id} (" in line["event"], (
            line
        )
        assert line["state"] == "Waiting for table metadata lock"
        assert line["statement"].startswith("DDL at ts ") and "ALTER TABLE" in line["statement"]
        answer = wait_until(lambda: _not_ready(base), 20, "/readyz 503", proc)
        assert answer["status"] == "waiting on a lock", answer
        assert f"session {reader_id} (" in answer["reason"] and "metadata lock" in answer["reason"]
        samples = scrape(base)
        assert value(samples, "applier_lock_waits_total", kind="metadata") == 1
        assert (value(samples, "applier_lock_wait_seconds") or 0) > 3
        assert proc.poll() is None
        reader.commit()  # the DDL goes on
        _recovers(feed, sim, proc, "statement no longer waits on a lock", "applier_lock_wait_seconds")
    finally:
        reader.rollback()
        reader.close()
        if proc is not None:
            stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)
    assert len(_log_lines(proc, "statement waits on a")) == 1
    assert feed.compare(sim, sim.final_resolved_ts) == []


def test_a_storm_of_transient_errors_is_logged_by_class_reported_and_ridden_out(
    own_user_feed: Changefeed, own_user: DatabaseUser
) -> None:
    """Applied by a database user of its own, so that the storm kills only the daemon's sessions."""
    feed = own_user_feed
    sim, cut, _, holder = _half_applied_rows_locked(feed, seed=63)
    admin = feed.connect()
    stop_killing = threading.Event()
    kills = 0

    def kill_the_waiting_statements() -> None:
        # Every statement of the daemon that waits on the held rows loses its connection: each
        # replay fails again (lost connection), with no success, until the storm ends.
        nonlocal kills
        lock = lock_name(feed.checkpoint_schema, feed.group_id)
        while not stop_killing.wait(0.2):
            with admin.cursor() as cur:
                cur.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s AND COMMAND = 'Query' "
                    "AND ID <> IFNULL(IS_USED_LOCK(%s), 0)",
                    (own_user.name, lock),
                )
                for (conn_id,) in cur.fetchall():
                    try:
                        cur.execute(f"KILL {int(conn_id)}")
                        kills += 1
                    except pymysql.err.OperationalError:
                        pass  # ended meanwhile

    killer = threading.Thread(target=kill_the_waiting_statements, daemon=True)
    proc = None
    try:
        produce_records(feed.bootstrap, feed.topic, sim.records[cut:])
        proc = feed.start(
            "--log-format", "json", "--http-listen", "127.0.0.1:0", "--retry-report-seconds", "3"
        )
        base = http_base(proc)
        wait_for_output(proc, '"started"', timeout=30)  # start-up is not retried: not killed either
        killer.start()
        answer = wait_until(
            lambda: (lambda a: a if a and a["status"] == "retrying" else None)(_not_ready(base)),
            30,
            "/readyz 503 retrying",
            proc,
        )
        assert answer["reason"].startswith("no downstream transaction committed for ")
        assert "connection=" in answer["reason"] and answer["failing_for_seconds"] >= 3
        time.sleep(3)  # a few more replays, each killed
        samples = scrape(base)
        retries = value(samples, "applier_downstream_retries_total", **{"class": "connection"}) or 0
        assert retries >= 3, samples
        assert (value(samples, "applier_downstream_failing_seconds") or 0) >= 3
        stop_killing.set()
        killer.join()
        holder.rollback()
        _recovers(feed, sim, proc, "downstream recovered", "applier_downstream_failing_seconds")
    finally:
        stop_killing.set()
        holder.rollback()
        holder.close()
        admin.close()
        if proc is not None:
            stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)
    assert kills >= 3
    # One line for the first error of the class, a line when it became a report (and at most a
    # summary every 30 s), one when it was over: not one per replay.
    first = _log_lines(proc, "transient downstream error, replaying the transaction")
    assert [line["error_class"] for line in first] == ["connection"], first
    assert len(_log_lines(proc, "downstream still failing")) <= 2
    assert len(_log_lines(proc, "downstream recovered")) == 1
    assert feed.compare(sim, sim.final_resolved_ts) == []


def test_an_idle_daemon_holds_no_lock_a_ddl_would_wait_for(feed: Changefeed) -> None:
    schema = feed.new_schema()
    sim = simulate(
        StreamConfig(
            seed=64,
            partitions=PARTITIONS,
            transactions=60,
            schema=schema,
            ddl_mid_stream=False,
            index_ddls=False,
        )
    )
    ensure_topic(feed.bootstrap, feed.topic, PARTITIONS)
    produce_records(feed.bootstrap, feed.topic, sim.records)
    proc = feed.start("--log-format", "json", "--http-listen", "off")
    ddl = feed.connect()
    try:
        wait_until(lambda: _caught_up(feed, sim), 60, "the end of the stream", proc)
        time.sleep(1.0)  # idle between windows: every session of the daemon is open, none works
        with ddl.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 2")
            cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (schema,))
            replicated = [r[0] for r in cur.fetchall()]
            targets = [(feed.checkpoint_schema, t) for t in TABLES] + [(schema, t) for t in replicated]
            for db, table in targets:
                started = time.monotonic()
                cur.execute(f"ALTER TABLE `{db}`.`{table}` COMMENT = 'metadata lock probe'")
                assert time.monotonic() - started < 1.5, f"ALTER TABLE {db}.{table} waited"
        assert proc.poll() is None, read_log(proc)
    finally:
        ddl.close()
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0
    assert "fatal" not in read_log(proc)


def test_sigterm_while_a_ddl_waits_on_a_metadata_lock_exits_zero_within_10_s(feed: Changefeed) -> None:
    """The DDL runs on the single-active lock's session: killing it for the stop is no lost lock."""
    sim, cut, reader, _ = _applied_up_to_the_alter_table_read(feed, seed=65)
    _sigterm_while_the_rest_waits_on_a_lock(feed, sim, cut, reader, "metadata")

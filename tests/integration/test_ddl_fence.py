"""Only the instance that holds the single-active lock runs a DDL.

A DDL commits on its own, so the checkpoint's owner fence cannot stop it: the lock session
checks, right before the DDL and on the same session, that it still holds the lock. Here the lock
is stolen (its session killed, another session takes it at once) from an instance that has not
noticed yet.
"""

from __future__ import annotations

import signal
import time
import uuid

import pymysql
import pytest

from applier.downstream.lock import ActiveLock, LockLost
from applier.downstream.url import DownstreamConfig
from applier.kafka.embedded_broker import create_topic
from tests.integration.ddl_script import Script
from tests.integration.harness import Changefeed, read_log, stop

pytestmark = pytest.mark.integration


def _steal(admin: pymysql.connections.Connection, name: str, victim: int) -> pymysql.connections.Connection:
    """Kill the lock's session and take the lock on a new session (returned: it holds the lock)."""
    thief = pymysql.connect(**admin._params, autocommit=True)  # type: ignore[attr-defined]
    with admin.cursor() as cur:
        cur.execute(f"KILL {int(victim)}")
    with thief.cursor() as cur:
        deadline = time.monotonic() + 10
        while True:
            cur.execute("SELECT GET_LOCK(%s, 1)", (name,))
            if cur.fetchone()[0] == 1:
                return thief
            assert time.monotonic() < deadline, "the killed session kept the lock"


def _admin(params: dict) -> pymysql.connections.Connection:
    conn = pymysql.connect(**params, autocommit=True)
    conn._params = params  # type: ignore[attr-defined]
    return conn


def test_a_lock_lost_unnoticed_runs_no_ddl(downstream_url: str, mariadb_params: dict, fresh_db: str) -> None:
    lock = ActiveLock(DownstreamConfig.from_url(downstream_url), schema=f"{fresh_db}_ck", changefeed="cf")
    admin = _admin(mariadb_params)
    assert lock.acquire()
    thief = None
    try:
        thief = _steal(admin, lock.name, lock.connection_id or 0)
        with pytest.raises(LockLost, match="not running a DDL"):
            lock.run_fenced([f"CREATE TABLE `{fresh_db}`.stolen (a INT)"])
        with admin.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'stolen'",
                (fresh_db,),
            )
            assert cur.fetchone()[0] == 0
        assert lock.lost
    finally:
        lock.release()
        if thief is not None:
            thief.close()
        admin.close()


def test_two_daemons_and_a_stolen_lock(broker, ddl_downstream_url: str, mariadb_params: dict) -> None:
    downstream_url = ddl_downstream_url
    db = f"fence_{uuid.uuid4().hex[:8]}"
    topic = f"cdc_{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 2)
    cf = Changefeed(broker.bootstrap, topic, downstream_url, mariadb_params)
    cf.schemas.append(db)
    s = Script(partitions=2)
    s.ddl(db, "", 1, f"CREATE DATABASE `{db}`")
    s.ddl(db, "t", 3, "CREATE TABLE t (a BIGINT PRIMARY KEY, b BIGINT)")
    s.rows(db, "t", insert=[{"a": 1, "b": 1}])
    s.ddl(db, "t", 5, "ALTER TABLE t ADD COLUMN c BIGINT")
    s.rows(db, "t", insert=[{"a": 2, "b": 2, "c": 2}])
    admin = _admin(mariadb_params)
    first = second = thief = None
    try:
        s.produce(cf.bootstrap, cf.topic, 0, 3)
        first = cf.start()

        def applied() -> bool:
            try:
                with admin.cursor() as cur:
                    cur.execute(f"SELECT COUNT(*) FROM `{db}`.t")
                    return cur.fetchone()[0] == 1 and cf.checkpoint()[0] > 0
            except pymysql.err.ProgrammingError:
                return False

        _wait(applied)
        with admin.cursor() as cur:
            cur.execute(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = (SELECT IS_USED_LOCK(%s))",
                (_lock_name(cf),),
            )
            (victim,) = cur.fetchone()
        thief = _steal(admin, _lock_name(cf), victim)
        s.produce(cf.bootstrap, cf.topic, 3)  # the DDL arrives at the instance that lost the lock
        assert first.wait(timeout=30) == 1, read_log(first)
        assert "LockLost" in read_log(first)
        with admin.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = %s AND COLUMN_NAME = 'c'",
                (db,),
            )
            assert cur.fetchone()[0] == 0, "the stale instance ran the DDL"
        second = cf.start()
        thief.close()  # the lock is free: the second instance takes it, runs the DDL, applies the rest
        thief = None

        def converged() -> bool:
            with admin.cursor() as cur:
                cur.execute(f"SELECT COUNT(*) FROM `{db}`.t WHERE c = 2")
                try:
                    return cur.fetchone()[0] == 1
                except pymysql.err.MySQLError:
                    return False

        _wait(lambda: _safe(converged))
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                stop(proc, signal.SIGTERM)
        if thief is not None:
            thief.close()
        admin.close()
        cf.drop()


def _safe(check) -> bool:
    try:
        return check()
    except pymysql.err.MySQLError:
        return False


def _wait(check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _lock_name(cf: Changefeed) -> str:
    from applier.downstream.lock import lock_name

    return lock_name(cf.checkpoint_schema, cf.group_id)

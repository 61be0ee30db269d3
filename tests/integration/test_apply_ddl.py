"""The DDL executor against the real MariaDB: journal, catalogue fingerprints, "already there".

An error that usually means "already applied" is accepted only when the catalogue shows the DDL's
effect: a pre-existing table of another shape makes ``CREATE TABLE`` fail for good.
"""

from __future__ import annotations

import pymysql
import pytest

from applier.apply.catalogue import Catalogue
from applier.apply.ddl import DDLExecutor, DDLFailed, touched_schemas
from applier.codec.events import DDLEvent
from applier.downstream.lock import ActiveLock
from applier.downstream.session import connect
from applier.downstream.url import DownstreamConfig
from checkpoint import CheckpointStore
from sqlgen import MARIADB
from tests.builders import ddl_event

pytestmark = pytest.mark.integration


@pytest.fixture
def env(fresh_db: str, downstream_url: str, mariadb_params: dict):
    cfg = DownstreamConfig.from_url(downstream_url)
    store = CheckpointStore(f"{fresh_db}_ck", "cf")
    conn = connect(cfg)
    store.ensure_schema(conn)
    lock = ActiveLock(cfg, schema=store.schema, changefeed="cf")
    assert lock.acquire()
    store.claim(conn, lock.owner_token)
    executor = DDLExecutor(store, MARIADB, lock, owner=lock.owner_token)
    admin = pymysql.connect(**mariadb_params, database=fresh_db, autocommit=True)
    try:
        yield fresh_db, conn, executor, admin, store
    finally:
        lock.release()
        conn.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{store.schema}`")
        admin.close()


def _run(executor: DDLExecutor, conn, ddl: DDLEvent) -> str:
    return executor.apply(conn, ddl, lambda cur: None).note


def test_create_table_over_a_table_of_the_same_columns_is_accepted(env) -> None:
    db, conn, executor, admin, store = env
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE t (a INT PRIMARY KEY, b INT)")
    note = _run(
        executor,
        conn,
        ddl_event(100, "CREATE TABLE t (a INT PRIMARY KEY, b INT)", "t", schema=db, ddl_type=3),
    )
    assert note.startswith("already present")
    with conn.cursor() as cur:
        assert store.ddl_recorded(cur, 100, "CREATE TABLE t (a INT PRIMARY KEY, b INT)")
        assert store.pending_ddl(cur) is None
    conn.rollback()


def test_create_table_over_a_table_of_another_shape_fails(env) -> None:
    db, conn, executor, admin, _ = env
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE t (a INT PRIMARY KEY, c INT)")
    with pytest.raises(DDLFailed, match="catalogue does not show"):
        _run(
            executor,
            conn,
            ddl_event(100, "CREATE TABLE t (a INT PRIMARY KEY, b INT)", "t", schema=db, ddl_type=3),
        )


@pytest.mark.parametrize(
    ("setup", "query", "ddl_type", "accepted"),
    [
        ("CREATE TABLE t (a INT PRIMARY KEY, b INT)", "ALTER TABLE t ADD COLUMN b INT", 5, True),
        (
            "CREATE TABLE t (a INT PRIMARY KEY, b INT)",
            "ALTER TABLE t ADD COLUMN b INT, ADD COLUMN c INT",
            5,
            False,
        ),
        ("CREATE TABLE t (a INT PRIMARY KEY)", "ALTER TABLE t DROP COLUMN b", 6, True),
        ("CREATE TABLE t (a INT PRIMARY KEY, b INT, KEY i (b))", "ALTER TABLE t ADD INDEX i (b)", 7, True),
        ("CREATE TABLE t (a INT PRIMARY KEY)", "DROP TABLE missing", 4, True),
    ],
)
def test_already_there_needs_the_catalogue(env, setup, query, ddl_type, accepted) -> None:
    db, conn, executor, admin, _ = env
    with admin.cursor() as cur:
        cur.execute(setup)
    if accepted:
        assert _run(executor, conn, ddl_event(100, query, "t", schema=db, ddl_type=ddl_type)).startswith(
            "already present"
        )
    else:
        with pytest.raises(DDLFailed):
            _run(executor, conn, ddl_event(100, query, "t", schema=db, ddl_type=ddl_type))


def test_fingerprint_sees_truncate_and_exchange(env) -> None:
    db, conn, _, admin, _ = env
    with admin.cursor() as cur:
        cur.execute(
            "CREATE TABLE p (a INT PRIMARY KEY) PARTITION BY RANGE (a) "
            "(PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN (20))"
        )
        cur.execute("CREATE TABLE n (a INT PRIMARY KEY)")
    cat = Catalogue(MARIADB)
    before = cat.fingerprint(conn, [db])
    assert before.identity
    assert before.changes(cat.fingerprint(conn, [db])) == []
    with admin.cursor() as cur:
        cur.execute("ALTER TABLE p EXCHANGE PARTITION p1 WITH TABLE n")
    swapped = cat.fingerprint(conn, [db])
    assert before.changes(swapped) == [f"{db}: data (table or partition ids)"]
    with admin.cursor() as cur:
        cur.execute("TRUNCATE TABLE n")
    assert swapped.changes(cat.fingerprint(conn, [db])) != []


def test_a_journaled_ddl_that_did_not_run_runs_on_retry(env) -> None:
    db, conn, executor, admin, store = env
    ddl = ddl_event(100, "CREATE TABLE t (a INT PRIMARY KEY)", "t", schema=db, ddl_type=3)
    fp = Catalogue(MARIADB).fingerprint(conn, touched_schemas(ddl))
    with conn.cursor() as cur:
        store.begin_ddl(
            cur, commit_ts=100, schema=db, table="t", ddl_type=3, query=ddl.query, catalogue=fp.to_json()
        )
    conn.commit()
    assert _run(executor, conn, ddl) == ""  # unchanged catalogue: it runs now
    with admin.cursor() as cur:
        cur.execute("SHOW TABLES")
        assert cur.fetchall() == (("t",),)


def test_touched_schemas() -> None:
    assert touched_schemas(ddl_event(100, "RENAME TABLE t TO `b``x`.t2", "t", schema="a", ddl_type=14)) == {
        "a",
        "b`x",
    }
    assert touched_schemas(
        ddl_event(100, "ALTER TABLE t EXCHANGE PARTITION p WITH TABLE o.n", "t", schema="a", ddl_type=42)
    ) == {
        "a",
        "o",
    }
    assert touched_schemas(ddl_event(100, "CREATE DATABASE a", "", schema="a", ddl_type=1)) == {"a"}

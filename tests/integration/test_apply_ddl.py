"""The DDL executor against the real MariaDB: journal, catalogue fingerprints, "already there".

An error that usually means "already applied" is accepted only when the catalogue shows the DDL's
effect: a pre-existing table of another shape makes ``CREATE TABLE`` fail for good.
"""

from __future__ import annotations

import json

import pymysql
import pytest

from applier.apply.catalogue import Catalogue, Fingerprint, Scope
from applier.apply.ddl import Bookkeeping, DDLExecutor, DDLFailed, touched
from applier.codec.events import DDLEvent
from applier.downstream.lock import ActiveLock
from applier.downstream.session import connect
from applier.downstream.url import DownstreamConfig
from checkpoint import CheckpointStore, ProgressWrite
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
    nothing = Bookkeeping(progress=lambda cur: ProgressWrite([], None, "cf"), before_commit=lambda: None)
    return executor.apply(conn, ddl, nothing).note


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
    for scope in (Scope({db: None}, ids=True), Scope({db: frozenset({"p", "n"})}, ids=True)):
        before = cat.fingerprint(conn, scope)
        assert before.identity
        assert before.changes(cat.fingerprint(conn, scope)) == []
        with admin.cursor() as cur:
            cur.execute("ALTER TABLE p EXCHANGE PARTITION p1 WITH TABLE n")
        swapped = cat.fingerprint(conn, scope)
        assert before.changes(swapped) == [f"{db}: data (table or partition ids)"]
        with admin.cursor() as cur:
            cur.execute("TRUNCATE TABLE n")
        assert swapped.changes(cat.fingerprint(conn, scope)) != []


def test_a_fingerprint_of_a_truncate_sees_the_table_emptied(env) -> None:
    db, conn, _, admin, _ = env
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE t (a INT PRIMARY KEY)")
        cur.execute("INSERT INTO t VALUES (1)")
    cat = Catalogue(MARIADB)
    scope = Scope({db: frozenset({"t"})}, rows=True)
    before = Fingerprint.from_json(cat.fingerprint(conn, scope).to_json())
    assert before.scope() == scope and before.changes(cat.fingerprint(conn, scope)) == []
    with admin.cursor() as cur:
        cur.execute("TRUNCATE TABLE t")
    assert before.changes(cat.fingerprint(conn, scope)) == [f"{db}.t: emptied"]


def test_a_fingerprint_reads_only_the_tables_it_names(env) -> None:
    """A DDL's cost does not grow with its schema: the other tables are not read, and a named
    table that does not exist is recorded as absent (its creation is then a change)."""
    db, conn, _, admin, _ = env
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE t (a INT PRIMARY KEY)")
        cur.execute("CREATE TABLE other (a INT PRIMARY KEY)")
    cat = Catalogue(MARIADB)
    scope = Scope({db: frozenset({"t", "new"})})
    before = cat.fingerprint(conn, scope)
    assert set(before.schemas[db]["tables"]) == {"t"} and before.schemas[db]["ids"] == ""
    with admin.cursor() as cur:
        cur.execute("ALTER TABLE other ADD COLUMN b INT")
    assert before.changes(cat.fingerprint(conn, scope)) == []
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE new (a INT PRIMARY KEY)")
        cur.execute("ALTER TABLE t ADD INDEX ia (a)")
    after = Fingerprint.from_json(before.to_json())  # as the journal keeps it
    assert after.scope() == scope
    assert after.changes(cat.fingerprint(conn, after.scope())) == [
        f"{db}.new: created",
        f"{db}.t: definition",
    ]


def test_a_journal_row_of_whole_schemas_is_read_as_it_was_written(env) -> None:
    """A fingerprint journaled before scopes existed (whole schemas, ids): the same is read again."""
    db, conn, _, admin, _ = env
    with admin.cursor() as cur:
        cur.execute("CREATE TABLE t (a INT PRIMARY KEY)")
    old = Catalogue(MARIADB).fingerprint(conn, Scope({db: None}, ids=True))
    data = json.loads(old.to_json())
    del data["ids"]
    journaled = Fingerprint.from_json(json.dumps(data))
    assert journaled.scope() == Scope({db: None}, ids=True)
    with admin.cursor() as cur:
        cur.execute("TRUNCATE TABLE t")
    assert journaled.changes(Catalogue(MARIADB).fingerprint(conn, journaled.scope())) != []


def test_a_journaled_ddl_that_did_not_run_runs_on_retry(env) -> None:
    db, conn, executor, admin, store = env
    ddl = ddl_event(100, "CREATE TABLE t (a INT PRIMARY KEY)", "t", schema=db, ddl_type=3)
    fp = Catalogue(MARIADB).fingerprint(conn, touched(ddl))
    with conn.cursor() as cur:
        store.begin_ddl(
            cur, commit_ts=100, schema=db, table="t", ddl_type=3, query=ddl.query, catalogue=fp.to_json()
        )
    conn.commit()
    assert _run(executor, conn, ddl) == ""  # unchanged catalogue: it runs now
    with admin.cursor() as cur:
        cur.execute("SHOW TABLES")
        assert cur.fetchall() == (("t",),)


def test_touched_names_the_objects_a_ddl_may_change() -> None:
    def scope(query: str, table: str, schema: str, ddl_type: int) -> Scope:
        return touched(ddl_event(100, query, table, schema=schema, ddl_type=ddl_type))

    assert scope("RENAME TABLE t TO `b``x`.t2", "t", "a", 14) == Scope(
        {"a": frozenset({"t"}), "b`x": frozenset({"t2"})}
    )  # the definitions show it: t gone, t2 there
    assert scope("RENAME TABLE t TO x, u TO t, x TO u", "t", "a", 47).ids  # a swap: only ids show it
    assert scope("ALTER TABLE t EXCHANGE PARTITION p WITH TABLE o.n", "t", "a", 42) == Scope(
        {"a": frozenset({"t"}), "o": frozenset({"n"})}, ids=True
    )
    assert scope("CREATE DATABASE a", "", "a", 1) == Scope({"a": frozenset()})
    assert scope("ALTER TABLE t ADD INDEX i (c)", "t", "a", 7) == Scope({"a": frozenset({"t"})})
    assert scope("TRUNCATE TABLE t", "t", "a", 11) == Scope({"a": frozenset({"t"})}, rows=True)
    # a text the guard cannot read: whole schemas, every one the text qualifies a name with
    assert scope("GRANT ALL ON x.y TO u", "t", "a", 3) == Scope({"a": None, "x": None})

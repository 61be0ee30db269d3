"""A SIGKILL between a DDL and its bookkeeping, or while the DDL waits: the restart converges exactly.

The window is hit deterministically: after the rows before the DDL are applied, the test session
takes a locking read over the changefeed's ``applied_ddl`` range (REPEATABLE READ, so the gap is
locked too), then the DDL is produced. The daemon journals the DDL, runs it (its effect shows in
the catalogue) and blocks on recording it; then it is killed. A second form holds a metadata lock
on the table instead, so the DDL itself waits when the kill comes. The reference is the same
stream applied by a daemon that is never killed (and, in the crash run, partly replayed by the
producer); the crash run must end in exactly that state:
schemas, tables, columns in order, indexes, partitions and rows.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pymysql
import pytest

from applier.kafka.embedded_broker import create_topic
from tests.integration.ddl_script import Script, snapshot
from tests.integration.harness import Changefeed, read_log, stop

pytestmark = pytest.mark.integration

Check = Callable[[pymysql.cursors.Cursor], bool]


@dataclass
class Case:
    name: str
    build: Callable[[Script, str, str], int]  # writes the steps; returns the index of the DDL step
    took_effect: Callable[[str, str], tuple[str, tuple]]  # SQL + args whose first value is truthy
    hold_table: str | None = None  # for the "DDL waits on a metadata lock" form: the table to hold


def _base(s: Script, db: str) -> None:
    s.ddl(db, "", 1, f"CREATE DATABASE `{db}`")
    s.ddl(db, "a", 3, "CREATE TABLE a (a BIGINT PRIMARY KEY, b BIGINT, c BIGINT)")
    s.rows(db, "a", insert=[{"a": i, "b": i * 10, "c": i * 100} for i in range(1, 6)])
    s.rows(db, "a", update=[({"a": 2, "b": 20, "c": 200}, {"a": 2, "b": 21, "c": 201})], delete=[{"a": 5}])


def _one_ddl(table: str, ddl_type: int, query: str, row: dict) -> Callable[[Script, str, str], int]:
    """A build: the base, one DDL keyed to ``table``, then ``row`` inserted into ``table``."""

    def build(s: Script, db: str, db2: str) -> int:
        _base(s, db)
        s.ddl(db, table, ddl_type, query)
        s.rows(db, table, insert=[row])
        return len(s.steps) - 2

    return build


rename = _one_ddl("b", 14, "RENAME TABLE a TO b", {"a": 7, "b": 70, "c": 700})
truncate = _one_ddl("a", 11, "TRUNCATE TABLE a", {"a": 9, "b": 90, "c": 900})
add_column = _one_ddl(
    "a", 5, "ALTER TABLE a ADD COLUMN d BIGINT AFTER a", {"a": 6, "d": 66, "b": 60, "c": 600}
)


def drop_column(s: Script, db: str, db2: str) -> int:
    _base(s, db)
    s.ddl(db, "a", 6, "ALTER TABLE a DROP COLUMN c")
    s.rows(db, "a", insert=[{"a": 8, "b": 80}], update=[({"a": 1, "b": 10}, {"a": 1, "b": 11})])
    s.ddl(db, "a", 5, "ALTER TABLE a ADD COLUMN c BIGINT")  # the same name again, after the crash point
    s.rows(db, "a", insert=[{"a": 10, "b": 100, "c": 1000}])
    return len(s.steps) - 4


def drop_create(s: Script, db: str, db2: str) -> int:
    _base(s, db)
    s.ddl(db, "a", 4, "DROP TABLE a")
    s.ddl(db, "a", 3, "CREATE TABLE a (a BIGINT PRIMARY KEY, x BIGINT, y BIGINT, KEY kx (x))")
    s.rows(db, "a", insert=[{"a": 1, "x": 2, "y": 3}])
    return len(s.steps) - 2


def create_database(s: Script, db: str, db2: str) -> int:
    _base(s, db)
    s.ddl(db2, "", 1, f"CREATE DATABASE `{db2}`")
    s.ddl(db2, "t", 3, "CREATE TABLE t (a BIGINT PRIMARY KEY)")
    s.rows(db2, "t", insert=[{"a": 1}, {"a": 2}])
    return len(s.steps) - 3


def drop_database(s: Script, db: str, db2: str) -> int:
    _base(s, db)
    s.ddl(db2, "", 1, f"CREATE DATABASE `{db2}`")
    s.ddl(db2, "t", 3, "CREATE TABLE t (a BIGINT PRIMARY KEY)")
    s.rows(db2, "t", insert=[{"a": 1}])
    s.ddl(db2, "", 2, f"DROP DATABASE `{db2}`")
    s.rows(db, "a", insert=[{"a": 11, "b": 1, "c": 1}])
    return len(s.steps) - 2


def exchange(s: Script, db: str, db2: str) -> int:
    s.ddl(db, "", 1, f"CREATE DATABASE `{db}`")
    s.ddl(
        db,
        "p",
        3,
        "CREATE TABLE p (a BIGINT PRIMARY KEY, b BIGINT) PARTITION BY RANGE (a) "
        "(PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN (100))",
    )
    s.ddl(db, "n", 3, "CREATE TABLE n (a BIGINT PRIMARY KEY, b BIGINT)")
    s.rows(db, "p", insert=[{"a": i, "b": i} for i in (1, 2, 15, 20)])
    s.rows(db, "n", insert=[{"a": 50, "b": 5}, {"a": 60, "b": 6}])
    s.ddl(db, "p", 42, "ALTER TABLE p EXCHANGE PARTITION p1 WITH TABLE n")
    s.rows(db, "n", insert=[{"a": 70, "b": 7}], delete=[{"a": 15, "b": 15}])
    s.rows(db, "p", insert=[{"a": 30, "b": 3}], update=[({"a": 50, "b": 5}, {"a": 50, "b": 55})])
    return len(s.steps) - 3


def _exists(sql: str) -> Callable[[str, str], tuple[str, tuple]]:
    return lambda db, db2: (sql, (db,))


CASES = [
    Case("rename", rename, _exists(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA=%s AND TABLE_NAME='b'")),
    Case("truncate", truncate, lambda db, db2: (f"SELECT COUNT(*) = 0 FROM `{db}`.a", ())),
    Case("drop_column", drop_column, _exists(
        "SELECT COUNT(*) = 2 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND TABLE_NAME='a' "
        "")),
    Case("drop_create", drop_create, _exists(
        "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND COLUMN_NAME='x' "
        "")),
    Case("add_column", add_column, _exists(
        "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND COLUMN_NAME='d' "
        "")),
    Case("create_database", create_database, lambda db, db2: (
        "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME=%s", (db2,))),
    Case("drop_database", drop_database, lambda db, db2: (
        "SELECT COUNT(*) = 0 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME=%s", (db2,))),
    Case("exchange_partition", exchange, lambda db, db2: (f"SELECT COUNT(*) FROM `{db}`.n WHERE a = 15", ())),
    Case("add_column_waiting", add_column, _exists(
        "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s AND COLUMN_NAME='d' "
        ""), hold_table="a"),
    Case("exchange_partition_waiting", exchange, lambda db, db2: (
        f"SELECT COUNT(*) FROM `{db}`.n WHERE a = 15", ()), hold_table="n"),
]  # fmt: skip


def _wait(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _feed(broker, downstream_url: str, mariadb_params: dict) -> Changefeed:
    topic = f"cdc_{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 2)
    return Changefeed(broker.bootstrap, topic, downstream_url, mariadb_params)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kill_around_a_ddl_converges_exactly(case: Case, broker, ddl_downstream_url, mariadb_params) -> None:
    downstream_url = ddl_downstream_url
    db, db2 = f"ddlc_{uuid.uuid4().hex[:8]}", f"ddlc2_{uuid.uuid4().hex[:8]}"
    script = Script(partitions=2)
    at = case.build(script, db, db2)
    admin = pymysql.connect(**mariadb_params, autocommit=True)

    def drop_schemas() -> None:
        with admin.cursor() as cur:
            for s in (db, db2):
                cur.execute(f"DROP DATABASE IF EXISTS `{s}`")

    # The reference: the whole stream, no kill.
    ref = _feed(broker, downstream_url, mariadb_params)
    try:
        script.produce(ref.bootstrap, ref.topic)
        done = ref.run_to_end(timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        expected = snapshot(admin, [db, db2])
    finally:
        ref.drop()
        drop_schemas()
    assert expected[db] is not None

    cf = _feed(broker, downstream_url, mariadb_params)
    holder = pymysql.connect(**mariadb_params, autocommit=False)
    proc = None
    try:
        script.produce(cf.bootstrap, cf.topic, 0, at)
        proc = cf.start()
        _wait("the stream before the DDL", lambda: proc.poll() is None and _applied(cf, script, at))
        with holder.cursor() as cur:
            if case.hold_table is None:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute(
                    f"SELECT * FROM `{cf.checkpoint_schema}`.applied_ddl WHERE changefeed = %s FOR UPDATE",
                    (cf.group_id,),
                )
            else:
                cur.execute(f"SELECT * FROM `{db}`.`{case.hold_table}` LIMIT 1")  # a metadata lock
        # The producer re-sends the two steps before the DDL as well (a TiCDC restart replays from
        # its checkpoint): rows and DDLs already applied arrive again around the crash window.
        script.produce(cf.bootstrap, cf.topic, max(0, at - 2))
        sql, args = case.took_effect(db, db2)
        if case.hold_table is None:

            def effect() -> bool:
                with admin.cursor() as cur:
                    cur.execute(sql, args)
                    return bool(cur.fetchone()[0])

            _wait("the DDL's effect", effect)
        else:
            _wait("the DDL waiting on the metadata lock", lambda: _mdl_waiters(admin) > 0)
        time.sleep(0.3)
        assert proc.poll() is None, read_log(proc)
        stop(proc)
        holder.rollback()
        done = cf.run_to_end(timeout=120)
        log = done.stdout + done.stderr
        assert done.returncode == 0, log
        assert "a DDL was interrupted by a crash or a lost session" in log, log
        if case.hold_table is None:
            assert "it had taken effect, recorded as applied" in log, log
        assert snapshot(admin, [db, db2]) == expected
    finally:
        if proc is not None and proc.poll() is None:
            stop(proc)
        holder.close()
        cf.drop()
        drop_schemas()
        admin.close()


def _applied(cf: Changefeed, script: Script, upto: int) -> bool:
    """Whether the steps before ``upto`` are applied: every DDL recorded, the rows checkpointed."""
    kinds = [json.loads(step[0].key[16:]) for step in script.steps[:upto]]
    ddls = sum(1 for k in kinds if k["t"] == 2)
    rows_ts = max((k["ts"] for k in kinds if k["t"] == 1), default=0)
    try:
        recorded = cf.applied_ddls()
    except pymysql.err.ProgrammingError:  # the daemon has not created the checkpoint tables yet
        return False
    return recorded >= ddls and cf.checkpoint()[0] >= rows_ts


def _mdl_waiters(conn: pymysql.connections.Connection) -> int:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
            "WHERE STATE LIKE 'Waiting for table metadata lock%'"
        )
        return int(cur.fetchone()[0])

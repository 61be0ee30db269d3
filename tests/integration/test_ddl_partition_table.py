"""TiCDC's partition-table DDLs on the real MariaDB: guard, translation and execution in sequence.

The DDL statements are those of TiCDC's ``partition_table`` integration test (global unique
indexes, truncate/add/drop/reorganize partition, remove partitioning and partitioning again with
``UPDATE INDEXES``, exchange partition within a schema and across schemas, CREATE TABLE ... LIKE),
with the type code and key TiCDC gives each (docs/open-protocol.md §8.1; the first EXCHANGE
PARTITION keyed as the classic architecture does, the second as the new one). Each passes
:func:`sqlgen.ddl_guard.check_ddl`, is planned by :func:`sqlgen.ddl.plan_ddl` and run; the rows
between them are written directly, as the applier's row path would. The end state is the one
TiDB reaches, worked out by hand below.
"""

from __future__ import annotations

import uuid

import pymysql
import pytest

from applier.downstream.session import DEFAULT_SQL_MODE
from sqlgen import MARIADB, plan_ddl
from sqlgen.ddl_guard import check_ddl

pytestmark = pytest.mark.integration


def _vals(*rows: tuple[int, ...]) -> str:
    return ",".join("(" + ",".join(str(v) for v in r) + ")" for r in rows)


def _pairs(*keys: int) -> str:
    return _vals(*((k, k) for k in keys))


def _script(s1: str, s2: str) -> list[tuple[int, str, str, str] | str]:
    """(type, key schema, key table, DDL) or a DML string, in upstream order. ``s1``/``s2`` stand
    for the test's ``partition_table`` and ``partition_table2``."""
    ranges = (
        "(PARTITION p0 VALUES LESS THAN (6),PARTITION p1 VALUES LESS THAN (11),"
        "PARTITION p2 VALUES LESS THAN (21))"
    )
    return [
        (1, s1, "", f"create database `{s1}`"),
        (
            3,
            s1,
            "t",
            "create table t (a int, b varchar(255), primary key (a), unique key (b) global) "
            "partition by hash(a) partitions 5",
        ),
        f"insert into t values {_pairs(*range(1, 10))}",
        (23, s1, "t", "alter table t truncate partition p3"),
        "update t set a=a+10, b='12' where a=2",
        (
            3,
            s1,
            "t1",
            "create table t1 (a int primary key, b bigint, unique key (b) global) "
            f"PARTITION BY RANGE ( a ) {ranges}",
        ),
        f"insert into t1 (a) values {_vals(*((k,) for k in (*range(1, 10), 11, 12, 20)))}",
        "update t1 set b = a",
        (
            19,
            s1,
            "t1",
            "alter table t1 add partition "
            "(partition p3 values less than (30), partition p4 values less than (40))",
        ),
        f"insert into t1 values {_pairs(25, 29, 35)}",
        (23, s1, "t1", "alter table t1 truncate partition p0"),
        (20, s1, "t1", "alter table t1 drop partition p1"),
        f"insert into t1 values {_pairs(7, 8, 9)}",
        "update t1 set a=a+10, b=19 where a=9",
        (72, s1, "t", "alter table t remove partitioning"),
        f"insert into t values {_pairs(*range(20, 26))}",
        (71, s1, "t", "alter table t partition by hash (a) partitions 5 update indexes (b global)"),
        f"insert into t values {_pairs(*range(30, 36))}",
        (3, s1, "t1b", "create table t1b like t1"),
        (8, s1, "t1b", "alter table t1b drop index b"),
        "insert into t1b select * from t1",
        (3, s1, "t2", "create table t2 (a int primary key, b bigint)"),
        # classic architecture: keyed to the partitioned table
        (42, s1, "t1b", "ALTER TABLE t1b EXCHANGE PARTITION p3 WITH TABLE t2"),
        f"insert into t2 values {_pairs(*range(100, 106))}",
        f"insert into t1b values {_pairs(25, 29)}",
        (1, s2, "", f"create database `{s2}`"),
        (3, s2, "t2", f"create table `{s2}`.t2 (a int primary key, b bigint)"),
        # new architecture: keyed to the normal table, text rebuilt fully qualified
        (42, s2, "t2", f"ALTER TABLE `{s1}`.`t1b` EXCHANGE PARTITION `p3` WITH TABLE `{s2}`.`t2`"),
        f"insert into `{s2}`.t2 values {_pairs(*range(1002, 1053, 10))}",
        f"insert into t1b values {_pairs(21, 28)}",
        (11, s1, "t1", "truncate table t1"),
        "insert into t1 select * from t1b",
        (
            64,
            s1,
            "t1",
            "ALTER TABLE t1 REORGANIZE PARTITION p0,p2 INTO (PARTITION p0 VALUES LESS THAN (5), "
            "PARTITION p1 VALUES LESS THAN (10), PARTITION p2 VALUES LESS THAN (21))",
        ),
        f"insert into t1 values {_pairs(-1, 6, 13)}",
        "update t1 set a=a-22, b=-2 where a=20",
        "delete from t1 where a = 5",
        (
            64,
            s1,
            "t1",
            "ALTER TABLE t1 REORGANIZE PARTITION p2,p3,p4 INTO (PARTITION p2 VALUES LESS THAN (20), "
            "PARTITION p3 VALUES LESS THAN (26), PARTITION p4 VALUES LESS THAN (35), "
            "PARTITION pMax VALUES LESS THAN (MAXVALUE))",
        ),
        f"insert into t1 values {_pairs(-3, 5, 14, 22, 30, 100)}",
        "update t1 set a=a-16, b=-4 where a=12",
        "delete from t1 where a = 29",
        (71, s1, "t1", "alter table t1 partition by key(a) partitions 7"),
        f"insert into t1 values {_pairs(*(s * k for k in range(2001, 2008) for s in (1, -1)))}",
        (
            71,
            s1,
            "t1",
            "ALTER TABLE t1 partition by range(a) (partition p0 values less than (5), "
            "PARTITION p2 VALUES LESS THAN (20), PARTITION p3 VALUES LESS THAN (26), "
            "PARTITION p4 VALUES LESS THAN (35), PARTITION pMax VALUES LESS THAN (MAXVALUE))",
        ),
        (3, s1, "finish_mark", "create table finish_mark (a int primary key)"),
    ]


# What TiDB holds at the end (keys; b = a except where the script sets it).
T = {1, 4, 5, 6, 7, 9, 12, *range(20, 26), *range(30, 36)}  # p3 (3, 8) truncated, 2 -> 12
T1B = {7, 8, 11, 12, 19, 20, 21, 28, 35}  # p3 exchanged away twice, then 21, 28
T1 = {-4, -3, -2, -1, 5, 6, 7, 8, 11, 13, 14, 19, 21, 22, 28, 30, 35, 100} | {
    s * k for k in range(2001, 2008) for s in (1, -1)
}
T2 = {25, 29, *range(100, 106)}
T2_OTHER = {25, 29, *range(1002, 1053, 10)}
T_B = {k: str(k) for k in T} | {12: "12"}  # varchar b; the update set '12' (it was 2)


@pytest.fixture
def schemas(mariadb_params: dict):
    tag = uuid.uuid4().hex[:8]
    names = (f"partition_table_{tag}", f"partition_table2_{tag}")
    yield names
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    with conn.cursor() as cur:
        for s in names:
            cur.execute(f"DROP DATABASE IF EXISTS `{s}`")
    conn.close()


def test_ticdc_partition_table_ddls_pass_the_guard_translate_and_run_on_mariadb(
    mariadb_params, schemas
) -> None:
    s1, s2 = schemas
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = %s", (DEFAULT_SQL_MODE,))
            for step in _script(s1, s2):
                if isinstance(step, str):
                    cur.execute(f"USE `{s1}`")
                    cur.execute(step)
                    continue
                ddl_type, schema, table, query = step
                check_ddl(query, ddl_type, schema, table, reserved_schemas={"ticdc_applier"})
                for sql in plan_ddl(query, ddl_type, schema, MARIADB).statements():
                    cur.execute(sql)

            def rows(qualified: str) -> dict[int, object]:
                cur.execute(f"SELECT a, b FROM {qualified}")
                return {int(a): b for a, b in cur.fetchall()}

            got = {
                "t": rows(f"`{s1}`.t"),
                "t1": rows(f"`{s1}`.t1"),
                "t1b": rows(f"`{s1}`.t1b"),
                "t2": rows(f"`{s1}`.t2"),
                "other t2": rows(f"`{s2}`.t2"),
            }
            cur.execute(f"SELECT COUNT(*) FROM `{s1}`.finish_mark")
            assert cur.fetchone() == (0,)
    finally:
        conn.close()

    assert got["t"] == T_B
    assert got["t1"] == {k: k for k in T1}  # b = a; the two updates set b to the new a (-2, -4)
    assert got["t1b"] == {k: k for k in T1B}
    assert got["t2"] == {k: k for k in T2}
    assert got["other t2"] == {k: k for k in T2_OTHER}

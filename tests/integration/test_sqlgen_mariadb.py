"""sqlgen statements and DDL translation executed against the real MariaDB (fixture ``fresh_db``).

Each test applies generated SQL exactly as the daemon would (``cursor.execute(sql, params)``, one
transaction per window, READ COMMITTED, permissive sql_mode) and then compares the table content
with what upstream would hold.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pymysql
import pytest

from applier.codec.events import (
    FLAG_BINARY,
    FLAG_GENERATED,
    FLAG_HANDLE_KEY,
    FLAG_PRIMARY_KEY,
    FLAG_UNIQUE_KEY,
    FLAG_UNSIGNED,
    Row,
    RowEvent,
    RowKind,
)
from applier.downstream.errors import error_code
from sqlgen import (
    MARIADB,
    ErrorClass,
    classify_ddl_error,
    plan_ddl,
    plan_window,
    quote_ident,
    quote_table,
    statements,
)
from tests.builders import KeyedRows, column, row_event

pytestmark = pytest.mark.integration

PK = FLAG_HANDLE_KEY | FLAG_PRIMARY_KEY
INT, BIGINT, FLOAT, DOUBLE, VARCHAR, JSON, DECIMAL, BLOB, TIME, DATE, DATETIME = (
    3,
    8,
    4,
    5,
    15,
    245,
    246,
    252,
    11,
    10,
    12,
)
INS, UPD, DEL = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE


@pytest.fixture
def conn(mariadb_params: dict, fresh_db: str) -> Iterator[pymysql.connections.Connection]:
    cn = pymysql.connect(**mariadb_params, database=fresh_db, charset="utf8mb4", autocommit=False)
    with cn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cur.execute(
            "SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION', foreign_key_checks = 0, time_zone = '+00:00'"
        )
    try:
        yield cn
    finally:
        cn.close()


def apply(cn: pymysql.connections.Connection, events: list[RowEvent]) -> list[str]:
    """Plan and apply one window in one transaction; returns the statement kinds run."""
    kinds = []
    with cn.cursor() as cur:
        for st in statements(plan_window(events), MARIADB):
            cur.execute(st.sql, st.params)
            kinds.append(st.kind)
    cn.commit()
    return kinds


def rows(cn: pymysql.connections.Connection, sql: str) -> list[tuple]:
    with cn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


def ddl(cn: pymysql.connections.Connection, sql: str) -> None:
    with cn.cursor() as cur:
        cur.execute(sql)


# --- keyed tables ---------------------------------------------------------------------------------


def kimg(id_: int, u: str, v: str) -> Row:
    return {"id": column(INT, id_, PK), "u": column(VARCHAR, u, FLAG_UNIQUE_KEY), "v": column(VARCHAR, v)}


def test_unique_swap_pk_change_and_reinsert_converge(conn, fresh_db: str) -> None:
    ddl(conn, "CREATE TABLE k (id INT PRIMARY KEY, u VARCHAR(10) NOT NULL UNIQUE, v VARCHAR(20))")
    s = fresh_db
    apply(conn, [row_event(INS, 10, kimg(i, f"u{i}", "init"), table="k", schema=s) for i in range(1, 8)])
    window = [
        # unique values swapped between rows 1 and 2 (one transaction, arrival reversed)
        row_event(UPD, 20, kimg(2, "u1", "swapped"), kimg(2, "u2", "init"), table="k", schema=s),
        row_event(UPD, 20, kimg(1, "u2", "swapped"), kimg(1, "u1", "init"), table="k", schema=s),
        # primary key 3 -> 9 split into INSERT + DELETE, insert first (another partition)
        row_event(INS, 21, kimg(9, "u3", "moved"), table="k", schema=s),
        row_event(DEL, 21, old=kimg(3, "u3", "init"), table="k", schema=s),
        # primary keys 4 and 5 swapped, split, every insert before every delete
        row_event(INS, 22, kimg(5, "u4", "was4"), table="k", schema=s),
        row_event(INS, 22, kimg(4, "u5", "was5"), table="k", schema=s),
        row_event(DEL, 22, old=kimg(4, "u4", "init"), table="k", schema=s),
        row_event(DEL, 22, old=kimg(5, "u5", "init"), table="k", schema=s),
        # delete then reinsert with a unique value that row 7 gives up at the same ts
        row_event(DEL, 23, old=kimg(6, "u6", "init"), table="k", schema=s),
        row_event(UPD, 24, kimg(7, "u7b", "init"), kimg(7, "u7", "init"), table="k", schema=s),
        row_event(INS, 24, kimg(6, "u7", "re"), table="k", schema=s),
    ]
    window += window[:3]  # replayed duplicates
    kinds = apply(conn, window)
    assert kinds[0] == "delete" and set(kinds) == {"delete", "replace"}
    assert rows(conn, "SELECT id, u, v FROM k ORDER BY id") == [
        (1, "u2", "swapped"),
        (2, "u1", "swapped"),
        (4, "u5", "was5"),
        (5, "u4", "was4"),
        (6, "u7", "re"),
        (7, "u7b", "init"),
        (9, "u3", "moved"),
    ]


def _random_windows(seed: int) -> Iterator[tuple[list[tuple], dict[int, tuple[str, str]]]]:
    """Windows of TiDB-like events for (id PK, u UNIQUE, v) and the upstream state after each.

    Events are (kind, ts, new (id, u, v) | None, old | None); PK changes are split, events are
    spread over 3 partitions by key and interleaved randomly; some are replayed."""
    rnd = random.Random(seed)
    upstream = KeyedRows(ids=range(12), us=[f"u{i}" for i in range(12)])
    live = upstream.rows
    ts = 100
    for _ in range(8):
        parts: list[list[tuple]] = [[], [], []]
        for _txn in range(rnd.randint(1, 5)):
            ts += 1
            before = dict(live)
            for _op in range(rnd.randint(1, 5)):
                # With fewer than two rows, an insert whenever a key is free: a swap needs two.
                insert = 0.3 if len(live) >= 2 else 1.0
                upstream.statement(rnd, rnd.random(), (insert, 0.4, 0.6, 0.8, 1.0), ts)
            for o, n in upstream.changes(before):
                if o and n and o[0] == n[0]:
                    out = [(UPD, ts, n, o)]
                else:
                    out = ([(DEL, ts, None, o)] if o else []) + ([(INS, ts, n, None)] if n else [])
                for e in out:
                    key = (e[2] or e[3])[0]
                    parts[key % 3].append(e)
        for p in parts:
            if p and rnd.random() < 0.5:
                p.extend(p[rnd.randrange(len(p)) :])
        arrival = []
        queues = [p for p in parts if p]
        while queues:
            q = rnd.choice(queues)
            arrival.append(q.pop(0))
            if not q:
                queues.remove(q)
        yield arrival, {r[0]: (r[1], r[2]) for r in live.values()}


@pytest.mark.parametrize("seed", range(6))
def test_random_windows_reproduce_upstream(conn, fresh_db: str, seed: int) -> None:
    ddl(conn, "CREATE TABLE r (id INT PRIMARY KEY, u VARCHAR(10) NOT NULL UNIQUE, v VARCHAR(20))")
    for arrival, expected in _random_windows(seed):
        events = [
            row_event(kind, ts, kimg(*n) if n else None, kimg(*o) if o else None, table="r", schema=fresh_db)
            for kind, ts, n, o in arrival
        ]
        if events:
            apply(conn, events)
        got = {i: (u, v) for i, u, v in rows(conn, "SELECT id, u, v FROM r")}
        assert got == expected


def test_keyed_deletes_use_the_primary_key(conn, fresh_db: str) -> None:
    ddl(conn, "CREATE TABLE e (a INT, b VARCHAR(20), v INT, PRIMARY KEY (a, b))")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO e VALUES (%s, %s, 0)", [(i, f"k{i}") for i in range(3000)])
        cur.execute("ANALYZE TABLE e")
        cur.fetchall()
    conn.commit()

    def img(i: int) -> Row:
        return {"a": column(INT, i, PK), "b": column(VARCHAR, f"k{i}", PK), "v": column(INT, 0)}

    for n in (1, 2, 50):
        plan = plan_window([row_event(DEL, 10, old=img(i * 7), table="e", schema=fresh_db) for i in range(n)])
        (st,) = list(statements(plan, MARIADB))
        with conn.cursor() as cur:
            cur.execute("EXPLAIN " + st.sql, st.params)
            (plan_row,) = cur.fetchall()
        assert plan_row[3] in ("range", "const", "eq_ref", "ref"), (n, st.sql, plan_row)
        assert plan_row[5] == "PRIMARY"


# --- keyless tables ---------------------------------------------------------------------------------


def nimg(a: Any, f: Any, d: Any, j: Any, x: Any, b: Any) -> Row:
    return {
        "a": column(INT, a),
        "f": column(FLOAT, f),
        "d": column(DOUBLE, d),
        "j": column(JSON, j),
        "x": column(DECIMAL, x),
        "b": column(BLOB, b, FLAG_BINARY),
        "g": column(INT, None, FLAG_GENERATED),  # never written, never matched
    }


def test_keyless_deletes_match_nulls_floats_json_decimals(conn, fresh_db: str) -> None:
    ddl(
        conn,
        "CREATE TABLE n (a INT, f FLOAT, d DOUBLE, j JSON, x DECIMAL(40,20), b BLOB, "
        "g INT AS (a + 1) STORED)",
    )
    s = fresh_db
    r1 = nimg(1, 1.1, 0.1, '{"k": [1, 2]}', "1.00000000000000000001", b"\x00\xff")
    r1b = nimg(1, 1.1, 0.1, '{"k": [1, 2]}', "1.00000000000000000002", b"\x00\xff")  # differs far out
    r2 = nimg(None, None, None, None, None, None)
    r3 = nimg(3, 3.3, 1e-300, '"s"', "-0.50000000000000000000", b"")
    apply(conn, [row_event(INS, 10, img, table="n", schema=s) for img in (r1, r1, r1b, r2, r2, r3)])
    assert rows(conn, "SELECT COUNT(*) FROM n") == [(6,)]
    # delete one of two identical rows, the NULL row, and update r3 (old image matched exactly)
    r3new = nimg(4, 4.4, 2.2, "[]", "9.9", b"z")
    kinds = apply(
        conn,
        [
            row_event(DEL, 20, old=r1, table="n", schema=s),
            row_event(DEL, 20, old=r2, table="n", schema=s),
            row_event(UPD, 20, r3new, r3, table="n", schema=s),
            row_event(DEL, 20, old=r1b, table="n", schema=s),
        ],
    )
    assert kinds == ["delete", "delete", "delete", "delete", "insert"]
    got = rows(conn, "SELECT a, f, d, j, x, b, g FROM n ORDER BY a IS NULL, a, x")
    assert got == [
        (
            1,
            pytest.approx(1.1, rel=1e-6),
            0.1,
            '{"k": [1, 2]}',
            Decimal("1.00000000000000000001"),
            b"\x00\xff",
            2,
        ),
        (4, pytest.approx(4.4, rel=1e-6), 2.2, "[]", Decimal("9.90000000000000000000"), b"z", 5),
        (None, None, None, None, None, None, None),
    ]


# --- hostile identifiers and values ---------------------------------------------------------------

HOSTILE_TABLE = 'ta`b\'le "x" %s ä表 \\'
HOSTILE_KEY = "k`e%y"
HOSTILE_COL = "va l%s`"


def himg(k1: int, k2: str, val: str, tm: str, dt: str, dd: str, bl: bytes, f: int = PK) -> Row:
    return {
        HOSTILE_KEY: column(BIGINT, k1, f | FLAG_UNSIGNED),
        "ö": column(VARCHAR, k2, f),
        HOSTILE_COL: column(VARCHAR, val),
        "tm": column(TIME, tm),
        "dt": column(DATETIME, dt),
        "dd": column(DATE, dd),
        "bl": column(BLOB, bl, FLAG_BINARY),
    }


NASTY = "NUL\x00 'q' \"dq\" back\\slash \\' %s %% 🙂𝄞 ä"
ALL_BYTES = bytes(range(256))
MAX_U64 = 2**64 - 1


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
def test_hostile_names_and_values_round_trip(conn, fresh_db: str, keyed: bool) -> None:
    tbl = quote_table(fresh_db, HOSTILE_TABLE)
    pk = f", PRIMARY KEY ({quote_ident(HOSTILE_KEY)}, `ö`)" if keyed else ""
    ddl(
        conn,
        f"CREATE TABLE {tbl} ({quote_ident(HOSTILE_KEY)} BIGINT UNSIGNED NOT NULL, "
        f"`ö` VARCHAR(64) NOT NULL, {quote_ident(HOSTILE_COL)} VARCHAR(100), "
        f"tm TIME, dt DATETIME, dd DATE, bl BLOB{pk}) CHARSET utf8mb4",
    )
    f = PK if keyed else 0
    s = fresh_db
    a = himg(MAX_U64, NASTY, NASTY, "-838:59:59", "0000-00-00 00:00:00", "0000-00-00", ALL_BYTES, f)
    b = himg(0, "plain", "x", "123:04:05", "2024-02-29 23:59:59", "2024-02-29", b"", f)
    cc = himg(7, "🙂 key", "to delete", "-00:00:01", "1970-01-01 00:00:01", "1000-01-01", b"\\", f)
    apply(conn, [row_event(INS, 10, img, table=HOSTILE_TABLE, schema=s) for img in (a, b, cc)])
    b2 = himg(0, "plain", NASTY, "838:59:59", "0000-00-00 00:00:00", "0000-00-00", ALL_BYTES[::-1], f)
    apply(
        conn,
        [
            row_event(UPD, 20, b2, b, table=HOSTILE_TABLE, schema=s),
            row_event(DEL, 20, old=cc, table=HOSTILE_TABLE, schema=s),
        ],
    )
    got = rows(
        conn,
        f"SELECT {quote_ident(HOSTILE_KEY)}, `ö`, {quote_ident(HOSTILE_COL)}, CAST(tm AS CHAR), "
        f"CAST(dt AS CHAR), CAST(dd AS CHAR), bl FROM {tbl} ORDER BY 1",
    )
    assert got == [
        (0, "plain", NASTY, "838:59:59", "0000-00-00 00:00:00", "0000-00-00", ALL_BYTES[::-1]),
        (MAX_U64, NASTY, NASTY, "-838:59:59", "0000-00-00 00:00:00", "0000-00-00", ALL_BYTES),
    ]
    # delete the row whose key holds every hostile value
    apply(conn, [row_event(DEL, 30, old=a, table=HOSTILE_TABLE, schema=s)])
    assert [r[0] for r in rows(conn, f"SELECT {quote_ident(HOSTILE_KEY)} FROM {tbl}")] == [0]


# --- DDL ------------------------------------------------------------------------------------------

# (DDL type code, TiDB query, SQL whose result proves the translated DDL took effect)
DDL_SEQUENCE = [
    (
        3,
        "CREATE TABLE t1 (id BIGINT AUTO_RANDOM(5) PRIMARY KEY CLUSTERED, c VARCHAR(10)) "
        "SHARD_ROW_ID_BITS=4 PRE_SPLIT_REGIONS=2 AUTO_ID_CACHE 1 AUTO_RANDOM_BASE=100",
    ),
    (
        3,
        "CREATE TABLE `t2` (\n  `id` bigint(20) NOT NULL /*T![auto_rand] AUTO_RANDOM(5, 54) */,\n"
        "  `k` bigint unsigned auto_random,\n"
        "  PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 "
        "COLLATE=utf8mb4_bin /*T![auto_rand_base] AUTO_RANDOM_BASE=30001 */ /*!90000 SHARD_ROW_ID_BITS=4 */",
    ),
    (
        3,
        "CREATE TABLE t3 (id INT, created_at DATETIME, ttl INT, PRIMARY KEY (id) NONCLUSTERED) "
        "TTL = `created_at` + INTERVAL 3 MONTH TTL_ENABLE = 'ON' TTL_JOB_INTERVAL = '24h' "
        "PLACEMENT POLICY=`p1`",
    ),
    (5, "ALTER TABLE t3 ADD COLUMN x INT, SHARD_ROW_ID_BITS=4"),
    (65, "ALTER TABLE t3 TTL = created_at + INTERVAL 1 DAY, TTL_ENABLE='OFF'"),
    (67, "ALTER TABLE t3 REMOVE TTL"),
    (58, "ALTER TABLE t3 STATS_BUCKETS=10"),
    (
        3,
        "CREATE TABLE t4 (a INT, clustered INT, "
        "PRIMARY KEY (a, clustered) /*T![clustered_index] NONCLUSTERED */) "
        "PARTITION BY RANGE (a) (PARTITION p0 VALUES LESS THAN (10) PLACEMENT POLICY p, "
        "PARTITION p1 VALUES LESS THAN MAXVALUE)",
    ),
    (32, "ALTER TABLE t1 DROP PRIMARY KEY, ADD PRIMARY KEY (id, c) NONCLUSTERED"),
    (
        3,
        "CREATE TABLE `we``ird %s tä` (`a``b` BIGINT PRIMARY KEY AUTO_RANDOM(3)) "
        "/*T![placement] PLACEMENT POLICY=`x` */",
    ),
    (51, "CREATE PLACEMENT POLICY p1 PRIMARY_REGION='us' REGIONS='us'"),
]


def test_translated_tidb_ddl_runs_on_mariadb(conn, fresh_db: str, mariadb_params: dict) -> None:
    executed = 0
    for ddl_type, query in DDL_SEQUENCE:
        plan = plan_ddl(query, ddl_type, fresh_db, MARIADB)
        for sql in plan.statements():
            ddl(conn, sql)
        executed += plan.execute
    assert executed == 7
    cols = rows(
        conn,
        "SELECT table_name, column_name, column_key, extra FROM information_schema.columns "
        f"WHERE table_schema = '{fresh_db}' ORDER BY table_name, ordinal_position",
    )
    assert cols == [
        ("t1", "id", "PRI", ""),
        ("t1", "c", "PRI", ""),
        ("t2", "id", "PRI", ""),
        ("t2", "k", "", ""),
        ("t3", "id", "PRI", ""),
        ("t3", "created_at", "", ""),
        ("t3", "ttl", "", ""),
        ("t3", "x", "", ""),
        ("t4", "a", "PRI", ""),
        ("t4", "clustered", "PRI", ""),
        ("we`ird %s tä", "a`b", "PRI", ""),
    ]
    assert rows(
        conn,
        f"SELECT COUNT(*) FROM information_schema.partitions WHERE table_schema = '{fresh_db}' "
        "AND table_name = 't4'",
    ) == [(2,)]

    # replaying a DDL fails with an "already applied" code
    plan = plan_ddl(DDL_SEQUENCE[0][1], 3, fresh_db, MARIADB)
    with pytest.raises(pymysql.err.MySQLError) as info:
        for sql in plan.statements():
            ddl(conn, sql)
    assert classify_ddl_error(error_code(info.value)) is ErrorClass.ALREADY_APPLIED

    # schema-level DDL runs without USE, with placement stripped
    other = fresh_db + "_s"
    plan = plan_ddl(
        f"CREATE DATABASE `{other}` DEFAULT CHARACTER SET utf8mb4 PLACEMENT POLICY = p", 1, other, MARIADB
    )
    assert plan.use_schema is None
    try:
        for sql in plan.statements():
            ddl(conn, sql)
        assert rows(
            conn, f"SELECT schema_name FROM information_schema.schemata WHERE schema_name = '{other}'"
        )
        assert not plan_ddl(
            f"ALTER DATABASE `{other}` PLACEMENT POLICY = DEFAULT", 99, other, MARIADB
        ).execute
    finally:
        ddl(conn, f"DROP DATABASE IF EXISTS `{other}`")

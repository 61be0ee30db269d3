"""SQL text and parameters produced by sqlgen.dml, quoting and dialect data (no database)."""

from __future__ import annotations

import dataclasses
import pickle
from decimal import Decimal
from typing import Any

import pytest

from applier.codec.events import FLAG_HANDLE_KEY, Position, Row, RowEvent, RowKind
from sqlgen import (
    MARIADB,
    MYSQL,
    TIDB,
    dialect_by_name,
    plan_window,
    quote_ident,
    quote_ident_fmt,
    quote_table,
    quote_table_fmt,
    statements,
)
from sqlgen.collapse import DeleteGroup, KeylessOp, UpsertGroup
from sqlgen.dml import delete_statements, keyless_statements, replace_statements

HK = FLAG_HANDLE_KEY
INT, VARCHAR, FLOAT, JSON, DECIMAL, BLOB = 3, 15, 4, 245, 246, 252


def ev(
    kind: RowKind, new: Row | None = None, old: Row | None = None, table: str = "t", ts: int = 10
) -> RowEvent:
    return RowEvent(ts, "s", table, kind, new, old, None, Position("x", 0, 0, 0))


def test_quoting() -> None:
    assert quote_ident("a") == "`a`"
    assert quote_ident("we`ird ` name") == "`we``ird `` name`"
    assert quote_ident('it\'s "q" \\ ä表') == '`it\'s "q" \\ ä表`'
    assert quote_table("s`", "t t") == "`s```.`t t`"
    assert quote_table("", "t") == "`t`"
    assert quote_ident_fmt("100%") == "`100%%`"
    assert quote_table_fmt("a%b", "%s") == "`a%%b`.`%%s`"


def test_dialects_are_picklable_data() -> None:
    assert dialect_by_name(" MariaDB ") is MARIADB
    with pytest.raises(ValueError, match="unknown SQL dialect"):
        dialect_by_name("oracle")
    for d in (MARIADB, MYSQL, TIDB):
        assert pickle.loads(pickle.dumps(d)) == d
        hash(d)
    assert MARIADB.where_param(FLOAT) == "CAST(%s AS FLOAT)"
    assert MARIADB.where_param(JSON) == "%s"
    assert MYSQL.where_param(JSON) == "CAST(%s AS JSON)"
    assert MYSQL.where_param(INT) == "%s"
    assert not TIDB.strip_tidb_ddl and MARIADB.strip_tidb_ddl


def test_keyed_delete_forms() -> None:
    one_col = DeleteGroup(("id",), (INT,), [(1,), (2,), (3,)])
    (st,) = delete_statements("s", "t", one_col, MARIADB)
    assert st.sql == "DELETE FROM `s`.`t` WHERE `id` IN (%s,%s,%s)"
    assert st.params == (1, 2, 3) and st.rows == 3 and st.kind == "delete" and st.first_key == (1,)

    (st,) = delete_statements("s", "t", DeleteGroup(("id",), (INT,), [(7,)]), MARIADB)
    assert st.sql == "DELETE FROM `s`.`t` WHERE `id` = %s" and st.params == (7,)

    comp = DeleteGroup(("a", "b"), (INT, VARCHAR), [(1, "x"), (2, "y")])
    (st,) = delete_statements("s", "t", comp, MARIADB)
    assert st.sql == "DELETE FROM `s`.`t` WHERE (`a`,`b`) IN ((%s,%s),(%s,%s))"
    assert st.params == (1, "x", 2, "y")

    # a one-row row constructor is a full scan on MariaDB: single composite key uses AND
    (st,) = delete_statements("s", "t", DeleteGroup(("a", "b"), (INT, VARCHAR), [(1, "x")]), MARIADB)
    assert st.sql == "DELETE FROM `s`.`t` WHERE `a` = %s AND `b` = %s"


def test_keyed_delete_null_keys_float_and_decimal() -> None:
    g = DeleteGroup(
        ("a", "f", "d"), (INT, FLOAT, DECIMAL), [(1, 1.5, "1.10"), (None, 2.5, None), (3, 3.5, "3.30")]
    )
    sts = list(delete_statements("s", "t", g, MARIADB))
    assert [s.sql for s in sts] == [
        "DELETE FROM `s`.`t` WHERE (`a`,`f`,`d`) IN ((%s,CAST(%s AS FLOAT),%s),(%s,CAST(%s AS FLOAT),%s))",
        "DELETE FROM `s`.`t` WHERE `a` IS NULL AND `f` = CAST(%s AS FLOAT) AND `d` IS NULL LIMIT 1",
    ]
    assert sts[0].params == (1, 1.5, Decimal("1.10"), 3, 3.5, Decimal("3.30"))
    assert type(sts[0].params[2]) is Decimal
    assert sts[1].params == (2.5,) and sts[1].first_key == (None, 2.5, None)
    no_exact = dataclasses.replace(MARIADB, exact_decimal_params=False)
    assert next(delete_statements("s", "t", g, no_exact)).params[2] == "1.10"


def test_delete_batching_by_rows_and_params() -> None:
    keys = [(i, i) for i in range(25)]
    d = dataclasses.replace(MARIADB, max_rows_per_statement=10)
    sts = list(delete_statements("s", "t", DeleteGroup(("a", "b"), (INT, INT), keys), d))
    assert [s.rows for s in sts] == [10, 10, 5]
    assert [len(s.params) for s in sts] == [20, 20, 10]
    assert sts[1].first_key == (10, 10)
    assert sts[0].sql is sts[1].sql  # full batches share one SQL string
    d = dataclasses.replace(MARIADB, max_params_per_statement=8)
    assert [s.rows for s in delete_statements("s", "t", DeleteGroup(("a", "b"), (INT, INT), keys), d)] == [
        4
    ] * 6 + [1]


def test_replace_batching_by_bytes_and_hostile_identifiers() -> None:
    rows = [(i, "x" * 400) for i in range(10)]
    g = UpsertGroup(("i`d", "v%s"), (INT, VARCHAR), rows, [(i,) for i in range(10)])
    d = dataclasses.replace(MARIADB, max_statement_bytes=1000)
    sts = list(replace_statements("my`db", "t%", g, d))
    assert sts[0].sql == "REPLACE INTO `my``db`.`t%%` (`i``d`,`v%%s`) VALUES (%s,%s),(%s,%s)"
    assert [s.rows for s in sts] == [2] * 5
    assert sts[2].params == (4, "x" * 400, 5, "x" * 400) and sts[2].first_key == (4,)
    assert all(s.kind == "replace" for s in sts)
    # a single row larger than the budget still goes out, alone
    big = UpsertGroup(("id", "b"), (INT, BLOB), [(1, b"\0" * 5000), (2, b"")], [(1,), (2,)])
    assert [s.rows for s in replace_statements("s", "t", big, d)] == [1, 1]
    # the rendered SQL survives pymysql-style %-interpolation and gives back the identifiers
    assert sts[0].sql % (("?",) * 4) == "REPLACE INTO `my``db`.`t%` (`i``d`,`v%s`) VALUES (?,?),(?,?)"


def test_keyless_statements_per_dialect() -> None:
    ops = [
        KeylessOp("insert", ("a", "b"), (INT, VARCHAR), (1, "x")),
        KeylessOp("insert", ("a", "b"), (INT, VARCHAR), (2, None)),
        KeylessOp(
            "delete", ("a", "f", "j", "d"), (INT, FLOAT, JSON, DECIMAL), (None, 1.1, '{"k": 1}', "2.50")
        ),
        KeylessOp("insert", ("a", "b"), (INT, VARCHAR), (3, "z")),
        KeylessOp("insert", ("a",), (INT,), (4,)),
    ]
    sts = list(keyless_statements("s", "t", ops, MARIADB))
    assert [(s.kind, s.rows) for s in sts] == [("insert", 2), ("delete", 1), ("insert", 1), ("insert", 1)]
    assert sts[0].sql == "INSERT INTO `s`.`t` (`a`,`b`) VALUES (%s,%s),(%s,%s)"
    assert sts[0].params == (1, "x", 2, None) and sts[0].first_key is None
    assert sts[1].sql == (
        "DELETE FROM `s`.`t` WHERE `a` <=> %s AND `f` <=> CAST(%s AS FLOAT)"
        " AND `j` <=> %s AND `d` <=> %s LIMIT 1"
    )
    assert sts[1].params == (None, 1.1, '{"k": 1}', Decimal("2.50"))
    assert sts[3].sql == "INSERT INTO `s`.`t` (`a`) VALUES (%s)"
    my = list(keyless_statements("s", "t", ops, MYSQL))
    assert "`j` <=> CAST(%s AS JSON)" in my[1].sql


def test_window_statements_order_and_counts() -> None:
    def img(i: int, v: Any) -> Row:
        return {"id": {"t": INT, "f": HK, "v": i}, "v": {"t": VARCHAR, "f": 0, "v": v}}

    plan = plan_window(
        [
            ev(RowKind.INSERT, img(1, "a")),
            ev(RowKind.DELETE, old=img(2, "b")),
            ev(RowKind.INSERT, img(3, "c")),
            ev(RowKind.INSERT, {"x": {"t": INT, "f": 0, "v": 5}}, table="nokey"),
        ]
    )
    sts = list(statements(plan, MARIADB))
    assert [(s.table, s.kind, s.rows) for s in sts] == [
        ("t", "delete", 1),
        ("t", "replace", 2),
        ("nokey", "insert", 1),
    ]
    assert sts[1].params == (1, "a", 3, "c")
    assert pickle.loads(pickle.dumps(sts)) == sts
    per_kind: dict[str, int] = {}
    for s in sts:
        per_kind[s.kind] = per_kind.get(s.kind, 0) + s.rows
    assert per_kind == {k: v for k, v in plan.totals().items() if k != "events" and v}

"""SQL text and parameters produced by sqlgen.dml, quoting and dialect data (no database)."""

from __future__ import annotations

import dataclasses
import datetime
import pickle
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hyp
from pymysql.constants import SERVER_STATUS

from applier.codec.events import FLAG_HANDLE_KEY, Row, RowKind
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
from sqlgen.dialect import packet_margin, packet_needed
from sqlgen.dml import (
    Statement,
    delete_statements,
    keyless_statements,
    literal_bytes,
    replace_statements,
    statement_too_large,
)
from tests.builders import row_event

HK = FLAG_HANDLE_KEY
INT, VARCHAR, FLOAT, JSON, DECIMAL, BLOB = 3, 15, 4, 245, 246, 252


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
            row_event(RowKind.INSERT, 10, img(1, "a")),
            row_event(RowKind.DELETE, 10, old=img(2, "b")),
            row_event(RowKind.INSERT, 10, img(3, "c")),
            row_event(RowKind.INSERT, 10, {"x": {"t": INT, "f": 0, "v": 5}}, table="nokey"),
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


# -- sizing to max_allowed_packet --------------------------------------------------------------


def _binder() -> Any:
    """A pymysql cursor that binds like the applier's sessions (utf8mb4, backslash escapes), offline."""
    conn = pymysql.connections.Connection(defer_connect=True, charset="utf8mb4", ssl_disabled=True)
    conn.server_status = 0  # set by the handshake; 0: backslash escapes, as our sql_mode has them
    return conn.cursor()


def _wire(cur: Any, st: Statement) -> int:
    return len(cur.mogrify(st.sql, st.params).encode("utf-8", "surrogatepass"))


def test_packet_budget_margin_and_advice() -> None:
    assert MARIADB.max_allowed_packet == 16 << 20
    one = MARIADB.with_max_allowed_packet(1 << 20)
    assert one.name == "mariadb" and one.max_allowed_packet == 1 << 20
    assert packet_margin(1 << 20) == 32 << 10 and packet_margin(4096) == 1024
    assert one.packet_budget == (1 << 20) - (32 << 10)
    assert one.statement_bytes == one.packet_budget  # below the 4 MiB cap
    assert MARIADB.statement_bytes == MARIADB.max_statement_bytes
    assert pickle.loads(pickle.dumps(one)) == one
    # the advice is a whole MiB whose budget fits the statement
    for size in (1, 900_000, 4 << 20, (4 << 20) + 1, 100 << 20):
        need = packet_needed(size)
        assert need % (1 << 20) == 0
        assert MARIADB.with_max_allowed_packet(need).packet_budget >= size
        assert MARIADB.with_max_allowed_packet(need - (1 << 20)).packet_budget < size or need == 1 << 20


def test_rows_of_300_kb_are_cut_to_the_packet_not_to_the_row_count() -> None:
    rows = [(i, "y" * 300_000) for i in range(10)]
    g = UpsertGroup(("id", "v"), (INT, VARCHAR), rows, [(i,) for i in range(10)])
    small = MARIADB.with_max_allowed_packet(1 << 20)
    sts = list(replace_statements("s", "t", g, small))
    assert [s.rows for s in sts] == [3, 3, 3, 1]
    cur = _binder()
    assert all(_wire(cur, s) <= small.packet_budget for s in sts)
    assert all(statement_too_large(s, cur.mogrify(s.sql, s.params), small) is None for s in sts)
    # 16 MiB: only the 4 MiB statement cap cuts
    assert [s.rows for s in replace_statements("s", "t", g, MARIADB)] == [10]


def test_tables_of_short_values_only_are_cut_to_the_packet_too() -> None:
    keys = [(i, i) for i in range(5000)]
    tiny = MARIADB.with_max_allowed_packet(64 << 10)
    sts = list(delete_statements("s", "t", DeleteGroup(("a", "b"), (INT, INT), keys), tiny))
    assert len(sts) > 1 and sum(s.rows for s in sts) == 5000
    cur = _binder()
    assert max(_wire(cur, s) for s in sts) <= tiny.packet_budget
    # with the default packet the row and parameter caps decide, as before
    whole = DeleteGroup(("a", "b"), (INT, INT), keys)
    assert [s.rows for s in delete_statements("s", "t", whole, MARIADB)] == [5000]


_values = hyp.one_of(
    hyp.none(),
    hyp.integers(min_value=-(2**63), max_value=2**64 - 1),
    hyp.floats(allow_nan=False, allow_infinity=False),
    hyp.text(alphabet=hyp.sampled_from("ab'\"\\\n\r\x00\x1aé表😀"), max_size=400),
    hyp.binary(max_size=400),
)


@settings(max_examples=60, deadline=None)
@given(
    hyp.lists(hyp.tuples(hyp.integers(0, 10**6), _values, _values), min_size=1, max_size=30),
    hyp.integers(min_value=2 << 10, max_value=40 << 10),
)
def test_every_multi_row_statement_fits_the_packet_once_bound(rows: list, packet: int) -> None:
    """Whatever the values (escapes, multi-byte text, bytes, extreme numbers), a statement of
    several rows, bound by pymysql, never exceeds the budget: only a lone row can."""
    dialect = MARIADB.with_max_allowed_packet(packet)
    types = (INT, VARCHAR, BLOB)
    g = UpsertGroup(("id", "v", "b"), types, rows, [(r[0],) for r in rows])
    ops = [KeylessOp("insert", ("id", "v", "b"), types, r) for r in rows]
    keys = DeleteGroup(("id", "v"), (INT, VARCHAR), [r[:2] for r in rows if r[1] is not None])
    cur = _binder()
    for sts in (
        list(replace_statements("s", "t", g, dialect)),
        list(keyless_statements("s", "t", ops, dialect)),
        list(delete_statements("s", "t", keys, dialect)),
    ):
        for s in sts:
            size = _wire(cur, s)
            if s.rows > 1:
                assert size <= dialect.packet_budget
            assert (statement_too_large(s, cur.mogrify(s.sql, s.params), dialect) is None) == (
                size <= dialect.packet_budget
            )
    assert sum(s.rows for s in replace_statements("s", "t", g, dialect)) == len(rows)


def test_a_row_beyond_the_packet_is_one_message_naming_table_key_and_setting() -> None:
    row = (7, "k" * 100, b"\x01" * (4 << 20))
    g = UpsertGroup(("id", "name", "blob"), (INT, VARCHAR, BLOB), [row], [row[:2]])
    small = MARIADB.with_max_allowed_packet(1 << 20)
    (st,) = replace_statements("my`db", "t", g, small)
    query = _binder().mogrify(st.sql, st.params)
    msg = statement_too_large(st, query, small)
    assert msg is not None and "\n" not in msg
    assert "a row of `my``db`.`t` cannot be applied" in msg
    assert f"is {len(query)} bytes" in msg
    assert "max_allowed_packet = 1048576 bytes" in msg
    assert f"at least {packet_needed(len(query))}" in msg and packet_needed(len(query)) == 9 << 20
    assert "REPLACE statement for key (7, '" + "k" * 36 + "...) is" in msg  # values cut short
    assert "\x01" not in msg
    assert statement_too_large(st, query, MARIADB) is None  # 16 MiB: fits
    (keyless,) = keyless_statements("s", "t", [KeylessOp("insert", ("b",), (BLOB,), (row[2],))], small)
    bound = _binder().mogrify(keyless.sql, keyless.params)
    assert "INSERT statement (keyless table) is" in (statement_too_large(keyless, bound, small) or "")


def test_literal_bounds_hold_and_are_exact_for_long_text_and_bytes() -> None:
    cur = _binder()
    for v in ("", "abc", "a'b\\c\n", "é表😀" * 3, "x'" * 300, "表\x00" * 200, b"", b"\x00\xff" * 300, None, 0,
              -(2**63), 2**64 - 1, 1e-300, -1.7976931348623157e308, 0.1):  # fmt: skip
        exact = len(cur.mogrify("%s", (v,)).encode("utf-8"))
        assert literal_bytes(v) >= exact, v
        if (isinstance(v, str) and len(v) >= 256) or isinstance(v, bytes):
            assert literal_bytes(v) - exact <= 9, v


# -- binding -----------------------------------------------------------------------------------

_VALUES_OF_EVERY_KIND: list[Any] = [
    0,
    -1,
    1 << 70,
    -(1 << 63),
    True,
    False,
    None,
    1.5,
    -0.0,
    1e300,
    "",
    "plain",
    'it\'s \\ "quoted"\n\r\x00\x1a',
    "日本語 ✓ \U0001f600",
    "%s %% %(x)s",
    b"\x00\xff'\\",
    bytearray(b"ab"),
    Decimal("-12.3400"),
    datetime.datetime(2026, 11, 25, 13, 0, 1, 5),
    datetime.date(2026, 1, 2),
    datetime.timedelta(hours=-3, seconds=7),
]


@pytest.mark.parametrize("no_backslash_escapes", [False, True])
def test_bound_is_the_text_of_pymysqls_mogrify_for_every_kind_of_value(no_backslash_escapes: bool) -> None:
    _assert_bound_as_mogrify(_VALUES_OF_EVERY_KIND, no_backslash_escapes, table="t%")


def _assert_bound_as_mogrify(values: list[Any], no_backslash_escapes: bool, table: str) -> None:
    """A REPLACE of ``values`` into ``table``, bound by us and by pymysql: the same text."""
    cur = _binder()
    # NO_BACKSLASH_ESCAPES (from the handshake and every OK packet) changes how strings are escaped
    cur.connection.server_status = (
        SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES if no_backslash_escapes else 0
    )
    sql = f"REPLACE INTO `{table.replace('%', '%%')}` (`a`) VALUES " + ",".join(["(%s)"] * len(values))
    st = Statement(sql, tuple(values), "replace", "s", table, len(values), None)
    assert st.bound(cur.connection.escape) == cur.mogrify(st.sql, st.params)


@settings(max_examples=300, deadline=None)
@given(
    values=hyp.lists(
        hyp.one_of(
            hyp.text(alphabet=hyp.sampled_from("ab 0%s\\'\"\n\r\x00\x1a日✓")),
            hyp.text(alphabet="abc -0123456789"),  # strings with nothing to escape (binding's quick path)
            hyp.integers(),
            hyp.none(),
            hyp.binary(max_size=4),
        ),
        min_size=1,
        max_size=12,
    ),
    no_backslash_escapes=hyp.booleans(),
)
def test_bound_agrees_with_mogrify_whether_or_not_a_string_needs_escaping(
    values: list[Any], no_backslash_escapes: bool
) -> None:
    _assert_bound_as_mogrify(values, no_backslash_escapes, table="t")

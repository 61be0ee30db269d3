"""Render a :class:`~sqlgen.collapse.WindowPlan` as parameterised SQL statements.

Every :class:`Statement` is a pymysql format string plus its parameters: values are never in the
SQL text, identifiers are backtick-quoted with ``%`` doubled. Execute it as
``cursor.execute(st.sql, st.params)`` — always *with* the params (even an empty tuple), or the
doubled ``%%`` of a hostile identifier would reach the server as two characters — or bind it
first with :meth:`Statement.bound` and execute that text alone.

Order: per table, deletes before REPLACEs (keyed) or the ops in plan order (keyless). Tables may
run in any order (``foreign_key_checks=0``), and statements of one kind of one keyed table in any
order too (see :mod:`sqlgen.collapse` for why).

Statement forms, chosen by measuring MariaDB 10.11 (EXPLAIN, 200k-row table):

- keyed delete, one key column: ``k IN (%s,...)``; several: ``(k1,k2) IN ((%s,%s),...)``. Both
  are range scans on the key (row-constructor IN is ~3x faster than an OR of AND groups). A
  one-element row constructor ``(k1,k2) IN ((%s,%s))`` is a full scan on MariaDB, so a single
  key uses ``k1 = %s AND k2 = %s``.
- a key containing NULL (handle keys are NOT NULL, so only for odd schemas) gets its own
  ``k IS NULL AND ... LIMIT 1`` statement.
- keyless delete: ``c1 <=> %s AND ... LIMIT 1`` over all written columns (null-safe), with the
  dialect's placeholder for FLOAT/JSON columns; DECIMAL parameters are bound as Decimal.
- ``REPLACE INTO t (cols) VALUES (...),(...)`` and keyless ``INSERT INTO``, multi-row.

Batches hold at most ``max_rows_per_statement`` rows and ``max_params_per_statement``
placeholders, and their statement, once pymysql has bound the values, at most
``Dialect.statement_bytes``: the smaller of ``max_statement_bytes`` and the server's
``max_allowed_packet`` less a margin. The size is an upper bound computed from the values, never
by binding them (that happens once, later, in the applier): a bytes value is ``X'hex'``, twice its
length; a string is quoted with ``\\ ' " NUL CR LF ^Z`` escaped and encoded as UTF-8, so at most
2 bytes per ASCII character and 4 per other character (``str.isascii`` is free in CPython), or,
from ``_EXACT_FROM`` characters on, exactly its UTF-8 length plus one byte per escaped character;
ints, floats and the NULL type never take more than ``_BOUNDED_LITERAL_BYTES``. A single row
above the budget goes alone, and :func:`statement_too_large` measures its bound text exactly
before it is sent: a row that does not fit the packet at all is an error naming the table, the
key and the setting, not a statement the server would refuse by dropping the connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from itertools import chain
from typing import Any, Literal

from applier.errors import compiled_module_missing
from sqlgen.collapse import DeleteGroup, KeylessOp, TablePlan, UpsertGroup, WindowPlan
from sqlgen.dialect import Dialect, packet_margin, packet_needed
from sqlgen.quoting import column_list_fmt, quote_ident_fmt, quote_table, quote_table_fmt
from sqlgen.route import Router

try:
    from sqlgen._bind import batch_ends, bind
except ImportError as _e:  # an install from before the module existed: one clear line
    raise compiled_module_missing("the compiled statement binding", "sqlgen/_bind.pyx", _e) from _e

TYPE_DECIMAL = 246
_BOUNDED_TYPES = frozenset({1, 2, 3, 8, 9, 13, 16, 247, 248, 4, 5, 6})
"""Column types whose values the decoder only ever gives as int, float or None
(docs/open-protocol.md §4: the integer types, YEAR, BIT, ENUM, SET; FLOAT and DOUBLE; the NULL
type): their literals are short. Every other column (text, blobs, JSON, DECIMAL, dates and times,
unknown codes) is measured value by value."""
_BOUNDED_LITERAL_BYTES = 32
"""Longest literal of such a value: 20 characters for a 64-bit int, 26 for a float (``repr`` plus
pymysql's ``e0``), ``NULL``; rounded up."""
_BYTES_LITERAL_EXTRA = 9
"""Literal of a bytes value beyond its hex digits: ``X''`` (``_binary''`` in older pymysql)."""
_EXACT_FROM = 256
"""Strings of at least this many characters are measured exactly (a few C-speed scans): for them the
2x/4x bound would waste most of a statement; shorter ones are not worth the scans."""
_ESCAPED = b"\\'\"\n\r\x00\x1a"
"""The characters pymysql escapes in a string literal, each with one more byte (all ASCII, so in
UTF-8 each is one byte that no other character's encoding contains)."""

StatementKind = Literal["delete", "replace", "insert"]


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement: ``cursor.execute(sql, params)``.

    ``rows`` is how many rows it deletes/writes (for metrics); ``first_key`` is the handle key of
    its first row for error messages (None for keyless tables, which have no key).
    """

    sql: str
    params: tuple[Any, ...]
    kind: StatementKind
    schema: str
    table: str
    rows: int
    first_key: tuple[Any, ...] | None

    def bound(self, escape: Callable[[Any], str]) -> str:
        """The statement's text with its values in it: what ``cursor.mogrify(sql, params)`` gives.

        ``escape`` is the session's ``Connection.escape`` (its text depends on the session's
        character set and sql_mode), which mogrify applies to every value. Two kinds of value are
        written without it, by the same text: an int as ``str(v)``, what pymysql's int encoder
        gives after the four calls of its type dispatch; a string holding none of the characters
        pymysql escapes (``_ESCAPED``) as itself between quotes, which is what either of its modes
        (backslashes, or NO_BACKSLASH_ESCAPES' doubled quotes) makes of such a string. Binding is
        a large share of the daemon's CPU time with pymysql's escaping alone, and the loop choosing
        each value's literal is most of what is left in Python, so it is compiled
        (``sqlgen/_bind.pyx``; docs/performance.md).
        """
        return bind(self.sql, self.params, escape)


def statements(plan: WindowPlan, dialect: Dialect, router: Router | None = None) -> Iterator[Statement]:
    """All statements of a window plan: per table, deletes then replaces (or keyless ops in order)."""
    for tp in plan.tables.values():
        yield from table_statements(tp, dialect, router)


def table_statements(tp: TablePlan, dialect: Dialect, router: Router | None = None) -> Iterator[Statement]:
    """Statements of one table's plan, written to the table's routed name (:mod:`sqlgen.route`)."""
    schema, table = router.table(tp.schema, tp.table) if router else (tp.schema, tp.table)
    if tp.keyed:
        for dg in tp.deletes:
            yield from delete_statements(schema, table, dg, dialect)
        for ug in tp.upserts:
            yield from replace_statements(schema, table, ug, dialect)
    else:
        yield from keyless_statements(schema, table, tp.ops, dialect)


# --- batching ---------------------------------------------------------------------------------


def literal_bytes(v: Any) -> int:
    """Upper bound of the bytes of ``v`` bound as a literal by pymysql (exact for bytes and long text)."""
    t = type(v)
    if t is str:
        n = len(v)
        if n >= _EXACT_FROM:
            return _text_bytes(v)
        return 2 * n + 2 if v.isascii() else 4 * n + 2
    if t is bytes:
        return 2 * len(v) + _BYTES_LITERAL_EXTRA
    if v is None or t is int or t is float:
        return _BOUNDED_LITERAL_BYTES
    return 4 * len(str(v)) + _BOUNDED_LITERAL_BYTES  # Decimal or anything else: its text, quoted


def _text_bytes(v: str) -> int:
    """Exact bytes of a string literal: quotes, UTF-8 text, one more byte per escaped character.

    Counted on the UTF-8 bytes with ``bytes.translate`` (deleting the escaped ones), one C pass:
    about 5% of what pymysql's escaping of the same string costs, where seven ``str.count``
    calls cost almost twice as much.
    """
    text = v.encode("utf-8", "surrogatepass")
    n = len(text)
    return 2 * n + 2 - len(text.translate(None, _ESCAPED))


def _batches(
    rows: Sequence[tuple[Any, ...]], types: Sequence[int], dialect: Dialect, head: int, per_row: int
) -> Iterator[range]:
    """Index ranges of ``rows`` that fit the dialect's per-statement limits.

    ``head`` is the size of the statement's text without its rows, ``per_row`` that of one row's
    placeholders and separator; values are counted as :func:`literal_bytes` does, by a compiled
    loop (``sqlgen/_bind.pyx``: ``batch_ends``) where a column's values vary in size.
    """
    ncols = max(len(types), 1)
    per = max(1, min(dialect.max_rows_per_statement, dialect.max_params_per_statement // ncols))
    n = len(rows)
    budget = dialect.statement_bytes - head
    var_idx = [i for i, t in enumerate(types) if t not in _BOUNDED_TYPES]
    fixed = per_row + _BOUNDED_LITERAL_BYTES * (ncols - len(var_idx))
    if not var_idx:
        per = max(1, min(per, budget // fixed))
        for start in range(0, n, per):
            yield range(start, min(start + per, n))
        return
    rows = rows if type(rows) is list else list(rows)
    start = 0
    for end in batch_ends(
        rows, var_idx, per, budget, fixed, _EXACT_FROM, _BYTES_LITERAL_EXTRA, literal_bytes
    ):
        yield range(start, end)
        start = end


def _text_size(text: str) -> int:
    """UTF-8 bytes of SQL text (identifiers may be any script)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def bound_bytes(query: str, limit: int) -> int:
    """Bytes of a bound statement as pymysql sends it (UTF-8), measured only when it matters.

    ASCII text (the common case: ``isascii`` reads a flag) is its length; other text is encoded
    only when 4 bytes per character could exceed ``limit``, else its 4x bound is returned.
    """
    n = len(query)
    if query.isascii() or 4 * n <= limit:
        return n if query.isascii() else 4 * n
    return len(query.encode("utf-8", "surrogatepass"))


def statement_too_large(st: Statement, query: str, dialect: Dialect) -> str | None:
    """Why ``query`` (``st`` with its values bound) cannot be sent to the server, or None.

    The batching above keeps every multi-row statement within the budget, so in practice only a
    statement of one row can be too large: one row whose values alone exceed the server's
    ``max_allowed_packet``. Nothing a retry or a restart does can apply it, so the message names
    the row and the setting to raise.
    """
    budget = dialect.packet_budget
    size = bound_bytes(query, budget)
    if size <= budget:
        return None
    packet = dialect.max_allowed_packet
    rows = "a row" if st.rows == 1 else f"{st.rows} rows"
    return (
        f"{rows} of {quote_table(st.schema, st.table)} cannot be applied: its {st.kind.upper()} "
        f"statement {_key_text(st.first_key)} is {size} bytes, over max_allowed_packet = {packet} bytes "
        f"(less a margin of {packet_margin(packet)}); raise max_allowed_packet on the downstream "
        f"server to at least {packet_needed(size)} (SET GLOBAL max_allowed_packet and the server's "
        "configuration file), then restart the applier"
    )


def _key_text(key: tuple[Any, ...] | None) -> str:
    """A handle key for a message: each value cut to a few dozen characters."""
    if key is None:
        return "(keyless table)"
    parts = []
    for v in key:
        r = repr(v)
        parts.append(r if len(r) <= 40 else r[:37] + "...")
    return "for key (" + ", ".join(parts) + ")"


def _exact(v: Any) -> Any:
    """A DECIMAL string as Decimal, so pymysql binds an exact numeric literal (not a string the
    server would compare as DOUBLE). Anything unexpected is passed through unchanged."""
    if type(v) is str:
        try:
            return Decimal(v)
        except InvalidOperation:
            return v
    return v


def _where_converters(types: Sequence[int], dialect: Dialect) -> list[int]:
    """Indexes of columns whose WHERE parameters must be converted to Decimal."""
    if not dialect.exact_decimal_params:
        return []
    return [i for i, t in enumerate(types) if t == TYPE_DECIMAL]


def _convert(row: tuple[Any, ...], idx: list[int]) -> tuple[Any, ...]:
    if not idx:
        return row
    out = list(row)
    for i in idx:
        out[i] = _exact(out[i])
    return tuple(out)


# --- keyed deletes ------------------------------------------------------------------------------


def delete_statements(schema: str, table: str, group: DeleteGroup, dialect: Dialect) -> Iterator[Statement]:
    """``DELETE`` statements for a group of handle keys (multi-row; NULL-containing keys one by one)."""
    if not group.keys:
        return
    target = quote_table_fmt(schema, table)
    cols = [quote_ident_fmt(c) for c in group.columns]
    phs = [dialect.where_param(t) for t in group.types]
    conv = _where_converters(group.types, dialect)
    plain: list[tuple[Any, ...]] = []
    with_null: list[tuple[Any, ...]] = []
    for k in group.keys:
        (with_null if None in k else plain).append(k)

    if plain:
        if len(cols) == 1:
            in_lhs = cols[0]
            tuple_ph = phs[0]
        else:
            in_lhs = "(" + ",".join(cols) + ")"
            tuple_ph = "(" + ",".join(phs) + ")"
        single = f"DELETE FROM {target} WHERE " + " AND ".join(
            f"{c} = {p}" for c, p in zip(cols, phs, strict=True)
        )
        prefix = f"DELETE FROM {target} WHERE {in_lhs} IN ("
        full_sql: str | None = None
        full_n = 0
        head, per_row = _text_size(prefix) + 1, len(tuple_ph) + 1
        for r in _batches(plain, group.types, dialect, head, per_row):
            batch = plain[r.start : r.stop]
            n = len(batch)
            if n == 1:
                sql = single
            elif n == full_n and full_sql is not None:
                sql = full_sql
            else:
                sql = prefix + ",".join([tuple_ph] * n) + ")"
                full_sql, full_n = sql, n
            if conv:
                batch = [_convert(k, conv) for k in batch]
            yield Statement(
                sql, tuple(chain.from_iterable(batch)), "delete", schema, table, n, plain[r.start]
            )

    for k in with_null:
        conds: list[str] = []
        params: list[Any] = []
        ck = _convert(k, conv)
        for c, p, v in zip(cols, phs, ck, strict=True):
            if v is None:
                conds.append(f"{c} IS NULL")
            else:
                conds.append(f"{c} = {p}")
                params.append(v)
        sql = f"DELETE FROM {target} WHERE " + " AND ".join(conds) + " LIMIT 1"
        yield Statement(sql, tuple(params), "delete", schema, table, 1, k)


# --- REPLACE / INSERT -----------------------------------------------------------------------------


def _multi_row(
    verb: str,
    kind: StatementKind,
    schema: str,
    table: str,
    columns: tuple[str, ...],
    types: tuple[int, ...],
    rows: Sequence[tuple[Any, ...]],
    keys: Sequence[tuple[Any, ...]] | None,
    dialect: Dialect,
) -> Iterator[Statement]:
    prefix = f"{verb} INTO {quote_table_fmt(schema, table)} ({column_list_fmt(columns)}) VALUES "
    row_ph = "(" + ",".join(["%s"] * len(columns)) + ")"
    cached_sql: str | None = None
    cached_n = 0
    for r in _batches(rows, types, dialect, _text_size(prefix), len(row_ph) + 1):
        n = len(r)
        if n != cached_n or cached_sql is None:
            cached_sql = prefix + ",".join([row_ph] * n)
            cached_n = n
        batch = rows[r.start : r.stop]
        first = keys[r.start] if keys is not None else None
        yield Statement(cached_sql, tuple(chain.from_iterable(batch)), kind, schema, table, n, first)


def replace_statements(schema: str, table: str, group: UpsertGroup, dialect: Dialect) -> Iterator[Statement]:
    """Multi-row ``REPLACE INTO`` statements for a group of final images."""
    if not group.rows:
        return
    yield from _multi_row(
        "REPLACE", "replace", schema, table, group.columns, group.types, group.rows, group.keys, dialect
    )


# --- keyless tables ------------------------------------------------------------------------------


def keyless_statements(
    schema: str, table: str, ops: Sequence[KeylessOp], dialect: Dialect
) -> Iterator[Statement]:
    """Ordered statements for a keyless table: one ``DELETE ... LIMIT 1`` per delete; runs of
    consecutive inserts with the same columns become multi-row ``INSERT`` statements."""
    target = quote_table_fmt(schema, table)
    delete_sql: dict[tuple[tuple[str, ...], tuple[int, ...]], tuple[str, list[int]]] = {}
    i = 0
    n = len(ops)
    while i < n:
        op = ops[i]
        if op.kind == "delete":
            shape = (op.columns, op.types)
            cached = delete_sql.get(shape)
            if cached is None:
                conds = " AND ".join(
                    f"{quote_ident_fmt(c)} <=> {dialect.where_param(t)}"
                    for c, t in zip(op.columns, op.types, strict=True)
                )
                cached = (f"DELETE FROM {target} WHERE {conds} LIMIT 1", _where_converters(op.types, dialect))
                delete_sql[shape] = cached
            yield Statement(cached[0], _convert(op.values, cached[1]), "delete", schema, table, 1, None)
            i += 1
            continue
        j = i + 1
        while j < n and ops[j].kind == "insert" and ops[j].columns == op.columns:
            j += 1
        rows = [o.values for o in ops[i:j]]
        yield from _multi_row("INSERT", "insert", schema, table, op.columns, op.types, rows, None, dialect)
        i = j

"""What differs between downstream servers, as plain data.

Following sqlglot's idea of "a dialect is a table of differences", the SQL builders ask a
:class:`Dialect` instead of branching on server names. A Dialect is a frozen dataclass of
builtins, so it pickles cheaply to Spark executors and can be compared and hashed.

Facts behind the values (checked against MariaDB 10.11 by tests/integration/test_sqlgen_mariadb.py;
MySQL/TiDB values come from their documentation):

- FLOAT (type 4) is stored in single precision, but a bound parameter is a DOUBLE literal: a
  column holding 1.1f never equals ``1.1e0``. ``CAST(%s AS FLOAT)`` rounds the parameter to single
  precision first; MariaDB ≥ 10.4.5, MySQL ≥ 8.0.17 and TiDB support it.
- JSON (type 245) is LONGTEXT on MariaDB, compared as the text we inserted; MySQL and TiDB store
  binary JSON, where a string parameter never equals a JSON value unless cast to JSON.
- DECIMAL (246) compared with a *string* is compared as DOUBLE on MySQL (MariaDB happens to compare
  exactly): parameters are therefore bound as :class:`decimal.Decimal`, which pymysql writes as
  an exact decimal literal (``exact_decimal_params``).
- Statement size limits bound the server-side parse/range-optimizer work, and every statement
  must fit the server's ``max_allowed_packet`` (16 MiB default on MariaDB, 64 MiB on MySQL 8,
  but often lowered or raised): the server refuses a bigger packet and closes the session, which
  a client sees as a lost connection, so the applier reads the limit at start
  (:meth:`Dialect.with_max_allowed_packet`) and the statements are sized to it (:mod:`sqlgen.dml`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TYPE_FLOAT = 4
TYPE_JSON = 245
MIB = 1 << 20


def packet_margin(max_allowed_packet: int) -> int:
    """Bytes of ``max_allowed_packet`` a statement leaves unused: 1/32 of it, at least 1 KiB.

    The statement sizes of :mod:`sqlgen.dml` are upper bounds of the bound text, but the packet
    also carries the command byte, and what reaches the server is not always exactly our text:
    a proxy in front of it (ProxySQL, MaxScale) may add a routing comment or rewrite the
    statement. A statement filling the packet to the last byte would then be refused, which the
    client sees as a lost connection and replays forever; the margin keeps statements away from
    that edge, at the price of a few percent more statements when rows are near the limit.
    """
    return max(1024, max_allowed_packet // 32)


def packet_needed(statement_bytes: int) -> int:
    """The smallest whole-MiB ``max_allowed_packet`` whose budget (less the margin) fits a statement."""
    need = max(statement_bytes + 1024, -(-statement_bytes * 32 // 31))
    return -(-need // MIB) * MIB


@dataclass(frozen=True, slots=True)
class Dialect:
    """Behaviour of one downstream flavour.

    ``where_params`` maps a column type code to the SQL expression used for a bound value that is
    *compared* with a column of that type (WHERE clauses); types not listed use a bare ``%s``.
    Inserted values never need this: the server converts them on store.
    """

    name: str
    where_params: tuple[tuple[int, str], ...] = ((TYPE_FLOAT, "CAST(%s AS FLOAT)"),)
    exact_decimal_params: bool = True
    max_rows_per_statement: int = 5000
    """Rows per multi-row statement. Fewer, larger statements mean fewer round trips (and fewer
    hand-overs between the daemon's threads); 5000 narrow rows are about 1 MB of SQL."""
    max_params_per_statement: int = 20000
    max_statement_bytes: int = 4 << 20
    """Size budget of one multi-row statement, in bytes of the bound text (an upper bound, see
    ``sqlgen.dml``); the packet budget below may lower it. A single bigger row goes alone."""
    max_allowed_packet: int = 16 << 20
    """The server's ``max_allowed_packet`` (session value), read at start; the default is MariaDB's."""
    strip_tidb_ddl: bool = True
    """Remove TiDB-only clauses from DDL (see sqlgen.ddl); False when the target is TiDB."""

    @property
    def packet_budget(self) -> int:
        """Most bytes one bound statement may have on this server (``max_allowed_packet`` less
        :func:`packet_margin`); a single row above it cannot be applied."""
        return max(0, self.max_allowed_packet - packet_margin(self.max_allowed_packet))

    @property
    def statement_bytes(self) -> int:
        """Most bytes a multi-row statement is given: the smaller of the two budgets."""
        return min(self.max_statement_bytes, self.packet_budget)

    def with_max_allowed_packet(self, max_allowed_packet: int) -> Dialect:
        """This dialect sized for a server whose ``max_allowed_packet`` is the value given."""
        return replace(self, max_allowed_packet=int(max_allowed_packet))

    def where_param(self, type_code: int) -> str:
        """Placeholder expression for comparing a bound value with a column of ``type_code``."""
        for code, sql in self.where_params:
            if code == type_code:
                return sql
        return "%s"


MARIADB = Dialect(name="mariadb")
MYSQL = Dialect(
    name="mysql",
    where_params=((TYPE_FLOAT, "CAST(%s AS FLOAT)"), (TYPE_JSON, "CAST(%s AS JSON)")),
)
TIDB = Dialect(
    name="tidb",
    where_params=((TYPE_FLOAT, "CAST(%s AS FLOAT)"), (TYPE_JSON, "CAST(%s AS JSON)")),
    strip_tidb_ddl=False,
)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (MARIADB, MYSQL, TIDB)}


def dialect_by_name(name: str) -> Dialect:
    """The built-in dialect called ``name`` (``mysql``, ``mariadb``, ``tidb``; case-insensitive)."""
    try:
        return DIALECTS[name.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown SQL dialect {name!r}; expected one of {sorted(DIALECTS)}") from None

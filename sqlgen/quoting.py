"""Identifier quoting for MySQL-family SQL.

Identifiers are the only text this package puts into SQL; values are always bound parameters.
MySQL, MariaDB and TiDB all accept backtick-quoted identifiers in which a backtick is written
twice, and nothing else inside backticks is special (no backslash escapes), so this one rule is
enough to make any name safe — spaces, quotes, backslashes, non-ASCII included.

Statements executed *with* pymysql parameters are Python %-format strings: a ``%`` inside a
quoted identifier must then be doubled too, or pymysql's ``query % args`` breaks on it.
:func:`quote_ident_fmt` / :func:`quote_table_fmt` do both; use the plain forms for SQL that is
executed without parameters (DDL, ``USE``).
"""

from __future__ import annotations

from collections.abc import Iterable


def quote_ident(name: str) -> str:
    """`name` with backticks doubled, for SQL executed without parameters."""
    return "`" + name.replace("`", "``") + "`"


def quote_table(schema: str, table: str) -> str:
    """`schema`.`table` (just `table` when the schema is empty)."""
    if not schema:
        return quote_ident(table)
    return quote_ident(schema) + "." + quote_ident(table)


def quote_ident_fmt(name: str) -> str:
    """Like :func:`quote_ident`, for a pymysql format string (``%`` doubled)."""
    return quote_ident(name).replace("%", "%%")


def quote_table_fmt(schema: str, table: str) -> str:
    """Like :func:`quote_table`, for a pymysql format string (``%`` doubled)."""
    return quote_table(schema, table).replace("%", "%%")


def column_list_fmt(names: Iterable[str]) -> str:
    """```a`,`b``` for a pymysql format string."""
    return ",".join(quote_ident_fmt(n) for n in names)

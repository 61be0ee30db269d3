"""Rows of handle-key-only events, read from the upstream TiDB as of their commit ts
(docs/open-protocol.md §9.2).

A handle-key-only event carries the handle-key columns of its row and nothing else; the rest
exists only upstream. TiDB keeps every version of a row until its GC passes, and a session can
read as of any ts after that with ``SET @@tidb_snapshot`` (the statement TiCDC's own consumer
uses). The statement lives in :func:`select_as_of` alone, so a test can put another historical
read behind it (a MariaDB upstream has no ``tidb_snapshot``).

What is read: the new image of inserts and updates, at the commit ts, in one statement per table
and commit ts (``WHERE (key columns) IN (...)``). Deletes need nothing: the downstream deletes by
key. The old image of an update keeps its key columns only (what the collapse and the delete of a
moved key use). Generated columns are not read (the downstream computes them).

Values are taken as the server's text (no client-side conversion): the string a column prints
is the string that stores the same value downstream, exactly (the key columns keep the event's
own typed values). Text columns arrive as ``str``, binary ones (BLOB, BINARY, BIT) as ``bytes``;
the session's time zone is the applier's ``time_zone``, so TIMESTAMP values read as TiCDC writes
them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import pymysql

from applier.codec.events import FLAG_BINARY, Row
from applier.downstream.errors import DownstreamConnectError, error_code, is_transient
from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig
from applier.errors import ApplierError
from sqlgen.quoting import quote_ident, quote_table

TYPE_VARCHAR, TYPE_BLOB = 15, 252
GC_PASSED = 8055  # TiDB: snapshot is older than GC safe point
KEYS_PER_STATEMENT = 500


class UpstreamRowMissing(ApplierError):
    """The upstream has no such row (or table) at that ts, or its history there was collected."""


class UpstreamUnreachable(ApplierError):
    """The upstream could not be asked (connection refused or lost); worth asking again later."""


def select_as_of(
    cur: Any, ts: int, schema: str, table: str, where: str, params: Sequence[Any]
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows) of ``SELECT ... WHERE <where>`` on the table as it was at ``ts``.

    TiDB's historical read: the session reads as of ``ts`` until ``tidb_snapshot`` is cleared,
    information_schema included, so the column list is the one in force at ``ts``. Generated
    and invisible columns are left out.
    """
    cur.execute("SET @@tidb_snapshot = %s", (ts,))
    try:
        names = table_columns(cur, schema, table)
        if not names:
            return [], []
        cur.execute(
            f"SELECT {', '.join(map(quote_ident, names))} FROM {quote_table(schema, table)} WHERE {where}",
            tuple(params),
        )
        return names, list(cur.fetchall())
    finally:
        cur.execute("SET @@tidb_snapshot = ''")


def table_columns(cur: Any, schema: str, table: str) -> list[str]:
    """Names of the stored, visible columns of a table, in table order (empty: no such table)."""
    cur.execute(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "AND EXTRA NOT LIKE '%%GENERATED%%' AND EXTRA NOT LIKE '%%INVISIBLE%%' ORDER BY ORDINAL_POSITION",
        (schema, table),
    )
    return [r[0] if isinstance(r[0], str) else r[0].decode() for r in cur.fetchall()]


def _same(fetched: Any, wanted: Any) -> bool:
    """Whether a key value read as text equals the event's typed key value."""
    if fetched is None or wanted is None:
        return fetched is wanted
    if isinstance(wanted, bytes):
        return fetched == wanted if isinstance(fetched, bytes) else fetched.encode() == wanted
    if isinstance(fetched, bytes):
        fetched = fetched.decode("utf-8", "surrogateescape")
    if isinstance(wanted, str):
        if fetched == wanted:
            return True
        try:  # DECIMAL keys: the same number may print with another scale
            return Decimal(fetched) == Decimal(wanted)
        except (InvalidOperation, ValueError):
            return False
    if isinstance(wanted, bool) or not isinstance(wanted, int | float):
        return False
    try:
        return (int(fetched) if isinstance(wanted, int) else float(fetched)) == wanted
    except ValueError:
        return False


class UpstreamReader:
    """Reads full rows from the upstream, one session per thread (the resolver's workers)."""

    def __init__(self, config: DownstreamConfig) -> None:
        self.config = config
        self._local = threading.local()
        self._sessions: list[pymysql.connections.Connection] = []
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.config.redacted()

    def _session(self) -> pymysql.connections.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = connect(self.config, autocommit=True)
            except DownstreamConnectError as exc:
                text = str(exc).replace("downstream", "upstream")
                if exc.errno is None or is_transient(exc) or exc.errno in (2002, 2003, 2005):
                    raise UpstreamUnreachable(text) from None
                raise UpstreamRowMissing(text) from None
            conn.decoders = {}  # every value as the server's text (see the module docstring)
            self._local.conn = conn
            with self._lock:
                self._sessions.append(conn)
        return conn

    def _drop_session(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._lock:
                if conn in self._sessions:
                    self._sessions.remove(conn)
            close_quietly(conn)

    def rows_as_of(self, ts: int, schema: str, table: str, key_images: Sequence[Row]) -> list[Row]:
        """The full row of each key image (handle-key columns with the event's values), at ``ts``.

        Raises :class:`UpstreamRowMissing` naming the first key not found, and
        :class:`UpstreamUnreachable` when the upstream cannot be asked.
        """
        out: list[Row] = []
        for start in range(0, len(key_images), KEYS_PER_STATEMENT):
            out += self._chunk(ts, schema, table, key_images[start : start + KEYS_PER_STATEMENT])
        return out

    def _query(
        self, ts: int, schema: str, table: str, where: str, params: Sequence[Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        conn = self._session()
        try:
            with conn.cursor() as cur:
                return select_as_of(cur, ts, schema, table, where, params)
        except pymysql.err.MySQLError as exc:
            code = error_code(exc)
            reason = exc.args[1] if len(exc.args) > 1 else str(exc)
            if is_transient(exc) or isinstance(exc, pymysql.err.InterfaceError):
                self._drop_session()
                raise UpstreamUnreachable(f"upstream {self.describe()}: {code}: {reason}") from None
            if code == GC_PASSED:
                raise UpstreamRowMissing(
                    f"the upstream's history at ts {ts} was garbage-collected ({code}: {reason}); "
                    "raise the upstream's tidb_gc_life_time above the applier's lag"
                ) from None
            raise UpstreamRowMissing(f"the upstream refused the read ({code}: {reason})") from None
        except OSError as exc:
            self._drop_session()
            raise UpstreamUnreachable(f"upstream {self.describe()}: {exc}") from None

    def _chunk(self, ts: int, schema: str, table: str, keys: Sequence[Row]) -> list[Row]:
        names = list(keys[0])
        if any(list(k) != names for k in keys):  # not one key shape: one statement per row
            out: list[Row] = []
            for k in keys:
                out += self._chunk(ts, schema, table, [k])
            return out
        cols = ", ".join(map(quote_ident, names))
        one = "(" + ", ".join(["%s"] * len(names)) + ")"
        where = f"({cols}) IN ({', '.join([one] * len(keys))})"
        params = [k[n]["v"] for k in keys for n in names]
        columns, rows = self._query(ts, schema, table, where, params)
        if not columns:
            raise UpstreamRowMissing(f"the upstream has no table `{schema}`.`{table}` at ts {ts}")
        at = [columns.index(n) if n in columns else -1 for n in names]
        if -1 in at:
            raise UpstreamRowMissing(
                f"the upstream table `{schema}`.`{table}` at ts {ts} has no column "
                f"{names[at.index(-1)]!r} of the handle key"
            )
        full: list[Row] = []
        for k in keys:
            found = [r for r in rows if all(_same(r[i], k[n]["v"]) for i, n in zip(at, names, strict=True))]
            if len(found) != 1:
                shown = ", ".join(f"{n}={k[n]['v']!r}"[:80] for n in names)
                raise UpstreamRowMissing(
                    f"the upstream has {'no' if not found else len(found)} row of `{schema}`.`{table}` "
                    f"with {shown} at ts {ts}"
                )
            full.append(_image(columns, found[0], k))
        return full

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for conn in sessions:
            close_quietly(conn)


def _image(columns: list[str], values: tuple[Any, ...], key: Row) -> Row:
    """A row image of the values read, the key columns as the event gave them."""
    row: Row = {}
    for name, v in zip(columns, values, strict=True):
        col = key.get(name)
        if col is not None:
            row[name] = col
        elif isinstance(v, bytes):
            row[name] = {"t": TYPE_BLOB, "f": FLAG_BINARY, "v": v}  # type: ignore[typeddict-item]
        else:
            row[name] = {"t": TYPE_VARCHAR, "f": 0, "v": v}  # type: ignore[typeddict-item]
    return row

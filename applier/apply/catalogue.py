"""What the downstream's catalogue says about the objects a DDL touches.

A DDL commits on its own, outside any transaction of ours, so "did it take effect?" cannot be
answered by the checkpoint after a crash: only the server's catalogue knows. A *fingerprint* of
the objects a DDL touches is taken before it runs (and journaled, see :mod:`applier.apply.ddl`);
comparing it with a fingerprint of the same objects taken later tells whether the catalogue
changed in between.

What is read (a :class:`Scope`): per schema, whether it exists (with its default character set
and collation) and, per table or view the DDL names, a digest of ``SHOW CREATE TABLE`` (the
``AUTO_INCREMENT`` counter removed: rows move it, DDL is what we look for), or its absence. Only
the named objects are read, so a DDL costs the same in a schema of ten tables as in one of ten
thousand; the DDL guard (:func:`sqlgen.check_ddl`) is what names them, and a statement it cannot
read has its whole schemas read instead (every table, as a scope of ``None``).

Two kinds of statement leave the definitions as they were. ``TRUNCATE`` empties its table: the
scope then asks whether each table holds a row (a table that held none is the same after it,
and running it again changes nothing). ``EXCHANGE PARTITION`` swaps the rows of two tables of the
same shape, and a ``RENAME`` of several tables can swap their names: the scope then asks for the
tables' *data identity*, the storage engine's ids of the tables and their partitions, from
``information_schema.INNODB_SYS_TABLES`` (MariaDB), ``INNODB_TABLES`` (MySQL 8) or
``TIDB_TABLE_ID``/``TIDB_PARTITION_ID`` (TiDB). The InnoDB views need the PROCESS privilege and
are filled from every table of the server (tens of milliseconds at ten thousand tables), which
is why they are read only there; without the privilege :attr:`Fingerprint.identity` is False.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import pymysql

from sqlgen import Dialect
from sqlgen.quoting import quote_ident

_AUTO_INCREMENT = re.compile(r" AUTO_INCREMENT=\d+")
_ACCESS_DENIED = frozenset({1044, 1142, 1227})  # no privilege for an information_schema view


_ABSENT: dict = {"db": None, "tables": {}, "ids": ""}


@dataclass(frozen=True, slots=True)
class Scope:
    """What a fingerprint reads: per schema the tables it names (``None``: every table of the
    schema), and whether the tables' data identity (storage ids) is needed too."""

    tables: dict[str, frozenset[str] | None]
    ids: bool = False
    rows: bool = False
    """Whether each table holds a row is asked too."""


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The catalogue of some objects at one moment; ``schemas`` maps a schema name to its state:
    ``db`` (None when absent), ``tables`` (a digest per table that exists), ``ids`` (a digest of
    the tables' storage ids, "" when not read), ``named`` (the tables looked at; absent when
    the whole schema was read) and, when asked, ``rows`` (the tables that hold a row)."""

    schemas: dict[str, dict]
    identity: bool
    """False when the scope needed table ids and the server hid them (no PROCESS privilege)."""
    ids: bool = False
    """Whether the table ids were asked for (:attr:`Scope.ids`)."""
    rows: bool = False
    """Whether the tables' rows were asked for (:attr:`Scope.rows`)."""

    def to_json(self) -> str:
        return json.dumps(
            {"schemas": self.schemas, "identity": self.identity, "ids": self.ids, "rows": self.rows},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Fingerprint:
        data = json.loads(text)
        # A journal row written before scopes existed read whole schemas, ids included.
        return cls(
            dict(data["schemas"]), bool(data["identity"]), bool(data.get("ids", True)), bool(data.get("rows"))
        )

    def scope(self) -> Scope:
        """What this fingerprint read: a later one of the same scope compares with it."""
        return Scope(
            {
                schema: None if "named" not in state else frozenset(state["named"])
                for schema, state in self.schemas.items()
            },
            self.ids,
            self.rows,
        )

    def changes(self, later: Fingerprint) -> list[str]:
        """What differs in ``later`` (e.g. ``"db.t: definition"``); [] when nothing did."""
        out: list[str] = []
        for schema in sorted(set(self.schemas) | set(later.schemas)):
            a = self.schemas.get(schema, _ABSENT)
            b = later.schemas.get(schema, _ABSENT)
            if a["db"] != b["db"]:
                what = "created" if a["db"] is None else "dropped" if b["db"] is None else "options"
                out.append(f"{schema}: {what}")
            ta, tb = a["tables"], b["tables"]
            for table in sorted(set(ta) | set(tb)):
                x, y = ta.get(table), tb.get(table)
                if x == y:
                    continue
                if x is None or y is None:
                    out.append(f"{schema}.{table}: {'created' if x is None else 'dropped'}")
                else:
                    out.append(f"{schema}.{table}: definition")
            for table in sorted(set(a.get("rows", ())) ^ set(b.get("rows", ()))):
                if ta.get(table) is not None and ta.get(table) == tb.get(table):
                    out.append(f"{schema}.{table}: {'emptied' if table in a['rows'] else 'filled'}")
            if self.identity and later.identity and a["ids"] != b["ids"] and not out:
                out.append(f"{schema}: data (table or partition ids)")
        return out


def _digest(text: str) -> str:
    # 64 bits: enough to see a change, small enough that the journal row of a schema with
    # thousands of tables stays far below max_allowed_packet.
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _innodb_name(name: str) -> str:
    """A LIKE pattern for a name as InnoDB spells it (encoded for the file system).

    Letters, digits and ``_`` are kept by the server's file-name encoding; every other character
    becomes an ``@`` code whose form depends on the character, so it is matched with ``%``: the
    pattern may then also match other objects, which only adds objects to compare.
    """
    return "".join(_like_escape(ch) if ch.isascii() and (ch.isalnum() or ch == "_") else "%" for ch in name)


def _innodb_patterns(schema: str, tables: frozenset[str] | None) -> list[str]:
    """LIKE patterns of the InnoDB names (``db/table``, ``db/table#P#partition``) of the tables."""
    db = _innodb_name(schema) + "/"
    if tables is None:
        return [db + "%"]
    return [p for t in sorted(tables) for p in (db + _innodb_name(t), db + _innodb_name(t) + "#P#%")]


class Catalogue:
    """Reads fingerprints on a session the caller owns (no transaction is left open)."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._identity: bool | None = None  # False once the ids were refused: not asked again

    def fingerprint(self, conn: pymysql.connections.Connection, scope: Scope) -> Fingerprint:
        state: dict[str, dict] = {}
        identity = True
        try:
            with conn.cursor() as cur:
                for schema in sorted(scope.tables):
                    entry, ids_ok = self._schema(cur, schema, scope.tables[schema], scope.ids, scope.rows)
                    identity = identity and ids_ok
                    state[schema] = entry
        finally:
            # information_schema and SHOW reads open a transaction on a non-autocommit session;
            # ending it releases the metadata locks they took before the DDL needs them.
            conn.rollback()
        return Fingerprint(state, identity, scope.ids, scope.rows)

    def _schema(
        self,
        cur: pymysql.cursors.Cursor,
        schema: str,
        named: frozenset[str] | None,
        with_ids: bool,
        with_rows: bool,
    ) -> tuple[dict, bool]:
        cur.execute(
            "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA "
            "WHERE SCHEMA_NAME = %s",
            (schema,),
        )
        row = cur.fetchone()
        entry: dict = {"db": None, "tables": {}, "ids": ""}
        if named is not None:
            entry["named"] = sorted(named)
        if row is None:
            return entry, True
        entry["db"] = f"{row[0]}/{row[1]}"
        if named is None:
            cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (schema,))
            names = sorted(r[0] for r in cur.fetchall())
        else:
            names = sorted(named)
        ids_ok = True
        if with_ids:
            entry["ids"], ids_ok = self._ids(cur, schema, named)
        q = quote_ident(schema)
        for name in names:
            try:
                cur.execute(f"SHOW CREATE TABLE {q}.{quote_ident(name)}")
                created = cur.fetchone()
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] == 1146:  # absent (or dropped between the two reads)
                    continue
                raise
            entry["tables"][name] = _digest(_AUTO_INCREMENT.sub("", str(created[1])))
        if with_rows:
            entry["rows"] = []
            for name in entry["tables"]:
                cur.execute(f"SELECT EXISTS (SELECT 1 FROM {q}.{quote_ident(name)})")
                if cur.fetchone()[0]:
                    entry["rows"].append(name)
        return entry, ids_ok

    def _ids(
        self, cur: pymysql.cursors.Cursor, schema: str, named: frozenset[str] | None
    ) -> tuple[str, bool]:
        """A digest of every (object, id) pair of the tables (and their partitions)."""
        if self._identity is False:
            return "", False
        if named is not None and not named:  # the schema row alone: no table to ask for
            return _digest("[]"), True
        try:
            if self._dialect.name == "tidb":
                where = "TABLE_SCHEMA = %s" + ("" if named is None else " AND TABLE_NAME IN %s")
                args: tuple = (schema,) if named is None else (schema, tuple(sorted(named)))
                cur.execute(
                    f"SELECT TABLE_NAME, '', TIDB_TABLE_ID FROM information_schema.TABLES WHERE {where} "
                    "UNION ALL SELECT TABLE_NAME, PARTITION_NAME, TIDB_PARTITION_ID FROM "
                    f"information_schema.PARTITIONS WHERE {where} AND PARTITION_NAME IS NOT NULL",
                    args + args,
                )
            else:
                view = "INNODB_SYS_TABLES" if self._dialect.name == "mariadb" else "INNODB_TABLES"
                patterns = _innodb_patterns(schema, named)
                cur.execute(
                    f"SELECT NAME, '', TABLE_ID FROM information_schema.{view} WHERE "
                    + " OR ".join(["NAME LIKE %s"] * len(patterns)),
                    tuple(patterns),
                )
            pairs = sorted([str(a), str(b or ""), int(c or 0)] for a, b, c in cur.fetchall())
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in _ACCESS_DENIED:
                self._identity = False
                return "", False
            raise
        self._identity = True
        return _digest(json.dumps(pairs)), True

"""What the downstream's catalogue says about the objects a DDL touches.

A DDL commits on its own, outside any transaction of ours, so "did it take effect?" cannot be
answered by the checkpoint after a crash: only the server's catalogue knows. A *fingerprint* of
the schemas a DDL touches is taken before it runs (and journaled, see :mod:`applier.apply.ddl`);
comparing it with a fingerprint taken later tells whether the catalogue changed in between.

Per schema the fingerprint holds whether the schema exists (with its default character set and
collation) and, per table or view, a digest of ``SHOW CREATE TABLE`` (the ``AUTO_INCREMENT``
counter removed: rows move it, DDL is what we look for) plus the table's *data identity*: the
storage engine's ids of the table and its partitions. The ids are what makes a DDL visible that
leaves every definition as it was: ``TRUNCATE`` (a new table id) and ``EXCHANGE PARTITION``
(the ids of the partition and the table swap). They come from
``information_schema.INNODB_SYS_TABLES`` (MariaDB), ``INNODB_TABLES`` (MySQL 8) or
``TIDB_TABLE_ID``/``TIDB_PARTITION_ID`` (TiDB); the InnoDB views need the PROCESS privilege.
Without it the fingerprint has definitions only (:attr:`Fingerprint.identity` False).

Whole schemas are fingerprinted, not just the tables a statement names: a name the statement
parser missed can then not hide a change.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

import pymysql

from sqlgen import Dialect
from sqlgen.quoting import quote_ident

_AUTO_INCREMENT = re.compile(r" AUTO_INCREMENT=\d+")
_ACCESS_DENIED = frozenset({1044, 1142, 1227})  # no privilege for an information_schema view


_ABSENT: dict = {"db": None, "tables": {}, "ids": ""}


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The catalogue of some schemas at one moment; ``schemas`` maps a schema name to its state."""

    schemas: dict[str, dict]
    identity: bool
    """Whether data identity (table ids) was visible; False without the PROCESS privilege."""

    def to_json(self) -> str:
        return json.dumps({"schemas": self.schemas, "identity": self.identity}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Fingerprint:
        data = json.loads(text)
        return cls(dict(data["schemas"]), bool(data["identity"]))

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
            if self.identity and later.identity and a["ids"] != b["ids"] and not out:
                out.append(f"{schema}: data (table or partition ids)")
        return out


def _digest(text: str) -> str:
    # 64 bits: enough to see a change, small enough that the journal row of a schema with
    # thousands of tables stays far below max_allowed_packet.
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _innodb_pattern(schema: str) -> str:
    """A LIKE pattern for the InnoDB names (``db/table``, encoded for the file system) of a schema.

    Letters, digits and ``_`` are kept by the server's file-name encoding; every other character
    becomes an ``@`` code whose form depends on the character, so it is matched with ``%``: the
    pattern may then also match another schema's tables, which only adds objects to compare.
    """
    out = []
    for ch in schema:
        if ch.isascii() and (ch.isalnum() or ch == "_"):
            out.append(_like_escape(ch))
        else:
            out.append("%")
    return "".join(out) + "/%"


class Catalogue:
    """Reads fingerprints on a session the caller owns (no transaction is left open)."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._identity: bool | None = None  # False once the ids were refused: not asked again

    def fingerprint(self, conn: pymysql.connections.Connection, schemas: Iterable[str]) -> Fingerprint:
        state: dict[str, dict] = {}
        identity = True
        try:
            with conn.cursor() as cur:
                for schema in sorted(set(schemas)):
                    entry, ids_ok = self._schema(cur, schema)
                    identity = identity and ids_ok
                    state[schema] = entry
        finally:
            # information_schema and SHOW reads open a transaction on a non-autocommit session;
            # ending it releases the metadata locks they took before the DDL needs them.
            conn.rollback()
        return Fingerprint(state, identity)

    def _schema(self, cur: pymysql.cursors.Cursor, schema: str) -> tuple[dict, bool]:
        cur.execute(
            "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA "
            "WHERE SCHEMA_NAME = %s",
            (schema,),
        )
        row = cur.fetchone()
        if row is None:
            return {"db": None, "tables": {}, "ids": ""}, True
        cur.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY TABLE_NAME",
            (schema,),
        )
        names = [r[0] for r in cur.fetchall()]
        ids, ids_ok = self._ids(cur, schema)
        tables: dict[str, str] = {}
        q = quote_ident(schema)
        for name in names:
            try:
                cur.execute(f"SHOW CREATE TABLE {q}.{quote_ident(name)}")
                created = cur.fetchone()
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] == 1146:  # dropped between the two reads
                    continue
                raise
            tables[name] = _digest(_AUTO_INCREMENT.sub("", str(created[1])))
        return {"db": f"{row[0]}/{row[1]}", "tables": tables, "ids": ids}, ids_ok

    def _ids(self, cur: pymysql.cursors.Cursor, schema: str) -> tuple[str, bool]:
        """A digest of every (object, id) pair of the schema's tables and partitions."""
        if self._identity is False:
            return "", False
        try:
            if self._dialect.name == "tidb":
                cur.execute(
                    "SELECT TABLE_NAME, '', TIDB_TABLE_ID FROM information_schema.TABLES "
                    "WHERE TABLE_SCHEMA = %s "
                    "UNION ALL SELECT TABLE_NAME, PARTITION_NAME, TIDB_PARTITION_ID FROM "
                    "information_schema.PARTITIONS WHERE TABLE_SCHEMA = %s AND PARTITION_NAME IS NOT NULL",
                    (schema, schema),
                )
            else:
                view = "INNODB_SYS_TABLES" if self._dialect.name == "mariadb" else "INNODB_TABLES"
                cur.execute(
                    f"SELECT NAME, '', TABLE_ID FROM information_schema.{view} WHERE NAME LIKE %s",
                    (_innodb_pattern(schema),),
                )
            pairs = sorted([str(a), str(b or ""), int(c or 0)] for a, b, c in cur.fetchall())
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] in _ACCESS_DENIED:
                self._identity = False
                return "", False
            raise
        self._identity = True
        return _digest(json.dumps(pairs)), True

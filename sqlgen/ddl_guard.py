"""Is a DDL event's text the DDL its type code and key describe? And which objects does it touch?

The query text of a DDL event comes from the topic and is run on the downstream with the daemon's
privileges. TiCDC only ever writes one DDL statement per event, of the kind its type code names,
on the table (or schema) of its key (docs/open-protocol.md §8). Anything else is not a TiCDC
event, whoever wrote it: :func:`check_ddl` refuses it with :class:`HostileDDL` before anything
runs, and otherwise returns the :class:`DDLTargets` the statement creates, drops, alters or names.

What is refused:

- more than one statement (a trailing ``;`` and comments are fine). Clauses inside MySQL/MariaDB
  executable comments (``/*!...*/``, ``/*M!...*/``) and TiDB's (``/*T![...] ...*/``, executed by
  a TiDB downstream) count as text; the text is read both with and without backslash escapes in
  strings, so no string boundary can hide a clause;
- a statement that is no DDL TiCDC writes (GRANT, CREATE USER, SET, DML, CALL, LOAD DATA, SELECT,
  FLUSH, KILL, CREATE FUNCTION/PROCEDURE/TRIGGER/EVENT, temporary tables, CREATE TABLE ... SELECT,
  ...), or a kind of DDL other than its type code describes;
- a statement on another table or schema than the key's, except where the type has a second
  table: RENAME TABLE (type 14, and 47), the EXCHANGE PARTITION partner (42), the source of
  CREATE TABLE ... LIKE, FOREIGN KEY ... REFERENCES, a MERGE table's UNION list;
- anything on a reserved schema: ``mysql``, ``information_schema``, ``performance_schema``,
  ``sys`` and the schemas the caller adds (the checkpoint schema), wherever the text qualifies a
  name with one of them (a view reading ``mysql.user`` too). Reserved names are compared
  case-insensitively (``INFORMATION_SCHEMA`` is the same schema on every server);
- clauses that reach outside the database: ``DATA DIRECTORY``/``INDEX DIRECTORY``,
  ``CONNECTION=``, storage engines that open files or remote servers (CONNECT, FEDERATED,
  SPIDER, ...), ``IMPORT``/``DISCARD TABLESPACE``, ``LOAD_FILE``, ``INTO OUTFILE/DUMPFILE``.

Names: schema and table names compare exactly (a server with ``lower_case_table_names=0``);
keywords case-insensitively; backticked names are unquoted (doubled backticks are one). An
unqualified table name is resolved against the key's schema, as the executor runs table DDL
after ``USE`` of that schema.

Type codes the table :data:`_TYPE_KINDS` does not know: only CREATE/ALTER/DROP of a schema,
table, view, index or sequence, RENAME TABLE and TRUNCATE are accepted, on the key's schema or
table, and a second table only in the key's schema. For the types TiDB-only DDL uses and
:data:`sqlgen.ddl.SKIP_DDL_TYPES` skips, the text never runs, so the key is not compared; the
kind and the reserved schemas still are (a GRANT there is a lie too).

The guard walks tokens (:mod:`sqlgen.sqltokens`) for the statement kind and the names at the
places where a DDL names objects; it never needs a full parse, which TiDB's DDL would often fail.
It is pure and cheap: the decoder calls it for every DDL event, the executor again before it runs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from applier.errors import ApplierError
from sqlgen.ddl import SKIP_DDL_TYPES
from sqlgen.sqltokens import INSIGNIFICANT, PUNCT, QIDENT, STRING, TIDB_COMMENT, WORD, Token, tokenize

__all__ = ["ALWAYS_RESERVED", "DDLTargets", "HostileDDL", "TableFlow", "check_ddl", "table_flows"]

ALWAYS_RESERVED = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
"""The server's own schemas: no replicated DDL may touch them."""


class HostileDDL(ApplierError):
    """A DDL event whose text is not the DDL its type code and key describe; the message says why."""


@dataclass(frozen=True, slots=True)
class DDLTargets:
    """What a DDL statement touches: ``schemas`` it creates, drops or alters, or whose tables it
    names; ``tables`` every (schema, table) it names, unqualified names resolved against the
    key's schema. The tables a view reads are not included (a view changes none of them)."""

    schemas: frozenset[str]
    tables: frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class TableFlow:
    """A table a statement takes a definition or rows from, and the table they go to: the old and
    new name of a RENAME (``moves``: the source is gone after it), the source and the new table of
    ``CREATE TABLE ... LIKE`` (the source stays), each direction of EXCHANGE PARTITION (both move).
    The table filter needs the direction: the key names only one side (docs/open-protocol.md §8.1)."""

    source: tuple[str, str]
    target: tuple[str, str]
    moves: bool


# --- statement kinds and the type codes that may carry them ---------------------------------------

CREATE_SCHEMA, DROP_SCHEMA, ALTER_SCHEMA = "CREATE DATABASE", "DROP DATABASE", "ALTER DATABASE"
CREATE_TABLE, DROP_TABLE, ALTER_TABLE = "CREATE TABLE", "DROP TABLE", "ALTER TABLE"
TRUNCATE, RENAME = "TRUNCATE TABLE", "RENAME TABLE"
CREATE_VIEW, DROP_VIEW = "CREATE VIEW", "DROP VIEW"
CREATE_INDEX, DROP_INDEX = "CREATE INDEX", "DROP INDEX"
CREATE_SEQ, ALTER_SEQ, DROP_SEQ = "CREATE SEQUENCE", "ALTER SEQUENCE", "DROP SEQUENCE"
TIDB_OBJECT = "a placement policy or resource group statement"
RECOVER_TABLE, FLASHBACK_SCHEMA = "RECOVER/FLASHBACK TABLE", "FLASHBACK DATABASE"
LOCK, UNLOCK, ADMIN = "LOCK TABLES", "UNLOCK TABLES", "ADMIN"

_ALTER = frozenset({ALTER_TABLE})
# The type codes that may carry each kind of statement. ``_ALTER`` is every other table-level
# ALTER: columns, indexes, keys, constraints, options, partitions, TTL, multi-schema change, and
# the TiDB-only ones that are skipped.
_CODES_BY_KINDS: dict[frozenset[str], tuple[int, ...]] = {
    frozenset({CREATE_SCHEMA}): (1,),
    frozenset({DROP_SCHEMA}): (2,),
    frozenset({ALTER_SCHEMA}): (26, 55, 77),
    frozenset({FLASHBACK_SCHEMA}): (63,),
    frozenset({CREATE_TABLE}): (3, 60),
    frozenset({DROP_TABLE}): (4,),
    frozenset({TRUNCATE}): (11,),
    frozenset({RECOVER_TABLE}): (25,),
    frozenset({RENAME}): (47,),
    frozenset({RENAME, ALTER_TABLE}): (14,),
    frozenset({ALTER_TABLE, CREATE_INDEX}): (7, 73),
    frozenset({ALTER_TABLE, DROP_INDEX}): (8, 33),
    frozenset({ALTER_TABLE, ALTER_SCHEMA}): (30,),
    frozenset({CREATE_VIEW}): (21,),
    frozenset({DROP_VIEW}): (24,),
    frozenset({CREATE_SEQ}): (34,),
    frozenset({ALTER_SEQ}): (35,),
    frozenset({DROP_SEQ}): (36,),
    frozenset({TIDB_OBJECT}): (51, 52, 53, 68, 69, 70),
    frozenset({LOCK}): (27,),
    frozenset({UNLOCK}): (28,),
    frozenset({ADMIN}): (29,),
    _ALTER: (
        *(5, 6, 9, 10, 12, 13, 15, 16, 17, 18, 19, 20, 22, 23, 31, 32, 37, 38, 39, 40, 41, 42),
        *(43, 44, 45, 48, 49, 50, 54, 56, 57, 58, 59, 61, 64, 65, 67, 71, 72, 74, 75),
    ),
}
_TYPE_KINDS: dict[int, frozenset[str]] = {
    code: kinds for kinds, codes in _CODES_BY_KINDS.items() for code in codes
}

_GENERIC_KINDS = frozenset(
    {
        CREATE_SCHEMA,
        DROP_SCHEMA,
        ALTER_SCHEMA,
        CREATE_TABLE,
        DROP_TABLE,
        ALTER_TABLE,
        TRUNCATE,
        RENAME,
        CREATE_VIEW,
        DROP_VIEW,
        CREATE_INDEX,
        DROP_INDEX,
        CREATE_SEQ,
        ALTER_SEQ,
        DROP_SEQ,
    }
)
"""What an unknown type code may be: DDL of the key's own schema or table."""

_SCHEMA_KINDS = frozenset({CREATE_SCHEMA, DROP_SCHEMA, ALTER_SCHEMA, FLASHBACK_SCHEMA})
_RENAME_TYPES = frozenset({14, 47})
_EXCHANGE_TYPE = 42

# Objects whose CREATE/ALTER/DROP no TiCDC DDL event carries: named in the refusal.
_FOREIGN_OBJECTS = frozenset(
    {
        "USER",
        "ROLE",
        "FUNCTION",
        "PROCEDURE",
        "TRIGGER",
        "EVENT",
        "SERVER",
        "TABLESPACE",
        "LOGFILE",
        "AGGREGATE",
        "PACKAGE",
        "INSTANCE",
        "SYNONYM",
        "STATS",
        "BINDING",
        "GLOBAL",
        "SESSION",
        "TEMPORARY",
    }
)
_ENGINES_OUTSIDE = frozenset(
    {"CONNECT", "FEDERATED", "FEDERATEDX", "SPIDER", "S3", "OQGRAPH", "CASSANDRA", "MERGE", "MRG_MYISAM"}
)
"""Engines that read files or other servers (or, MERGE, other tables by a list TiDB never writes)."""
_OUTSIDE_WORDS = frozenset({"LOAD_FILE", "OUTFILE", "DUMPFILE"})
_SCHEMA_OPTION_WORDS = frozenset(
    {"CHARACTER", "CHARSET", "COLLATE", "DEFAULT", "ENCRYPTION", "PLACEMENT", "READ", "SET", "COMMENT"}
)


# --- tokens ---------------------------------------------------------------------------------------


def _significant(query: str, backslash_escapes: bool) -> list[Token]:
    """Significant tokens of ``query``, the content of TiDB comments included (a TiDB downstream
    executes it; for the others it is removed before running, see :mod:`sqlgen.ddl`)."""
    out: list[Token] = []
    for t in tokenize(query, backslash_escapes=backslash_escapes):
        if t.kind == TIDB_COMMENT:
            inner = t.text[4:-2] if t.text.endswith("*/") else t.text[4:]
            if inner.startswith("["):
                close = inner.find("]")
                inner = inner[close + 1 :] if close >= 0 else ""
            out.extend(_significant(inner, backslash_escapes))
        elif t.kind not in INSIGNIFICANT:
            out.append(t)
    return out


def _ident(t: Token | None) -> str | None:
    """The name a WORD or backticked token stands for, else None."""
    if t is None:
        return None
    if t.kind == WORD:
        return t.text
    if t.kind == QIDENT:
        body = t.text[1:-1] if len(t.text) >= 2 and t.text.endswith("`") else t.text[1:]
        return body.replace("``", "`")
    return None


class _Walk:
    """A cursor over the significant tokens of one statement, with the paren depth of each."""

    def __init__(self, toks: list[Token], schema: str) -> None:
        self.toks = toks
        self.schema = schema
        self.depth: list[int] = []
        d = 0
        for t in toks:
            if t.kind == PUNCT and t.text == ")":
                d = max(d - 1, 0)
            self.depth.append(d)
            if t.kind == PUNCT and t.text == "(":
                d += 1
        self.i = 0

    def tok(self, i: int) -> Token | None:
        return self.toks[i] if 0 <= i < len(self.toks) else None

    def word(self, i: int | None = None) -> str:
        t = self.tok(self.i if i is None else i)
        return t.upper if t is not None else ""

    def punct(self, ch: str, i: int | None = None) -> bool:
        t = self.tok(self.i if i is None else i)
        return t is not None and t.kind == PUNCT and t.text == ch

    def accept(self, *words: str) -> bool:
        """Consume the words in sequence if they are next; True if they were."""
        for k, w in enumerate(words):
            if self.word(self.i + k) != w:
                return False
        self.i += len(words)
        return True

    def at_end(self) -> bool:
        return self.i >= len(self.toks)

    def name(self, what: str) -> str:
        """One (unqualified) identifier at the cursor."""
        n = _ident(self.tok(self.i))
        if n is None:
            raise HostileDDL(f"expected {what} at {self.show(self.i)}")
        self.i += 1
        return n

    def table(self, what: str = "a table name") -> tuple[str, str]:
        """``name`` or ``schema.name`` at the cursor, resolved against the key's schema."""
        first = self.name(what)
        if self.punct("."):
            self.i += 1
            return first, self.name(what)
        return self.schema, first

    def skip_if_exists(self) -> None:
        self.accept("IF", "NOT", "EXISTS") or self.accept("IF", "EXISTS")

    def show(self, i: int) -> str:
        t = self.tok(i)
        return "the end of the statement" if t is None else repr(t.text[:40])


# --- the check ------------------------------------------------------------------------------------


def check_ddl(
    query: str,
    ddl_type: int,
    schema: str,
    table: str,
    *,
    reserved_schemas: Collection[str] = (),
) -> DDLTargets:
    """The objects ``query`` touches, if it is the DDL that type ``ddl_type`` on the key
    (``schema``, ``table``) describes; else :class:`HostileDDL` with the reason (module docstring)."""
    reserved = ALWAYS_RESERVED | {s.casefold() for s in reserved_schemas}
    plain = _significant(query, True)
    targets = _check_tokens(plain, ddl_type, schema, table, reserved)
    if any(t.kind == STRING and "\\" in t.text for t in plain):
        # Under NO_BACKSLASH_ESCAPES these strings end elsewhere: that reading must pass too.
        _check_tokens(_significant(query, False), ddl_type, schema, table, reserved)
    return targets


def _check_tokens(
    toks: list[Token], ddl_type: int, schema: str, table: str, reserved: frozenset[str]
) -> DDLTargets:
    toks = _one_statement(toks)
    _no_reserved_qualifier(toks, reserved)
    walk = _Walk(toks, schema)
    kind, objects, seconds = _parse(walk, ddl_type)
    allowed = _TYPE_KINDS.get(ddl_type)
    if kind not in (allowed if allowed is not None else _GENERIC_KINDS):
        expected = " or ".join(sorted(allowed)) if allowed else "CREATE/ALTER/DROP/RENAME/TRUNCATE"
        raise HostileDDL(f"the text is {kind} but DDL type {ddl_type} is {expected}")
    schemas = {s for s, t in objects if not t} | {s for s, _ in seconds}
    tables = {(s, t) for s, t in objects if t} | set(seconds)
    schemas |= {s for s, _ in tables}
    if ddl_type not in SKIP_DDL_TYPES and kind != TIDB_OBJECT:
        _matches_key(kind, ddl_type, objects, seconds, schema, table)
    if allowed is None:
        for s, t in sorted(tables):
            if s != schema:
                raise HostileDDL(
                    f"DDL type {ddl_type} is unknown, so a table outside the key's schema "
                    f"({s}.{t}) is refused"
                )
    for s in sorted(schemas | ({schema} if schema else set())):
        if s.casefold() in reserved:
            raise HostileDDL(f"it touches the reserved schema {s!r}")
    return DDLTargets(frozenset(schemas), frozenset(tables))


def _one_statement(toks: list[Token]) -> list[Token]:
    """The tokens before the first ``;``; anything but more ``;`` after it is a second statement."""
    for i, t in enumerate(toks):
        if t.kind == PUNCT and t.text == ";":
            rest = [r for r in toks[i + 1 :] if not (r.kind == PUNCT and r.text == ";")]
            if rest:
                raise HostileDDL(f"more than one statement: {rest[0].text[:40]!r} follows a ';'")
            return toks[:i]
    if not toks:
        raise HostileDDL("the text holds no statement")
    return toks


def _no_reserved_qualifier(toks: list[Token], reserved: frozenset[str]) -> None:
    """Refuse ``reserved_schema.anything`` anywhere in the statement (a view's SELECT, a CHECK,
    a clause this module does not classify), and words that reach files outside the database."""
    for i, t in enumerate(toks):
        if t.kind == WORD and t.upper in _OUTSIDE_WORDS:
            raise HostileDDL(f"{t.text} reaches files outside the database")
        if i + 2 < len(toks) and toks[i + 1].kind == PUNCT and toks[i + 1].text == ".":
            if i > 0 and toks[i - 1].kind == PUNCT and toks[i - 1].text == ".":
                continue
            name = _ident(t)
            if name is not None and _ident(toks[i + 2]) is not None and name.casefold() in reserved:
                raise HostileDDL(f"it names {name}.{_ident(toks[i + 2])} in the reserved schema {name!r}")


def _matches_key(
    kind: str,
    ddl_type: int,
    objects: list[tuple[str, str]],
    seconds: list[tuple[str, str]],
    schema: str,
    table: str,
) -> None:
    """The statement's own object must be the key's (for RENAME and EXCHANGE PARTITION, either
    side: TiCDC keys RENAME by the new name, EXCHANGE PARTITION by the partitioned table in the
    classic architecture and by the normal table in the new one)."""
    if kind in _SCHEMA_KINDS:
        for s, _ in objects:
            # Producers that leave ``scm`` out of a schema DDL's key (docs/open-protocol.md §2)
            # give nothing to compare; the reserved schemas are still refused.
            if schema and s != schema:
                raise HostileDDL(f"it is {kind} of {s!r} but the event is keyed to schema {schema!r}")
        return
    key = (schema, table)
    if kind == RENAME and ddl_type == 14 and len(objects) > 1:
        raise HostileDDL("it renames several tables but DDL type 14 is one table's rename")
    if kind == RENAME or (kind == ALTER_TABLE and ddl_type in _RENAME_TYPES and seconds):
        sides = set(objects) | set(seconds)
        if key not in sides:
            raise HostileDDL(f"it renames {_names(sides)}, none of which is the key's {_name(key)}")
        return
    if kind == ALTER_TABLE and ddl_type == _EXCHANGE_TYPE and seconds:
        if key not in set(objects) | set(seconds):
            raise HostileDDL(
                f"it exchanges a partition of {_names(objects)} with {_names(seconds)}, "
                f"neither of which is the key's {_name(key)}"
            )
        return
    for obj in objects:
        if obj != key:
            raise HostileDDL(f"it is {kind} of {_name(obj)} but the event is keyed to {_name(key)}")


def _name(st: tuple[str, str]) -> str:
    return f"`{st[0]}`.`{st[1]}`"


def _names(sts: Collection[tuple[str, str]]) -> str:
    return ", ".join(_name(x) for x in sorted(sts))


# --- statement shapes -----------------------------------------------------------------------------

Parsed = tuple[str, list[tuple[str, str]], list[tuple[str, str]]]
"""(kind, the statement's own objects, second tables). A schema object is (schema, '')."""


def _parse(w: _Walk, ddl_type: int) -> Parsed:
    head = w.word(0)
    if not head:
        raise HostileDDL(f"the statement starts with {w.show(0)}, not a DDL keyword")
    w.i = 1
    if head == "CREATE":
        return _create(w, ddl_type)
    if head == "DROP":
        return _drop(w)
    if head == "ALTER":
        return _alter(w, ddl_type)
    if head == "RENAME":
        return _rename(w)
    if head == "TRUNCATE":
        w.accept("TABLE")
        obj = w.table()
        _expect_end(w, TRUNCATE)
        return TRUNCATE, [obj], []
    if head in ("RECOVER", "FLASHBACK"):
        if w.accept("DATABASE") or w.accept("SCHEMA"):
            return FLASHBACK_SCHEMA, [(w.name("a schema name"), "")], []
        if w.accept("TABLE"):
            if w.accept("BY", "JOB"):
                return RECOVER_TABLE, [], []
            return RECOVER_TABLE, [w.table()], []
    if head == "LOCK" and w.word() in ("TABLE", "TABLES"):
        return LOCK, [], []
    if head == "UNLOCK" and w.word() in ("TABLE", "TABLES"):
        return UNLOCK, [], []
    if head == "ADMIN":
        return ADMIN, [], []
    raise HostileDDL(f"{head} {w.word()}".strip() + " is not a DDL statement TiCDC replicates")


def _expect_end(w: _Walk, kind: str) -> None:
    if not w.at_end():
        raise HostileDDL(f"unexpected {w.show(w.i)} after {kind}")


def _refuse_foreign(verb: str, w: _Walk) -> None:
    word = w.word()
    if word in _FOREIGN_OBJECTS:
        raise HostileDDL(f"{verb} {word} is not a DDL statement TiCDC replicates")


def _create(w: _Walk, ddl_type: int) -> Parsed:
    or_replace = w.accept("OR", "REPLACE")
    view_clauses = _view_clauses(w)
    _refuse_foreign("CREATE", w)
    if w.accept("DATABASE") or w.accept("SCHEMA"):
        w.skip_if_exists()
        return CREATE_SCHEMA, [(w.name("a schema name"), "")], []
    if w.accept("VIEW"):
        w.skip_if_exists()
        return CREATE_VIEW, [w.table("a view name")], []
    if view_clauses:
        raise HostileDDL("ALGORITHM, DEFINER and SQL SECURITY belong to CREATE VIEW only")
    if w.accept("TABLE"):
        if or_replace:
            raise HostileDDL("CREATE OR REPLACE TABLE drops the table first; TiCDC never writes it")
        w.skip_if_exists()
        return _create_table(w)
    if w.accept("SEQUENCE"):
        w.skip_if_exists()
        return CREATE_SEQ, [w.table("a sequence name")], []
    if w.word() in ("PLACEMENT", "RESOURCE"):
        return TIDB_OBJECT, [], []
    if w.word(w.i + 1) in ("INDEX", "KEY"):
        w.accept("UNIQUE") or w.accept("FULLTEXT") or w.accept("SPATIAL") or w.accept("COLUMNAR")
        w.accept("VECTOR")
    if w.accept("INDEX") or w.accept("KEY"):
        return _create_index(w)
    raise HostileDDL(f"CREATE {w.word() or w.show(w.i)} is not a DDL statement TiCDC replicates")


def _view_clauses(w: _Walk) -> bool:
    """Skip ``ALGORITHM = x``, ``DEFINER = user``, ``SQL SECURITY x``; True if any was there."""
    seen = False
    while True:
        if w.accept("ALGORITHM"):
            if w.punct("="):
                w.i += 1
            w.i += 1
        elif w.accept("DEFINER"):
            if w.punct("="):
                w.i += 1
            _skip_user(w)
        elif w.accept("SQL", "SECURITY"):
            w.i += 1
        else:
            return seen
        seen = True


def _skip_user(w: _Walk) -> None:
    """``user[@host]`` (names or strings) or ``CURRENT_USER[()]``."""
    if w.accept("CURRENT_USER"):
        if w.punct("(") and w.punct(")", w.i + 1):
            w.i += 2
        return
    for part in range(2):
        t = w.tok(w.i)
        if t is None or t.kind not in (WORD, QIDENT, STRING):
            raise HostileDDL(f"expected a user name at {w.show(w.i)}")
        w.i += 1
        if part == 0 and not w.punct("@"):
            return
        if part == 0:
            w.i += 1


def _create_table(w: _Walk) -> Parsed:
    obj = w.table()
    seconds: list[tuple[str, str]] = []
    if w.accept("LIKE"):
        seconds.append(w.table())
        _expect_end(w, "CREATE TABLE ... LIKE")
        return CREATE_TABLE, [obj], seconds
    if w.punct("(") and w.word(w.i + 1) == "LIKE":
        w.i += 2
        seconds.append(w.table())
        if not w.punct(")"):
            raise HostileDDL(f"unexpected {w.show(w.i)} in CREATE TABLE (LIKE ...)")
        w.i += 1
        _expect_end(w, "CREATE TABLE (LIKE ...)")
        return CREATE_TABLE, [obj], seconds
    body = w.i
    for i in range(body, len(w.toks)):
        if w.depth[i] == 0 and w.word(i) in ("AS", "SELECT", "VALUES", "TABLE", "IGNORE", "REPLACE"):
            raise HostileDDL("CREATE TABLE ... SELECT copies rows from elsewhere; TiCDC never writes it")
    seconds.extend(_body_tables(w, body))
    return CREATE_TABLE, [obj], seconds


def _create_index(w: _Walk) -> Parsed:
    w.skip_if_exists()
    w.name("an index name")
    while not w.at_end() and w.word() != "ON":
        w.i += 1
    if not w.accept("ON"):
        raise HostileDDL("CREATE INDEX without ON table")
    obj = w.table()
    return CREATE_INDEX, [obj], _body_tables(w, w.i)


def _drop(w: _Walk) -> Parsed:
    _refuse_foreign("DROP", w)
    if w.accept("DATABASE") or w.accept("SCHEMA"):
        w.skip_if_exists()
        obj = w.name("a schema name")
        _expect_end(w, DROP_SCHEMA)
        return DROP_SCHEMA, [(obj, "")], []
    kinds = {"TABLE": DROP_TABLE, "TABLES": DROP_TABLE, "VIEW": DROP_VIEW, "SEQUENCE": DROP_SEQ}
    kind = kinds.get(w.word())
    if kind is not None:
        w.i += 1
        w.skip_if_exists()
        objs = [w.table()]
        while w.punct(","):
            w.i += 1
            objs.append(w.table())
        w.accept("RESTRICT") or w.accept("CASCADE")
        _expect_end(w, kind)
        return kind, objs, []
    if w.word() in ("PLACEMENT", "RESOURCE"):
        return TIDB_OBJECT, [], []
    if w.accept("INDEX") or w.accept("KEY"):
        w.skip_if_exists()
        w.name("an index name")
        if not w.accept("ON"):
            raise HostileDDL("DROP INDEX without ON table")
        obj = w.table()
        _options_only(w, DROP_INDEX)
        return DROP_INDEX, [obj], []
    raise HostileDDL(f"DROP {w.word() or w.show(w.i)} is not a DDL statement TiCDC replicates")


def _options_only(w: _Walk, kind: str) -> None:
    """What may follow DROP INDEX ... ON t: ``ALGORITHM [=] x``, ``LOCK [=] x``, ``WAIT n``, ``NOWAIT``."""
    while not w.at_end():
        if w.word() in ("ALGORITHM", "LOCK", "WAIT"):
            w.i += 1
            if w.punct("="):
                w.i += 1
            w.i += 1
        elif w.accept("NOWAIT"):
            pass
        else:
            raise HostileDDL(f"unexpected {w.show(w.i)} after {kind}")


def _alter(w: _Walk, ddl_type: int) -> Parsed:
    while w.word() in ("ONLINE", "OFFLINE", "IGNORE"):
        w.i += 1
    _refuse_foreign("ALTER", w)
    if w.accept("DATABASE") or w.accept("SCHEMA"):
        t = w.tok(w.i)
        if t is not None and (t.kind == QIDENT or (t.kind == WORD and t.upper not in _SCHEMA_OPTION_WORDS)):
            name = w.name("a schema name")
        else:
            name = w.schema
        _body_tables(w, w.i)
        return ALTER_SCHEMA, [(name, "")], []
    if w.accept("SEQUENCE"):
        w.skip_if_exists()
        return ALTER_SEQ, [w.table("a sequence name")], []
    if w.word() in ("PLACEMENT", "RESOURCE"):
        return TIDB_OBJECT, [], []
    if not w.accept("TABLE"):
        raise HostileDDL(f"ALTER {w.word() or w.show(w.i)} is not a DDL statement TiCDC replicates")
    obj = w.table()
    seconds = _body_tables(w, w.i)
    renamed = _alter_rename_target(w)
    partner = _exchange_partner(w)
    if renamed is not None:
        if ddl_type not in _RENAME_TYPES and ddl_type in _TYPE_KINDS:
            raise HostileDDL(f"it renames the table but DDL type {ddl_type} is no rename")
        seconds.append(renamed)
    if partner is not None:
        if ddl_type != _EXCHANGE_TYPE and ddl_type in _TYPE_KINDS:
            raise HostileDDL(f"it exchanges a partition but DDL type {ddl_type} is no EXCHANGE PARTITION")
        seconds.append(partner)
    return ALTER_TABLE, [obj], seconds


def _alter_rename_target(w: _Walk) -> tuple[str, str] | None:
    """``RENAME [TO|AS|=] name`` among the ALTER TABLE specs (not RENAME COLUMN/INDEX/KEY)."""
    for i in range(len(w.toks)):
        if w.depth[i] != 0 or w.word(i) != "RENAME" or w.word(i + 1) in ("COLUMN", "INDEX", "KEY"):
            continue
        if i > 0 and w.word(i - 1) == "TABLE":  # the ALTER's own name is RENAME: `ALTER TABLE rename`
            continue
        w.i = i + 1
        if w.word() in ("TO", "AS") or w.punct("="):
            w.i += 1
        return w.table()
    return None


def _exchange_partner(w: _Walk) -> tuple[str, str] | None:
    for i in range(len(w.toks)):
        if w.word(i) == "EXCHANGE" and w.word(i + 1) == "PARTITION" and w.depth[i] == 0:
            j = i + 3
            if w.word(j) == "WITH" and w.word(j + 1) == "TABLE":
                w.i = j + 2
                return w.table()
            raise HostileDDL("EXCHANGE PARTITION without WITH TABLE")
    return None


def _body_tables(w: _Walk, start: int) -> list[tuple[str, str]]:
    """Second tables in a CREATE/ALTER body (REFERENCES, a MERGE table's UNION list), and the
    refusal of clauses that reach outside the database."""
    found: list[tuple[str, str]] = []
    n = len(w.toks)
    i = start
    while i < n:
        word = w.word(i)
        if word == "SELECT":
            raise HostileDDL("a SELECT inside a DDL statement other than CREATE VIEW")
        if word in ("DIRECTORY",) and w.word(i - 1) in ("DATA", "INDEX"):
            raise HostileDDL(f"{w.word(i - 1)} DIRECTORY places files outside the data directory")
        if word == "CONNECTION":
            raise HostileDDL("CONNECTION makes the table a link to another server")
        if word == "TABLESPACE" and w.word(i - 1) in ("IMPORT", "DISCARD"):
            raise HostileDDL(f"{w.word(i - 1)} TABLESPACE replaces or deletes data files")
        if word == "ENGINE":
            j = i + 2 if w.punct("=", i + 1) else i + 1
            engine = (_ident(w.tok(j)) or "").upper()
            if engine in _ENGINES_OUTSIDE:
                raise HostileDDL(f"ENGINE={engine} reads files, other servers or other tables")
        if word == "REFERENCES":
            w.i = i + 1
            found.append(w.table())
            i = w.i
            continue
        if word == "UNION" and w.depth[i] == 0:
            j = i + 2 if w.punct("=", i + 1) else i + 1
            if w.punct("(", j):
                w.i = j + 1
                found.append(w.table())
                while w.punct(","):
                    w.i += 1
                    found.append(w.table())
                i = w.i
                continue
        i += 1
    return found


def _rename(w: _Walk) -> Parsed:
    if not (w.accept("TABLE") or w.accept("TABLES")):
        raise HostileDDL(f"RENAME {w.word() or w.show(w.i)} is not a DDL statement TiCDC replicates")
    olds: list[tuple[str, str]] = []
    news: list[tuple[str, str]] = []
    while True:
        olds.append(w.table())
        if not w.accept("TO"):
            raise HostileDDL(f"expected TO at {w.show(w.i)}")
        news.append(w.table())
        if not w.punct(","):
            break
        w.i += 1
    _expect_end(w, RENAME)
    return RENAME, news, olds


def table_flows(query: str, schema: str) -> list[TableFlow]:
    """The :class:`TableFlow` of a DDL the decoder already accepted (:func:`check_ddl`); none for
    statements without a second table, or whose text does not parse. Unqualified names resolve
    against ``schema`` (the key's), as in :func:`check_ddl`."""
    try:
        walk = _Walk(_one_statement(_significant(query, True)), schema)
        kind, objects, seconds = _parse(walk, 0)
    except HostileDDL:
        return []
    if kind == RENAME:  # _rename returns (new names, old names)
        return [TableFlow(old, new, True) for new, old in zip(objects, seconds, strict=True)]
    if kind == CREATE_TABLE and seconds and _like_form(walk):
        return [TableFlow(seconds[0], objects[0], False)]
    if kind == ALTER_TABLE and objects:
        walk.i = 0
        renamed = _alter_rename_target(walk)
        if renamed is not None:
            return [TableFlow(objects[0], renamed, True)]
        partner = _exchange_partner(walk)
        if partner is not None:
            return [TableFlow(partner, objects[0], True), TableFlow(objects[0], partner, True)]
    return []


def _like_form(w: _Walk) -> bool:
    """Is the CREATE TABLE just walked ``CREATE TABLE t LIKE s`` or ``... (LIKE s)``, rather than a
    body whose REFERENCES name other tables? (LIKE in a body is an operator, inside a CHECK.)"""
    return any(
        w.word(i) == "LIKE" and (w.depth[i] == 0 or (w.depth[i] == 1 and w.punct("(", i - 1)))
        for i in range(len(w.toks))
    )

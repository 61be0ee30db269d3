"""DDL handling rules: which DDL events to run, how, and TiDB-only clause removal.

:func:`plan_ddl` decides per DDL event (docs/open-protocol.md §6 and §8):

- skip DDL types that mean nothing outside TiDB (:data:`SKIP_DDL_TYPES`: the protocol's list —
  13 rebase auto id, 16 shard row id, 27/28/29 lock/unlock/repair, 30/31 TiFlash replica — plus
  the TiDB-only types TiCDC itself ignores: auto id cache, auto_random base, attributes, placement
  policies, table cache, statistics options);
- run schema-level DDL (1 create schema, 2 drop schema, 26 schema charset) without ``USE``, all
  others after ``USE `schema```; unknown type codes just run their query text;
- translate the query with :func:`translate_ddl`, and skip it if nothing is left (e.g.
  ``ALTER TABLE t SHARD_ROW_ID_BITS = 4``).

:func:`translate_ddl` removes the clauses MySQL and MariaDB reject, keeping every other byte of
the statement as upstream wrote it (see :mod:`sqlgen.sqltokens` for why this is a token rewrite
and not a sqlglot round trip):

- TiDB executable comments ``/*T![feature] ... */`` — inert on MySQL/MariaDB, removed for clarity;
- column attribute ``AUTO_RANDOM`` / ``AUTO_RANDOM(n[, m])`` (the BIGINT column stays; values
  always come from upstream, so no AUTO_INCREMENT is added);
- ``CLUSTERED`` / ``NONCLUSTERED`` after a PRIMARY KEY;
- table options ``SHARD_ROW_ID_BITS``, ``PRE_SPLIT_REGIONS``, ``AUTO_ID_CACHE``,
  ``AUTO_RANDOM_BASE``, ``TTL = col + INTERVAL n unit``, ``TTL_ENABLE``, ``TTL_JOB_INTERVAL``,
  TiDB statistics options, ``[DEFAULT] PLACEMENT POLICY [=] name`` (table, partition, database)
  and ``REMOVE TTL``, with the comma that separated them;
- the same inside MySQL executable comments (``/*!90000 ... */``), dropping comments left empty;
- TiDB's global index option ``GLOBAL``/``LOCAL`` (also as ``/*T![global_index] GLOBAL */``)
  and a partitioning change's ``UPDATE INDEXES (...)``. A global UNIQUE index of a CREATE TABLE
  that has a primary key becomes a plain index (docs/open-protocol.md §8.3 says why that is safe
  and why it is not done elsewhere).

Statements that exist only in TiDB (``CREATE/ALTER/DROP PLACEMENT POLICY``, ``... RESOURCE
GROUP``) translate to ''. Words are matched only where they are clauses, so a column that happens
to be called ``ttl`` or ``clustered`` is left alone. Anything unexpected leaves the query as it is:
translation never raises, the server's error is the better report.

All SQL returned here is meant to be executed *without* parameters (no ``%`` escaping).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlgen.dialect import Dialect
from sqlgen.quoting import quote_ident
from sqlgen.sqltokens import (
    EXEC_CLOSE,
    EXEC_OPEN,
    INSIGNIFICANT,
    PUNCT,
    QIDENT,
    STRING,
    TIDB_COMMENT,
    WORD,
    WS,
    Token,
    tokenize,
)

PROTOCOL_SKIP_DDL_TYPES = frozenset({13, 16, 27, 28, 29, 30, 31})
"""Skipped by the protocol's rules: rebase auto id, shard row id, lock/unlock/repair, TiFlash."""

TIDB_ONLY_DDL_TYPES = frozenset({39, 40, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59})
"""TiDB's ActionModifyTableAutoIdCache (39), ActionRebaseAutoRandomBase (40), table/partition
attributes (49, 50), placement policies (51-56), cache/nocache table (57, 59) and statistics
options (58): no MySQL/MariaDB meaning; TiCDC's own DDL puller ignores them too."""

SKIP_DDL_TYPES = PROTOCOL_SKIP_DDL_TYPES | TIDB_ONLY_DDL_TYPES
SCHEMA_DDL_TYPES = frozenset({1, 2, 26})
"""Create schema, drop schema, modify schema charset/collate: run without ``USE``."""


@dataclass(frozen=True, slots=True)
class DDLPlan:
    """How to run one DDL event. ``sql`` is the translated query ('' when ``execute`` is False);
    ``use_schema`` is the schema to select first, or None for schema-level DDL."""

    execute: bool
    sql: str
    use_schema: str | None
    reason: str

    def statements(self) -> list[str]:
        """SQL to run in order, each without parameters: [``USE `s```,] query; [] when skipped."""
        if not self.execute:
            return []
        if self.use_schema:
            return [f"USE {quote_ident(self.use_schema)}", self.sql]
        return [self.sql]


def plan_ddl(query: str, ddl_type: int, schema: str, dialect: Dialect) -> DDLPlan:
    """Decide what to do with a DDL event (``plan_ddl(ev.query, ev.ddl_type, ev.schema, d)``)."""
    if ddl_type in SKIP_DDL_TYPES:
        return DDLPlan(False, "", None, f"DDL type {ddl_type} has no meaning outside TiDB")
    sql = translate_ddl(query, dialect)
    if not sql.strip().rstrip(";").strip():
        return DDLPlan(False, "", None, "nothing left after removing TiDB-only clauses")
    use = None if ddl_type in SCHEMA_DDL_TYPES or not schema else schema
    return DDLPlan(True, sql, use, "execute")


def translate_ddl(query: str, dialect: Dialect) -> str:
    """``query`` without TiDB-only clauses when ``dialect.strip_tidb_ddl`` (see module docstring).

    Returns '' for statements that only exist in TiDB. Never raises: on any internal problem the
    query is returned unchanged.
    """
    if not dialect.strip_tidb_ddl:
        return query
    try:
        return _Rewriter(tokenize(query)).run()
    except Exception:  # a rewriting bug must not stop replication; the server will judge the text
        return query


# --- rewriting ------------------------------------------------------------------------------------

_TABLE_OPTIONS = frozenset(
    {
        "SHARD_ROW_ID_BITS",
        "PRE_SPLIT_REGIONS",
        "AUTO_ID_CACHE",
        "AUTO_RANDOM_BASE",
        "TTL_ENABLE",
        "TTL_JOB_INTERVAL",
        "STATS_BUCKETS",
        "STATS_TOPN",
        "STATS_COLS_CHOICE",
        "STATS_COL_LIST",
        "STATS_SAMPLE_RATE",
    }
)
# Words after which the next word is a name (column, index, table), never a clause.
_NAME_POSITION = frozenset(
    {
        "COLUMN",
        "CHANGE",
        "MODIFY",
        "DROP",
        "AFTER",
        "TO",
        "ALTER",
        "KEY",
        "INDEX",
        "BY",
        "RENAME",
        "ADD",
        "TABLE",
        "ON",
        "AS",
        "REFERENCES",
        "CONSTRAINT",
        "UNIQUE",
        "FULLTEXT",
        "SPATIAL",
        "EXISTS",
        "PARTITION",
    }
)
# What may follow the AUTO_RANDOM attribute in a column definition.
_AFTER_ATTRIBUTE = frozenset(
    {
        "PRIMARY",
        "KEY",
        "NOT",
        "NULL",
        "COMMENT",
        "UNIQUE",
        "DEFAULT",
        "UNSIGNED",
        "SIGNED",
        "ZEROFILL",
        "COLLATE",
        "CHARACTER",
        "CHARSET",
        "AUTO_INCREMENT",
        "REFERENCES",
        "CHECK",
        "CONSTRAINT",
        "FIRST",
        "AFTER",
        "INVISIBLE",
        "VISIBLE",
        "COLUMN_FORMAT",
        "STORAGE",
        "ON",
        "GENERATED",
        "AS",
        "CLUSTERED",
        "NONCLUSTERED",
    }
)
_TIME_UNITS = frozenset(
    {
        "MICROSECOND",
        "SECOND",
        "MINUTE",
        "HOUR",
        "DAY",
        "WEEK",
        "MONTH",
        "QUARTER",
        "YEAR",
        "SECOND_MICROSECOND",
        "MINUTE_MICROSECOND",
        "MINUTE_SECOND",
        "HOUR_MICROSECOND",
        "HOUR_SECOND",
        "HOUR_MINUTE",
        "DAY_MICROSECOND",
        "DAY_SECOND",
        "DAY_MINUTE",
        "DAY_HOUR",
        "YEAR_MONTH",
    }
)
_CLOSERS = frozenset({",", ")", ";"})


def _is_global_comment(t: Token) -> bool:
    if t.kind != TIDB_COMMENT:
        return False
    inner = t.text[4:-2]
    if inner.startswith("["):
        inner = inner[inner.find("]") + 1 :]
    return inner.strip().upper() == "GLOBAL"


class _Rewriter:
    """Marks tokens for removal, then renders the survivors with tidy whitespace."""

    def __init__(self, toks: list[Token]) -> None:
        # TiDB may write the global index option as ``/*T![global_index] GLOBAL */``: read it as
        # the word, so that the index loses its UNIQUE where that is safe (see global_index).
        toks = [Token(WORD, "GLOBAL") if _is_global_comment(t) else t for t in toks]
        self.toks = toks
        self.removed = [False] * len(toks)
        self.replaced: dict[int, str] = {}
        # significant tokens: indexes into toks, and the paren depth in front of each
        self.sig: list[int] = []
        self.depth: list[int] = []
        d = 0
        for i, t in enumerate(toks):
            if t.kind in INSIGNIFICANT:
                continue
            if t.kind == PUNCT and t.text == ")":
                d = max(d - 1, 0)
            self.sig.append(i)
            self.depth.append(d)
            if t.kind == PUNCT and t.text == "(":
                d += 1

    # helpers on significant positions (p = index into self.sig)
    def tok(self, p: int) -> Token | None:
        return self.toks[self.sig[p]] if 0 <= p < len(self.sig) else None

    def word(self, p: int) -> str:
        t = self.tok(p)
        return t.upper if t is not None else ""

    def punct(self, p: int, ch: str) -> bool:
        t = self.tok(p)
        return t is not None and t.kind == PUNCT and t.text == ch

    def punct_any(self, p: int, chars: str) -> bool:
        t = self.tok(p)
        return t is not None and t.kind == PUNCT and t.text in chars

    def kept(self, p: int) -> bool:
        return not self.removed[self.sig[p]]

    def prev_kept(self, p: int) -> int:
        q = p - 1
        while q >= 0 and not self.kept(q):
            q -= 1
        return q

    def next_kept(self, p: int) -> int:
        q = p + 1
        while q < len(self.sig) and not self.kept(q):
            q += 1
        return q

    def remove(self, p_from: int, p_to: int) -> None:
        """Remove significant tokens p_from..p_to and everything between them."""
        for i in range(self.sig[p_from], self.sig[p_to] + 1):
            self.removed[i] = True

    def remove_clause(self, p_from: int, p_to: int) -> None:
        """Remove a clause; at depth 0 also the comma that separated it from its neighbours."""
        if self.depth[p_from] == 0:
            before = self.prev_kept(p_from)
            after = self.next_kept(p_to)
            if before >= 0 and self.punct(before, ","):
                p_from = before
            elif self.punct(after, ","):
                p_to = after
        self.remove(p_from, p_to)

    # statement classification
    def statement_kind(self) -> str:
        """'table', 'database', 'tidb_only' or 'other' from the leading keywords."""
        words = [self.word(p) for p in range(min(len(self.sig), 6))]
        if not words:
            return "other"
        head = words[0]
        rest = [
            w
            for w in words[1:]
            if w not in ("OR", "REPLACE", "TEMPORARY", "GLOBAL", "ONLINE", "OFFLINE", "IGNORE")
        ]
        second = rest[0] if rest else ""
        if head in ("CREATE", "ALTER", "DROP") and second in ("PLACEMENT", "RESOURCE"):
            return "tidb_only"
        if head in ("CREATE", "ALTER") and second == "TABLE":
            return "table"
        if head in ("CREATE", "ALTER") and second in ("DATABASE", "SCHEMA"):
            return "database"
        if head == "CREATE" and second in ("UNIQUE", "INDEX", "FULLTEXT", "SPATIAL"):
            return "index"
        return "other"

    def run(self) -> str:
        for i, t in enumerate(self.toks):
            if t.kind == TIDB_COMMENT:
                self.removed[i] = True
        kind = self.statement_kind()
        if kind == "tidb_only":
            return ""
        if kind in ("table", "database", "index"):
            self.rewrite(table=kind != "database")
            if self.word(0) == "ALTER" and self.alter_is_empty():
                return ""
        self.drop_empty_exec_comments()
        return self.render()

    def rewrite(self, table: bool) -> None:
        n = len(self.sig)
        pk_depth = -1  # >= 0 while inside a PRIMARY KEY clause at that depth
        p = 0
        while p < n:
            if not self.kept(p):
                p += 1
                continue
            t = self.tok(p)
            assert t is not None
            d = self.depth[p]
            w = t.upper
            if pk_depth >= 0 and (d < pk_depth or (d == pk_depth and self.punct(p, ","))):
                pk_depth = -1
            prev_w = self.word(self.prev_kept(p))
            prev_is_name_pos = prev_w in _NAME_POSITION or self.punct(self.prev_kept(p), ".")
            if w == "PLACEMENT" and self.word(p + 1) == "POLICY" and not prev_is_name_pos:
                end = self.option_value_end(p + 2)
                if end is not None:
                    start = p
                    before = self.prev_kept(p)
                    if before >= 0 and self.word(before) == "DEFAULT":
                        start = before
                    self.remove_clause(start, end)
                    p = end + 1
                    continue
            if not table:
                p += 1
                continue
            if w == "PRIMARY" and self.word(p + 1) == "KEY":
                pk_depth = d
            elif w in ("CLUSTERED", "NONCLUSTERED") and pk_depth == d and not self.punct(p + 1, "("):
                self.remove(p, p)
            elif w in ("GLOBAL", "LOCAL") and self.global_index(p):
                pass
            elif d == 0 and w == "UPDATE" and self.word(p + 1) == "INDEXES" and self.punct(p + 2, "("):
                end = self.paren_end(p + 2)
                if end is not None:
                    self.remove(p, end)
                    p = end + 1
                    continue
            elif w == "AUTO_RANDOM" and self.attribute_position(p):
                end = self.auto_random_end(p)
                if end is not None:
                    self.remove(p, end)
                    p = end + 1
                    continue
            elif d == 0 and w in _TABLE_OPTIONS and not prev_is_name_pos:
                end = self.option_value_end(p + 1, numeric_without_eq=True)
                if end is not None:
                    self.remove_clause(p, end)
                    p = end + 1
                    continue
            elif d == 0 and w == "TTL" and not prev_is_name_pos:
                end = self.ttl_end(p)
                if end is not None:
                    self.remove_clause(p, end)
                    p = end + 1
                    continue
            elif d == 0 and w == "REMOVE" and self.word(p + 1) == "TTL" and not prev_is_name_pos:
                self.remove_clause(p, p + 1)
                p += 2
                continue
            p += 1

    def paren_end(self, p: int) -> int | None:
        """Position of the ``)`` closing the ``(`` at ``p``, or None."""
        for q in range(p + 1, len(self.sig)):
            if self.depth[q] == self.depth[p] and self.punct(q, ")"):
                return q
        return None

    def clause_start(self, p: int) -> int:
        """First position of the comma-separated clause holding ``p`` (at ``p``'s depth)."""
        d = self.depth[p]
        q = p
        while q > 0 and self.depth[q - 1] >= d and not (self.depth[q - 1] == d and self.punct(q - 1, ",")):
            q -= 1
        return q

    def global_index(self, p: int) -> bool:
        """Handle TiDB's ``GLOBAL``/``LOCAL`` index option at ``p``: remove it, and turn a global
        UNIQUE index into a plain index where that keeps replication exact (docs/open-protocol.md
        §8.3): a TiDB global unique index need not contain the partitioning columns, which MySQL
        and MariaDB refuse for any unique index of a partitioned table (error 1503)."""
        start = self.clause_start(p)
        if self.punct(start, "(") and self.depth[start] < self.depth[p]:
            start += 1
        words = [self.word(q) for q in range(start, p) if self.depth[q] == self.depth[p]]
        if not {"KEY", "INDEX", "UNIQUE", "PRIMARY"} & set(words):
            return False  # not an index option (CREATE GLOBAL TEMPORARY TABLE, a name, ...)
        if self.punct(p + 1, "("):
            return False  # an index called global: ``KEY global (c)``
        after = self.prev_kept(p)
        if not self.punct(after, ")") and self.word(after) not in ("KEY", "UNIQUE", "PRIMARY"):
            return False
        self.remove(p, p)
        if self.word(p) == "GLOBAL" and words[0] == "UNIQUE" and self.has_local_primary_key():
            # Table-level ``UNIQUE [KEY|INDEX] [name] (cols)``: the primary key is the handle
            # key, so REPLACE by it converges without this index being unique downstream.
            if self.word(start + 1) in ("KEY", "INDEX"):
                self.remove(start, start)
            else:
                self.replaced[self.sig[start]] = "KEY"
        return True

    def has_local_primary_key(self) -> bool:
        """A CREATE TABLE that declares a primary key without the GLOBAL option."""
        if self.word(0) != "CREATE":
            return False
        for q in range(len(self.sig)):
            if self.word(q) == "PRIMARY" and self.word(q + 1) == "KEY" and self.depth[q] == 1:
                end = q + 2
                while (
                    end < len(self.sig)
                    and not (self.depth[end] == 1 and self.punct_any(end, ","))
                    and self.depth[end] >= 1
                ):
                    if self.word(end) == "GLOBAL" and self.depth[end] == 1:
                        return False
                    end += 1
                return True
        return False

    def option_value_end(self, p: int, numeric_without_eq: bool = False) -> int | None:
        """Position of the value of an option whose ``[=]`` would be at ``p``, or None."""
        if self.punct(p, "="):
            t = self.tok(p + 1)
            if t is not None and t.kind in (WORD, STRING, QIDENT):
                return p + 1
            return None
        t = self.tok(p)
        if t is None:
            return None
        if numeric_without_eq:
            if t.kind == STRING or (t.kind == WORD and t.text[0].isdigit()):
                return p
            return None
        if t.kind in (WORD, STRING, QIDENT):
            return p
        return None

    def attribute_position(self, p: int) -> bool:
        """Whether the word at ``p`` stands where a column attribute can (after a type or another
        attribute, including ``PRIMARY KEY``), not where a column or index name does."""
        before = self.prev_kept(p)
        if before < 0 or self.punct_any(before, "(,."):
            return False
        w = self.word(before)
        if w == "KEY":
            return self.word(self.prev_kept(before)) == "PRIMARY"
        return w not in _NAME_POSITION

    def auto_random_end(self, p: int) -> int | None:
        """End of ``AUTO_RANDOM[(n[, m])]`` at ``p`` if it is the column attribute, else None."""
        q = p + 1
        if self.punct(q, "("):
            r = q + 1
            while r < len(self.sig) and not self.punct(r, ")"):
                t = self.tok(r)
                assert t is not None
                if not (self.punct(r, ",") or (t.kind == WORD and t.text.isdigit())):
                    return None
                r += 1
            return r if r < len(self.sig) else None
        t = self.tok(q)
        if t is None or (t.kind == PUNCT and t.text in _CLOSERS) or t.upper in _AFTER_ATTRIBUTE:
            return p
        return None

    def ttl_end(self, p: int) -> int | None:
        """End of ``TTL [=] col + INTERVAL expr unit`` starting at ``p``, or None."""
        q = p + 1
        if self.punct(q, "="):
            q += 1
        t = self.tok(q)
        if t is None or t.kind not in (WORD, QIDENT):
            return None
        q += 1
        while self.punct(q, ".") and self.tok(q + 1) is not None:
            q += 2
        if not self.punct(q, "+") or self.word(q + 1) != "INTERVAL":
            return None
        base = self.depth[q]
        r = q + 3  # at least one expression token after INTERVAL
        while r < len(self.sig):
            if self.depth[r] == base and self.word(r) in _TIME_UNITS:
                return r
            if self.depth[r] < base:
                return None
            r += 1
        return None

    def alter_is_empty(self) -> bool:
        """True for ``ALTER TABLE name`` / ``ALTER DATABASE [name]`` with nothing left to do."""
        rest = [p for p in range(len(self.sig)) if self.kept(p) and not self.punct(p, ";")]
        words = [self.word(p) for p in rest]
        i = 1
        while i < len(words) and words[i] in ("ONLINE", "OFFLINE", "IGNORE"):
            i += 1
        if i >= len(words):
            return False
        if words[i] == "TABLE":
            i += 1
            i += 1  # the table name
            while i + 1 < len(rest) and self.punct(rest[i], "."):
                i += 2
            return i >= len(rest)
        if words[i] in ("DATABASE", "SCHEMA"):
            left = rest[i + 1 :]
            if not left:
                return True
            t = self.tok(left[0])
            return len(left) == 1 and t is not None and t.kind in (WORD, QIDENT)
        return False

    def drop_empty_exec_comments(self) -> None:
        open_at = -1
        for i, t in enumerate(self.toks):
            if t.kind == EXEC_OPEN:
                open_at = i
            elif t.kind == EXEC_CLOSE and open_at >= 0:
                inner = range(open_at + 1, i)
                if all(self.removed[j] or self.toks[j].kind == WS for j in inner):
                    for j in range(open_at, i + 1):
                        self.removed[j] = True
                open_at = -1

    def render(self) -> str:
        out: list[Token] = []
        pending = False  # a removed run sits between out[-1] and the next kept token
        for i, t in enumerate(self.toks):
            if self.removed[i]:
                pending = True
                continue
            if pending:
                self.join_gap(out, t)
                pending = False
            out.append(Token(t.kind, self.replaced[i]) if i in self.replaced else t)
        if pending:
            self.join_gap(out, None)
        return "".join(t.text for t in out)

    @staticmethod
    def join_gap(out: list[Token], nxt: Token | None) -> None:
        """Keep the text around a removed run well-formed: no doubled or dangling whitespace,
        and never two words glued together."""
        prev = out[-1] if out else None
        if prev is None:
            return
        nxt_is_closer = nxt is None or nxt.kind == WS or (nxt.kind == PUNCT and nxt.text in _CLOSERS)
        if prev.kind == WS:
            if nxt_is_closer:
                out.pop()
            return
        after_open = prev.kind == PUNCT and prev.text == "("
        if not nxt_is_closer and not after_open:
            out.append(Token(WS, " "))

"""DDL text with its table and schema names routed (:mod:`sqlgen.route`).

TiCDC sends a DDL as the statement upstream ran, in the schema it ran in (``DDLEvent.schema``), so
its names may be unqualified. :func:`route_ddl_query` first qualifies every table name with that
schema, then replaces each ``schema.table`` with its routed name, always written qualified and
backquoted (```dst`.`t```), so the statement means the same whatever ``USE`` precedes it. Every
other byte of the statement stays as upstream wrote it: the names are edited in place, the
statement is never generated again (:mod:`sqlgen.sqltokens` says why).

Where the names are, in this order:

1. **sqlglot's MySQL parser.** When the statement parses (not as a bare ``Command``), its
   ``Table`` nodes are the table names (CREATE/DROP/ALTER/TRUNCATE TABLE, ``LIKE``, ``REFERENCES``,
   ``ALTER TABLE ... RENAME TO``, CREATE/DROP INDEX ``ON``, CREATE/DROP VIEW and the tables a view
   reads) and sqlglot reports where each identifier starts and ends in the text. A CREATE/DROP
   DATABASE names a schema, routed as a whole.
2. **Token-level fallback**, for what sqlglot does not parse (RENAME TABLE of several tables,
   partition DDL such as ``ADD``/``EXCHANGE``/``TRUNCATE``/``REORGANIZE PARTITION``, ``CREATE
   TABLE ... PARTITION BY``, ``ALTER DATABASE``, TiDB-only clauses): the lossless lexer of
   :mod:`sqlgen.sqltokens` and a name (``t``, ```t```, ``s.t``, ```s`.`t```) in one of these
   positions only: after ``TABLE`` or ``VIEW`` (skipping ``IF [NOT] EXISTS``), after ``LIKE`` and
   ``REFERENCES``, after the first ``ON`` of an index statement, after ``RENAME [TO|AS]`` of an
   ALTER TABLE, after ``TO`` and after each comma of a ``RENAME TABLE`` list, after each comma of a
   ``DROP TABLE``/``DROP VIEW`` list; and the schema after ``CREATE/DROP/ALTER DATABASE|SCHEMA
   [IF [NOT] EXISTS]``. A word anywhere else (a column, an index, a partition, a view's body) is
   never touched.

Views: the view's own name is routed; the tables its body reads are routed too when sqlglot
parses the statement (a column qualified by a table whose name changed follows it), so the view
reads the replicated tables. When it does not parse, the body is left as upstream wrote it.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

from applier.codec.events import DDLEvent
from sqlgen.ddl import SCHEMA_DDL_TYPES
from sqlgen.quoting import quote_ident, quote_table
from sqlgen.route import Router
from sqlgen.sqltokens import INSIGNIFICANT, PUNCT, QIDENT, WORD, Token, tokenize

if TYPE_CHECKING:  # imported where a DDL is routed: every process that decodes imports this module
    from sqlglot import exp

Edit = tuple[int, int, str]
"""Replace ``query[start:end]`` by the text."""

DROP_SCHEMA_DDL_TYPE = 2


def route_ddl(ddl: DDLEvent, router: Router) -> DDLEvent:
    """``ddl`` as it runs downstream: its schema, table and query routed (the same event when there
    are no rules). The key of the event for the checkpoint stays the upstream one: callers record
    the original event."""
    if not router:
        return ddl
    if ddl.ddl_type in SCHEMA_DDL_TYPES or not ddl.table:
        schema, table = router.schema(ddl.schema), ddl.table
    else:
        schema, table = router.table(ddl.schema, ddl.table)
    query = route_ddl_query(ddl.query, ddl.schema, router)
    return DDLEvent(ddl.commit_ts, schema, table, query, ddl.ddl_type, ddl.pos)


def route_ddl_query(query: str, schema: str, router: Router) -> str:
    """``query`` (run upstream in ``schema``) with its names routed: sqlglot where it parses the
    statement, else the token-level fallback (module docstring)."""
    if not router:
        return query
    edits = sqlglot_edits(query, schema, router)
    if edits is None:
        edits = token_edits(query, schema, router)
    return _apply(query, edits)


def _apply(query: str, edits: list[Edit]) -> str:
    out: list[str] = []
    at = 0
    for start, end, text in sorted(edits):
        out.append(query[at:start])
        out.append(text)
        at = end
    out.append(query[at:])
    return "".join(out)


# -- 1. sqlglot -------------------------------------------------------------------------------------


class _NoCommandFallbackWarning(logging.Filter):
    """sqlglot logs a warning for each statement it reads as a bare ``Command``: that is the
    signal to use the fallback here, not something for the applier's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_NoCommandFallbackWarning())


def sqlglot_edits(query: str, schema: str, router: Router) -> list[Edit] | None:
    """The name edits sqlglot's tree gives, or None when the statement does not parse (or a name's
    position is not known exactly): then the fallback decides.

    sqlglot is imported here, on the first DDL routed, not with the module: ``sqlgen`` is imported
    by every process that decodes (the catch-up's Spark workers among them), and sqlglot's import
    took 65-90 ms of each one's start."""
    import sqlglot
    from sqlglot import exp

    try:
        trees = [t for t in sqlglot.parse(query, read="mysql") if t is not None]
    except Exception:  # sqlglot's errors have no common root worth naming here
        return None
    if len(trees) != 1 or isinstance(trees[0], exp.Command):
        return None
    tree = trees[0]
    kind = str(tree.args.get("kind") or "").upper()
    edits: list[Edit] = []
    if isinstance(tree, exp.Create | exp.Drop) and kind in ("DATABASE", "SCHEMA"):
        node = tree.this if isinstance(tree, exp.Create) else (tree.args.get("tables") or [None])[0]
        ident = node.this if isinstance(node, exp.Table) else None
        span = _span(query, ident)
        if span is None:
            return None
        return [(span[0], span[1], quote_ident(router.schema(ident.name)))]
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    renamed: dict[str, str] = {}
    for node in tree.find_all(exp.Table):
        drop = node.parent
        if isinstance(drop, exp.Drop) and str(drop.args.get("kind") or "").upper() not in ("TABLE", "VIEW"):
            continue  # DROP INDEX i ON t, ALTER TABLE t DROP INDEX i: ``i`` is an index
        ident, db = node.args.get("this"), node.args.get("db")
        if node.args.get("catalog") is not None or not isinstance(ident, exp.Identifier):
            return None
        if db is None and ident.name.lower() in ctes:
            continue
        span = _span(query, ident)
        first = _span(query, db) if db is not None else span
        if span is None or first is None:
            return None
        target = router.table(db.name if db is not None else schema, ident.name)
        edits.append((first[0], span[1], quote_table(*target)))
        if not node.alias and target[1] != ident.name:
            renamed[ident.name.lower()] = target[1]
    for col in tree.find_all(exp.Column):
        table, db = col.args.get("table"), col.args.get("db")
        if table is None:
            continue
        if col.args.get("catalog") is not None:
            return None
        span = _span(query, table)
        if span is None:
            return None
        if db is not None:
            first = _span(query, db)
            if first is None:
                return None
            edits.append((first[0], span[1], quote_table(*router.table(db.name, table.name))))
        elif table.name.lower() in renamed:
            edits.append((span[0], span[1], quote_ident(renamed[table.name.lower()])))
    return edits if _disjoint(edits) else None


def _span(query: str, ident: exp.Expression | None) -> tuple[int, int] | None:
    """[start, end) of an identifier in ``query``, checked against its name; None if unknown."""
    from sqlglot import exp

    if not isinstance(ident, exp.Identifier):
        return None
    start, end = ident.meta.get("start"), ident.meta.get("end")
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    text = query[start : end + 1]
    name = text[1:-1].replace("``", "`") if text.startswith("`") and text.endswith("`") else text
    return (start, end + 1) if name == ident.name else None


def _disjoint(edits: list[Edit]) -> bool:
    spans = sorted((s, e) for s, e, _ in edits)
    return all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


# -- 2. tokens --------------------------------------------------------------------------------------


def _ident(tok: Token) -> str | None:
    if tok.kind == QIDENT and len(tok.text) >= 2 and tok.text.endswith("`"):
        return tok.text[1:-1].replace("``", "`")
    if tok.kind == WORD:
        return tok.text
    return None


class _Names:
    """The significant tokens of a statement, with their offsets in the text and paren depth."""

    def __init__(self, query: str) -> None:
        self.toks: list[Token] = []
        self.start: list[int] = []
        self.depth: list[int] = []
        at = 0
        d = 0
        for t in tokenize(query):
            if t.kind not in INSIGNIFICANT:
                if t.kind == PUNCT and t.text == ")":
                    d = max(d - 1, 0)
                self.toks.append(t)
                self.start.append(at)
                self.depth.append(d)
                if t.kind == PUNCT and t.text == "(":
                    d += 1
            at += len(t.text)

    def word(self, p: int) -> str:
        return self.toks[p].upper if 0 <= p < len(self.toks) else ""

    def punct(self, p: int, ch: str) -> bool:
        return 0 <= p < len(self.toks) and self.toks[p].kind == PUNCT and self.toks[p].text == ch

    def skip_if_exists(self, p: int) -> int:
        if self.word(p) == "IF" and self.word(p + 1) == "NOT" and self.word(p + 2) == "EXISTS":
            return p + 3
        if self.word(p) == "IF" and self.word(p + 1) == "EXISTS":
            return p + 2
        return p

    def name(self, p: int) -> tuple[int, int, str | None, str] | None:
        """The name at ``p``: (first position, last position, schema or None, name), or None."""
        if p >= len(self.toks):
            return None
        first = _ident(self.toks[p])
        if first is None:
            return None
        if self.punct(p + 1, ".") and p + 2 < len(self.toks):
            second = _ident(self.toks[p + 2])
            if second is None:
                return None
            return p, p + 2, first, second
        return p, p, None, first

    def span(self, first: int, last: int) -> tuple[int, int]:
        return self.start[first], self.start[last] + len(self.toks[last].text)


def token_edits(query: str, schema: str, router: Router) -> list[Edit]:
    """The name edits of the token-level fallback (module docstring, 2.)."""
    n = _Names(query)
    head = [n.word(p) for p in range(min(len(n.toks), 8))]
    edits: list[Edit] = []
    done: set[int] = set()

    def table_at(p: int) -> int:
        """Route the table name at ``p``; returns the position after it (``p`` if none is there)."""
        found = n.name(p)
        if found is None or p in done:
            return p
        first, last, db, name = found
        done.add(p)
        start, end = n.span(first, last)
        edits.append((start, end, quote_table(*router.table(db if db is not None else schema, name))))
        return last + 1

    verb = head[0] if head else ""
    second = next((w for w in head[1:] if w not in ("OR", "REPLACE", "TEMPORARY", "UNIQUE")), "")
    if verb in ("CREATE", "DROP", "ALTER") and second in ("DATABASE", "SCHEMA"):
        p = n.skip_if_exists(head.index(second) + 1)
        found = n.name(p)
        if found is not None and found[2] is None:
            start, end = n.span(found[0], found[1])
            edits.append((start, end, quote_ident(router.schema(found[3]))))
        return edits
    index_statement = verb in ("CREATE", "DROP") and "INDEX" in head[:4]
    table_statement = second == "TABLE"
    list_statement = verb in ("RENAME", "DROP") and second in ("TABLE", "TABLES", "VIEW")
    seen_on = False
    for p, tok in enumerate(n.toks):
        w = tok.upper
        if w in ("TABLE", "VIEW"):
            table_at(n.skip_if_exists(p + 1))
        elif w in ("LIKE", "REFERENCES") and table_statement:
            table_at(p + 1)
        elif w == "ON" and index_statement and not seen_on and n.depth[p] == 0:
            seen_on = True
            table_at(p + 1)
        elif w == "RENAME" and verb == "ALTER" and n.depth[p] == 0:
            after = n.word(p + 1)
            if after in ("TO", "AS"):
                table_at(p + 2)
            elif after not in ("COLUMN", "INDEX", "KEY", "CONSTRAINT"):
                table_at(p + 1)
        elif list_statement and n.depth[p] == 0 and (w == "TO" or n.punct(p, ",")):
            table_at(p + 1)
    return edits

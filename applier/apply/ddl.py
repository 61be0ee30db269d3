"""Running one DDL event downstream exactly once, for the daemon and the catch-up alike.

MySQL and MariaDB commit a DDL on its own: it cannot join the transaction that records it, so a
process killed between the two leaves a DDL that took effect and a checkpoint that does not say
so (or the other way round, if it were recorded first). Error codes do not settle it either: a
re-run ``RENAME TABLE a TO b`` fails with "no such table", a re-run ``DROP COLUMN`` of a column that
was dropped and re-added in between silently destroys data, a re-run ``EXCHANGE PARTITION`` swaps
the rows back. So a DDL goes through a journal, and the downstream's catalogue decides:

1. **Journal**: the catalogue of the objects the DDL touches is fingerprinted
   (:class:`applier.apply.catalogue.Catalogue`: definitions, table ids where they are needed)
   and written to the ``ddl_journal`` row of the changefeed, in a committed transaction fenced
   by the owner token.
2. **DDL**: on the session that holds the single-active lock, right after checking that it still
   holds it (:meth:`ActiveLock.run_fenced`): a stale instance cannot run a DDL.
3. **Record**: ``applied_ddl``, the checkpoint the caller writes, the rows that checkpoint makes
   redundant pruned (:meth:`CheckpointStore.prune`), and the journal row removed, in one
   transaction. Only then does the caller apply rows after the DDL.

After a crash (or a lost connection) between 1 and 3, :meth:`DDLExecutor.settle` compares the
journaled fingerprint with the catalogue now. Nothing else changes these objects' catalogue
between the journal and the restart (the daemon is their only writer of DDL, and MariaDB and
MySQL 8 DDL is atomic), so: changed means the DDL took effect (it is recorded); unchanged means it
did not, or had no effect at all, and running it (again) gives exactly what one run gives.

An error that usually means "already there" (1050 table exists, 1060 duplicate column, ...) on a
first run means the downstream held that object *before* this DDL: it is accepted only when the
catalogue shows the DDL's effect (:func:`confirmed_effect`), never by the code alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import pymysql
import sqlglot
from sqlglot import exp

from applier.apply.catalogue import Catalogue, Fingerprint, Scope
from applier.codec.events import DDLEvent, Position
from applier.downstream.batch import BatchFailed, Statements, execute_batch
from applier.downstream.errors import error_code, is_transient
from applier.downstream.lock import ActiveLock
from applier.errors import FatalError
from applier.ops.logs import get_logger
from checkpoint import CheckpointStore, JournalEntry, ProgressWrite, ddl_digest, ddl_fields
from sqlgen import (
    MARIADB,
    MYSQL,
    DDLPlan,
    Dialect,
    ErrorClass,
    Router,
    classify_ddl_error,
    plan_ddl,
    route_ddl,
)
from sqlgen.ddl_guard import HostileDDL, check_ddl
from sqlgen.ddl_route import DROP_SCHEMA_DDL_TYPE
from sqlgen.sqltokens import INSIGNIFICANT, PUNCT, QIDENT, WORD, tokenize


class DDLFailed(FatalError):
    """A DDL failed with an error that retrying cannot fix; the message names the DDL and the code."""


class DDLUnsettled(FatalError):
    """A DDL journaled before a crash cannot be decided from the catalogue; an operator must look."""


def detect_dialect(conn: pymysql.connections.Connection) -> Dialect:
    """MariaDB or MySQL rules, from the server's version string, sized to its ``max_allowed_packet``.

    Read once at start by the daemon and the catch-up: the session value is what limits our
    statements (``sqlgen.dml`` cuts them to it; a row beyond it stops with a clear error).
    """
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION(), @@SESSION.max_allowed_packet")
        version, packet = cur.fetchone()
    conn.rollback()
    dialect = MARIADB if "mariadb" in str(version).lower() else MYSQL
    return dialect.with_max_allowed_packet(int(packet))


def touched(ddl: DDLEvent | JournalEntry) -> Scope:
    """What a DDL may change, as its fingerprint reads it: the schemas and tables the DDL guard
    reads in the text (the key's table, RENAME targets, the EXCHANGE PARTITION partner, ...) plus
    every ``schema.table`` the text spells out; only these, so that a DDL's cost does not grow with
    its schema. A text the guard cannot read has every table of those schemas read instead. Table
    ids are asked for where only they show the effect (:func:`_moves_data`), whether the tables hold
    rows where only that does (:func:`_empties_tables`)."""
    named: dict[str, set[str]] = {}
    if ddl.schema:
        named[ddl.schema] = {ddl.table} if ddl.table else set()
    try:
        targets = check_ddl(ddl.query, ddl.ddl_type, ddl.schema, ddl.table)
    except HostileDDL:
        targets = None  # refused at decoding already; the token scan below still covers it
    else:
        for schema in targets.schemas:
            named.setdefault(schema, set())
        for schema, table in targets.tables:
            named.setdefault(schema, set()).add(table)
    toks = [t for t in tokenize(ddl.query) if t.kind not in INSIGNIFICANT]
    for i in range(len(toks) - 2):
        a, dot, b = toks[i], toks[i + 1], toks[i + 2]
        if dot.kind == PUNCT and dot.text == "." and a.kind in (WORD, QIDENT) and b.kind in (WORD, QIDENT):
            named.setdefault(_ident(a.text), set()).add(_ident(b.text))
    whole = targets is None
    return Scope(
        {s: None if whole else frozenset(t for t in tables if t) for s, tables in named.items() if s},
        ids=_moves_data(ddl.query),
        rows=_empties_tables(ddl.query),
    )


def as_event(ddl: DDLEvent | JournalEntry) -> DDLEvent:
    """A journaled DDL as the event it was (its position in the topic is not kept: none)."""
    if isinstance(ddl, DDLEvent):
        return ddl
    return DDLEvent(ddl.commit_ts, ddl.schema, ddl.table, ddl.query, ddl.ddl_type, _JOURNALED)


_JOURNALED = Position("", -1, -1, -1)


def _ident(text: str) -> str:
    if text.startswith("`") and text.endswith("`") and len(text) >= 2:
        return text[1:-1].replace("``", "`")
    return text


@dataclass(frozen=True, slots=True)
class Bookkeeping:
    """What the caller commits with a DDL's record: its checkpoint (the store's statements, bound
    by the cursor given), and the check that must come right before the COMMIT (the lock's)."""

    progress: Callable[[pymysql.cursors.Cursor], ProgressWrite]
    before_commit: Callable[[], None]


@dataclass(frozen=True, slots=True)
class DDLOutcome:
    plan: DDLPlan
    note: str = ""
    """How it ended when not simply run: recorded before, took effect before, already present."""


class DDLExecutor:
    """Journal, fenced execution and recording of DDL events (see the module docstring).

    ``conn`` arguments are the caller's apply session (autocommit off); the DDL itself runs on the
    lock's session. ``owner`` is the instance's fence token for the journal write.
    """

    def __init__(
        self,
        store: CheckpointStore,
        dialect: Dialect,
        lock: ActiveLock,
        *,
        owner: str | None,
        on_statement: Callable[[int, str], None] = lambda connection_id, sql: None,
        router: Router | None = None,
    ) -> None:
        self._store = store
        self._router = router or Router()
        self._dialect = dialect
        self._lock = lock
        self._owner = owner
        self._catalogue = Catalogue(dialect)
        self.on_statement = on_statement
        """Called with the session id and the statement when a DDL starts on the lock's session
        (a window applier given this executor sets it: it watches that session)."""
        self.log = get_logger(component="ddl")
        self._warned_identity = False

    # -- after a crash -------------------------------------------------------------------------
    def settle(self, conn: pymysql.connections.Connection) -> None:
        """Decide a DDL journaled by an earlier run (call at start-up, before loading the
        checkpoint): recorded as applied when the catalogue changed since the journal, else
        forgotten (the stream delivers it again and it runs then)."""
        with conn.cursor() as cur:
            entry = self._store.pending_ddl(cur)
        conn.rollback()
        if entry is None:
            return
        changes = self._changes_since(conn, entry)
        with conn.cursor() as cur:
            self._store.fence(cur, self._owner)
            if changes:
                self._record(cur, entry)
                self._store.prune(cur, **ddl_fields(entry))
            self._store.end_ddl(cur)
        conn.commit()
        self.log.warning(
            "a DDL was interrupted by a crash or a lost session: "
            + (
                "it had taken effect, recorded as applied"
                if changes
                else "it had not taken effect, it runs again"
            ),
            ts=entry.commit_ts,
            schema=entry.schema,
            table=entry.table,
            changes=changes,
            query=_short(entry.query),
        )

    def _changes_since(self, conn: pymysql.connections.Connection, entry: JournalEntry) -> list[str]:
        before = Fingerprint.from_json(entry.catalogue)
        now = self._catalogue.fingerprint(conn, before.scope())
        changes = before.changes(now)
        if not changes and not (before.identity and now.identity) and _moves_data(entry.query):
            raise DDLUnsettled(
                f"the DDL at ts {entry.commit_ts} ({_short(entry.query)}) was interrupted, and whether it "
                "took effect cannot be told without table ids (grant the PROCESS privilege): compare "
                "the tables by hand, then either run the DDL yourself and leave the journal row, or "
                "delete the changefeed's row from the ddl_journal table"
            )
        return changes

    # -- one DDL event ---------------------------------------------------------------------------
    def apply(
        self,
        conn: pymysql.connections.Connection,
        ddl: DDLEvent,
        bookkeeping: Bookkeeping,
    ) -> DDLOutcome:
        """Run ``ddl`` exactly once and commit its record with ``bookkeeping`` (the caller's
        checkpoint write, fenced). Re-entrant: a retry after a transient error (a new ``conn``)
        picks up where the previous attempt stopped, deciding from the journal and the catalogue.

        With route rules the statement runs on the routed names (``target``: the catalogue is
        read, and the "already there" check made, under those), while the journal, ``applied_ddl``
        and the checkpoint keep the upstream event (:mod:`sqlgen.route`)."""
        target, plan = self._planned(ddl)
        with conn.cursor() as cur:
            recorded, entry = self._store.ddl_state(cur, ddl.commit_ts, ddl.query)
        # The read's transaction goes on into what follows (the catalogue's reads end it, the
        # record commits it): one round trip less than ending it here.
        if recorded:  # an ambiguous COMMIT of step 3 that landed
            conn.rollback()
            return DDLOutcome(plan, "recorded before")
        if not plan.execute:
            self._finish(conn, ddl, bookkeeping)
            return DDLOutcome(plan)
        took_effect = False
        if entry is not None and (entry.commit_ts, ddl_digest(entry.query)) == (
            ddl.commit_ts,
            ddl_digest(ddl.query),
        ):
            took_effect = bool(self._changes_since(conn, entry))
        else:
            before = self._catalogue.fingerprint(conn, touched(target))
            if not before.identity and not self._warned_identity:
                self._warned_identity = True
                self.log.warning(
                    "table ids are not visible (the PROCESS privilege is missing): a crash during "
                    "EXCHANGE PARTITION or a RENAME that swaps tables would need an operator"
                )
            with conn.cursor() as cur:
                journal = before.to_json()
                self._fenced(cur, lambda w: self._store.begin_ddl(w, **ddl_fields(ddl), catalogue=journal))
            conn.commit()
            self.log.info(
                "DDL started", ts=ddl.commit_ts, schema=ddl.schema, table=ddl.table, query=_short(ddl.query)
            )
        note = "took effect before it was recorded" if took_effect else self._run_fenced(conn, target, plan)
        self._finish(conn, ddl, bookkeeping)
        return DDLOutcome(plan, note)

    def record_online(
        self,
        conn: pymysql.connections.Connection,
        ddl: DDLEvent,
        bookkeeping: Bookkeeping,
    ) -> tuple[DDLOutcome, JournalEntry | None]:
        """Record ``ddl`` as applied with the caller's checkpoint and journal it in ``ddl_online``,
        in one transaction, without running it: :class:`applier.apply.online_ddl.OnlineDDLs` runs
        the returned entry beside the stream (None: nothing to run, or recorded before, whose
        journal row the caller resumes)."""
        target, plan = self._planned(ddl)
        with conn.cursor() as cur:
            recorded = self._store.ddl_recorded(cur, ddl.commit_ts, ddl.query)
        conn.rollback()
        if recorded:
            return DDLOutcome(plan, "recorded before"), None
        if not plan.execute:
            self._finish(conn, ddl, bookkeeping)
            return DDLOutcome(plan), None
        before = self._catalogue.fingerprint(conn, touched(target))
        entry = JournalEntry(ddl.commit_ts, ddl.schema, ddl.table, ddl.ddl_type, ddl.query, before.to_json())
        self._finish(
            conn,
            ddl,
            bookkeeping,
            journal=lambda w: self._store.begin_online_ddl(w, catalogue=entry.catalogue, **ddl_fields(ddl)),
        )
        return DDLOutcome(plan, "runs beside the stream"), entry

    def run_online(self, conn: pymysql.connections.Connection, entry: JournalEntry) -> str:
        """Run a DDL journaled by :meth:`record_online` on ``conn`` (a session of its own) unless the
        catalogue shows it took effect since the journal, then forget its journal row; returns
        how it ended. Nothing else changes its objects meanwhile: a DDL whose scope overlaps waits
        for it (``OnlineDDLs.wait_for``), so a changed catalogue is its own effect."""
        target, plan = self._planned(entry)
        if self._changes_since(conn, entry):
            note = "took effect before"
        else:
            self._lock.ensure_held()
            note = self._run(conn, target, plan, lambda: _execute(conn, plan.statements()))
        try:
            with conn.cursor() as cur:
                self._store.fence(cur, self._owner)
                self._store.end_online_ddl(cur, entry.commit_ts, entry.query)
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise
        return note

    def _planned(self, ddl: DDLEvent | JournalEntry) -> tuple[DDLEvent, DDLPlan]:
        """The DDL as it runs downstream (routed) and what to do with it (skipped when the route
        rules leave its schema out)."""
        target = route_ddl(as_event(ddl), self._router)
        skip = self._router.ddl_skip_reason(ddl.schema, drop_schema=ddl.ddl_type == DROP_SCHEMA_DDL_TYPE)
        if skip:
            return target, DDLPlan(False, "", None, skip)
        return target, plan_ddl(target.query, target.ddl_type, target.schema, self._dialect)

    def _run_fenced(self, conn: pymysql.connections.Connection, ddl: DDLEvent, plan: DDLPlan) -> str:
        statements = plan.statements()

        def execute() -> None:
            self._lock.run_fenced(statements, on_start=lambda cid: self.on_statement(cid, statements[-1]))

        return self._run(conn, ddl, plan, execute)

    def _run(
        self,
        conn: pymysql.connections.Connection,
        ddl: DDLEvent | JournalEntry,
        plan: DDLPlan,
        execute: Callable[[], None],
    ) -> str:
        """``execute`` the DDL's statements; an error that means "already there" is accepted only
        when ``conn`` reads the DDL's effect in the catalogue, any other permanent one is DDLFailed."""
        try:
            execute()
        except pymysql.MySQLError as exc:
            code = error_code(exc)
            if is_transient(exc):
                raise
            if classify_ddl_error(code) is ErrorClass.ALREADY_APPLIED:
                why = confirmed_effect(conn, ddl, plan.sql)
                if why:
                    self.log.info(
                        "DDL effect already present downstream", code=code, ts=ddl.commit_ts, why=why
                    )
                    return f"already present ({why})"
                raise DDLFailed(
                    f"DDL at ts {ddl.commit_ts} on {ddl.schema}.{ddl.table} failed with MySQL error {code} "
                    f"({exc.args[-1]}), which would mean its change is already there, but the downstream's "
                    f"catalogue does not show that change; query: {_short(ddl.query, 300)}"
                ) from None
            raise DDLFailed(
                f"DDL at ts {ddl.commit_ts} on {ddl.schema}.{ddl.table} failed with MySQL "
                f"error {code}: {exc.args[-1]}; query: {_short(ddl.query, 300)}"
            ) from None
        return ""

    def _fenced(self, cur: pymysql.cursors.Cursor, write: Callable[[Statements], None]) -> None:
        """The fence, then the statements ``write`` gives (writes of the store), in one packet."""
        writes = Statements(cur)
        write(writes)
        fence = [] if self._owner is None else [self._store.fence_statement(cur)]
        try:
            rows = execute_batch(cur, [*fence, *writes.texts], fetch=range(len(fence)))
        except BatchFailed as failed:
            raise failed.error from None
        if fence:
            self._store.check_fence(self._owner, rows[0])

    def _finish(
        self,
        conn: pymysql.connections.Connection,
        ddl: DDLEvent,
        bookkeeping: Bookkeeping,
        journal: Callable[[Statements], None] | None = None,
    ) -> None:
        """Commit the DDL's record, the caller's checkpoint (fenced), the pruning it allows and
        the end of its journal (``journal``: what to write instead, for a DDL beside the stream),
        sent in as few packets as the session takes."""
        try:
            with conn.cursor() as cur:
                record, rest = Statements(cur), Statements(cur)
                self._record(record, ddl)
                checkpoint = bookkeeping.progress(cur)
                self._store.prune(rest, **ddl_fields(ddl))  # after the checkpoint: it reads its resolved ts
                if journal is not None:
                    journal(rest)
                self._store.end_ddl(rest)
                texts = [*record.texts, *checkpoint.texts, *rest.texts]
                first = len(record.texts)
                try:
                    rows = execute_batch(cur, texts, fetch=[first + i for i in checkpoint.fetch])
                except BatchFailed as failed:
                    raise failed.error from None
                checkpoint.check(rows, first)
                bookkeeping.before_commit()
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):  # the session may be gone: the server rolls back
                conn.rollback()
            raise

    def _record(self, cur: pymysql.cursors.Cursor | Statements, ddl: DDLEvent | JournalEntry) -> None:
        self._store.record_ddl(cur, **ddl_fields(ddl))


def _execute(conn: pymysql.connections.Connection, statements: list[str]) -> None:
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def keywords(query: str) -> list[str]:
    """The bare words of a DDL text, upper-cased, in order (quoted names and literals left out)."""
    return [t.upper for t in tokenize(query) if t.kind == WORD]


def _short(query: str, n: int = 200) -> str:
    return " ".join(query.split())[:n]


def _moves_data(query: str) -> bool:
    """Statements whose effect the table definitions do not show and that must not run twice:
    ``EXCHANGE PARTITION`` swaps the rows of two tables of one shape, a ``RENAME`` of several tables
    can swap their names. Only table ids tell."""
    words = keywords(query)
    return "EXCHANGE" in words or ("RENAME" in words and words.count("TO") > 1)


def _empties_tables(query: str) -> bool:
    """``TRUNCATE`` leaves the definition as it was: whether its table still has rows tells."""
    return "TRUNCATE" in keywords(query)


# -- "already there": what the catalogue must show ---------------------------------------------


def _dropped(node: exp.Expression) -> list[exp.Expression]:
    """The objects a sqlglot ``Drop`` names (kept under ``tables`` whatever their kind)."""
    return list(node.args.get("tables") or node.expressions or [])


def confirmed_effect(conn: pymysql.connections.Connection, ddl: DDLEvent | JournalEntry, sql: str) -> str:
    """Why the catalogue shows ``ddl``'s effect already, or '' when it does not (or cannot tell).

    Checked: a created/dropped schema exists/is gone; a created table exists with the statement's
    columns in order (or the ``LIKE`` source's); a dropped table is gone; added columns and indexes
    exist; dropped ones are gone.
    """
    try:
        return _confirm(conn, ddl, sql)
    finally:
        conn.rollback()


def _confirm(conn: pymysql.connections.Connection, ddl: DDLEvent | JournalEntry, sql: str) -> str:
    with conn.cursor() as cur:
        if ddl.ddl_type in (1, 2):
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (ddl.schema,)
            )
            exists = cur.fetchone()[0] > 0
            if exists == (ddl.ddl_type == 1):
                return f"schema {ddl.schema} {'exists' if exists else 'is gone'}"
            return ""
        try:
            tree = sqlglot.parse_one(sql, read="mysql")
        except Exception:
            return ""

        def table_of(node: exp.Expression | None) -> tuple[str, str] | None:
            t = node if isinstance(node, exp.Table) else (node.find(exp.Table) if node is not None else None)
            if t is None or not t.name:
                return None
            return (t.db or ddl.schema, t.name)

        def columns(t: tuple[str, str]) -> list[str] | None:
            cur.execute(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                t,
            )
            names = [r[0] for r in cur.fetchall()]
            return names or None

        def indexes(t: tuple[str, str]) -> set[str]:
            cur.execute(
                "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS "
                "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                t,
            )
            return {r[0].lower() for r in cur.fetchall()}

        if isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() in ("TABLE", "VIEW"):
            target = table_of(tree.this)
            if target is None:
                return ""
            have = columns(target)
            if have is None:
                return ""
            schema = tree.this if isinstance(tree.this, exp.Schema) else None
            if schema is not None:
                want = [c.name for c in schema.expressions if isinstance(c, exp.ColumnDef)]
                return f"{target[0]}.{target[1]} exists with columns {want}" if want == have else ""
            like = tree.find(exp.LikeProperty)
            if like is not None:
                source = table_of(like.this)
                same = source is not None and columns(source) == have
                return f"{target[0]}.{target[1]} exists like {source}" if same else ""
            return (
                f"view {target[0]}.{target[1]} exists" if str(tree.args.get("kind")).upper() == "VIEW" else ""
            )
        if isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() in ("TABLE", "VIEW"):
            named = _dropped(tree)
            gone = [t for t in (table_of(x) for x in named) if t is not None and columns(t) is None]
            return f"{gone} gone" if gone and len(gone) == len(named) else ""
        if isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() == "INDEX":
            index = tree.this
            target = table_of(index.args.get("table")) if isinstance(index, exp.Index) else None
            if target is None or not index.name:
                return ""
            return f"index {index.name} exists" if index.name.lower() in indexes(target) else ""
        if isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() == "INDEX":
            on = tree.args.get("cluster")
            target = table_of(on.this) if isinstance(on, exp.OnProperty) else None
            names = [n.name.lower() for n in _dropped(tree)]
            if target is None or not names or set(names) & indexes(target):
                return ""
            return f"index {', '.join(names)} gone"
        if isinstance(tree, exp.Alter):
            target = table_of(tree.this)
            if target is None:
                return ""
            have = columns(target) or []
            have_lower = {c.lower() for c in have}
            have_idx = indexes(target)
            facts = []
            for action in tree.args.get("actions") or []:
                if isinstance(action, exp.ColumnDef):
                    if action.name.lower() not in have_lower:
                        return ""
                    facts.append(f"column {action.name} exists")
                elif isinstance(action, exp.Drop) and str(action.args.get("kind", "")).upper() in (
                    "COLUMN",
                    "INDEX",
                    "KEY",
                ):
                    kind = str(action.args.get("kind")).upper()
                    for n in _dropped(action):
                        name = n.name.lower()
                        present = name in have_lower if kind == "COLUMN" else name in have_idx
                        if present:
                            return ""
                        facts.append(f"{kind.lower()} {n.name} gone")
                elif isinstance(action, exp.RenameIndex):
                    old_name, new_name = action.this.name.lower(), action.args["to"].name.lower()
                    if old_name in have_idx or new_name not in have_idx:
                        return ""
                    facts.append(f"index {action.this.name} renamed")
                elif isinstance(action, exp.AddConstraint):
                    for c in action.expressions:
                        if isinstance(c, exp.PrimaryKey):
                            name = "primary"
                        elif isinstance(c, exp.IndexColumnConstraint) and c.this is not None:
                            name = c.this.name.lower()
                        else:
                            return ""
                        if name not in have_idx:
                            return ""
                        facts.append(f"index {name} exists")
                else:
                    return ""
            return ", ".join(facts)
        return ""

"""DDLs that leave the rows' shape as it is run beside the stream instead of stopping it.

An index built on a table of hundreds of millions of rows runs for minutes or hours downstream,
and MariaDB and MySQL build a secondary index online: the table's writers go on meanwhile. So a
DDL that changes only indexes (:func:`runs_online`) does not hold the stream back. When the barrier
reaches it, it is recorded as applied, with the window's checkpoint and a journal row in
``ddl_online`` (fingerprint of its objects before it runs), in one transaction
(:meth:`DDLExecutor.record_online`); then it runs on a session of its own while the windows after
it are applied, to its table too.

What keeps that exactly once:

- The journal row stays until the DDL has taken effect. A restart (after SIGKILL, a lost session
  or a database restart) compares the journaled fingerprint with the catalogue: changed means the
  DDL finished (the row goes), unchanged means it runs again. A statement the server still runs
  for a killed daemon is not a problem: the new run waits for its metadata lock, then fails with
  "duplicate key name" (or "can't drop"), which is accepted because the catalogue shows the effect.
- Nothing else changes the DDL's objects before it finishes: a later DDL whose scope overlaps
  (the same table, a DDL of its whole schema, one the guard cannot read) waits for it
  (:meth:`OnlineDDLs.wait_for`). A DDL of another table does not.
- On stop the statement is killed on the server (an index build rolls back) and runs again
  after the restart: waiting for an hour-long build would break the promise that SIGTERM ends the
  daemon within seconds.

What a reader gives up: the checkpoint passes the DDL before its index exists, so for the build's
duration the downstream has the upstream's rows without that index (``applier status`` and
``/metrics`` list the DDLs still building). Rows are unaffected: the row events carry their key
columns, and no statement the applier writes depends on a downstream index.

A unique index is not built this way: the statements of a window reach their end state only at
COMMIT, and an online build of a unique index fails on a duplicate that exists for a moment in
between. It runs as every other DDL does.

With ``ddl_blocking = "tables"`` the other DDLs of a known set of tables (:func:`beside_scope`) run
the same way, and their tables' rows wait (:class:`TableHolds`, ``applier.stream.barrier``): the
stream goes on for every other table, and the checkpoint's resolved ts stays below the DDL until
those rows are applied. A DDL of whole schemas, or one that copies another table, still stops
every table.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pymysql

from applier.apply.catalogue import Scope
from applier.apply.ddl import DDLExecutor, DDLFailed, as_event, keywords, touched
from applier.apply.transaction import TransactionRunner
from applier.codec.events import DDLEvent
from applier.downstream.errors import describe
from applier.downstream.retry import Backoff, RetryInfo
from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig
from applier.ops.logs import get_logger
from checkpoint import CheckpointStore, JournalEntry, ddl_digest
from sqlgen import Router, route_ddl
from sqlgen.ddl import SCHEMA_DDL_TYPES

# TiDB's DDL types that change indexes only: add index, drop index, rename index, index
# visibility, drop indexes (docs/open-protocol.md §8). Each is one job upstream, so its text changes
# nothing else (several changes in one ALTER arrive as a multi-schema change, type 61).
ONLINE_DDL_TYPES = frozenset({7, 8, 18, 41, 48})


def runs_online(ddl: DDLEvent) -> bool:
    """Whether ``ddl`` runs beside the stream: an index DDL other than a unique one."""
    if ddl.ddl_type not in ONLINE_DDL_TYPES:
        return False
    return not {"UNIQUE", "PRIMARY"}.intersection(keywords(ddl.query))


def beside_scope(ddl: DDLEvent, router: Router) -> frozenset[tuple[str, str]] | None:
    """The downstream tables a DDL changes, when that is a set of tables the guard reads in its
    text (None: a DDL of whole schemas, one that copies another table, or a text it cannot read)."""
    if ddl.ddl_type in SCHEMA_DDL_TYPES or _reads_other_tables(ddl):
        return None
    tables: set[tuple[str, str]] = set()
    for schema, names in touched(route_ddl(ddl, router)).tables.items():
        if names is None:
            return None
        tables.update((schema, name) for name in names)
    return frozenset(tables) or None


def _overlaps(a: Scope, b: Scope, *, whole: bool) -> bool:
    """Whether two DDLs' scopes share an object (``whole``: the second is about whole schemas)."""
    for schema, tables in a.tables.items():
        if schema not in b.tables:
            continue
        other = b.tables[schema]
        if whole or tables is None or other is None or tables & other:
            return True
    return False


def _key(entry: JournalEntry) -> tuple[int, str]:
    return entry.commit_ts, ddl_digest(entry.query)


@dataclass
class _Job:
    entry: JournalEntry
    scope: Scope
    started: float = field(default_factory=time.time)
    """Wall clock, when this process started it."""
    thread: threading.Thread | None = None
    session: int | None = None
    """The server's id of the session running it (what stop kills)."""
    holds: frozenset[tuple[str, str]] = frozenset()
    """The (downstream) tables whose rows wait for it: none for an index DDL."""


class OnlineDDLs:
    """The DDLs running beside the stream, one thread and one session each (module docstring)."""

    def __init__(
        self,
        downstream: DownstreamConfig,
        store: CheckpointStore,
        executor: DDLExecutor,
        *,
        router: Router | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._downstream = downstream
        self._store = store
        self._executor = executor
        self._router = router or Router()
        self._backoff = backoff or Backoff()
        self._jobs: dict[tuple[int, str], _Job] = {}
        self._failed: DDLFailed | None = None
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self.version = 0
        """Counts the changes of :meth:`running` (the daemon tells its observers when it moved)."""
        self.log = get_logger(component="ddl")

    # -- the daemon's side ------------------------------------------------------------------------
    def start(self, entry: JournalEntry) -> None:
        """Run a DDL journaled in ``ddl_online`` on a thread of its own (no-op if it runs already)."""
        event = as_event(entry)
        job = _Job(entry, touched(route_ddl(event, self._router)))
        if not runs_online(event):  # ddl_blocking = "tables": its tables' rows wait for it
            job.holds = beside_scope(event, self._router) or frozenset()
        with self._changed:
            if self._stopping.is_set() or _key(entry) in self._jobs:
                return
            self._jobs[_key(entry)] = job
            self.version += 1
        job.thread = threading.Thread(target=self._run, args=(job,), name="applier-online-ddl", daemon=True)
        job.thread.start()

    def resume(self, conn: pymysql.connections.Connection | None = None) -> None:
        """Start every DDL the checkpoint schema lists as running beside the stream (at start-up,
        on a session of its own, and after a recording whose COMMIT was ambiguous, on ``conn``)."""
        session = conn if conn is not None else connect(self._downstream, multi_statements=True)
        try:
            with session.cursor() as cur:
                entries = self._store.online_ddls(cur)
            session.rollback()
        finally:
            if conn is None:
                close_quietly(session)
        for entry in entries:
            self.start(entry)

    def wait_for(self, ddl: DDLEvent | None, stop_requested: Callable[[], bool]) -> bool:
        """Wait until no running DDL shares an object with ``ddl`` (None: until none runs);
        False when a stop was requested first. Raises the error of a DDL that failed."""
        whole = ddl is None or ddl.ddl_type in SCHEMA_DDL_TYPES or _reads_other_tables(ddl)
        scope = touched(route_ddl(ddl, self._router)) if ddl is not None else None
        with self._changed:
            while True:
                self._raise_failed()
                if not any(
                    scope is None or _overlaps(job.scope, scope, whole=whole) for job in self._jobs.values()
                ):
                    return True
                if stop_requested():
                    return False
                self._changed.wait(0.1)

    def check(self) -> None:
        """Raise the error of a DDL that failed for good (the daemon stops, naming it)."""
        with self._changed:
            self._raise_failed()

    def held_tables(self) -> frozenset[tuple[str, str]]:
        """The (downstream) tables whose rows wait for a DDL running now."""
        with self._changed:
            return frozenset().union(*(job.holds for job in self._jobs.values()))

    def running(self) -> list[tuple[JournalEntry, float]]:
        """The DDLs running now, with when they started (wall clock), oldest DDL first."""
        with self._changed:
            jobs = sorted(self._jobs.values(), key=lambda j: j.entry.commit_ts)
        return [(j.entry, j.started) for j in jobs]

    def close(self, timeout: float = 5.0) -> None:
        """Stop: kill the running statements on the server (they run again after the restart) and
        wait for the threads, ``timeout`` seconds at most."""
        self._stopping.set()
        with self._changed:
            jobs = list(self._jobs.values())
        sessions = [j.session for j in jobs if j.session is not None]
        if sessions:
            killer = None
            try:
                killer = connect(self._downstream, autocommit=True)
                with killer.cursor() as cur:
                    for sid in sessions:
                        with contextlib.suppress(Exception):  # it ended meanwhile (1094)
                            cur.execute(f"KILL QUERY {int(sid)}")
            except Exception as exc:
                self.log.warning("stop: killing the DDLs beside the stream failed", error=describe(exc))
            finally:
                close_quietly(killer)
        deadline = time.monotonic() + timeout
        for job in jobs:
            if job.thread is not None:
                job.thread.join(max(0.0, deadline - time.monotonic()))

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    # -- one DDL's thread -------------------------------------------------------------------------
    def _run(self, job: _Job) -> None:
        """Run one DDL to its end on a session of its own: transient errors (a lost session, a
        server restart) reconnect and run it again from its journal row, as every unit of the
        applier is replayed (``TransactionRunner``); a stop ends the thread, a permanent error is
        kept for the daemon (:meth:`check`)."""
        entry = job.entry
        began = time.monotonic()
        self.log.info(
            "DDL started beside the stream",
            ts=entry.commit_ts,
            schema=entry.schema,
            table=entry.table,
            query=" ".join(entry.query.split())[:200],
        )

        def on_retry(info: RetryInfo) -> None:
            if self._stopping.is_set():
                return  # the stop killed it: nothing to retry, the next start runs it
            self.log.warning(
                "a DDL running beside the stream failed; retrying",
                ts=entry.commit_ts,
                error=describe(info.error),
                attempt=info.attempt,
                wait=round(info.wait, 2),
            )

        def sleep(seconds: float) -> None:
            if self._stopping.wait(seconds):
                raise _Stopped()

        runner = TransactionRunner(
            self._downstream, max_time=None, backoff=self._backoff, on_retry=on_retry, sleep=sleep
        )
        runner.on_connect = lambda _conn: setattr(
            job, "session", runner.session.id if runner.session else None
        )
        notes: list[str] = []
        try:
            runner.run(lambda conn: notes.append(self._executor.run_online(conn, entry)))
        except _Stopped:
            return
        except Exception as exc:
            if self._stopping.is_set():
                return
            failed = (
                exc
                if isinstance(exc, DDLFailed)
                else DDLFailed(
                    f"DDL at ts {entry.commit_ts} on {entry.schema}.{entry.table}, running beside "
                    f"the stream, failed: {describe(exc)}; query: {_short(entry.query)}"
                )
            )
            with self._changed:
                self._failed = self._failed or failed
                self._changed.notify_all()
            return
        finally:
            job.session = None
            runner.close()
        self.log.info(
            "DDL applied beside the stream",
            ts=entry.commit_ts,
            schema=entry.schema,
            table=entry.table,
            note=notes[-1] or None,
            seconds=round(time.monotonic() - began, 3),
        )
        with self._changed:
            self._jobs.pop(_key(entry), None)
            self.version += 1
            self._changed.notify_all()


class TableHolds:
    """The barrier's view of the tables held by DDLs running beside the stream
    (``applier.stream.barrier.TableHolds``). Names are compared without case: a DDL's text may
    spell a table otherwise than its rows do, and holding a table too many only makes it wait."""

    def __init__(self, online: OnlineDDLs, router: Router | None = None) -> None:
        self._online = online
        self._router = router or Router()

    def tables(self) -> frozenset[tuple[str, str]]:
        return _folded(self._online.held_tables())

    def route(self, table: tuple[str, str]) -> tuple[str, str]:
        schema, name = self._router.table(*table)
        return schema.casefold(), name.casefold()

    def scope(self, ddl: DDLEvent) -> frozenset[tuple[str, str]] | None:
        scope = beside_scope(ddl, self._router)
        return None if scope is None else _folded(scope)


def _folded(tables: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    return frozenset((schema.casefold(), name.casefold()) for schema, name in tables)


class _Stopped(Exception):
    """The daemon stops while a DDL beside the stream waits to be run again."""


def _short(query: str) -> str:
    return " ".join(query.split())[:300]


def _reads_other_tables(ddl: DDLEvent) -> bool:
    """A DDL that copies another table's definition or rows (``CREATE TABLE ... LIKE``/``AS
    SELECT``) may read a table its scope does not name: it waits as if it touched its whole
    schemas."""
    return bool({"LIKE", "SELECT"}.intersection(keywords(ddl.query)))

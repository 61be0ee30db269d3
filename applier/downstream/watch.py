"""Watch the daemon's own statements for lock waits: say who blocks them, kill them on stop.

A statement that waits on a lock raises no error for a long time: a row lock for
``innodb_lock_wait_timeout`` (50 s by default, then error 1205 and a replay), a metadata lock for
``lock_wait_timeout`` (a day on MariaDB, a year on MySQL). Meanwhile the daemon applies nothing and
nothing says why. A DDL waits for the metadata lock of every open transaction that touched its
table (an idle ``BEGIN; SELECT ...`` in a client someone forgot), and once a DDL waits, every
later statement on that table waits behind it.

So the daemon registers what it runs (:meth:`StatementWatch.statement`, around a statement or a
whole transaction unit, for any of its connections) and a small thread with its own session
looks at every registered statement that has run for more than :attr:`StatementWatch.AFTER`
seconds:

* ``information_schema.PROCESSLIST`` gives its state: ``Waiting for table metadata lock`` (or
  another ``Waiting for ... lock``) is a metadata-lock wait;
* ``information_schema.INNODB_TRX`` says whether its transaction is in ``LOCK WAIT`` (a row lock).

A wait is logged once, with the statement and the sessions that block it (id, user, host,
command, time, statement or state), published to the health and metrics observers (which make
``/readyz`` fail once it lasts longer than ``stall_seconds``), and logged once more when it ends.
The statement keeps waiting: the server's timeout and the replay rules decide what happens to it.

Who blocks:

* a row lock: ``information_schema.INNODB_LOCK_WAITS`` (MariaDB, MySQL 5.7) or
  ``performance_schema.data_lock_waits`` (MySQL 8);
* a metadata lock: ``performance_schema.metadata_locks`` (MySQL; MariaDB with the performance
  schema on), else MariaDB's ``information_schema.METADATA_LOCK_INFO`` (plugin
  ``metadata_lock_info``) for the tables the statement was registered with, else the likely
  holders: every other session with an open transaction, and every session whose statement
  names one of those tables.

Seeing other users' sessions and ``INNODB_TRX`` needs the ``PROCESS`` privilege. Without it the
watch still sees the daemon's own sessions (so metadata-lock waits are still reported) and says
``blocker unknown: no PROCESS privilege``.

The same session kills a statement on request (:meth:`StatementWatch.interrupt`): the daemon
uses it on SIGTERM for a statement that does not finish within seconds (``KILL QUERY``, then
``KILL CONNECTION``). Killing a session of the same user needs no privilege.

The watch session runs in autocommit mode and reads only ``information_schema`` and
``performance_schema``, so it never holds a metadata lock on a table between its statements.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pymysql

from applier.downstream.errors import describe, error_code
from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig
from applier.ops.logs import get_logger

__all__ = ["Blocker", "StatementWait", "StatementWatch"]

NO_PROCESS: Final = "blocker unknown: no PROCESS privilege"
_ACCESS_DENIED: Final = frozenset({1227, 1142, 1044})  # need PROCESS / SELECT on the table / the schema
_NO_SUCH_TABLE: Final = frozenset({1109, 1146})  # an information_schema / performance_schema table missing
_TEXT: Final = 120  # characters of a statement shown in a log line


def _short(text: object, limit: int = _TEXT) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class Blocker:
    """A session that holds what a watched statement waits for (as far as the server tells)."""

    id: int
    user: str | None = None
    host: str | None = None
    command: str | None = None
    time: int = 0  # seconds in its current command
    state: str | None = None
    info: str | None = None

    def __str__(self) -> str:
        if self.user is None:
            return f"session {self.id} (details hidden: no PROCESS privilege)"
        doing = f"running {_short(self.info)!r}" if self.info else "idle in an open transaction"
        state = f", state {self.state!r}" if self.state else ""
        who = f"{self.user}@{self.host}, command {self.command}, {self.time} s{state}"
        return f"session {self.id} ({who}, {doing})"


@dataclass(frozen=True, slots=True)
class StatementWait:
    """A registered statement found waiting on a lock."""

    seq: int  # increases with every new wait (metrics count waits by it)
    connection_id: int
    description: str
    kind: str  # "metadata" | "row"
    state: str  # the PROCESSLIST state, e.g. "Waiting for table metadata lock"
    since: float  # monotonic time the wait began (the server's own count of seconds)
    blockers: tuple[Blocker, ...] = ()
    unknown: str | None = None  # why no blocker is named
    likely: bool = False  # the blockers are candidates (no metadata-lock table to ask)

    def blocked_by(self) -> str:
        """``blocked by session ...``, or why nobody is named."""
        if not self.blockers:
            return self.unknown or "blocker unknown: no session found holding it"
        sessions = "; ".join(str(b) for b in self.blockers)
        return f"likely blocked by one of: {sessions}" if self.likely else f"blocked by {sessions}"


@dataclass(eq=False)
class _Entry:
    connection_id: int
    description: str
    tables: tuple[tuple[str, str], ...]
    started: float
    wait: StatementWait | None = None


def _row_queries(cid: int) -> tuple[tuple[str, tuple], ...]:
    """Who holds the row lock session ``cid`` waits for: MariaDB and MySQL 5.7, then MySQL 8."""
    return (
        (
            "SELECT DISTINCT b.trx_mysql_thread_id FROM information_schema.INNODB_LOCK_WAITS w "
            "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id "
            "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
            "WHERE r.trx_mysql_thread_id = %s",
            (cid,),
        ),
        (
            "SELECT DISTINCT b.trx_mysql_thread_id FROM performance_schema.data_lock_waits w "
            "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID "
            "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID "
            "WHERE r.trx_mysql_thread_id = %s",
            (cid,),
        ),
    )


class Watched:
    """The statements one :meth:`StatementWatch.statement` block registered; all end with it."""

    def __init__(self, watch: StatementWatch, description: str, tables: tuple[tuple[str, str], ...]) -> None:
        self._watch = watch
        self.description = description
        self.tables = tables
        self._entries: list[_Entry] = []

    def also(self, connection_id: int, description: str | None = None) -> None:
        """Watch session ``connection_id`` too, until the block ends: a statement the unit runs on
        another session (the DDL, on the single-active lock's session)."""
        entry = _Entry(connection_id, description or self.description, self.tables, self._watch._clock())
        self._entries.append(entry)
        self._watch._add(entry)

    def end(self) -> None:
        for entry in self._entries:
            self._watch._remove(entry)
        self._entries.clear()


class StatementWatch:
    """Registered statements, the thread that looks at the long ones, and the kill switch.

    Usage::

        watch = StatementWatch(cfg)
        watch.start()
        with watch.statement(conn_id, "ALTER TABLE s.t ...", tables=[("s", "t")]):
            cur.execute(...)
        watch.waits()        # what waits now (for health and metrics)
        with watch.statement(apply_id, "DDL at ts ...") as watched:
            watched.also(lock_session_id)   # the unit's DDL runs on another session
            ...
        watch.interrupt()    # on stop: KILL QUERY of every registered statement
        watch.close()
    """

    AFTER = 3.0
    """Seconds a statement runs before the watch looks at it: every window commits well within it,
    so a healthy daemon costs the server no query at all."""
    POLL = 1.0
    MAX_BLOCKERS = 5

    def __init__(
        self,
        cfg: DownstreamConfig,
        *,
        after: float | None = None,
        poll: float | None = None,
        connect_fn: Callable[[DownstreamConfig], pymysql.connections.Connection] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg.with_options(read_timeout=10.0, write_timeout=10.0)
        self._after = self.AFTER if after is None else after
        self._poll = self.POLL if poll is None else poll
        self._connect = connect_fn or (lambda c: connect(c, autocommit=True))
        self._clock = clock
        self._conn: pymysql.connections.Connection | None = None
        self._mutex = threading.Lock()  # the watch session: PyMySQL connections are not thread-safe
        self._entries: dict[int, _Entry] = {}
        self._entries_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._no_process: bool | None = None  # unknown until the first look
        self._sources: dict[str, str | None] = {}  # which server table answered each question
        self._waits: tuple[StatementWait, ...] = ()
        self.version = 0
        """Changes whenever :meth:`waits` does (the daemon passes waits on only then)."""
        self.interrupted = False
        """Set by :meth:`interrupt`: errors of the statements from then on are the kill's doing."""
        self.log = get_logger(component="watch")

    # -- registration (any thread) ---------------------------------------------------------------
    @contextlib.contextmanager
    def statement(
        self, connection_id: int | None, description: str, tables: Iterable[tuple[str, str]] = ()
    ) -> Iterator[Watched]:
        """Watch what session ``connection_id`` runs inside the block (None: nothing yet).

        ``description`` names it in the log (truncated); ``tables`` (schema, table) help name the
        holders of a metadata lock when the server has no lock table for it. The block's
        :meth:`Watched.also` adds statements the unit runs on other sessions.
        """
        watched = Watched(self, description, tuple(tables))
        if connection_id is not None:
            watched.also(connection_id)
        try:
            yield watched
        finally:
            watched.end()

    def _add(self, entry: _Entry) -> None:
        with self._entries_lock:
            self._entries[id(entry)] = entry

    def _remove(self, entry: _Entry) -> None:
        self._end_wait(entry, "the statement ended")
        with self._entries_lock:
            self._entries.pop(id(entry), None)

    def waits(self) -> tuple[StatementWait, ...]:
        """The registered statements waiting on a lock now."""
        return self._waits

    # -- the thread ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="applier-statement-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=15)
        with self._mutex:
            close_quietly(self._conn)
            self._conn = None

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            self.check()

    def check(self) -> None:
        """Look once at every registered statement older than ``after`` seconds (the thread's step)."""
        now = self._clock()
        with self._entries_lock:
            due = [e for e in self._entries.values() if now - e.started >= self._after]
        if not due:
            return
        try:
            with self._mutex:
                conn = self._session()
                for entry in due:
                    self._look(conn, entry)
        except Exception as exc:  # the database is in trouble: the apply path reports that
            self.log.debug("statement watch: cannot look at the server now", error=describe(exc))
            with self._mutex:
                close_quietly(self._conn)
                self._conn = None

    def _session(self) -> pymysql.connections.Connection:
        if self._conn is None:
            self._conn = self._connect(self._cfg)
            if self._no_process is None:
                self._no_process = not self._can_read(
                    self._conn, "SELECT COUNT(*) FROM information_schema.INNODB_TRX"
                )
                if self._no_process:
                    self.log.warning(
                        "the database user has no PROCESS privilege: lock waits of the daemon's "
                        "statements are reported without the sessions that block them "
                        "(GRANT PROCESS ON *.* to name them)"
                    )
        return self._conn

    @staticmethod
    def _can_read(conn: pymysql.connections.Connection, sql: str) -> bool:
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                cur.fetchall()
        except pymysql.err.MySQLError as exc:
            if error_code(exc) in _ACCESS_DENIED:
                return False
            raise
        return True

    # -- one look ------------------------------------------------------------------------------------
    def _look(self, conn: pymysql.connections.Connection, entry: _Entry) -> None:
        cid = entry.connection_id
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COMMAND, TIME, STATE, INFO FROM information_schema.PROCESSLIST WHERE ID = %s", (cid,)
            )
            row = cur.fetchone()
            if row is None:
                self._end_wait(entry, "the session ended")
                return
            _command, seconds, state, _info = row
            state = str(state or "")
            kind: str | None = None
            waited = float(seconds or 0)
            if state.startswith("Waiting for") and "lock" in state:
                kind = "metadata"
            elif not self._no_process:
                cur.execute(
                    "SELECT TIMESTAMPDIFF(SECOND, trx_wait_started, NOW()) "
                    "FROM information_schema.INNODB_TRX "
                    "WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT'",
                    (cid,),
                )
                lock_wait = cur.fetchone()
                if lock_wait is not None:
                    kind, waited = "row", float(lock_wait[0] or 0)
                    state = state or "LOCK WAIT"
        if kind is None:
            self._end_wait(entry, "the lock was granted")
            return
        if entry.wait is not None and entry.wait.kind == kind:
            return  # still the same wait: said once
        self._end_wait(entry, "the lock was granted")
        blockers, unknown, likely = self._blockers(conn, entry, kind)
        since = self._clock() - waited
        wait = StatementWait(
            next(self._seq), cid, entry.description, kind, state, since, blockers, unknown, likely
        )
        if not self._swap(entry, wait):
            return  # the statement ended meanwhile
        self.log.warning(
            f"statement waits on a {kind} lock; {wait.blocked_by()}",
            statement=_short(entry.description, 200),
            connection=cid,
            state=state,
            waiting_s=round(waited, 1),
        )

    def _end_wait(self, entry: _Entry, why: str) -> None:
        wait = entry.wait
        if wait is None or not self._swap(entry, None, expected=wait):
            return
        self.log.info(
            "statement no longer waits on a lock: " + why,
            statement=_short(wait.description, 200),
            connection=wait.connection_id,
            kind=wait.kind,
            waited_s=round(self._clock() - wait.since, 1),
        )

    def _swap(self, entry: _Entry, wait: StatementWait | None, expected: StatementWait | None = None) -> bool:
        """Set or clear ``entry``'s wait and republish :meth:`waits`; False when there was nothing
        to do: a wait is only set while its statement is registered, and cleared once (the watch
        thread and the statement's own thread may both see it end)."""
        with self._entries_lock:
            if wait is not None and self._entries.get(id(entry)) is not entry:
                return False
            if wait is None and entry.wait is not expected:
                return False
            entry.wait = wait
            self._waits = tuple(e.wait for e in self._entries.values() if e.wait is not None)
            self.version += 1
        return True

    # -- who blocks --------------------------------------------------------------------------------
    def _blockers(
        self, conn: pymysql.connections.Connection, entry: _Entry, kind: str
    ) -> tuple[tuple[Blocker, ...], str | None, bool]:
        """The blocking sessions, why none is named, and whether they are only candidates."""
        if self._no_process:
            own = self._ids_from(conn, self._mdl_queries(entry) if kind == "metadata" else ())
            if not own:
                return (), NO_PROCESS, False
            return self._describe(conn, own), None, False
        likely = False
        if kind == "row":
            ids = self._ids_from(conn, _row_queries(entry.connection_id))
        else:
            ids = self._ids_from(conn, self._mdl_queries(entry))
            if not ids:
                ids, likely = self._likely_mdl_holders(conn, entry), True
        if not ids:
            return (), None, False
        return self._describe(conn, ids), None, likely

    def _mdl_queries(self, entry: _Entry) -> tuple[tuple[str, tuple], ...]:
        cid = entry.connection_id
        queries: list[tuple[str, tuple]] = [
            (
                "SELECT DISTINCT ht.PROCESSLIST_ID FROM performance_schema.metadata_locks w "
                "JOIN performance_schema.threads wt ON wt.THREAD_ID = w.OWNER_THREAD_ID "
                "JOIN performance_schema.metadata_locks h ON h.OBJECT_TYPE = w.OBJECT_TYPE "
                "AND h.OBJECT_SCHEMA <=> w.OBJECT_SCHEMA AND h.OBJECT_NAME <=> w.OBJECT_NAME "
                "AND h.LOCK_STATUS = 'GRANTED' "
                "JOIN performance_schema.threads ht ON ht.THREAD_ID = h.OWNER_THREAD_ID "
                "WHERE wt.PROCESSLIST_ID = %s AND w.LOCK_STATUS = 'PENDING' AND ht.PROCESSLIST_ID <> %s",
                (cid, cid),
            )
        ]
        if entry.tables:
            cond = " OR ".join(["(TABLE_SCHEMA = %s AND TABLE_NAME = %s)"] * len(entry.tables))
            queries.append(
                (
                    "SELECT DISTINCT THREAD_ID FROM information_schema.METADATA_LOCK_INFO "
                    f"WHERE THREAD_ID <> %s AND ({cond})",
                    (cid, *itertools.chain.from_iterable(entry.tables)),
                )
            )
        return tuple(queries)

    def _ids_from(
        self, conn: pymysql.connections.Connection, queries: Iterable[tuple[str, tuple]]
    ) -> list[int]:
        """Session ids from the first of ``queries`` the server can answer with a non-empty result
        (a lock table may be missing, not readable, or empty because its instrument is off)."""
        for sql, args in queries:
            if self._sources.get(sql, sql) is None:
                continue  # found missing or unreadable before
            try:
                with conn.cursor() as cur:
                    cur.execute(sql, args)
                    ids = [int(r[0]) for r in cur.fetchall() if r[0] is not None]
            except pymysql.err.MySQLError as exc:
                if error_code(exc) in _NO_SUCH_TABLE | _ACCESS_DENIED:
                    self._sources[sql] = None
                    continue
                raise
            if ids:
                return ids
        return []

    def _likely_mdl_holders(self, conn: pymysql.connections.Connection, entry: _Entry) -> list[int]:
        """Without a metadata-lock table: every other session with an open transaction (a
        transaction keeps the metadata locks of every table it touched until it ends), longest
        first, then every session whose statement names one of the statement's tables."""
        cid = entry.connection_id
        with conn.cursor() as cur:
            cur.execute(
                "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX "
                "WHERE trx_mysql_thread_id <> %s ORDER BY trx_started",
                (cid,),
            )
            ids = [int(r[0]) for r in cur.fetchall()]
            names = {t for _s, t in entry.tables}
            if names:
                cur.execute(
                    "SELECT ID, INFO FROM information_schema.PROCESSLIST "
                    "WHERE ID <> %s AND ID <> CONNECTION_ID() AND INFO IS NOT NULL",
                    (cid,),
                )
                for sid, info in cur.fetchall():
                    if int(sid) not in ids and any(name in str(info) for name in names):
                        ids.append(int(sid))
        return ids

    def _describe(self, conn: pymysql.connections.Connection, ids: list[int]) -> tuple[Blocker, ...]:
        ids = list(dict.fromkeys(ids))[: self.MAX_BLOCKERS]
        marks = ", ".join(["%s"] * len(ids))
        with conn.cursor() as cur:
            cur.execute(
                "SELECT ID, USER, HOST, COMMAND, TIME, STATE, INFO FROM information_schema.PROCESSLIST "
                f"WHERE ID IN ({marks})",
                tuple(ids),
            )
            rows: dict[int, Any] = {int(r[0]): r for r in cur.fetchall()}
        out = []
        for sid in ids:
            r = rows.get(sid)
            if r is None:
                out.append(Blocker(sid))
            else:
                out.append(Blocker(sid, r[1], r[2], r[3], int(r[4] or 0), r[5] or None, r[6]))
        return tuple(out)

    # -- stopping --------------------------------------------------------------------------------------
    def registered(self) -> list[int]:
        """Connection ids of the statements registered now."""
        with self._entries_lock:
            return list(dict.fromkeys(e.connection_id for e in self._entries.values()))

    def interrupt(self, *, connection: bool = False) -> list[int]:
        """Kill what every registered statement runs (``KILL QUERY``; ``connection=True``:
        ``KILL CONNECTION``); returns the connection ids told. Never raises: on stop, a server that
        cannot be reached has nothing of ours to roll back that it will not roll back anyway."""
        ids = self.registered()
        if not ids:
            return []
        self.interrupted = True
        verb = "CONNECTION" if connection else "QUERY"
        # The watch session, unless the watch thread is busy with it: then a session of its own.
        shared = self._mutex.acquire(timeout=1.0)
        conn = None
        try:
            conn = self._session() if shared else self._connect(self._cfg)
            with conn.cursor() as cur:
                for cid in ids:
                    try:
                        cur.execute(f"KILL {verb} {int(cid)}")
                    except pymysql.err.MySQLError as exc:
                        if error_code(exc) != 1094:  # unknown thread: it ended meanwhile
                            raise
        except Exception as exc:
            self.log.warning(f"stop: KILL {verb} failed", connections=ids, error=describe(exc))
            if shared:
                close_quietly(self._conn)
                self._conn = None
            return []
        finally:
            if shared:
                self._mutex.release()
            elif conn is not None:
                close_quietly(conn)
        return ids

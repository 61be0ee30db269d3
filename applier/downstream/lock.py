"""One active applier per changefeed and downstream: a server-side named lock.

Two appliers applying the same changefeed to the same database would interleave batches and could
move rows backwards. The lock is a MySQL/MariaDB user-level lock (``GET_LOCK``) held on a
*dedicated* session for the life of the active instance:

* it lives on the downstream itself, so "same downstream" needs no extra coordination service;
* the server releases it when the holding session ends for any reason (process exit, crash,
  ``KILL``, network loss noticed by the server), so a standby that keeps asking gets it within
  about one poll after that; a holder whose lock session died only on its own side ends that
  session itself and takes the lock again (:meth:`ActiveLock.is_held`);
* a holder whose lock session died with the server (a restart) cannot ask anyone whether the
  lock is free: it is *suspended* (no commit, no DDL: :class:`LockSuspended`, a transient error
  the callers replay) and takes the lock again every poll until the server answers. Then it
  either has the lock again, or finds another session holding it and has lost it for good;
* it is not on the apply session because the apply session is closed and reopened by the retry
  logic, which would drop the lock and let a standby in mid-failover.

The lock session gets a short ``wait_timeout`` (``idle_timeout``) and a heartbeat thread queries
it every ``heartbeat`` seconds. The heartbeat keeps a live holder's session from idling out, and
the short timeout makes the *server* drop the lock of a holder whose host vanished without closing
TCP (otherwise that could take the server's default eight hours). The heartbeat checks
``IS_USED_LOCK(name) = CONNECTION_ID()``; once it fails the instance must stop applying:
:attr:`ActiveLock.lost` turns true and :meth:`ActiveLock.ensure_held` raises :class:`LockLost`.

Between losing the lock and noticing it an in-flight transaction may still commit. A standby that
has just taken over closes that window with the checkpoint store's owner fence
(``CheckpointStore.claim`` / ``write(owner=...)``), using :attr:`ActiveLock.owner_token`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import pymysql

from applier.downstream.errors import DownstreamUnreachable, is_connection_loss, is_transient
from applier.downstream.session import SessionRef, close_quietly, connect, end_session, session_ref
from applier.downstream.url import DownstreamConfig
from applier.errors import FatalError
from applier.ops.logs import get_logger

__all__ = ["ActiveLock", "LockLost", "LockSuspended", "LockWait", "lock_name"]

LOCK_PREFIX: Final = "ticdc_applier:"
MAX_LOCK_NAME: Final = 64  # MySQL 5.7+ rejects longer user-level lock names


_log = get_logger(component="lock")


class LockLost(FatalError):
    """The single-active lock is gone: stop applying, another instance may already be active."""


class LockSuspended(DownstreamUnreachable):
    """The lock's session died and the server does not answer (it restarts): nothing may commit
    until the lock is taken again, which the heartbeat tries every poll. Transient, as the server
    being away is (``is_transient``): the caller replays its unit of work, and either the lock is
    back by then or it was lost for good (:class:`LockLost`)."""


@dataclass(frozen=True, slots=True)
class LockWait:
    """Passed to the wait callback on every poll while another instance holds the lock."""

    name: str
    waited: float  # seconds since acquire() started
    holder_connection_id: int | None  # server connection id holding the lock, if known
    error: BaseException | None  # a transient error of our own lock session, if that is why we wait


def _plain(name: str) -> bool:
    # Lowercase printable ASCII only: MySQL compares lock names case-insensitively, MariaDB
    # byte-wise and truncates at NUL. A plain name means the same thing on every server; anything
    # else is hashed (hex is lowercase too, so a hashed name can never fold onto a plain one).
    return all(" " <= ch <= "~" for ch in name) and name == name.lower()


def lock_name(schema: str, changefeed: str) -> str:
    """``ticdc_applier:<schema>:<changefeed>``, or a SHA-256-based name when that is over 64
    characters or not plain lowercase ASCII."""
    name = f"{LOCK_PREFIX}{schema}:{changefeed}"
    if len(name) <= MAX_LOCK_NAME and _plain(name):
        return name
    digest = hashlib.sha256(f"{schema}\x00{changefeed}".encode()).hexdigest()
    head = f"{LOCK_PREFIX}sha256:"
    return head + digest[: MAX_LOCK_NAME - len(head)]


class ActiveLock:
    """The single-active lock for one changefeed on one downstream.

    Usage::

        lock = ActiveLock(cfg, schema="ticdc_applier", changefeed=group_id)
        lock.acquire(lambda w: log.info("standby", holder=w.holder_connection_id))
        try:
            ...  # call lock.ensure_held() before each commit
        finally:
            lock.release()
    """

    def __init__(
        self,
        cfg: DownstreamConfig,
        *,
        schema: str = "ticdc_applier",
        changefeed: str,
        poll: float = 1.0,
        heartbeat: float = 5.0,
        idle_timeout: int = 60,
        connect_fn: Callable[[DownstreamConfig], pymysql.connections.Connection] | None = None,
    ) -> None:
        if poll <= 0 or heartbeat <= 0:
            raise ValueError("poll and heartbeat must be positive")
        if idle_timeout <= 2 * heartbeat:
            raise ValueError("idle_timeout must be well above the heartbeat interval")
        self.name = lock_name(schema, changefeed)
        self._cfg = cfg.with_options(
            # Short timeouts: this session only runs tiny queries and a GET_LOCK of at most `poll`.
            read_timeout=max(10.0, poll + 10.0),
            write_timeout=10.0,
        )
        self._poll = poll
        self._heartbeat = heartbeat
        self._idle_timeout = int(idle_timeout)
        self._connect = connect_fn or (lambda c: connect(c, autocommit=True))
        self._conn: pymysql.connections.Connection | None = None
        self._connection_id: int | None = None
        self._session: SessionRef | None = None
        self._mutex = threading.Lock()  # PyMySQL connections are not thread-safe
        self._held = False
        self._lost = threading.Event()
        self._suspended = threading.Event()  # the session died, the server did not answer since
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.owner_token = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"

    @property
    def connection_id(self) -> int | None:
        """Server connection id of the lock session while held (for fencing and diagnostics)."""
        return self._connection_id if self._held else None

    @property
    def lost(self) -> bool:
        """True once a held lock was found gone (set by the heartbeat thread or :meth:`is_held`)."""
        return self._lost.is_set()

    def _open(self) -> None:
        close_quietly(self._conn)
        self._conn = None
        conn = self._connect(self._cfg)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION wait_timeout = %s", (self._idle_timeout,))
            self._session = session_ref(conn)
            self._connection_id = self._session.id
        except BaseException:
            close_quietly(conn)
            raise
        self._conn = conn

    def _query_one(self, sql: str, args: tuple) -> object:
        assert self._conn is not None
        with self._conn.cursor() as cur:
            cur.execute(sql, args)
            row = cur.fetchone()
        return row[0] if row else None

    def acquire(
        self, wait_callback: Callable[[LockWait], bool | None] | None = None, *, timeout: float | None = None
    ) -> bool:
        """Block until this instance holds the lock; True when it does.

        Returns False if ``timeout`` seconds pass or ``wait_callback`` returns False (so a caller
        can stop waiting on shutdown). Transient errors of the lock session (downstream restarting)
        are waited out: they are reported through ``wait_callback`` and the session is reopened.
        Permanent errors (e.g. access denied) propagate.
        """
        if self._held and not self._lost.is_set():
            return True
        if self._lost.is_set():
            raise LockLost(f"lock {self.name!r} was lost; create a new ActiveLock to compete again")
        started = time.monotonic()
        wait_seconds = max(1, round(self._poll))  # GET_LOCK takes whole seconds on MySQL
        while True:
            error: BaseException | None = None
            holder: int | None = None
            try:
                with self._mutex:
                    if self._conn is None:
                        self._open()
                    got = self._query_one("SELECT GET_LOCK(%s, %s)", (self.name, wait_seconds))
                    if got == 1:
                        self._held = True
                        self._start_heartbeat()
                        return True
                    holder_value = self._query_one("SELECT IS_USED_LOCK(%s)", (self.name,))
                    holder = int(holder_value) if holder_value is not None else None
            except Exception as exc:
                if not is_transient(exc):
                    raise
                error = exc
                with self._mutex:
                    close_quietly(self._conn)
                    self._conn = None
            waited = time.monotonic() - started
            if (
                wait_callback is not None
                and wait_callback(LockWait(self.name, waited, holder, error)) is False
            ):
                return False
            if timeout is not None and waited >= timeout:
                return False
            if error is not None:
                time.sleep(self._poll)  # GET_LOCK did not do the waiting for us

    def is_held(self) -> bool:
        """Ask the server whether our lock session still holds the lock (one round trip).

        When the lock session failed (a network blip, a killed session), the lock is re-taken at
        once if it is free, on a new session; when another session holds it, it is lost for good;
        when the server does not answer, it is suspended (False, asked again at the next call).
        Re-taking is safe because the lock is only the first line: every checkpoint write is
        fenced by the owner token (``CheckpointStore.claim``), so an instance that took over in
        between makes our next commit fail with ``FencedOut``.
        """
        if not self._held or self._lost.is_set():
            return False
        error: BaseException | None = None
        try:
            with self._mutex:
                if self._conn is None or self._suspended.is_set():
                    holds = False
                else:
                    holds = self._query_one("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.name,)) == 1
        except Exception as exc:
            error = exc
            holds = False
        if holds:
            return True
        if error is None:
            error_text = (
                "the server did not answer"
                if self._suspended.is_set()
                else "the lock is held by another session"
            )
        else:
            error_text = repr(error)
        retaken = self._retake()
        if retaken is None:  # the server does not answer: ask again at the next poll
            if not self._suspended.is_set():
                self._suspended.set()
                _log.warning(
                    "single-active lock session failed and the server does not answer: nothing "
                    "commits until the lock is re-taken",
                    lock=self.name,
                    error=error_text,
                )
            return False
        self._suspended.clear()
        _log.warning(
            "single-active lock session failed" + ("; lock re-taken" if retaken else "; lock lost"),
            lock=self.name,
            error=error_text,
        )
        if not retaken:
            self._mark_lost()
        return retaken

    def _retake(self) -> bool | None:
        """Open a new lock session and take the lock if nobody holds it now (no waiting): True
        when taken, False when another session holds it (or a permanent error), None when the
        server could not be asked (a transient error: it is away).

        When the holder is our own previous lock session (its socket died on our side, a cut or
        stalled network path, but the server still keeps it, and the lock with it, until its
        ``wait_timeout``), that session is ended first (``end_session``): it is ours, so the lock
        is still ours to take, and waiting for the server to notice would only stop the daemon.
        """
        with self._mutex:
            return self._retake_locked()

    def _retake_locked(self) -> bool | None:
        """:meth:`_retake` for a caller that already holds the mutex."""
        if self._conn is not None:  # another thread may have taken it again meanwhile
            with contextlib.suppress(Exception):
                if self._query_one("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.name,)) == 1:
                    return True
        previous = self._session
        try:
            self._open()
            if self._query_one("SELECT GET_LOCK(%s, 0)", (self.name,)) == 1:
                return True
            holder = self._query_one("SELECT IS_USED_LOCK(%s)", (self.name,))
            if previous is None or holder != previous.id:
                return False
            assert self._conn is not None
            if not end_session(self._conn, previous):
                return False
            return self._query_one("SELECT GET_LOCK(%s, 0)", (self.name,)) == 1
        except Exception as exc:
            close_quietly(self._conn)
            self._conn = None
            return None if is_transient(exc) else False

    def run_fenced(
        self,
        statements: Sequence[str],
        *,
        on_start: Callable[[int], None] = lambda connection_id: None,
    ) -> None:
        """Run ``statements`` (a DDL) on the lock's own session, right after asking the server
        that this session still holds the lock.

        Why here: a DDL commits on its own, so the owner fence of the checkpoint cannot stop a
        stale instance from running one. The check and the DDL share the session that holds the
        lock, and the heartbeat waits meanwhile, so no other instance can hold the lock between
        the two. A lock found held by another session is lost for good (a standby may have it); a
        lock session that died only on our side is ended and the lock re-taken (``_retake``). The
        session's read timeout is lifted while the DDL runs (a long ALTER is not a dead server;
        hung statements are watched elsewhere). ``on_start`` gets the session's connection id
        (for the statement watch). Database errors of the DDL propagate, a lost session too once
        the lock is re-taken; a lost session whose lock cannot be re-taken raises :class:`LockLost`.
        """
        with self._mutex:
            if not self._held or self._lost.is_set():
                raise LockLost(f"the single-active lock {self.name!r} is not held: not running a DDL")
            if self._conn is None or self._suspended.is_set():
                raise self._suspended_error("not running a DDL")
            conn = self._conn
            checked = False
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.name,))
                    row = cur.fetchone()
                    checked = True
                    if not row or row[0] != 1:
                        raise LockLost(
                            f"the single-active lock {self.name!r} is held by another session: "
                            "not running a DDL (another instance may be active)"
                        )
                    on_start(int(self._connection_id or 0))
                    saved = conn._read_timeout  # pymysql applies it to every read of the session
                    conn._read_timeout = None
                    try:
                        for sql in statements:
                            cur.execute(sql)
                    finally:
                        conn._read_timeout = saved
            except LockLost:
                self._lost_locked()
                raise
            except pymysql.err.MySQLError as exc:
                if isinstance(exc, pymysql.err.InterfaceError) or not conn.open or is_connection_loss(exc):
                    retaken = self._retake_locked()
                    if retaken or retaken is None:
                        # Our session died on our side only: it is ended on the server (a DDL it
                        # was running with it) and the lock is ours again on a new session; or
                        # the server went away with it, and the lock is taken again once it is
                        # back (suspended meanwhile). The lost connection propagates as the
                        # transient error it is: the caller replays, and a DDL that was sent is
                        # settled from the journal.
                        if retaken is None:
                            self._suspended.set()
                        _log.warning(
                            "single-active lock session failed during a DDL; "
                            + ("lock re-taken" if retaken else "the server does not answer"),
                            lock=self.name,
                            error=repr(exc),
                        )
                        raise
                    self._lost_locked()
                    why = exc.args[-1] if exc.args else exc
                    if not checked:
                        raise LockLost(
                            f"the session holding the single-active lock {self.name!r} is gone ({why}): "
                            "not running a DDL (another instance may be active)"
                        ) from None
                    raise LockLost(
                        f"the session holding the single-active lock {self.name!r} was lost while running "
                        f"a DDL ({why}); a restart settles the DDL"
                    ) from None
                raise

    def _lost_locked(self) -> None:
        """:meth:`_mark_lost` for a caller that already holds the mutex."""
        self._lost.set()
        self._stop.set()
        close_quietly(self._conn)
        self._conn = None

    def _suspended_error(self, what: str) -> LockSuspended:
        return LockSuspended(
            f"the session holding the single-active lock {self.name!r} is gone and the server does not "
            f"answer: {what} until the lock is taken again"
        )

    def ensure_held(self, *, check: bool = False) -> None:
        """Raise :class:`LockLost` unless the lock is held, :class:`LockSuspended` (transient)
        while it is suspended. ``check=False`` trusts the heartbeat (no round trip, call it
        freely); ``check=True`` asks the server now (call before commit)."""
        held = (
            self.is_held()
            if check
            else (self._held and not self._lost.is_set() and not self._suspended.is_set())
        )
        if not held:
            if self._held and self._suspended.is_set() and not self._lost.is_set():
                raise self._suspended_error("not committing")
            raise LockLost(
                f"the single-active lock {self.name!r} is no longer held "
                "(its session ended); stop applying, another instance may be active"
            )

    def _mark_lost(self) -> None:
        self._lost.set()
        self._stop.set()
        with self._mutex:
            close_quietly(self._conn)
            self._conn = None

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat, name=f"applier-lock-heartbeat:{self.name}", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self._poll if self._suspended.is_set() else self._heartbeat):
            if not self.is_held() and not self._suspended.is_set():
                return

    def release(self) -> None:
        """Release the lock and close its session (idempotent)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._heartbeat + 15)
        with self._mutex:
            if self._conn is not None and self._held and not self._lost.is_set():
                # Closing the session below releases the lock anyway; this just makes it prompt.
                with contextlib.suppress(Exception):
                    self._query_one("SELECT RELEASE_LOCK(%s)", (self.name,))
            close_quietly(self._conn)
            self._conn = None
            self._held = False

    close = release

    def __enter__(self) -> ActiveLock:
        if not self.acquire():
            raise LockLost(f"could not acquire {self.name!r}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

"""Opening a downstream session configured the way replication needs it.

Every session the applier opens goes through :func:`connect`, so all of them agree on:

* autocommit off: a batch of rows and its checkpoint commit together or not at all;
* READ COMMITTED: fewer gap locks than REPEATABLE READ, so a replayed batch does not deadlock with
  itself or with readers; it is also what TiCDC's own MySQL sink uses;
* ``foreign_key_checks=0``: the stream is already consistent upstream, but rows of one upstream
  transaction arrive spread over partitions and are applied in an order that a child-before-parent
  check would reject;
* utf8mb4 on the wire;
* ``time_zone`` from the config: TIMESTAMP values arrive as strings in the producer's zone;
* a fixed, permissive ``sql_mode`` (below), independent of whatever the server's global mode is;
* TCP keepalive (``KEEPALIVE_IDLE`` / ``KEEPALIVE_INTERVAL`` / ``KEEPALIVE_COUNT``) and, on Linux,
  ``TCP_USER_TIMEOUT``: a peer that vanished without closing the connection (host down, a
  firewall or NAT that dropped the flow) is noticed within about a minute even while the session
  waits for a long statement, which the read timeout of the DDL session does not bound;
* the client's ``max_allowed_packet`` is the server's session value: PyMySQL keeps its own
  (16 MiB unless told), which would otherwise disagree with a server set lower or higher. The
  statements themselves are sized to the server's value by ``sqlgen`` (the daemon and the
  catch-up read it at start, ``applier.apply.ddl.detect_dialect``).

``DEFAULT_SQL_MODE`` is deliberately *not* derived from the server's global mode: a global mode
with ``ANSI_QUOTES``, ``NO_BACKSLASH_ESCAPES`` (breaks PyMySQL's backslash escaping of bound
values), ``EMPTY_STRING_IS_NULL`` or ``ORACLE`` would silently change what our statements and the
upstream DDL text mean. It contains no STRICT_* / NO_ZERO_DATE / NO_ZERO_IN_DATE /
ERROR_FOR_DIVISION_BY_ZERO, so zero dates (``'0000-00-00'``) that TiDB accepted are stored as
sent, and:

* ``NO_AUTO_VALUE_ON_ZERO``: an AUTO_INCREMENT column that holds 0 upstream must stay 0 here,
  not be replaced by a freshly generated id (mysqldump sets it for the same reason);
* ``ALLOW_INVALID_DATES``: DATE/DATETIME values such as ``2020-02-30`` that the upstream stored
  are kept instead of being turned into zero dates.

The price of a non-strict mode is that out-of-range or too-long values are clipped with a warning
instead of failing; code writing our own tables (the checkpoint store) validates values itself.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pymysql
from pymysql.constants import CLIENT

from applier.downstream.batch import BatchFailed, execute_batch, multi_statements
from applier.downstream.errors import (
    PRIVILEGE_CODES,
    UNREACHABLE_CODES,
    DownstreamConnectError,
    DownstreamPrivilegeError,
    DownstreamRefused,
    DownstreamUnreachable,
    describe,
    error_code,
    is_transient,
)
from applier.downstream.url import DownstreamConfig

__all__ = [
    "DEFAULT_SQL_MODE",
    "DownstreamConnectError",
    "DownstreamRefused",
    "DownstreamUnreachable",
    "SessionRef",
    "close_quietly",
    "connect",
    "connection_id",
    "end_session",
    "privileges_needed",
    "session_ref",
    "tls_kwargs",
]

KEEPALIVE_IDLE: Final = 30
"""Seconds of silence on a session before the first keepalive probe."""
KEEPALIVE_INTERVAL: Final = 10
KEEPALIVE_COUNT: Final = 3
"""Unanswered probes after which the kernel resets the connection: idle + count x interval = 60 s."""
USER_TIMEOUT_MS: Final = 60_000
"""How long sent data may stay unacknowledged before the kernel gives up on the connection
(Linux ``TCP_USER_TIMEOUT``; the default retransmission limit is about 15 minutes)."""
SESSION_END_SECONDS: Final = 30.0
"""How long :func:`end_session` waits for a killed session to be gone from the server."""
SERVER_START_TOLERANCE: Final = 3.0
"""Seconds by which two readings of a server's start time (now - uptime) may differ for one run."""

DEFAULT_SQL_MODE: Final = "NO_AUTO_VALUE_ON_ZERO,ALLOW_INVALID_DATES"

_HOW_TO_REPOINT: Final = "set APPLIER_DOWNSTREAM or pass --downstream to use another server"


def tls_kwargs(cfg: DownstreamConfig) -> dict[str, Any]:
    """PyMySQL's TLS arguments for ``cfg.ssl_mode`` (MySQL client ``--ssl-mode`` semantics).

    For the modes that encrypt we build the ``ssl.SSLContext`` ourselves, because PyMySQL's own
    mapping surprises: given ``ssl_ca`` alone it encrypts but does not verify the certificate,
    and without a CA file it never checks the host name even when asked to. Raises
    :class:`DownstreamConnectError` (permanent: retrying cannot fix a file) when a certificate
    or key file cannot be loaded.
    """
    mode = cfg.ssl_mode
    if mode == "disabled":
        return {"ssl_disabled": True}
    if mode == "preferred":
        return {}  # PyMySQL: TLS when the server offers it, unverified; plain otherwise
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca)
        # MySQL's auto-generated certificates fail Python 3.13's strict X.509 checks.
        ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
        if mode == "required":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.check_hostname = mode == "verify_identity"
        if cfg.ssl_cert:
            ctx.load_cert_chain(cfg.ssl_cert, cfg.ssl_key)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(
            f"{k}={v}"
            for k, v in (("ssl_ca", cfg.ssl_ca), ("ssl_cert", cfg.ssl_cert), ("ssl_key", cfg.ssl_key))
            if v
        )
        raise DownstreamConnectError(
            f"cannot load the TLS files for {cfg.redacted()} ({files}): {_one_line(str(exc))}"
        ) from exc
    return {"ssl": ctx}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def connect(
    cfg: DownstreamConfig, *, autocommit: bool = False, multi_statements: bool = False
) -> pymysql.connections.Connection:
    """Open and configure a session; raises :class:`DownstreamConnectError` (or its subclass
    :class:`DownstreamUnreachable`) with a one-line, password-free message on failure.

    ``autocommit=True`` is for sessions that never write rows (the single-active lock).
    ``multi_statements``: the session takes several statements in one packet
    (:mod:`applier.downstream.batch`), for sessions that run the applier's own statements only,
    never the upstream DDL text; the settings below then cost a single round trip.
    """
    tls = tls_kwargs(cfg)
    try:
        conn = pymysql.connect(
            host=cfg.host,
            port=cfg.port,
            user=cfg.user,
            # Bytes: PyMySQL would encode a str password as latin-1, which fails for most scripts.
            password=cfg.password.reveal().encode("utf-8"),
            charset="utf8mb4",
            autocommit=None,  # set with the other session settings, in the same round trip
            client_flag=CLIENT.MULTI_STATEMENTS if multi_statements else 0,
            connect_timeout=cfg.connect_timeout,
            read_timeout=cfg.read_timeout,
            write_timeout=cfg.write_timeout,
            program_name="ticdc-applier",
            **tls,
        )
    except pymysql.err.MySQLError as exc:
        code = error_code(exc)
        reason = _one_line(exc.args[1] if len(exc.args) > 1 else exc)
        tls_problem = _tls_failure(cfg, exc)
        if tls_problem is not None:  # permanent: retrying cannot fix a certificate
            raise DownstreamRefused(tls_problem, errno=code) from exc
        if code in UNREACHABLE_CODES or code in _BUSY_CODES or isinstance(exc, pymysql.err.InterfaceError):
            raise DownstreamUnreachable(
                f"cannot reach the downstream database at {cfg.redacted()}: {reason}; {_HOW_TO_REPOINT}",
                errno=code,
            ) from exc
        if code in (1044, 1045, 1698):
            raise DownstreamRefused(
                f"the downstream database at {cfg.redacted()} refused the login ({code}: {reason}); "
                f"check the user and the password (URL, APPLIER_DOWNSTREAM_PASSWORD or password_file)",
                errno=code,
            ) from exc
        detail = f"{code}: {reason}" if code is not None else reason
        raise DownstreamConnectError(
            f"cannot open a session on the downstream database at {cfg.redacted()} ({detail})",
            errno=code,
        ) from exc
    except OSError as exc:  # PyMySQL wraps socket errors; this is a safety net
        raise DownstreamUnreachable(
            f"cannot reach the downstream database at {cfg.redacted()}: {_one_line(str(exc))}; "
            f"{_HOW_TO_REPOINT}"
        ) from exc
    try:
        _keep_alive(conn)
        _configure(conn, cfg, autocommit)
    except BaseException:
        close_quietly(conn)
        raise
    return conn


_BUSY_CODES: Final = frozenset({1040, 1053})
"""The server answered but takes no session now: too many connections, shutting down."""


def current_account(conn: pymysql.connections.Connection) -> str:
    """The account the server matched the login to, as a GRANT names it (``'applier'@'%'``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER()")
        user, _, host = str(cur.fetchone()[0]).rpartition("@")
    return f"{conn.escape(user)}@{conn.escape(host)}"


@contextlib.contextmanager
def privileges_needed(
    conn: pymysql.connections.Connection, *, privileges: str, on: str, purpose: str
) -> Iterator[None]:
    """Turn a privilege error of the statements run inside into a configuration error that names
    the GRANT statement giving what is missing: restarting cannot fix it, an operator can."""
    try:
        yield
    except pymysql.err.MySQLError as exc:
        if error_code(exc) not in PRIVILEGE_CODES:
            raise
        try:
            account = current_account(conn)
        except pymysql.err.MySQLError:
            account = "the applier's user"
        raise DownstreamPrivilegeError(
            f"the downstream user {account} lacks a privilege {purpose} ({describe(exc)}); "
            f"grant it with: GRANT {privileges} ON {on} TO {account}"
        ) from None


def _keep_alive(conn: pymysql.connections.Connection) -> None:
    """Turn on TCP keepalive (and the unacknowledged-data limit where the kernel has one) for the
    session's socket: see the module docstring. A Unix socket has neither, and needs neither."""
    sock = conn._sock  # PyMySQL's socket (an SSLSocket under TLS: the options go through)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _tls_failure(cfg: DownstreamConfig, exc: pymysql.err.MySQLError) -> str | None:
    """A clear message when the TLS handshake, not the network, failed (None otherwise).

    PyMySQL reports a failed certificate check as "can't connect" (2003), which reads like a
    network problem; the operator needs to hear which setting to look at instead.
    """
    original = getattr(exc, "original_exception", None)
    where = cfg.redacted()
    if isinstance(original, ssl.SSLCertVerificationError):
        why = _one_line(original.verify_message or original.reason or original)
        return (
            f"TLS: the certificate of the downstream database at {where} was refused ({why}); "
            f"ssl_mode={cfg.ssl_mode}: check downstream_ssl_ca (the CA that signed the server's "
            "certificate) and, for verify_identity, that the certificate names the host in the URL"
        )
    if isinstance(original, ssl.SSLError):
        return f"TLS handshake with the downstream database at {where} failed: {_one_line(str(original))}"
    if error_code(exc) == 2026:  # CR_SSL_CONNECTION_ERROR, e.g. the server offers no TLS
        detail = _one_line(exc.args[1] if len(exc.args) > 1 else exc)
        return f"TLS to the downstream database at {where} is impossible ({detail}); ssl_mode={cfg.ssl_mode}"
    return None


def close_quietly(conn: pymysql.connections.Connection | None) -> None:
    """Close a session that may already be dead; closing is best effort by nature."""
    if conn is None:
        return
    # close() raises "Already closed" on a second call and socket errors on a dead peer.
    with contextlib.suppress(pymysql.err.Error, OSError):
        conn.close()


def connection_id(conn: pymysql.connections.Connection) -> int:
    """The server's id of a session: what ``KILL`` and ``PROCESSLIST`` name it by. Reads no table,
    so it opens no transaction even with autocommit off."""
    with conn.cursor() as cur:
        cur.execute("SELECT CONNECTION_ID()")
        return int(cur.fetchone()[0])


@dataclass(frozen=True, slots=True)
class SessionRef:
    """A session as the server knows it: its id, and when the server that runs it started.

    Ids restart from 1 when the server restarts (and differ between the servers behind a
    failover address), so an id alone may name someone else's session later on."""

    id: int
    server_started: float  # Unix seconds, to about a second


def _server_started(cur: Any) -> float:
    cur.execute(_SESSION_REF[0])
    now = cur.fetchall()
    cur.execute(_SESSION_REF[1])
    return _started(now, cur.fetchall())


def _started(now: Any, uptime: Any) -> float:
    """The server's start, from the rows of ``SELECT UNIX_TIMESTAMP()`` and its uptime status."""
    return float(now[0][0]) - float(uptime[0][1])


def _session_ref(now: Any, uptime: Any, session_id: Any) -> SessionRef:
    return SessionRef(int(session_id[0][0]), _started(now, uptime))


def session_ref(conn: pymysql.connections.Connection) -> SessionRef:
    """The :class:`SessionRef` of ``conn``; opens no transaction. A session that takes several
    statements a packet read it when it was set up (``_configure``)."""
    known = getattr(conn, "applier_session", None)
    if known is not None:
        return known
    with conn.cursor() as cur:
        started = _server_started(cur)
        cur.execute(_SESSION_REF[2])
        return SessionRef(int(cur.fetchone()[0]), started)


def end_session(
    conn: pymysql.connections.Connection, session: SessionRef, timeout: float = SESSION_END_SECONDS
) -> bool:
    """End a session of ours that we lost contact with, from ``conn`` (another session), and wait
    until the server no longer lists it; True once it is gone.

    A connection that died on our side (a read timeout, a cut network path, a proxy that stopped
    forwarding) may live on in the server for hours: still in its transaction, holding its row
    locks (a replay of the same rows would wait on them) or a named lock, and possibly still able
    to commit. Killing it and waiting until it is gone makes its outcome final before the caller
    decides what to do next (replay, or learn from the checkpoint that the commit landed). A
    session of a server that has restarted since (or of another server) ended with it: nothing
    is killed then, since its id may now be someone else's. Best effort: a server that refuses
    (a session of another user without the privilege) or cannot tell leaves the session to its
    ``wait_timeout``; False then.
    """
    deadline = time.monotonic() + timeout
    try:
        with conn.cursor() as cur:
            if abs(_server_started(cur) - session.server_started) > SERVER_START_TOLERANCE:
                return True
            try:
                cur.execute("KILL CONNECTION %s", (session.id,))
            except pymysql.err.OperationalError as exc:
                if error_code(exc) != 1094:  # unknown thread: already gone
                    return False
            while True:
                cur.execute(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (session.id,)
                )
                gone = cur.fetchone()[0] == 0
                if gone or time.monotonic() >= deadline:
                    return gone
                time.sleep(0.05)
    except pymysql.err.MySQLError:
        return False
    finally:
        if not conn.get_autocommit():
            with contextlib.suppress(pymysql.err.Error):
                conn.rollback()  # the PROCESSLIST reads must not leave a transaction open


def _configure(conn: pymysql.connections.Connection, cfg: DownstreamConfig, autocommit: bool) -> None:
    """Set the session up (the module docstring says what and why), in as few round trips as the
    session takes statements (``applier.downstream.batch``); with several statements a packet,
    also what :func:`session_ref` asks, kept on the connection."""
    sql_mode = DEFAULT_SQL_MODE if cfg.sql_mode is None else cfg.sql_mode
    texts = [
        # Must run before any transaction starts (1568 otherwise); SET never starts one.
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        f"SET SESSION autocommit = {int(autocommit)}, foreign_key_checks = 0, "
        f"time_zone = {conn.escape(cfg.time_zone)}, sql_mode = {conn.escape(sql_mode)}",
        "SELECT @@SESSION.max_allowed_packet",
    ]
    ref = multi_statements(conn)
    if ref:
        texts += _SESSION_REF
    with conn.cursor() as cur:
        try:
            rows = execute_batch(cur, texts, fetch=range(2, len(texts)))
        except BatchFailed as failed:
            raise _setting_refused(cfg, sql_mode, failed) from None
    conn.max_allowed_packet = int(rows[2][0][0])
    if ref:
        conn.applier_session = _session_ref(rows[3], rows[4], rows[5])


def _setting_refused(cfg: DownstreamConfig, sql_mode: str, failed: BatchFailed) -> BaseException:
    """What the server's refusal of a session setting means (transient errors are passed on)."""
    exc = failed.error
    if failed.index != 1 or is_transient(exc):
        return exc
    reason = _one_line(exc.args[1] if len(exc.args) > 1 else exc)
    if error_code(exc) == _UNKNOWN_TIME_ZONE:
        return DownstreamConnectError(
            f"the downstream database at {cfg.redacted()} rejected time_zone {cfg.time_zone!r} "
            f"({reason}); use an offset such as +08:00, "
            "or load the server's time zone tables to use names",
            errno=error_code(exc),
        )
    return DownstreamConnectError(
        f"the downstream database at {cfg.redacted()} rejected sql_mode {sql_mode!r} ({reason})",
        errno=error_code(exc),
    )


_UNKNOWN_TIME_ZONE: Final = 1298
_SESSION_REF: Final = (
    "SELECT UNIX_TIMESTAMP()",
    "SHOW GLOBAL STATUS LIKE 'Uptime'",
    "SELECT CONNECTION_ID()",
)
"""What :func:`session_ref` reads: the server's start (now - uptime) and the session's id."""

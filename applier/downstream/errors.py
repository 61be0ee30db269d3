"""Which downstream errors are worth retrying, and the connection errors shown to operators.

Retrying is only safe because the caller replays a whole unit of work (a transaction body kept in
memory) on a fresh session, so "transient" here means: the server did not apply the unit and may
succeed if asked again (also when it refuses to store anything for now: read-only, out of space).
Everything else (constraint violations, missing tables, syntax, access) would fail the same way on
every replay and must surface at once.
"""

from __future__ import annotations

from typing import Final

import pymysql

from applier.errors import EXIT_USAGE, ConfigurationError, FatalError
from sqlgen.errors import TRANSIENT_CLASSES, transient_class

# Codes that mean "the server is not there" when they come from connect().
UNREACHABLE_CODES: Final = frozenset({2002, 2003, 2005, 2006, 2013})


class DownstreamConnectError(FatalError):
    """Opening a downstream session failed. ``str()`` is one line, safe to show: no password.

    The CLI prints ``str(exc)`` instead of a traceback. ``errno`` is the MySQL error code when
    there was one.
    """

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class DownstreamUnreachable(DownstreamConnectError):
    """No server answered at the configured address (refused, unknown host, timeout), or it
    answered that it cannot take a session now (too many connections, shutting down): transient."""


class DownstreamRefused(DownstreamConnectError):
    """The server answered and refused this client for good: the login (user, password, host) or
    the TLS settings. Only the configuration can change that, so it exits as one (2)."""

    exit_code = EXIT_USAGE


PRIVILEGE_CODES: Final = frozenset({1044, 1142, 1143, 1227, 1370})
"""Access denied to a database, a table, a column, for an operation (SUPER/PROCESS...), a routine."""


class DownstreamPrivilegeError(ConfigurationError):
    """The downstream user lacks a privilege a job needs; the message names the GRANT that gives it."""


def error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a PyMySQL exception (``exc.args[0]``), else None."""
    if isinstance(exc, DownstreamConnectError):
        return exc.errno
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def is_transient(exc: BaseException) -> bool:
    """True when replaying the unit of work on a new session may succeed.

    InterfaceError is PyMySQL's "this connection is already closed" (``(0, '')``), which is what
    the *second* statement on a killed session raises. Bare socket errors are included in case one
    escapes PyMySQL's wrapping. Anything that is not a database/network error (a bug in our code)
    is never transient.
    """
    if isinstance(exc, DownstreamUnreachable):
        return True
    if isinstance(exc, DownstreamConnectError):
        return False  # e.g. access denied: retrying cannot help
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    if isinstance(exc, pymysql.err.MySQLError):
        return transient_class(error_code(exc), _server_text(exc)) is not None
    return isinstance(exc, (ConnectionError, TimeoutError))


def _server_text(exc: BaseException) -> str:
    """The server's message of a PyMySQL error (``exc.args[1]``), else ''."""
    if isinstance(exc, pymysql.err.MySQLError) and len(exc.args) >= 2:
        return str(exc.args[1])
    return ""


def is_connection_loss(exc: BaseException) -> bool:
    """True when the session itself is gone (not just the statement): its locks went with it."""
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    code = error_code(exc)
    return code is not None and TRANSIENT_CLASSES.get(code) in ("connection", "server_shutdown")


def retry_class(exc: BaseException) -> str:
    """The class a transient error is counted and logged under: ``lock_wait``, ``deadlock``,
    ``interrupted``, ``server_shutdown``, ``read_only``, ``disk_full`` or ``connection`` (no
    code: a dropped socket)."""
    return transient_class(error_code(exc), _server_text(exc)) or "connection"


def describe(exc: BaseException) -> str:
    """``"(2013) Lost connection ..."`` — a compact, secret-free form for logs."""
    code = error_code(exc)
    if isinstance(exc, pymysql.err.MySQLError) and len(exc.args) >= 2:
        text = str(exc.args[1]) or type(exc).__name__
    else:
        text = str(exc) or type(exc).__name__
    return f"({code}) {text}" if code is not None else text

"""Transient/permanent classification of downstream errors."""

from __future__ import annotations

import pymysql
import pytest

from applier.downstream.errors import (
    DownstreamConnectError,
    DownstreamUnreachable,
    describe,
    error_code,
    is_transient,
    retry_class,
)

OE = pymysql.err.OperationalError


@pytest.mark.parametrize(
    "exc",
    [
        OE(1205, "Lock wait timeout exceeded; try restarting transaction"),
        OE(1213, "Deadlock found when trying to get lock; try restarting transaction"),
        OE(2002, "Can't connect"),
        OE(2003, "Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)"),
        OE(2006, "MySQL server has gone away"),
        OE(2013, "Lost connection to MySQL server during query"),
        OE(1927, "Connection was killed"),
        OE(1317, "Query execution was interrupted"),
        pymysql.err.InterfaceError(0, ""),
        DownstreamUnreachable("cannot reach", errno=2003),
        ConnectionResetError(104, "reset"),
        TimeoutError(),
    ],
)
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        pymysql.err.IntegrityError(1062, "Duplicate entry '1' for key 'PRIMARY'"),
        pymysql.err.ProgrammingError(1146, "Table 'x.y' doesn't exist"),
        pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax"),
        OE(1049, "Unknown database"),
        OE(1045, "Access denied"),
        pymysql.err.DataError(1406, "Data too long"),
        DownstreamConnectError("refused the login", errno=1045),
        ValueError("a bug"),
        KeyError("a bug"),
    ],
)
def test_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_error_code_and_describe() -> None:
    exc = OE(2013, "Lost connection to MySQL server during query")
    assert error_code(exc) == 2013
    assert describe(exc) == "(2013) Lost connection to MySQL server during query"
    assert error_code(ValueError("x")) is None and describe(ValueError("x")) == "x"
    assert error_code(DownstreamUnreachable("m", errno=2003)) == 2003
    assert describe(pymysql.err.InterfaceError(0, "")) == "(0) InterfaceError"


def test_retry_classes_name_what_happened() -> None:
    assert retry_class(OE(1205, "Lock wait timeout exceeded")) == "lock_wait"
    assert retry_class(OE(1213, "Deadlock found")) == "deadlock"
    assert retry_class(OE(1317, "Query execution was interrupted")) == "interrupted"
    assert retry_class(OE(1053, "Server shutdown in progress")) == "server_shutdown"
    for exc in (OE(2013, "Lost connection"), pymysql.err.InterfaceError(0, ""), TimeoutError()):
        assert retry_class(exc) == "connection"

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


# The server's own texts (MariaDB 10.11), as the daemon receives them.
READ_ONLY = OE(
    1290, "The MariaDB server is running with the --read-only option so it cannot execute this statement"
)
TABLE_FULL = OE(1114, "The table 't' is full")
CREATE_IN_FULL_TABLESPACE = OE(
    1005, 'Can\'t create table `d`.`t2` (errno: 135 "No more room in record file")'
)
ENGINE_NO_SPACE = OE(1030, 'Got error 28 "No space left on device" from storage engine InnoDB')
WRITE_NO_SPACE = OE(3, "Error writing file './binlog.000001' (Errcode: 28 \"No space left on device\")")
QUOTA = OE(1030, 'Got error 122 "Disk quota exceeded" from storage engine InnoDB')


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (READ_ONLY, "read_only"),
        (TABLE_FULL, "disk_full"),
        (OE(1021, "Disk full (./t.MAD); waiting for someone to free some space..."), "disk_full"),
        (CREATE_IN_FULL_TABLESPACE, "disk_full"),
        (ENGINE_NO_SPACE, "disk_full"),
        (WRITE_NO_SPACE, "disk_full"),
        (QUOTA, "disk_full"),
    ],
)
def test_a_read_only_or_full_server_is_transient_with_its_own_class(exc: BaseException, cls: str) -> None:
    """docs/operations.md, "Read-only and full downstreams": ridden out, counted by class."""
    assert is_transient(exc)
    assert retry_class(exc) == cls


@pytest.mark.parametrize(
    "exc",
    [
        # the same codes with another errno: a bad definition, not a full disk
        OE(1005, 'Can\'t create table `d`.`c` (errno: 150 "Foreign key constraint is incorrectly formed")'),
        OE(1030, 'Got error 1 "Operation not permitted" from storage engine InnoDB'),
        OE(1005, "Can't create table `d`.`t`"),  # no number at all
        # the binlog cache: the same transaction never fits (the daemon says which setting to raise)
        OE(1197, "Multi-statement transaction required more than 'max_binlog_cache_size' bytes of storage"),
        OE(1534, "Non-transactional statements required more than 'max_binlog_stmt_cache_size' bytes"),
    ],
)
def test_other_storage_errors_stay_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)

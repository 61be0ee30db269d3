"""Classifying MySQL/MariaDB error codes for the DDL and DML appliers.

The code sets come from TiCDC's MySQL sink (docs/open-protocol.md §6). The classes say what
the caller should do; retry policy, backoff and logging are the caller's business.

- ``ALREADY_APPLIED``: a DDL error meaning the change is already there (table exists, column
  missing on DROP COLUMN, ...) — typical after a replay; ignore it.
- ``FATAL``: retrying cannot help (bad SQL, missing database or table, access denied, duplicate
  key outside REPLACE); stop and report.
- ``TRANSIENT``: deadlock, lock wait timeout, lost connection, a read-only or full server; retry
  (after reconnecting).
- ``UNKNOWN``: anything else; the caller decides (typically retry a few times, then stop).
"""

from __future__ import annotations

import enum
import re
from typing import Final

ALREADY_APPLIED_DDL_ERRORS = frozenset(
    {1007, 1008, 1050, 1051, 1054, 1060, 1061, 1068, 1091, 1176, 1507, 1517}
)
NEVER_RETRY_DDL_ERRORS = frozenset(
    {1044, 1045, 1046, 1049, 1064, 1149, 1066, 1072, 1082, 1146, 1166, 1505, 3750}
)
# The one table of transient codes: the server did not apply the statement, or the session died;
# replaying the whole unit of work on a new session may succeed. Each code names the class its
# retries are counted and logged under (``applier.downstream.errors.retry_class``).
#   1317 ER_QUERY_INTERRUPTED: the statement was killed (KILL QUERY); the transaction is rolled
#        back, so replaying it is safe (on stop the daemon kills its own statement and does not
#        replay: ``applier.apply.window_applier.Stopping``);
#   1927 ER_CONNECTION_KILLED (MariaDB): our session was killed while a statement ran;
#   4031 (MySQL >= 8.0.24): idle session disconnected by wait_timeout, sent as an error packet.
# The server refusing to store anything is transient too: nothing of the unit was applied, and the
# condition is an operator's to end (docs/operations.md, "Read-only and full downstreams"):
#   1290 ER_OPTION_PREVENTS_STATEMENT: ``read_only`` (or MySQL's ``super_read_only``) is on, as
#        during a switchover; the only option our statements can run into (none of ours reads
#        files or needs a TLS-only account);
#   1114 ER_RECORD_FILE_FULL: InnoDB cannot extend the table's tablespace (the disk, or a data
#        file of fixed size, is full);
#   1021 ER_DISK_FULL: the server waits for space, and gives up after a while.
TRANSIENT_CLASSES: Final = {
    1205: "lock_wait",  # lock wait timeout
    1213: "deadlock",
    1317: "interrupted",
    1053: "server_shutdown",  # shutdown in progress: the connection is about to die
    1040: "connection",  # too many connections
    1927: "connection",
    2002: "connection",  # can't connect (socket)
    2003: "connection",  # can't connect (TCP)
    2006: "connection",  # server has gone away
    2013: "connection",  # lost connection during query
    2055: "connection",  # lost connection (system error)
    4031: "connection",
    1290: "read_only",
    1114: "disk_full",
    1021: "disk_full",
}
TRANSIENT_ERRORS: Final = frozenset(TRANSIENT_CLASSES)
# Codes that carry an operating system or storage engine error number in their text, and the
# numbers among those that mean "no space": such an error is ``disk_full`` (transient); with any
# other number it stays what its code is (a CREATE TABLE refused for a bad foreign key is 1005
# with errno 150: permanent).
#   3 ER_ERROR_ON_WRITE, 1005 ER_CANT_CREATE_TABLE, 1030 ER_GET_ERRNO (storage engine errors);
#   errno 28 ENOSPC, 122 EDQUOT (disk quota), 135 HA_ERR_RECORD_FILE_FULL (what a CREATE TABLE in
#   a full InnoDB tablespace reports).
ERRNO_CARRYING_CODES: Final = frozenset({3, 1005, 1030})
NO_SPACE_ERRNOS: Final = frozenset({28, 122, 135})
_ERRNO = re.compile(r"(?:errno|Errcode|error)[:\s]+(\d+)", re.IGNORECASE)
# Errors of the binary log's transaction caches: the transaction does not fit the server's
# limit, so the same transaction fails the same way on every replay (permanent), and the
# message names the setting to raise. Value: the server variable.
#   1197 ER_TRANS_CACHE_FULL, 1534 ER_STMT_CACHE_FULL (non-transactional tables).
BINLOG_CACHE_FULL: Final = {1197: "max_binlog_cache_size", 1534: "max_binlog_stmt_cache_size"}


def transient_class(code: int | None, message: str = "") -> str | None:
    """The retry class of a transient error (``TRANSIENT_CLASSES``, or ``disk_full`` for an
    errno-carrying code whose number means "no space"), None when the error is not transient.
    ``message`` is the server's text of the error."""
    if code in TRANSIENT_CLASSES:
        return TRANSIENT_CLASSES[code]
    if code in ERRNO_CARRYING_CODES:
        match = _ERRNO.search(message)
        if match is not None and int(match.group(1)) in NO_SPACE_ERRNOS:
            return "disk_full"
    return None


class ErrorClass(enum.Enum):
    ALREADY_APPLIED = "already_applied"
    FATAL = "fatal"
    TRANSIENT = "transient"
    UNKNOWN = "unknown"


def classify_ddl_error(code: int | None) -> ErrorClass:
    """What a DDL failing with MySQL error ``code`` means."""
    if code in ALREADY_APPLIED_DDL_ERRORS:
        return ErrorClass.ALREADY_APPLIED
    if code in NEVER_RETRY_DDL_ERRORS:
        return ErrorClass.FATAL
    if code in TRANSIENT_ERRORS:
        return ErrorClass.TRANSIENT
    return ErrorClass.UNKNOWN

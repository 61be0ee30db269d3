"""Executing one DDL event downstream with the daemon's rules, inside a caller's transaction.

Shared by the streaming daemon's DDL windows and the Spark catch-up's DDL epochs, so both run a
DDL the same way: :func:`sqlgen.plan_ddl` decides whether and how (skipped TiDB-only types, ``USE``
except for schema-level DDL, TiDB-only clauses removed); error codes that mean "already there"
(a replayed ``CREATE TABLE``, a duplicate column after a crash between the DDL and its checkpoint)
are ignored; transient errors propagate unchanged so the caller's retry loop replays the unit;
anything else is a :class:`DDLFailed`, which no retry can fix.

The caller records the DDL (``CheckpointStore.record_ddl``) and moves its checkpoint in the same
transaction and commits: a DDL is not transactional itself, so the record is what recognises it
when the stream replays it.
"""

from __future__ import annotations

from collections.abc import Callable

import pymysql

from applier.codec.events import DDLEvent
from applier.downstream.errors import error_code, is_transient
from sqlgen import MARIADB, MYSQL, DDLPlan, Dialect, ErrorClass, classify_ddl_error, plan_ddl


class DDLFailed(RuntimeError):
    """A DDL failed with an error that retrying cannot fix; the message names the DDL and the code."""


def detect_dialect(conn: pymysql.connections.Connection) -> Dialect:
    """MariaDB or MySQL rules, from the server's version string."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        (version,) = cur.fetchone()
    return MARIADB if "mariadb" in str(version).lower() else MYSQL


def execute_ddl(
    cur: pymysql.cursors.Cursor,
    ddl: DDLEvent,
    dialect: Dialect,
    *,
    on_already_applied: Callable[[int | None], None] = lambda code: None,
) -> DDLPlan:
    """Run ``ddl``'s statements on ``cur``; returns the plan (``plan.execute`` False: skipped).

    Raises the driver's error for transient failures (the caller retries the whole unit after a
    reconnect) and :class:`DDLFailed` for permanent ones. ``on_already_applied`` is told the error
    code of each statement whose failure means the change is already there.
    """
    plan = plan_ddl(ddl.query, ddl.ddl_type, ddl.schema, dialect)
    for sql in plan.statements():
        try:
            cur.execute(sql)
        except pymysql.MySQLError as exc:
            code = error_code(exc)
            if classify_ddl_error(code) is ErrorClass.ALREADY_APPLIED:
                on_already_applied(code)
                continue
            if is_transient(exc):
                raise
            raise DDLFailed(
                f"DDL at ts {ddl.commit_ts} on {ddl.schema}.{ddl.table} failed with MySQL "
                f"error {code}: {exc.args[-1]}; query: {ddl.query[:300]}"
            ) from None
    return plan

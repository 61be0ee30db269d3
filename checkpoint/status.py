"""A changefeed's progress as ``applier status`` shows it, read from the checkpoint tables.

It reads what the daemon and the catch-up committed, not a running daemon's memory, so it answers
while no applier runs, and without locks, so while one runs the parts may be from adjacent commits.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime
from typing import Any, Final

import pymysql

from applier.codec.events import tso_physical_ms
from checkpoint.schema import applied_ts_query, quote_ident, validate_schema_name


def lag_seconds(ts: int, now: float) -> float | None:
    """Seconds between a TSO's physical time and ``now`` (epoch seconds); None for ts 0 (nothing yet).

    Uses this host's clock against PD's, so clock skew shows up as lag (or negative lag).
    """
    if ts <= 0:
        return None
    return round(now - tso_physical_ms(ts) / 1000.0, 3)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"


def _journaled(cur: Any, q: str, table: str, changefeed: str) -> list[dict[str, Any]]:
    """The DDLs of a journal table (``ddl_journal``, ``ddl_online``), oldest first, each with when
    it started and how long ago by the server's clock."""
    cur.execute(
        "SELECT `commit_ts`, `schema_name`, `table_name`, `ddl_type`, `query`, `started_at`, "
        "TIMESTAMPDIFF(MICROSECOND, `started_at`, UTC_TIMESTAMP(6)) "
        f"FROM {q}.`{table}` WHERE `changefeed` = %s ORDER BY `commit_ts`",
        (changefeed,),
    )
    return [
        {**_ddl(r), "started_at": _iso(r[5]), "elapsed_seconds": round(int(r[6]) / 1e6, 1)}
        for r in cur.fetchall()
    ]


def _ddl(row: tuple) -> dict[str, Any]:
    """The event of a DDL row: commit ts, schema, table, DDL type and query, its first columns."""
    return {
        "commit_ts": int(row[0]),
        "schema": row[1],
        "table": row[2],
        "ddl_type": int(row[3]),
        "query": row[4],
    }


_MISSING_CODES: Final = (1049, 1146)  # unknown database, table doesn't exist


def status_report(
    conn: pymysql.connections.Connection,
    schema: str,
    changefeed: str,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """A JSON-ready summary of a changefeed's progress, for ``applier status``.

    ``found`` is False when the schema, its tables or the changefeed do not exist yet. Lags are
    seconds between the TSO's physical time and ``now`` (default: this host's clock). Reads
    without locks, so while an applier runs the parts may be from adjacent commits.
    """
    validate_schema_name(schema)
    now = time.time() if now is None else now
    q = quote_ident(schema)
    report: dict[str, Any] = {
        "schema": schema,
        "changefeed": changefeed,
        "found": False,
        "topic": None,
        "owner": None,
        "resolved_ts": 0,
        "lag_seconds": None,
        "updated_at": None,
        "tables": [],
        "partitions": [],
        "applied_ddls": 0,
        "last_ddl": None,
        "ddl_in_progress": None,
        "ddls_online": [],
    }
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT `topic`, `resolved_ts`, `owner`, `updated_at` FROM {q}.`changefeed` "
                "WHERE `changefeed` = %s",
                (changefeed,),
            )
            row = cur.fetchone()
            if row is None:
                return report
            cur.execute(applied_ts_query(q), (changefeed,))
            resolved = max(int(row[1]), int(cur.fetchone()[0]))  # row mode: every partition's
            report.update(
                found=True,
                topic=row[0],
                owner=row[2],
                resolved_ts=resolved,
                lag_seconds=lag_seconds(resolved, now),
                updated_at=_iso(row[3]),
            )
            cur.execute(
                "SELECT `schema_name`, `table_name`, `checkpoint_ts`, `updated_at` "
                f"FROM {q}.`table_checkpoint` WHERE `changefeed` = %s ORDER BY `schema_name`, `table_name`",
                (changefeed,),
            )
            for s, t, ts, updated in cur.fetchall():
                effective = max(resolved, int(ts))
                report["tables"].append(
                    {
                        "schema": s,
                        "table": t,
                        "checkpoint_ts": int(ts),
                        "effective_ts": effective,
                        "lag_seconds": lag_seconds(effective, now),
                        "updated_at": _iso(updated),
                    }
                )
            cur.execute(
                f"SELECT `topic`, `partition_id`, `next_offset`, `resolved_ts`, `updated_at` "
                f"FROM {q}.`partition_offset` WHERE `changefeed` = %s ORDER BY `topic`, `partition_id`",
                (changefeed,),
            )
            for topic, partition, offset, p_resolved, updated in cur.fetchall():
                report["partitions"].append(
                    {
                        "topic": topic,
                        "partition": int(partition),
                        "next_offset": int(offset),
                        "resolved_ts": int(p_resolved),
                        "lag_seconds": lag_seconds(int(p_resolved), now),
                        "current_topic": topic == row[0],
                        "updated_at": _iso(updated),
                    }
                )
            cur.execute(
                f"SELECT COUNT(*) FROM {q}.`applied_ddl` WHERE `changefeed` = %s",
                (changefeed,),
            )
            report["applied_ddls"] = int(cur.fetchone()[0])
            cur.execute(
                f"SELECT `commit_ts`, `schema_name`, `table_name`, `ddl_type`, `query`, `applied_at` "
                f"FROM {q}.`applied_ddl` WHERE `changefeed` = %s "
                "ORDER BY `commit_ts` DESC, `applied_at` DESC LIMIT 1",
                (changefeed,),
            )
            last = cur.fetchone()
            if last is not None:
                report["last_ddl"] = {**_ddl(last), "applied_at": _iso(last[5])}
            # The journal row lives from just before a DDL runs until it is recorded: a DDL
            # running now, or one a crash interrupted (the next start settles it). The server's
            # clock times it, as it wrote started_at.
            pending = _journaled(cur, q, "ddl_journal", changefeed)
            report["ddl_in_progress"] = pending[0] if pending else None
            # DDLs recorded as applied that still run beside the stream (oldest first): index
            # builds, and with ddl_blocking = "tables" the DDLs whose tables' rows wait for them.
            report["ddls_online"] = _journaled(cur, q, "ddl_online", changefeed)
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] in _MISSING_CODES:
            return report
        raise
    finally:
        # End the read-only transaction (it holds metadata locks); the session may be dead.
        with contextlib.suppress(pymysql.err.Error):
            conn.rollback()
    return report

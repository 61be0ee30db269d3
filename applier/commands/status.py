"""``applier status``: a changefeed's progress as the database records it, for people and scripts.

It reads the checkpoint tables (``checkpoint.status.status_report``), not the daemon's memory, so it
gives the same answer whether the daemon runs, is stopped, or crashed: the checkpoint is what a
restart would resume from. Whether an instance is active right now is read from the single-active
lock (``IS_USED_LOCK``), which the active instance holds for as long as it runs.

Every TSO is shown with its physical wall time (``ts >> 18`` milliseconds, UTC) and the lag is
this host's clock minus that time, as in the ``applier_lag_seconds`` metric. Output never contains
a password: the downstream is shown in its redacted form.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from applier.codec.events import tso_physical_ms
from applier.downstream.lock import lock_name
from applier.downstream.session import close_quietly, connect, privileges_needed
from applier.errors import ApplierError
from applier.kafka.topics import TopicSet
from applier.ops.redact import redact_text
from applier.settings.downstream import downstream_config
from checkpoint.schema import quote_ident
from checkpoint.status import status_report

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_ERROR = 2


def tso_wall_time(ts: int) -> str | None:
    """ISO-8601 UTC time of a TSO's physical part, millisecond precision; None for 0."""
    if ts <= 0:
        return None
    dt = datetime.fromtimestamp(tso_physical_ms(ts) / 1000.0, tz=UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def collect(cfg: Any, *, now: float | None = None) -> dict[str, Any]:
    """The status document of ``cfg.group_id`` (raises an ``ApplierError`` saying what is wrong:
    the settings, the connection, a privilege)."""
    ds = downstream_config(cfg)
    now = time.time() if now is None else now
    conn = connect(ds, autocommit=True)
    try:
        with privileges_needed(
            conn,
            privileges="SELECT",
            on=f"{quote_ident(cfg.checkpoint_schema)}.*",
            purpose=f"to read the checkpoint schema {cfg.checkpoint_schema!r}",
        ):
            report = status_report(conn, cfg.checkpoint_schema, cfg.group_id, now=now)
        with conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s)", (lock_name(cfg.checkpoint_schema, cfg.group_id),))
            (holder,) = cur.fetchone()
    finally:
        close_quietly(conn)
    report["downstream"] = ds.redacted()
    report["active_instance"] = None if holder is None else {"connection_id": int(holder)}
    report["running"] = holder is not None
    report["resolved_time"] = tso_wall_time(report["resolved_ts"])
    if report["topic"]:  # several topics: the checkpoint's topic describes the set
        with contextlib.suppress(ValueError):
            topics = TopicSet.parse(report["topic"])
            for item in report["partitions"]:
                item["current_topic"] = topics.matches(item["topic"])
    for item in report["tables"]:
        item["checkpoint_time"] = tso_wall_time(item["effective_ts"])
    for item in report["partitions"]:
        item["resolved_time"] = tso_wall_time(item["resolved_ts"])
    for ddl in (report.get("last_ddl"), report.get("ddl_in_progress"), *report.get("ddls_online", ())):
        if ddl:
            ddl["commit_time"] = tso_wall_time(ddl["commit_ts"])
    return report


def _lag(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def render_text(report: dict[str, Any], out: TextIO) -> None:
    """A compact, aligned, human-readable form of :func:`collect`'s document."""
    w = out.write
    w(f"changefeed {report['changefeed']} (checkpoint schema {report['schema']}, {report['downstream']})\n")
    if not report["found"]:
        w("no checkpoint: this changefeed has not applied anything yet (or the names are wrong)\n")
        return
    holder = report["active_instance"]
    w(f"topic:           {report['topic']}\n")
    w(
        "active instance: "
        + (f"yes (database connection {holder['connection_id']})" if holder else "none (stopped)")
        + "\n"
    )
    w(
        f"resolved ts:     {report['resolved_ts']}  {report['resolved_time'] or '-'}  "
        f"lag {_lag(report['lag_seconds'])}\n"
    )
    w(f"updated at:      {report['updated_at'] or '-'}\n")
    tables = report["tables"]
    w(f"\ntables ({len(tables)}):\n")
    if tables:
        names = [f"{t['schema']}.{t['table']}" for t in tables]
        width = max(len("table"), *(len(n) for n in names))
        w(f"  {'table':<{width}}  {'checkpoint ts':>20}  {'wall time (UTC)':<24}  lag\n")
        for name, t in zip(names, tables, strict=True):
            w(
                f"  {name:<{width}}  {t['effective_ts']:>20}  {t['checkpoint_time'] or '-':<24}  "
                f"{_lag(t['lag_seconds'])}\n"
            )
    parts = report["partitions"]
    w(f"\npartitions ({len(parts)}):\n")
    if parts:
        w(f"  {'partition':>9}  {'next offset':>12}  {'resolved ts':>20}  {'wall time (UTC)':<24}  lag\n")
        for p in parts:
            mark = "" if p["current_topic"] else f"  (old topic {p['topic']})"
            w(
                f"  {p['partition']:>9}  {p['next_offset']:>12}  {p['resolved_ts']:>20}  "
                f"{p['resolved_time'] or '-':<24}  {_lag(p['lag_seconds'])}{mark}\n"
            )
    w(f"\nDDLs recorded:   {report['applied_ddls']} (older than the newest 100 are pruned)\n")
    last = report.get("last_ddl")
    if last:
        w(f"last DDL:        {last['commit_ts']} {last['commit_time']} {_ddl_line(last)}\n")
    pending = report.get("ddl_in_progress")
    if pending:
        w(
            f"DDL in progress: {pending['commit_ts']} {_ddl_line(pending)}; started {pending['started_at']}, "
            f"{pending['elapsed_seconds']:.1f}s ago"
            + ("" if report["running"] else " (no instance runs: the next start settles it)")
            + "\n"
        )
    for online in report.get("ddls_online") or ():
        w(
            f"DDL building beside the stream: {online['commit_ts']} {_ddl_line(online)}; started "
            f"{online['started_at']}, {online['elapsed_seconds']:.1f}s ago"
            + ("" if report["running"] else " (no instance runs: the next start runs it again)")
            + "\n"
        )


def _ddl_line(ddl: dict[str, Any]) -> str:
    query = " ".join(str(ddl["query"]).split())
    if len(query) > 120:
        query = query[:117] + "..."
    return f"{ddl['schema']}.{ddl['table']}: {query}"


def run_status(cfg: Any, *, as_json: bool = False, out: TextIO | None = None) -> int:
    """``applier status``: print the report; exit 1 when the changefeed has no checkpoint, 2 on errors."""
    out = out or sys.stdout
    try:
        report = collect(cfg)
    except (ApplierError, ValueError) as exc:
        print(f"applier status: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    if as_json:
        out.write(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    else:
        render_text(report, out)
    return EXIT_OK if report["found"] else EXIT_NOT_FOUND

"""Run the real daemon (``python -m applier run``) against the test broker and MariaDB.

Tests drive the daemon as a separate process, exactly as systemd would, so that SIGKILL,
SIGTERM and standby take-over are exercised for real.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

from applier.simulator import Simulation, compare_downstream

_log_dir: Path | None = None


def keep_logs_in(path: Path) -> None:
    """Where the daemons and catch-ups started without a log path of their own write their output
    (the session's pytest temporary directory, which pytest prunes; else the system's)."""
    global _log_dir
    _log_dir = path


def new_log(prefix: str) -> str:
    """A new empty log file (see :func:`keep_logs_in`)."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log", dir=_log_dir)
    os.close(fd)
    return path


@dataclass(frozen=True)
class DatabaseUser:
    """A database account a test made for itself (tests/integration/conftest.py, ``own_user``)."""

    name: str
    password: str


@dataclass
class Changefeed:
    """One test changefeed: its topic, group id, checkpoint schema and downstream URL."""

    bootstrap: str
    topic: str
    downstream: str
    mariadb_params: dict
    group_id: str = field(default_factory=lambda: f"cf_{uuid.uuid4().hex[:10]}")
    checkpoint_schema: str = field(default_factory=lambda: f"ckpt_{uuid.uuid4().hex[:10]}")
    extra_args: list[str] = field(default_factory=list)
    schemas: list[str] = field(default_factory=list)  # upstream schemas to drop at the end
    module: str = "applier"  # what ``python -m`` runs: a test may wrap the CLI (versioned_upstream)

    def new_schema(self, prefix: str = "up") -> str:
        """A fresh upstream schema name, dropped with the changefeed's other schemas."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.schemas.append(name)
        return name

    def args(self, *more: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            self.module,
            "run",
            "--kafka-bootstrap",
            self.bootstrap,
            "--topic",
            self.topic,
            "--group-id",
            self.group_id,
            "--downstream",
            self.downstream,
            "--checkpoint-schema",
            self.checkpoint_schema,
            "--standby-poll-seconds",
            "1",
            # Early writes (applier.apply.early) for pieces of one row or more: the test streams
            # are far too small to reach the default's 500 rows. They only happen while a daemon
            # follows a stream produced as it runs, not in a backlog (a test's own flag wins).
            "--early-rows",
            "1",
            *self.extra_args,
            *more,
        ]

    def start(
        self, *more: str, log_path: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start the daemon in the background, its output going to a log file (never a pipe that
        could fill up and block it); ``proc.log_path`` says where. ``env`` is added to the
        test's environment."""
        env = {**os.environ, **(env or {})}
        env.pop("APPLIER_CONFIG", None)
        if log_path is None:
            log_path = new_log("applier-")
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(self.args(*more), stdout=out, stderr=subprocess.STDOUT, env=env)
        proc.log_path = log_path  # type: ignore[attr-defined]
        return proc

    def run_to_end(self, *more: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run with --exit-when-caught-up; return the finished process (output decoded)."""
        proc = subprocess.run(
            self.args("--exit-when-caught-up", *more),
            capture_output=True,
            timeout=timeout,
            env=dict(os.environ),
        )
        return subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    def connect(self) -> pymysql.connections.Connection:
        return pymysql.connect(**self.mariadb_params, charset="utf8mb4", autocommit=True)

    def checkpoint(self) -> tuple[int, dict[int, int]]:
        """(global resolved ts applied, partition -> next offset) as stored."""
        rows = self.checkpoint_rows("SELECT resolved_ts FROM {schema}.changefeed WHERE changefeed=%s")
        offsets = self.checkpoint_rows(
            "SELECT partition_id, next_offset FROM {schema}.partition_offset WHERE changefeed=%s"
        )
        return (int(rows[0][0]) if rows else 0), {int(p): int(o) for p, o in offsets}

    def checkpoint_rows(self, sql: str) -> list[tuple]:
        """Rows of a query on this changefeed's checkpoint tables: ``{schema}`` is the checkpoint
        schema, the one ``%s`` the changefeed's group id."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql.format(schema=f"`{self.checkpoint_schema}`"), (self.group_id,))
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    def snapshot_ts(self, resolved: int) -> int:
        """The upstream ts the downstream stands at when the stored resolved ts is ``resolved``.

        A DDL step leaves the resolved ts at ``D - 1`` once the DDL at ``D`` has run (a DDL is its
        own upstream transaction), so the downstream then equals the snapshot at ``D``.
        """
        return resolved + 1 if self.applied_ddls(commit_ts=resolved + 1) else resolved

    def applied_ddls(self, commit_ts: int | None = None) -> int:
        """How many DDLs the changefeed has recorded as applied (only those at ``commit_ts`` if given).

        Raises pymysql's ProgrammingError while the daemon has not created its checkpoint tables."""
        sql = f"SELECT COUNT(*) FROM `{self.checkpoint_schema}`.applied_ddl WHERE changefeed=%s"
        args: list[object] = [self.group_id]
        if commit_ts is not None:
            sql += " AND commit_ts=%s"
            args.append(commit_ts)
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def compare(self, sim: Simulation, ts: int) -> list[str]:
        """Differences between the downstream and the upstream at ``ts``. Rows of keyless tables
        are compared when the stream lets a consumer rebuild them exactly (``sim.exact_keyless``):
        without rid a replayed keyless row cannot be told from a second identical one
        (docs/open-protocol.md §5.6)."""
        conn = self.connect()
        try:
            return compare_downstream(conn, sim, ts, keyless_rows=sim.exact_keyless)
        finally:
            conn.close()

    def kill_repeatedly(
        self, sim: Simulation, *, kills: int, rng: random.Random, log_dir: Path, first_window_s: float
    ) -> list[int]:
        """Start the daemon ``kills`` times, each time SIGKILLing it at a random moment once it has
        applied a window (or after ``first_window_s``): after each kill the downstream must be
        exactly the upstream at the checkpoint's ts (``assert_snapshot``). Returns the checkpoints
        the kills left."""
        points = []
        for i in range(kills):
            proc = self.start(log_path=str(log_dir / f"daemon{i}.log"))
            with contextlib.suppress(AssertionError):  # nothing left to apply: kill it anyway
                wait_for_output(proc, "window applied", first_window_s)
            time.sleep(rng.uniform(0.0, 0.6))
            stop(proc, signal.SIGKILL)
            resolved, _ = self.checkpoint()
            if resolved:
                self.assert_snapshot(sim, resolved, "after a kill")
                points.append(resolved)
        return points

    def assert_snapshot(self, sim: Simulation, resolved: int, when: str) -> None:
        """The downstream is exactly the upstream at the checkpoint's ts ``resolved``, or one DDL
        ahead of it: a DDL commits on its own, before the checkpoint that records it, so a stop in
        between leaves it one DDL ahead (no row lies between them, or the checkpoint would have
        moved up to that DDL first)."""
        ts = self.snapshot_ts(resolved)
        diffs = self.compare(sim, ts)
        if diffs:
            ahead = min((ev.commit_ts for ev in sim.ddl_events if ev.commit_ts > ts), default=None)
            diffs = diffs if ahead is None else self.compare(sim, ahead)
        assert diffs == [], f"{when} at ts {resolved}"

    def drop(self) -> None:
        """Drop the checkpoint schema and every upstream schema the test used."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for s in (self.checkpoint_schema, *self.schemas, *(f"{x}_upstream" for x in self.schemas)):
                    cur.execute("DROP DATABASE IF EXISTS `" + s.replace("`", "``") + "`")
        finally:
            conn.close()


def read_log(proc: subprocess.Popen) -> str:
    with open(proc.log_path, "rb") as fh:  # type: ignore[attr-defined]
        return fh.read().decode(errors="replace")


def wait_for_output(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    """Wait until the process's log contains ``needle`` (fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = read_log(proc)
        if needle in seen:
            return seen
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not seen within {timeout}s; output so far:\n{read_log(proc)}")


def kill_loop(
    feed: Changefeed, log_path: str, rng: random.Random, *, runs: int, delay: tuple[float, float]
) -> list[int]:
    """Start the daemon ``runs`` times (output to ``log_path``), each SIGKILLed ``delay`` seconds
    (uniform) after a point of its run; the stored resolved ts after each kill. The point is its
    "started" line on even runs (kills while it starts and reads its first windows), its first
    "window applied" line on odd ones (kills while it applies; or 30 s, when nothing is left).

    Timed from lines of the log, not from the process start: interpreter start-up varies with the
    machine's load, and the first windows need the whole backlog's head decoded across every
    partition (about a second, several on a loaded machine) before the barrier can release them;
    the odd runs make progress between the kills however loaded the machine is."""
    progress: list[int] = []
    for kills in range(runs):
        applied = _count_in(log_path, "window applied")
        proc = feed.start(log_path=log_path)
        started = time.monotonic()
        while read_log(proc).count("[info     ] started") <= kills and time.monotonic() - started < 30:
            time.sleep(0.02)
        while kills % 2 and read_log(proc).count("window applied") <= applied and proc.poll() is None:
            if time.monotonic() - started > 30:
                break  # nothing left to apply
            time.sleep(0.02)
        time.sleep(rng.uniform(*delay))
        if proc.poll() is not None:
            break  # finished early: cannot happen without --exit-when-caught-up, but stay safe
        stop(proc, signal.SIGKILL)
        progress.append(feed.checkpoint()[0])
    return progress


def _count_in(path: str, needle: str) -> int:
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as fh:
        return fh.read().decode(errors="replace").count(needle)
    return 0


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=30)

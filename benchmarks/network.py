"""The apply rate across a network: ``applier run`` through a delay line to the database.

What it does: for each ``--rtts`` round trip (milliseconds; 0, 2, 5 and 10 by default) and each
``--modes`` consistency (``transaction`` and ``row`` by default, docs/operations.md), a backlog of
``--events`` row events over ``--tables`` tables and ``--partitions`` partitions (the stream of
``apply.py``: transactions of 1-7 rows, 70% inserts, 20% updates, 10% deletes) is produced into a
fresh topic and applied by ``applier run --exit-when-caught-up`` whose downstream URL names a delay
line in front of the database: every chunk read from either side is forwarded half the round
trip later, without holding back the chunks behind it (a link's latency, not its bandwidth). The
changefeed is primed first: a daemon run (not timed) applies the stream's CREATE DDLs and its first
resolved ts, so the timed run starts from a checkpoint that has every partition's offset, as a
daemon that has been running does (in row mode, a partition read from its beginning makes the
partitions release together for ``row_settle_seconds``: 0 here, the topic never grows). Beside
it, the final rows inserted raw through the same delay line with multi-row INSERTs from one session
(``--raw-batch`` rows a statement, a commit every ``--raw-commit``; ``--raw-sessions`` deals them
out to more, each on a thread of its own): what one session, or several, can do across that link.
Prints, per round trip and mode, the daemon's rows/s and the raw rows/s, each beside its own
rate at the first round trip of the same run (row mode's also beside the transaction mode's at the
same round trip), and checks the daemon's tables against the stream (row count and checksum). The
daemon's rate is given twice: from its start to its last commit (what the backlog
took), and from its first window's commit to its last ("its windows": the apply once running,
without the start-up's round trips, which a daemon pays once and a short backlog feels most).
Prints figures, never asserts; exits 1 when the daemon failed or the data differ.

The delay line is Python threads on the same two cores as the daemon and the database: at 0 ms it
still costs a copy of every byte, which is why 0 ms goes through it too (the ratios compare like
with like).

Run from the repository root (``--private-db``: a ``mariadbd`` of its own, sized for the data):

    .venv/bin/python benchmarks/network.py --private-db
    .venv/bin/python benchmarks/network.py --private-db --events 100000 --rtts 0 10
    .venv/bin/python benchmarks/network.py --private-db --partitions 16 --rtts 0 10
    .venv/bin/python benchmarks/network.py --private-db --rtts 0 10 --modes transaction -- --apply-workers 4
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid

import pymysql
from _common import (
    PAD_BYTES,
    DelayLine,
    Generator,
    checksum_expected,
    daemon_command,
    daemon_result,
    database_line,
    private_db_arguments,
    produce,
    read_windows,
    run_daemon,
    settle_database,
    start_services,
)
from apply import raw_insert


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--downstream", default="mysql://root@127.0.0.1:3306/")
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--tables", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rtts", type=float, nargs="+", default=[0, 2, 5, 10], help="round trips, ms")
    ap.add_argument("--resolved-every", type=int, default=200)
    ap.add_argument("--raw-batch", type=int, default=1000)
    ap.add_argument("--raw-commit", type=int, default=10_000)
    ap.add_argument(
        "--raw-sessions", type=int, default=1, help="sessions the raw INSERTs are dealt out to (1)"
    )
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=("transaction", "row"),
        default=["transaction", "row"],
        help="consistency",
    )
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("daemon_args", nargs="*", help="extra `applier run` options (after --)")
    private_db_arguments(ap, buffer_pool="2G")
    args = ap.parse_args()
    ok = True
    with contextlib.ExitStack() as cleanup:
        params, broker = start_services(args, cleanup)
        admin = pymysql.connect(**params)
        cleanup.callback(admin.close)
        print(database_line(admin, args.downstream, args.private_db))
        print(f"{args.events:,} row events, {args.tables} tables, {args.partitions} partitions per run")
        base: dict[str, float] = {}
        for rtt in args.rtts:
            line = DelayLine((params["host"], params["port"]), rtt / 2000.0)
            cleanup.callback(line.close)
            far = f"mysql://{params['user']}@127.0.0.1:{line.port}/"
            rates: dict[str, float] = {}
            for mode in args.modes:
                tag = uuid.uuid4().hex[:8]
                schema, ckpt = f"net_{tag}", f"net_ckpt_{tag}"
                gen = Generator(schema, args.partitions, args.seed, args.resolved_every, tables=args.tables)
                gen.setup_resolved = True
                topic, group = f"net-{tag}", f"net_{tag}"
                # No joint release after the priming run's start: the topic's partitions never change.
                more = ("--http-listen", "off", "--consistency", mode, "--row-settle-seconds", "0")
                more = (*more, *args.daemon_args)
                cmd, env = daemon_command(broker.bootstrap, topic, group, far, ckpt, *more)

                def prime(cmd: list[str] = cmd, env: dict[str, str] = env) -> None:
                    primed = run_daemon(cmd, env)
                    if primed.returncode != 0:
                        raise SystemExit(f"the priming run failed: see {primed.log_path}")

                st = produce(broker.bootstrap, topic, gen, args.events, prime)
                settle_database(admin)
                run = run_daemon(cmd, env)
                seconds, got = daemon_result(admin, run, schema, ckpt, group, args.tables)
                rate = rates[mode] = st.events / seconds
                steady = _steady_rate(run.log_path)
                base.setdefault(mode, rate)
                base.setdefault(f"{mode} steady", steady)
                same = got == checksum_expected(*st.finals)
                ok = ok and same
                versus = (
                    f", {rate / rates['transaction']:.2f}x of transaction"
                    if mode != "transaction" and "transaction" in rates
                    else ""
                )
                print(
                    f"rtt {rtt:4g} ms, {mode:11}: daemon {rate:9,.0f} events/s "
                    f"({rate / base[mode]:.2f}x of {args.rtts[0]:g} ms{versus}), its windows "
                    f"{steady:9,.0f} events/s ({steady / base[f'{mode} steady']:.2f}x); "
                    + (
                        "data equal to the stream"
                        if same
                        else f"DATA DIFFERENT (daemon exit {run.returncode})"
                    )
                )
                for name in (schema, ckpt):
                    with admin.cursor() as cur:
                        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
            settle_database(admin)
            raw_schema = f"net_raw_{uuid.uuid4().hex[:8]}"
            raw_s = raw_insert(
                {**params, "host": "127.0.0.1", "port": line.port},
                raw_schema,
                st.finals,
                PAD_BYTES,
                args.raw_batch,
                args.raw_commit,
                args.raw_sessions,
            )
            raw_rate = st.final_rows / raw_s
            base.setdefault("raw", raw_rate)
            sessions = f"{args.raw_sessions} session{'s' if args.raw_sessions > 1 else ''}"
            print(
                f"rtt {rtt:4g} ms, raw INSERT ({sessions}) {raw_rate:9,.0f} rows/s "
                f"({raw_rate / base['raw']:.2f}x)"
            )
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{raw_schema}`")
            line.close()
    return 0 if ok else 1


def _steady_rate(log_path: str) -> float:
    """Row events a second from the first window's commit to the last's: the apply without the
    start-up (sessions, checkpoint schema, the stream's first DDLs), which a daemon pays once."""
    w = read_windows(log_path)
    if len(w.at) < 2 or w.at[-1] <= w.at[0]:
        return float("nan")
    return sum(w.rows[1:]) / (w.at[-1] - w.at[0])


if __name__ == "__main__":
    sys.exit(main())

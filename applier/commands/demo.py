"""``applier demo`` and ``applier simulate``: the whole path on an embedded default.

The demo starts the embedded broker, produces a simulated TiCDC stream (several partitions,
replays, duplicates, a DDL mid-stream, unique-key swaps, primary-key changes, a keyless table),
decodes it back and prints a summary, applies it to the database with the real daemon, and
finally checks that the downstream equals the simulator's upstream snapshot.

Every run starts fresh: it drops the schema it writes (``--schema``) and the demo changefeed's
checkpoint rows. So before it writes anything it says which database it writes to and where that
choice came from (``--downstream``, ``APPLIER_DOWNSTREAM`` or the default: a variable set for
another purpose must not go unnoticed), and it refuses a schema that holds anything the
simulator does not create (a table or view by another name, a routine, an event), or a system
or checkpoint schema: a typo in ``--schema`` must not drop someone's data.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from applier.ops.redact import redact_text, redact_url
from applier.settings.schema import ConfigError, resolve

DEFAULT_DOWNSTREAM = "mysql://root@127.0.0.1:3306/"
DEMO_GROUP = "applier-demo"
DEMO_TOPIC = "ticdc-demo"
DEMO_CHECKPOINT_SCHEMA = "ticdc_applier"


def _stream_config(args: argparse.Namespace):
    """The simulator settings of the command line; impossible combinations are configuration errors
    (for example ``--architecture new --row-ids on``: that producer never sends rid)."""
    from applier.simulator import StreamConfig

    cfg = StreamConfig(
        seed=args.seed,
        partitions=args.partitions,
        transactions=args.transactions,
        schema=args.schema,
        dispatcher=args.dispatcher,
        replays=not args.no_replays,
        architecture=args.architecture,
        row_ids={"auto": None, "on": True, "off": False}[args.row_ids],
        partitioned=args.partitioned,
        late_first_copies=args.late_first_copies,
        ddl_lag=args.ddl_lag,
        partition_growth=args.partition_growth,
        # Options of `simulate` only (the demo's applier reads every event whole).
        large_message=getattr(args, "large_message", None),
        claim_check_uri=getattr(args, "claim_check_uri", StreamConfig.claim_check_uri),
        wide_rows=getattr(args, "wide_rows", False),
        max_message_bytes=getattr(args, "max_message_bytes", StreamConfig.max_message_bytes),
    )
    try:
        cfg.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return cfg


def run_simulate_command(args: argparse.Namespace) -> int:
    """Produce a simulated stream into a topic: to test a deployment without TiDB and TiCDC."""
    from applier.kafka.embedded_broker import start_broker
    from applier.simulator import format_summary, produce_simulation, simulate, write_claim_check_objects

    cfg = _stream_config(args)
    bootstrap = args.kafka_bootstrap or os.environ.get("APPLIER_KAFKA_BOOTSTRAP")
    if not bootstrap and not args.embedded:
        print("applier: simulate needs --kafka-bootstrap (or --embedded)", file=sys.stderr)
        return 2
    try:
        sim = simulate(cfg)
    except ValueError as exc:  # an event over --max-message-bytes without --large-message
        raise ConfigError(str(exc)) from exc
    broker = None
    if args.embedded:
        broker = start_broker()
        bootstrap = broker.bootstrap
    if args.claim_check_dir:
        # Before the references are produced, as TiCDC stores an object before sending its reference.
        written = write_claim_check_objects(sim, args.claim_check_dir)
        print(f"wrote {written} claim-check objects to {args.claim_check_dir}")
    elif sim.claim_check_objects:
        print(f"{len(sim.claim_check_objects)} claim-check objects not written (no --claim-check-dir)")
    produce_simulation(bootstrap, args.topic, sim)
    print(format_summary(sim))
    print(f"produced to topic {args.topic!r} at {bootstrap}")
    if broker is not None:
        print("embedded broker running; Ctrl-C stops it")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            broker.stop()
    return 0


def _check_downstream(url: str) -> str | None:
    """None when the database answers, else the message to print."""
    from applier.downstream.errors import DownstreamConnectError
    from applier.downstream.session import close_quietly, connect
    from applier.downstream.url import DownstreamConfig

    try:
        close_quietly(connect(DownstreamConfig.from_url(url)))
    except DownstreamConnectError as exc:  # its message names the URL (redacted) and the settings
        return str(exc)
    except Exception as exc:  # anything else is reported the same way, without a traceback
        return (
            f"cannot use the downstream database at {redact_url(url)}: {redact_text(str(exc))}; "
            "point the demo elsewhere with --downstream URL or APPLIER_DOWNSTREAM=mysql://USER[:PASSWORD]@HOST:PORT/"
        )
    return None


SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


def _downstream_choice(args: argparse.Namespace, environ=os.environ) -> tuple[str, str]:
    """The demo's database URL and where it came from (shown before anything is written)."""
    if args.downstream:
        return args.downstream, "--downstream"
    if environ.get("APPLIER_DOWNSTREAM"):
        return environ["APPLIER_DOWNSTREAM"], "APPLIER_DOWNSTREAM"
    return DEFAULT_DOWNSTREAM, "the default"


def foreign_objects(conn, schema: str) -> list[str]:
    """What ``schema`` holds that the simulator never creates: tables and views by other names,
    routines, events (the demo drops the schema whole). Empty when the schema does not exist."""
    from applier.simulator.tables import simulated_table_names

    ours = simulated_table_names()
    found: list[str] = []
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
            "ORDER BY TABLE_NAME",
            (schema,),
        )
        for name, kind in cur.fetchall():
            if name not in ours or kind != "BASE TABLE":
                found.append(f"{'view' if kind == 'VIEW' else 'table'} {name}")
        cur.execute(
            "SELECT ROUTINE_TYPE, ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s",
            (schema,),
        )
        found += [f"{kind.lower()} {name}" for kind, name in cur.fetchall()]
        cur.execute("SELECT EVENT_NAME FROM information_schema.EVENTS WHERE EVENT_SCHEMA = %s", (schema,))
        found += [f"event {name}" for (name,) in cur.fetchall()]
    return found


def _check_demo_schema(url: str, schema: str) -> None:
    """Refuse (a configuration error, exit 2) a schema the demo must not drop."""
    from applier.downstream.session import close_quietly, connect
    from applier.downstream.url import DownstreamConfig

    if schema.lower() in SYSTEM_SCHEMAS or schema == DEMO_CHECKPOINT_SCHEMA:
        raise ConfigError(
            f"applier demo drops --schema {schema!r} at every run: refused, a system or checkpoint schema"
        )
    conn = connect(DownstreamConfig.from_url(url))
    try:
        found = foreign_objects(conn, schema)
    finally:
        close_quietly(conn)
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise ConfigError(
            f"applier demo drops --schema {schema!r} at every run, and {redact_url(url)} has it holding "
            f"what the demo did not create ({shown}): refused; give another --schema"
        )


def _reset_demo_state(url: str, schema: str) -> None:
    """Drop the demo's upstream schema and checkpoint rows so every demo run starts fresh."""
    from applier.downstream.session import close_quietly, connect
    from applier.downstream.url import DownstreamConfig
    from checkpoint import CheckpointStore
    from sqlgen import quote_ident

    conn = connect(DownstreamConfig.from_url(url), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {quote_ident(schema)}")
        store = CheckpointStore(DEMO_CHECKPOINT_SCHEMA, DEMO_GROUP)
        store.ensure_schema(conn)
        store.reset(conn)
    finally:
        close_quietly(conn)


def run_demo(args: argparse.Namespace) -> int:
    from applier.codec.decoder import DecoderOptions
    from applier.commands.decode import summarise
    from applier.kafka.embedded_broker import start_broker
    from applier.kafka.reader import PartitionReader, read_all
    from applier.simulator import format_summary, produce_simulation, simulate

    stream_cfg = _stream_config(args)
    url, source = _downstream_choice(args)
    if not args.decode_only:
        print(
            f"downstream: {redact_url(url)} (from {source}); schema {args.schema!r} is dropped and "
            f"written again there, with changefeed {DEMO_GROUP!r}'s checkpoint in {DEMO_CHECKPOINT_SCHEMA!r}",
            flush=True,
        )
        problem = _check_downstream(url)
        if problem:
            print(f"applier demo: {problem}", file=sys.stderr)
            return 1
        _check_demo_schema(url, args.schema)

    print("== 1. embedded Kafka-protocol broker (tansu)")
    broker = start_broker()
    try:
        print(f"listening on {broker.bootstrap}")
        print("\n== 2. simulated TiCDC Open Protocol stream")
        sim = simulate(stream_cfg)
        produce_simulation(broker.bootstrap, DEMO_TOPIC, sim)
        print(format_summary(sim))

        print("\n== 3. decoded back from the broker")
        reader = PartitionReader(broker.bootstrap, DEMO_TOPIC, "applier-demo-decode")
        try:
            parts = reader.discover_partitions()
            records = read_all(reader, dict.fromkeys(parts, "earliest"))
        finally:
            reader.close()
        print(summarise(records, DEMO_TOPIC, DecoderOptions()).render())
        if args.decode_only:
            return 0

        print(f"\n== 4. applier run -> {redact_url(url)}")
        _reset_demo_state(url, args.schema)
        from applier.daemon.loop import Daemon
        from applier.ops.logs import configure

        configure("console", "warning")
        cfg = resolve(
            "run",
            {
                "kafka_bootstrap": broker.bootstrap,
                "topic": DEMO_TOPIC,
                "group_id": DEMO_GROUP,
                "downstream": url,
                "exit_when_caught_up": True,
            },
            environ={},
        )
        started = time.monotonic()
        daemon = Daemon(cfg)
        code = daemon.run()
        seconds = time.monotonic() - started
        if code != 0:
            print(f"the applier stopped with exit code {code}", file=sys.stderr)
            return code
        stats = daemon.applier.stats if daemon.applier else None
        if stats:
            rows = sum(stats.rows_by_table_op.values())
            print(
                f"applied {stats.windows} windows in {stats.transactions} transactions "
                f"({rows} row operations after collapsing, {stats.ddls} DDLs) in {seconds:.1f}s"
            )

        print("\n== 5. check: downstream == upstream snapshot at the final resolved ts")
        return _verify(url, sim)
    finally:
        broker.stop()


def _verify(url: str, sim) -> int:
    from applier.downstream.session import close_quietly, connect
    from applier.downstream.url import DownstreamConfig
    from applier.simulator import compare_downstream

    conn = connect(DownstreamConfig.from_url(url))
    try:
        # Without rid, re-sent keyless rows cannot be told from identical ones: only require them all.
        diffs = compare_downstream(conn, sim, sim.final_resolved_ts, keyless_rows=sim.exact_keyless)
    finally:
        close_quietly(conn)
    expected = sim.expected_snapshot(sim.final_resolved_ts)
    if diffs:
        print("MISMATCH:")
        for d in diffs:
            print("  " + d)
        return 1
    total = sum(len(rows) for rows in expected.values())
    print(f"OK: {len(expected)} tables, {total} rows equal to the upstream at ts {sim.final_resolved_ts}")
    return 0

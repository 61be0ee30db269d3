"""The ``applier`` command line: one subcommand per job, settings from one schema (applier.settings.schema).

Errors a user can fix (configuration, an unreachable database or broker, bad input) end in one
clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from applier import __version__
from applier.errors import EXIT_FATAL, ConfigurationError
from applier.settings.schema import add_arguments, resolve


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="applier",
        description="Apply a TiCDC Open Protocol change stream from Kafka to MySQL, MariaDB or TiDB.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="the streaming daemon: apply the topic to the downstream, continuously")
    add_arguments(run, "run")

    catchup = sub.add_parser(
        "catchup",
        help="apply a large backlog from --from-ts as a Spark job, then hand over to `run` (needs [spark])",
    )
    add_arguments(catchup, "catchup")

    decode = sub.add_parser(
        "decode", help="read a topic to its end and print a summary of the decoded events"
    )
    add_arguments(decode, "decode")

    simulate = sub.add_parser(
        "simulate", help="produce a TiCDC-like test stream into a topic (to test a deployment)"
    )
    simulate.add_argument("--kafka-bootstrap", help="Kafka bootstrap servers (omit with --embedded)")
    simulate.add_argument(
        "--embedded", action="store_true", help="start an embedded broker and keep it running"
    )
    simulate.add_argument("--topic", default="ticdc-sim", help="topic to produce into (created if missing)")
    _add_stream_options(simulate)
    simulate.add_argument(
        "--wide-rows",
        action="store_true",
        help="add a table of 300 KB to 2 MB values: events larger than --max-message-bytes",
    )
    simulate.add_argument(
        "--max-message-bytes",
        type=int,
        default=1 << 20,
        help="TiCDC max-message-bytes: larger row events are large messages (default 1048576)",
    )
    simulate.add_argument(
        "--large-message",
        choices=("claim-check", "handle-key-only"),
        default=None,
        help="TiCDC large-message-handle-option for them (default none: the stream fails as TiCDC does)",
    )
    simulate.add_argument(
        "--claim-check-uri",
        default="file:///var/lib/ticdc/claim-check",
        help="claim-check-storage-uri written in references (default file:///var/lib/ticdc/claim-check)",
    )
    simulate.add_argument(
        "--claim-check-dir", help="directory to write the claim-check objects to (created if missing)"
    )

    demo = sub.add_parser(
        "demo",
        help="embedded broker + simulated stream + applier, end to end, then a check; drops and "
        "rewrites --schema",
        description="Embedded broker, simulated stream, the real daemon, then a check that the "
        "downstream equals the simulated upstream. Every run DROPS the schema --schema (default "
        "applier_demo) and the checkpoint rows of changefeed applier-demo in ticdc_applier, and "
        "writes them again; it prints the database it uses before it writes, and refuses a schema "
        "holding anything the demo did not create.",
    )
    demo.add_argument(
        "--downstream",
        default=None,
        help="mysql:// URL [env APPLIER_DOWNSTREAM; default mysql://root@127.0.0.1:3306/]; "
        "printed, with where it came from, before anything is written",
    )
    demo.add_argument(
        "--decode-only", action="store_true", help="only decode the stream back and summarise it"
    )
    _add_stream_options(
        demo,
        schema_help="schema the demo writes to, DROPPED and written again at every run; refused when it "
        "holds a table the demo did not create (default applier_demo)",
    )

    config = sub.add_parser("config", help="configuration tools")
    csub = config.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True
    check = csub.add_parser(
        "check", help="validate and print the effective configuration of `run`, secrets masked"
    )
    add_arguments(check, "run")

    status = sub.add_parser(
        "status",
        help="print a changefeed's checkpoint (per-table ts, partition offsets, lag) from the database",
    )
    add_arguments(status, "status")
    status.add_argument("--json", action="store_true", help="print a JSON document (for scripts)")
    return parser


def _add_stream_options(
    p: argparse.ArgumentParser, schema_help: str = "upstream schema name (default applier_demo)"
) -> None:
    p.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    p.add_argument("--transactions", type=int, default=300, help="upstream transactions (default 300)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--schema", default="applier_demo", help=schema_help)
    p.add_argument("--dispatcher", choices=("index-value", "table"), default="index-value")
    p.add_argument("--no-replays", action="store_true", help="do not simulate TiCDC failover replays")
    p.add_argument(
        "--architecture",
        choices=("classic", "new"),
        default="classic",
        help="TiCDC producing the stream: classic (<= v8.5) or new (v9: no rid, DDLs wait only for "
        "the tables they block) (default classic)",
    )
    p.add_argument(
        "--row-ids",
        choices=("auto", "on", "off"),
        default="auto",
        help="send rid in row keys (default auto: as the architecture does)",
    )
    p.add_argument(
        "--partitioned",
        action="store_true",
        help="add a partitioned table whose physical partitions flush independently (ptn in keys)",
    )
    p.add_argument(
        "--late-first-copies",
        action="store_true",
        help="simulate failed produces: spans restart and first copies arrive after newer rows",
    )
    p.add_argument(
        "--ddl-lag",
        action="store_true",
        help="write the mid-stream ALTER TABLE late: newer rows of other tables arrive before it",
    )
    p.add_argument(
        "--partition-growth",
        action="store_true",
        help="use half the partitions at first, then all of them (keys re-hashed mid-stream)",
    )


def main(argv: Sequence[str] | None = None, **run_options: Any) -> int:
    """The command line; ``run_options`` go to ``run_daemon`` (tests: a ``Tuning``, observers)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args, run_options)
    except ConfigurationError as exc:
        from applier.commands.run import report_configuration_error

        return report_configuration_error(exc)
    except KeyboardInterrupt:
        return EXIT_FATAL


def _dispatch(args: argparse.Namespace, run_options: Mapping[str, Any]) -> int:
    """Call the subcommand's module (imported only when used: Spark and boto3 are heavy)."""
    flags = vars(args)
    command = args.command
    if command == "run":
        from applier.commands.run import run_daemon

        return run_daemon(resolve("run", flags), **run_options)
    if command == "catchup":
        from applier.commands.catchup import run_catchup_command

        return run_catchup_command(resolve("catchup", flags))
    if command == "decode":
        from applier.commands.decode import run_decode

        return run_decode(resolve("decode", flags))
    if command == "simulate":
        from applier.commands.demo import run_simulate_command

        return run_simulate_command(args)
    if command == "demo":
        from applier.commands.demo import run_demo

        return run_demo(args)
    if command == "config":
        from applier.commands.config import run_config_check

        return run_config_check(resolve("run", flags))
    if command == "status":
        from applier.commands.status import run_status

        return run_status(resolve("status", flags), as_json=args.json)
    raise AssertionError(command)  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The settings table: every setting described once, as data.

The argument parser, the environment lookup, the TOML reader and ``applier config check`` are all
generated from :data:`SETTINGS` (:mod:`applier.settings.schema`), and :class:`~applier.settings.config.Config`
has one typed attribute per row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from applier.downstream.url import SSL_MODES
from applier.errors import ConfigurationError
from applier.settings.parsers import (
    parse_bool,
    parse_early_rows,
    parse_filter,
    parse_kv_list,
    parse_listen,
    parse_positive_int,
    parse_readable_file,
    parse_routes,
    parse_seconds,
    parse_size,
    parse_topics,
    parse_tso,
    parse_until,
    parse_workers,
)


class ConfigError(ConfigurationError):
    """A setting is missing, unknown or has a bad value; the message names it."""


@dataclass(frozen=True)
class Setting:
    """One configuration key. ``name`` is the TOML key; the flag and variable derive from it."""

    name: str
    help: str
    default: Any = None
    parse: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    secret: bool = False
    required: bool | tuple[str, ...] = False
    """True, or the commands that require it (``from_ts``: required by catchup, optional for run)."""
    flag_kind: str = "value"  # value | bool | kv (repeatable key=value) | list (repeatable, ordered)
    commands: tuple[str, ...] = ("run",)
    metavar: str = ""
    """Shown for the value in ``--help`` (list flags)."""

    def required_by(self, command: str) -> bool:
        return self.required is True or (isinstance(self.required, tuple) and command in self.required)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "APPLIER_" + self.name.upper()

    def convert(self, raw: Any, source: str) -> Any:
        """Turn a raw value from ``source`` into the setting's type, or raise ConfigError."""
        try:
            if self.flag_kind == "kv":
                value = parse_kv_list(raw if not isinstance(raw, str) else raw.split(","))
            elif self.flag_kind == "list":
                value = self.parse(raw)
            elif self.flag_kind == "bool":
                value = raw if isinstance(raw, bool) else parse_bool(str(raw))
            elif isinstance(raw, str) or self.parse is str:
                value = self.parse(str(raw))
            else:
                value = self.parse(raw) if not isinstance(raw, int | float) else self.parse(str(raw))
        except (ValueError, TypeError, ConfigurationError) as exc:  # a parser's own error (route rules) too
            shown = "***" if self.secret else repr(raw)
            raise ConfigError(f"{self.name} ({source}): bad value {shown}: {exc}") from None
        if self.choices is not None and value not in self.choices:
            shown = "***" if self.secret else repr(value)
            raise ConfigError(f"{self.name} ({source}): {shown} is not one of {', '.join(self.choices)}")
        return value


_BOTH = ("run", "catchup", "status")

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "kafka_bootstrap",
        "Kafka bootstrap servers, HOST:PORT[,HOST:PORT]",
        required=True,
        commands=("run", "catchup", "decode"),
    ),
    Setting(
        "topic",
        "the TiCDC changefeed's Kafka topic; several topics of one changefeed (a topic dispatcher) as a "
        "list, repeatable or comma-separated, a /regex/ item matching whole topic names (topics created "
        'later join); read under one barrier (docs/operations.md, "Several topics")',
        parse=parse_topics,
        flag_kind="list",
        required=True,
        commands=("run", "catchup", "decode"),
        metavar="TOPIC",
    ),
    Setting(
        "group_id",
        "changefeed id: names the checkpoint rows and the Kafka consumer group",
        required=True,
        commands=_BOTH,
    ),
    Setting(
        "downstream",
        "mysql://USER[:PASSWORD]@HOST:PORT/ of the target database (password better in "
        "APPLIER_DOWNSTREAM_PASSWORD or downstream_password_file)",
        required=True,
        secret=True,
        commands=_BOTH,
    ),
    Setting("downstream_password_file", "file holding the downstream password (first line)", commands=_BOTH),
    Setting(
        "downstream_ssl_mode",
        "TLS to the database, as the MySQL client's --ssl-mode (default: the URL's ssl_mode, else "
        "verify_ca when a CA is given, else preferred)",
        choices=SSL_MODES,
        commands=_BOTH,
    ),
    Setting(
        "downstream_ssl_ca",
        "PEM file of the CA that signed the database's certificate",
        parse=parse_readable_file,
        commands=_BOTH,
    ),
    Setting(
        "downstream_ssl_cert",
        "PEM client certificate (for REQUIRE X509 users)",
        parse=parse_readable_file,
        commands=_BOTH,
    ),
    Setting(
        "downstream_ssl_key",
        "PEM private key of the client certificate",
        parse=parse_readable_file,
        commands=_BOTH,
    ),
    Setting(
        "downstream_ssl_verify_identity",
        "check that the database's certificate names the host connected to (ssl_mode verify_identity)",
        default=False,
        flag_kind="bool",
        commands=_BOTH,
    ),
    Setting(
        "checkpoint_schema", "database holding the checkpoint tables", default="ticdc_applier", commands=_BOTH
    ),
    Setting(
        "legacy_base64_strings",
        "producer is TiCDC < v4.0.5: CHAR/VARCHAR values are base64",
        default=False,
        flag_kind="bool",
        commands=("run", "catchup", "decode"),
    ),
    Setting(
        "compression",
        "value compression configured on the changefeed (large-message-handle-compression)",
        default="none",
        choices=("none", "snappy", "lz4"),
        commands=("run", "catchup", "decode"),
    ),
    Setting(
        "kafka_config",
        "librdkafka setting passed through (TLS, SASL), key=value, repeatable",
        default={},
        flag_kind="kv",
        secret=True,
        commands=("run", "catchup", "decode"),
    ),
    Setting(
        "claim_check_storage_uri",
        "where the changefeed's claim-check objects are, as this host sees them: file:///DIR or "
        "s3://BUCKET/PREFIX[?endpoint=...&region=...]; objects are read by the base name of the "
        "location in the stream, never by the location itself",
        secret=True,
        commands=("run", "catchup"),
    ),
    Setting(
        "upstream",
        "mysql://USER@HOST:PORT/ of the upstream TiDB, for handle-key-only (ohk) large messages: "
        "their rows are read as of their commit ts (password in APPLIER_UPSTREAM_PASSWORD or "
        "upstream_password_file)",
        secret=True,
        commands=("run", "catchup"),
    ),
    Setting(
        "upstream_password_file",
        "file holding the upstream password (first line)",
        commands=("run", "catchup"),
    ),
    Setting(
        "large_message_workers",
        "claim-check objects and upstream rows fetched at once",
        default=8,
        parse=parse_positive_int,
        commands=("run", "catchup"),
    ),
    Setting(
        "filter",
        "table-filter rule as in TiCDC's [filter] rules: db.tbl, wildcards * ? [a-z], !rule excludes, "
        "the last matching rule decides; repeatable (APPLIER_FILTER: comma- or newline-separated); "
        "default: every table",
        default=(),
        parse=parse_filter,
        flag_kind="list",
        commands=("run", "catchup"),
    ),
    Setting(
        "route",
        "route rule FROM=TO mapping upstream schema.table to downstream names, repeatable, first match "
        "wins: 'prod.*=replica.{table}', 'db.t=db2.t2', '*.*={schema}_bak.{table}' (docs/operations.md)",
        default=[],
        parse=parse_routes,
        flag_kind="list",
        metavar="FROM=TO",
        commands=("run", "catchup"),
    ),
    Setting(
        "start",
        "where a changefeed without a checkpoint starts reading",
        default="earliest",
        choices=("earliest", "latest"),
    ),
    Setting(
        "time_zone",
        "session time_zone: the TiCDC server's zone (TIMESTAMP values carry none)",
        default="+00:00",
        commands=("run", "catchup"),
    ),
    Setting(
        "max_txn_rows",
        "split a very large window over transactions of at most this many rows",
        default=200_000,
        parse=parse_positive_int,
        commands=("run", "catchup"),
    ),
    Setting(
        "apply_workers",
        "extra downstream sessions that write the keyed rows of a large window (5,000 rows or more) "
        "beside its own session, which writes the checkpoint once they committed; 0: every window "
        "is one transaction (docs/operations.md)",
        default=0,
        parse=parse_workers,
    ),
    Setting(
        "early_rows",
        "write rows that have arrived ahead of their resolved ts into the open transaction once at "
        "least this many are waiting, so that less is left to write when it arrives; committed only "
        "with their window, rolled back if it does not hold exactly them; 0: off; off with "
        "apply_workers (docs/operations.md)",
        default=500,
        parse=parse_early_rows,
    ),
    Setting(
        "consistency",
        "transaction: every window is every partition's rows up to the lowest partition's resolved "
        "ts, one transaction, so the downstream is a snapshot of the upstream at each checkpoint; "
        "row: each partition's rows up to its own resolved ts, on a session of its own, so the "
        "apply scales with the partitions and a quiet or slow partition holds back only itself; "
        "a row's versions stay in order, transactions across partitions are not atomic "
        '(docs/operations.md, "Choosing the consistency")',
        default="transaction",
        choices=("transaction", "row"),
    ),
    Setting(
        "row_settle_seconds",
        "row mode: after a partition starts to deliver, or a start that reads one from its beginning, "
        "the partitions release together until every partition was read to its end this long later "
        "and what was read is applied (TiCDC may still deliver rows hashed over the old partition "
        "count meanwhile); 0 for a topic whose partitions never change (docs/operations.md)",
        default=60.0,
        parse=parse_seconds,
    ),
    Setting(
        "ddl_blocking",
        "what a DDL other than an index one stops while it runs downstream: all, every table (the "
        "downstream stays a snapshot of the upstream at each checkpoint); tables, only the tables it "
        "changes, the others go on (docs/operations.md)",
        default="all",
        choices=("all", "tables"),
    ),
    Setting(
        "max_cached_bytes",
        "memory bound of the row cache (decoded rows, estimated); beyond it rows the barrier cannot "
        "release yet go to spill_dir and partitions ahead of the barrier are paused",
        default=512 << 20,
        parse=parse_size,
    ),
    Setting(
        "spill_dir",
        "directory for the rows of transactions larger than max_cached_bytes (a subdirectory per "
        "changefeed, emptied at start); default: $STATE_DIRECTORY/spill under systemd, else "
        "ticdc-applier-spill in the system temp directory",
    ),
    Setting(
        "standby_poll_seconds",
        "how often a standby instance tries to become active",
        default=2,
        parse=parse_positive_int,
    ),
    Setting(
        "exit_when_caught_up",
        "exit 0 once every partition is read to its end and all resolved "
        "data is applied (for one-shot runs, demos and tests)",
        default=False,
        flag_kind="bool",
    ),
    Setting(
        "http_listen",
        "HOST:PORT serving /metrics, /healthz and /readyz, or off",
        default="127.0.0.1:9400",
        parse=parse_listen,
    ),
    Setting(
        "stall_seconds",
        "not ready (and no systemd watchdog ping) when nothing was read or applied for this long "
        "while the topic is not read to its end",
        default=300,
        parse=parse_positive_int,
    ),
    Setting(
        "retry_report_seconds",
        "transient database errors (lock wait timeout, deadlock, lost connection, read-only, full) are "
        "replayed without end; after this long without a committed transaction /readyz fails and the "
        "log says so",
        default=60,
        parse=parse_positive_int,
    ),
    Setting(
        "log_format",
        "log output",
        default="console",
        choices=("console", "json"),
        commands=("run", "catchup", "status", "decode"),
    ),
    Setting(
        "log_level",
        "log level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        commands=("run", "catchup", "status", "decode"),
    ),
    # -- applier catchup (issue 5) --
    Setting(
        "from_ts",
        "TSO the downstream was restored at (BR/Dumpling backup): a TSO integer or an ISO-8601 time "
        "(UTC unless it names a zone); rows and DDLs committed at or before it are never applied. "
        "catchup: required. run: a changefeed without a checkpoint starts as if it had one at this "
        "ts (every partition read from its beginning); ignored once the checkpoint is at or above "
        "it, refused when the checkpoint is below it (docs/quickstart.md)",
        parse=parse_tso,
        required=("catchup",),
        commands=("run", "catchup"),
    ),
    Setting(
        "until",
        "end of the backlog: latest (what the topic holds when the job starts) or a TSO / ISO-8601 time",
        default=None,
        parse=parse_until,
        commands=("catchup",),
    ),
    Setting(
        "spark_master",
        "Spark master: local[*], local[N], spark://HOST:PORT, yarn, ...",
        default="local[*]",
        commands=("catchup",),
    ),
    Setting(
        "spark_conf",
        "Spark setting, key=value, repeatable",
        default={},
        flag_kind="kv",
        commands=("catchup",),
    ),
    Setting(
        "catchup_class_archive",
        "directory of the Spark driver JVM's class-data archive, which about halves the JVM's start "
        "(about 170 MB, written by the first catch-up), and of the Spark home links its Python "
        "workers import PySpark through (default: ~/.cache/ticdc-applier; off: neither)",
        default=None,
        commands=("catchup",),
    ),
    Setting(
        "catchup_parallelism",
        "writer tasks per epoch, each with its own database connection "
        "(default: Spark's default parallelism)",
        default=None,
        parse=parse_positive_int,
        commands=("catchup",),
    ),
    Setting(
        "catchup_split_records",
        "largest Kafka offset range read by one Spark task",
        default=250_000,
        parse=parse_positive_int,
        commands=("catchup",),
    ),
    Setting(
        "catchup_collapse_in_reader",
        "keep only the last op per handle key already in the reading tasks (less data to cache and "
        "shuffle; off: every op goes to the writers)",
        default=True,
        flag_kind="bool",
        commands=("catchup",),
    ),
    Setting(
        "catchup_retry_seconds",
        "how long a writer keeps retrying transient database errors before the job fails",
        default=600,
        parse=parse_positive_int,
        commands=("catchup",),
    ),
    Setting(
        "catchup_time_lookup_margin_seconds",
        "start partitions without a stored offset at the first record written this many seconds before "
        "--from-ts (broker record times, offsets_for_times); default: read them from the beginning",
        default=None,
        parse=parse_positive_int,
        commands=("catchup",),
    ),
)

SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


def settings_for(command: str) -> list[Setting]:
    return [s for s in SETTINGS if command in s.commands]

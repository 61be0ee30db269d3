"""One schema for every setting: command-line flags, ``APPLIER_*`` variables and the TOML file.

Each setting is described once (as data, in ``SETTINGS``); the argument parser, the environment
lookup, the TOML reader and ``applier config check`` are all generated from that table, so the
three sources can never drift apart. Precedence: flag > environment > file > default.
Unknown keys and bad values are rejected with a message naming the key and what is accepted.
"""

from __future__ import annotations

import argparse
import os
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from applier.codec.decoder import DecoderOptions
from applier.downstream.url import SSL_MODES
from applier.errors import ConfigurationError
from sqlgen.route import Router, parse_route_rule, rule_texts

if TYPE_CHECKING:
    from applier.kafka.topics import TopicSet
    from applier.stream.table_filter import TableFilter


class ConfigError(ConfigurationError):
    """A setting is missing, unknown or has a bad value; the message names it."""


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def _parse_size(text: str) -> int:
    """Bytes, with an optional K/M/G (binary) suffix: '512M' -> 536870912."""
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suffix):
            s, mult = s[:-1], m
            break
    try:
        value = int(s) * mult
    except ValueError:
        raise ValueError("expected a positive number of bytes, optionally with K, M or G (512M)") from None
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _parse_positive_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("expected a positive integer") from None
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _parse_workers(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("expected a whole number of sessions, 0 to 16") from None
    if not 0 <= value <= 16:
        raise ValueError("must be 0 to 16")
    return value


def _parse_early_rows(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("expected a whole number of rows (0: off)") from None
    if value < 0:
        raise ValueError("must be 0 (off) or a positive number of rows")
    return value


def _parse_kv_list(items: Iterable[str] | Mapping[str, Any]) -> dict[str, str]:
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out[key.strip()] = value
    return out


def _split_list(text: str) -> list[str]:
    """A list setting given as one string (``APPLIER_FILTER``): one item per line when it holds a
    newline (so an item may contain a comma), else separated by commas; blank items dropped."""
    parts = text.splitlines() if "\n" in text else text.split(",")
    return [p.strip() for p in parts if p.strip()]


def _parse_filter(raw: Any) -> tuple[str, ...]:
    """Table-filter rules, each checked (applier.stream.table_filter); the error names the rule."""
    from applier.stream.table_filter import TableFilter

    rules = _split_list(raw) if isinstance(raw, str) else list(raw)
    if not all(isinstance(r, str) for r in rules):
        raise ValueError("expected a list of rules (strings)")
    return TableFilter(rules).rules


def _parse_topics(raw: Any) -> str:
    """The topic set (applier.kafka.topics), kept as its normalised description: one topic stays
    its name, so ``cfg.topic`` reads as before where one topic is all there is."""
    from applier.kafka.topics import TopicSet

    if not isinstance(raw, str) and not all(isinstance(r, str) for r in raw):
        raise ValueError("expected a topic name or a list of them")
    described = TopicSet.parse(raw).describe()
    if len(described) > 255:  # it is stored with the checkpoint (checkpoint.schema: names of 255)
        raise ValueError("more than 255 characters of topics: name them with a /regex/ instead")
    return described


def _parse_listen(text: str) -> str:
    """``HOST:PORT`` (``[v6]:PORT``, ``:PORT`` for every address) or ``off``; returned normalised."""
    s = str(text).strip()
    if s.lower() in ("off", "none", "disabled", "false", "no"):
        return "off"
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError("expected HOST:PORT (port 0-65535) or off")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise ValueError("an IPv6 host must be in brackets: [::1]:9400")
    return f"{host}:{int(port)}"


def _parse_readable_file(text: str) -> str:
    """A path the process can read now: a typo in a certificate path should fail at start, by name."""
    path = str(text).strip()
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return path


def _parse_routes(raw: Any) -> list[str]:
    """Route rules (``sqlgen.route``), checked now and kept as ``FROM=TO`` strings in their order."""
    rules = rule_texts(raw)
    for text in rules:
        parse_route_rule(text)
    return rules


def _parse_tso(text: str) -> int:
    """A TSO integer or an ISO-8601 time, as a TSO (applier.catchup.tso: no pyspark import)."""
    from applier.catchup.tso import parse_ts

    return parse_ts(text)


def _parse_until(text: str) -> int | None:
    from applier.catchup.tso import parse_until

    return parse_until(text)


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
                value = _parse_kv_list(raw if not isinstance(raw, str) else raw.split(","))
            elif self.flag_kind == "list":
                value = self.parse(raw)
            elif self.flag_kind == "bool":
                value = raw if isinstance(raw, bool) else _parse_bool(str(raw))
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
        parse=_parse_topics,
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
        parse=_parse_readable_file,
        commands=_BOTH,
    ),
    Setting(
        "downstream_ssl_cert",
        "PEM client certificate (for REQUIRE X509 users)",
        parse=_parse_readable_file,
        commands=_BOTH,
    ),
    Setting(
        "downstream_ssl_key",
        "PEM private key of the client certificate",
        parse=_parse_readable_file,
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
        parse=_parse_positive_int,
        commands=("run", "catchup"),
    ),
    Setting(
        "filter",
        "table-filter rule as in TiCDC's [filter] rules: db.tbl, wildcards * ? [a-z], !rule excludes, "
        "the last matching rule decides; repeatable (APPLIER_FILTER: comma- or newline-separated); "
        "default: every table",
        default=(),
        parse=_parse_filter,
        flag_kind="list",
        commands=("run", "catchup"),
    ),
    Setting(
        "route",
        "route rule FROM=TO mapping upstream schema.table to downstream names, repeatable, first match "
        "wins: 'prod.*=replica.{table}', 'db.t=db2.t2', '*.*={schema}_bak.{table}' (docs/operations.md)",
        default=[],
        parse=_parse_routes,
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
        parse=_parse_positive_int,
        commands=("run", "catchup"),
    ),
    Setting(
        "apply_workers",
        "extra downstream sessions that write the keyed rows of a large window (5,000 rows or more) "
        "beside its own session, which writes the checkpoint once they committed; 0: every window "
        "is one transaction (docs/operations.md)",
        default=0,
        parse=_parse_workers,
    ),
    Setting(
        "early_rows",
        "write rows that have arrived ahead of their resolved ts into the open transaction once at "
        "least this many are waiting, so that less is left to write when it arrives; committed only "
        "with their window, rolled back if it does not hold exactly them; 0: off; off with "
        "apply_workers (docs/operations.md)",
        default=500,
        parse=_parse_early_rows,
    ),
    Setting(
        "max_cached_bytes",
        "memory bound of the row cache (decoded rows, estimated); beyond it rows the barrier cannot "
        "release yet go to spill_dir and partitions ahead of the barrier are paused",
        default=512 << 20,
        parse=_parse_size,
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
        parse=_parse_positive_int,
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
        parse=_parse_listen,
    ),
    Setting(
        "stall_seconds",
        "not ready (and no systemd watchdog ping) when nothing was read or applied for this long "
        "while the topic is not read to its end",
        default=300,
        parse=_parse_positive_int,
    ),
    Setting(
        "retry_report_seconds",
        "transient database errors (lock wait timeout, deadlock, lost connection, read-only, full) are "
        "replayed without end; after this long without a committed transaction /readyz fails and the "
        "log says so",
        default=60,
        parse=_parse_positive_int,
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
        parse=_parse_tso,
        required=("catchup",),
        commands=("run", "catchup"),
    ),
    Setting(
        "until",
        "end of the backlog: latest (what the topic holds when the job starts) or a TSO / ISO-8601 time",
        default=None,
        parse=_parse_until,
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
        parse=_parse_positive_int,
        commands=("catchup",),
    ),
    Setting(
        "catchup_split_records",
        "largest Kafka offset range read by one Spark task",
        default=250_000,
        parse=_parse_positive_int,
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
        parse=_parse_positive_int,
        commands=("catchup",),
    ),
    Setting(
        "catchup_time_lookup_margin_seconds",
        "start partitions without a stored offset at the first record written this many seconds before "
        "--from-ts (broker record times, offsets_for_times); default: read them from the beginning",
        default=None,
        parse=_parse_positive_int,
        commands=("catchup",),
    ),
)

SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass
class Config:
    """The effective configuration of one command; ``sources`` says where each value came from."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def decoder_options(self) -> DecoderOptions:
        """How to decode this changefeed's records: the one place the daemon, the catch-up and
        ``applier decode`` build their options. The checkpoint schema is reserved: no DDL event
        may touch it (:mod:`sqlgen.ddl_guard`)."""
        ckpt = self.values.get("checkpoint_schema")
        compression = self.values.get("compression") or "none"
        return DecoderOptions(
            legacy_base64_strings=bool(self.values.get("legacy_base64_strings")),
            compression=None if compression == "none" else compression,
            reserved_schemas=frozenset({ckpt}) if ckpt else frozenset(),
        )

    def topics(self) -> TopicSet:
        """The topics of this changefeed (``topic``): one, several, or ``/regex/`` patterns."""
        from applier.kafka.topics import TopicSet

        return TopicSet.parse(self.values["topic"])

    def table_filter(self) -> TableFilter:
        """The tables this changefeed replicates (``filter``): the one place the daemon and the
        catch-up build it."""
        from applier.stream.table_filter import TableFilter

        return TableFilter(self.values.get("filter") or ())

    def router(self) -> Router:
        """The route rules (``sqlgen.route``) of the daemon and the catch-up; the checkpoint schema
        may not be a target."""
        ckpt = self.values.get("checkpoint_schema")
        return Router.from_rules(self.values.get("route") or (), reserved_schemas=[ckpt] if ckpt else ())

    def masked(self) -> dict[str, Any]:
        """The values with every secret hidden: what may be printed or logged."""
        from applier.ops.redact import redact_url

        out: dict[str, Any] = {}
        for name, value in self.values.items():
            setting = SETTINGS_BY_NAME.get(name)
            if setting is not None and setting.secret and value:
                if name in ("downstream", "upstream"):
                    value = redact_url(value)
                elif name == "claim_check_storage_uri":
                    from applier.large_messages.storage import redacted_uri

                    value = redacted_uri(value)
                elif isinstance(value, dict):
                    value = {k: ("***" if _looks_secret(k) else v) for k, v in value.items()}
                else:
                    value = "***"
            out[name] = value
        return out


def _looks_secret(key: str) -> bool:
    low = key.lower()
    return any(word in low for word in ("password", "secret", "key", "token", "sasl.oauthbearer"))


def settings_for(command: str) -> list[Setting]:
    return [s for s in SETTINGS if command in s.commands]


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Add one flag per setting of ``command``; defaults stay None so precedence can be resolved later."""
    parser.add_argument("--config", metavar="FILE.toml", help="TOML configuration file")
    for s in settings_for(command):
        shown = s.default not in (None, {}, ())
        extra = f" [env {s.env}; default {s.default!r}]" if shown else f" [env {s.env}]"
        if s.choices:
            extra = f" ({'|'.join(s.choices)})" + extra
        if s.flag_kind == "bool":
            parser.add_argument(
                s.flag, dest=s.name, action=argparse.BooleanOptionalAction, default=None, help=s.help + extra
            )
        elif s.flag_kind in ("kv", "list"):
            metavar = "KEY=VALUE" if s.flag_kind == "kv" else s.name.upper()
            parser.add_argument(
                s.flag, dest=s.name, action="append", default=None, metavar=metavar, help=s.help + extra
            )
        elif s.flag_kind == "list":
            parser.add_argument(
                s.flag, dest=s.name, action="append", default=None, metavar=s.metavar, help=s.help + extra
            )
        else:
            parser.add_argument(
                s.flag, dest=s.name, default=None, metavar=s.name.upper(), help=s.help + extra
            )


def _unreadable(path: str, exc: OSError) -> str:
    """Why ``path`` cannot be read, with who asks and who owns it: under systemd's DynamicUser=
    the process runs as a user that exists only while it runs, so "permission denied" alone does
    not tell the operator which side to change."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, PermissionError):
        try:
            st = os.stat(path)
        except OSError:
            return f"{reason} (for uid {os.getuid()})"
        return (
            f"{reason} for uid {os.getuid()} (the file is mode {stat.S_IMODE(st.st_mode):04o}, "
            f"owner {st.st_uid}:{st.st_gid}); make it readable by the service's user"
        )
    return reason


def load_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {_unreadable(path, exc)}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "kafka" and isinstance(value, dict):
            flat["kafka_config"] = value
        elif key == "route" and isinstance(value, dict):
            flat["route"] = value  # [route] "FROM" = "TO", in file order
        elif isinstance(value, dict):
            raise ConfigError(
                f"config file {path}: unknown table [{key}] (only [kafka] and [route] are accepted)"
            )
        else:
            flat[key] = value
    return flat


def resolve(
    command: str,
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Merge flags, environment, file and defaults for ``command`` (flag > env > file > default)."""
    environ = os.environ if environ is None else environ
    allowed = {s.name: s for s in settings_for(command)}
    file_path = flags.get("config") or environ.get("APPLIER_CONFIG")
    file_values = load_toml(file_path) if file_path else {}
    for key in file_values:
        if key not in SETTINGS_BY_NAME:
            raise ConfigError(
                f"config file {file_path}: unknown key {key!r}; accepted keys: {', '.join(sorted(allowed))}"
            )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, s in allowed.items():
        flag_value = flags.get(name)
        if flag_value is not None:
            values[name], sources[name] = s.convert(flag_value, f"flag {s.flag}"), "flag"
        elif s.env in environ:
            values[name], sources[name] = s.convert(environ[s.env], f"variable {s.env}"), "environment"
        elif name in file_values:
            values[name], sources[name] = s.convert(file_values[name], f"file {file_path}"), "file"
        elif s.required_by(command):
            raise ConfigError(
                f"{name} is required: pass {s.flag}, set {s.env} or put {name} in the config file"
            )
        else:
            values[name], sources[name] = s.default, "default"
    if command == "run" and values.get("from_ts") is not None and values.get("start") == "latest":
        raise ConfigError(
            "from_ts and start = latest contradict each other: from_ts reads every partition from its "
            "beginning and skips what the restored downstream holds; latest would skip the changes "
            "made after it; drop start"
        )
    if sources.get("kafka_config") in ("flag", "environment") and "kafka_config" in file_values:
        # Pass-through settings merge: file first, then the flag or variable, key by key.
        merged = _parse_kv_list(file_values["kafka_config"])
        merged.update(values["kafka_config"])
        values["kafka_config"] = merged
    return Config(values, sources)

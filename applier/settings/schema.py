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
from collections.abc import Mapping
from typing import Any

from applier.settings.config import Config
from applier.settings.parsers import parse_kv_list
from applier.settings.table import SETTINGS, SETTINGS_BY_NAME, ConfigError, Setting, settings_for

__all__ = [
    "SETTINGS",
    "SETTINGS_BY_NAME",
    "Config",
    "ConfigError",
    "Setting",
    "add_arguments",
    "load_toml",
    "resolve",
    "settings_for",
]


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
    if values.get("consistency") == "row":
        if values.get("ddl_blocking") == "tables":
            raise ConfigError(
                "consistency = row and ddl_blocking = tables cannot be combined: in row mode a DDL is "
                "a barrier every partition reaches (index DDLs still run beside the stream); drop one"
            )
        if values.get("apply_workers"):
            raise ConfigError(
                "consistency = row writes each partition on a session of its own; apply_workers "
                "adds sessions to the transaction mode only: set it to 0 or drop consistency = row"
            )
    if sources.get("kafka_config") in ("flag", "environment") and "kafka_config" in file_values:
        # Pass-through settings merge: file first, then the flag or variable, key by key.
        merged = parse_kv_list(file_values["kafka_config"])
        merged.update(values["kafka_config"])
        values["kafka_config"] = merged
    return Config(values, sources)

"""The parsers of setting values: text (a flag, a variable) or a TOML value to the setting's type.

Each raises ValueError with what is accepted; :meth:`applier.settings.table.Setting.convert` adds
the setting's name and where the value came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlgen.route import parse_route_rule, rule_texts


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def parse_size(text: str) -> int:
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


def parse_positive_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("expected a positive integer") from None
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def parse_seconds(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise ValueError("must be 0 or more seconds")
    return value


def parse_workers(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("expected a whole number of sessions, 0 to 16") from None
    if not 0 <= value <= 16:
        raise ValueError("must be 0 to 16")
    return value


def parse_early_rows(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError("expected a whole number of rows (0: off)") from None
    if value < 0:
        raise ValueError("must be 0 (off) or a positive number of rows")
    return value


def parse_kv_list(items: Iterable[str] | Mapping[str, Any]) -> dict[str, str]:
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out[key.strip()] = value
    return out


def split_list(text: str) -> list[str]:
    """A list setting given as one string (``APPLIER_FILTER``): one item per line when it holds a
    newline (so an item may contain a comma), else separated by commas; blank items dropped."""
    parts = text.splitlines() if "\n" in text else text.split(",")
    return [p.strip() for p in parts if p.strip()]


def parse_filter(raw: Any) -> tuple[str, ...]:
    """Table-filter rules, each checked (applier.stream.table_filter); the error names the rule."""
    from applier.stream.table_filter import TableFilter

    rules = split_list(raw) if isinstance(raw, str) else list(raw)
    if not all(isinstance(r, str) for r in rules):
        raise ValueError("expected a list of rules (strings)")
    return TableFilter(rules).rules


def parse_topics(raw: Any) -> str:
    """The topic set (applier.kafka.topics), kept as its normalised description: one topic stays
    its name, so ``cfg.topic`` reads as before where one topic is all there is."""
    from applier.kafka.topics import TopicSet

    if not isinstance(raw, str) and not all(isinstance(r, str) for r in raw):
        raise ValueError("expected a topic name or a list of them")
    described = TopicSet.parse(raw).describe()
    if len(described) > 255:  # it is stored with the checkpoint (checkpoint.schema: names of 255)
        raise ValueError("more than 255 characters of topics: name them with a /regex/ instead")
    return described


def parse_listen(text: str) -> str:
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


def parse_readable_file(text: str) -> str:
    """A path the process can read now: a typo in a certificate path should fail at start, by name."""
    path = str(text).strip()
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return path


def parse_routes(raw: Any) -> list[str]:
    """Route rules (``sqlgen.route``), checked now and kept as ``FROM=TO`` strings in their order."""
    rules = rule_texts(raw)
    for text in rules:
        parse_route_rule(text)
    return rules


def parse_tso(text: str) -> int:
    """A TSO integer or an ISO-8601 time, as a TSO (applier.catchup.tso: no pyspark import)."""
    from applier.catchup.tso import parse_ts

    return parse_ts(text)


def parse_until(text: str) -> int | None:
    from applier.catchup.tso import parse_until

    return parse_until(text)

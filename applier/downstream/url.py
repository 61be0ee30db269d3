"""Downstream URL parsing and the password wrapper.

The downstream is named by ``mysql://USER[:PASSWORD]@HOST[:PORT]/[?OPTIONS]``. A password on a
command line is visible in ``ps`` and shell history, so it can also come from the environment
(``APPLIER_DOWNSTREAM_PASSWORD``) or from a file (``password_file=`` option or
``APPLIER_DOWNSTREAM_PASSWORD_FILE``). Wherever it comes from it is kept in a :class:`Secret`, whose
``repr``/``str`` is ``***``, so that logging a config object or an exception built from one can
never print it. Every message this package builds from a URL uses :meth:`DownstreamConfig.redacted`
or :func:`redact_url_text`.

Options (query parameters, values percent-decoded; ``+`` is a literal plus so ``time_zone=+08:00``
works unescaped):

* ``time_zone`` — session time zone, default ``+00:00``. TiCDC writes TIMESTAMP values as strings
  in the TiCDC server's zone, and MySQL interprets them in the session zone, so this must be the
  producer's zone. UTC is only a default: set it to the zone TiCDC runs with (its ``--tz``, which
  defaults to the TiCDC host's system zone). Named zones (``Asia/Shanghai``) need the server's
  time zone tables loaded; offsets (``+08:00``) always work.
* ``sql_mode`` — overrides the permissive session ``sql_mode`` (see ``session.py``).
* ``ssl_mode`` — ``disabled``, ``preferred`` (default: TLS if the server offers it), ``required``
  (TLS, no certificate check), ``verify_ca``, ``verify_identity``; like the MySQL client's
  ``--ssl-mode``. ``ssl_ca``, ``ssl_cert``, ``ssl_key``: PEM file paths. Giving ``ssl_ca`` without
  ``ssl_mode`` means ``verify_ca`` (as in the MySQL client); ``ssl_verify_identity=true`` means
  ``verify_identity``.
* ``connect_timeout``, ``read_timeout``, ``write_timeout`` — seconds; ``0`` or ``none`` for no
  read/write timeout. The read timeout (default 300 s) bounds every statement but DDLs, which run
  on the single-active lock's session without one.
* ``password_file`` — read the password from this file (one trailing newline is stripped).

The URL must not name a database: the applier writes into the schemas named by the stream and
keeps its own state in a configurable schema.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import quote, unquote, urlsplit

from applier.errors import ConfigurationError
from applier.ops.redact import redact_url

ENV_PASSWORD: Final = "APPLIER_DOWNSTREAM_PASSWORD"
ENV_PASSWORD_FILE: Final = "APPLIER_DOWNSTREAM_PASSWORD_FILE"

DEFAULT_PORT: Final = 3306
DEFAULT_USER: Final = "root"
DEFAULT_TIME_ZONE: Final = "+00:00"
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
# A bound on every wait for the server's answer: a session whose peer stopped answering without
# closing (a proxy or firewall that drops the flow, a frozen server) is given up after it, and the
# unit of work replayed on a new session. The apply and catch-up sessions run only row statements,
# checkpoint writes and short queries, which never legitimately take minutes; DDLs, which can run
# for hours, run on the single-active lock's session without a read timeout (downstream/lock.py).
DEFAULT_READ_TIMEOUT: Final[float | None] = 300.0
DEFAULT_WRITE_TIMEOUT: Final = 60.0

SSL_MODES: Final = ("disabled", "preferred", "required", "verify_ca", "verify_identity")

_KNOWN_OPTIONS: Final = frozenset(
    {
        "time_zone",
        "sql_mode",
        "ssl_mode",
        "ssl_ca",
        "ssl_cert",
        "ssl_key",
        "ssl_verify_identity",
        "connect_timeout",
        "read_timeout",
        "write_timeout",
        "password_file",
    }
)


class DownstreamConfigError(ConfigurationError):
    """The downstream URL or its options are unusable. The message never contains a password."""


class Secret:
    """A string that refuses to be printed.

    ``repr`` and ``str`` (and therefore f-strings, ``%s`` and logging) show ``***``; only
    :meth:`reveal` returns the value, so every place that really needs it is greppable. It can be
    pickled (a Spark job or a worker process may need the config); the pickle holds the value.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class DownstreamConfig:
    """Everything needed to open a session on the downstream server (no database: see module doc)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    user: str = DEFAULT_USER
    password: Secret = field(default_factory=Secret)
    time_zone: str = DEFAULT_TIME_ZONE
    sql_mode: str | None = None  # None: the applier's permissive default (session.DEFAULT_SQL_MODE)
    ssl_mode: str = "preferred"
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float | None = DEFAULT_READ_TIMEOUT
    write_timeout: float | None = DEFAULT_WRITE_TIMEOUT
    password_file: str | None = None  # where the password came from, shown in redacted URLs

    def __post_init__(self) -> None:
        if self.ssl_mode not in SSL_MODES:
            modes = ", ".join(SSL_MODES)
            raise DownstreamConfigError(f"ssl_mode must be one of {modes}, not {self.ssl_mode!r}")
        if self.ssl_mode == "verify_ca" and not self.ssl_ca:
            raise DownstreamConfigError("ssl_mode=verify_ca needs ssl_ca (the CA certificate file)")
        if not 0 < self.port < 65536:
            raise DownstreamConfigError(f"port must be 1-65535, not {self.port}")

    @property
    def ssl_verify_identity(self) -> bool:
        return self.ssl_mode == "verify_identity"

    @classmethod
    def from_url(cls, url: str, *, env: Mapping[str, str] | None = None) -> DownstreamConfig:
        return parse_downstream_url(url, env=env)

    def with_options(self, **changes: object) -> DownstreamConfig:
        """A copy with some fields changed (e.g. a shorter read timeout for the lock connection)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def redacted(self) -> str:
        """The URL with the password shown as ``***``: the only form that may appear in messages."""
        auth = quote(self.user, safe="")
        if self.password:
            auth += ":***"
        host = f"[{self.host}]" if ":" in self.host else self.host
        params: list[tuple[str, str]] = []
        if self.time_zone != DEFAULT_TIME_ZONE:
            params.append(("time_zone", self.time_zone))
        if self.sql_mode is not None:
            params.append(("sql_mode", self.sql_mode))
        if self.ssl_mode != "preferred":
            params.append(("ssl_mode", self.ssl_mode))
        for name in ("ssl_ca", "ssl_cert", "ssl_key", "password_file"):
            value = getattr(self, name)
            if value:
                params.append((name, value))
        query = "&".join(f"{k}={quote(v, safe='+:/,')}" for k, v in params)
        return f"mysql://{auth}@{host}:{self.port}/" + (f"?{query}" if query else "")

    def __str__(self) -> str:
        return self.redacted()


redact_url_text = redact_url
"""Kept under this name for the downstream modules; see :func:`applier.ops.redact.redact_url`."""


def _parse_query(query: str, shown: str) -> dict[str, str]:
    """Parse ``a=b&c=d`` with ``unquote`` (not ``unquote_plus``): '+' in a zone offset stays '+'."""
    out: dict[str, str] = {}
    if not query:
        return out
    for part in query.split("&"):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = unquote(key)
        if not sep:
            raise DownstreamConfigError(f"option {key!r} has no value in downstream URL {shown}")
        if key not in _KNOWN_OPTIONS:
            known = ", ".join(sorted(_KNOWN_OPTIONS))
            raise DownstreamConfigError(f"unknown option {key!r} in downstream URL {shown} (known: {known})")
        if key in out:
            raise DownstreamConfigError(f"option {key!r} given twice in downstream URL {shown}")
        out[key] = unquote(value)
    return out


def _bool_option(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise DownstreamConfigError(f"option {name} must be true or false, not {value!r}")


def _seconds_option(name: str, value: str, *, allow_none: bool) -> float | None:
    lowered = value.strip().lower()
    if allow_none and lowered in ("0", "none", ""):
        return None
    try:
        seconds = float(lowered)
    except ValueError:
        raise DownstreamConfigError(f"option {name} must be a number of seconds, not {value!r}") from None
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise DownstreamConfigError(f"option {name} must be a positive number of seconds, not {value!r}")
    return seconds


def read_password_file(path: str) -> Secret:
    """Read a password file; strips exactly one trailing newline (editors add one), nothing else."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise DownstreamConfigError(f"cannot read password file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DownstreamConfigError(f"password file {path!r} is not UTF-8 text") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    return Secret(text)


def parse_downstream_url(url: str, *, env: Mapping[str, str] | None = None) -> DownstreamConfig:
    """Parse a ``mysql://`` URL into a :class:`DownstreamConfig`.

    Password precedence: in the URL, else the ``password_file`` option, else
    ``APPLIER_DOWNSTREAM_PASSWORD``, else the file named by ``APPLIER_DOWNSTREAM_PASSWORD_FILE``,
    else empty. A URL password together with ``password_file`` is rejected as ambiguous.
    ``env`` defaults to ``os.environ`` (tests pass their own).
    """
    environ = os.environ if env is None else env
    shown = redact_url_text(url)
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        # urlsplit's messages can quote the netloc; say why without echoing it.
        reason = "invalid port" if "port" in str(exc).lower() else "malformed URL"
        raise DownstreamConfigError(f"{reason} in downstream URL {shown}") from None
    if parts.scheme.lower() not in ("mysql", "mariadb", "tidb"):
        raise DownstreamConfigError(f"downstream URL must start with mysql://, got {shown}")
    if parts.path not in ("", "/"):
        raise DownstreamConfigError(
            f"downstream URL {shown} names a database; leave the path empty (mysql://user@host:port/): "
            "the applier writes into the schemas named by the change stream"
        )
    if parts.fragment:
        raise DownstreamConfigError(f"downstream URL {shown} has a '#' fragment; percent-encode '#' as %23")
    if not parts.hostname:
        raise DownstreamConfigError(f"downstream URL {shown} has no host")
    opts = _parse_query(parts.query, shown)

    url_password = unquote(parts.password) if parts.password is not None else None
    password_file = opts.get("password_file")
    if url_password is not None and password_file:
        raise DownstreamConfigError(f"downstream URL {shown} has both a password and password_file; use one")
    if url_password is not None:
        password = Secret(url_password)
    elif password_file:
        password = read_password_file(password_file)
    elif environ.get(ENV_PASSWORD):
        password = Secret(environ[ENV_PASSWORD])
    elif environ.get(ENV_PASSWORD_FILE):
        password_file = environ[ENV_PASSWORD_FILE]
        password = read_password_file(password_file)
    else:
        password = Secret("")

    ssl_mode = opts.get("ssl_mode", "").strip().lower()
    if "ssl_verify_identity" in opts and _bool_option("ssl_verify_identity", opts["ssl_verify_identity"]):
        if ssl_mode and ssl_mode != "verify_identity":
            raise DownstreamConfigError(f"ssl_verify_identity=true contradicts ssl_mode={ssl_mode}")
        ssl_mode = "verify_identity"
    if not ssl_mode:
        ssl_mode = "verify_ca" if opts.get("ssl_ca") else "preferred"

    time_zone = opts.get("time_zone", DEFAULT_TIME_ZONE).strip()
    if not time_zone:
        raise DownstreamConfigError("option time_zone is empty")

    return DownstreamConfig(
        host=parts.hostname,
        port=port or DEFAULT_PORT,
        user=unquote(parts.username) if parts.username else DEFAULT_USER,
        password=password,
        time_zone=time_zone,
        sql_mode=opts.get("sql_mode"),
        ssl_mode=ssl_mode,
        ssl_ca=opts.get("ssl_ca") or None,
        ssl_cert=opts.get("ssl_cert") or None,
        ssl_key=opts.get("ssl_key") or None,
        connect_timeout=_seconds_option("connect_timeout", opts["connect_timeout"], allow_none=False)
        if "connect_timeout" in opts
        else DEFAULT_CONNECT_TIMEOUT,
        read_timeout=_seconds_option("read_timeout", opts["read_timeout"], allow_none=True)
        if "read_timeout" in opts
        else DEFAULT_READ_TIMEOUT,
        write_timeout=_seconds_option("write_timeout", opts["write_timeout"], allow_none=True)
        if "write_timeout" in opts
        else DEFAULT_WRITE_TIMEOUT,
        password_file=password_file or None,
    )

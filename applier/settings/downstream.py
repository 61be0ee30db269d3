"""Turn the validated settings into the :class:`DownstreamConfig` every command connects with.

The downstream URL can carry TLS options and a password itself, but operators configure a service
through flat keys (``downstream_ssl_ca = ...`` in the TOML file, ``APPLIER_DOWNSTREAM_SSL_CA`` in a
unit's environment file) and keep the password out of the URL and off the command line (the
``APPLIER_DOWNSTREAM_PASSWORD`` variable or ``downstream_password_file``). This module is the one
place where the two meet, so ``run``, ``status`` and ``config check`` agree on what they connect to.

Rules: a flat setting overrides the same option in the URL; a password in the URL together with a
password file is ambiguous and rejected; every message names the setting and never the password.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from applier.downstream.url import DownstreamConfig, DownstreamConfigError, read_password_file


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return getattr(cfg, "values", {}).get(name, default)


def downstream_config(cfg: Any, *, env: Mapping[str, str] | None = None) -> DownstreamConfig:
    """The downstream of ``cfg`` (a :class:`~applier.settings.schema.Config`) with TLS and passwords.

    Raises :class:`DownstreamConfigError` with a password-free message naming the setting at fault.
    """
    base = DownstreamConfig.from_url(cfg.downstream, env=env)
    changes: dict[str, Any] = {}
    tz = _get(cfg, "time_zone")
    if tz:
        changes["time_zone"] = tz

    password_file = _get(cfg, "downstream_password_file")
    if password_file and password_file != base.password_file:
        if base.password and base.password_file is None and _url_has_password(cfg.downstream):
            raise DownstreamConfigError(
                "downstream has a password in the URL and downstream_password_file is set; use one"
            )
        changes["password"] = read_password_file(password_file)
        changes["password_file"] = password_file

    for name in ("ssl_ca", "ssl_cert", "ssl_key"):
        value = _get(cfg, f"downstream_{name}")
        if value:
            changes[name] = value
    if changes.get("ssl_key") and not (changes.get("ssl_cert") or base.ssl_cert):
        raise DownstreamConfigError("downstream_ssl_key is set without downstream_ssl_cert")

    mode = _get(cfg, "downstream_ssl_mode")
    if _get(cfg, "downstream_ssl_verify_identity"):
        if mode and mode != "verify_identity":
            raise DownstreamConfigError(
                f"downstream_ssl_verify_identity=true contradicts downstream_ssl_mode={mode}"
            )
        mode = "verify_identity"
    if not mode and changes.get("ssl_ca") and base.ssl_mode == "preferred":
        mode = "verify_ca"  # a CA means "check the certificate", as with the MySQL client
    if mode:
        changes["ssl_mode"] = mode
    if (changes.get("ssl_mode") or base.ssl_mode) == "disabled" and any(
        changes.get(k) or getattr(base, k) for k in ("ssl_cert", "ssl_key")
    ):
        raise DownstreamConfigError("downstream_ssl_mode=disabled contradicts a client certificate")
    return base.with_options(**changes) if changes else base


def _url_has_password(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        return urlsplit(url.strip()).password is not None
    except ValueError:
        return False


def password_source(cfg: Any, ds: DownstreamConfig, *, env: Mapping[str, str] | None = None) -> str:
    """Where the password comes from, for ``config check`` (never the password itself)."""
    import os

    from applier.downstream.url import ENV_PASSWORD

    environ = os.environ if env is None else env
    if not ds.password:
        return "none"
    if _url_has_password(cfg.downstream):
        return "*** (in the downstream URL: better use APPLIER_DOWNSTREAM_PASSWORD or a password file)"
    if ds.password_file:
        return f"*** (file {ds.password_file})"
    if environ.get(ENV_PASSWORD):
        return f"*** (variable {ENV_PASSWORD})"
    return "***"

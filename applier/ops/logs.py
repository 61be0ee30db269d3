"""structlog set-up: console or JSON lines, with a processor that masks secrets in every event.

Small composable processors, as structlog intends: the redaction runs last before rendering, so
no code path (including exception text) can print a password.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from applier.ops.redact import looks_secret, redact_text


def mask_secrets(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Mask values under secret-looking keys and ``user:password@`` inside any string value."""
    for key, value in list(event_dict.items()):
        if looks_secret(key):
            event_dict[key] = "***"
        elif isinstance(value, str) and "://" in value:
            event_dict[key] = redact_text(value)
    return event_dict


def configure(fmt: str = "console", level: str = "info", stream: Any = None) -> None:
    """Configure structlog for the whole process (idempotent)."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info
            if fmt == "json"
            else structlog.processors.StackInfoRenderer(),
            mask_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**bind: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger with ``bind`` in every line, which follows :func:`configure` whenever it was made:
    a lazy proxy that reads the configuration at each call. (Binding the proxy at once would fix
    the configuration in force then: a module-level logger, made at import, would print the
    console format under ``--log-format json``.)"""
    return structlog.get_logger("applier", **bind)

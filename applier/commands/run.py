"""``applier run``: the streaming daemon with its operations (metrics, health, HTTP, systemd)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from applier.errors import ConfigurationError
from applier.ops.logs import configure
from applier.ops.redact import redact_text
from applier.settings.schema import Config

if TYPE_CHECKING:
    from applier.daemon.tuning import Tuning
    from applier.ops.observer import Observer


def report_configuration_error(exc: ConfigurationError) -> int:
    """One line on stderr, secrets masked; the exit code that tells systemd not to retry."""
    print(f"applier: configuration error: {redact_text(str(exc))}", file=sys.stderr)
    return exc.exit_code


def run_daemon(cfg: Config, *, tuning: Tuning | None = None, observers: tuple[Observer, ...] = ()) -> int:
    """``applier run``; ``tuning`` and extra ``observers`` are for tests that run it as a process."""
    from applier.daemon.loop import Daemon
    from applier.ops.wiring import Operations

    configure(cfg.log_format, cfg.log_level)
    try:
        daemon = Daemon(cfg, observers, tuning=tuning)
        ops = Operations(cfg)
    except ConfigurationError as exc:
        return report_configuration_error(exc)
    for observer in ops.observers:
        daemon.observer.add(observer)
    daemon.install_signal_handlers()
    ops.install_signal_hooks(daemon.request_stop)
    ops.start(daemon.log)
    try:
        return daemon.run()
    finally:
        ops.close()

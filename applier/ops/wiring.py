"""Wires the operational side of ``applier run``: health, metrics, HTTP endpoints, systemd.

Kept out of ``applier/daemon/loop.py`` so the daemon's loop stays about replication:
``applier.commands.run.run_daemon`` builds one :class:`Operations`, hands its observers to the
daemon, and closes it when the daemon returns.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from applier.ops.health import Health
from applier.ops.http import HttpEndpoints, HttpListenError
from applier.ops.metrics import MetricsObserver
from applier.ops.observer import Observer
from applier.ops.sdnotify import Notifier, SystemdObserver


class Operations:
    """Health state, metrics, the HTTP endpoints (unless ``http_listen = off``) and sd_notify."""

    def __init__(self, cfg: Any, environ: dict[str, str] | None = None) -> None:
        self.health = Health(stall_seconds=cfg.stall_seconds, retry_report_seconds=cfg.retry_report_seconds)
        self.metrics = MetricsObserver()
        self.systemd = SystemdObserver(Notifier(environ), self.health)
        listen = cfg.http_listen
        self.http: HttpEndpoints | None = None
        self.http_problem: str | None = None
        if listen != "off":
            # Bound here, before the daemon starts: an address the operator chose that cannot be used
            # is a start-up error. The default address is only a convenience: when a second instance on
            # the same host (a standby, a test, the demo) finds it taken, it runs without endpoints and
            # says so, rather than refusing to replicate.
            try:
                self.http = HttpEndpoints(listen, self.health, self.metrics)
            except HttpListenError as exc:
                if getattr(cfg, "sources", {}).get("http_listen", "default") != "default":
                    raise
                self.http_problem = str(exc)

    @property
    def observers(self) -> list[Observer]:
        # Health first: the systemd observer asks it questions in the same hooks.
        return [self.health, self.metrics, self.systemd]

    def install_signal_hooks(self, request_stop: Callable[[int, FrameType | None], None]) -> None:
        """Say STOPPING=1 the moment SIGTERM/SIGINT arrives, then let the daemon stop as before."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.systemd.stopping()
            request_stop(signum, frame)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def start(self, log: Any) -> None:
        if self.http_problem is not None:
            log.warning("http endpoints disabled: " + self.http_problem)
        if self.http is not None:
            self.http.start()
            log.info("http endpoints listening", address=self.http.address, paths="/metrics /healthz /readyz")
        self.systemd.start()

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
        self.systemd.close()

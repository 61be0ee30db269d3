"""The daemon's HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

A ``ThreadingHTTPServer`` on a daemon thread is enough: scrapes and probes are a few requests a
minute, each answered from memory (see :mod:`applier.ops.health` for what the probes mean). Probe
bodies are small JSON documents so that a person running ``curl`` sees *why* (``standby``,
``stalled``...), while orchestrators only look at the status code: 200 or 503.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from applier.errors import ConfigurationError
from applier.ops.health import Health, Verdict
from applier.ops.metrics import CONTENT_TYPE, MetricsObserver


class HttpListenError(ConfigurationError):
    """The configured address cannot be bound (in use, not local, no permission)."""


def split_listen(listen: str) -> tuple[str, int]:
    """``'127.0.0.1:9400'`` -> ``('127.0.0.1', 9400)``; ``'[::1]:9400'`` -> ``('::1', 9400)``; ``':9400'``
    listens on every address."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    return host, int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], health: Health, metrics: MetricsObserver) -> None:
        import socket

        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.health = health
        self.metrics = metrics


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "ticdc-applier"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would drown the daemon's own log; stay quiet."""

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _verdict(self, verdict: Verdict) -> None:
        body = json.dumps({"status": verdict.status, **verdict.detail}, sort_keys=True).encode() + b"\n"
        self._send(200 if verdict.ok else 503, body, "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.metrics.render(), CONTENT_TYPE)
        elif path in ("/healthz", "/livez"):
            self._verdict(self.server.health.alive())
        elif path == "/readyz":
            self._verdict(self.server.health.ready())
        elif path == "/":
            self._send(200, b"ticdc-applier: /metrics /healthz /readyz\n", "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET


class HttpEndpoints:
    """Binds at construction (so a bad address fails the start), serves after :meth:`start`."""

    def __init__(self, listen: str, health: Health, metrics: MetricsObserver) -> None:
        host, port = split_listen(listen)
        try:
            self._server = _Server((host, port), health, metrics)
        except OSError as exc:
            raise HttpListenError(
                f"http_listen {listen}: cannot listen there ({exc.strerror or exc}); "
                "choose another HOST:PORT or set http_listen = off"
            ) from None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=2)
        self._server.server_close()

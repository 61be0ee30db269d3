"""applier.ops.http: the /metrics, /healthz and /readyz endpoints over real HTTP, and listen addresses."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from applier.ops.health import Health
from applier.ops.http import HttpEndpoints, HttpListenError, split_listen
from applier.ops.metrics import MetricsObserver


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_http_endpoints_serve_metrics_and_probes() -> None:
    health = Health()
    metrics = MetricsObserver(process_metrics=False)
    http = HttpEndpoints("127.0.0.1:0", health, metrics)
    http.start()
    base = f"http://{http.address}"
    try:
        code, ctype, body = _get(base + "/metrics")
        assert code == 200 and ctype.startswith("text/plain; version=0.0.4") and "applier_state" in body
        assert _get(base + "/healthz")[0] == 200
        code, ctype, body = _get(base + "/readyz")
        assert code == 503 and ctype == "application/json" and json.loads(body)["status"] == "starting"
        health.on_state("active")
        health.on_ready()
        assert _get(base + "/readyz")[0] == 200
        assert _get(base + "/other")[0] == 404
        # A taken address is a clear start-up error.
        with pytest.raises(
            HttpListenError, match=r"http_listen .*cannot listen there.*or set http_listen = off"
        ):
            HttpEndpoints(http.address, health, metrics)
    finally:
        http.close()


def test_split_listen() -> None:
    assert split_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert split_listen("[::1]:9400") == ("::1", 9400)
    assert split_listen(":9400") == ("", 9400)

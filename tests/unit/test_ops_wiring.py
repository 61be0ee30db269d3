"""applier.ops.wiring: how the operations parts are put together from the configuration."""

from __future__ import annotations

import socket

import pytest

from applier.ops.http import HttpListenError


def test_a_taken_default_address_degrades_a_chosen_one_fails() -> None:
    """Two instances on one host (a standby, the demo) must not refuse to replicate over the default port."""
    from applier.ops.wiring import Operations
    from applier.settings.schema import resolve

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    base = {"kafka_bootstrap": "k:1", "topic": "t", "group_id": "g", "downstream": "mysql://a@b/"}
    try:
        cfg = resolve("run", base, environ={})
        cfg.values["http_listen"] = address  # as if it were the default value
        ops = Operations(cfg, environ={})
        assert ops.http is None and "cannot listen there" in (ops.http_problem or "")
        ops.close()
        with pytest.raises(HttpListenError):
            Operations(resolve("run", {**base, "http_listen": address}, environ={}), environ={})
    finally:
        taken.close()

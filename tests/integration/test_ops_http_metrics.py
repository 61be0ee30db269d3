"""Metrics and health endpoints of a real daemon, scraped while it applies a simulated stream."""

from __future__ import annotations

import json
import math
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from applier.codec.events import tso_physical_ms
from applier.simulator import StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.harness import Changefeed, stop
from tests.integration.ops_support import (
    http_base,
    http_get,
    scrape,
    scrape_when,
    total,
    value,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3


def same_tso(exported: float | None, ts: int) -> bool:
    """Prometheus values are float64: a TSO (~2^59) keeps its physical milliseconds, not every logical bit."""
    return exported is not None and abs(exported - ts) < 2**8


@pytest.fixture
def feed(broker, downstream_url, mariadb_params) -> Iterator[Changefeed]:
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", downstream_url, mariadb_params)
    cf.extra_args += ["--http-listen", "127.0.0.1:0", "--log-format", "json", "--stall-seconds", "60"]
    cf.schema = cf.new_schema()  # type: ignore[attr-defined]
    yield cf
    cf.drop()


def test_metrics_move_as_rows_are_applied_and_probes_answer(feed: Changefeed) -> None:
    sim = simulate(StreamConfig(seed=11, partitions=PARTITIONS, transactions=160, schema=feed.schema))
    cut = len(sim.records) // 2
    ensure_topic(feed.bootstrap, feed.topic, PARTITIONS)
    produce_records(feed.bootstrap, feed.topic, sim.records[:cut])
    proc = feed.start()
    standby = None
    try:
        base = http_base(proc)
        # Ready once active, connected and reading; the first half gets applied.
        wait_until(lambda: http_get(base + "/readyz")[0] == 200, 30, "/readyz 200", proc)
        first = wait_until(
            lambda: scrape_when(
                base,
                # The per-partition gauges are refreshed on the loop's ticks (every 0.1-0.5 s), the
                # counters at each commit: wait until a refresh has seen every partition read.
                lambda s: (
                    total(s, "applier_rows_applied_total") > 0
                    and all(
                        value(s, "applier_partition_read_offset", partition=str(p)) is not None
                        for p in range(PARTITIONS)
                    )
                ),
            ),
            60,
            "rows applied",
            proc,
        )
        ckpt1 = value(first, "applier_checkpoint_ts")
        assert ckpt1 and ckpt1 > 0
        assert value(first, "applier_state", applier_state="active") == 1
        assert value(first, "applier_active") == 1
        assert value(first, "applier_ready") == 1
        # Lag is the wall clock minus the checkpoint's physical time (the simulator's TSOs are recent).
        lag = value(first, "applier_lag_seconds")
        expected_lag = time.time() - tso_physical_ms(int(ckpt1)) / 1000
        assert lag is not None and not math.isnan(lag) and abs(lag - expected_lag) < 30
        assert value(first, "applier_checkpoint_timestamp_seconds") == pytest.approx(
            tso_physical_ms(int(ckpt1)) / 1000
        )
        for p in range(PARTITIONS):
            assert value(first, "applier_partition_resolved_ts", partition=str(p)) is not None
            assert value(first, "applier_partition_read_offset", partition=str(p)) is not None
            assert value(first, "applier_partition_cached_bytes", partition=str(p)) is not None
        assert value(first, "applier_batch_seconds_count") == value(first, "applier_transactions_total")
        assert value(first, "applier_build_info", version="0.1.0") == 1

        status, body = http_get(base + "/healthz")
        assert status == 200 and json.loads(body)["state"] == "active"
        status, body = http_get(base + "/readyz")
        assert status == 200 and json.loads(body)["status"] == "ready"

        # A second instance of the same changefeed is a standby: alive, not ready, and says why.
        standby = feed.start("--log-format", "json")
        sbase = http_base(standby)
        wait_until(
            lambda: json.loads(http_get(sbase + "/readyz")[1])["status"] == "standby",
            30,
            "standby readiness",
            standby,
        )
        status, body = http_get(sbase + "/readyz")
        assert status == 503 and json.loads(body)["reason"] == "another instance is active"
        status, body = http_get(sbase + "/healthz")
        assert status == 200 and json.loads(body)["status"] == "standby"
        s = scrape(sbase)
        assert value(s, "applier_state", applier_state="standby") == 1
        assert value(s, "applier_active") == 0
        assert total(s, "applier_rows_applied_total") == 0

        # The rest of the stream: every value that tracks progress moves forward.
        rows1 = total(first, "applier_rows_applied_total")
        tx1 = value(first, "applier_transactions_total")
        produce_records(feed.bootstrap, feed.topic, sim.records[cut:])
        final = wait_until(
            lambda: scrape_when(
                base,
                lambda s: (
                    same_tso(value(s, "applier_checkpoint_ts"), sim.final_resolved_ts)
                    and value(s, "applier_global_resolved_ts") >= float(sim.final_resolved_ts)
                ),
            ),
            60,
            "the final resolved ts in the metrics",
            proc,
        )
        assert total(final, "applier_rows_applied_total") > rows1
        assert value(final, "applier_transactions_total") > tx1
        assert value(final, "applier_global_resolved_ts") >= float(sim.final_resolved_ts)
        assert value(final, "applier_ddls_applied_total") == len(sim.ddl_events)
        # Every row window is observed in the commit lag histogram at its commit (idle now: no race).
        row_windows = value(final, "applier_transactions_total") - len(sim.ddl_events)
        assert value(final, "applier_commit_lag_seconds_count") == row_windows > 0
        # ... and those the loop saw become ready (their resolved ts read) in the applier's own share.
        assert 0 < value(final, "applier_ready_to_commit_seconds_count") <= row_windows
        ops = {dict(k[1]).get("op") for k in final if k[0] == "applier_rows_applied_total"}
        assert ops <= {"insert", "replace", "delete"} and ops
        for p in range(PARTITIONS):
            assert value(final, "applier_partition_checkpoint_offset", partition=str(p)) is not None
        # Caught up and idle: still ready (waiting healthily, not stalled).
        time.sleep(1.0)
        assert http_get(base + "/readyz")[0] == 200
        assert http_get(base + "/nope")[0] == 404
    finally:
        if standby is not None:
            stop(standby, signal.SIGTERM)
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0
    assert standby is not None and standby.returncode == 0


def test_http_listen_off_and_a_taken_port(feed: Changefeed) -> None:
    """``off`` serves nothing; an address in use fails the start with exit 2 and a clear message."""
    import socket

    ensure_topic(feed.bootstrap, feed.topic, 1)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        done = feed.run_to_end("--http-listen", f"127.0.0.1:{port}", timeout=60)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"http_listen 127.0.0.1:{port}: cannot listen there" in done.stderr
    finally:
        taken.close()
    done = feed.run_to_end("--http-listen", "off", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "http endpoints listening" not in done.stdout + done.stderr

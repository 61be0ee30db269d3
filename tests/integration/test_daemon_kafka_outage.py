"""The broker unreachable for 8 s under a running daemon: a few structured lines, /readyz and a metric.

The embedded broker loses its topics when it stops, so the outage is made by a forwarder in front
of it (tests/integration/tcp_proxy.py): the broker advertises the forwarder's port, every client
connection goes through it, and cutting it resets the connections and refuses new ones exactly as
a stopped broker does, while the broker keeps the topic. The daemon must then say so in a few
structured lines (no raw librdkafka line), be unready while no broker answers, and carry on when
the broker is back: the rest of the stream converges.
"""

from __future__ import annotations

import json
import re
import signal
import time
import uuid

import pytest

from applier.simulator import StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.ops_support import http_base, http_get, scrape, value, wait_until
from tests.integration.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration

OUTAGE_SECONDS = 8.0
MAX_OUTAGE_LINES = 15
RAW_LIBRDKAFKA = re.compile(r"%\d+\|\d+\.\d+\|")  # librdkafka's own stderr format: %LEVEL|TIME|FAC|...


def unreachable_seconds(base: str) -> float | None:
    return value(scrape(base), "applier_kafka_unreachable_seconds")


def test_broker_down_8s_gives_a_few_structured_lines_and_unready(
    proxied_broker: TcpProxy, downstream_url: str, mariadb_params: dict
) -> None:
    bootstrap = f"127.0.0.1:{proxied_broker.port}"
    feed = Changefeed(bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", downstream_url, mariadb_params)
    feed.extra_args += ["--http-listen", "127.0.0.1:0", "--log-format", "json"]
    try:
        sim = simulate(StreamConfig(seed=21, partitions=2, transactions=80, schema=feed.new_schema()))
        cut = len(sim.records) // 2
        ensure_topic(bootstrap, feed.topic, 2)
        produce_records(bootstrap, feed.topic, sim.records[:cut])
        proc = feed.start()
        try:
            base = http_base(proc)
            wait_until(lambda: http_get(base + "/readyz")[0] == 200, 60, "/readyz 200", proc)
            wait_until(lambda: feed.checkpoint()[0] > 0, 60, "the first windows applied", proc)
            assert unreachable_seconds(base) == 0
            before = len(read_log(proc).splitlines())

            proxied_broker.cut()
            down_at = time.monotonic()
            wait_until(
                lambda: http_get(base + "/readyz")[0] == 503, 60, "/readyz 503 while unreachable", proc
            )
            status, body = http_get(base + "/readyz")
            assert status == 503 and json.loads(body)["status"] == "kafka unreachable", body
            wait_until(lambda: (unreachable_seconds(base) or 0) > 0, 30, "the unreachable metric", proc)
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
            assert http_get(base + "/readyz")[0] == 503  # still down: nothing answered meanwhile
            proxied_broker.restore()

            wait_for_output(proc, "broker reachable again", 60)
            wait_until(lambda: http_get(base + "/readyz")[0] == 200, 60, "/readyz 200 after the outage", proc)
            assert unreachable_seconds(base) == 0
            lines = read_log(proc).splitlines()
            upto = next(i for i, line in enumerate(lines) if "broker reachable again" in line)
            outage = lines[before : upto + 1]
            shown = "\n".join(outage)
            events = [json.loads(line) for line in outage]  # each line is one JSON event
            assert all("event" in e and "level" in e for e in events), shown
            # What the outage said: the windows and DDLs of records fetched before it, applied
            # meanwhile, are the daemon's work, not its noise.
            said = [e for e in events if e.get("component") not in ("apply", "ddl")]
            assert len(said) <= MAX_OUTAGE_LINES, shown
            assert any("no broker reachable" in e["event"] for e in events), shown
            back = events[-1]
            assert back["unreachable_seconds"] > 0, back

            # The rest of the stream still arrives and is applied.
            produce_records(bootstrap, feed.topic, sim.records[cut:])
            wait_until(
                lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 120, "the final resolved ts", proc
            )
            assert feed.compare(sim, sim.final_resolved_ts) == []
        finally:
            stop(proc, signal.SIGTERM)
        output = read_log(proc)
        assert not RAW_LIBRDKAFKA.search(output), output[-4000:]
        for line in output.splitlines():
            json.loads(line)  # nothing but structured events, start to stop
    finally:
        feed.drop()

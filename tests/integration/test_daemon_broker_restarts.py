"""The broker restarted five times under a running daemon: nothing lost, nothing twice, no exit.

The embedded broker (tansu) keeps its topics in an S3 bucket here (moto's server in the test
process, tests/integration/s3_server.py), so a stopped broker started again on the same port has
every record it acknowledged, as a restarted Kafka broker has. The stream is produced in eleven
parts: one before the daemon starts, and for each outage one right before it (the daemon may still be
reading or applying it when the broker goes away) and one right after it (only the restarted broker
can deliver that one). The outages last 1, 3, 8, 15 and 30 s (a little longer when the daemon takes
longer to report one).

What it proves, for each outage: the daemon keeps running; ``/readyz`` answers 503
``kafka unreachable`` while the broker is down (and ``applier_kafka_unreachable_seconds`` grows);
once the broker is back the daemon reads on, without being restarted, and applies the part
produced after the restart (the time it takes is printed and only loosely bounded). At the end the
downstream equals the simulator's model at the final resolved ts exactly: no row lost, none
applied twice. The daemon then stops cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from applier.kafka.embedded_broker import EmbeddedBroker, start_broker
from applier.simulator import StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.catchup_support import global_resolved_of
from tests.integration.harness import Changefeed, read_log, stop
from tests.integration.ops_support import http_base, http_get, scrape, value, wait_until
from tests.integration.s3_server import client_env, make_bucket

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGES = (1.0, 3.0, 8.0, 15.0, 30.0)  # seconds the broker stays down, one restart each
RESUME_WITHIN = 60.0  # loose: the daemon reconnects within librdkafka's reconnect backoff (<= 10 s)
PARTITIONS = 3


@pytest.fixture
def durable_broker(s3_endpoint: str) -> Iterator[EmbeddedBroker]:
    """A broker of its own whose topics live in a fresh bucket of the test S3 server."""
    bucket = f"tansu-{uuid.uuid4().hex[:10]}"
    make_bucket(s3_endpoint, bucket)
    broker = start_broker(storage_engine=f"s3://{bucket}/", env=client_env(s3_endpoint))
    try:
        yield broker
    finally:
        broker.stop()


def readyz(base: str) -> tuple[int, str]:
    status, body = http_get(base + "/readyz")
    return status, json.loads(body).get("status", "")


def resolved_bounds(records, parts: int) -> list[int]:
    """Cut ``records`` into ``parts`` runs of about equal length, each ending where R moves.

    R, the global resolved ts of a prefix, is the lowest of the partitions' latest resolved events.
    Each cut is placed right after a record that raised it, so every part moves R on: the test can
    then tell the part produced after a restart applied from the part before it.
    """
    latest = dict.fromkeys(range(PARTITIONS), 0)
    moves: list[int] = []  # prefix lengths after which R is higher than one record before
    for n, rec in enumerate(records, start=1):
        before = min(latest.values())
        for ev in rec.events:
            if ev.kind == "resolved":
                latest[rec.partition] = max(latest[rec.partition], ev.commit_ts)
        if min(latest.values()) > before:
            moves.append(n)
    assert len(moves) >= parts, f"the stream moves R only {len(moves)} times, fewer than {parts} parts"
    cuts = [moves[len(moves) * k // parts - 1] for k in range(1, parts)]
    return [0, *cuts, len(records)]


def test_five_broker_restarts_lose_and_duplicate_nothing(
    durable_broker: EmbeddedBroker, downstream_url: str, mariadb_params: dict
) -> None:
    broker = durable_broker
    feed = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", downstream_url, mariadb_params)
    feed.extra_args += ["--http-listen", "127.0.0.1:0", "--log-format", "json"]
    try:
        sim = simulate(
            StreamConfig(seed=47, partitions=PARTITIONS, transactions=300, schema=feed.new_schema())
        )
        # Part 0 before the daemon starts; for each outage one part right before it (in flight when
        # the broker goes away) and one right after it (only the restarted broker can deliver it).
        bounds = resolved_bounds(sim.records, 2 * len(OUTAGES) + 1)

        def produce_part(k: int) -> int:
            """Produce part ``k``; returns the global resolved ts of the stream up to its end."""
            produce_records(broker.bootstrap, feed.topic, sim.records[bounds[k] : bounds[k + 1]])
            return global_resolved_of(sim.records[: bounds[k + 1]])

        ensure_topic(broker.bootstrap, feed.topic, PARTITIONS)
        first = produce_part(0)
        proc = feed.start()
        try:
            base = http_base(proc)
            wait_until(lambda: readyz(base)[0] == 200, 60, "/readyz 200", proc)
            wait_until(lambda: feed.checkpoint()[0] >= first, 120, "the first part applied", proc)
            resumed_in: list[float] = []
            for i, outage in enumerate(OUTAGES):
                in_flight = produce_part(2 * i + 1)
                broker.stop()
                down_at = time.monotonic()
                wait_until(
                    lambda: readyz(base) == (503, "kafka unreachable"), 60, "/readyz kafka unreachable", proc
                )
                wait_until(
                    lambda: (value(scrape(base), "applier_kafka_unreachable_seconds") or 0) > 0,
                    30,
                    "the unreachable metric",
                    proc,
                )
                time.sleep(max(0.0, outage - (time.monotonic() - down_at)))
                assert readyz(base) == (503, "kafka unreachable")  # nothing answered meanwhile
                assert proc.poll() is None, read_log(proc)[-4000:]

                broker.start()
                back_at = time.monotonic()
                target = produce_part(2 * i + 2)
                assert target > in_flight, "the part after the restart must move the resolved ts on"
                wait_until(
                    lambda target=target: feed.checkpoint()[0] >= target,
                    RESUME_WITHIN,
                    f"the part produced after outage {i + 1} ({outage:.0f} s) applied",
                    proc,
                )
                resumed_in.append(time.monotonic() - back_at)
                wait_until(lambda: readyz(base)[0] == 200, 60, "/readyz 200 after the outage", proc)
            print("\nthe part produced after each restart was applied within (s of the broker being back):")
            print(", ".join(f"{o:.0f} s down: {r:.1f}" for o, r in zip(OUTAGES, resumed_in, strict=True)))

            wait_until(
                lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 120, "the final resolved ts", proc
            )
            assert feed.compare(sim, sim.final_resolved_ts) == []
            assert proc.poll() is None, read_log(proc)[-4000:]
        finally:
            stop(proc, signal.SIGTERM)
        assert proc.returncode == 0, read_log(proc)[-4000:]
        log = read_log(proc)
        assert log.count("broker reachable again") >= len(OUTAGES), log[-4000:]
    finally:
        feed.drop()

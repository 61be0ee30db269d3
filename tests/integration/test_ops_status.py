"""``applier status`` against the real checkpoint, with the daemon stopped and while it runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from applier.codec.events import tso_physical_ms
from applier.simulator import StreamConfig, produce_simulation, simulate
from tests.integration.harness import Changefeed, stop
from tests.integration.ops_support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def feed(feed: Changefeed) -> Changefeed:
    """The suite's changefeed, its daemon without the HTTP listener: these tests do not probe it."""
    feed.extra_args += ["--http-listen", "off"]
    return feed


def status(feed: Changefeed, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "applier",
            "status",
            "--downstream",
            feed.downstream,
            "--group-id",
            feed.group_id,
            "--checkpoint-schema",
            feed.checkpoint_schema,
            *more,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def wall(ts: int) -> str:
    return datetime.fromtimestamp(tso_physical_ms(ts) / 1000, tz=UTC).isoformat(timespec="milliseconds")[:23]


def test_status_text_and_json_when_stopped_and_while_running(feed: Changefeed) -> None:
    missing = status(feed)
    assert missing.returncode == 1
    assert "no checkpoint" in missing.stdout

    sim = simulate(StreamConfig(seed=31, partitions=3, transactions=120, schema=feed.new_schema()))
    produce_simulation(feed.bootstrap, feed.topic, sim)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stderr
    resolved, offsets = feed.checkpoint()

    # Stopped: JSON for scripts.
    out = status(feed, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["found"] is True and doc["running"] is False and doc["active_instance"] is None
    assert doc["changefeed"] == feed.group_id and doc["topic"] == feed.topic
    assert doc["resolved_ts"] == resolved == sim.final_resolved_ts
    assert doc["resolved_time"].startswith(wall(resolved))
    assert doc["lag_seconds"] > 0
    assert {p["partition"]: p["next_offset"] for p in doc["partitions"]} == offsets
    tables = {(t["schema"], t["table"]) for t in doc["tables"]}
    assert {t for t in tables if t[0] == sim.schema}, tables
    for t in doc["tables"]:
        assert t["effective_ts"] >= resolved and t["checkpoint_time"].startswith(wall(t["effective_ts"]))
    assert doc["applied_ddls"] >= 1 and doc["last_ddl"]["commit_ts"] > 0
    assert doc["downstream"] == feed.downstream

    # Stopped: text for people.
    out = status(feed)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "active instance: none (stopped)" in text
    assert f"resolved ts:     {resolved}  {wall(resolved)}" in text
    for p, offset in offsets.items():
        assert any(line.split()[:2] == [str(p), str(offset)] for line in text.splitlines()), text
    for t in doc["tables"]:
        assert f"{t['schema']}.{t['table']}" in text

    # Running: the same checkpoint, and the active instance is named.
    proc = feed.start()
    try:
        running = wait_until(
            lambda: (d := json.loads(status(feed, "--json").stdout))["running"] and d,
            30,
            "status to see the running daemon",
            proc,
        )
        assert running["active_instance"]["connection_id"] > 0
        assert running["resolved_ts"] == resolved
        text = status(feed).stdout
        assert "active instance: yes (database connection" in text
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0


def test_status_of_an_unreachable_database_is_one_clear_line(feed: Changefeed) -> None:
    feed.downstream = "mysql://root:hunter2-status@127.0.0.1:1/"
    out = status(feed)
    assert out.returncode == 2
    assert out.stderr.startswith("applier status: cannot reach the downstream database")
    assert "hunter2-status" not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr

"""sd_notify end to end: the real daemon talks to a datagram socket this test owns, as systemd would."""

from __future__ import annotations

import itertools
import signal
import threading
import time

import pytest

from applier.simulator import StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from tests.integration.harness import Changefeed, read_log, stop
from tests.integration.ops_support import wait_until
from tests.notify_socket import bind_notify_socket

pytestmark = pytest.mark.integration


class NotifySocket:
    """A bound AF_UNIX datagram socket collecting (monotonic time, message) pairs on a thread."""

    def __init__(self, abstract: bool = False) -> None:
        self.sock, self.env_value = bind_notify_socket(abstract)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic()
            for line in data.decode().splitlines():
                self.messages.append((now, line))

    def lines(self) -> list[str]:
        return [m for _, m in self.messages]

    def first(self, message: str) -> float | None:
        return next((t for t, m in self.messages if m == message), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def feed(feed: Changefeed) -> Changefeed:
    """The suite's changefeed, its daemon without the HTTP listener: these tests do not probe it."""
    feed.extra_args += ["--http-listen", "off"]
    return feed


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_watchdog_while_applying_and_stopping_on_sigterm(
    feed: Changefeed, monkeypatch: pytest.MonkeyPatch, abstract: bool
) -> None:
    notify = NotifySocket(abstract=abstract)
    monkeypatch.setenv("NOTIFY_SOCKET", notify.env_value)
    monkeypatch.setenv("WATCHDOG_USEC", "1500000")  # 1.5 s: the daemon pings every 0.5 s
    sim = simulate(StreamConfig(seed=21, partitions=2, transactions=240, schema=feed.new_schema()))
    ensure_topic(feed.bootstrap, feed.topic, 2)
    proc = feed.start()
    try:
        wait_until(lambda: notify.first("READY=1"), 30, "READY=1", proc)
        ready_at = notify.first("READY=1")
        assert ready_at is not None
        assert not [m for t, m in notify.messages if m == "WATCHDOG=1" and t < ready_at]
        assert any(m.startswith("STATUS=") for m in notify.lines())
        # Apply the stream in slices while watching the watchdog pings arrive.
        applied_before = feed.checkpoint()[0]
        step = max(1, len(sim.records) // 4)
        for i in range(0, len(sim.records), step):
            produce_records(feed.bootstrap, feed.topic, sim.records[i : i + step])
            time.sleep(0.5)
        wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 60, "the final checkpoint", proc)
        assert feed.checkpoint()[0] > applied_before
        pings = [t for t, m in notify.messages if m == "WATCHDOG=1"]
        assert len(pings) >= 4, notify.lines()
        # Never a gap in which systemd would have killed the daemon.
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert max(gaps) < 1.5, gaps
        wait_until(
            lambda: [m for m in notify.lines() if m.startswith("STATUS=active: applied up to ts")],
            10,
            "a STATUS with the applied ts and the lag",
            proc,
        )
        assert "STOPPING=1" not in notify.lines()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        assert time.monotonic() - sent < 10  # fits TimeoutStopSec with a wide margin
        assert proc.returncode == 0, read_log(proc)
        stopping_at = notify.first("STOPPING=1")
        assert stopping_at is not None, notify.lines()
        assert stopping_at >= sent - 0.1
    finally:
        stop(proc)
        notify.close()


def test_standby_reports_ready_and_is_kept_alive(feed: Changefeed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby completed its start-up: READY=1, a STATUS saying so, and watchdog pings while it waits."""
    ensure_topic(feed.bootstrap, feed.topic, 1)
    active = feed.start()
    notify = NotifySocket()
    try:
        wait_until(lambda: "started" in read_log(active), 30, "the active instance", active)
        monkeypatch.setenv("NOTIFY_SOCKET", notify.env_value)
        monkeypatch.setenv("WATCHDOG_USEC", "600000")
        standby = feed.start()
        try:
            wait_until(lambda: notify.first("READY=1"), 30, "READY=1 from the standby", standby)
            assert any(m.startswith("STATUS=standby") for m in notify.lines())
            t0 = time.monotonic()
            wait_until(
                lambda: sum(1 for t, m in notify.messages if m == "WATCHDOG=1" and t > t0) >= 3,
                10,
                "watchdog pings from the waiting standby",
                standby,
            )
        finally:
            stop(standby, signal.SIGTERM)
        assert standby.returncode == 0
        assert notify.first("STOPPING=1") is not None
    finally:
        stop(active, signal.SIGTERM)
        notify.close()


def test_nothing_is_sent_without_watchdog_usec(feed: Changefeed, monkeypatch: pytest.MonkeyPatch) -> None:
    """READY/STATUS/STOPPING go out under systemd, but no WATCHDOG=1 unless the watchdog is on."""
    notify = NotifySocket()
    monkeypatch.setenv("NOTIFY_SOCKET", notify.env_value)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    ensure_topic(feed.bootstrap, feed.topic, 1)
    try:
        done = feed.run_to_end(timeout=60)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: notify.first("READY=1"), 5, "READY=1")
        assert "WATCHDOG=1" not in notify.lines()
    finally:
        notify.close()

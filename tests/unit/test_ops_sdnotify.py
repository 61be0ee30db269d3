"""applier.ops.sdnotify: datagrams to the systemd notify socket (path and abstract), the watchdog settings
and the READY/STATUS/WATCHDOG/STOPPING protocol, received on a real socket.
"""

from __future__ import annotations

import os
import time

import pytest

from applier.ops.health import Health
from applier.ops.metrics import tso_seconds
from applier.ops.observer import WindowApplied
from applier.ops.sdnotify import Notifier, SystemdObserver
from tests.notify_socket import bind_notify_socket
from tests.unit.ops_fakes import TS, Clock, FakeBarrier, FakeReader, window


class Receiver:
    """The notify socket, read without blocking: ``drain`` returns the lines received so far."""

    def __init__(self, abstract: bool) -> None:
        self.sock, self.env = bind_notify_socket(abstract)
        self.sock.setblocking(False)

    def drain(self) -> list[str]:
        out: list[str] = []
        while True:
            try:
                out += self.sock.recv(4096).decode().splitlines()
            except BlockingIOError:
                return out


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notifier_sends_datagrams_to_path_and_abstract_sockets(abstract: bool) -> None:
    rx = Receiver(abstract)
    n = Notifier({"NOTIFY_SOCKET": rx.env})
    assert n.enabled and n.send("READY=1", "STATUS=hello")
    time.sleep(0.05)
    assert rx.drain() == ["READY=1", "STATUS=hello"]
    n.close()


def test_nothing_happens_without_notify_socket() -> None:
    n = Notifier({})
    assert not n.enabled and n.watchdog_seconds is None
    assert n.send("READY=1") is False
    obs = SystemdObserver(n, Health())
    obs.on_ready()
    obs.stopping()
    obs.start()
    assert obs._keepalive is None  # no thread either


def test_watchdog_settings_come_from_the_environment() -> None:
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "30000000"}).watchdog_seconds == 30
    pid = str(os.getpid())
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": pid}).watchdog_seconds
    assert (
        Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}).watchdog_seconds
        is None
    )
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "0"}).watchdog_seconds is None


def test_systemd_observer_protocol() -> None:
    rx = Receiver(abstract=True)
    clock = Clock()
    health = Health(stall_seconds=30, clock=clock)
    obs = SystemdObserver(
        Notifier({"NOTIFY_SOCKET": rx.env, "WATCHDOG_USEC": "3000000"}),
        health,
        clock=clock,
        wall=lambda: tso_seconds(TS) + 2,
    )
    observers = [health, obs]

    def call(name: str, *args: object) -> None:
        for o in observers:
            getattr(o, name)(*args)

    call("on_state", "starting")
    call("on_state", "active")
    call("on_tick", FakeBarrier(), FakeReader(), True)
    assert "WATCHDOG=1" not in rx.drain()  # never before READY=1
    call("on_ready")
    msgs = rx.drain()
    assert msgs[0] == "READY=1" and msgs[1].startswith("STATUS=active") and "WATCHDOG=1" in msgs
    call("on_window", WindowApplied(window(TS), 0.1, {("d", "t", "insert"): 7}))
    clock.now += 5
    call("on_tick", FakeBarrier(TS), FakeReader(), True)
    msgs = rx.drain()
    assert "WATCHDOG=1" in msgs
    assert f"STATUS=active: applied up to ts {TS}, lag 2.0s, 7 rows applied" in msgs
    # Stalled: no progress, not at the end, for longer than stall_seconds -> no more pings.
    clock.now += 31
    call("on_tick", FakeBarrier(TS), FakeReader(), False)
    clock.now += 2
    call("on_tick", FakeBarrier(TS), FakeReader(), False)
    assert "WATCHDOG=1" not in rx.drain()
    obs.stopping()
    call("on_state", "stopping")
    msgs = rx.drain()
    assert msgs.count("STOPPING=1") == 1


def test_a_standby_is_ready_and_kept_alive_by_the_helper_thread() -> None:
    rx = Receiver(abstract=False)
    health = Health()
    obs = SystemdObserver(Notifier({"NOTIFY_SOCKET": rx.env, "WATCHDOG_USEC": "150000"}), health)
    obs.start()
    try:
        for o in (health, obs):
            o.on_state("standby")
        time.sleep(0.5)
        msgs = rx.drain()
        assert msgs[:2] == ["READY=1", "STATUS=standby: another instance is active; waiting to take over"]
        assert msgs.count("WATCHDOG=1") >= 3
        # Active with a running loop: the helper thread is silent (only the loop's ticks ping).
        for o in (health, obs):
            o.on_state("active")
            o.on_ready()
        rx.drain()
        time.sleep(0.4)
        assert "WATCHDOG=1" not in rx.drain()
    finally:
        obs.close()


def test_a_waiting_start_up_says_why_and_extends_the_start_timeout_without_ready() -> None:
    rx = Receiver(abstract=True)
    health = Health(clock=Clock())
    obs = SystemdObserver(Notifier({"NOTIFY_SOCKET": rx.env, "WATCHDOG_USEC": "3000000"}), health)
    for o in (health, obs):
        o.on_waiting("waiting for the downstream database: (2003) cannot reach it")
    assert rx.drain() == [
        "STATUS=starting: waiting for the downstream database: (2003) cannot reach it",
        f"EXTEND_TIMEOUT_USEC={SystemdObserver.WAIT_EXTEND_SECONDS * 1_000_000}",
    ]
    for o in (health, obs):
        o.on_waiting(None)
    assert rx.drain() == []
    obs.on_ready()
    assert rx.drain()[0] == "READY=1"

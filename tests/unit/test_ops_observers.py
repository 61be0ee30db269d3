"""Health, metrics, sd_notify and the HTTP endpoints, driven through the observer hooks with fakes."""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

import pymysql
import pytest
from prometheus_client.parser import text_string_to_metric_families

from applier.downstream.watch import Blocker, StatementWait
from applier.ops.health import Health
from applier.ops.http import HttpEndpoints, HttpListenError, split_listen
from applier.ops.metrics import MetricsObserver, tso_seconds
from applier.ops.sdnotify import Notifier, SystemdObserver
from applier.stream.window import Window

TS = (1_700_000_000_000 << 18) + 5  # physical time 1_700_000_000.000 s


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeListener:
    resolved: int
    last_offset: int | None
    cached_bytes: int


@dataclass
class FakeBarrier:
    applied_ts: int = 0
    listeners: dict[int, FakeListener] = field(default_factory=dict)

    def global_resolved(self) -> int:
        return min(lst.resolved for lst in self.listeners.values())


@dataclass
class FakeReader:
    at_end: bool = False
    paused: frozenset[int] = frozenset()

    def all_at_end(self) -> bool:
        return self.at_end


def window(ts: int, ddl: object | None = None) -> Window:
    return Window(ts, [], ddl, {0: 10, 1: None}, {0: ts}, frozenset(), ts - 1)  # type: ignore[arg-type]


# -- health ---------------------------------------------------------------------------------------


def test_health_lifecycle_alive_and_ready() -> None:
    clock = Clock()
    h = Health(stall_seconds=30, loop_timeout=10, clock=clock)
    assert h.alive().ok and not h.ready().ok and h.ready().status == "starting"
    h.on_state("standby")
    assert h.alive().ok and h.alive().status == "standby"
    ready = h.ready()
    assert (
        not ready.ok and ready.status == "standby" and ready.detail["reason"] == "another instance is active"
    )
    h.on_state("active")
    assert h.alive().ok and not h.ready().ok  # taking over: not ready before the checkpoint is loaded
    h.on_ready()
    assert h.ready().ok
    # Progress keeps it ready; nothing read for longer than stall_seconds while not at the end: stalled.
    clock.now += 5
    h.on_tick(FakeBarrier(), FakeReader(), progressed=True)
    clock.now += 31
    h.on_tick(FakeBarrier(), FakeReader(), progressed=False)
    assert h.alive().ok and h.ready().status == "stalled" and not h.waiting_healthily()
    # Caught up (every partition at its end) is healthy waiting, not a stall.
    h.on_tick(FakeBarrier(), FakeReader(at_end=True), progressed=False)
    clock.now += 100
    h.on_tick(FakeBarrier(), FakeReader(at_end=True), progressed=False)
    assert h.ready().ok and h.waiting_healthily()


def test_health_retries_are_reported_after_retry_report_seconds_until_a_window_commits() -> None:
    clock = Clock()
    h = Health(clock=clock, retry_report_seconds=60)
    h.on_state("active")
    h.on_ready()
    h.on_apply_start(window(TS))
    h.on_retry(pymysql.err.OperationalError(1213, "Deadlock found"))
    assert h.ready().ok  # one deadlock, replayed at once: normal operation
    clock.now += 59
    h.on_retry(pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"))
    assert h.ready().ok and h.ready().detail["failing_for_seconds"] == 59
    clock.now += 1
    r = h.ready()
    assert not r.ok and r.status == "retrying"
    assert r.detail["reason"] == (
        "no downstream transaction committed for 60 s: transient errors replayed "
        "(deadlock=1, lock_wait=1), last (1205) Lock wait timeout exceeded"
    )
    assert h.alive().ok  # waiting for the database is alive: no restart
    h.on_window(window(TS), 60, {})
    assert h.ready().ok and h.ready().detail["applied_ts"] == TS
    assert h.ready().detail["failing_for_seconds"] is None


def test_health_a_lock_wait_longer_than_stall_seconds_is_not_ready() -> None:
    clock = Clock()
    h = Health(stall_seconds=30, clock=clock)
    h.on_state("active")
    h.on_ready()
    h.on_apply_start(window(TS))
    blocker = Blocker(42, "app", "10.0.0.7:5123", "Sleep", 75, None, None)
    wait = StatementWait(
        1,
        17,
        "ALTER TABLE db.t ADD c INT",
        "metadata",
        "Waiting for table metadata lock",
        clock.now - 5,
        (blocker,),
    )
    h.on_statement_waits([wait])
    assert h.ready().ok
    clock.now += 26
    r = h.ready()
    assert not r.ok and r.status == "waiting on a lock"
    assert r.detail["reason"] == (
        "a statement has waited 31 s on a metadata lock (ALTER TABLE db.t ADD c INT); blocked by session 42 "
        "(app@10.0.0.7:5123, command Sleep, 75 s, idle in an open transaction)"
    )
    h.on_statement_waits([])
    assert h.ready().ok


def test_health_a_long_apply_is_alive_a_stuck_loop_is_not() -> None:
    clock = Clock()
    h = Health(stall_seconds=30, loop_timeout=10, clock=clock)
    h.on_state("active")
    h.on_ready()
    h.on_apply_start(window(TS))
    clock.now += 3600  # an ALTER TABLE running for an hour
    assert h.alive().ok and h.alive().status == "applying" and h.waiting_healthily()
    h.on_window(window(TS), 3600, {})
    h.on_tick(FakeBarrier(), FakeReader(), progressed=True)
    clock.now += 11
    alive = h.alive()
    assert not alive.ok and alive.status == "loop stuck"
    h.on_error("ApplyError")
    h.on_state("failed")
    assert not h.alive().ok and h.alive().detail["error"] == "ApplyError"


# -- metrics --------------------------------------------------------------------------------------


def _samples(m: MetricsObserver) -> dict:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_follow_the_hooks_and_the_naming_conventions() -> None:
    clock = Clock(tso_seconds(TS) + 12.5)
    m = MetricsObserver(clock=clock, process_metrics=False)
    s = _samples(m)
    assert math.isnan(s[("applier_lag_seconds", ())])  # nothing applied yet
    assert s[("applier_state", (("applier_state", "starting"),))] == 1
    m.on_state("active")
    m.on_ready()
    m.on_window(
        window(TS), 0.2, {("db", "t", "insert"): 3, ("db", "t", "delete"): 1, ("db", "u", "replace"): 0}
    )
    m.on_window(window(TS + 10, ddl=object()), 1.5, {})
    m.on_retry(TimeoutError("x"))
    m.on_retry(pymysql.err.OperationalError(1213, "Deadlock found"))
    barrier = FakeBarrier(TS + 10, {0: FakeListener(TS + 20, 41, 1024), 1: FakeListener(TS + 30, None, 0)})
    m.on_tick(barrier, FakeReader(paused=frozenset({1})), progressed=True)  # type: ignore[arg-type]
    m.on_error("ApplyError")
    s = _samples(m)
    assert s[("applier_rows_applied_total", (("op", "insert"), ("schema", "db"), ("table", "t")))] == 3
    assert s[("applier_rows_applied_total", (("op", "delete"), ("schema", "db"), ("table", "t")))] == 1
    assert ("applier_rows_applied_total", (("op", "replace"), ("schema", "db"), ("table", "u"))) not in s
    assert s[("applier_transactions_total", ())] == 2
    assert s[("applier_ddls_applied_total", ())] == 1
    assert s[("applier_batch_seconds_count", ())] == 2 and s[("applier_batch_seconds_sum", ())] == 1.7
    assert s[("applier_downstream_retries_total", (("class", "connection"),))] == 1
    assert s[("applier_downstream_retries_total", (("class", "deadlock"),))] == 1
    assert s[("applier_errors_total", (("kind", "ApplyError"),))] == 1
    assert s[("applier_checkpoint_ts", ())] == float(TS + 10)
    assert s[("applier_checkpoint_timestamp_seconds", ())] == pytest.approx(tso_seconds(TS))
    assert s[("applier_lag_seconds", ())] == pytest.approx(12.5, abs=0.01)
    assert s[("applier_global_resolved_ts", ())] == float(TS + 20)
    assert s[("applier_partition_resolved_ts", (("partition", "1"),))] == float(TS + 30)
    assert s[("applier_partition_read_offset", (("partition", "0"),))] == 41
    assert ("applier_partition_read_offset", (("partition", "1"),)) not in s  # nothing read yet
    assert s[("applier_partition_checkpoint_offset", (("partition", "0"),))] == 10
    assert s[("applier_partition_cached_bytes", (("partition", "0"),))] == 1024
    assert s[("applier_partition_paused", (("partition", "1"),))] == 1
    assert s[("applier_active", ())] == 1 and s[("applier_ready", ())] == 1
    m.on_state("standby")
    s = _samples(m)
    assert s[("applier_state", (("applier_state", "standby"),))] == 1
    assert s[("applier_state", (("applier_state", "active"),))] == 0
    assert s[("applier_active", ())] == 0
    # Conventions: prefix; counters end in _total; the only time/size units are seconds and bytes.
    families = list(text_string_to_metric_families(m.render().decode()))
    for f in families:
        assert f.name.startswith("applier_"), f.name
        if f.type == "counter":
            assert any(x.name == f.name + "_total" for x in f.samples), f.name
        assert not any(unit in f.name for unit in ("_ms", "milli", "_kb", "_mb")), f.name
    with_process = MetricsObserver()
    assert "process_resident_memory_bytes" in with_process.render().decode()


def test_failing_and_lock_wait_gauges_grow_until_the_trouble_ends() -> None:
    mono = Clock(500.0)
    m = MetricsObserver(clock=Clock(), monotonic=mono, process_metrics=False)
    s = _samples(m)
    assert s[("applier_downstream_failing_seconds", ())] == 0 and s[("applier_lock_wait_seconds", ())] == 0
    m.on_retry(pymysql.err.OperationalError(2013, "Lost connection"))
    mono.now += 7
    m.on_retry(pymysql.err.OperationalError(2003, "Can't connect"))
    row = StatementWait(1, 17, "rows", "row", "Updating", mono.now - 4)
    mdl = StatementWait(2, 18, "DDL", "metadata", "Waiting for table metadata lock", mono.now - 1)
    m.on_statement_waits([row])
    m.on_statement_waits([row, mdl])  # the row wait goes on: counted once
    s = _samples(m)
    assert s[("applier_downstream_failing_seconds", ())] == 7
    assert s[("applier_downstream_retries_total", (("class", "connection"),))] == 2
    assert s[("applier_lock_wait_seconds", ())] == 4
    assert s[("applier_lock_waits_total", (("kind", "row"),))] == 1
    assert s[("applier_lock_waits_total", (("kind", "metadata"),))] == 1
    m.on_statement_waits([])
    m.on_window(window(TS), 7, {})
    s = _samples(m)
    assert s[("applier_downstream_failing_seconds", ())] == 0 and s[("applier_lock_wait_seconds", ())] == 0


def test_the_lag_keeps_growing_while_nothing_is_applied() -> None:
    clock = Clock(tso_seconds(TS) + 1)
    m = MetricsObserver(clock=clock, process_metrics=False)
    m.on_window(window(TS), 0.01, {})
    assert _samples(m)[("applier_lag_seconds", ())] == pytest.approx(1)
    clock.now += 60
    assert _samples(m)[("applier_lag_seconds", ())] == pytest.approx(61)


# -- sd_notify ------------------------------------------------------------------------------------


class Receiver:
    def __init__(self, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"applier-unit-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.env = "@" + name
        else:
            self.env = os.path.join(tempfile.mkdtemp(), "notify")
            self.sock.bind(self.env)
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
    call("on_window", window(TS), 0.1, {("d", "t", "insert"): 7})
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


# -- http -------------------------------------------------------------------------------------------


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

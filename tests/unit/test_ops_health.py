"""applier.ops.health: liveness and readiness through the observer hooks (start-up, standby, stalls,
retries, lock waits, long applies), on a settable clock so that every threshold is crossed exactly.
"""

from __future__ import annotations

import pymysql

from applier.downstream.watch import Blocker, StatementWait
from applier.ops.health import Health
from applier.ops.observer import WindowApplied
from tests.unit.ops_fakes import TS, Clock, FakeBarrier, FakeReader, window


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


def _applying(clock: Clock, **settings: float) -> Health:
    """The health of an active, ready instance that has started applying the window at TS: where
    retries, lock waits and long applies happen."""
    h = Health(clock=clock, **settings)
    h.on_state("active")
    h.on_ready()
    h.on_apply_start(window(TS))
    return h


def _not_ready_for(h: Health, status: str) -> str:
    """The reason readiness gives, once it is checked to say not ready with ``status``."""
    r = h.ready()
    assert not r.ok and r.status == status, r
    return r.detail["reason"]


def test_health_retries_are_reported_after_retry_report_seconds_until_a_window_commits() -> None:
    clock = Clock()
    h = _applying(clock, retry_report_seconds=60)
    h.on_retry(pymysql.err.OperationalError(1213, "Deadlock found"))
    assert h.ready().ok  # one deadlock, replayed at once: normal operation
    clock.now += 59
    h.on_retry(pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"))
    assert h.ready().ok and h.ready().detail["failing_for_seconds"] == 59
    clock.now += 1
    assert _not_ready_for(h, "retrying") == (
        "no downstream transaction committed for 60 s: transient errors replayed "
        "(deadlock=1, lock_wait=1), last (1205) Lock wait timeout exceeded"
    )
    assert h.alive().ok  # waiting for the database is alive: no restart
    h.on_window(WindowApplied(window(TS), 60, {}))
    assert h.ready().ok and h.ready().detail["applied_ts"] == TS
    assert h.ready().detail["failing_for_seconds"] is None


def test_health_transient_errors_the_start_up_rode_out_end_with_it() -> None:
    """A read-only downstream at start: the start-up retries (counted, not ready as "starting");
    once ready, they are over, also when no window follows for a long time."""
    clock = Clock()
    h = Health(clock=clock, retry_report_seconds=60)
    h.on_state("active")
    h.on_retry(
        pymysql.err.OperationalError(1290, "The MariaDB server is running with the --read-only option")
    )
    clock.now += 120
    assert h.ready().status == "active" and h.retries == {"read_only": 1}
    h.on_ready()
    clock.now += 120
    h.on_tick(FakeBarrier(), FakeReader(at_end=True), progressed=False)
    assert h.ready().ok and h.ready().detail["failing_for_seconds"] is None


def test_health_a_lock_wait_longer_than_stall_seconds_is_not_ready() -> None:
    clock = Clock()
    h = _applying(clock, stall_seconds=30)
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
    assert _not_ready_for(h, "waiting on a lock") == (
        "a statement has waited 31 s on a metadata lock (ALTER TABLE db.t ADD c INT); blocked by session 42 "
        "(app@10.0.0.7:5123, command Sleep, 75 s, idle in an open transaction)"
    )
    h.on_statement_waits([])
    assert h.ready().ok


def test_health_a_long_apply_is_alive_a_stuck_loop_is_not() -> None:
    clock = Clock()
    h = _applying(clock, stall_seconds=30, loop_timeout=10)
    for _ in range(360):  # an ALTER TABLE running for an hour on the apply thread; the loop ticks
        clock.now += 10
        h.on_tick(FakeBarrier(), FakeReader(), progressed=False)  # read-ahead full: nothing read
    assert h.alive().ok and h.alive().status == "applying" and h.waiting_healthily()
    assert h.ready().ok
    h.on_window(WindowApplied(window(TS), 3600, {}))
    h.on_tick(FakeBarrier(), FakeReader(), progressed=True)
    clock.now += 11
    alive = h.alive()
    assert not alive.ok and alive.status == "loop stuck"
    h.on_error("ApplyError")
    h.on_state("failed")
    assert not h.alive().ok and h.alive().detail["error"] == "ApplyError"


def test_health_is_unready_while_no_kafka_broker_is_reachable() -> None:
    clock = Clock()
    h = Health(clock=clock)
    h.on_state("active")
    h.on_ready()
    h.on_tick(FakeBarrier(), FakeReader(at_end=True), progressed=False)
    assert h.ready().ok
    down = FakeReader(at_end=True, unreachable_since=clock.now, last_kafka_error="b/1: Connection refused")
    clock.now += 8
    h.on_tick(FakeBarrier(), down, progressed=False)
    r = h.ready()
    assert not r.ok and r.status == "kafka unreachable"
    assert r.detail["reason"] == "no Kafka broker reachable for 8 s; last error: b/1: Connection refused"
    assert h.alive().ok  # waiting for the broker is alive: no restart
    h.on_tick(FakeBarrier(), FakeReader(at_end=True), progressed=False)
    assert h.ready().ok


def test_health_says_what_the_start_up_waits_for_and_since_when() -> None:
    clock = Clock()
    h = Health(clock=clock)
    h.on_waiting("waiting for Kafka (topic 't'): topic 't' does not exist")
    clock.now += 30
    h.on_waiting("waiting for Kafka (topic 't'): topic 't' does not exist")
    verdict = h.ready()
    assert h.alive().ok and not verdict.ok and verdict.status == "waiting"
    assert verdict.detail["reason"] == "waiting for Kafka (topic 't'): topic 't' does not exist (for 30 s)"
    h.on_waiting(None)
    assert h.ready().status == "starting"
    h.on_state("active")
    h.on_ready()
    assert h.ready().ok

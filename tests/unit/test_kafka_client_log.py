"""librdkafka's messages in the structured log: first occurrence logged, repeats counted and summarised
at most once per interval, levels mapped, unreachability and recovery logged once each."""

from __future__ import annotations

import json
import logging

from confluent_kafka import KafkaError

from applier.kafka.client_log import KafkaClientLog, broker_of, log_method
from tests.unit.ops_fakes import Clock

REFUSED = (
    "127.0.0.1:9092/1: Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)"
)


class Recorder:
    """A structlog-like logger that keeps (method, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, method: str):
        return lambda event, **kw: self.lines.append((method, event, kw))


def client(interval: float = 30.0) -> tuple[KafkaClientLog, Recorder, Clock]:
    rec, clock = Recorder(), Clock(100.0)
    return KafkaClientLog(rec, summary_seconds=interval, clock=clock), rec, clock


def transport(text: str = REFUSED) -> KafkaError:
    return KafkaError(KafkaError._TRANSPORT, text)


def stats(*states: str) -> str:
    return json.dumps({"brokers": {f"b{i}": {"state": s} for i, s in enumerate(states)}})


def test_the_first_occurrence_is_one_event_and_repeats_one_summary_per_interval() -> None:
    log, rec, clock = client(30)
    for _ in range(100):  # every 50 ms for 5 s: one line
        log.on_error(transport())
        clock.now += 0.05
    assert [(m, e) for m, e, _ in rec.lines] == [("warning", "kafka: " + REFUSED)]
    assert rec.lines[0][2] == {"kind": "_TRANSPORT", "broker": "127.0.0.1:9092/1"}
    clock.now = 131.0
    log.on_error(transport())  # the interval is over: the count so far, in one summary
    method, event, kw = rec.lines[-1]
    assert (method, kw["repeats"], kw["kind"]) == ("warning", 100, "_TRANSPORT")
    assert event == "kafka: _TRANSPORT repeated 100 times in 31 s"
    for _ in range(10):
        log.on_error(transport())
    assert len(rec.lines) == 2  # the next summary waits for the next interval


def test_a_due_summary_is_logged_by_tick_and_a_condition_quiet_for_an_interval_is_news_again() -> None:
    log, rec, clock = client(30)
    log.on_error(transport())
    log.on_error(transport())
    log.tick()
    assert len(rec.lines) == 1
    clock.now += 30
    log.tick()
    assert rec.lines[-1][2]["repeats"] == 1
    clock.now += 30
    log.tick()  # nothing came meanwhile: no summary, and the condition is forgotten
    assert len(rec.lines) == 2
    log.on_error(transport())
    assert rec.lines[-1][1] == "kafka: " + REFUSED


def test_conditions_are_told_apart_by_kind_and_broker() -> None:
    log, rec, _ = client()
    log.on_error(transport())
    log.on_error(transport(REFUSED.replace("/1:", "/bootstrap:")))
    log.on_log(logging.WARNING, "REQTMOUT", "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Timed out 1 requests")
    log.on_error(transport())
    assert [kw["broker"] for _, _, kw in rec.lines] == [
        "127.0.0.1:9092/1",
        "127.0.0.1:9092/bootstrap",
        "127.0.0.1:9092/1",
    ]
    assert rec.lines[2][1] == "kafka: 127.0.0.1:9092/1: Timed out 1 requests"  # thread prefix dropped


def test_levels_follow_librdkafka() -> None:
    assert [log_method(level) for level in (50, 40, 30, 20, 10)] == [
        "error",
        "error",
        "warning",
        "info",
        "debug",
    ]
    log, rec, _ = client()
    log.on_log(logging.INFO, "CONFWARN", "Configuration property x is ignored")
    log.on_log(logging.ERROR, "FAIL", "[thrd:b/1]: " + REFUSED)  # the twin of an error event
    log.on_error(KafkaError(KafkaError._FATAL, "fatal idempotence error", fatal=True))
    assert [m for m, _, _ in rec.lines] == ["info", "debug", "error"]


def test_the_log_handler_reads_what_confluent_kafka_passes() -> None:
    log, rec, _ = client()
    log.logger.log(logging.ERROR, "%s [%s] %s", "SASL", "ticdc-applier#consumer-1", "b/1: auth failed")
    assert rec.lines == [("error", "kafka: b/1: auth failed", {"kind": "SASL"})]


def test_unreachable_until_a_broker_is_up_again_each_said_once() -> None:
    log, rec, clock = client()
    log.on_stats(stats("UP"))  # reachable: statistics are not even read
    log.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert log.unreachable_since == 100.0
    assert rec.lines[-1][1] == "kafka: no broker reachable; the client retries until one answers"
    for _ in range(50):
        clock.now += 0.1
        log.on_error(transport())
        log.on_stats(stats("INIT", "DOWN", "CONNECT"))
        log.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert log.unreachable_since == 100.0
    assert len(rec.lines) == 2  # the outage and the first refused connection
    clock.now = 108.0
    log.on_stats(stats("INIT", "UP"))
    assert log.unreachable_since is None
    method, event, kw = rec.lines[-1]
    assert (method, event) == ("info", "kafka: broker reachable again after 8.0 s")
    assert kw == {
        "unreachable_seconds": 8.0,
        "repeats": {"_TRANSPORT 127.0.0.1:9092/1": 49, "_ALL_BROKERS_DOWN": 50},
    }
    log.on_stats(stats("UP"))
    assert len(rec.lines) == 3  # recovery said once
    log.on_error(transport())  # a new outage's first failure is news again
    assert rec.lines[-1][1] == "kafka: " + REFUSED


def test_quiet_clients_log_nothing_but_keep_the_last_error() -> None:
    rec = Recorder()
    log = KafkaClientLog(rec, quiet=True)
    log.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    log.on_error(transport())
    log.on_log(logging.ERROR, "FAIL", REFUSED)
    log.on_stats(stats("UP"))
    assert rec.lines == [] and log.last_error == REFUSED and log.unreachable_since is None


def test_install_sets_the_callbacks_and_keeps_statistics_on() -> None:
    log, _, _ = client()
    conf = log.install({"bootstrap.servers": "b:9092"})
    assert conf["logger"] is log.logger and conf["error_cb"] == log.on_error
    assert conf["statistics.interval.ms"] == 1000
    assert log.install({"statistics.interval.ms": "0"})["statistics.interval.ms"] == 1000
    assert log.install({"statistics.interval.ms": 5000})["statistics.interval.ms"] == 5000


def test_librdkafka_s_debug_setting_asks_for_every_debug_line() -> None:
    """Debug lines are conditions like any other, unless the operator set librdkafka's ``debug``
    contexts: then the trace is what was asked for, line by line (warnings are still summarised)."""
    log, rec, _ = client()
    log.install({"bootstrap.servers": "b:9092"})
    for i in range(3):
        log.on_log(logging.DEBUG, "CONF", f"Client configuration: setting{i} = x")
    assert len(rec.lines) == 1
    log, rec, _ = client()
    log.install({"bootstrap.servers": "b:9092", "debug": "conf"})
    for i in range(3):
        log.on_log(logging.DEBUG, "CONF", f"Client configuration: setting{i} = x")
    assert [e for _, e, _ in rec.lines] == [f"kafka: Client configuration: setting{i} = x" for i in range(3)]
    for _ in range(3):
        log.on_error(transport())
    assert len(rec.lines) == 4


def test_broker_names() -> None:
    assert broker_of(REFUSED) == "127.0.0.1:9092/1"
    assert broker_of("sasl_ssl://kafka-1:9093/2: Disconnected") == "sasl_ssl://kafka-1:9093/2"
    assert broker_of("[::1]:9092/bootstrap: Connect failed") == "[::1]:9092/bootstrap"
    assert broker_of("GroupCoordinator: b:9092: Connect failed") == "GroupCoordinator"
    assert broker_of("1/1 brokers are down") is None

"""applier.ops.metrics: the Prometheus families follow the observer hooks and the naming conventions,
read back through the text exposition format the scraper sees.
"""

from __future__ import annotations

import math

import pymysql
import pytest
from prometheus_client.parser import text_string_to_metric_families

from applier.downstream.watch import StatementWait
from applier.ops.metrics import MetricsObserver, tso_seconds
from applier.ops.observer import WindowApplied
from checkpoint import JournalEntry
from tests.builders import ddl_event
from tests.unit.ops_fakes import TS, Clock, FakeBarrier, FakeListener, FakeReader, window


def _samples(m: MetricsObserver) -> dict:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _histogram(m: MetricsObserver, name: str) -> tuple[float, float, dict[str, float]]:
    """A histogram's count, sum and cumulative buckets (by their ``le``)."""
    s = _samples(m)
    buckets = {dict(labels)["le"]: v for (n, labels), v in s.items() if n == f"{name}_bucket"}
    return s[(f"{name}_count", ())], s[(f"{name}_sum", ())], buckets


def test_metrics_follow_the_hooks_and_the_naming_conventions() -> None:
    clock = Clock(tso_seconds(TS) + 12.5)
    m = MetricsObserver(clock=clock, process_metrics=False)
    s = _samples(m)
    assert math.isnan(s[("applier_lag_seconds", ())])  # nothing applied yet
    assert s[("applier_state", (("applier_state", "starting"),))] == 1
    m.on_state("active")
    m.on_ready()
    m.on_window(
        WindowApplied(
            window(TS), 0.2, {("db", "t", "insert"): 3, ("db", "t", "delete"): 1, ("db", "u", "replace"): 0}
        )
    )
    m.on_window(WindowApplied(window(TS + 10, ddl=object()), 1.5, {}))
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
    assert s[("applier_window_rows_count", ())] == 1 and s[("applier_window_rows_sum", ())] == 4
    assert s[("applier_window_rows_bucket", (("le", "1.0"),))] == 0
    assert s[("applier_window_rows_bucket", (("le", "10.0"),))] == 1
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
    m.on_window(WindowApplied(window(TS), 7, {}))
    s = _samples(m)
    assert s[("applier_downstream_failing_seconds", ())] == 0 and s[("applier_lock_wait_seconds", ())] == 0


def test_the_lag_keeps_growing_while_nothing_is_applied() -> None:
    clock = Clock(tso_seconds(TS) + 1)
    m = MetricsObserver(clock=clock, process_metrics=False)
    m.on_window(WindowApplied(window(TS), 0.01, {}))
    assert _samples(m)[("applier_lag_seconds", ())] == pytest.approx(1)
    clock.now += 60
    assert _samples(m)[("applier_lag_seconds", ())] == pytest.approx(61)


def test_kafka_unreachable_seconds_grow_while_no_broker_answers() -> None:
    mono = Clock(500.0)
    m = MetricsObserver(monotonic=mono, process_metrics=False)
    assert _samples(m)[("applier_kafka_unreachable_seconds", ())] == 0
    barrier = FakeBarrier(TS, {0: FakeListener(TS, None, 0)})
    m.on_tick(barrier, FakeReader(unreachable_since=500.0), progressed=False)  # type: ignore[arg-type]
    mono.now += 8
    assert _samples(m)[("applier_kafka_unreachable_seconds", ())] == 8  # evaluated at scrape time
    m.on_tick(barrier, FakeReader(), progressed=False)  # type: ignore[arg-type]
    assert _samples(m)[("applier_kafka_unreachable_seconds", ())] == 0


def test_commit_lag_histogram_observes_each_row_window_at_its_commit() -> None:
    clock = Clock(tso_seconds(TS) + 30)  # the daemon's thread noticed the commits late: not used
    m = MetricsObserver(clock=clock, process_metrics=False)
    assert _samples(m)[("applier_commit_lag_seconds_count", ())] == 0  # exported before any window
    m.on_window(WindowApplied(window(TS), 0.1, {}, tso_seconds(TS) + 0.12))
    m.on_window(
        WindowApplied(window(TS + (1000 << 18)), 0.1, {}, tso_seconds(TS) + 1.45)
    )  # resolved 1 s later
    m.on_window(
        WindowApplied(window(TS + 10, ddl=object()), 0.1, {}, tso_seconds(TS) + 2)
    )  # a DDL: not a row window
    count, total, le = _histogram(m, "applier_commit_lag_seconds")
    assert (count, le["0.1"], le["0.15"], le["0.5"], le["60.0"]) == (2, 0, 1, 2, 2)
    assert total == pytest.approx(0.57)
    m.on_window(WindowApplied(window(TS), 0.1, {}))  # commit time unknown: the clock now
    assert _samples(m)[("applier_commit_lag_seconds_sum", ())] == pytest.approx(30.57)


def test_ready_to_commit_histogram_observes_the_applier_s_own_share_of_row_windows() -> None:
    m = MetricsObserver(clock=Clock(tso_seconds(TS) + 30), process_metrics=False)
    assert _samples(m)[("applier_ready_to_commit_seconds_count", ())] == 0  # exported before any window
    at = tso_seconds(TS) + 2.0
    m.on_window(WindowApplied(window(TS), 0.1, {}, at, at - 0.12))
    m.on_window(WindowApplied(window(TS + 1), 0.1, {}, at + 1, at + 0.6))
    m.on_window(
        WindowApplied(window(TS + 2), 0.1, {}, at + 2)
    )  # when it was ready is not known: not observed
    m.on_window(
        WindowApplied(window(TS + 10, ddl=object()), 0.1, {}, at + 3, at + 2.5)
    )  # a DDL: not a row window
    count, total, le = _histogram(m, "applier_ready_to_commit_seconds")
    assert (count, le["0.15"], le["0.5"]) == (2, 1, 2)
    assert total == pytest.approx(0.52)
    assert _histogram(m, "applier_commit_lag_seconds")[0] == 3  # the commit lag counts every row window


def test_a_ddl_being_applied_is_shown_with_its_table_and_how_long_it_has_run() -> None:
    mono = Clock(100.0)
    m = MetricsObserver(monotonic=mono, process_metrics=False)
    assert _samples(m)[("applier_ddl_in_progress_seconds", ())] == 0
    ddl = ddl_event(TS + 5, "ALTER TABLE t ADD INDEX i (a)", "t", schema="db", ddl_type=7)
    m.on_apply_start(window(TS + 5, ddl=ddl))
    mono.now += 20
    s = _samples(m)
    assert s[("applier_ddl_in_progress_seconds", ())] == 20  # evaluated at scrape time
    labels = (("commit_ts", str(TS + 5)), ("mode", "window"), ("schema", "db"), ("table", "t"))
    assert s[("applier_ddl_in_progress_info", labels)] == 1
    m.on_window(WindowApplied(window(TS + 5, ddl=ddl), 20.0, {}))
    s = _samples(m)
    assert s[("applier_ddl_in_progress_seconds", ())] == 0
    assert not [k for k in s if k[0] == "applier_ddl_in_progress_info"]
    m.on_apply_start(window(TS + 6))  # a row window: no DDL in progress
    assert _samples(m)[("applier_ddl_in_progress_seconds", ())] == 0


def test_index_ddls_beside_the_stream_are_shown_with_how_long_the_oldest_has_run() -> None:
    wall = Clock(1_000.0)
    m = MetricsObserver(clock=wall, monotonic=Clock(100.0), process_metrics=False)
    add = JournalEntry(TS + 5, "db", "t", 7, "ALTER TABLE t ADD INDEX i (a)", "{}")
    drop = JournalEntry(TS + 9, "db", "u", 8, "DROP INDEX j ON u", "{}")
    m.on_online_ddls([(add, 990.0), (drop, 995.0)])
    s = _samples(m)
    assert s[("applier_ddl_in_progress_seconds", ())] == 10  # the oldest
    for entry in (add, drop):
        ts = str(entry.commit_ts)
        labels = (("commit_ts", ts), ("mode", "beside"), ("schema", "db"), ("table", entry.table))
        assert s[("applier_ddl_in_progress_info", labels)] == 1
    m.on_online_ddls([])
    s = _samples(m)
    assert s[("applier_ddl_in_progress_seconds", ())] == 0
    assert not [k for k in s if k[0] == "applier_ddl_in_progress_info"]

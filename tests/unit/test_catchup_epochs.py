"""The window and the DDL epochs: R, which DDLs run and in what order, epoch boundaries."""

from __future__ import annotations

import pytest

from applier.catchup.epochs import (
    Control,
    Epoch,
    ddls_to_run,
    epoch_of,
    global_resolved,
    partition_resolved,
    plan_catchup,
    plan_epochs,
)
from applier.stream.progress import ddl_key
from tests.builders import ddl_event


def test_partition_resolved_ignores_ddls_and_older_values() -> None:
    """A DDL implies no resolved ts: rows of tables it does not block may still follow it with a
    smaller ts (docs/open-protocol.md §5.4)."""
    controls = [
        Control(0, 1, 0, 100),
        Control(0, 5, 0, 90),  # an older resolved after a replay
        Control(1, 2, 0, 81, ddl_event(81, "ALTER TABLE t ADD c INT", table="t", schema="s")),
        Control(1, 3, 0, 70),
    ]
    assert partition_resolved(controls, [0, 1, 2], floor=50) == {0: 100, 1: 70, 2: 50}


def test_drained_partitions_count_as_the_resolved_ts_they_were_drained_at() -> None:
    """Several topics: a quiet partition read to an end learned after 90 was seen counts as
    resolved at 90; its own higher resolved ts still wins, and so does the floor."""
    controls = [Control(0, 1, 0, 100), Control(1, 3, 0, 95)]
    resolved = partition_resolved(controls, [0, 1, 2, 3], floor=50, drained={1: 90, 2: 90, 3: 40})
    assert resolved == {0: 100, 1: 95, 2: 90, 3: 50}
    assert global_resolved(resolved) == 50
    assert global_resolved(partition_resolved(controls, [0, 1, 2], floor=50, drained={2: 90})) == 90


def test_global_resolved_is_the_smallest_capped_by_until() -> None:
    assert global_resolved({0: 100, 1: 80, 2: 95}) == 80
    assert global_resolved({0: 100, 1: 80}, until=70) == 70
    assert global_resolved({0: 100, 1: 80}, until=90) == 80
    with pytest.raises(ValueError):
        global_resolved({})


def test_ddls_in_the_window_once_each_in_the_barriers_order() -> None:
    a, b, c = (
        ddl_event(50, "CREATE TABLE a (i INT)", "a", schema="s"),
        ddl_event(50, "CREATE TABLE b (i INT)", "b", schema="s"),
        ddl_event(70, "ALTER TABLE t ADD c INT", table="t", schema="s"),
    )
    old, late = (
        ddl_event(20, "CREATE TABLE old (i INT)", table="t", schema="s"),
        ddl_event(120, "ALTER TABLE t ADD c INT", table="t", schema="s"),
    )
    controls = [
        # partition 1 saw b before a, partition 0 a before b: the lowest partition's order wins
        Control(1, 3, 0, 50, b),
        Control(1, 4, 0, 50, a),
        Control(0, 7, 0, 50, a),
        Control(0, 8, 0, 50, b),
        Control(0, 9, 0, 70, c),
        Control(1, 9, 0, 70, c),
        Control(0, 1, 0, 20, old),  # at or below the lower bound: already in the backup
        Control(0, 12, 0, 120, late),  # above R: left to the daemon
        Control(0, 10, 0, 100),
    ]
    assert ddls_to_run(controls, lower=30, upper=100) == [a, b, c]
    assert ddls_to_run(controls, lower=30, upper=100, applied=[ddl_key(b)]) == [a, c]
    assert ddls_to_run(controls, lower=30, upper=70) == [a, b, c]
    assert ddls_to_run(controls, lower=30, upper=69) == [a, b]


def test_epochs_split_the_window_at_each_ddl() -> None:
    d1, d2, d3 = (
        ddl_event(50, "q1", table="t", schema="s"),
        ddl_event(50, "q2", table="t", schema="s"),
        ddl_event(71, "ALTER TABLE t ADD c INT", table="t", schema="s"),
    )
    epochs = plan_epochs(30, 100, [d1, d2, d3])
    assert epochs == [
        Epoch(1, 30, 49, d1),
        Epoch(2, 49, 49, d2),
        Epoch(3, 49, 70, d3),
        Epoch(4, 70, 100, None),
    ]
    assert [e.has_rows for e in epochs] == [True, False, True, True]
    assert epoch_of(epochs, 31).number == 1
    assert epoch_of(epochs, 49).number == 1  # rows below the DDL's ts run before it
    assert epoch_of(epochs, 50).number == 3  # rows at the DDL's ts and above run after it
    assert epoch_of(epochs, 70).number == 3
    assert epoch_of(epochs, 71).number == 4
    assert epoch_of(epochs, 100).number == 4
    assert epoch_of(epochs, 30) is None and epoch_of(epochs, 101) is None


def test_no_ddl_is_one_epoch_and_a_ddl_outside_is_refused() -> None:
    assert plan_epochs(10, 20, []) == [Epoch(1, 10, 20, None)]
    assert plan_epochs(10, 10, []) == [Epoch(1, 10, 10, None)]
    with pytest.raises(ValueError):
        plan_epochs(10, 20, [ddl_event(21, "ALTER TABLE t ADD c INT", table="t", schema="s")])


def test_plan_catchup_puts_the_rules_together() -> None:
    """R from every partition (a drained one included, capped by ``until``), then the DDLs in the
    window not yet applied split it; below ``lower`` there is no window at all."""
    ddl = ddl_event(60, "ALTER TABLE t ADD c INT", table="t", schema="s")
    controls = [Control(0, 1, 0, 100), Control(0, 2, 0, 60, ddl), Control(1, 3, 0, 90)]
    r, planned = plan_catchup(controls, [0, 1, 2], 30, drained={2: 95})
    assert r == 90
    assert [(e.lower, e.upper, e.ddl) for e in planned] == [(30, 59, ddl), (59, 90, None)]
    r, planned = plan_catchup(controls, [0, 1, 2], 30, drained={2: 95}, until=80, applied=[ddl_key(ddl)])
    assert (r, [(e.lower, e.upper, e.ddl) for e in planned]) == (80, [(30, 80, None)])
    assert plan_catchup(controls, [0, 1, 2], 30) == (30, [Epoch(1, 30, 30, None)])
    assert plan_catchup([Control(0, 1, 0, 20)], [0], 30, until=10) == (10, [])

"""Performance-driven details of sqlgen.collapse that must not change results.

- final upserts come in handle-key order (what InnoDB writes fastest), in arrival order when keys
  do not compare;
- ``plan_window(events, tables)`` with the window's single table gives the same plan as without;
- the one-pass collapse (no sort) equals "stable sort by (ts, deletes first), last op wins".
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from applier.codec.events import RowEvent, RowKind
from sqlgen import plan_window
from tests.builders import delete_row, id_val_image, insert_row, row_event, update_row

INT, VARCHAR = 3, 15


def test_upserts_and_deletes_come_in_key_order() -> None:
    evs = [insert_row(10, k) for k in (5, 3, 9, 1)] + [
        delete_row(11, 7),
        delete_row(11, 2),
        insert_row(12, 4),
    ]
    tp = plan_window(evs).tables[("s", "t")]
    (ug,) = tp.upserts
    assert ug.keys == [(1,), (3,), (4,), (5,), (9,)]
    assert [row[0] for row in ug.rows] == [1, 3, 4, 5, 9]
    assert tp.delete_keys == [(2,), (7,)]


def test_keys_that_do_not_compare_keep_arrival_order() -> None:
    evs = [insert_row(10, 2), insert_row(10, None), insert_row(10, 1)]
    (ug,) = plan_window(evs).tables[("s", "t")].upserts
    assert sorted(ug.keys, key=repr) == sorted([(2,), (None,), (1,)], key=repr)
    assert len(ug.rows) == 3


def _reference(events: list[RowEvent]) -> dict[tuple, Any]:
    """Final state per key by the definition: stable sort by (ts, deletes first), last op wins."""
    ops = []
    for i, ev in enumerate(events):
        if ev.kind is RowKind.DELETE:
            ops.append((ev.commit_ts, 0, i, ev.old["id"]["v"], None))
            continue
        if ev.kind is RowKind.UPDATE and ev.old is not None and ev.old["id"]["v"] != ev.new["id"]["v"]:
            ops.append((ev.commit_ts, 0, i, ev.old["id"]["v"], None))
        ops.append((ev.commit_ts, 1, i, ev.new["id"]["v"], ev.new["val"]["v"]))
    final: dict[tuple, Any] = {}
    for _ts, _prio, _i, key, value in sorted(ops, key=lambda op: (op[0], op[1], op[2])):
        final[(key,)] = value
    return final


def _plan_state(events: list[RowEvent], tables: Any = None) -> dict[tuple, Any]:
    tp = plan_window(events, tables).tables[("s", "t")]
    state: dict[tuple, Any] = {k: None for k in tp.delete_keys}
    for ug in tp.upserts:
        for key, row in zip(ug.keys, ug.rows, strict=True):
            assert key not in state
            state[key] = row[1]
    return state


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60))
def test_one_pass_collapse_equals_the_sorted_definition(seed: int, n: int) -> None:
    rnd = random.Random(seed)
    evs: list[RowEvent] = []
    for i in range(n):
        ts = rnd.randint(1, 6)  # few distinct ts: many ties between deletes and upserts
        key = rnd.randint(1, 5)
        kind = rnd.random()
        if kind < 0.4:
            evs.append(insert_row(ts, key, f"v{i}"))
        elif kind < 0.7:
            evs.append(delete_row(ts, key))
        else:
            evs.append(update_row(ts, key, rnd.randint(1, 5), f"u{i}"))
    assert _plan_state(evs) == _reference(evs)
    assert _plan_state(evs, frozenset({("s", "t")})) == _reference(evs)


def test_the_tables_hint_gives_the_same_plan() -> None:
    evs = [insert_row(10, 2), update_row(11, 2, 3), delete_row(12, 1), insert_row(12, 1, "again")]
    plain = plan_window(evs)
    hinted = plan_window(evs, frozenset({("s", "t")}))
    assert plain.events == hinted.events == 4
    assert plain.row_counts() == hinted.row_counts()
    assert plain.tables[("s", "t")].upserts == hinted.tables[("s", "t")].upserts
    assert plain.tables[("s", "t")].deletes == hinted.tables[("s", "t")].deletes
    two = [*evs, row_event(RowKind.INSERT, 13, id_val_image(9), None, table="other")]
    assert set(plan_window(two, frozenset({("s", "t"), ("s", "other")})).tables) == {
        ("s", "t"),
        ("s", "other"),
    }

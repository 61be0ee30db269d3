"""Early writes (applier.apply.early): which rows the barrier offers before their window is
released, and when the released window may commit them."""

from __future__ import annotations

import random

from applier.apply.early import EarlyWrites
from applier.stream.barrier import Barrier
from applier.stream.window import Window
from checkpoint import Checkpoint
from sqlgen import plan_window
from tests.builders import ddl_event, keyed_row, resolved_event
from tests.unit.test_stream_barrier import Feeds, ids


def _writes(*pieces: Window) -> EarlyWrites:
    return EarlyWrites(tuple(pieces), tuple(plan_window(w.rows) for w in pieces))


def test_the_early_target_is_one_below_the_newest_commit_ts_of_the_partition_least_far_on() -> None:
    b = Barrier([0, 1], Checkpoint(resolved_ts=5))
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2), keyed_row(30, 3))
    f(1, keyed_row(15, 4), keyed_row(25, 5))
    assert b.next_window() is None  # no resolved ts yet: nothing can be released
    w = b.early_window(5, 1, 100)
    assert w is not None
    assert (w.base_ts, w.target_ts) == (5, 24)  # partition 1 may still send more rows of ts 25
    assert ids(w) == [(10, 1), (15, 4), (20, 2)]
    assert b.early_window(24, 1, 100) is None  # nothing more has arrived
    f(1, keyed_row(40, 6))
    w2 = b.early_window(24, 1, 100)
    assert w2 is not None and (w2.base_ts, w2.target_ts) == (24, 29)
    assert ids(w2) == [(25, 5)]


def test_a_partition_resolved_ts_counts_as_far_as_its_rows() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2))
    f(1, resolved_event(18))  # partition 1 has nothing up to 18 (and no rows at all)
    w = b.early_window(0, 1, 100)
    assert w is not None and w.target_ts == 18 and ids(w) == [(10, 1)]


def test_no_early_rows_while_a_partition_has_said_nothing() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2))
    assert b.early_window(0, 1, 100) is None  # partition 1 may still send rows from ts 1 on
    b.set_empty(1, True)  # unless it is known to be empty
    w = b.early_window(0, 1, 100)
    assert w is not None and w.target_ts == 19


def test_early_rows_stop_below_a_pending_ddl_and_need_min_rows() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(12, 2), ddl_event(15), keyed_row(20, 3), keyed_row(30, 4))
    w = b.early_window(0, 1, 100)
    assert w is not None and w.target_ts == 14 and ids(w) == [(10, 1), (12, 2)]
    assert b.early_window(0, 3, 100) is None  # two rows only
    assert b.early_window(14, 1, 100) is None  # the DDL comes next


def test_early_rows_are_bounded_by_whole_commit_ts() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(10, 2), keyed_row(20, 3), keyed_row(30, 4), keyed_row(40, 5))
    w = b.early_window(0, 1, 3)
    assert w is not None and w.target_ts == 20 and len(w.rows) == 3
    w = b.early_window(0, 1, 2)
    assert w is not None and w.target_ts == 10 and len(w.rows) == 2
    assert b.early_window(0, 1, 1) is None  # one transaction alone is over the bound


def test_no_early_rows_while_several_topics_are_read() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2))
    b.cap = 5
    assert b.early_window(0, 1, 100) is None


def test_the_released_window_commits_early_rows_that_are_exactly_its_rows_up_to_their_target() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2), keyed_row(30, 3))
    f(1, keyed_row(15, 4), keyed_row(25, 5), keyed_row(35, 6))
    first = b.early_window(0, 1, 100)
    assert first is not None and first.target_ts == 29
    f(0, resolved_event(32))
    f(1, resolved_event(32))
    window = b.next_window()
    assert window is not None and window.target_ts == 32
    rest = _writes(first).remainder(window)
    assert rest is not None and [(r.commit_ts, r.new["id"]["v"]) for r in rest] == [(30, 3)]


def test_a_row_that_arrived_after_its_piece_makes_the_window_write_everything_again() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(30, 3))
    f(1, keyed_row(15, 4), keyed_row(35, 6))
    first = b.early_window(0, 1, 100)
    assert first is not None and first.target_ts == 29
    f(1, keyed_row(12, 7))  # a late first copy (physical partitions of one table, §5.3)
    f(0, resolved_event(40))
    f(1, resolved_event(40))
    window = b.next_window()
    assert window is not None
    assert _writes(first).remainder(window) is None


def test_windows_that_cannot_take_the_early_rows() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2), keyed_row(30, 3))
    first = b.early_window(0, 1, 100)
    assert first is not None and first.target_ts == 29
    writes = _writes(first)
    f(0, resolved_event(15))
    short = b.next_window()  # stops below one of the early rows
    assert short is not None and short.target_ts == 15
    assert writes.remainder(short) is None
    ddl = Window(15, [], ddl_event(16), {0: 0}, {0: 15}, frozenset(), base_ts=0)
    assert ddl is not None and ddl.ddl is not None
    assert writes.remainder(ddl) is None
    moved_on = Window(29, list(first.rows), None, {}, {}, first.tables, base_ts=3)
    assert writes.remainder(moved_on) is None  # built on another applied ts


def test_a_window_cut_between_the_last_early_row_and_their_target_takes_them() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2), keyed_row(30, 3), keyed_row(30, 4))
    first = b.early_window(0, 1, 100)
    assert first is not None and first.target_ts == 29 and len(first.rows) == 2
    f(0, resolved_event(40))
    cut = b.next_window(3)  # max_txn_rows: ts 30 would make it 4 rows
    assert cut is not None and cut.target_ts == 20
    assert _writes(first).remainder(cut) == []


def test_chained_pieces_and_the_rest_are_the_window_cut_at_their_targets() -> None:
    """Random streams over three partitions: whenever the window released after a chain of pieces
    takes them, pieces + rest hold each of its rows exactly once, and every piece holds every row
    of the window in its ts range (so each is a window of its own: applier.apply.early)."""
    rng = random.Random(5)
    for _ in range(200):
        b = Barrier([0, 1, 2])
        f = Feeds(b)
        ts = {p: 0 for p in range(3)}
        pieces: list[Window] = []
        key = 0
        for _step in range(rng.randint(1, 6)):
            for p in range(3):
                for _ in range(rng.randint(0, 3)):
                    late = rng.random() < 0.1
                    t = max(1, ts[p] - rng.randint(1, 8)) if late else ts[p] + rng.randint(1, 5)
                    ts[p] = max(ts[p], t)
                    key += 1
                    f(p, keyed_row(t, key))
            base = pieces[-1].target_ts if pieces else 0
            piece = b.early_window(base, 1, 1000)
            if piece is not None:
                pieces.append(piece)
        top = max(ts.values()) + 1
        for p in range(3):
            f(p, resolved_event(top))
        window = b.next_window()
        if not pieces or window is None:
            continue
        rest = _writes(*pieces).remainder(window)
        if rest is None:
            continue
        seen = [id(r) for w in pieces for r in w.rows] + [id(r) for r in rest]
        assert sorted(seen) == sorted(id(r) for r in window.rows)
        for w in pieces:
            inside = [r for r in window.rows if w.base_ts < r.commit_ts <= w.target_ts]
            assert sorted(map(id, inside)) == sorted(map(id, w.rows))

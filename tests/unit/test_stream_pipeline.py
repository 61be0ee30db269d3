"""Barrier windows built ahead (``next_window(after=...)``), as the daemon's apply pipeline uses them.

The daemon prepares window N+1 while the database applies window N, and keeps reading records
meanwhile. These tests drive the barrier that way (random interleaving of feeding, building ahead
and completing) over the randomized streams of test_stream_barrier.py, and check the same guarantees as
the sequential tests: every row exactly once in ts order, DDLs alone and in order, and a restart
from any window's checkpoint (written from that window's own fields) reproduces the rest.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.stream.barrier import Barrier
from applier.stream.window import Window
from checkpoint import Checkpoint
from tests.builders import ddl_event, keyed_row, resolved_event
from tests.unit.test_stream_barrier import (
    Applied,
    Feeds,
    Stream,
    check_order,
    check_window,
    consume,
    run_once_and_pick_a_crash,
    start_consuming,
    summary,
)


def checkpoint_of(barrier: Barrier, window: Window) -> Checkpoint:
    """What the daemon stores with ``window`` (its own resume offsets), read after marking it."""
    state = barrier.checkpoint()
    return Checkpoint(
        resolved_ts=window.target_ts,
        tables=state.tables,
        applied_ddls=state.applied_ddls,
        offsets={p: o for p, o in window.resume_offsets.items() if o is not None},
    )


def consume_pipelined(
    stream: Stream, state: Checkpoint, rnd: random.Random, start: dict[int, int] | None = None
) -> Applied:
    barrier, cursor, out = start_consuming(stream, state, start)
    queue: list[Window] = []  # queue[0] is in flight, queue[1] prepared ahead

    def build() -> bool:
        kwargs = rnd.choice([{}, {"merge": False}, {"max_rows": rnd.randint(1, 4)}])
        if not queue:
            w = barrier.next_window(**kwargs)
        elif len(queue) == 1:
            uncapped = barrier.next_window(after=queue[0])
            assert barrier.rows_ready_after(queue[0]) == (len(uncapped.rows) if uncapped else 0)
            w = barrier.next_window(after=queue[0], **kwargs)
            if w is not None:
                assert w.ddl is None and w.rows, "only row windows are built ahead"
                assert w.base_ts == queue[0].target_ts
        else:
            return False
        if w is None:
            return False
        check_window(barrier, w)
        queue.append(w)
        return True

    def complete() -> bool:
        if not queue:
            return False
        w = queue.pop(0)
        barrier.mark_applied(w)
        out.windows.append(w)
        out.snapshots.append(checkpoint_of(barrier, w))
        return True

    while True:
        left = [p for p in stream.records if cursor[p] < len(stream.records[p])]
        if not left:
            break
        action = rnd.random()
        if action < 0.6:
            p = rnd.choice(left)
            barrier.feed(p, cursor[p], stream.records[p][cursor[p]], 10)
            cursor[p] += 1
        elif action < 0.8:
            build()
        else:
            complete()
    while build() or complete():
        pass
    assert not queue
    assert barrier.next_window() is None
    assert barrier.total_cached_bytes() == 0
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), consumer_seed=st.integers(0, 2**32 - 1), cut=st.floats(0, 1))
def test_windows_built_ahead_apply_every_row_once_and_restart_reproduces_the_rest(
    seed: int, consumer_seed: int, cut: float
) -> None:
    stream, run, k = run_once_and_pick_a_crash(seed, random.Random(consumer_seed), cut, consume_pipelined)
    if k == 0:
        return
    # Crash after window k: restart from the checkpoint written with it, sequentially or pipelined.
    state = run.snapshots[k - 1]
    rest = summary(run.windows[k:])
    for again in (consume, consume_pipelined):
        rerun = again(stream, state, random.Random(consumer_seed + 1), start=dict(state.offsets))
        check_order(rerun.windows, state.resolved_ts)
        assert summary(rerun.windows) == rest


def test_nothing_is_built_ahead_of_a_ddl_or_of_a_ddl_window() -> None:
    barrier = Barrier([0, 1])
    feed = Feeds(barrier)
    feed(0, keyed_row(10, 1))
    feed(1, keyed_row(10, 2))
    feed.broadcast(ddl_event(20))
    feed(0, keyed_row(30, 3))
    feed(1, keyed_row(30, 4))
    feed.broadcast(resolved_event(40))
    first = barrier.next_window()
    assert first is not None and first.target_ts == 19 and len(first.rows) == 2
    assert barrier.next_window(after=first) is None  # the DDL comes next: not built ahead
    assert barrier.rows_ready_after(first) == 0
    barrier.mark_applied(first)
    ddl_window = barrier.next_window()
    assert ddl_window is not None and ddl_window.ddl is not None
    assert barrier.next_window(after=ddl_window) is None
    barrier.mark_applied(ddl_window)
    last = barrier.next_window()
    assert last is not None and last.base_ts == 19 and [r.commit_ts for r in last.rows] == [30, 30]


def test_a_window_built_ahead_takes_only_rows_after_the_one_in_flight() -> None:
    barrier = Barrier([0])
    feed = Feeds(barrier)
    for ts in (10, 11, 12, 13):
        feed(0, keyed_row(ts, ts))
    feed(0, resolved_event(13))
    first = barrier.next_window(max_rows=2)
    assert first is not None and first.target_ts == 11
    assert barrier.rows_ready_after(first) == 2  # what the daemon asks before building a full window
    ahead = barrier.next_window(max_rows=2, after=first)
    assert ahead is not None and [r.commit_ts for r in ahead.rows] == [12, 13]
    assert ahead.base_ts == 11 and ahead.target_ts == 13
    stale = barrier.next_window(after=ahead)  # not built on the applied state: refused
    assert stale is None
    barrier.mark_applied(first)
    barrier.mark_applied(ahead)
    assert barrier.applied_ts == 13 and barrier.next_window() is None

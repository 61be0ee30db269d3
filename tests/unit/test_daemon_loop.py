"""The daemon loop's parts: flow control (whether it reads on or waits while a window is in
flight) and the window pipeline (when each window could first be released).

Reading must go on whenever the barrier cannot release a window after the one in flight (only
records of the partitions holding it back can), or the database sits idle after the commit while
those records are read; it stops only when the next window is releasable from what is cached.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from applier.daemon.pacing import FlowControl
from applier.daemon.tuning import Tuning
from applier.daemon.windows import WindowPipeline
from applier.ops.observer import Observers

TUNING = Tuning()


class _Reader:
    paused: frozenset[int] = frozenset()

    def __init__(self) -> None:
        self.polls: list[float] = []  # the timeout of each poll

    def poll(self, max_records: int, timeout: float) -> list[object]:
        self.polls.append(timeout)
        return []


class _Barrier:
    def __init__(self, global_resolved: int, cached_rows: int) -> None:
        self._resolved, self._cached = global_resolved, cached_rows

    def global_resolved(self) -> int:
        return self._resolved

    def total_cached_rows(self) -> int:
        return self._cached


class _InFlight:
    def __init__(self, target_ts: int) -> None:
        self.window = SimpleNamespace(target_ts=target_ts)
        self.waits = 0

    def wait(self, timeout: float) -> bool:
        self.waits += 1
        return False


def _flow(
    *, global_resolved: int, cached_rows: int, in_flight_up_to: int | None
) -> tuple[FlowControl, _InFlight | None]:
    flow = FlowControl(
        _Reader(),  # type: ignore[arg-type]
        _Barrier(global_resolved, cached_rows),  # type: ignore[arg-type]
        tuning=TUNING,
        max_cached_bytes=1 << 30,
        large=None,
        observer=Observers(),
        log=None,
    )
    return flow, None if in_flight_up_to is None else _InFlight(in_flight_up_to)


FULL = TUNING.read_ahead_rows + 1


def test_with_the_barrier_held_back_at_the_window_in_flight_reading_goes_on_however_much_is_cached() -> None:
    flow, inflight = _flow(global_resolved=100, cached_rows=FULL, in_flight_up_to=100)
    assert flow.waits_for_input(inflight)  # type: ignore[arg-type]
    flow.read(inflight)  # type: ignore[arg-type]
    assert flow.reader.polls == [TUNING.poll_timeout]  # type: ignore[attr-defined]
    assert inflight is not None and inflight.waits == 0


def test_with_the_next_window_releasable_and_the_cache_full_the_loop_waits_for_the_window() -> None:
    flow, inflight = _flow(global_resolved=200, cached_rows=FULL, in_flight_up_to=100)
    assert not flow.waits_for_input(inflight)  # type: ignore[arg-type]
    flow.read(inflight)  # type: ignore[arg-type]
    assert flow.reader.polls == []  # type: ignore[attr-defined]
    assert inflight is not None and inflight.waits == 1


def test_with_room_in_the_cache_what_has_arrived_is_read_then_the_window_waited_for() -> None:
    flow, inflight = _flow(global_resolved=200, cached_rows=10, in_flight_up_to=100)
    flow.read(inflight)  # type: ignore[arg-type]
    assert flow.reader.polls == [0]  # type: ignore[attr-defined]
    assert inflight is not None and inflight.waits == 1


def test_with_nothing_in_flight_the_barrier_always_waits_for_input() -> None:
    flow, inflight = _flow(global_resolved=200, cached_rows=FULL, in_flight_up_to=None)
    assert flow.waits_for_input(inflight)  # type: ignore[arg-type]
    flow.read(inflight)  # type: ignore[arg-type]
    assert flow.reader.polls == [TUNING.poll_timeout]  # type: ignore[attr-defined]


# -- when a window could first be released (the ``ready_s`` of its log line) -------------------


def _ready_daemon(barrier: _Barrier) -> WindowPipeline:
    return WindowPipeline(
        _Reader(),  # type: ignore[arg-type]
        barrier,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        tuning=TUNING,
        max_txn_rows=1000,
        observer=Observers(),
        stop=threading.Event(),
        statements=None,
        may_write_early=lambda: False,
        log=None,
    )


def _window(base_ts: int, target_ts: int) -> SimpleNamespace:
    return SimpleNamespace(base_ts=base_ts, target_ts=target_ts)


def test_a_window_is_ready_at_the_read_that_moved_the_global_resolved_ts_past_its_base() -> None:
    barrier = _Barrier(global_resolved=100, cached_rows=0)
    daemon = _ready_daemon(barrier)
    daemon.read_at = 1.0
    daemon.note_ready()  # start-up: the applied ts, nothing to release
    daemon.read_at = 1.5
    daemon.note_ready()  # nothing moved: not a new moment
    barrier._resolved = 200
    daemon.read_at = 2.0
    daemon.note_ready()
    barrier._resolved = 300
    daemon.read_at = 3.0
    daemon.note_ready()
    assert daemon.ready_at(_window(100, 200)) == 2.0  # type: ignore[arg-type]
    assert daemon.ready_at(_window(200, 300)) == 3.0  # type: ignore[arg-type]
    assert daemon.ready_at(_window(300, 400)) is None  # nothing read that releases it (yet)


def test_merged_and_cut_windows_are_ready_when_their_first_rows_were() -> None:
    barrier = _Barrier(global_resolved=100, cached_rows=0)
    daemon = _ready_daemon(barrier)
    for at, ts in ((2.0, 200), (3.0, 300), (4.0, 400)):
        barrier._resolved = ts
        daemon.read_at = at
        daemon.note_ready()
    # several resolved ts merged into one window: ready when its oldest rows were
    assert daemon.ready_at(_window(100, 300)) == 2.0  # type: ignore[arg-type]
    # a window cut below a resolved ts (max_txn_rows), then the rest of it: both ready at 4.0
    assert daemon.ready_at(_window(300, 350)) == 4.0  # type: ignore[arg-type]
    assert daemon.ready_at(_window(350, 400)) == 4.0  # type: ignore[arg-type]

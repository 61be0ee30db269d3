"""The daemon loop's read stage: whether it reads on or waits while a window is in flight.

Reading must go on whenever the barrier cannot release a window after the one in flight (only
records of the partitions holding it back can), or the database sits idle after the commit while
those records are read; it stops only when the next window is releasable from what is cached.
"""

from __future__ import annotations

from types import SimpleNamespace

from applier.daemon.loop import Daemon


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


def _daemon(*, global_resolved: int, cached_rows: int, in_flight_up_to: int | None) -> Daemon:
    daemon = Daemon.__new__(Daemon)  # only the read stage's state: no configuration, no connections
    daemon.reader = _Reader()  # type: ignore[assignment]
    daemon.barrier = _Barrier(global_resolved, cached_rows)  # type: ignore[assignment]
    daemon._inflight = None if in_flight_up_to is None else _InFlight(in_flight_up_to)  # type: ignore[assignment]
    return daemon


FULL = Daemon.READ_AHEAD_ROWS + 1


def test_with_the_barrier_held_back_at_the_window_in_flight_reading_goes_on_however_much_is_cached() -> None:
    daemon = _daemon(global_resolved=100, cached_rows=FULL, in_flight_up_to=100)
    assert daemon._waits_for_input()
    daemon._read()
    assert daemon.reader.polls == [Daemon.POLL_TIMEOUT]  # type: ignore[attr-defined]
    assert daemon._inflight.waits == 0  # type: ignore[union-attr]


def test_with_the_next_window_releasable_and_the_cache_full_the_loop_waits_for_the_window() -> None:
    daemon = _daemon(global_resolved=200, cached_rows=FULL, in_flight_up_to=100)
    assert not daemon._waits_for_input()
    daemon._read()
    assert daemon.reader.polls == []  # type: ignore[attr-defined]
    assert daemon._inflight.waits == 1  # type: ignore[union-attr]


def test_with_room_in_the_cache_what_has_arrived_is_read_then_the_window_waited_for() -> None:
    daemon = _daemon(global_resolved=200, cached_rows=10, in_flight_up_to=100)
    daemon._read()
    assert daemon.reader.polls == [0]  # type: ignore[attr-defined]
    assert daemon._inflight.waits == 1  # type: ignore[union-attr]


def test_with_nothing_in_flight_the_barrier_always_waits_for_input() -> None:
    daemon = _daemon(global_resolved=200, cached_rows=FULL, in_flight_up_to=None)
    assert daemon._waits_for_input()
    daemon._read()
    assert daemon.reader.polls == [Daemon.POLL_TIMEOUT]  # type: ignore[attr-defined]


# -- when a window could first be released (the ``ready_s`` of its log line) -------------------


def _ready_daemon(barrier: _Barrier) -> Daemon:
    daemon = Daemon.__new__(Daemon)
    daemon.barrier = barrier  # type: ignore[assignment]
    daemon._start_loop_state()
    return daemon


def _window(base_ts: int, target_ts: int) -> SimpleNamespace:
    return SimpleNamespace(base_ts=base_ts, target_ts=target_ts)


def test_a_window_is_ready_at_the_read_that_moved_the_global_resolved_ts_past_its_base() -> None:
    barrier = _Barrier(global_resolved=100, cached_rows=0)
    daemon = _ready_daemon(barrier)
    daemon._read_at = 1.0
    daemon._note_ready()  # start-up: the applied ts, nothing to release
    daemon._read_at = 1.5
    daemon._note_ready()  # nothing moved: not a new moment
    barrier._resolved = 200
    daemon._read_at = 2.0
    daemon._note_ready()
    barrier._resolved = 300
    daemon._read_at = 3.0
    daemon._note_ready()
    assert daemon._ready_at(_window(100, 200)) == 2.0  # type: ignore[arg-type]
    assert daemon._ready_at(_window(200, 300)) == 3.0  # type: ignore[arg-type]
    assert daemon._ready_at(_window(300, 400)) is None  # nothing read that releases it (yet)


def test_merged_and_cut_windows_are_ready_when_their_first_rows_were() -> None:
    barrier = _Barrier(global_resolved=100, cached_rows=0)
    daemon = _ready_daemon(barrier)
    for at, ts in ((2.0, 200), (3.0, 300), (4.0, 400)):
        barrier._resolved = ts
        daemon._read_at = at
        daemon._note_ready()
    # several resolved ts merged into one window: ready when its oldest rows were
    assert daemon._ready_at(_window(100, 300)) == 2.0  # type: ignore[arg-type]
    # a window cut below a resolved ts (max_txn_rows), then the rest of it: both ready at 4.0
    assert daemon._ready_at(_window(300, 350)) == 4.0  # type: ignore[arg-type]
    assert daemon._ready_at(_window(350, 400)) == 4.0  # type: ignore[arg-type]

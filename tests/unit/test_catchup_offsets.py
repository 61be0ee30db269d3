"""Offset planning: range splitting and the choice of start offsets (broker faked)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

from applier.catchup.offsets import EARLIEST, END, OffsetRange, StartSpec, choose_starts, split_ranges


def test_ranges_cover_every_offset_once_and_respect_the_size() -> None:
    bounds = {0: (0, 1000), 1: (250, 251), 2: (10, 10), 3: (5, 17)}
    ranges = split_ranges(bounds, 300)
    for p, (start, end) in bounds.items():
        mine = [r for r in ranges if r.partition == p]
        covered = [o for r in mine for o in range(r.start, r.end)]
        assert covered == list(range(start, end)), p
        assert all(0 < r.size <= 300 for r in mine)
    assert [r for r in ranges if r.partition == 0] == [
        OffsetRange(0, 0, 250),
        OffsetRange(0, 250, 500),
        OffsetRange(0, 500, 750),
        OffsetRange(0, 750, 1000),
    ]
    assert not [r for r in ranges if r.partition == 2]  # empty partition: no task


def test_ranges_are_nearly_equal_and_ordered() -> None:
    ranges = split_ranges({1: (0, 10), 0: (0, 7)}, 3)
    assert [(r.partition, r.size) for r in ranges] == [(0, 3), (0, 2), (0, 2), (1, 3), (1, 3), (1, 2), (1, 2)]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        split_ranges({0: (10, 5)}, 10)
    with pytest.raises(ValueError):
        split_ranges({0: (0, 5)}, 0)


class FakeBroker:
    """An OffsetSource whose record times are given per partition as (offset, ms) pairs."""

    def __init__(self, times: Mapping[int, list[tuple[int, int]]]) -> None:
        self.times = times
        self.lookups: list[tuple[list[int], int]] = []

    def partitions(self) -> list[int]:
        return sorted(self.times)

    def bounds(self, starts: Mapping[int, StartSpec]) -> dict[int, tuple[int, int]]:
        raise AssertionError("not used here")

    def offsets_for_time(self, partitions: Iterable[int], ms: int) -> dict[int, int | None]:
        parts = list(partitions)
        self.lookups.append((parts, ms))
        return {p: next((o for o, t in self.times[p] if t >= ms), None) for p in parts}


def test_stored_offsets_win_and_the_rest_start_at_the_beginning_by_default() -> None:
    broker = FakeBroker({0: [(0, 1)], 1: [(0, 1)], 2: [(0, 1)]})
    starts = choose_starts([0, 1, 2], {1: 40}, from_ts=1000 << 18, source=broker)
    assert starts == {0: EARLIEST, 1: 40, 2: EARLIEST}
    assert broker.lookups == []  # record times are never asked for unless enabled


def test_time_lookup_uses_the_margin_and_only_for_partitions_without_a_stored_offset() -> None:
    ms = 1_700_000_000_000
    broker = FakeBroker(
        {
            0: [(0, ms - 900_000), (5, ms - 400_000), (9, ms - 100_000), (12, ms + 1)],
            1: [(0, ms - 900_000)],  # nothing written since: the window is not in it yet
            2: [(0, ms)],
        }
    )
    starts = choose_starts(
        [0, 1, 2, 3], {3: 77}, from_ts=(ms << 18) | 5, source=broker, time_margin_ms=300_000
    )
    assert broker.lookups == [([0, 1, 2], ms - 300_000)]
    assert starts == {0: 9, 1: END, 2: 0, 3: 77}

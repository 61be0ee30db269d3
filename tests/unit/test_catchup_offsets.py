"""Offset planning: range splitting, the choice of start offsets, quiet partitions of several topics
(broker faked)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import pytest

from applier.catchup.offsets import EARLIEST, END, StartSpec, choose_starts, plan_reads
from applier.catchup.ranges import OffsetRange, ranges_per_task, split_ranges, task_groups
from applier.kafka.topics import TopicSet, TopicSlots


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


class FakeTopics:
    """An OffsetSource over topics held in memory: per topic, per partition, the records as the
    resolved ts each holds (None: a row). ``then`` maps a call's name to what happens in Kafka
    right after its first time (TiCDC goes on writing, a table's topic is created)."""

    def __init__(self, topics: TopicSet, data: dict[str, list[list[int | None]]]) -> None:
        self.set, self.data = topics, data
        self.slots = TopicSlots(topics)
        self.calls: list[tuple[str, object]] = []
        self.then: dict[str, Callable[[], None]] = {}

    def _called(self, name: str, arg: object) -> None:
        self.calls.append((name, arg))
        after = self.then.pop(name, None)
        if after is not None:
            after()

    def _records(self, p: int) -> list[int | None]:
        topic, partition = self.slots.key(p)
        return self.data[topic][partition]

    def partitions(self) -> list[int]:
        found = {t: len(parts) for t, parts in self.data.items() if self.set.matches(t)}
        out = sorted(self.slots.slot(t, p) for t in sorted(found) for p in range(found[t]))
        self._called("partitions", [self.slots.label(p) for p in out])
        return out

    def key(self, partition: int) -> tuple[str, int]:
        return self.slots.key(partition)

    def bounds(self, starts: Mapping[int, StartSpec]) -> dict[int, tuple[int, int]]:
        out = {}
        for p, spec in starts.items():
            end = len(self._records(p))
            start = 0 if spec == EARLIEST else end if spec == END else int(spec)
            out[p] = (start, max(start, end))
        self._called("bounds", {self.slots.label(p): s for p, s in sorted(starts.items())})
        return out

    def tail_resolved(self, bounds: Mapping[int, tuple[int, int]], options: object) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for p, (start, end) in bounds.items():
            found = [ts for ts in self._records(p)[start:end] if ts is not None]
            out[p] = max(found) if found else None
        self._called("tail_resolved", sorted(self.slots.label(p) for p in bounds))
        return out

    def offsets_for_time(self, partitions: Iterable[int], ms: int) -> dict[int, int | None]:
        raise AssertionError("not used here")


def _named(source: FakeTopics, by_slot: Mapping[int, object]) -> dict[str, object]:
    return {source.slots.label(p): v for p, v in by_slot.items()}


def test_quiet_partitions_are_fetched_again_and_count_as_the_highest_resolved_ts_seen() -> None:
    """The default topic and an active table topic have resolved events up to 30; a quiet table
    topic has none (or an old one). Their ends are learned again after 30 was read, records
    written meanwhile included, and they count as resolved at 30 there. A partition that has its
    own resolved ts is not fetched again: what it got since stays for the daemon."""
    r = None
    data = {
        "cdc": [[10, r, 20, 30], [10, 20, r, 30]],
        "cdc_s_a": [[r, 10, r, 30], [r, r, 10, r, 30]],
        "cdc_s_b": [[r, 10, r, r], []],  # quiet since 10; its second partition never got anything
    }
    source = FakeTopics(TopicSet(("cdc",), ("cdc_.*",)), data)

    def meanwhile() -> None:
        data["cdc_s_b"][0] += [r, r]  # rows above 30: TiCDC wrote 30 after every row at or below it
        data["cdc"][0] += [r, 40]

    source.then["tail_resolved"] = meanwhile
    plan = plan_reads(source, {("cdc_s_b", 1): 0}, from_ts=5, several=True)

    assert [name for name, _ in source.calls] == [
        "partitions",
        "bounds",
        "tail_resolved",
        "partitions",
        "bounds",
    ]
    assert source.calls[4][1] == {"cdc_s_b/0": 4, "cdc_s_b/1": 0}  # from where each was read to
    assert plan.top == 30
    assert _named(source, plan.drained) == {"cdc_s_b/0": 30, "cdc_s_b/1": 30}
    assert _named(source, plan.bounds) == {
        "cdc/0": (0, 4),  # not fetched again: its own resolved events say 30
        "cdc/1": (0, 4),
        "cdc_s_a/0": (0, 4),
        "cdc_s_a/1": (0, 5),
        "cdc_s_b/0": (0, 6),
        "cdc_s_b/1": (0, 0),
    }


def test_a_topic_listed_only_after_the_resolved_ts_was_seen_joins_from_its_beginning() -> None:
    """A table's topic created while the catch-up plans may hold rows at or below the highest
    resolved ts seen: the listing made after it was read finds the topic, read from its beginning
    (or from a stored offset) to an end fetched then, counting as resolved at that ts."""
    r = None
    data = {"cdc": [[10, r, 20], [10, 20]], "cdc_s_a": [[r, 20], [r, r, 20]]}
    source = FakeTopics(TopicSet(("cdc", "cdc_s_a", "cdc_s_new")), data)
    source.then["tail_resolved"] = lambda: data.update({"cdc_s_new": [[r, r, r], [r, r]]})
    plan = plan_reads(source, {("cdc_s_new", 1): 1}, from_ts=5, several=True)

    assert source.calls[3] == (
        "partitions",
        ["cdc/0", "cdc/1", "cdc_s_a/0", "cdc_s_a/1", "cdc_s_new/0", "cdc_s_new/1"],
    )
    assert source.calls[4] == ("bounds", {"cdc_s_new/0": EARLIEST, "cdc_s_new/1": 1})
    assert _named(source, plan.drained) == {"cdc_s_new/0": 20, "cdc_s_new/1": 20}
    assert _named(source, plan.bounds)["cdc_s_new/0"] == (0, 3)
    assert _named(source, plan.bounds)["cdc_s_new/1"] == (1, 2)
    assert len(plan.bounds) == 6


def test_one_topic_asks_kafka_what_it_always_did() -> None:
    """One plain topic: one listing and one round of fetches, partitions named by their number;
    no tails read (that is the reader collapse's business) and nothing counts as drained."""
    r = None
    source = FakeTopics(TopicSet(("cdc",)), {"cdc": [[10, r, 20], [10]]})
    plan = plan_reads(source, {("cdc", 1): 1, ("other", 0): 7}, from_ts=5)
    assert [name for name, _ in source.calls] == ["partitions", "bounds"]
    assert plan.bounds == {0: (0, 3), 1: (1, 1)}
    assert plan.tails is None and plan.top is None and plan.drained == {}


def test_without_any_resolved_ts_nothing_counts_as_drained() -> None:
    r = None
    source = FakeTopics(TopicSet(("cdc", "cdc_s_a")), {"cdc": [[r]], "cdc_s_a": [[r, r]]})
    plan = plan_reads(source, {}, from_ts=5, several=True)
    assert [name for name, _ in source.calls] == ["partitions", "bounds", "tail_resolved"]
    assert plan.drained == {} and plan.top is None


def test_ranges_of_several_topics_carry_their_topic_and_partition() -> None:
    where = {0: ("cdc", 0), 1: ("cdc_s_a", 0)}
    ranges = split_ranges({0: (0, 5), 1: (3, 9)}, 4, key=where.__getitem__)
    assert ranges == [
        OffsetRange(0, 0, 3, "cdc", 0),
        OffsetRange(0, 3, 5, "cdc", 0),
        OffsetRange(1, 3, 6, "cdc_s_a", 0),
        OffsetRange(1, 6, 9, "cdc_s_a", 0),
    ]
    assert ranges[2].where("cdc,cdc_s_a") == ("cdc_s_a", 0)
    assert OffsetRange(2, 0, 1).where("cdc") == ("cdc", 2)


def test_task_groups_pair_large_ranges_with_small_ones() -> None:
    sizes = [500, 10, 300, 200, 50]
    ranges = [OffsetRange(p, 0, n) for p, n in enumerate(sizes)]
    groups = task_groups(ranges, 2)
    assert [[r.partition for r in g] for g in groups] == [[0], [1, 2], [3, 4]]
    assert sorted(r.partition for g in groups for r in g) == list(range(5))  # each range read once
    assert task_groups(ranges, 2) == groups  # a retried task reads the same ranges


def test_task_groups_of_even_ranges_are_even_and_one_per_task_is_the_list() -> None:
    ranges = [OffsetRange(p, s, s + 100) for p in range(3) for s in (0, 100, 200, 300)]
    groups = task_groups(ranges, 2)
    assert len(groups) == 6 and {sum(r.size for r in g) for g in groups} == {200}
    assert task_groups(ranges, 1) == [(r,) for r in ranges]
    assert task_groups([], 2) == []
    with pytest.raises(ValueError):
        task_groups(ranges, 0)


def test_two_ranges_a_task_only_when_that_makes_one_wave_of_two_of_small_ranges() -> None:
    def even(n: int, size: int = 100) -> list[OffsetRange]:
        return [OffsetRange(p, 0, size) for p in range(n)]

    assert [ranges_per_task(even(n), 2, 1000) for n in range(1, 10)] == [1, 1, 2, 2, 1, 1, 1, 1, 1]
    assert [ranges_per_task(even(n), 4, 1000) for n in (4, 5, 8, 9)] == [1, 2, 2, 1]
    # A task never reads more records than one range may hold: larger blocks cost the JVM memory.
    assert ranges_per_task(even(4, 600), 2, 1000) == 1
    assert ranges_per_task(even(4, 500), 2, 1000) == 2
    uneven = [OffsetRange(0, 0, 900), OffsetRange(1, 0, 100), OffsetRange(2, 0, 900), OffsetRange(3, 0, 200)]
    assert ranges_per_task(uneven, 2, 1000) == 1  # paired large with small: 900 + 200 > 1000

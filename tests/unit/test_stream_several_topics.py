"""Several topics under one barrier: drained partitions, the listing cap, and the watch's probes.

The producer facts are in docs/open-protocol.md §5.10: a partition read to its end by a fetch made
after a resolved ts R was seen holds nothing more at or below R but copies; a topic created after
R was written may hold rows at or below R. The reader is a fake here (the real one, with the
broker, is tests/integration/test_daemon_topics.py).
"""

from __future__ import annotations

from typing import Any

from applier.kafka.topics import TopicSet, TopicSlots
from applier.stream.barrier import Barrier
from applier.stream.partition_watch import PartitionWatch
from tests.builders import insert_row, resolved_event


def test_a_drained_partition_counts_as_resolved_and_drops_later_copies_below() -> None:
    barrier = Barrier([0, 1])
    barrier.feed(0, 0, [insert_row(10, 1)])
    barrier.feed(0, 1, [resolved_event(20)])
    assert barrier.global_resolved() == 0  # partition 1 got nothing: it holds the barrier
    barrier.listener(1).observe_drained(5, 20)  # read to offset 5 after 20 was seen
    assert barrier.global_resolved() == 20
    barrier.feed(1, 5, [insert_row(15, 2)])  # written after 20: a copy
    window = barrier.next_window()
    assert window is not None and [r.commit_ts for r in window.rows] == [10]
    assert window.resume_offsets[1] == 6  # everything up to 20 applied: after the copy
    barrier.feed(1, 6, [insert_row(25, 3)])
    assert barrier.listener(1).stats.rows_replayed == 1


def test_the_cap_holds_the_watermark_but_never_below_the_applied_ts() -> None:
    barrier = Barrier([0])
    barrier.feed(0, 0, [insert_row(10, 1), resolved_event(30)])
    barrier.cap = 12
    assert barrier.global_resolved() == 12 and barrier.max_observed() == 30
    window = barrier.next_window()
    assert window is not None and window.target_ts == 12
    barrier.mark_applied(window)
    barrier.cap = 5  # stale: the applied ts wins
    assert barrier.global_resolved() == 12
    barrier.cap = None
    assert barrier.global_resolved() == 30


class FakeReader:
    """What PartitionWatch uses of PartitionReader, for a set of topics."""

    def __init__(self, topics: str, found: dict[str, list[int]]) -> None:
        self.slots = TopicSlots(TopicSet.parse(topics))
        self.found = found
        self.partitions: list[int] = []
        self.at_end: set[int] = set()
        self.listed_at: float | None = None
        self.listings = 0
        self.probed: list[list[int]] = []
        self.drained: dict[int, int] = {}
        self.assigned: dict[int, Any] = {}

    def new_partitions(self, now: float | None = None) -> list[int]:
        self.listings += 1
        self.listed_at = float(self.listings)
        slots = [self.slots.slot(t, p) for t, parts in sorted(self.found.items()) for p in parts]
        return sorted(set(slots) - set(self.partitions))

    def add_partitions(self, offsets: dict[int, Any]) -> None:
        self.assigned.update(offsets)
        self.partitions = sorted({*self.partitions, *offsets})

    def probe(self, partitions: list[int]) -> list[int]:
        self.probed.append(sorted(partitions))
        return list(partitions)

    def take_drained(self) -> dict[int, int]:
        out, self.drained = self.drained, {}
        return out


class Log:
    def info(self, *_a: Any, **_k: Any) -> None:
        pass

    warning = info


def test_new_topics_join_from_their_beginning_and_then_the_cap_rises() -> None:
    reader = FakeReader("d,/d_.*/", {"d": [0]})
    barrier = Barrier([0])
    reader.add_partitions({0: "earliest"})
    watch = PartitionWatch(reader, barrier, Log(), {("d_t", 1): 7}, [])
    barrier.feed(0, 0, [resolved_event(40)])
    reader.found["d_t"] = [0, 1]
    assert watch.add_new(now=0.0) == [1, 2]
    assert reader.assigned == {0: "earliest", 1: "earliest", 2: 7}  # a stored offset is used
    assert barrier.cap == 40  # seen before that listing, which has been joined
    assert barrier.global_resolved() == 0  # the new topic's partitions hold it now


def test_probes_go_to_partitions_at_their_end_that_lag_and_their_end_resolves_them() -> None:
    reader = FakeReader("a,b", {})
    for topic, p in [("a", 0), ("b", 0), ("b", 1)]:
        reader.slots.slot(topic, p)
    barrier = Barrier([0, 1, 2])
    watch = PartitionWatch(reader, barrier, Log(), {}, [])
    barrier.feed(0, 0, [resolved_event(50)])
    reader.at_end = {0, 1}  # 2 is still being read: not probed
    watch.probe_quiet(now=0.0)
    assert reader.probed == [[1]]
    watch.probe_quiet(now=0.1)  # within PROBE_SECONDS
    assert reader.probed == [[1]]
    reader.drained = {1: 9}
    watch.settle_drained(skip={2})
    assert barrier.listener(1).resolved == 50
    reader.drained = {2: 3}  # no probe of 2 was started: an end says nothing
    watch.settle_drained()
    assert barrier.listener(2).resolved == 0


def test_a_drained_partition_with_records_not_fed_is_probed_again() -> None:
    reader = FakeReader("a,b", {})
    reader.slots.slot("a", 0)
    reader.slots.slot("b", 0)
    barrier = Barrier([0, 1])
    watch = PartitionWatch(reader, barrier, Log(), {}, [])
    barrier.feed(0, 0, [resolved_event(50)])
    reader.at_end = {1}
    watch.probe_quiet(now=0.0)
    reader.drained = {1: 4}
    watch.settle_drained(skip={1})  # a large message of partition 1 is being fetched
    assert barrier.listener(1).resolved == 0
    watch.probe_quiet(now=1.0)
    assert reader.probed == [[1], [1]]

"""Partitions added while running and partitions that stay empty: what the barrier is told, and when.

The real PartitionReader runs on a fake consumer (tansu cannot add partitions to a topic); the
barrier is a fake that records the calls ``Barrier.add_partition`` and ``Barrier.set_empty``
receive. The last tests drive the daemon's own loop with them.
"""

from __future__ import annotations

import gc
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from applier.codec.decoder import DecoderOptions
from applier.codec.events import Position, ResolvedEvent
from applier.daemon.loop import EXIT_OK, Daemon
from applier.daemon.startup import Stages, start_offsets
from applier.daemon.tuning import Tuning
from applier.kafka.reader import PartitionReader
from applier.ops.observer import Observers
from applier.settings.schema import Config
from applier.stream.barrier import Barrier
from applier.stream.partition_watch import PartitionWatch
from checkpoint import Checkpoint
from tests.builders import resolved_record
from tests.unit.kafka_fakes import FakeConsumer, FakeOracle, Msg, event

EOF = KafkaError._PARTITION_EOF


class Journal(list):
    """Every call the barrier and the consumer's assignment receive, in order."""


class FakeBarrier:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.applied_ts = 0

    def add_partition(self, partition: int, start_offset: int | None) -> None:
        self.journal.append(("add_partition", partition, start_offset))

    def set_empty(self, partition: int, empty: bool) -> None:
        self.journal.append(("set_empty", partition, empty))

    def feed(self, partition: int, offset: int, events: Any, size: int = 0, raw: Any = None) -> None:
        self.journal.append(("feed", partition, offset))

    # What the daemon's loop asks besides: nothing is ever ready to apply here.
    def next_window(self, *_args: Any, **_kw: Any) -> None:
        return None

    def total_cached_rows(self) -> int:
        return 0

    def global_resolved(self) -> int:
        return self.applied_ts

    def total_cached_bytes(self) -> int:
        return 0

    def spill_over(self, *_args: Any) -> int:
        return 0

    def partitions_far_ahead(self, *_args: Any) -> set[int]:
        return set()

    def partitions_to_pause(self, *_args: Any) -> set[int]:
        return set()

    def partitions_to_resume(self, *_args: Any) -> set[int]:
        return set()


class JournalConsumer(FakeConsumer):
    journal: Journal | None = None

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        super().incremental_assign(tps)
        assert self.journal is not None
        self.journal.append(("assign", [(tp.partition, tp.offset) for tp in tps]))


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, message: str, **kw: Any) -> None:
        self.lines.append((message, kw))

    warning = error = debug = info

    def about(self, words: str) -> list[dict]:
        return [kw for message, kw in self.lines if words in message]


def setup(
    stored: dict[int, int], partitions: list[int]
) -> tuple[PartitionReader, JournalConsumer, PartitionWatch, Journal, Log]:
    journal = Journal()
    consumer = JournalConsumer(topic_partitions=list(partitions))
    consumer.journal = journal
    reader = PartitionReader("unused:9092", "orders", "g", consumer=consumer, oracle=FakeOracle({}, {}))
    reader.PARTITION_CHECK_SECONDS = 0.0  # look every time: the pacing has its own test
    log = Log()
    unsettled = [p for p in partitions if p not in stored]
    by_topic = {("orders", p): offset for p, offset in stored.items()}
    watch = PartitionWatch(reader, FakeBarrier(journal), log, by_topic, unsettled)
    reader.assign({p: stored.get(p, "earliest") for p in partitions})
    return reader, consumer, watch, journal, log


# -- empty partitions ---------------------------------------------------------------------------------


def test_partition_without_offset_reaching_its_end_with_no_record_is_empty_once() -> None:
    reader, consumer, watch, journal, log = setup({0: 40}, [0, 1, 2])
    consumer.batches = [
        [Msg(0, 40), Msg(2, 0), event(EOF, 1, 0), event(EOF, 2, 1), event(EOF, 0, 41)],
        [event(EOF, 1, 0)],
    ]
    reader.poll()
    assert watch.settle() is True
    assert journal == [("set_empty", 1, True)]  # not 2 (it delivered a record), not 0 (stored offset)
    assert watch.empty == {1}
    reader.poll()
    assert watch.settle() is False
    assert journal == [("set_empty", 1, True)]
    assert log.about("partition is empty") == [{"partition": 1}]


def test_partition_with_a_stored_offset_is_never_empty() -> None:
    reader, consumer, watch, journal, _log = setup({0: 40, 1: 7}, [0, 1])
    consumer.batches = [[event(EOF, 0, 40), event(EOF, 1, 7)]]
    reader.poll()
    assert watch.settle() is False
    assert journal == [] and watch.empty == set()


def test_first_record_of_an_empty_partition_is_reported_before_it_is_fed() -> None:
    reader, consumer, watch, journal, log = setup({}, [0])
    consumer.batches = [[event(EOF, 0, 0)]]
    reader.poll()
    watch.settle()
    watch.record_arrived(0)
    assert journal == [("set_empty", 0, True), ("set_empty", 0, False)]
    assert watch.empty == set()
    assert len(log.about("no longer empty")) == 1


# -- partitions added while running ---------------------------------------------------------------


def test_new_partitions_are_added_to_the_barrier_then_read_from_their_beginning() -> None:
    reader, consumer, watch, journal, log = setup({0: 40, 3: 12}, [0, 1])
    assert watch.add_new() == []
    consumer.topic_partitions = [0, 1, 2, 3]
    assert watch.add_new() == [2, 3]
    assert journal == [
        ("add_partition", 2, None),
        ("add_partition", 3, 12),  # in the checkpoint (a previous run read it): resume there
        ("assign", [(2, OFFSET_BEGINNING), (3, 12)]),
    ]
    assert reader.partitions == [0, 1, 2, 3]
    assert [kw["partition"] for kw in log.about("partition added")] == [2, 3]
    assert watch.add_new() == []  # nothing new: nothing said again
    assert len(log.about("partition added")) == 2


def test_an_added_partition_that_stays_empty_is_reported_empty() -> None:
    reader, consumer, watch, journal, _log = setup({0: 40, 1: 3}, [0, 1])
    consumer.topic_partitions = [0, 1, 2]
    watch.add_new()
    consumer.batches = [[event(EOF, 2, 0)]]
    reader.poll()
    assert watch.settle() is True
    assert journal[-1] == ("set_empty", 2, True)


# -- the daemon's loop ------------------------------------------------------------------------------


def record(partition: int, offset: int, ts: int) -> Msg:
    key, value = resolved_record(ts)
    return Msg(partition, offset, k=key, val=value)


class Lock:
    def ensure_held(self, check: bool = False) -> None:
        pass


class _NoApplier:
    """The loop's streams here release no row window: it only asks whether a row mode summary is
    due (and writes the last one on the way out) and whether to write rows early."""

    early = SimpleNamespace(next_piece=lambda barrier, max_rows: None)

    @staticmethod
    def summary_async() -> None:
        return None

    @staticmethod
    def flush_summary() -> None:
        return None


def run_loop(
    stored: dict[int, int], partitions: list[int], batches: list[list[Msg]], grow_to: list[int], grow_at: int
) -> tuple[int, Journal, Log]:
    """Run ``Daemon._loop`` over ``batches``; the topic has ``grow_to`` partitions from poll ``grow_at``."""
    reader, consumer, watch, journal, log = setup(stored, partitions)
    consumer.batches = list(batches)
    polls = 0

    def on_consume(c: FakeConsumer) -> None:
        nonlocal polls
        polls += 1
        if polls == grow_at:
            c.topic_partitions = list(grow_to)
        if polls > len(batches) + 50:
            daemon._stop.set()  # a loop that never catches up fails the test instead of hanging

    consumer.on_consume = on_consume
    daemon = Daemon.__new__(Daemon)
    daemon.cfg = Config(
        {"topic": "orders", "max_txn_rows": 1000, "max_cached_bytes": 1 << 30, "exit_when_caught_up": True}
    )
    daemon.observer, daemon.log, daemon._stop = Observers(), log, threading.Event()
    daemon.options, daemon.tuning = DecoderOptions(), Tuning()
    daemon.stages = Stages(
        lock=Lock(),
        reader=reader,
        barrier=watch.barrier,
        watch=watch,
        applier=_NoApplier(),  # type: ignore[arg-type]
    )
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        code = daemon._loop()
    finally:  # the loop tunes the interpreter for itself: give the test process its settings back
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
    assert not daemon._stop.is_set(), "the loop did not catch up"
    return code, journal, log


def test_loop_reports_empty_partitions_and_adds_new_ones_in_order() -> None:
    code, journal, log = run_loop(
        stored={0: 10},
        partitions=[0, 1],
        batches=[
            [record(0, 10, 100), event(EOF, 1, 0)],  # 1 is empty so far
            [record(1, 0, 100)],  # ...until it is not; meanwhile the topic grew
            [record(2, 0, 100), event(EOF, 2, 1)],
            [event(EOF, 0, 11), event(EOF, 1, 1)],
        ],
        grow_to=[0, 1, 2],
        grow_at=2,
    )
    assert code == EXIT_OK
    assert journal == [
        ("feed", 0, 10),
        ("set_empty", 1, True),
        ("set_empty", 1, False),  # before its first record is fed
        ("feed", 1, 0),
        ("add_partition", 2, None),  # before it is assigned, and long before it is fed
        ("assign", [(2, OFFSET_BEGINNING)]),
        ("feed", 2, 0),
    ]
    assert len(log.about("partition added")) == 1
    assert len(log.about("partition is empty")) == 1 and len(log.about("no longer empty")) == 1


def test_loop_exits_caught_up_with_a_partition_that_stays_empty() -> None:
    code, journal, _log = run_loop(
        stored={},
        partitions=[0, 1],
        batches=[[record(0, 0, 100), event(EOF, 0, 1), event(EOF, 1, 0)]],
        grow_to=[0, 1],
        grow_at=1,
    )
    assert code == EXIT_OK
    assert journal == [("feed", 0, 0), ("set_empty", 1, True)]


def test_several_topics_are_caught_up_only_once_the_highest_resolved_ts_read_is_applied() -> None:
    """Read to their end, a quiet partition still waits for its drain probe (and the watermark for
    the next topic listing): no window being ready does not mean caught up yet."""
    barrier = Barrier([0, 1], Checkpoint(resolved_ts=50, offsets={0: 0, 1: 0}))
    barrier.feed(0, 0, [ResolvedEvent(60, Position("a", 0, 0, 0))], 0, None)
    daemon = Daemon.__new__(Daemon)
    daemon.cfg = Config({"topic": "a,b", "exit_when_caught_up": True})
    watch = SimpleNamespace(several=True)
    daemon.stages = Stages(reader=SimpleNamespace(all_at_end=lambda: True), barrier=barrier, watch=watch)  # type: ignore[arg-type]
    daemon.windows = SimpleNamespace(inflight=None)  # type: ignore[assignment]
    assert barrier.next_window() is None and not daemon._caught_up([])
    barrier.listeners[1].observe_drained(0, 60)  # its probe's end came
    while (window := barrier.next_window()) is not None:
        barrier.mark_applied(window)
    assert barrier.applied_ts == 60 and daemon._caught_up([])
    watch.several = False  # one topic: every partition gets every resolved event
    daemon.stages.barrier = Barrier([0], Checkpoint(resolved_ts=50, offsets={0: 0}))
    assert daemon._caught_up([])


# -- where partitions start ------------------------------------------------------------------------


@pytest.mark.parametrize("start", ["earliest", "latest"])
def test_start_setting_applies_only_to_a_changefeed_without_checkpoint(start: str) -> None:
    assert start_offsets([0, 1], {}, False, start) == {0: start, 1: start}
    # With a checkpoint, a partition without a stored offset was added meanwhile or never had a
    # record: its end would lose rows, its beginning loses nothing (replays are skipped).
    assert start_offsets([0, 1, 2], {0: 5, 7: 9}, True, start) == {0: 5, 1: "earliest", 2: "earliest"}

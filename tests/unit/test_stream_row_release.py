"""Row mode's release (applier.stream.row_release): each partition up to its own resolved ts, DDLs
as barriers every partition reaches, the joint release while keys may move between partitions."""

from __future__ import annotations

from applier.codec.events import FLAG_UNIQUE_KEY, Event, RowEvent, RowKind
from applier.stream.progress import ddl_key
from applier.stream.row_release import PartitionBarriers
from applier.stream.window import Window
from checkpoint import Checkpoint
from tests.builders import INT, PK, column, ddl_event, keyed_row, keyless_row, position, resolved_event


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Feeds:
    def __init__(self, barrier: PartitionBarriers) -> None:
        self.barrier = barrier
        self.next = dict.fromkeys(barrier.listeners, 0)

    def __call__(self, partition: int, *events: Event) -> None:
        off = self.next.setdefault(partition, 0)
        self.barrier.feed(partition, off, list(events))
        self.next[partition] = off + 1


def settled(partitions: int = 3, state: Checkpoint | None = None) -> tuple[PartitionBarriers, Feeds, Clock]:
    """A barrier past its joint release after start-up (every partition at its end, nothing read)."""
    clock = Clock()
    barrier = PartitionBarriers(range(partitions), state, settle_seconds=10, clock=clock)
    clock.now = 10
    barrier.settle(set(range(partitions)))
    assert not barrier.joint()
    return barrier, Feeds(barrier), clock


def keys(window: Window) -> dict[int, list[tuple[int, int]]]:
    """Per part: (commit ts, key) of its rows."""
    return {
        part.partition: sorted((r.commit_ts, (r.new or r.old)["id"]["v"]) for r in part.rows)
        for part in window.parts
    }


def apply(barrier: PartitionBarriers) -> Window | None:
    window = barrier.next_window()
    if window is not None:
        barrier.mark_applied(window)
    return window


def test_each_partition_releases_up_to_its_own_resolved_ts() -> None:
    barrier, feed, _ = settled()
    feed(0, keyed_row(10, 1), keyed_row(20, 2), resolved_event(15))
    feed(1, keyed_row(12, 3), resolved_event(30))
    # Partition 2 has read nothing: in the default mode nothing could be released.
    window = barrier.next_window()
    assert window is not None and not window.joint
    assert keys(window) == {0: [(10, 1)], 1: [(12, 3)]}
    assert {p.partition: p.target_ts for p in window.parts} == {0: 15, 1: 30}
    barrier.mark_applied(window)
    assert barrier.partition_applied() == {0: 15, 1: 30, 2: 0}
    assert barrier.applied_ts == 0  # the lowest partition's
    feed(0, resolved_event(25))
    window = apply(barrier)
    assert window is not None and keys(window) == {0: [(20, 2)]}


def test_a_restart_skips_each_partitions_rows_by_its_own_applied_ts() -> None:
    state = Checkpoint(resolved_ts=5, partition_applied={0: 20, 1: 8})
    barrier, feed, _ = settled(2, state)
    feed(0, keyed_row(15, 1), keyed_row(25, 2), resolved_event(30))
    feed(1, keyed_row(15, 3), resolved_event(30))
    window = barrier.next_window()
    assert window is not None and keys(window) == {0: [(25, 2)], 1: [(15, 3)]}
    barrier.mark_applied(window)
    assert barrier.checkpoint().resolved_ts == 30


def test_a_ddl_waits_for_every_partition_and_runs_once() -> None:
    barrier, feed, _ = settled(2)
    ddl = ddl_event(20)
    feed(0, keyed_row(10, 1), ddl, keyed_row(25, 2), resolved_event(30))
    feed(1, keyed_row(15, 3), resolved_event(18))
    window = apply(barrier)
    assert window is not None and keys(window) == {0: [(10, 1)], 1: [(15, 3)]}
    # Partition 0 is at the DDL; partition 1 has not read it, nor a resolved ts past it.
    assert barrier.next_window() is None
    feed(1, ddl_event(20, partition=1), keyed_row(22, 4), resolved_event(40))
    window = apply(barrier)
    assert window is not None and window.ddl is not None and window.target_ts == 19
    assert len(window.parts) == 2 and window.ddl_key == ddl_key(ddl)
    window = apply(barrier)
    assert window is not None and keys(window) == {0: [(25, 2)], 1: [(22, 4)]}
    assert barrier.next_window() is None


def test_a_partition_the_ddl_was_not_written_to_waits_for_it_too() -> None:
    """A partition that was empty when TiCDC wrote the DDL gets no copy of it; its later rows may
    need it (a CREATE TABLE), so they wait until it ran."""
    barrier, feed, _ = settled(2)
    feed(0, ddl_event(20, "CREATE TABLE k (id INT PRIMARY KEY)", ddl_type=3), resolved_event(30))
    feed(1, keyed_row(25, 1), resolved_event(30))
    window = apply(barrier)
    assert window is not None and window.ddl is None and keys(window) == {1: []}  # up to 20 only
    window = apply(barrier)
    assert window is not None and window.ddl is not None and [p.partition for p in window.parts] == [0]
    window = apply(barrier)
    assert window is not None and keys(window) == {0: [], 1: [(25, 1)]}


def test_after_start_up_the_partitions_release_together_until_what_was_read_is_applied() -> None:
    clock = Clock()
    barrier = PartitionBarriers(range(2), settle_seconds=10, clock=clock)
    feed = Feeds(barrier)
    feed(0, keyed_row(10, 1), keyed_row(20, 2), resolved_event(25))
    feed(1, keyed_row(12, 1), resolved_event(15))  # key 1 on two partitions: the topic grew
    assert barrier.joint()
    window = apply(barrier)
    assert window is not None and window.joint
    assert sorted(r.commit_ts for r in window.rows) == [10, 12]  # together, one transaction
    assert {p.partition: p.target_ts for p in window.parts} == {0: 15, 1: 15}
    barrier.settle({0, 1})
    assert barrier.joint()  # not settle_seconds yet
    clock.now = 10
    barrier.settle({0})
    assert barrier.joint()  # partition 1 not at its end
    barrier.settle({0, 1})
    assert barrier.hold is not None and barrier.hold.until == 25  # the highest ts read
    feed(1, resolved_event(30))
    apply(barrier)
    barrier.settle({0, 1})
    assert not barrier.joint()


def test_a_partition_that_starts_to_deliver_makes_the_release_joint_again() -> None:
    barrier, feed, _ = settled(2)
    barrier.set_empty(1, True)
    assert barrier.joint()
    feed(0, keyed_row(10, 1), resolved_event(20))
    window = apply(barrier)
    assert window is not None and window.joint and window.target_ts == 20
    barrier.set_empty(1, False)
    assert barrier.hold is not None and barrier.partition_applied()[1] == 20
    feed(1, keyed_row(30, 1), resolved_event(40))
    feed(0, keyed_row(25, 1), resolved_event(35))
    window = apply(barrier)
    assert window is not None and window.joint and window.target_ts == 35
    assert sorted(r.commit_ts for r in window.rows) == [25, 30]  # key 1's versions, in one transaction


def test_keyless_rows_with_rid_are_dropped_by_their_partitions_applied_ts() -> None:
    state = Checkpoint(resolved_ts=0, partition_applied={0: 20})
    barrier, feed, _ = settled(1, state)
    feed(0, keyless_row(20, 1, rid=7), keyless_row(21, 1, rid=7), resolved_event(30))
    window = apply(barrier)
    assert window is not None and [r.commit_ts for r in window.parts[0].rows] == [21]


def test_the_part_after_one_in_flight() -> None:
    barrier, feed, _ = settled(2)
    feed(0, keyed_row(10, 1), resolved_event(15))
    feed(1, keyed_row(12, 2), resolved_event(15))
    first = barrier.next_window()
    assert first is not None
    feed(0, keyed_row(20, 3), resolved_event(25))
    ahead = barrier.next_window(after=first)
    assert ahead is not None and keys(ahead) == {0: [(20, 3)]}
    barrier.mark_applied(first)
    barrier.mark_applied(ahead)
    assert barrier.partition_applied() == {0: 25, 1: 15}


def unique_row(ts: int, key: int, u: int) -> RowEvent:
    """A row of ``db.uk`` (id INT primary key, u INT UNIQUE): a second unique key."""
    image = {"id": column(INT, key, PK), "u": column(INT, u, FLAG_UNIQUE_KEY)}
    return RowEvent(ts, "db", "uk", RowKind.INSERT, image, None, None, position(), None)


def test_a_table_with_a_second_unique_key_waits_for_every_partition() -> None:
    """Its rows are written together, in commit-ts order, once the lowest resolved ts passes them;
    each partition goes on with its other tables up to its first such row."""
    barrier, feed, _ = settled(2)
    feed(0, keyed_row(10, 1), unique_row(20, 1, 7), keyed_row(25, 2), resolved_event(30))
    feed(1, keyed_row(12, 3), resolved_event(15))
    window = apply(barrier)
    assert window is not None and not window.joint
    assert keys(window) == {0: [(10, 1)], 1: [(12, 3)]}
    assert {p.partition: p.target_ts for p in window.parts} == {0: 19, 1: 15}
    assert apply(barrier) is None  # partition 0 stops below its row of db.uk
    feed(1, unique_row(18, 2, 7), resolved_event(40))
    window = apply(barrier)
    assert window is not None and window.joint  # both rows of db.uk, in one transaction
    assert sorted(r.commit_ts for r in window.rows) == [18, 20, 25]
    assert {p.partition: p.target_ts for p in window.parts} == {0: 30, 1: 30}


def test_a_joint_window_is_cut_at_one_ts_for_every_partition() -> None:
    """Parts cut each on their own would stop at different ts: a key's versions, or a unique value,
    on two partitions would then be written out of order."""
    clock = Clock()
    barrier = PartitionBarriers(range(2), settle_seconds=10, clock=clock)
    feed = Feeds(barrier)
    feed(0, *(keyed_row(10 + i, i) for i in range(6)), resolved_event(40))
    feed(1, keyed_row(11, 100), keyed_row(30, 101), resolved_event(40))
    window = barrier.next_window(4)
    assert window is not None and window.joint
    assert {p.partition: p.target_ts for p in window.parts} == {0: 12, 1: 12}
    assert sorted(r.commit_ts for r in window.rows) == [10, 11, 11, 12]


def test_a_topic_whose_partitions_are_all_empty_yet_releases_nothing() -> None:
    barrier, feed, _ = settled(2)
    barrier.set_empty(0, True)
    barrier.set_empty(1, True)
    assert barrier.joint() and barrier.next_window(100) is None
    barrier.set_empty(0, False)
    feed(0, keyed_row(10, 1), resolved_event(20))
    window = apply(barrier)
    assert window is not None and window.joint and [r.commit_ts for r in window.rows] == [10]

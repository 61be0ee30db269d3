"""Partitions that appear while the daemon runs, and partitions that stay empty.

TiCDC notices a larger partition count of its topic (every ten minutes or so) and re-hashes keys
onto the new partitions: rows of a key can move to a partition the daemon did not have at start.
Ignoring it would lose those rows, so the daemon looks for new partitions while it runs
(``PartitionReader.new_partitions``), tells the barrier (``Barrier.add_partition``) and reads
them. A new partition starts at its stored offset if the checkpoint has one, else at its
beginning, even with ``--start latest``: all it holds was written after the daemon started
(the partition did not exist before), and a row there belongs to a transaction above the
checkpoint, so starting at its end would lose rows; replays at or below the checkpoint are
skipped as on any partition.

The barrier waits for every partition's resolved ts, so a partition that never receives
anything would hold it forever. That happens for good: TiCDC pins its default topic to the
partition count it started with, so extra partitions can stay empty. A partition without a
stored offset that reaches its end without having delivered a record in this session is
reported with ``Barrier.set_empty(p, True)``; its first record is reported with
``set_empty(p, False)`` before it is fed. A partition with a stored offset is never reported:
it held records before, and an offset it no longer has is a lost offset, not an empty partition.

Nothing here runs per record: the daemon looks a record's partition up in the set ``empty``
(with the partitions it stopped reading), and calls ``record_arrived`` only for those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol


class EmptyAwareBarrier(Protocol):
    """What this module needs from the barrier: the two calls that change its set of partitions."""

    def add_partition(self, partition: int, start_offset: int | None) -> None: ...

    def set_empty(self, partition: int, empty: bool) -> None: ...


class PartitionWatch:
    """Adds new partitions and reports empty ones to the barrier; logs each change once.

    ``stored`` are the checkpoint's offsets (a partition in it resumes there, wherever it shows
    up); ``unsettled`` the partitions read without a stored offset at start.
    """

    def __init__(
        self,
        reader: Any,
        barrier: EmptyAwareBarrier,
        log: Any,
        stored: Mapping[int, int],
        unsettled: Iterable[int],
    ) -> None:
        self.reader, self.barrier, self.log = reader, barrier, log
        self.stored = dict(stored)
        self.empty: set[int] = set()
        self._unsettled = set(unsettled)  # no stored offset, and neither a record nor the end seen yet

    def settle(self) -> bool:
        """After a poll: report partitions that reached their end without a record. True if any."""
        reached = self._unsettled & self.reader.at_end if self._unsettled else None
        if not reached:
            return False
        changed = False
        for p in sorted(reached):
            self._unsettled.discard(p)
            if not self.reader.has_delivered(p):
                self.barrier.set_empty(p, True)
                self.empty.add(p)
                self.log.warning(
                    "partition is empty: the barrier does not wait for it until it delivers a record "
                    "(TiCDC does not write to it: its default topic keeps the partition count it "
                    "started with until the changefeed restarts)",
                    partition=p,
                )
                changed = True
        return changed

    def record_arrived(self, partition: int) -> None:
        """A record of an empty partition is about to be fed: the barrier waits for it again."""
        self.empty.discard(partition)
        self.barrier.set_empty(partition, False)
        self.log.info("partition is no longer empty: the barrier waits for it again", partition=partition)

    def add_new(self, now: float | None = None) -> list[int]:
        """Assign the partitions the topic gained since the last check (the reader paces the checks)."""
        added = self.reader.new_partitions(now)
        if not added:
            return []
        starts: dict[int, int | str] = {}
        for p in added:
            offset = self.stored.get(p)
            self.barrier.add_partition(p, offset)
            if offset is None:
                self._unsettled.add(p)
            starts[p] = "earliest" if offset is None else offset
        self.reader.add_partitions(starts)
        for p in added:
            self.log.info("partition added to the topic: reading it", partition=p, start=starts[p])
        return added

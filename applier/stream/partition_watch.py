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

Several topics (docs/open-protocol.md §5.10). TiCDC sends resolved events only to the topics of the
tables it replicates and to the default topic, and creates a table's topic on first use. So:

- Topics of the set that appear while running join like new partitions (from their beginning).
  The listing is repeated every second, and once a listing that started after a resolved ts R
  was seen has been joined, the barrier may pass R (``Barrier.cap``): a topic created before R
  was written is in that listing.
- A partition that gets no resolved events would hold the barrier forever. Every
  ``PROBE_SECONDS``, the partitions read to their end whose resolved ts is below the highest one
  seen are probed (``PartitionReader.probe``): the end reached by a fetch made after that
  resolved ts R was seen proves the partition holds nothing more at or below R, and the listener
  takes R as its resolved ts (``PartitionListener.observe_drained``). This also covers partitions
  that never held a record, so with several topics nothing is left out as "empty": that rule
  rests on TiCDC not writing to such partitions, which does not hold for a new table's topic.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol


class EmptyAwareBarrier(Protocol):
    """What this module needs from the barrier: its set of partitions, their resolved ts, the cap."""

    cap: int | None

    def add_partition(self, partition: int, start_offset: int | None) -> None: ...

    def set_empty(self, partition: int, empty: bool) -> None: ...

    def max_observed(self) -> int | None: ...

    @property
    def listeners(self) -> Mapping[int, Any]: ...


class PartitionWatch:
    """Adds new partitions and reports empty ones to the barrier; logs each change once.

    ``stored`` are the checkpoint's offsets by ``(topic, partition)`` (a partition in it resumes
    there, wherever it shows up); ``unsettled`` the partitions read without a stored offset at
    start (one topic only: see the module docstring).
    """

    PROBE_SECONDS = 0.2
    PROBE_RETRY_SECONDS = 2.0
    """A probe whose end has not come by then (the partition was paused meanwhile) starts again."""

    def __init__(
        self,
        reader: Any,
        barrier: EmptyAwareBarrier,
        log: Any,
        stored: Mapping[tuple[str, int], int],
        unsettled: Iterable[int],
    ) -> None:
        self.reader, self.barrier, self.log = reader, barrier, log
        self.stored = dict(stored)
        self.empty: set[int] = set()
        self.several = reader.slots.single is None
        # no stored offset, and neither a record nor the end seen yet
        self._unsettled = set() if self.several else set(unsettled)
        # partition -> (the resolved ts its probe stands for, when it started)
        self._probed: dict[int, tuple[int, float]] = {}
        self._next_probe = 0.0

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
        """Assign the partitions (and topics) gained since the last check (the reader paces the
        checks); with several topics, then let the barrier pass what was seen before the listing."""
        reader = self.reader
        seen, listed = (self.barrier.max_observed(), reader.listed_at) if self.several else (None, None)
        added = reader.new_partitions(now)
        starts: dict[int, int | str] = {}
        for p in added:
            offset = self.stored.get(reader.slots.key(p))
            self.barrier.add_partition(p, offset)
            if offset is None and not self.several:
                self._unsettled.add(p)
            starts[p] = "earliest" if offset is None else offset
        if starts:
            reader.add_partitions(starts)
        for p in added:
            topic, partition = reader.slots.key(p)
            self.log.info("partition added: reading it", topic=topic, partition=partition, start=starts[p])
        if self.several and reader.listed_at != listed and seen is not None:
            cap = self.barrier.cap
            self.barrier.cap = seen if cap is None else max(cap, seen)
        return added

    def probe_quiet(self, skip: Iterable[int] = (), now: float | None = None) -> None:
        """Several topics: probe the partitions read to their end that lag the highest resolved
        ts seen (module docstring), at most every ``PROBE_SECONDS``."""
        now = time.monotonic() if now is None else now
        if not self.several or now < self._next_probe:
            return
        self._next_probe = now + self.PROBE_SECONDS
        top = self.barrier.max_observed()
        if top is None:
            return
        at_end, skip, probed = self.reader.at_end, set(skip), self._probed
        retry = now - self.PROBE_RETRY_SECONDS
        lagging = [
            p
            for p, lst in self.barrier.listeners.items()
            if lst.resolved < top
            and p not in skip
            and (p in at_end if p not in probed else probed[p][1] < retry)
        ]
        for p in self.reader.probe(lagging):
            probed[p] = (top, now)

    def settle_drained(self, skip: Iterable[int] = ()) -> None:
        """Probed partitions that reached their end: their listener takes the probe's resolved ts.

        Call after every record read before the end was fed; ``skip`` are partitions with records
        not fed yet (large messages being fetched) or refused: probed again later."""
        drained = self.reader.take_drained() if self._probed else {}
        skip = set(skip)
        for p, end in drained.items():
            probe = self._probed.pop(p, None)
            if probe is not None and p not in skip:
                self.barrier.listeners[p].observe_drained(end, probe[0])

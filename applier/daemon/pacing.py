"""Flow control: how much the daemon reads while a window is in flight, and which partitions wait.

Two bounds keep memory in check without ever leaving the database idle:

- Reading (``read``): with a window in flight whose successor can already be released from what
  is cached, reading stops once ``Tuning.read_ahead_rows`` are cached (applying is the bottleneck:
  reading further would only grow memory). While no window can follow the one in flight until
  more is read (or none is in flight), reading goes on.
- Pausing partitions (``pace``): the partitions ahead of the barrier are paused when the cache is
  over ``--max-cached-bytes`` (or over ``read_ahead_rows`` while the barrier waits for input), or
  when one alone is ``Tuning.ahead_rows`` ahead; the ones holding the barrier back keep being
  read, so it always moves.

Kept apart from the loop as tiflow's kafka-consumer keeps its flow control apart from the
consumer: the loop asks, this decides.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from applier.apply.window_applier import PendingApply
from applier.daemon.tuning import Tuning
from applier.kafka.reader import PartitionReader, Record
from applier.large_messages.resolver import LargeMessageQueue
from applier.ops.observer import Observer
from applier.stream.barrier import Barrier


class FlowControl:
    """Back-pressure on the reading of one daemon."""

    def __init__(
        self,
        reader: PartitionReader,
        barrier: Barrier,
        large: LargeMessageQueue | None,
        tuning: Tuning,
        max_cached_bytes: int,
        observer: Observer,
        log: Any,
    ) -> None:
        self.reader, self.barrier, self.tuning = reader, barrier, tuning
        self.max_cached_bytes = max_cached_bytes
        self.large = large
        self.observer = observer
        self.log = log
        self.at_tail = False
        """The last read found the reader at the end of what the broker holds (fewer records than
        asked for): the daemon follows the stream rather than working through a backlog."""
        self._last_holdback_log = 0.0

    def waits_for_input(self, inflight: PendingApply | None) -> bool:
        """True while the barrier cannot release anything after the window in flight (or with none
        in flight) until more records are read: its global resolved ts is not past that window."""
        return inflight is None or self.barrier.global_resolved() <= inflight.window.target_ts

    def read(self, inflight: PendingApply | None) -> list[Record]:
        """The next batch of records, or none while enough is cached for the window in flight."""
        timeout = self.tuning.poll_timeout
        if inflight is None:
            return self._poll(timeout)
        if self.waits_for_input(inflight):
            # No window can follow the one in flight before the partitions holding the barrier
            # back are read further (``pace`` pauses the others once read_ahead_rows are
            # cached). Waiting for the window in flight instead would leave the database idle
            # after its commit while those records are read and decoded.
            return self._poll(timeout)
        if self.barrier.total_cached_rows() > self.tuning.read_ahead_rows:
            # Enough is cached for the next window: let the one in flight finish first rather
            # than grow memory (applying is the bottleneck right now).
            inflight.wait(timeout)
            return []
        # Read what has arrived; with nothing to read, wait for the window in flight (not for the
        # broker), so the next window starts as soon as it committed.
        records = self._poll(0)
        if not records:
            inflight.wait(timeout)
        return records

    def _poll(self, timeout: float) -> list[Record]:
        """One read; notes whether it found the reader at the end of what the broker holds: early
        writes are only for a daemon that follows the stream, not for one working through a
        backlog, whose windows come one after the other anyway."""
        wanted = self.tuning.poll_records
        records = self.reader.poll(wanted, timeout)
        self.at_tail = len(records) < wanted
        return records

    def pace(self, now: float, inflight: PendingApply | None, refused: Set[int]) -> None:
        """Pause the partitions ahead of the barrier that memory cannot take more of, resume the
        ones it can again (never the ``refused`` ones: nothing more of them is read)."""
        reader, barrier, large = self.reader, self.barrier, self.large
        max_bytes = self.max_cached_bytes
        ahead = barrier.partitions_far_ahead(self.tuning.ahead_rows, reader.paused)
        if large is not None:
            ahead |= large.over_limit()  # fetched rows wait in memory: bounded too
        waits = self.waits_for_input(inflight)
        rows = self.tuning.read_ahead_rows if waits else None
        to_pause = barrier.partitions_to_pause(max_bytes, rows) | ahead
        if to_pause - reader.paused:
            before = reader.paused
            reader.pause(to_pause)
            self.observer.on_back_pressure(
                reader.paused - before,
                barrier.total_cached_rows(),
                inflight is not None and waits,
            )
            if now - self._last_holdback_log > 10 and barrier.total_cached_bytes() > max_bytes:
                self.log.warning(
                    "row cache full: pausing partitions ahead of the barrier",
                    cached_bytes=barrier.total_cached_bytes(),
                    paused=sorted(reader.paused),
                    holding_back=barrier.holding_back(),
                    global_resolved_ts=barrier.global_resolved(),
                )
                self._last_holdback_log = now
        if reader.paused:
            resume = barrier.partitions_to_resume(reader.paused, max_bytes, max_cached_rows=rows)
            reader.resume(resume - ahead - refused)

"""Row mode's release (``consistency = "row"``): each partition's rows up to its own resolved ts.

The MQ protocol's design names two ways to consume it: restore transactions (every partition must
have passed a resolved ts before anything below it is applied: :class:`applier.stream.barrier.Barrier`,
the default) or keep row order only, each partition applying what it holds as soon as it has read
a resolved ts itself. This module is the second. It keeps one ``Barrier`` per partition: a barrier
over one partition releases exactly that partition's rows up to its own resolved ts, drops the
copies by its own applied ts, and builds that partition's DDL window once every row of it below the
DDL is applied. On top of them:

- **Windows.** A window is one part per partition with something to release (``Window.parts``),
  each with its own base and target; the applier writes each part on its partition's session,
  with that partition's offset and applied ts, in a transaction of its own. Why row order holds:
  the versions of one row are all on one Kafka partition, oldest first, as long as the partition
  count stays (docs/open-protocol.md §5.1, §5.7) and the dispatcher keeps a row on one partition
  (``table``, the default, or ``index-value``); each part is collapsed in commit-ts order like any
  window. A row version's delete and insert halves of a key change (§5.9) may land on different
  partitions: REPLACE by key converges whichever comes first.
- **Unique keys.** Row order is not enough for a table with a unique key besides its handle key
  whose rows are on several partitions (``index-value``): a row of one partition may take a
  value that an older version of a row of another partition still holds, and REPLACE would then
  remove the newer row for good. So the rows of such tables (``PartitionListener.first_ts_of``,
  from the columns' flags) are never applied by their partition alone: each partition stops below
  its first one, and once the lowest resolved ts passes one, the next window is joint (below).
- **DDLs.** Still a barrier: a partition applies its rows below the DDL, then waits until every
  partition that holds records is at the same DDL; the DDL runs once (a window of its own holding
  every partition's DDL window), and all go on.
- **Joint release.** The guarantees above need a row's versions on one partition. A key moves to
  another partition when the topic's partition count grows, while its older versions may still be
  unread on the old one (§5.7), and nothing in the stream says up to which ts rows were hashed over
  the old count. So rows are released jointly (every partition up to the lowest partition's
  resolved ts, cut at one ts for all, written in one transaction on the apply session: the
  transaction mode's rule) while a partition of the topic is empty (the producer may start writing
  to it any time), and for a while (``hold``) after a partition starts to deliver, and after a start
  that reads a partition from its beginning: until every partition has been read to its end
  ``settle_seconds`` after the hold began (longer than the producer may take to deliver what it
  hashed over the old count), and everything read by then is applied. The hold travels with the
  windows to the checkpoint (``Window.row_hold``), so that a restart in the middle keeps it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace

from applier.codec.events import Event, RowEvent
from applier.stream.barrier import Barrier, StaleWindowError, TableHolds, far_ahead, over_limits
from applier.stream.listener import PartitionListener
from applier.stream.progress import DDLKey
from applier.stream.spill import GroupPart, SpillDir, StreamedRows
from applier.stream.window import Window
from checkpoint import ROW_HOLD_OPEN, Checkpoint


@dataclass
class _Hold:
    """Joint release until ``until`` (None: not known yet, see ``PartitionBarriers.settle``)."""

    since: float
    until: int | None = None


def _merged(parts: Sequence[Window]) -> StreamedRows:
    """The rows of ``parts``, some of them on disk, as one window's (commit ts, partition) order."""
    groups: list[GroupPart] = []
    for part in parts:
        if part.streamed is not None:
            groups += part.streamed.parts
            continue
        by_ts: dict[int, list[RowEvent]] = {}
        for row in part.rows:
            by_ts.setdefault(row.commit_ts, []).append(row)
        groups += (GroupPart(ts, part.partition, None, rows) for ts, rows in by_ts.items())
    groups.sort(key=lambda g: (g.commit_ts, g.partition))
    return StreamedRows(tuple(groups))


class PartitionBarriers:
    """One :class:`Barrier` per partition and the rules between them (module docstring). Offers the
    daemon what a ``Barrier`` does; partitions are the stream's partition ids (slots)."""

    def __init__(
        self,
        partitions: Iterable[int],
        state: Checkpoint | None = None,
        spill: SpillDir | None = None,
        *,
        settle_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        hold: bool = True,
    ) -> None:
        self._state = state or Checkpoint()
        self._spill = spill
        self._subs: dict[int, Barrier] = {}
        for p in sorted(set(partitions)):
            self._subs[p] = self._sub(p, self._state.offsets.get(p))
        if not self._subs:
            raise ValueError("a barrier needs at least one partition")
        self._empty: set[int] = set()
        self._unique: set = set()  # tables with a unique key besides the handle key (module docstring)
        for p, sub in self._subs.items():
            sub.listener(p).unique_tables = self._unique
        self._cap: int | None = None
        self._holds: TableHolds | None = None
        self.settle_seconds = settle_seconds
        self._clock = clock
        stored = self._state.row_hold
        self.hold: _Hold | None = None
        """Joint release after a partition's first records, kept across restarts (module docstring)."""
        if hold or stored is not None:
            self.hold = _Hold(clock(), None if stored is None or stored == ROW_HOLD_OPEN else stored)

    def _sub(self, partition: int, start_offset: int | None) -> Barrier:
        state = self._state
        applied = max(state.resolved_ts, state.partition_applied.get(partition, 0))
        own = Checkpoint(
            resolved_ts=applied,
            tables={t: ts for t, ts in state.tables.items() if ts > applied},
            applied_ddls={k for k in state.applied_ddls if k[0] > applied},
            offsets={} if start_offset is None else {partition: start_offset},
        )
        return Barrier([partition], own, self._spill)

    # ------------------------------------------------------------------ partitions

    def add_partition(self, partition: int, start_offset: int | None = None) -> None:
        """A partition added to the topic while running: read from ``start_offset``; a partition
        that starts to deliver moves the rows of some keys there, so the release is joint again."""
        if partition in self._subs:
            raise ValueError(f"partition {partition} is already read")
        sub = self._sub(partition, start_offset)
        sub.cap, sub.holds = self._cap, self._holds
        sub.listener(partition).unique_tables = self._unique
        self._subs = dict(sorted({**self._subs, partition: sub}.items()))
        self.hold = _Hold(self._clock())

    def set_empty(self, partition: int, empty: bool) -> None:
        """Whether ``partition`` never held a record; one that starts to deliver begins a hold."""
        sub = self._subs[partition]
        if empty:
            self._empty.add(partition)
        elif partition in self._empty:
            # Its rows are all above what the others are applied up to (``Barrier.set_empty``).
            sub.lift(self.applied_ts)
            self._empty.discard(partition)
            self.hold = _Hold(self._clock())
        sub.set_empty(partition, empty)

    @property
    def listeners(self) -> Mapping[int, PartitionListener]:
        return {p: sub.listener(p) for p, sub in self._subs.items()}

    def listener(self, partition: int) -> PartitionListener:
        return self._subs[partition].listener(partition)

    def feed(
        self,
        partition: int,
        offset: int,
        events: Sequence[Event],
        record_bytes: int = 0,
        raw: tuple[bytes | None, bytes | None] | None = None,
    ) -> None:
        self._subs[partition].feed(partition, offset, events, record_bytes, raw)

    def _counted(self) -> list[Barrier]:
        """The partitions that hold records (an empty one releases nothing and waits for nothing)."""
        counted = [sub for p, sub in self._subs.items() if p not in self._empty]
        return counted or list(self._subs.values())

    # ------------------------------------------------------------------ settings the daemon sets

    @property
    def cap(self) -> int | None:
        """Several topics: no partition's rows pass it (``Barrier.cap``)."""
        return self._cap

    @cap.setter
    def cap(self, value: int | None) -> None:
        self._cap = value
        for sub in self._subs.values():
            sub.cap = value

    @property
    def holds(self) -> TableHolds | None:
        return self._holds

    @holds.setter
    def holds(self, value: TableHolds | None) -> None:
        self._holds = value
        for sub in self._subs.values():
            sub.holds = value

    # ------------------------------------------------------------------ progress

    @property
    def applied_ts(self) -> int:
        """Every row at or below it is applied, on every partition: the lowest partition's."""
        return min(sub.applied_ts for sub in self._counted())

    def partition_applied(self) -> dict[int, int]:
        """What each partition is applied up to."""
        return {p: sub.applied_ts for p, sub in self._subs.items()}

    def applied_ddl_keys(self) -> frozenset[DDLKey]:
        keys: set[DDLKey] = set()
        for sub in self._subs.values():
            keys |= sub.applied_ddl_keys()
        g = self.applied_ts
        return frozenset(k for k in keys if k[0] > g)

    def resume_offsets(self) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for sub in self._subs.values():
            out.update(sub.resume_offsets())
        return out

    def checkpoint(self) -> Checkpoint:
        """The current applied state as a checkpoint (what a restart would start from)."""
        g = self.applied_ts
        return Checkpoint(
            resolved_ts=g,
            applied_ddls=self.applied_ddl_keys(),
            offsets={p: o for p, o in self.resume_offsets().items() if o is not None},
            partition_applied={p: ts for p, ts in self.partition_applied().items() if ts > g},
        )

    def global_resolved(self) -> int:
        """The lowest resolved ts of the partitions that hold records (never above ``cap``)."""
        return min(sub.global_resolved() for sub in self._counted())

    def max_observed(self) -> int | None:
        return max(
            (ts for sub in self._subs.values() if (ts := sub.max_observed()) is not None), default=None
        )

    # ------------------------------------------------------------------ joint release

    def joint(self) -> bool:
        """Whether the partitions release together now (module docstring)."""
        return bool(self._empty) or self.hold is not None

    def settle(self, at_end: Set[int]) -> None:
        """Called by the daemon as it reads (``at_end``: the partitions read to their end now): fixes
        the end of a hold once ``settle_seconds`` have passed and every partition is at its end, as
        the highest ts read on any partition by then; ends it once that much is applied."""
        hold = self.hold
        if hold is None:
            return
        if hold.until is None:
            if self._clock() - hold.since < self.settle_seconds or not at_end.issuperset(self._subs):
                return
            hold.until = max(self._highest_read(p, sub) for p, sub in self._subs.items())
        if self.applied_ts >= hold.until:
            self.hold = None

    @staticmethod
    def _highest_read(partition: int, sub: Barrier) -> int:
        lst = sub.listener(partition)
        ddl_top = max((ddl.commit_ts for ddl in lst.pending_ddls()), default=0)
        return max(lst.max_cached_ts() or 0, lst.observed_resolved or 0, ddl_top)

    def _pending_ddl_ts(self) -> int | None:
        """The lowest commit ts of a DDL any partition holds and has not applied."""
        return min(
            (ts for p, sub in self._subs.items() if (ts := sub.listener(p).min_pending_ddl_ts()) is not None),
            default=None,
        )

    def _caps(self) -> tuple[int | None, bool]:
        """Set every partition's cap for the next window; returns the lowest pending DDL's ts and
        whether the window is joint.

        Every cap: the daemon's (several topics) and the lowest DDL pending on any partition (a
        partition the DDL was never written to, one that was empty then, waits for it too: its
        rows may need it). A joint window: the lowest resolved ts too, for every partition. The
        window is joint while ``joint()``, and when a row of a table with a unique key besides its
        handle key is releasable (module docstring); otherwise each partition stops below its
        first such row."""
        base = self._cap
        for sub in self._subs.values():
            sub.cap = base
        ddl_ts = self._pending_ddl_ts()
        cap = min((c for c in (base, ddl_ts) if c is not None), default=None)
        low = self.global_resolved()
        if cap is not None:
            low = min(low, cap)
        unique = self._unique
        firsts: dict[int, int | None] = {}
        joint = self.joint()
        if not joint and unique:
            for p, sub in self._subs.items():
                first = firsts[p] = sub.listener(p).first_ts_of(unique, sub.applied_ts)
                if first is not None and first <= low:
                    joint = True
                    break
        for p, sub in self._subs.items():
            if joint:
                sub.cap = low
            else:
                first = firsts.get(p)
                own = cap if first is None else first - 1 if cap is None else min(cap, first - 1)
                sub.cap = own
        return ddl_ts, joint

    # ------------------------------------------------------------------ windows

    def next_window(
        self, max_rows: int | None = None, *, merge: bool = True, after: Window | None = None
    ) -> Window | None:
        """What to apply next (never changes any state): a window of parts, one per partition that
        can move (its rows up to its own resolved ts, or only its applied ts), while no partition
        is at a DDL the others have not reached; else the DDL every partition holding records is at
        (a window of their DDL windows); else None. ``max_rows`` bounds the window: each part
        gets its share.

        ``after``: a window of parts being applied: the parts that follow it, for partitions with
        rows to write (the DDL is never built ahead).
        """
        ddl_ts, joint = self._caps()
        inflight: dict[int, Window] = {}
        if after is not None:
            if after.ddl is not None or not after.parts:
                return None
            inflight = {part.partition: part for part in after.parts}
        if joint and max_rows is not None:
            # One cut for every partition: parts cut each on its own would stop at different ts,
            # and the rows of a key or a unique value on two of them apply out of order.
            self._cut_joint(max_rows, inflight)
            max_rows = None
        if max_rows is not None:
            # A window holds about ``max_rows`` rows however many partitions share it, so that
            # the next one is planned while this one is written, as in the transaction mode.
            max_rows = max(1, max_rows // max(1, len(self._subs) - len(self._empty)))
        parts: list[Window] = []
        at_ddl: dict[int, Window] = {}
        for p, sub in self._subs.items():
            if p in self._empty:
                continue
            w = sub.next_window(max_rows, merge=merge, after=inflight.get(p))
            if w is None:
                continue
            if w.ddl is not None:
                at_ddl[p] = w
            elif after is None or not w.is_empty:
                parts.append(w)
        if any(not part.is_empty for part in parts) or (after is None and parts):
            return self._window(parts, after, joint)
        if after is not None or ddl_ts is None:
            return None
        first = [w for w in at_ddl.values() if w.ddl is not None and w.ddl.commit_ts == ddl_ts]
        if not first:
            return None
        key = first[0].ddl_key
        holding = tuple(w for w in at_ddl.values() if w.ddl_key == key)
        for p, sub in self._subs.items():
            if p in self._empty or (p in at_ddl and at_ddl[p].ddl_key == key):
                continue
            # A partition without this DDL (it was not written there) must be past every row below it.
            lst = sub.listener(p)
            own = lst.min_pending_ddl_ts()
            if (own is not None and own <= ddl_ts) or sub.applied_ts < ddl_ts - 1 or lst.resolved < ddl_ts:
                return None
        return self._ddl_window(holding)

    def _cut_joint(self, max_rows: int, inflight: Mapping[int, Window]) -> None:
        """Lower every partition's cap to the highest ts T up to which the partitions hold at most
        ``max_rows`` rows together (at least the lowest commit ts: one transaction is never cut)."""
        counted = [
            (sub.listener(p), inflight[p].target_ts if p in inflight else sub.applied_ts, sub)
            for p, sub in self._subs.items()
            if p not in self._empty
        ]
        if not counted:
            return  # no partition holds a record yet
        low = min(sub.cap if sub.cap is not None else sub.global_resolved() for _, _, sub in counted)
        below = sum(lst.count_upto(base) for lst, base, _ in counted)

        def rows_upto(ts: int) -> int:
            return sum(lst.count_upto(ts) for lst, _, _ in counted) - below

        if rows_upto(low) <= max_rows:
            return
        first = min(
            (ts for lst, base, _ in counted if (ts := lst.min_cached_ts_above(base)) is not None), default=low
        )
        lo, hi = first, low  # the answer is in [lo, hi]; rows_upto(lo) may be over max_rows
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if rows_upto(mid) <= max_rows:
                lo = mid
            else:
                hi = mid - 1
        for _, _, sub in counted:
            sub.cap = lo

    def _window(self, parts: list[Window], after: Window | None, joint: bool) -> Window:
        # The lowest partition's applied ts once the parts are applied (after ``after``'s).
        applied = {p: sub.applied_ts for p, sub in self._subs.items() if p not in self._empty}
        base = self.applied_ts
        if after is not None:
            applied.update((part.partition, part.target_ts) for part in after.parts)
            base = after.target_ts
        applied.update((part.partition, part.target_ts) for part in parts)
        target = max(min(applied.values(), default=base), base)
        offsets: dict[int, int | None] = {}
        resolved: dict[int, int] = {}
        tables: set = set()
        for part in parts:
            offsets.update(part.resume_offsets)
            resolved.update(part.resolved)
            tables |= part.tables
        rows: list[RowEvent] = []
        streamed = None
        if joint:
            # Versions of a key, or holders of a unique value, on two partitions: one transaction,
            # in commit-ts order.
            if any(part.streamed is not None for part in parts):
                streamed = _merged(parts)
            else:
                for part in parts:
                    rows += part.rows
        return Window(
            target_ts=target,
            rows=rows,
            ddl=None,
            resume_offsets=offsets,
            resolved=resolved,
            tables=frozenset(tables),
            base_ts=base,
            streamed=streamed,
            parts=tuple(parts),
            row_hold=self._row_hold(),
        )

    def _row_hold(self) -> int | None:
        hold = self.hold
        if hold is None:
            return None
        return ROW_HOLD_OPEN if hold.until is None else hold.until

    def _ddl_window(self, parts: tuple[Window, ...]) -> Window:
        first = parts[0]
        offsets: dict[int, int | None] = {}
        resolved: dict[int, int] = {}
        for part in parts:
            offsets.update(part.resume_offsets)
            resolved.update(part.resolved)
        return replace(
            first,
            resume_offsets=offsets,
            resolved=resolved,
            base_ts=min(part.base_ts for part in parts),
            parts=parts,
            row_hold=self._row_hold(),
        )

    def rows_ready_after(self, window: Window) -> int:
        """How many rows the parts after ``window`` could take (for ``WindowPipeline.hand_over``)."""
        if window.ddl is not None or not window.parts:
            return 0
        self._caps()
        inflight = {part.partition: part for part in window.parts}
        return sum(sub.rows_ready_after(inflight[p]) for p, sub in self._subs.items() if p in inflight)

    def early_window(self, base: int, min_rows: int, max_rows: int) -> Window | None:
        """None: in row mode a partition's rows are written as soon as it has their resolved ts."""
        return None

    def mark_applied(self, window: Window) -> None:
        """Every part of ``window`` committed: move each partition on."""
        if not window.parts:
            raise StaleWindowError("a row mode window has parts")
        for part in window.parts:
            self._subs[part.partition].mark_applied(part)

    # ------------------------------------------------------------------ back-pressure

    def total_cached_bytes(self) -> int:
        return sum(sub.total_cached_bytes() for sub in self._subs.values())

    def total_spilled_bytes(self) -> int:
        return sum(sub.total_spilled_bytes() for sub in self._subs.values())

    def total_cached_rows(self) -> int:
        return sum(sub.total_cached_rows() for sub in self._subs.values())

    def spill_over(self, max_cached_bytes: int, keep_fraction: float = 0.5) -> int:
        """Over ``max_cached_bytes``: each partition moves the rows it cannot release yet to disk,
        down to its share of the bound (``Barrier.spill_over``)."""
        if self.total_cached_bytes() <= max_cached_bytes:
            return 0
        share = max_cached_bytes // len(self._subs)
        return sum(sub.spill_over(share, keep_fraction) for sub in self._subs.values())

    def holding_back(self) -> int:
        """The partition with the lowest resolved ts: in joint release the one all wait for."""
        return min(
            ((sub.global_resolved(), p) for p, sub in self._subs.items() if p not in self._empty),
            default=(0, next(iter(self._subs))),
        )[1]

    def partitions_to_pause(self, max_cached_bytes: int, max_cached_rows: int | None = None) -> set[int]:
        """In joint release, as ``Barrier.partitions_to_pause`` over all partitions; otherwise none:
        a partition's rows leave memory as soon as it reads their resolved ts, which pausing it
        would only put off."""
        if not self.joint() or not self._over(max_cached_bytes, max_cached_rows, 1.0):
            return set()
        low = self.global_resolved()
        return {p for p, lst in self.listeners.items() if lst.resolved > low}

    def partitions_far_ahead(self, max_rows: int, paused: Iterable[int] = ()) -> set[int]:
        if not self.joint():
            return set()
        return far_ahead(self.listeners, self.global_resolved(), max_rows, paused)

    def partitions_to_resume(
        self,
        paused: Iterable[int],
        max_cached_bytes: int,
        resume_fraction: float = 0.8,
        max_cached_rows: int | None = None,
    ) -> set[int]:
        paused = set(paused)
        if not self.joint() or not self._over(max_cached_bytes, max_cached_rows, resume_fraction):
            return paused
        low = self.global_resolved()
        listeners = self.listeners
        return {p for p in paused if listeners[p].resolved <= low}

    def _over(self, max_cached_bytes: int, max_cached_rows: int | None, fraction: float) -> bool:
        return over_limits(self.listeners, max_cached_bytes, max_cached_rows, fraction)

"""The shared resolved/DDL barrier: decides what the daemon may apply next, across all partitions.

Rules (docs/open-protocol.md §5.5; the producer facts they rest on are §5.1-§5.4 and §5.7):

- The global resolved ts (the watermark) is the minimum of the partitions' resolved ts: only at or
  below it is the set of rows complete, because a partition behind it may still deliver first
  copies. Rows are released in commit-ts order across partitions up to it, whatever partition a
  key arrived on (the window is sorted and collapsed by the SQL planner).
- A partition that never held a record (``set_empty``) does not hold the watermark back: TiCDC
  keeps writing to the partition count it started with, so extra partitions can stay empty for
  good. The moment one delivers a record it counts again: TiCDC starts writing to it with rows above
  every resolved ts it had broadcast, so nothing applied meanwhile can be below them, unless its
  rows were fetched late; that is checked, and stops the daemon rather than skip them.
- DDLs are queued (each partition keeps its broadcast copy) and run once each, in commit-ts order,
  when the watermark has reached their ts D: every first copy below D has been delivered by then,
  on every partition, including rows of tables the DDL does not block, which the new architecture
  may deliver after the DDL itself. Rows below D are applied first, the DDL alone, then rows
  above it. Nothing here waits for a DDL to arrive on every partition: the watermark says more.
- Rows of a commit ts the barrier cannot release yet are moved to disk once the cache is over its
  bound (``spill_over``, ``applier.stream.spill``): one upstream transaction can be larger than memory,
  and the partitions still reading it are the ones holding the barrier back, so pausing them is
  no way out. A window with such rows carries them as ``Window.streamed``.
- Several topics (docs/open-protocol.md §5.10): the watermark is the minimum over every partition of
  every topic. Partitions that get no resolved events (their tables do not change) are given one
  when a fetch made after a resolved ts was seen reached their end
  (``PartitionListener.observe_drained``). A topic created after a resolved ts R was written may
  hold rows at or below R, so the watermark never passes ``cap``: the highest resolved ts seen
  before the last topic listing that has been joined.
- Tables that wait for a DDL (``ddl_blocking = "tables"``, docs/operations.md): while a DDL that
  changes a table's shape runs beside the stream (``holds``), that table's rows stay in the cache
  and the windows go on with every other table's. The front ts (``SharedProgress.front_ts``) is
  then what every other table is applied up to, and the applied ts, which the checkpoint says,
  stays at what the waiting tables are applied up to: a restart reads from their oldest row
  again and skips the other tables' rows by their per-table ts. Once the DDL finished, the next
  window takes the rows that waited. A DDL that shares a table with one running (or whose tables
  cannot be read from its text) waits until those rows are applied; rows above it wait with it.
- Nothing is removed from memory until the daemon reports the window applied
  (``mark_applied``): ``next_window`` is a pure function of the current state, so a failed
  transaction can be retried with the same window.

The daemon loop is: feed records; ``w = barrier.next_window()``; apply ``w`` (rows, or the DDL);
write the checkpoint from ``w`` in the same transaction; ``barrier.mark_applied(w)``; repeat until
``next_window`` returns None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from applier.codec.events import DDLEvent, Event, RowEvent
from applier.errors import ApplierError
from applier.stream.listener import KeylessVersions, PartitionListener
from applier.stream.progress import DDLKey, SharedProgress, TableKey, ddl_key
from applier.stream.spill import GroupPart, SpillDir, StreamedRows
from applier.stream.window import Window
from checkpoint import Checkpoint


class StaleWindowError(ApplierError):
    """``mark_applied`` got a window that was not built from the current applied state."""


class TableHolds(Protocol):
    """The tables whose rows wait for a DDL running beside the stream (in downstream names, since
    routes may merge upstream tables into one)."""

    def tables(self) -> frozenset[TableKey]:
        """The tables held now."""
        ...

    def route(self, table: TableKey) -> TableKey:
        """The downstream table of an upstream one."""
        ...

    def scope(self, ddl: DDLEvent) -> frozenset[TableKey] | None:
        """The downstream tables ``ddl`` may change; None when that is not a set of tables."""
        ...


class Barrier:
    """Owns one ``PartitionListener`` per partition of the topic and the shared applied progress.

    The global resolved ts needs every partition: one that has not delivered anything yet holds
    the barrier at the checkpoint's ts, unless it is known to be empty (``set_empty``). Partitions
    added to the topic while the daemon runs join with ``add_partition``. Without ``spill`` (a
    spill directory) rows always stay in memory.
    """

    def __init__(
        self,
        partitions: Iterable[int],
        state: Checkpoint | None = None,
        spill: SpillDir | None = None,
    ) -> None:
        state = state or Checkpoint()
        parts = sorted(set(partitions))
        if not parts:
            raise ValueError("a barrier needs at least one partition")
        self._progress = SharedProgress(state)
        self._versions = KeylessVersions()
        self._spill = spill
        self._empty: set[int] = set()
        self.cap: int | None = None  # several topics: see the module docstring
        self.holds: TableHolds | None = None
        """Tables held by DDLs running beside the stream (module docstring); None: never any."""
        self._held: dict[TableKey, int] = {}  # held table -> the ts its rows are applied up to
        self._listeners: dict[int, PartitionListener] = {
            p: PartitionListener(p, self._progress, state.offsets.get(p), self._versions, spill)
            for p in parts
        }
        for p, floor in state.partition_applied.items():
            if p in self._listeners:
                self._listeners[p].floor = floor

    def add_partition(self, partition: int, start_offset: int | None = None) -> None:
        """A partition added to the topic while running. Until it delivers a resolved ts it holds
        the watermark at the applied ts (rows already cached stay cached), unless ``set_empty``."""
        if partition in self._listeners:
            raise ValueError(f"partition {partition} is already read")
        self._listeners[partition] = PartitionListener(
            partition, self._progress, start_offset, self._versions, self._spill
        )
        self._listeners = dict(sorted(self._listeners.items()))

    def set_empty(self, partition: int, empty: bool) -> None:
        """Whether ``partition`` never held a record (read to its end, nothing in it): an empty
        partition does not hold the watermark back. Cleared before its first record is fed; its
        rows must then be above the applied ts (module docstring), which its listener checks
        until it reads a resolved ts (``RowsBehindWatermark``)."""
        if partition not in self._listeners:
            raise KeyError(partition)
        if empty:
            self._empty.add(partition)
        elif partition in self._empty:
            self._empty.discard(partition)
            self._listeners[partition].rejoin_floor = self._progress.front_ts

    def lift(self, ts: int) -> None:
        """Row mode (``applier.stream.row_release``): this barrier's partition held no record and
        starts to deliver while the others are applied up to ``ts``; nothing of it is at or below."""
        progress = self._progress
        if ts > progress.applied_ts and not self._held:
            progress.applied_ts = progress.front_ts = ts
            progress.prune()

    # ------------------------------------------------------------------ plumbing

    @property
    def listeners(self) -> Mapping[int, PartitionListener]:
        return self._listeners

    def listener(self, partition: int) -> PartitionListener:
        return self._listeners[partition]

    def feed(
        self,
        partition: int,
        offset: int,
        events: Sequence[Event],
        record_bytes: int = 0,
        raw: tuple[bytes | None, bytes | None] | None = None,
    ) -> None:
        """Shortcut for ``listener(partition).feed(...)``."""
        self._listeners[partition].feed(offset, events, record_bytes, raw)

    @property
    def applied_ts(self) -> int:
        """Global applied resolved ts: every row <= this is applied downstream."""
        return self._progress.applied_ts

    def applied_ddl_keys(self) -> frozenset[DDLKey]:
        """Applied DDLs a checkpoint must remember (those above the applied ts)."""
        g = self._progress.applied_ts
        return frozenset(k for k in self._progress.applied_ddls if k[0] > g)

    def resume_offsets(self) -> dict[int, int | None]:
        """Per-partition restart offsets for the current applied state."""
        return {p: lst.resume_offset() for p, lst in self._listeners.items()}

    def checkpoint(self) -> Checkpoint:
        """The current applied state as a checkpoint (what a restart would start from)."""
        g = self._progress.applied_ts
        return Checkpoint(
            resolved_ts=g,
            tables={t: ts for t, ts in self._progress.table_ts.items() if ts > g},
            applied_ddls=self.applied_ddl_keys(),
            offsets={p: o for p, o in self.resume_offsets().items() if o is not None},
        )

    # ------------------------------------------------------------------ the barrier

    def global_resolved(self) -> int:
        """Minimum over the partitions (empty ones left out) of their resolved ts: the watermark
        (never above ``cap``, nor below the applied ts)."""
        empty = self._empty
        front = self._progress.front_ts
        low = min((lst.resolved for p, lst in self._listeners.items() if p not in empty), default=front)
        cap = self.cap
        return low if cap is None or cap >= low else max(cap, front)

    def max_observed(self) -> int | None:
        """The highest resolved ts read on any partition in this session (None before the first)."""
        return max(
            (ts for lst in self._listeners.values() if (ts := lst.observed_resolved) is not None),
            default=None,
        )

    def _min_pending_ddl_ts(self) -> int | None:
        return min(
            (ts for lst in self._listeners.values() if (ts := lst.min_pending_ddl_ts()) is not None),
            default=None,
        )

    def _first_ddl_at(self, ts: int) -> DDLEvent:
        """The DDL at ``ts`` to run first: arrival order of the lowest partition holding one.

        Several DDLs can share a commit ts (TiCDC splits multi-table DDLs into one event per table,
        all at one ts); they are written in the producer's order to every partition.
        """
        for lst in self._listeners.values():
            for ddl in lst.pending_ddls():
                if ddl.commit_ts == ts:
                    return ddl
        raise AssertionError("no pending DDL at the minimum pending ts")

    def next_window(
        self, max_rows: int | None = None, *, merge: bool = True, after: Window | None = None
    ) -> Window | None:
        """What to apply next, or None when nothing can move. Never changes any state.

        T = global resolved ts, capped at D - 1 while a DDL with ts D is pending anywhere.
        - Cached rows <= T exist: a row window. ``merge=True`` (default) takes all of them up to T in
          one window (catching up after a lag in one transaction); ``merge=False`` takes one
          commit ts (one upstream transaction) per window. ``max_rows`` bounds a merged window by
          whole commit ts: transactions are added in ts order while the total stays <= max_rows
          (always at least one). ``target_ts`` is T when every row <= T is included, else the
          last included commit ts.
        - Else, the lowest pending DDL's ts D is at or below the watermark: a DDL window
          (target D - 1). A DDL above the watermark waits, however many partitions hold it.
        - Else, T > applied ts: an empty window that only moves the applied ts to T (the daemon
          may skip the database transaction but should still call ``mark_applied``).

        ``after``: a row window built from the current state and not yet marked applied (it is
        being applied). Returns the row window that follows it, as if it were applied, so the
        daemon can prepare that one while the database works on ``after``; ``mark_applied``
        accepts it once ``after`` is marked. Only row windows are built ahead: None when the next
        step is a DDL, an empty window, or nothing.
        """
        if max_rows is not None and max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        held = self._holding()
        if held or self._held:
            return None if after is not None else self._next_beside(held)
        g = self._progress.applied_ts
        if after is not None:
            if after.ddl is not None or after.base_ts != g:
                return None
            g = after.target_ts
        ddl_ts = self._min_pending_ddl_ts()
        target = self._row_target(ddl_ts)
        if target > g:
            listeners = self._listeners.values()
            below = sum(lst.count_upto(g) for lst in listeners) if after is not None else 0
            total = sum(lst.count_upto(target) for lst in listeners) - below
            if total:
                first = min(ts for lst in listeners if (ts := lst.min_cached_ts_above(g)) is not None)
                if not merge:
                    if total > sum(lst.count_upto(first) for lst in listeners) - below:
                        target = first  # more than one commit ts is ready: take the first only
                elif max_rows is not None and total > max_rows:
                    target = self._cut(first, target, max_rows + below)
                return self._build(target, None, g)
        if after is not None:
            return None
        if ddl_ts is not None and ddl_ts <= self.global_resolved():
            return self._build(ddl_ts - 1, self._first_ddl_at(ddl_ts), g)
        if target > g:
            return self._build(target, None, g)
        return None

    def _holding(self) -> frozenset[TableKey]:
        return self.holds.tables() if self.holds is not None else frozenset()

    def _waits(self, held: frozenset[TableKey]) -> Callable[[TableKey], bool] | None:
        """Whether an upstream table's rows wait (None: no table waits)."""
        if not held:
            return None
        assert self.holds is not None
        route = self.holds.route
        return lambda table: route(table) in held

    def _next_beside(self, held: frozenset[TableKey]) -> Window | None:
        """``next_window`` while tables wait for a DDL (``held``) or hold rows that waited: every
        cached row up to the watermark but the held tables', in one window (no row cap: what waited
        for a DDL is applied at once); then a DDL that shares no table with those still waiting.
        A window of spilled rows waits until no table does."""
        front = self._progress.front_ts
        ddl_ts = self._min_pending_ddl_ts()
        target = max(self._row_target(ddl_ts), front)
        listeners = self._listeners.values()
        # The rows at or below the front ts are the waiting tables' only: looked at again only
        # once one of those tables is released, not every time the loop asks.
        after = front if self._held.keys() <= held else -1
        if any(lst.has_spilled(after, target) for lst in listeners):
            return None
        rows: list[RowEvent] = []
        tables: set[TableKey] = set()
        waits = self._waits(held)
        for lst in listeners:
            lst.collect(after, target, rows, tables, waits)
        if rows or target > front:
            return self._beside(target, None, rows, tables, held)
        if ddl_ts is None or ddl_ts > self.global_resolved():
            return None
        ddl = self._first_ddl_at(ddl_ts)
        assert self.holds is not None
        scope = self.holds.scope(ddl)
        if scope is None or not scope.isdisjoint(held | self._held.keys()):
            return None  # it waits for the DDLs of its tables and the rows that waited for them
        return self._beside(ddl_ts - 1, ddl, rows, tables, held)

    def _beside(
        self,
        target: int,
        ddl: DDLEvent | None,
        rows: list[RowEvent],
        tables: set[TableKey],
        held: frozenset[TableKey],
    ) -> Window:
        front = self._progress.front_ts
        floor = min(min((self._held.get(t, front) for t in held), default=target), target)
        # Resumed from the oldest row still waiting: a restart reads it again (the other tables'
        # rows on the way are skipped by their per-table ts).
        return self._window(target, ddl, front, rows, tables, held=held, floor=floor)

    def _row_target(self, ddl_ts: int | None) -> int:
        """The highest ts rows can be released up to: the watermark, below the lowest pending DDL."""
        target = self.global_resolved()
        return target if ddl_ts is None else min(target, ddl_ts - 1)

    def rows_ready_after(self, window: Window) -> int:
        """How many rows ``next_window(after=window)`` could take with no row cap (0 when it would
        build nothing): bisections only, so the daemon can ask every few records whether a full
        window already waits behind the one being applied."""
        if window.ddl is not None or window.base_ts != self._progress.front_ts or self._held or window.held:
            return 0
        target = self._row_target(self._min_pending_ddl_ts())
        if target <= window.target_ts:
            return 0
        listeners = self._listeners.values()
        return sum(lst.count_upto(target) - lst.count_upto(window.target_ts) for lst in listeners)

    def early_window(self, base: int, min_rows: int, max_rows: int) -> Window | None:
        """Rows above the watermark that have most likely all arrived, to be written before their
        window is released, starting above ``base`` (the applied ts, or the target of the early rows
        written already); None below ``min_rows`` rows. Never changes any state. Built here as any
        window is; when to write one, and what is open, is ``applier.apply.early.EarlyWriter``'s.

        Its target E is the lowest, over the partitions (empty ones left out), of the partition's
        resolved ts or, when higher, one below its newest cached commit ts: a partition delivers
        the versions of a row in commit-ts order (docs/open-protocol.md §5), so what it holds below
        its newest commit ts is usually all it will ever hold there, and the newest one may still
        miss rows of its transaction. Usually is not always (the physical partitions of one table,
        a late first copy, a replay): the window released later must hold exactly these rows at
        or below E, which the applier checks before it commits them. E stays below a pending DDL,
        bounded by ``max_rows`` by whole commit ts, and no early window holds spilled rows or is
        built while several topics are read (``cap``: a new topic may still bring rows below E).
        """
        if self.cap is not None or min_rows < 1 or self._held or self._holding():
            return None
        empty = self._empty
        target: int | None = None
        for p, lst in self._listeners.items():
            if p in empty:
                continue
            edge = lst.resolved
            top = lst.max_cached_ts()
            if top is not None and top - 1 > edge:
                edge = top - 1
            if target is None or edge < target:
                target = edge
        ddl_ts = self._min_pending_ddl_ts()
        if target is None or (ddl_ts is not None and ddl_ts <= base + 1):
            return None
        if ddl_ts is not None:
            target = min(target, ddl_ts - 1)
        if target <= base:
            return None
        listeners = self._listeners.values()
        below = sum(lst.count_upto(base) for lst in listeners)
        total = sum(lst.count_upto(target) for lst in listeners) - below
        if total < min_rows:
            return None
        if total > max_rows:
            first = min(ts for lst in listeners if (ts := lst.min_cached_ts_above(base)) is not None)
            target = self._cut(first, target, max_rows + below)
            if sum(lst.count_upto(target) for lst in listeners) - below > max_rows:
                return None  # one transaction alone is over the bound: leave it to its window
        if any(lst.has_spilled(base, target) for lst in listeners):
            return None
        return self._build(target, None, base)

    def _cut(self, first: int, target: int, max_rows: int) -> int:
        """The highest cached commit ts X <= ``target`` with at most ``max_rows`` rows <= X, or
        ``first`` (the lowest cached ts of the window) when that one alone is over the limit.

        Bisects over the ts range with per-listener prefix counts: O(64 x partitions x log n)
        instead of walking every cached commit ts, which mattered for windows of 100k rows.
        """
        listeners = self._listeners.values()
        lo, hi = first, target  # invariant: answer in [lo, hi]; count(<= lo) may exceed max_rows
        if sum(lst.count_upto(first) for lst in listeners) > max_rows:
            return first
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(lst.count_upto(mid) for lst in listeners) <= max_rows:
                lo = mid
            else:
                hi = mid - 1
        return max(ts for lst in listeners if (ts := lst.max_cached_ts_upto(lo)) is not None)

    def _build(self, target: int, ddl: DDLEvent | None, base: int) -> Window:
        rows: list[RowEvent] = []
        tables: set[TableKey] = set()
        streamed = None
        if ddl is None:
            listeners = self._listeners.values()
            if any(lst.has_spilled(base, target) for lst in listeners):
                parts: list[GroupPart] = []
                for lst in listeners:
                    lst.collect_parts(base, target, parts, tables)
                parts.sort(key=lambda part: part.commit_ts)  # stable: partition order within a ts
                streamed = StreamedRows(tuple(parts))
            else:
                for lst in listeners:
                    lst.collect(base, target, rows, tables)
        return self._window(target, ddl, base, rows, tables, streamed)

    def _window(
        self,
        target: int,
        ddl: DDLEvent | None,
        base: int,
        rows: list[RowEvent],
        tables: set[TableKey],
        streamed: StreamedRows | None = None,
        *,
        held: frozenset[TableKey] = frozenset(),
        floor: int | None = None,
    ) -> Window:
        key = None if ddl is None else ddl_key(ddl)
        if ddl is not None and ddl.table:
            tables.add((ddl.schema, ddl.table))
        applied = target if floor is None else floor
        return Window(
            target_ts=target,
            rows=rows,
            ddl=ddl,
            resume_offsets={
                p: lst.resume_offset(applied, excluding_ddl=key) for p, lst in self._listeners.items()
            },
            resolved={p: lst.resolved for p, lst in self._listeners.items()},
            tables=frozenset(tables),
            base_ts=base,
            streamed=streamed,
            held=held,
            floor_ts=floor,
        )

    def mark_applied(self, window: Window) -> None:
        """The daemon committed ``window``: move the applied ts, forget its rows, record its DDL."""
        progress = self._progress
        front = progress.front_ts
        if window.base_ts != front or window.target_ts < front:
            raise StaleWindowError(
                f"window built on applied ts {window.base_ts} (target {window.target_ts}) "
                f"but the applied ts is now {front}"
            )
        key = window.ddl_key
        if key is not None and not any(lst.has_pending_ddl(key) for lst in self._listeners.values()):
            raise StaleWindowError(f"DDL at ts {key[0]} is not pending any more (applied twice?)")
        target = window.target_ts
        if window.held or self._held:
            self._held = {t: self._held.get(t, front) for t in window.held}
            table_ts = progress.table_ts
            for t in window.tables:  # what a restart skips: the checkpoint says the same
                if table_ts.get(t, 0) < target:
                    table_ts[t] = target
        progress.front_ts = target
        progress.applied_ts = window.resolved_ts
        if key is not None:
            progress.applied_ddls.add(key)
        progress.prune()
        waits = self._waits(window.held)
        for lst in self._listeners.values():
            lst.discard_applied(key, waits)

    # ------------------------------------------------------------------ back-pressure

    def total_cached_bytes(self) -> int:
        """Cache bytes of the rows in memory (spilled rows not included)."""
        return sum(lst.cached_bytes for lst in self._listeners.values())

    def total_spilled_bytes(self) -> int:
        return sum(lst.spilled_bytes for lst in self._listeners.values())

    def spill_over(self, max_cached_bytes: int, keep_fraction: float = 0.5) -> int:
        """When the rows in memory are over ``max_cached_bytes``: move rows to disk, the biggest
        commit ts first, until they are below ``keep_fraction`` of it. Returns the rows moved.

        Only commit ts above the global resolved ts: no window holds their rows (the one being
        applied and the one built ahead are at or below it), and they are the ones that can wait
        longest. Rows at or below it are about to be applied and leave memory then. Without a
        spill directory nothing moves.
        """
        if self._spill is None or self.total_cached_bytes() <= max_cached_bytes:
            return 0
        low = self.global_resolved()
        candidates = [
            (nbytes, ts, lst) for lst in self._listeners.values() for nbytes, ts in lst.spill_candidates(low)
        ]
        candidates.sort(key=lambda c: c[0], reverse=True)
        moved = 0
        goal = max_cached_bytes * keep_fraction
        total = self.total_cached_bytes()
        for nbytes, ts, lst in candidates:
            if total <= goal:
                break
            moved += lst.spill_group(ts)
            total -= nbytes
        return moved

    def holding_back(self) -> int:
        """The partition with the smallest resolved ts (lowest id on ties): the one the barrier waits for."""
        waiting = [lst for p, lst in self._listeners.items() if p not in self._empty]
        return min(
            waiting or self._listeners.values(), key=lambda lst: (lst.resolved, lst.partition)
        ).partition

    def total_cached_rows(self) -> int:
        """Rows in memory (spilled rows not included)."""
        return sum(lst.cached_rows for lst in self._listeners.values())

    def _over(self, max_cached_bytes: int, max_cached_rows: int | None, fraction: float) -> bool:
        return over_limits(self._listeners, max_cached_bytes, max_cached_rows, fraction)

    def partitions_to_pause(self, max_cached_bytes: int, max_cached_rows: int | None = None) -> set[int]:
        """When the cache is over ``max_cached_bytes`` (or ``max_cached_rows``): the partitions
        ahead of the global resolved ts.

        They hold rows the barrier cannot release until the partitions behind catch up, so reading
        more from them only grows memory; the partitions at the global resolved ts keep being read
        (one of them holds the barrier back), so pausing the others cannot deadlock.
        """
        if not self._over(max_cached_bytes, max_cached_rows, 1.0):
            return set()
        low = self.global_resolved()
        return {p for p, lst in self._listeners.items() if lst.resolved > low}

    def partitions_far_ahead(self, max_rows: int, paused: Iterable[int] = ()) -> set[int]:
        """Partitions ahead of the global resolved ts that hold more than ``max_rows`` rows above it
        (half that for the ``paused`` ones, so pausing does not flap).

        Reading them further cannot help the next window; pausing them early lets the consumer
        fetch the partitions that hold the barrier back (some brokers serve partitions unevenly).
        The partitions at the global resolved ts are never in the set, so this cannot deadlock.
        """
        return far_ahead(self._listeners, self.global_resolved(), max_rows, paused)

    def partitions_to_resume(
        self,
        paused: Iterable[int],
        max_cached_bytes: int,
        resume_fraction: float = 0.8,
        max_cached_rows: int | None = None,
    ) -> set[int]:
        """Which of the ``paused`` partitions to resume: all of them once the cache is below
        ``resume_fraction`` of the limits (hysteresis, so pausing does not flap), else those no
        longer ahead of the global resolved ts."""
        paused = set(paused)
        if not self._over(max_cached_bytes, max_cached_rows, resume_fraction):
            return paused
        low = self.global_resolved()
        return {p for p in paused if self._listeners[p].resolved <= low}


def over_limits(
    listeners: Mapping[int, PartitionListener],
    max_cached_bytes: int,
    max_cached_rows: int | None,
    fraction: float,
) -> bool:
    """Whether the rows ``listeners`` hold are over ``fraction`` of the limits. Spilled rows count
    too: pausing is what keeps the partitions ahead from filling the disk instead of memory while
    the barrier waits."""
    held = sum(lst.cached_bytes + lst.spilled_bytes for lst in listeners.values())
    if held > max_cached_bytes * fraction:
        return True
    rows = sum(lst.held_rows for lst in listeners.values())
    return max_cached_rows is not None and rows > max_cached_rows * fraction


def far_ahead(
    listeners: Mapping[int, PartitionListener], low: int, max_rows: int, paused: Iterable[int] = ()
) -> set[int]:
    """The partitions ahead of ``low`` holding more than ``max_rows`` rows above it (half that for
    the ``paused`` ones): ``Barrier.partitions_far_ahead``."""
    paused = set(paused)
    out = set()
    for p, lst in listeners.items():
        if lst.resolved > low:
            limit = max_rows // 2 if p in paused else max_rows
            if lst.held_rows - lst.count_upto(low) > limit:
                out.add(p)
    return out

"""The shared resolved/DDL barrier: decides what the daemon may apply next, across all partitions.

Rules (open-protocol.md sections 5 and 6):

- The global resolved ts is the minimum of the partitions' resolved ts: only below it is the set of
  rows complete, because a partition behind it may still deliver rows.
- A DDL with commit ts D runs once, only when every partition has reached it (has it pending, or
  has resolved >= D), after every row < D and before any row > D. While a DDL is pending anywhere,
  rows are released only up to D - 1.
- Nothing is removed from memory until the daemon reports the window applied
  (``mark_applied``): ``next_window`` is a pure function of the current state, so a failed
  transaction can be retried with the same window.

The daemon loop is: feed records; ``w = barrier.next_window()``; apply ``w`` (rows, or the DDL);
write the checkpoint from ``w`` in the same transaction; ``barrier.mark_applied(w)``; repeat until
``next_window`` returns None.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from applier.codec.events import DDLEvent, Event
from applier.listener import PartitionListener
from applier.progress import CheckpointState, DDLKey, SharedProgress, TableKey, ddl_key
from applier.window import Window


class StaleWindowError(RuntimeError):
    """``mark_applied`` got a window that was not built from the current applied state."""


class Barrier:
    """Owns one ``PartitionListener`` per partition of the topic and the shared applied progress.

    All partitions are known up front: the global resolved ts needs every one of them, and a
    partition that has not delivered anything yet holds the barrier at the checkpoint's ts.
    """

    def __init__(self, partitions: Iterable[int], state: CheckpointState | None = None) -> None:
        state = state or CheckpointState()
        parts = sorted(set(partitions))
        if not parts:
            raise ValueError("a barrier needs at least one partition")
        self._progress = SharedProgress(state)
        self._listeners: dict[int, PartitionListener] = {
            p: PartitionListener(p, self._progress, state.offsets.get(p)) for p in parts
        }

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

    def checkpoint_state(self) -> CheckpointState:
        """The current applied state as a ``CheckpointState`` (what a restart would start from)."""
        g = self._progress.applied_ts
        return CheckpointState(
            applied_ts=g,
            table_ts={t: ts for t, ts in self._progress.table_ts.items() if ts > g},
            applied_ddls=self.applied_ddl_keys(),
            offsets={p: o for p, o in self.resume_offsets().items() if o is not None},
        )

    # ------------------------------------------------------------------ the barrier

    def global_resolved(self) -> int:
        """Minimum over partitions of their resolved ts (DDL-implied ``D - 1`` included)."""
        return min(lst.resolved for lst in self._listeners.values())

    def _min_pending_ddl_ts(self) -> int | None:
        return min(
            (ts for lst in self._listeners.values() if (ts := lst.min_pending_ddl_ts()) is not None),
            default=None,
        )

    def _first_ddl_at(self, ts: int) -> DDLEvent:
        """The DDL at ``ts`` to run first: arrival order of the lowest partition holding one.

        Several DDLs can share a commit ts; each partition receives them in the producer's order.
        """
        for lst in self._listeners.values():
            for ddl in lst.pending_ddls():
                if ddl.commit_ts == ts:
                    return ddl
        raise AssertionError("no pending DDL at the minimum pending ts")

    def _is_reached(self, key: DDLKey) -> bool:
        return all(lst.has_pending_ddl(key) or lst.resolved >= key[0] for lst in self._listeners.values())

    def next_window(self, max_rows: int | None = None, *, merge: bool = True) -> Window | None:
        """What to apply next, or None when nothing can move. Never changes any state.

        T = global resolved ts, capped at D - 1 while a DDL with ts D is pending anywhere.
        - Cached rows <= T exist: a row window. ``merge=True`` (default) takes all of them up to T in
          one window (catching up after a lag in one transaction); ``merge=False`` takes one
          commit ts (one upstream transaction) per window. ``max_rows`` bounds a merged window by
          whole commit ts: transactions are added in ts order while the total stays <= max_rows
          (always at least one). ``target_ts`` is T when every row <= T is included, else the
          last included commit ts.
        - Else, the DDL at D is reached by every partition: a DDL window (target D - 1).
        - Else, T > applied ts: an empty window that only moves the applied ts to T (the daemon
          may skip the database transaction but should still call ``mark_applied``).
        """
        if max_rows is not None and max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        g = self._progress.applied_ts
        target = self.global_resolved()
        ddl_ts = self._min_pending_ddl_ts()
        if ddl_ts is not None:
            target = min(target, ddl_ts - 1)
        if target > g:
            ts_lists = [lst.cached_ts_upto(target) for lst in self._listeners.values()]
            ts_values = _merge_distinct(ts_lists)
            if ts_values:
                take = len(ts_values)
                if not merge:
                    take = 1
                elif max_rows is not None:
                    take = self._take_within(ts_values, max_rows)
                if take < len(ts_values):
                    target = ts_values[take - 1]
                return self._build(target, None)
        if ddl_ts is not None:
            ddl = self._first_ddl_at(ddl_ts)
            if self._is_reached(ddl_key(ddl)):
                return self._build(ddl_ts - 1, ddl)
        if target > g:
            return self._build(target, None)
        return None

    def _take_within(self, ts_values: list[int], max_rows: int) -> int:
        total = 0
        for i, ts in enumerate(ts_values):
            total += sum(lst.row_count_at(ts) for lst in self._listeners.values())
            if total > max_rows:
                return max(i, 1)
        return len(ts_values)

    def _build(self, target: int, ddl: DDLEvent | None) -> Window:
        key = None if ddl is None else ddl_key(ddl)
        rows = []
        if ddl is None:
            for lst in self._listeners.values():
                rows.extend(lst.rows_upto(target))
        tables: set[TableKey] = {(r.schema, r.table) for r in rows}
        if ddl is not None and ddl.table:
            tables.add((ddl.schema, ddl.table))
        return Window(
            target_ts=target,
            rows=rows,
            ddl=ddl,
            resume_offsets={
                p: lst.resume_offset(target, excluding_ddl=key) for p, lst in self._listeners.items()
            },
            resolved={p: lst.resolved for p, lst in self._listeners.items()},
            tables=frozenset(tables),
            base_ts=self._progress.applied_ts,
        )

    def mark_applied(self, window: Window) -> None:
        """The daemon committed ``window``: move the applied ts, forget its rows, record its DDL."""
        g = self._progress.applied_ts
        if window.base_ts != g or window.target_ts < g:
            raise StaleWindowError(
                f"window built on applied ts {window.base_ts} (target {window.target_ts}) "
                f"but the applied ts is now {g}"
            )
        key = window.ddl_key
        if key is not None and not any(lst.has_pending_ddl(key) for lst in self._listeners.values()):
            raise StaleWindowError(f"DDL at ts {key[0]} is not pending any more (applied twice?)")
        self._progress.applied_ts = window.target_ts
        if key is not None:
            self._progress.applied_ddls.add(key)
        self._progress.prune()
        for lst in self._listeners.values():
            lst.discard_applied(key)

    # ------------------------------------------------------------------ back-pressure

    def total_cached_bytes(self) -> int:
        return sum(lst.cached_bytes for lst in self._listeners.values())

    def holding_back(self) -> int:
        """The partition with the smallest resolved ts (lowest id on ties): the one the barrier waits for."""
        return min(self._listeners.values(), key=lambda lst: (lst.resolved, lst.partition)).partition

    def partitions_to_pause(self, max_cached_bytes: int) -> set[int]:
        """When the cache is over ``max_cached_bytes``: the partitions ahead of the global resolved ts.

        They hold rows the barrier cannot release until the partitions behind catch up, so reading
        more from them only grows memory; the partitions at the global resolved ts keep being read
        (one of them holds the barrier back), so pausing the others cannot deadlock.
        """
        if self.total_cached_bytes() <= max_cached_bytes:
            return set()
        low = self.global_resolved()
        return {p for p, lst in self._listeners.items() if lst.resolved > low}

    def partitions_to_resume(
        self, paused: Iterable[int], max_cached_bytes: int, resume_fraction: float = 0.8
    ) -> set[int]:
        """Which of the ``paused`` partitions to resume: all of them once the cache is below
        ``resume_fraction`` of the limit (hysteresis, so pausing does not flap), else those no
        longer ahead of the global resolved ts."""
        paused = set(paused)
        if self.total_cached_bytes() < max_cached_bytes * resume_fraction:
            return paused
        low = self.global_resolved()
        return {p for p in paused if self._listeners[p].resolved <= low}


def _merge_distinct(sorted_lists: list[list[int]]) -> list[int]:
    out: list[int] = []
    for ts in heapq.merge(*sorted_lists):
        if not out or out[-1] != ts:
            out.append(ts)
    return out

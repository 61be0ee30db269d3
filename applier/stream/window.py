"""A unit of work the daemon applies downstream: rows up to a target ts, or one DDL.

The barrier builds windows; the daemon turns them into SQL, commits, writes a checkpoint from the
window's fields, then calls ``Barrier.mark_applied``. A window is a snapshot: it never changes
after it was built, so the daemon can retry it from memory after a failed transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from applier.codec.events import DDLEvent, RowEvent, has_handle_key
from applier.stream.progress import DDLKey, TableKey, ddl_key
from applier.stream.spill import StreamedRows


def is_keyless(row: RowEvent) -> bool:
    """True when neither image of ``row`` has a handle-key column.

    Such rows are matched downstream by all their columns and inserted with plain INSERT, so
    applying one twice leaves two rows: they need exact (not "at least once") delivery.
    """
    return not (has_handle_key(row.new) or has_handle_key(row.old))


@dataclass(frozen=True, slots=True)
class Window:
    """What to apply next, and what to record once it is committed.

    - ``target_ts``: after this window every row with commit ts <= target_ts is applied
      (the new global applied resolved ts to store in the checkpoint).
    - ``rows``: the rows to apply, all with ``base_ts < commit_ts <= target_ts``. Partitions are
      concatenated in partition order; inside one partition rows are in commit-ts order, arrival
      order within one ts. The SQL planner must sort by commit ts (stable) before applying. After a
      producer replay a keyed row may appear twice with identical content and ts: harmless for
      REPLACE/DELETE by key, and keyless rows are deduplicated before they get here.
    - ``ddl``: a DDL to execute (then ``rows`` is empty); ``target_ts`` is then ``ddl.commit_ts - 1``.
    - ``resume_offsets``: per partition, the Kafka offset to restart from once this window is
      applied (``None``: nothing read yet and no start offset known).
    - ``resolved``: per partition resolved ts when the window was built (for logs and metrics).
    - ``tables``: tables touched by the rows or the DDL (for per-table checkpoints).
    - ``base_ts``: the applied ts the window builds on; ``mark_applied`` refuses a window whose
      base is no longer current.
    - ``streamed``: set instead of ``rows`` when some of the window's rows were spilled to disk
      (``applier.stream.spill``): they are read back and applied in pieces, still in one transaction.
    - ``held``: (downstream) tables whose rows the window leaves out because a DDL of theirs runs
      beside the stream (``ddl_blocking = "tables"``); their rows wait in the cache, so the window
      may also hold rows at or below ``base_ts`` of tables that waited before it.
    - ``floor_ts``: with tables waiting, the ts every table is applied up to after this window
      (below ``target_ts``): what the checkpoint's resolved ts says (:attr:`resolved_ts`).
    - ``parts``: row mode (``applier.stream.row_release``): the window is made of one window per
      partition, each with its own base and target, applied on that partition's session; ``rows``
      is then empty, ``target_ts`` the lowest partition's applied ts once they are all applied, and
      a DDL window holds every partition's window at the DDL. While the partitions release
      together (:attr:`joint`), ``rows`` or ``streamed`` hold every part's rows as well.
    - ``row_hold``: row mode, the joint release to keep across a restart (``Checkpoint.row_hold``);
      None: none.
    """

    target_ts: int
    rows: list[RowEvent]
    ddl: DDLEvent | None
    resume_offsets: dict[int, int | None]
    resolved: dict[int, int]
    tables: frozenset[TableKey]
    base_ts: int
    streamed: StreamedRows | None = None
    held: frozenset[TableKey] = frozenset()
    floor_ts: int | None = None
    parts: tuple[Window, ...] = ()
    row_hold: int | None = None

    @property
    def resolved_ts(self) -> int:
        """The changefeed's resolved ts once the window is applied: every row of every table at or
        below it is downstream."""
        return self.target_ts if self.floor_ts is None else self.floor_ts

    @property
    def ddl_key(self) -> DDLKey | None:
        return None if self.ddl is None else ddl_key(self.ddl)

    @property
    def row_count(self) -> int:
        """Rows of the window, in memory or spilled."""
        own = len(self.rows) + (self.streamed.count if self.streamed is not None else 0)
        return own or sum(part.row_count for part in self.parts)

    @property
    def is_empty(self) -> bool:
        """No rows and no DDL: the window only moves the applied ts (and the resume offsets)."""
        return (
            not self.rows
            and self.ddl is None
            and self.streamed is None
            and all(part.is_empty for part in self.parts)
        )

    @property
    def joint(self) -> bool:
        """Row mode, partitions released together: the parts' rows are in ``rows`` (or
        ``streamed``) too, to be written in one transaction on one session."""
        return bool(self.parts) and self.ddl is None and bool(self.rows or self.streamed is not None)

    @property
    def partition(self) -> int:
        """The partition of a row mode part (its only one)."""
        (partition,) = self.resolved
        return partition

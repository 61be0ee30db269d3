"""Rows written into the open transaction before their window is released ("early writes").

Why: a window can only be committed once every partition's resolved ts has passed its rows
(docs/open-protocol.md §5.5), but TiCDC sends those rows up to a second before that resolved ts.
Writing them only once the window is released puts the database's whole time for the window
into the replication lag (at 10,000 rows/s about 160 ms of the ~250 ms between a resolved ts
and its commit, benchmarks/lag.py). So while nothing can be released, the daemon writes the rows
that have most likely all arrived (``Barrier.early_window``) into the apply session's open
transaction, piece by piece; when the window is released, only the rows after those pieces and
the checkpoint are left to write before COMMIT.

Why it converges: the pieces are consecutive windows in the barrier's own sense. Piece i holds
every cached row with commit ts in ``(t[i-1], t[i]]`` (``t[0]`` the applied ts), whole commit-ts
groups. Before the released window W (``(t[0], R]``) is committed on top of them, W must hold
exactly the pieces' rows at or below ``t[k]``, and ``R >= t[k]`` (``EarlyWrites.remainder``). Then
the transaction applies the sub-windows ``(t[0], t[1]], ..., (t[k-1], t[k]], (t[k], R]`` one after
the other, each a snapshot-to-snapshot step like any window (``sqlgen.collapse`` says why one
window converges), and commits them with W's checkpoint: the same state as W applied whole. (W may
also end between the pieces' last row and ``t[k]``, when ``max_txn_rows`` cuts it there: the last
piece is then the same rows as the sub-window ending at R.) If
the check fails (a row below ``t[k]`` arrived after its piece was written: the physical partitions
of one table, a late first copy, a replay; or W stops below ``t[k]`` at a DDL or at
``max_txn_rows``), the transaction is rolled back and W is written whole, as without early
writes. Nothing is ever committed that the barrier did not release, so readers (READ COMMITTED)
and a restart after a crash see exactly what they see without early writes.

The pieces hold row locks until W commits (a second at most with TiCDC's default resolved-ts
interval); every DDL, which runs on another session, first rolls them back.
"""

from __future__ import annotations

from dataclasses import dataclass

from applier.codec.events import RowEvent
from applier.stream.window import Window
from sqlgen import WindowPlan


@dataclass(frozen=True, slots=True)
class EarlyWrites:
    """The pieces written into the apply session's open transaction, in order, and their plans
    (for the row counts of the window they end up in)."""

    pieces: tuple[Window, ...]
    plans: tuple[WindowPlan, ...]

    @property
    def base_ts(self) -> int:
        return self.pieces[0].base_ts

    @property
    def target_ts(self) -> int:
        return self.pieces[-1].target_ts

    @property
    def rows(self) -> int:
        return sum(len(w.rows) for w in self.pieces)

    def then(self, piece: Window, plan: WindowPlan) -> EarlyWrites:
        """These writes and ``piece`` after them."""
        return EarlyWrites((*self.pieces, piece), (*self.plans, plan))

    def remainder(self, window: Window) -> list[RowEvent] | None:
        """The rows of ``window`` left to write after these pieces, or None when the pieces cannot
        be committed as part of it (module docstring): it is a DDL, has spilled rows, builds on
        another applied ts, stops below one of their rows, or holds other rows at or below their
        target. A window that stops between their last row and their target takes them all the
        same: their last piece holds the same rows as that piece cut at the window's target."""
        if window.ddl is not None or window.streamed is not None or window.base_ts != self.base_ts:
            return None
        top = min(self.target_ts, window.target_ts)
        written = {id(r) for w in self.pieces for r in w.rows}  # the pieces keep their rows alive
        rest: list[RowEvent] = []
        matched = 0
        for row in window.rows:
            if row.commit_ts > top:
                rest.append(row)
            elif id(row) in written:
                matched += 1
            else:
                return None  # arrived after its piece was written
        return rest if matched == self.rows else None  # else some are above the window's target

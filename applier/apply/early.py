"""Rows written into the open transaction before their window is released ("early writes").

Why: a window can only be committed once every partition's resolved ts has passed its rows
(docs/open-protocol.md §5.5), but TiCDC sends those rows up to a second before that resolved ts.
Writing them only once the window is released puts the database's whole time for the window
into the replication lag, where it is the larger part of the time between a resolved ts and
its commit (docs/performance.md). So while nothing can be released, the daemon writes the rows
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

Who does what: ``EarlyWriter`` (below) owns early writes: whether a piece is written now, the
pieces open on the session, and the pause after a miss. The barrier builds a piece as it builds
any window (``Barrier.early_window``), the window applier writes it and commits or rolls it back
(it holds the session), and the daemon's loop only says when it follows the stream.

The pieces hold row locks until W commits (a second at most with TiCDC's default resolved-ts
interval); every DDL, which runs on another session, first rolls them back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from applier.codec.events import RowEvent
from applier.ops.logs import get_logger
from applier.stream.window import Window
from sqlgen import WindowPlan

if TYPE_CHECKING:
    from applier.stream.barrier import Barrier


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


class EarlyWriter:
    """Early writes of one apply session: the pieces open on it and when to write the next one.

    ``min_rows`` is the least a piece holds (0: early writes off); ``piece_rows`` the most. After a
    miss (the pieces rolled back) the next window is written whole, and twice as many after each
    further miss in a row (at most 64), so a producer whose rows keep arriving late does not have
    every window written twice.
    """

    MAX_PAUSE = 64
    REPORT_SECONDS = 60.0

    def __init__(self, min_rows: int, piece_rows: int) -> None:
        self.min_rows = min_rows
        self.piece_rows = piece_rows
        self.open: EarlyWrites | None = None
        """The pieces written into the apply session's open transaction (apply thread; read by the
        daemon's thread only while no unit is in flight)."""
        self.used = 0
        """Early rows the last committed window took."""
        self._skip = 0  # windows to write without early pieces after a miss
        self._pause = 0  # how many the last miss made it (doubles while they keep missing)
        self._misses = 0  # pieces rolled back since the last line that said so
        self._said = 0.0  # monotonic time of that line
        self.log = get_logger(component="apply")

    def allowed(self) -> bool:
        """Whether a piece may be written now: early writes are on and not paused by a miss."""
        return self.min_rows > 0 and self._skip == 0

    def next_piece(self, barrier: Barrier, max_rows: int) -> Window | None:
        """The piece to write now, while nothing can be released: the rows above the open pieces
        (or the applied ts) that have most likely all arrived, up to ``max_rows`` in all (the
        window released later is cut at the highest commit ts with at most that many rows below
        it, which is at or above the pieces' target unless rows below it arrived late: then they
        are rolled back anyway). None when early writes are off or paused, or too few rows wait."""
        if not self.allowed():
            return None
        early = self.open
        held = early.rows if early is not None else 0
        base = early.target_ts if early is not None else barrier.applied_ts
        if max_rows - held < self.min_rows:
            return None
        return barrier.early_window(base, self.min_rows, min(max_rows - held, self.piece_rows))

    def window_started(self) -> None:
        """A window is being applied: one fewer to write whole after a miss."""
        if self._skip:
            self._skip -= 1

    def committed(self, took: EarlyWrites | None) -> None:
        """A window committed, with the open pieces (``took``) or without any."""
        self.open = None
        self.used = took.rows if took is not None else 0
        if self.used:
            self._pause = 0  # they work again: a later miss pauses them for one window

    def missed(self, error: str | None = None) -> None:
        """The open pieces were rolled back (the caller rolled the transaction back): pause."""
        self.open = None
        self._pause = min(self.MAX_PAUSE, self._pause * 2 or 1)
        self._skip = self._pause
        self._misses += 1
        now = time.monotonic()
        if now - self._said >= self.REPORT_SECONDS:
            self.log.info(
                "early writes rolled back: the window released after them did not hold exactly "
                "their rows (a row arrived late, or a DDL came first) or writing them failed; "
                "windows are written whole meanwhile",
                times=self._misses,
                paused_windows=self._pause,
                error=error,
            )
            self._misses = 0
            self._said = now

"""The daemon's tuning: how much it reads, caches, merges and waits, as one value passed in.

Production uses ``Tuning()``; a test that needs the back-pressure of a stream of millions of rows
on a stream of a few hundred passes its own (``dataclasses.replace(Tuning(), ...)``) instead of
patching the daemon. The figures these defaults were chosen by are in docs/performance.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from applier.apply.workers import MIN_ROWS


@dataclass(frozen=True, slots=True)
class Tuning:
    poll_records: int = 500
    """Records per read: about 8,000 rows of the benchmark's records (16 events each), which is
    also how far one read can overshoot ``read_ahead_rows``."""
    poll_timeout: float = 0.1
    """Seconds one read (or one wait for the window in flight) may block the loop."""
    lock_check_seconds: float = 5.0
    """How often the loop asks whether the single-active lock is still held."""
    drain_seconds: float = 30.0
    """After bad input, how long the healthy partitions are read on at most before the daemon stops."""
    merge_max_rows: int = 25_000
    """Merge ready windows into one transaction up to about this many rows (``--max-txn-rows``
    caps it further): big enough that commits cost nothing, small enough that the window in
    flight, the one prepared after it and the rows read meanwhile fit in ``read_ahead_rows``,
    and that applying and reading overlap in steps of half a second or so."""
    early_piece_rows: int = 5_000
    """At most this many rows in one early piece (``applier.apply.early``): a window released while
    a piece is being written waits for it, so pieces stay short (tens of milliseconds) or they
    add to the lag they are there to cut."""
    read_ahead_rows: int = 80_000
    """Rows in memory, the window in flight and the one prepared after it included: while the
    barrier can release a window after the one in flight, reading stops once this many rows are
    cached; while it cannot (nothing in flight, or a partition holds it back at or below the
    window in flight), the partitions ahead of the barrier are paused at this many and the ones
    holding it back keep being read, so the database never waits for records that could have been
    read while it worked. Rows, not bytes, because they are what costs: a decoded row is 1-2 KB of
    Python objects whatever its size on the wire, and the process's peak RSS follows the peak of
    this count (``--max-cached-bytes`` still bounds wide rows). When applying is the bottleneck,
    reading further would only grow memory; much lower, windows get smaller and the rate drops."""
    gc_thresholds: tuple[int, int, int] = (1_000_000, 50, 100)
    """Cyclic-GC thresholds for the loop: a young collection every million allocations, older
    generations almost never. None of the hot-path objects (events, rows, plans) form reference
    cycles, so reference counting frees them; the cyclic collector only has rare garbage to find,
    and scanning the row cache over and over costs more than any other single step."""
    ahead_rows: int = 16_000
    """A partition ahead of the barrier with this many rows above the global resolved ts is
    paused until the others catch up (see ``Barrier.partitions_far_ahead``)."""
    handoff_records: int = 64
    """While decoding a batch, look every this many records whether the window in flight is done
    (a batch is a few hundred milliseconds of decoding: too long for the database to wait for its
    next window)."""
    switch_interval: float = 0.001
    """``sys.setswitchinterval`` for the daemon: the apply thread mostly waits for the database and
    needs the GIL back from the (CPU-bound) reading thread once per statement; Python's 5 ms
    default adds seconds per million rows."""
    worker_min_rows: int = MIN_ROWS
    """Windows with fewer rows are written by their own session alone (``--apply-workers``): the
    workers' round trips and commits would cost more than they save."""
    stop_grace_seconds: float = 2.0
    """On stop, how long the window in flight may take before its statement is killed (``KILL
    QUERY``), and each further step waits (``KILL CONNECTION``, then leaving without it): three
    steps stay well within the 10 s a stop may take (systemd's ``TimeoutStopSec`` is 30 s)."""

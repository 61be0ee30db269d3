"""The daemon with its read-ahead limits a few hundred rows instead of tens of thousands.

``Daemon.READ_AHEAD_ROWS`` (80,000), ``MERGE_MAX_ROWS`` and ``AHEAD_ROWS`` are class constants
sized for production streams; the test streams never cache that many rows, so without this the
back-pressure taken while a window is in flight (the partitions ahead of the barrier paused, the
ones holding it back read on) would only run in the benchmarks. This module shrinks them in the
process it starts and says on its output each time a partition was paused while more than
``READ_AHEAD_ROWS`` were cached and the barrier waited for input behind a window in flight, so a
test can check that branch really ran. Everything else is the product's.

Run as ``python -m tests.integration.tight_read_ahead run ...`` (what ``Changefeed.module``
selects): the same command line as ``python -m applier``.
"""

from __future__ import annotations

import sys

READ_AHEAD_ROWS = 120
MERGE_MAX_ROWS = 40
AHEAD_ROWS = 60
POLL_RECORDS = 8
MARK = "tight read-ahead: paused with a window in flight"


def main(argv: list[str] | None = None) -> int:
    from applier.cli import main as applier_main
    from applier.daemon.loop import Daemon

    Daemon.READ_AHEAD_ROWS = READ_AHEAD_ROWS
    Daemon.MERGE_MAX_ROWS = MERGE_MAX_ROWS
    Daemon.AHEAD_ROWS = AHEAD_ROWS
    Daemon.POLL_RECORDS = POLL_RECORDS
    pace = Daemon._pace

    def counted_pace(self: Daemon) -> None:
        barrier = self.barrier
        over = barrier is not None and barrier.total_cached_rows() > READ_AHEAD_ROWS
        in_flight = over and self._inflight is not None and self._waits_for_input()
        before = self.reader.paused if self.reader is not None else frozenset()
        pace(self)
        after = self.reader.paused if self.reader is not None else frozenset()
        if in_flight and after - before:
            print(f"{MARK}: {sorted(after - before)}", flush=True)

    Daemon._pace = counted_pace  # type: ignore[method-assign]
    return applier_main(argv)


if __name__ == "__main__":
    sys.exit(main())

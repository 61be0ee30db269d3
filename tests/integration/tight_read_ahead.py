"""The daemon with its read-ahead limits a few hundred rows instead of tens of thousands.

``Tuning.read_ahead_rows`` (80,000), ``merge_max_rows`` and ``ahead_rows`` are sized for
production streams; the test streams never cache that many rows, so without this the
back-pressure taken while a window is in flight (the partitions ahead of the barrier paused, the
ones holding it back read on) would only run in the benchmarks. This module runs the daemon with
a ``Tuning`` that shrinks them and says on its output each time a partition was paused while more
than ``read_ahead_rows`` were cached and the barrier waited for input behind a window in flight
(``Observer.on_back_pressure``), so a test can check that branch really ran. Everything else is
the product's.

Run as ``python -m tests.integration.tight_read_ahead run ...`` (what ``Changefeed.module``
selects): the same command line as ``python -m applier``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Set

from applier.daemon.tuning import Tuning
from applier.ops.observer import Observer

TIGHT = dataclasses.replace(Tuning(), read_ahead_rows=120, merge_max_rows=40, ahead_rows=60, poll_records=8)
MARK = "tight read-ahead: paused with a window in flight"


class PausedBehindWindow(Observer):
    """Prints ``MARK`` for each pause taken over the read-ahead limit behind a window in flight."""

    def on_back_pressure(self, paused: Set[int], cached_rows: int, behind_window_in_flight: bool) -> None:
        if behind_window_in_flight and cached_rows > TIGHT.read_ahead_rows:
            print(f"{MARK}: {sorted(paused)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    from applier.cli import main as applier_main

    return applier_main(argv, tuning=TIGHT, observers=(PausedBehindWindow(),))


if __name__ == "__main__":
    sys.exit(main())

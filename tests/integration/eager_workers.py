"""The daemon with its worker sessions used for every window, not only for windows of thousands of rows.

``Tuning.worker_min_rows`` (5,000) keeps small windows on one session; the test streams' windows
are a few rows each, so without this the workers (``--apply-workers``) would only run in the
benchmarks. This module runs the daemon with it at one row; a window still goes to the workers
only when they get at least two statements, or one beside statements that stay on the window's
own session (``WorkerSessions.split``). Everything else is the product's.

Run as ``python -m tests.integration.eager_workers run ... --apply-workers N`` (what
``Changefeed.module`` selects): the same command line as ``python -m applier``.
"""

from __future__ import annotations

import dataclasses
import sys

from applier.daemon.tuning import Tuning

EAGER = dataclasses.replace(Tuning(), worker_min_rows=1)


def main(argv: list[str] | None = None) -> int:
    from applier.cli import main as applier_main

    return applier_main(argv, tuning=EAGER)


if __name__ == "__main__":
    sys.exit(main())

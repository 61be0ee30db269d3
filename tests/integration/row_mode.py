"""The daemon in row mode with its joint release after start-up kept short.

``Tuning.row_settle_seconds`` (60 s) keeps the partitions releasing together for a minute after
start-up (``applier.stream.row_release``); a test stream is read in seconds, so without this row
mode's own release would only be seen in the benchmarks. This module runs the daemon with half a
second. Everything else is the product's.

Run as ``python -m tests.integration.row_mode run ... --consistency row`` (what
``Changefeed.module`` selects): the same command line as ``python -m applier``.
"""

from __future__ import annotations

import dataclasses
import sys

from applier.daemon.tuning import Tuning

SHORT_SETTLE = dataclasses.replace(Tuning(), row_settle_seconds=0.5)


def main(argv: list[str] | None = None) -> int:
    from applier.cli import main as applier_main

    return applier_main(argv, tuning=SHORT_SETTLE)


if __name__ == "__main__":
    sys.exit(main())

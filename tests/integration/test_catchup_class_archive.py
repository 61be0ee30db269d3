"""The JVM class archive of ``applier catchup`` processes: the first run writes it, the next reads it.

Real processes with their own Spark (local[2]): the archive is only written when the JVM exits,
which the job makes happen at its end, and put in place after the run (``applier.catchup.class_archive``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.catchup_support import backlog_after_a_backup, start_catchup_process
from tests.integration.harness import Changefeed, read_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _run(feed: Changefeed, from_ts: int, directory: Path) -> str:
    proc = start_catchup_process(feed, from_ts, "--catchup-class-archive", str(directory))
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = read_log(proc)
    assert proc.returncode == 0, log[-4000:]
    return log


def test_the_first_catchup_writes_the_class_archive_and_the_next_reads_it(
    feed: Changefeed, tmp_path: Path
) -> None:
    sim, x, r = backlog_after_a_backup(feed, seed=41, transactions=80)

    first = _run(feed, x, tmp_path)
    assert "written after the job ends" in first, first[-4000:]
    deadline = time.monotonic() + 120  # written by the JVM as it exits, put in place after the run
    while not list(tmp_path.glob("spark-classes-*.jsa")) or list(tmp_path.glob("*.part")):
        assert time.monotonic() < deadline, "no class archive put in place"
        time.sleep(0.2)
    archives = list(tmp_path.glob("spark-classes-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1 << 20
    assert list(tmp_path.glob("*.part")) == [], "the part file was moved into place"
    assert feed.compare(sim, r) == []
    written = archives[0].stat().st_ino  # a rewrite replaces the file; a read only marks it used

    second = _run(feed, x, tmp_path)  # nothing left to apply: the checkpoint is at r already
    assert "action=read" in second and "JVM class archive written" not in second, second[-4000:]
    assert archives[0].stat().st_ino == written
    assert feed.compare(sim, r) == []

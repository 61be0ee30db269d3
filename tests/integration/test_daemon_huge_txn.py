"""Upstream transactions far larger than the row cache: spilled to disk, applied in pieces inside
one downstream transaction, and a SIGKILL in the middle of applying one."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from applier.simulator import PRODUCER_MODES, StreamConfig, produce_simulation, simulate
from applier.simulator.tables import BULK_TABLE
from tests.integration.harness import Changefeed, read_log, stop
from tests.integration.ops_support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HUGE = 50_000


def _stream(feed: Changefeed, seed: int, mode: str | None = None):
    # Two transactions of about 50K rows each (one fills the bulk table, one rewrites it: deletes,
    # key moves, a DELETE and an INSERT of one key, unique swaps), 3 partitions, replays on; with
    # ``mode`` every producer order of that architecture on as well.
    cfg = StreamConfig(
        seed=seed,
        partitions=3,
        transactions=240,
        schema=feed.new_schema(),
        huge_transaction=HUGE,
        **(PRODUCER_MODES[mode] if mode else {}),
    )
    sim = simulate(cfg)
    produce_simulation(feed.bootstrap, feed.topic, sim)
    return sim


@pytest.mark.parametrize("mode", [None, "all-classic", "all-new"])
def test_huge_transactions_converge_with_a_small_row_cache(
    feed: Changefeed, tmp_path: Path, mode: str | None
) -> None:
    sim = _stream(feed, seed=31, mode=mode)
    spill = tmp_path / "spill"
    done = feed.run_to_end("--max-cached-bytes", "2M", "--spill-dir", str(spill))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "moved to disk" in done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert [p for p in spill.rglob("*") if p.is_file()] == []  # removed once applied


def _uncommitted_bulk_rows(feed: Changefeed, schema: str) -> int:
    conn = feed.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
            cur.execute(f"SELECT COUNT(*) FROM `{schema}`.`{BULK_TABLE}`")
            return int(cur.fetchone()[0])
    except Exception:  # the table does not exist yet
        return 0
    finally:
        conn.close()


def test_sigkill_while_a_huge_window_is_applied_then_a_restart_converges(
    feed: Changefeed, tmp_path: Path
) -> None:
    sim = _stream(feed, seed=32)
    spill = tmp_path / "spill"
    args = ("--max-cached-bytes", "2M", "--spill-dir", str(spill))
    proc = feed.start(*args)
    # The first huge transaction fills the empty bulk table: rows visible to a READ UNCOMMITTED
    # reader, but not all of them, mean its window is being applied right now.
    deadline = time.monotonic() + 120
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None:
        seen = _uncommitted_bulk_rows(feed, sim.schema)
        if 0 < seen < HUGE // 2:
            break
        time.sleep(0.02)
    assert 0 < seen < HUGE // 2, f"never caught the huge window being applied ({seen} rows)\n{read_log(proc)}"
    stop(proc, signal.SIGKILL)
    assert list(spill.rglob("*.spill")), "the killed daemon had spilled rows"
    resolved, _ = feed.checkpoint()
    # Rolled back (or committed whole): once the server has seen the session die and undone its
    # rows, which takes a moment on a loaded machine.
    wait_until(
        lambda: _uncommitted_bulk_rows(feed, sim.schema) in (0, HUGE), 60, "the huge window rolled back"
    )
    done = feed.run_to_end(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.checkpoint()[0] > resolved
    assert feed.compare(sim, sim.final_resolved_ts) == []
    assert [p for p in spill.rglob("*") if p.is_file()] == []

"""The catch-up's summary lines read back: what a test or benchmark running it as a process learns."""

from __future__ import annotations

import time
from types import SimpleNamespace

from applier.catchup.report import Progress, Summary
from applier.catchup.writer import WriteStats


def test_the_printed_summary_reads_back_as_it_was() -> None:
    s = Summary(
        from_ts=100,
        lower_ts=120,
        resolved_ts=480,
        records=37,
        events=512,
        writes=WriteStats(events=512, deletes=3, replaces=200, inserts=7, retries=1),
        ddls=1,
        epochs=2,
        keyless_replays_dropped=4,
        seconds=12.5,
        stage_seconds={"start-up": 5.2, "scan": 4.0, "epoch1": 2.1, "handoff": 0.0},
        resume_offsets={0: 11, 1: 26},
    )
    got = Summary.parse("noise before\n" + "\n".join(s.lines()) + "\nnoise after\n")
    assert got is not None
    assert (got.from_ts, got.lower_ts, got.resolved_ts, got.records, got.events) == (100, 120, 480, 37, 512)
    assert (got.rows_written, got.ddls, got.epochs, got.keyless_replays_dropped) == (210, 1, 2, 4)
    assert got.writes.retries == 1 and got.seconds == 12.5
    assert got.stage_seconds == s.stage_seconds


def test_no_summary_without_its_lines() -> None:
    assert Summary.parse("catch-up failed: topic 't' partition 0 offset 5: not JSON") is None


class _Tracker:
    """Spark's status tracker as the progress reads it: one job of one stage in the scan's group."""

    def __init__(self) -> None:
        self.active = 0

    def getJobIdsForGroup(self, group: str) -> list[int]:
        return [1] if group == "applier-catchup-scan" else []

    def getJobInfo(self, job_id: int) -> SimpleNamespace:
        return SimpleNamespace(stageIds=[7])

    def getStageInfo(self, stage_id: int) -> SimpleNamespace:
        return SimpleNamespace(numTasks=4, numActiveTasks=self.active, numCompletedTasks=0, numFailedTasks=0)


class _Log:
    def info(self, *args: object, **kwargs: object) -> None:
        pass


def test_the_scan_s_planning_is_counted_apart_until_its_first_task_runs() -> None:
    tracker = _Tracker()
    spark = SimpleNamespace(
        sparkContext=SimpleNamespace(statusTracker=lambda: tracker, setJobGroup=lambda *a: None)
    )
    progress = Progress(spark, _Log(), interval=60)
    progress.stage("start-up")
    progress.stage("scan", total_records=10, plan_apart=True)
    time.sleep(0.3)  # planning: no task yet
    tracker.active = 2
    time.sleep(0.3)  # the watcher polls every 50 ms
    progress.stage("replay")
    progress.stop()
    seconds = progress.stage_seconds
    assert list(seconds) == ["start-up", "plan", "scan", "replay"]
    # The first task appeared after the planning's 0.3 s; the scan's time runs from then on.
    assert seconds["plan"] >= 0.29 and seconds["scan"] > 0


def test_without_a_task_the_stage_keeps_all_its_time() -> None:
    spark = SimpleNamespace(
        sparkContext=SimpleNamespace(statusTracker=lambda: _Tracker(), setJobGroup=lambda *a: None)
    )
    progress = Progress(spark, _Log(), interval=60)
    progress.stage("scan", plan_apart=True)
    time.sleep(0.1)
    progress.stop()
    assert list(progress.stage_seconds) == ["scan"]

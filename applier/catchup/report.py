"""Progress while a catch-up runs, and its final summary.

Progress comes from Spark's status tracker (tasks done out of tasks planned, per job group), so
nothing is added to the executors' hot loops: records read are estimated from the share of
scan tasks done (the ranges are of nearly equal size), rows written are counted as writer tasks
finish. A background thread logs one line every ``interval`` seconds: stage, records read, rows
written, and an ETA for the stage from its elapsed time and the share done.

A stage entered with ``plan_apart`` (the scan) counts the time until its first Spark task runs
as the stage ``plan``: Spark's planning of the data source read (a Python worker that lists the
input partitions) takes seconds whatever the backlog's size, so the stage's own time is the part
that grows with the backlog. A watcher thread polls the status tracker for that first task.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from applier.catchup.writer import WriteStats


def partition_label(partition: int | tuple[str, int]) -> str:
    """A partition as logs name it: its number (one topic), or ``topic/partition`` (several)."""
    return f"{partition[0]}/{partition[1]}" if isinstance(partition, tuple) else str(partition)


# What Summary.lines() prints, read back by Summary.parse (same order as the lines).
_SUMMARY_LINES = (
    re.compile(
        r"catch-up done: window \((?P<lower_ts>\d+), (?P<resolved_ts>\d+)\] \(from-ts (?P<from_ts>\d+)\)"
    ),
    re.compile(
        r"records read (?P<records>\d+), row events (?P<events>\d+), rows written after collapse \d+ "
        r"\(delete (?P<deletes>\d+), replace (?P<replaces>\d+), keyless (?P<inserts>\d+)\)"
    ),
    re.compile(
        r"DDLs executed (?P<ddls>\d+), epochs (?P<epochs>\d+), keyless replays dropped "
        r"(?P<keyless_replays_dropped>\d+), retried transactions (?P<retries>\d+)"
    ),
    re.compile(r"seconds (?P<seconds>[0-9.]+), row events/s \d+(?: \((?P<stages>[^)]*)\))?"),
)
_WRITE_FIELDS = ("deletes", "replaces", "inserts", "retries")


@dataclass
class Summary:
    """What a catch-up did (printed at the end, returned to callers and tests)."""

    from_ts: int
    lower_ts: int = 0
    resolved_ts: int = 0
    records: int = 0
    events: int = 0
    writes: WriteStats = field(default_factory=WriteStats)  # the writers' counters, summed
    ddls: int = 0
    epochs: int = 0
    keyless_replays_dropped: int = 0
    seconds: float = 0.0
    resume_offsets: dict[int, int] | dict[tuple[str, int], int] = field(default_factory=dict)
    """By partition of the topic, or by (topic, partition) with several topics."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    nothing_to_do: bool = False

    @property
    def rows_written(self) -> int:
        """Rows after collapse: keyed deletes and REPLACEs plus keyless ops."""
        return self.writes.rows

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        stages = ", ".join(f"{k} {v:.1f}s" for k, v in self.stage_seconds.items())
        return [
            f"catch-up done: window ({self.lower_ts}, {self.resolved_ts}] (from-ts {self.from_ts})",
            f"records read {self.records}, row events {self.events}, rows written after collapse "
            f"{self.rows_written} (delete {self.writes.deletes}, replace {self.writes.replaces}, "
            f"keyless {self.writes.inserts})",
            f"DDLs executed {self.ddls}, epochs {self.epochs}, keyless replays dropped "
            f"{self.keyless_replays_dropped}, retried transactions {self.writes.retries}",
            f"seconds {self.seconds:.1f}, row events/s {self.events_per_second:.0f}"
            + (f" ({stages})" if stages else ""),
            "resume offsets for `applier run`: "
            + ", ".join(
                f"{'p' if isinstance(p, int) else ''}{partition_label(p)}={o}"
                for p, o in sorted(self.resume_offsets.items())  # type: ignore[type-var]
            ),
        ]

    @classmethod
    def parse(cls, text: str) -> Summary | None:
        """The summary a catch-up printed (its ``lines()``, e.g. in a process's output), or None when
        ``text`` holds none; what the lines do not show (offsets, ``nothing_to_do``) stays default."""
        found: dict[str, str] = {}
        for pattern in _SUMMARY_LINES:
            m = pattern.search(text)
            if m is None:
                return None
            found.update({k: v for k, v in m.groupdict().items() if v is not None})
        stages = {}
        for part in filter(None, found.pop("stages", "").split(", ")):
            name, _, secs = part.rpartition(" ")
            stages[name] = float(secs.rstrip("s"))
        writes = WriteStats(**{k: int(found.pop(k)) for k in _WRITE_FIELDS})
        seconds = float(found.pop("seconds"))
        return cls(
            **{k: int(v) for k, v in found.items()}, writes=writes, seconds=seconds, stage_seconds=stages
        )


class Progress:
    """Logs the running stage's progress every ``interval`` seconds (see the module docstring)."""

    def __init__(self, spark: Any, log: Any, interval: float = 5.0) -> None:
        self._sc = spark.sparkContext if spark is not None else None
        self._log = log
        self._interval = interval
        self._lock = threading.Lock()
        self._stage: str | None = None
        self._group: str | None = None
        self._stage_started = time.monotonic()
        self._first_task: float | None = None  # when the plan_apart stage's first task ran
        self._total_records = 0
        self.records_read = 0
        self.rows_written = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stage_seconds: dict[str, float] = {}

    def start(self) -> None:
        if self._sc is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="catchup-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._end_stage()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def stage(self, name: str, *, total_records: int | None = None, plan_apart: bool = False) -> None:
        """Enter stage ``name``; Spark jobs started from now on belong to it. ``plan_apart``: the
        time until its first task runs is stage ``plan`` (module docstring)."""
        self._end_stage()
        with self._lock:
            self._stage = name
            self._group = group = f"applier-catchup-{name}"
            self._stage_started = time.monotonic()
            self._first_task = None
            if total_records is not None:
                self._total_records = total_records
        if self._sc is not None:
            self._sc.setJobGroup(group, f"applier catch-up: {name}")
            if plan_apart:
                threading.Thread(
                    target=self._watch_first_task, args=(group,), name="catchup-first-task", daemon=True
                ).start()
        self._log.info("stage", stage=name)

    def _end_stage(self) -> None:
        with self._lock:
            if self._stage is not None:
                now = time.monotonic()
                started = self._stage_started
                if self._first_task is not None:
                    self._add_seconds("plan", self._first_task - started)
                    started = self._first_task
                self._add_seconds(self._stage, now - started)
                self._stage = None
                self._first_task = None

    def _add_seconds(self, stage: str, seconds: float) -> None:
        self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    def _watch_first_task(self, group: str) -> None:
        """Note when the first task of ``group``'s jobs runs (every 50 ms, until the stage ends)."""
        while not self._stop.is_set():
            with self._lock:
                if self._stage is None or self._group != group:
                    return
            try:
                begun = self._tasks_begun(group)
            except Exception:  # the context may be stopping; the split is best effort
                return
            if begun:
                with self._lock:
                    if self._stage is not None and self._group == group:
                        self._first_task = time.monotonic()
                return
            self._stop.wait(0.05)

    def _tasks_begun(self, group: str) -> bool:
        """Has any task of ``group``'s jobs started (running, done or failed)?"""
        return any(
            info.numActiveTasks + info.numCompletedTasks + info.numFailedTasks
            for info in self._stage_infos(group)
        )

    def _stage_infos(self, group: str) -> Iterator[Any]:
        """The status tracker's info of every stage of ``group``'s jobs."""
        assert self._sc is not None
        tracker = self._sc.statusTracker()
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    yield info

    def fraction(self) -> float | None:
        """Share of the current stage's Spark tasks that are done (None before any job started)."""
        if self._sc is None or self._group is None:
            return None
        total = done = 0
        for info in self._stage_infos(self._group):
            total += info.numTasks
            done += info.numCompletedTasks
        return None if total == 0 else done / total

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                stage, started, total_records = self._stage, self._stage_started, self._total_records
            if stage is None:
                continue
            try:
                frac = self.fraction()
            except Exception:  # the context may be stopping; progress is best effort
                continue
            elapsed = time.monotonic() - started
            fields: dict[str, Any] = {"stage": stage, "elapsed_s": round(elapsed, 1)}
            if stage == "scan" and frac is not None:
                fields["records_read"] = int(total_records * frac)
                fields["records_total"] = total_records
            else:
                fields["records_read"] = self.records_read
            fields["rows_written"] = self.rows_written
            if frac is not None:
                fields["done_pct"] = round(100 * frac, 1)
                if 0 < frac < 1:
                    fields["eta_s"] = round(elapsed * (1 - frac) / frac, 1)
            self._log.info("progress", **fields)

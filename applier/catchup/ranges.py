"""The scan's input ranges: each partition's offsets cut into ranges, the ranges grouped into tasks.

Its own module, light on imports, because Spark's planning workers import it: a Python worker
started by the driver's JVM to plan the read (``applier.catchup.source``) imports everything the
data source's module imports, one worker after another before the first reading task starts, and
where the offsets come from (:mod:`applier.catchup.offsets`, Kafka and the decoder) is none of
their business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``start <= offset < end`` of one partition: one Spark input partition.

    ``partition`` is the catch-up's partition id (a slot, see :mod:`applier.catchup.offsets`); with several
    topics ``topic`` and ``kafka_partition`` say where the records are (one topic: empty, the
    partition id is the Kafka partition of the job's topic).
    """

    partition: int
    start: int
    end: int
    topic: str = ""
    kafka_partition: int = -1

    @property
    def size(self) -> int:
        return self.end - self.start

    def where(self, topic: str) -> tuple[str, int]:
        """The Kafka topic and partition to read; ``topic`` is the job's, for a range without one."""
        return (self.topic, self.kafka_partition) if self.topic else (topic, self.partition)


def split_ranges(
    bounds: Mapping[int, tuple[int, int]],
    max_records: int,
    key: Callable[[int], tuple[str, int]] | None = None,
) -> list[OffsetRange]:
    """Cut each partition's ``[start, end)`` into nearly equal ranges of at most ``max_records``.

    Empty partitions give no range. Ranges are ordered by partition, then offset, so the input
    partitions' order is deterministic (a retried Spark task re-reads exactly the same records).
    ``key`` (several topics) gives each range the topic and partition of its partition id.
    """
    if max_records < 1:
        raise ValueError("max_records must be at least 1")
    out: list[OffsetRange] = []
    for p in sorted(bounds):
        start, end = bounds[p]
        if end < start:
            raise ValueError(f"partition {p}: end offset {end} is before start offset {start}")
        total = end - start
        if total == 0:
            continue
        pieces = -(-total // max_records)
        base, extra = divmod(total, pieces)
        where = () if key is None else key(p)
        s = start
        for i in range(pieces):
            e = s + base + (1 if i < extra else 0)
            out.append(OffsetRange(p, s, e, *where))
            s = e
    return out


def ranges_per_task(ranges: Sequence[OffsetRange], cores: int, max_records: int) -> int:
    """How many of ``ranges`` one reading task reads (:func:`task_groups`): two when that makes
    the scan one wave of tasks instead of two and no task then reads more than ``max_records``
    records (the most one range holds, ``catchup_split_records``), else one.

    Each wave of reading tasks costs time beside the reading (fresh Python workers and their
    imports, Spark taking over each task's output before the slot's next task starts). The cap is
    for memory: the JVM builds a task's cached block whole before storing it and keeps the heap it
    grew, so a task must not build a larger block than one range gives."""
    if not cores < len(ranges) <= 2 * cores:
        return 1
    if any(sum(r.size for r in group) > max_records for group in task_groups(ranges, 2)):
        return 1
    return 2


def task_groups(ranges: Sequence[OffsetRange], per_task: int) -> list[tuple[OffsetRange, ...]]:
    """The ranges one reading task reads, one after another: ``per_task`` of them (the last group
    may hold fewer), the largest range with the smallest, the second largest with the second
    smallest, and so on, so that the groups' sizes come out even. Deterministic: a retried task
    re-reads exactly the same ranges.

    Why group: each task costs a fresh Python worker (its imports) and a pause while Spark takes
    over its output before the next task of the slot starts, together about a second on a 2-core
    machine, paid once per wave of tasks. A task reading two ranges in turn (each with its own
    batch builder: its worker holds no more than for one range) halves the waves."""
    if per_task < 1:
        raise ValueError("per_task must be at least 1")
    if per_task == 1:
        return [(r,) for r in ranges]
    order = sorted(ranges, key=lambda r: (-r.size, r.partition, r.start))
    count = -(-len(order) // per_task)
    groups: list[list[OffsetRange]] = [[] for _ in range(count)]
    for i, rng in enumerate(order):
        turn, pos = divmod(i, count)
        groups[pos if turn % 2 == 0 else count - 1 - pos].append(rng)  # back and forth
    return [tuple(sorted(g, key=lambda r: (r.partition, r.start))) for g in groups]

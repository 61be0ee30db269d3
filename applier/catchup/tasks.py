"""The functions Spark runs in the executors' Python workers for a catch-up's writes and checks.

They are apart from :mod:`applier.catchup.job` because Spark pickles a task's function by
reference: the worker imports the module that defines it. In local mode every task gets a fresh
worker (``applier.catchup.session``), and importing the job's module (the driver's Spark calls,
DDL execution and with it the SQL parser, the replay, the progress display) would cost each
writer task more CPU than these functions need.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pyarrow as pa

from applier.catchup.rows import straddling_rows
from applier.catchup.writer import WriteSpec, WriteStats, write_keyed, write_keyless
from applier.errors import fatal_in_task
from sqlgen import TablePlan

# What a writer task returns to the driver: its WriteStats as one Arrow row (the fields, in order).
_STATS_TYPES = {"int": (pa.int64(), "long"), "float": (pa.float64(), "double")}
_STATS_FIELDS = [(f.name, _STATS_TYPES[str(f.type)]) for f in dataclasses.fields(WriteStats)]
_STATS_ARROW = pa.schema([(name, arrow) for name, (arrow, _spark) in _STATS_FIELDS])
WRITE_STATS_SCHEMA = ", ".join(f"{name} {spark}" for name, (_arrow, spark) in _STATS_FIELDS)


def _stats_batch(stats: WriteStats) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({n: [getattr(stats, n)] for n, _ in _STATS_FIELDS}, schema=_STATS_ARROW)


def keyed_task(batches: Iterator[pa.RecordBatch], spec: WriteSpec) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the keyed writers: one row of WRITE_STATS_SCHEMA."""
    with fatal_in_task():
        stats = write_keyed(batches, spec)
    yield _stats_batch(stats)


def straddling_task(batches: Iterator[pa.RecordBatch], uppers: list[int]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the check after the scan: writer rows standing for ops of two epochs."""
    with fatal_in_task():
        count = sum(straddling_rows(batch, uppers) for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [count]}, schema=pa.schema([("rows", pa.int64())]))


def keyless_task(tp: TablePlan, spec: WriteSpec) -> WriteStats:
    """Body of a keyless table's writer task (``writer.write_keyless``)."""
    with fatal_in_task():
        return write_keyless(tp, spec)

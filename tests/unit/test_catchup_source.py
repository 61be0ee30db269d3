"""applier.catchup.source and .scan: what a reading task spends besides reading (the collector, imports)."""

from __future__ import annotations

import gc

import confluent_kafka
import pytest

from applier.catchup import scan, source
from applier.catchup._batch_builder import BatchBuilder
from applier.catchup.ranges import OffsetRange
from applier.codec.decoder import DecoderOptions


class _Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"


class _Consumer:
    """Hands out offsets 0..2 of the assigned partition, then nothing."""

    def __init__(self, _conf: dict) -> None:
        self._left = [_Message(o) for o in range(3)]

    def assign(self, _partitions: list) -> None:
        pass

    def consume(self, _n: int, _timeout: float) -> list[_Message]:
        batch, self._left = self._left, []
        return batch

    def close(self) -> None:
        pass


def test_a_reader_writes_out_its_winners_with_the_collector_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The final flush turns every kept winner into a tuple: with the collector on, each few hundred
    of them re-scanned all the winners still held (a quarter of a reader's time on the benchmark)."""
    seen: list[tuple[bool, bool]] = []

    class Spy(BatchBuilder):
        def flush(self, final=False):
            seen.append((final, gc.isenabled()))
            return super().flush(final)

    monkeypatch.setattr(scan, "BatchBuilder", Spy)
    monkeypatch.setattr(scan, "decode_record", lambda *_a, **_k: [])
    monkeypatch.setattr(confluent_kafka, "Consumer", _Consumer)
    spec = source.ReadSpec("127.0.0.1:9", "t", "g", {}, DecoderOptions(), lower_ts=0, collapse_upto=10)
    assert gc.isenabled()
    batches = list(scan.read_range(spec, OffsetRange(0, 0, 3)))
    assert seen == [(True, False)]
    assert len(batches) == 1 and gc.isenabled()  # on again once the range is read


def _imports(modules: str, probe: str) -> bool:
    """Whether importing ``modules`` (comma-separated) in a fresh interpreter imports ``probe``."""
    import subprocess
    import sys

    code = f"import sys, {modules}; print({probe!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def test_the_readers_modules_import_no_sql_parser() -> None:
    """Every Spark task worker imports them: sqlglot (65-90 ms) is imported where a DDL is routed."""
    assert not _imports("applier.catchup.scan, applier.catchup.tasks", "sqlglot")


@pytest.mark.parametrize("heavy", ["confluent_kafka", "applier.codec.decoder", "applier.catchup.scan"])
def test_the_planning_workers_import_only_the_spark_side_of_the_source(heavy: str) -> None:
    """Spark starts two Python workers one after the other to create the data source and plan its
    read, before any task reads: they import the source's module (and its reader, unpickled) and
    nothing of the reading (0.2 s of CPU each: 0.24 s for PySpark's planning module alone or with
    the source, 0.44 s with the reading's modules too). PySpark itself imports pyarrow there."""
    assert _imports("applier.catchup.scan", heavy) or heavy == "applier.catchup.scan"
    assert not _imports("pyspark.sql.worker.plan_data_source_read, applier.catchup.source", heavy)


def test_the_reader_gives_the_reading_task_the_drivers_spec() -> None:
    """The options the driver writes (source_options) come back as the same ReadSpec in the task."""
    from applier.catchup.ranges import OffsetRange as Range
    from applier.large_messages.settings import LargeMessageSettings

    large = LargeMessageSettings(claim_check_storage_uri="file:///x")
    spec = source.ReadSpec(
        "b:9092", "t", "g", {"security.protocol": "SSL"}, DecoderOptions(compression="lz4"), lower_ts=5,
        batch_rows=7, collapse_upto=9, buckets=3, large=large, filter=("db.*",),
    )  # fmt: skip
    options = source.source_options(spec, [Range(0, 0, 10), Range(1, 5, 6, "other", 2)], per_task=2)
    reader = source.OpenProtocolSource(options).reader(None)
    assert scan.read_spec(reader.options) == spec
    assert [p.ranges for p in reader.partitions()] == [(Range(0, 0, 10), Range(1, 5, 6, "other", 2))]


def test_the_writer_tasks_need_not_import_the_job() -> None:
    """Spark pickles a task's function by reference, so its worker imports the function's module:
    the tasks' module must not pull in the driver's (about 0.2 s of CPU per task)."""
    import pickle

    from applier.catchup import job, tasks

    assert job.keyed_task is tasks.keyed_task and b"applier.catchup.tasks" in pickle.dumps(tasks.keyed_task)
    assert not _imports("applier.catchup.tasks", "applier.catchup.job")

"""applier.catchup.source: what a reading task spends besides reading (the collector, its imports)."""

from __future__ import annotations

import gc

import confluent_kafka
import pytest

from applier.catchup import source
from applier.catchup.batch_builder import BatchBuilder
from applier.catchup.offsets import OffsetRange
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

    monkeypatch.setattr(source, "BatchBuilder", Spy)
    monkeypatch.setattr(source, "decode_record", lambda *_a, **_k: [])
    monkeypatch.setattr(confluent_kafka, "Consumer", _Consumer)
    spec = source.ReadSpec("127.0.0.1:9", "t", "g", {}, DecoderOptions(), lower_ts=0, collapse_upto=10)
    assert gc.isenabled()
    batches = list(source.read_range(spec, OffsetRange(0, 0, 3)))
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
    assert not _imports("applier.catchup.source, applier.catchup.tasks", "sqlglot")


def test_the_writer_tasks_need_not_import_the_job() -> None:
    """Spark pickles a task's function by reference, so its worker imports the function's module:
    the tasks' module must not pull in the driver's (about 0.2 s of CPU per task)."""
    import pickle

    from applier.catchup import job, tasks

    assert job.keyed_task is tasks.keyed_task and b"applier.catchup.tasks" in pickle.dumps(tasks.keyed_task)
    assert not _imports("applier.catchup.tasks", "applier.catchup.job")

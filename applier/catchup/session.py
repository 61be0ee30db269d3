"""The SparkSession of a catch-up: local mode by default, any master the operator names otherwise.

The Python workers must run this interpreter (``PYSPARK_PYTHON``), whose environment has the
applier installed; in local mode the JVM binds to the loopback address (``SPARK_LOCAL_IP``), so
nothing listens on other interfaces. The workers import the applier that is installed, wherever
the catch-up is started: Python puts the working directory first on the path of a process started
with ``-m``, as Spark starts its Python workers, so a catch-up started from a checkout would
otherwise import the checkout's sources (without their compiled modules) in every task. The JVM
is launched with ``PYTHONSAFEPATH`` set, which every worker it starts inherits, and executors get it
as ``spark.executorEnv``. No package is ever downloaded (``spark.jars.packages`` is
never set): Kafka is read by the Python data source, not by a JVM connector.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from applier.catchup.class_archive import ClassArchive
from applier.catchup.source import OpenProtocolSource
from applier.catchup.spark_home import launched_from

_SAFE_PATH = "PYTHONSAFEPATH"  # the interpreter leaves the working directory off sys.path

DEFAULT_MASTER = "local[*]"
_LOCAL_DEFAULTS = {
    # The cached decoded backlog lives in the driver's JVM in local mode; the readers' collapse
    # keeps it to the rows changed (10M events on 450K rows: well within, spilling otherwise).
    "spark.driver.memory": "2g",
    # In local mode the JVM shares the machine with the Python readers and writers, which do the
    # per-row work, while the JVM moves a few large rows (rows.py). Its optimising compiler and
    # parallel collector then mostly take cores from them: with the client compiler only and the
    # serial collector the JVM uses about half the CPU and two thirds of the memory
    # (docs/performance.md). Setting this option replaces both.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    # Python workers started for each task instead of forked from a daemon: Spark's data-source
    # planning otherwise leaves a daemon and an idle worker per planning step alive for the whole
    # job (hundreds of megabytes), and a
    # worker is never reused by the next stage with its predecessor's garbage. Each task pays a
    # fresh interpreter's imports instead (a catch-up has a few tasks per core).
    "spark.python.use.daemon": "false",
}
_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The progress display reads task counts from Spark's status store, which by default records
    # a task's start only if 100 ms passed since the stage's last update: the scan's first tasks,
    # started together right after the stage, are then seen only when one of them ends, and
    # the read planning (until the first task runs, applier.catchup.report) is reported seconds
    # too long. A catch-up has a few tasks a stage.
    "spark.ui.liveUpdate.period": "0",
    # Rows per Arrow batch handed to Python (the writers' input, the skeleton's collect). Those rows
    # are large (a writer bucket's pickled rows, a skeleton bundle: tens of kilobytes each), and a
    # writer holds a batch while it plans: 64 rows keep that to a few megabytes.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "64",
    "spark.sql.shuffle.partitions": "8",
    "spark.python.worker.reuse": "true",
    # Task workers import PySpark from the installation, not from Spark's zip of its sources
    # (less CPU per task): applier.catchup.spark_worker says why. The driver's JVM
    # gets no zips to begin with when launched from the Spark home links (applier.catchup.spark_home).
    "spark.python.worker.module": "applier.catchup.spark_worker",
}


def build_session(
    master: str = DEFAULT_MASTER,
    conf: Mapping[str, str] | None = None,
    app_name: str = "applier-catchup",
    archive: ClassArchive | None = None,
    spark_home: Path | None = None,
) -> SparkSession:
    """A (new or the active) SparkSession with the catch-up's data source registered; ``archive``:
    the driver JVM reads or writes that class-data archive (``applier.catchup.class_archive``);
    ``spark_home``: the JVM is launched from those links (``applier.catchup.spark_home``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = dict(conf or {})
    if "spark.jars.packages" in conf:
        raise ValueError("spark.jars.packages is not used by the catch-up and must not be set")
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(_DEFAULTS)
    if master.startswith("local"):
        settings.update(_LOCAL_DEFAULTS)
    settings.update(conf)
    settings.setdefault(f"spark.executorEnv.{_SAFE_PATH}", "1")
    if archive is not None:
        settings = archive.with_options(settings)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with launched_from(spark_home), _safe_path():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@contextlib.contextmanager
def _safe_path() -> Iterator[None]:
    """``PYTHONSAFEPATH`` set while the JVM is launched (it inherits the environment, and so do the
    Python workers it starts), then restored: this process's other children keep the usual path."""
    if _SAFE_PATH in os.environ:
        yield
        return
    os.environ[_SAFE_PATH] = "1"
    try:
        yield
    finally:
        os.environ.pop(_SAFE_PATH, None)


def register(spark: SparkSession) -> None:
    """Register the Open Protocol data source on ``spark`` (idempotent)."""
    spark.dataSource.register(OpenProtocolSource)

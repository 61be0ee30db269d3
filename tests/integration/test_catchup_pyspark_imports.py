"""The catch-up's Spark workers import PySpark from the installation, planning workers included.

The session is launched as a catch-up launches it (``applier.catchup.spark_home``): its JVM's
SPARK_HOME holds no ``python/lib/pyspark.zip``, so the workers it starts for Spark's planning of a
Python data source (which no setting reaches) and for its tasks import the installed PySpark with
its compiled files, not the zip's sources.
"""

from __future__ import annotations

import os
import sys

from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from tests.integration.catchup_support import spark_session


class _WhereFrom(DataSource):
    """One row: where the planning worker and the task worker imported PySpark from."""

    @classmethod
    def name(cls) -> str:
        return "applier_test_where_from"

    def schema(self) -> str:
        return "planning string, task string"

    def reader(self, schema) -> DataSourceReader:
        return _WhereFromReader()


class _WhereFromReader(DataSourceReader):
    def partitions(self) -> list[InputPartition]:  # runs in Spark's planning worker
        import pyspark

        return [InputPartition(pyspark.__file__)]

    def read(self, partition: InputPartition):  # runs in a task worker
        import pyspark

        yield (partition.value, pyspark.__file__)


def test_planning_and_task_workers_import_pyspark_from_the_installation() -> None:
    import pyspark

    spark = spark_session()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module
    spark.dataSource.register(_WhereFrom)
    [row] = spark.read.format(_WhereFrom.name()).load().collect()
    installed = os.path.realpath(pyspark.__file__)
    assert os.path.realpath(row["planning"]) == installed, row
    assert os.path.realpath(row["task"]) == installed, row
    assert "spark-home-" not in os.environ.get("SPARK_HOME", "")  # set only while the JVM was launched

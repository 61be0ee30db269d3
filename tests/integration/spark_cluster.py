"""A real Spark standalone cluster for the tests: one master and one worker on 127.0.0.1.

Both are started from the PySpark installation (``bin/spark-class``), as an operator would start
them from a Spark distribution, so a catch-up test can run against ``spark://`` exactly as it runs
in local mode: the executors are separate JVMs with their own Python workers, and nothing is
shared with the driver but the network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_SECONDS = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_class() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return str(Path(_find_spark_home()) / "bin" / "spark-class")


def _wait_for(log: Path, text: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.25)
    raise RuntimeError(f"the Spark {what} did not start: {log.read_text(errors='replace')[-2000:]}")


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    workdir: str


@contextlib.contextmanager
def standalone_cluster(cores: int = 2, memory: str = "2g") -> Iterator[SparkCluster]:
    """A master and a worker offering ``cores`` and ``memory``; both stopped on exit."""
    workdir = tempfile.mkdtemp(prefix="spark-cluster-")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": workdir}
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = _spark_class()
    procs: list[subprocess.Popen] = []
    try:
        master_log = Path(workdir, "master.log")
        with open(master_log, "wb") as out:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(_free_port())],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        procs.append(master)
        _wait_for(master_log, "I have been elected leader", master, "master")
        worker_log = Path(workdir, "worker.log")
        with open(worker_log, "wb") as out:
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
                 "--work-dir", str(Path(workdir, "work"))],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        procs.append(worker)
        _wait_for(worker_log, "Successfully registered with master", worker, "worker")
        yield SparkCluster(url, workdir)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

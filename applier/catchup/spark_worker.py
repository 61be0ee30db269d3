"""The Python worker of the catch-up's Spark tasks: PySpark's own worker, imported from the
installed PySpark rather than from the ``pyspark.zip`` that Spark puts first on its workers' path.

Why: that zip holds PySpark's sources only, and Python compiles a module imported from a zip every
time (it caches compiled files only beside sources on disk). Each worker Spark starts (a process
per task in local mode, see ``applier.catchup.session``) then spends several times the CPU on
compiling PySpark before the task runs than the same imports take from the installation's cached
files, at the start of every reader and writer task. The installed PySpark is used only when it
is the zip's own version (a cluster started from the same installation); otherwise nothing
changes. The zips stay on the path after the installation, for anything it lacks. The driver's
own JVM (local mode's tasks, and Spark's planning workers everywhere) is launched without the zips
at all (``applier.catchup.spark_home``): there this module finds none to move, and it matters for
a cluster's executors, or when the links are off.

Session setting ``spark.python.worker.module`` names this module (``applier.catchup.session``);
importing it must not import PySpark before the path is arranged.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import zipfile

_VERSION = re.compile(r"""__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""")


def _version_in(path: str) -> str | None:
    """The PySpark version of a ``pyspark.zip`` (None when unreadable)."""
    try:
        with zipfile.ZipFile(path) as zf:
            found = _VERSION.search(zf.read("pyspark/version.py").decode("utf-8", "replace"))
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    return found.group(1) if found else None


def _installed_version(paths: list[str]) -> str | None:
    """The version of the PySpark installed on ``paths`` (directories only), if any."""
    for entry in paths:
        version_file = os.path.join(entry, "pyspark", "version.py")
        if os.path.isfile(version_file):
            try:
                with open(version_file, encoding="utf-8", errors="replace") as fh:
                    found = _VERSION.search(fh.read())
            except OSError:
                return None
            return found.group(1) if found else None
    return None


def prefer_installed_pyspark(path: list[str]) -> bool:
    """Move Spark's ``pyspark.zip`` and ``py4j-*.zip`` entries of ``path`` to its end when the
    PySpark installed on the rest of it is the zip's own version; True when moved."""
    zips = [p for p in path if p.endswith(".zip") and os.path.basename(p).startswith(("pyspark", "py4j"))]
    spark_zip = next((p for p in zips if os.path.basename(p) == "pyspark.zip"), None)
    if spark_zip is None:
        return False
    rest = [p for p in path if p not in zips]
    version = _version_in(spark_zip)
    if version is None or _installed_version([p for p in rest if os.path.isdir(p)]) != version:
        return False
    path[:] = rest + zips
    return True


if __name__ == "__main__":
    prefer_installed_pyspark(sys.path)
    runpy.run_module("pyspark.worker", run_name="__main__", alter_sys=True)

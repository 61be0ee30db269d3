"""The SPARK_HOME the catch-up's driver JVM is launched with: the installed PySpark's, without its zips.

Why: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the path of every
Python worker its JVM starts. The zip holds sources only, and Python compiles what it imports from
a zip in every process: importing PySpark's planning worker that way takes about twice as long
as from the installation's compiled files. Before the scan's first task, the driver's JVM starts such
workers one after another (Spark's lookup of the Python data sources, the creation of ours and
the planning of its read), and in local mode one per task. ``spark.python.worker.module`` reaches
the task workers only (:mod:`applier.catchup.spark_worker`); no setting reaches the others.

So the JVM is launched with a SPARK_HOME of links to the installed PySpark's own entries (``bin``,
``jars``, ...) except ``python``: its workers find no zip and import the installed PySpark, of the
same version by construction, and the start-up and the read planning are shorter
(docs/performance.md). The links are made once, in the
directory of the JVM's class archive (setting ``catchup_class_archive``; ``off``: none, and the JVM
is launched from the installation itself); their name holds a digest of the installation's path
and version, so an upgrade makes new ones. The class archive keeps matching: its jars are the same
files. A SPARK_HOME set in the environment is the operator's choice and is left as it is.

Executors of a cluster are launched by its workers from their own Spark installation, which this
does not touch (their task workers are :mod:`applier.catchup.spark_worker`'s).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from applier.catchup.class_archive import cache_directory

_LEFT_OUT = "python"  # the entry of the installation whose zips the workers must not see


def installed_spark_home(package: Path | None = None) -> Path | None:
    """The installed PySpark's directory (or ``package``) when it is a Spark home (a launcher and
    jars, as a pip-installed PySpark is), else None."""
    if package is None:
        import pyspark

        package = Path(pyspark.__file__).resolve().parent
    if (package / "bin" / "spark-submit").is_file() and (package / "jars").is_dir():
        return package
    return None


def spark_home_links(setting: str | None, installed: Path | None = None) -> Path | None:
    """The directory of links for the installed PySpark in the class archive's directory
    (``setting``), made on first use; None when off, when PySpark is not a Spark home or when the
    directory cannot be written (the JVM is then launched from the installation itself)."""
    directory = cache_directory(setting)
    home = installed if installed is not None else installed_spark_home()
    if directory is None or home is None:
        return None
    import pyspark

    digest = hashlib.sha256(f"{home}|{pyspark.__version__}".encode()).hexdigest()[:16]
    links = directory / f"spark-home-{digest}"
    if _in_place(links, home):
        return links
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=directory))
    except OSError:
        return None
    try:
        for entry in home.iterdir():
            if entry.name != _LEFT_OUT:
                (staging / entry.name).symlink_to(entry)
        os.rename(staging, links)  # atomic: a concurrent catch-up sees no links or all of them
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        # Another catch-up may have put the same links in place meanwhile.
        return links if _in_place(links, home) else None
    return links


def _in_place(links: Path, home: Path) -> bool:
    """Whether ``links`` are already there, for ``home`` (checked by the launcher's directory)."""
    return (links / "bin").resolve() == home / "bin"


@contextlib.contextmanager
def launched_from(links: Path | None) -> Iterator[None]:
    """SPARK_HOME set to ``links`` while the JVM is launched (PySpark's launcher reads it from the
    environment), then restored: nothing else of this process, such as a Spark cluster a test
    starts from the installation, sees it. A SPARK_HOME already set is left as it is."""
    if links is None or "SPARK_HOME" in os.environ:
        yield
        return
    os.environ["SPARK_HOME"] = str(links)
    try:
        yield
    finally:
        os.environ.pop("SPARK_HOME", None)

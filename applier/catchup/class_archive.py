"""The Spark driver JVM's class-data archive: a catch-up's JVM starts in about half the time.

Why: a catch-up spends seconds before it reads anything, most of them in the JVM loading and
verifying Spark's classes. The JVM can map the classes a run loaded from an archive instead
(class data sharing), and the session starts in about half the time (docs/performance.md).

How: the archive is specific to one JVM build and one Spark installation, so its name holds a
digest of both (:func:`archive_key`). A catch-up that finds it starts the JVM with
``-XX:SharedArchiveFile`` (and marks it used: its modification time). One that does not (the
first on a machine, or after an upgrade) runs with ``-XX:ArchiveClassesAtExit`` pointed at a file
of its own (``.part``): the JVM writes what it loaded when it exits. The job ends by stopping
Spark and letting its JVM exit (:meth:`ClassArchive.finish`), but does not wait for the writing:
a detached process (:func:`settle`, this module run as a program) waits for the JVM, then renames
the file into place, which is atomic: a catch-up starting meanwhile sees no archive or a whole
one, never a part.

Several installations on one host (a virtual environment beside a container build, an upgrade
side by side) each keep their own archive: archives of other keys are removed only when unused
for :data:`_UNUSED_SECONDS`, or when more than :data:`_KEEP` are kept (the least recently used
first). A run that fails leaves its JVM to write its part as it exits, after the process: that
part is never used, and a later run removes it once it is an hour old. A JVM that cannot use or
write an archive says so only in its own log (CDS logging is off) and runs as it would without one.

The archive (about 170 MB) lives in the setting ``catchup_class_archive``'s directory, by default
``$XDG_CACHE_HOME/ticdc-applier`` (``~/.cache/ticdc-applier``); ``off`` turns it off. An operator
who sets the driver's JVM options themselves (``spark.driver.extraJavaOptions`` naming an archive
or ``-Xshare``) keeps theirs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from applier.ops.logs import get_logger

OPTION = "spark.driver.extraJavaOptions"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_EXIT_SECONDS = 120.0  # the JVM writing the archive as it exits: seconds; past this it is killed
_STALE_PART_SECONDS = 3600.0  # the JVM writes a .part only as it exits: one this old was left by a killed run
_KEEP = 4  # archives kept in one directory, one per JVM and Spark installation in use on the host
_UNUSED_SECONDS = 30 * 86400.0  # an archive no catch-up read for this long belongs to a removed installation


def java_binary() -> str | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def archive_key(java: str, spark_home: str, spark_version: str) -> str:
    """A digest of the JVM build (its real path and modification time) and the Spark installation
    (its directory and version): an archive is only valid for the pair that wrote it."""
    real = os.path.realpath(java)
    stamp = os.stat(real).st_mtime_ns
    text = f"{real}|{stamp}|{os.path.realpath(spark_home)}|{spark_version}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_directory() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "ticdc-applier"


def cache_directory(setting: str | None) -> Path | None:
    """The directory the setting ``catchup_class_archive`` names (empty: the default; None: ``off``),
    where the archive and the JVM's Spark home links (``applier.catchup.spark_home``) live."""
    if setting is not None and setting.strip().lower() == "off":
        return None
    return Path(setting) if setting else default_directory()


@dataclass(frozen=True)
class ClassArchive:
    """The archive of this JVM and Spark: ``path``; ``part``: where this run writes one (none yet)."""

    path: Path
    part: Path | None

    def java_options(self) -> str:
        if self.part is not None:
            return f"-XX:ArchiveClassesAtExit={self.part} {_QUIET}"
        return f"-XX:SharedArchiveFile={self.path} {_QUIET}"

    def with_options(self, conf: dict[str, str]) -> dict[str, str]:
        """``conf`` (the session's settings) with the archive's JVM options added to the driver's,
        unless those already name an archive of their own."""
        current = conf.get(OPTION, "")
        if any(word in current for word in ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")):
            return conf
        return {**conf, OPTION: f"{current} {self.java_options()}".strip()}

    def finish(self, spark: object) -> None:
        """After the job: when this run writes the archive, stop Spark and let the JVM exit (it writes
        the archive then); a detached process puts the archive in place once the JVM is gone, so
        the catch-up does not wait for the writing. Nothing to do when it read one."""
        if self.part is None:
            return
        proc = _gateway_process(spark)
        if proc is None:
            return
        with contextlib.suppress(Exception):  # a context already stopped, a JVM already gone
            spark.stop()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            proc.stdin.close()  # the gateway exits at the end of its input
        try:
            subprocess.Popen(
                [sys.executable, "-P", "-m", __name__, str(proc.pid), str(self.part), str(self.path)],
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives this process, and a signal to its group
            )
        except OSError as exc:  # the catch-up is done: an archive not written only costs time
            get_logger(component="catchup").warning("JVM class archive not written", error=str(exc))


def settle(jvm_pid: int, part: Path, path: Path, timeout: float = _EXIT_SECONDS) -> bool:
    """Wait for the JVM ``jvm_pid`` to exit (killed past ``timeout`` seconds), then move the archive
    it wrote at ``part`` to ``path`` and prune the directory (:func:`prune`); True when moved."""
    log = get_logger(component="catchup")
    started = time.monotonic()
    while _running(jvm_pid):
        if time.monotonic() - started > timeout:
            with contextlib.suppress(OSError):
                os.kill(jvm_pid, 9)
            with contextlib.suppress(OSError):
                part.unlink()
            log.warning("the Spark JVM did not exit in time; no class archive written", seconds=timeout)
            return False
        time.sleep(0.1)
    if not part.is_file() or part.stat().st_size == 0:
        with contextlib.suppress(OSError):
            part.unlink()
        return False
    try:
        os.replace(part, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            part.unlink()
        log.warning("JVM class archive not put in place", path=str(path), error=str(exc))
        return False
    prune(path.parent)
    log.info(
        "JVM class archive written; later catch-ups start their JVM faster",
        path=str(path),
        seconds=round(time.monotonic() - started, 1),
    )
    return True


def prune(directory: Path, now: float | None = None) -> None:
    """Remove the archives of ``directory`` unused for :data:`_UNUSED_SECONDS` and, past
    :data:`_KEEP`, the least recently used (an archive's modification time is its last use)."""
    now = time.time() if now is None else now
    found: list[tuple[float, Path]] = []
    for archive in directory.glob("spark-classes-*.jsa"):
        with contextlib.suppress(OSError):
            found.append((archive.stat().st_mtime, archive))
    found.sort(reverse=True)
    for rank, (used, archive) in enumerate(found):
        if rank >= _KEEP or now - used > _UNUSED_SECONDS:
            with contextlib.suppress(OSError):
                archive.unlink()


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _gateway_process(spark: object) -> subprocess.Popen | None:
    """The JVM process PySpark started for ``spark`` (None when it did not start one)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    return proc if isinstance(proc, subprocess.Popen) and proc.stdin is not None else None


def class_archive(setting: str | None) -> ClassArchive | None:
    """The archive to use or write, from the setting (a directory, empty: the default, ``off``);
    None when off, when no ``java`` is found, or when the directory cannot be written."""
    directory = cache_directory(setting)
    if directory is None:
        return None
    java = java_binary()
    if java is None or not os.path.exists(java):
        return None
    import pyspark

    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = archive_key(java, os.path.dirname(pyspark.__file__), pyspark.__version__)
    except OSError:
        return None
    path = directory / f"spark-classes-{key}.jsa"
    if path.is_file():
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: pruning keeps the archives in use (prune)
        return ClassArchive(path, None)
    if not os.access(directory, os.W_OK):
        return None
    now = time.time()
    for part in directory.glob("spark-classes-*.part"):
        with contextlib.suppress(OSError):
            if now - part.stat().st_mtime > _STALE_PART_SECONDS:
                part.unlink()
    return ClassArchive(path, directory / f"spark-classes-{key}.{os.getpid()}.part")


# Started by ClassArchive.finish: python -m applier.catchup.class_archive JVM_PID PART PATH
if __name__ == "__main__":
    settle(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))

"""applier.catchup.class_archive: which archive a catch-up reads or writes, and how it is put in place."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from applier.catchup import class_archive as ca


@pytest.fixture
def java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A JAVA_HOME whose bin/java is a plain file (the key reads its path and modification time)."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    binary = home / "bin" / "java"
    binary.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(home))
    return binary


def test_off_means_no_archive(java: Path) -> None:
    assert ca.class_archive("off") is None
    assert ca.class_archive(" OFF ") is None


def test_without_an_archive_the_run_writes_one_of_its_own(java: Path, tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    archive = ca.class_archive(str(directory))
    assert archive is not None and archive.part is not None
    assert archive.path.parent == directory and archive.path.name.startswith("spark-classes-")
    assert archive.part.name.endswith(f".{os.getpid()}.part")
    assert f"-XX:ArchiveClassesAtExit={archive.part}" in archive.java_options()
    assert oct(directory.stat().st_mode & 0o777) == "0o700"


def test_an_archive_in_place_is_read(java: Path, tmp_path: Path) -> None:
    first = ca.class_archive(str(tmp_path))
    assert first is not None
    first.path.write_bytes(b"archive")
    again = ca.class_archive(str(tmp_path))
    assert again == ca.ClassArchive(first.path, None)
    assert again.java_options().startswith(f"-XX:SharedArchiveFile={first.path} ")


def test_another_jvm_build_gets_another_archive(java: Path, tmp_path: Path) -> None:
    first = ca.class_archive(str(tmp_path))
    os.utime(java, ns=(1, 1))
    second = ca.class_archive(str(tmp_path))
    assert first is not None and second is not None and first.path != second.path


def test_the_options_join_the_driver_s_and_leave_an_operator_s_own(java: Path, tmp_path: Path) -> None:
    archive = ca.class_archive(str(tmp_path))
    assert archive is not None
    conf = {ca.OPTION: "-XX:+UseSerialGC", "spark.ui.enabled": "false"}
    got = archive.with_options(conf)
    assert got[ca.OPTION] == "-XX:+UseSerialGC " + archive.java_options()
    assert got["spark.ui.enabled"] == "false" and conf[ca.OPTION] == "-XX:+UseSerialGC"
    assert archive.with_options({})[ca.OPTION] == archive.java_options()
    own = {ca.OPTION: "-XX:SharedArchiveFile=/opt/mine.jsa"}
    assert archive.with_options(own) == own


def test_a_stale_part_is_removed_and_a_fresh_one_kept(java: Path, tmp_path: Path) -> None:
    stale, fresh = tmp_path / "spark-classes-x.1.part", tmp_path / "spark-classes-x.2.part"
    stale.write_bytes(b"old")
    fresh.write_bytes(b"new")
    os.utime(stale, (0, 0))
    ca.class_archive(str(tmp_path))
    assert not stale.exists() and fresh.exists()


class _Spark:
    stopped = False

    def stop(self) -> None:
        self.stopped = True


def _jvm(writes: Path | None, delay: float = 0.0) -> subprocess.Popen:
    """A stand-in for the gateway JVM: at the end of its input it waits ``delay`` seconds, then
    writes ``writes`` and exits."""
    body = f"import sys, time; sys.stdin.read(); time.sleep({delay!r})"
    if writes:
        body += f"; open({str(writes)!r}, 'wb').write(b'jsa')"
    return subprocess.Popen([sys.executable, "-c", body], stdin=subprocess.PIPE)


def _eventually(check, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_finish_lets_the_jvm_exit_without_waiting_and_its_archive_is_put_in_place_after(
    java: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = ca.class_archive(str(tmp_path))
    assert archive is not None and archive.part is not None
    proc = _jvm(archive.part, delay=2.0)
    monkeypatch.setattr(ca, "_gateway_process", lambda spark: proc)
    spark = _Spark()
    started = time.monotonic()
    archive.finish(spark)
    assert time.monotonic() - started < 1.5, "finish does not wait for the JVM to write the archive"
    assert spark.stopped and not archive.path.exists()
    _eventually(lambda: archive.path.is_file())
    assert archive.path.read_bytes() == b"jsa"
    _eventually(lambda: not archive.part.exists())
    proc.wait()


def test_settle_moves_the_archive_into_place_and_keeps_other_installations_archives(
    java: Path, tmp_path: Path
) -> None:
    other = tmp_path / "spark-classes-0000000000000000.jsa"
    other.write_bytes(b"another Spark installation's")
    archive = ca.class_archive(str(tmp_path))
    assert archive is not None and archive.part is not None
    proc = _jvm(archive.part)
    proc.stdin.close()
    assert ca.settle(proc.pid, archive.part, archive.path)
    assert proc.wait() == 0
    assert archive.path.read_bytes() == b"jsa" and not archive.part.exists()
    assert other.read_bytes() == b"another Spark installation's"


def test_settle_without_an_archive_written_leaves_nothing(java: Path, tmp_path: Path) -> None:
    archive = ca.class_archive(str(tmp_path))
    assert archive is not None and archive.part is not None
    proc = _jvm(None)
    proc.stdin.close()
    assert not ca.settle(proc.pid, archive.part, archive.path)
    proc.wait()
    assert list(tmp_path.glob("spark-classes-*")) == []


def test_prune_keeps_the_most_recently_used_archives_and_drops_the_long_unused(tmp_path: Path) -> None:
    now = 1_000_000_000.0
    archives = [tmp_path / f"spark-classes-{i:016x}.jsa" for i in range(ca._KEEP + 2)]
    for age, path in enumerate(archives):
        path.write_bytes(b"jsa")
        os.utime(path, (now - age * 60, now - age * 60))
    unused = tmp_path / "spark-classes-ffffffffffffffff.jsa"
    unused.write_bytes(b"jsa")
    os.utime(unused, (0, 0))
    ca.prune(tmp_path, now=now)
    assert sorted(tmp_path.glob("*.jsa")) == sorted(archives[: ca._KEEP])


def test_an_archive_read_is_marked_used(java: Path, tmp_path: Path) -> None:
    first = ca.class_archive(str(tmp_path))
    assert first is not None
    first.path.write_bytes(b"archive")
    os.utime(first.path, (0, 0))
    ca.class_archive(str(tmp_path))
    assert first.path.stat().st_mtime > 0


def test_finish_after_reading_an_archive_does_nothing(java: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ca, "_gateway_process", lambda spark: pytest.fail("the JVM is left alone"))
    spark = _Spark()
    ca.ClassArchive(tmp_path / "a.jsa", None).finish(spark)
    assert not spark.stopped

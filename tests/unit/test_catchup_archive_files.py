"""applier.catchup.class_archive: which archive a catch-up reads or writes, and how it is put in place."""

from __future__ import annotations

import os
import subprocess
import sys
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


def _jvm(writes: Path | None) -> subprocess.Popen:
    """A stand-in for the gateway JVM: it exits at the end of its input, writing ``writes`` then."""
    body = "import sys; sys.stdin.read()" + (f"; open({str(writes)!r}, 'wb').write(b'jsa')" if writes else "")
    return subprocess.Popen([sys.executable, "-c", body], stdin=subprocess.PIPE)


def test_finish_lets_the_jvm_exit_and_moves_its_archive_into_place(
    java: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = tmp_path / "spark-classes-0000000000000000.jsa"
    older.write_bytes(b"an older Spark's")
    archive = ca.class_archive(str(tmp_path))
    assert archive is not None and archive.part is not None
    proc = _jvm(archive.part)
    monkeypatch.setattr(ca, "_gateway_process", lambda spark: proc)
    spark = _Spark()
    archive.finish(spark)
    assert spark.stopped and proc.returncode == 0
    assert archive.path.read_bytes() == b"jsa"
    assert not archive.part.exists() and not older.exists()


def test_finish_without_an_archive_written_leaves_nothing(
    java: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = ca.class_archive(str(tmp_path))
    assert archive is not None and archive.part is not None
    proc = _jvm(None)
    monkeypatch.setattr(ca, "_gateway_process", lambda spark: proc)
    archive.finish(_Spark())
    assert list(tmp_path.glob("spark-classes-*")) == []


def test_finish_after_reading_an_archive_does_nothing(java: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ca, "_gateway_process", lambda spark: pytest.fail("the JVM is left alone"))
    spark = _Spark()
    ca.ClassArchive(tmp_path / "a.jsa", None).finish(spark)
    assert not spark.stopped

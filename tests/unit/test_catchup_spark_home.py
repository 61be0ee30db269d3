"""applier.catchup.spark_home: the links the driver JVM is launched from (PySpark's home, no zips)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from applier.catchup.spark_home import installed_spark_home, launched_from, spark_home_links


def _installation(base: Path) -> Path:
    """A pip-installed PySpark's shape: a launcher, jars, Python modules and python/lib's zips."""
    home = base / "site-packages" / "pyspark"
    for sub in ("bin", "jars", "sbin", "python/lib"):
        (home / sub).mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (home / "jars" / "spark-core.jar").write_text("")
    (home / "python" / "lib" / "pyspark.zip").write_text("")
    (home / "__init__.py").write_text("")
    return home


def test_the_links_hold_every_entry_of_the_installation_but_its_python_zips(tmp_path: Path) -> None:
    home = _installation(tmp_path)
    links = spark_home_links(str(tmp_path / "cache"), installed=home)
    assert links is not None and links.parent == tmp_path / "cache"
    assert sorted(p.name for p in links.iterdir()) == ["__init__.py", "bin", "jars", "sbin"]
    assert (links / "bin" / "spark-submit").resolve() == home / "bin" / "spark-submit"
    assert all(p.is_symlink() for p in links.iterdir())
    # Made once: the next catch-up finds them (no staging directory left behind either).
    assert spark_home_links(str(tmp_path / "cache"), installed=home) == links
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [links.name]


def test_another_installation_gets_links_of_its_own(tmp_path: Path) -> None:
    first = spark_home_links(str(tmp_path / "cache"), installed=_installation(tmp_path / "a"))
    second = spark_home_links(str(tmp_path / "cache"), installed=_installation(tmp_path / "b"))
    assert first is not None and second is not None and first != second


def test_no_links_when_off_unwritable_or_not_a_spark_home(tmp_path: Path) -> None:
    home = _installation(tmp_path)
    assert spark_home_links("off", installed=home) is None
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        assert spark_home_links(str(locked), installed=home) is None
    client_only = tmp_path / "client" / "pyspark"  # a PySpark without Spark's launcher and jars
    client_only.mkdir(parents=True)
    assert installed_spark_home(client_only) is None
    assert installed_spark_home(home) == home


def test_this_environments_pyspark_gets_links(tmp_path: Path) -> None:
    links = spark_home_links(str(tmp_path / "cache"))
    assert links is not None and (links / "jars").is_dir() and not (links / "python").exists()


def test_spark_home_is_set_only_while_the_jvm_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    with launched_from(tmp_path):
        assert os.environ["SPARK_HOME"] == str(tmp_path)
    assert "SPARK_HOME" not in os.environ
    with launched_from(None):
        assert "SPARK_HOME" not in os.environ


def test_an_operators_spark_home_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    with launched_from(tmp_path):
        assert os.environ["SPARK_HOME"] == "/opt/spark"
    assert os.environ["SPARK_HOME"] == "/opt/spark"

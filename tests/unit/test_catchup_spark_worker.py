"""The catch-up's Spark worker imports PySpark from the installation when it is the zip's version."""

from __future__ import annotations

import zipfile
from pathlib import Path

from applier.catchup.spark_worker import prefer_installed_pyspark


def _spark_lib(base: Path, version: str) -> list[str]:
    """Spark's worker path entries: a pyspark.zip of ``version`` and a py4j zip."""
    lib = base / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as zf:
        zf.writestr("pyspark/version.py", f'__version__: str = "{version}"\n')
    with zipfile.ZipFile(lib / "py4j-0.10.9.9-src.zip", "w") as zf:
        zf.writestr("py4j/__init__.py", "")
    return [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]


def _installed(base: Path, version: str) -> str:
    site = base / "site-packages"
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "version.py").write_text(f"__version__: str = '{version}'\n")
    return str(site)


def test_the_zips_go_after_an_installation_of_the_same_version(tmp_path: Path) -> None:
    zips = _spark_lib(tmp_path, "4.3.0")
    site = _installed(tmp_path, "4.3.0")
    path = ["/work/app", *zips, "/opt/lib.zip", site]
    assert prefer_installed_pyspark(path)
    assert path == ["/work/app", "/opt/lib.zip", site, *zips]


def test_another_installed_version_or_none_leaves_the_path_alone(tmp_path: Path) -> None:
    zips = _spark_lib(tmp_path, "4.3.0")
    other = _installed(tmp_path, "4.1.1")
    for path in ([*zips, other], [*zips, str(tmp_path / "nothing-here")], [other]):
        before = list(path)
        assert not prefer_installed_pyspark(path)
        assert path == before


def test_an_unreadable_zip_leaves_the_path_alone(tmp_path: Path) -> None:
    (tmp_path / "pyspark.zip").write_bytes(b"not a zip")
    site = _installed(tmp_path, "4.3.0")
    path = [str(tmp_path / "pyspark.zip"), site]
    assert not prefer_installed_pyspark(path) and path == [str(tmp_path / "pyspark.zip"), site]

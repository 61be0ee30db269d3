"""``applier catchup`` started from a checkout while the applier is installed elsewhere, not editable.

Spark starts its Python workers with ``-m``, which puts the working directory first on their path:
without care, a catch-up started from a checkout imports the checkout's sources there, whose
compiled modules are not built, and every reading task fails. The installation here is a copy of
the compiled packages on PYTHONPATH, the checkout a copy of the sources alone, and the driver runs
with ``-P`` as an installed console script does (its path starts at the script's directory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.catchup_support import backlog_after_a_backup, catchup_flags, class_archive_directory
from tests.integration.harness import Changefeed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("applier", "sqlgen", "checkpoint")


def _copy(target: Path, compiled: bool) -> None:
    """The packages into ``target``: with their compiled modules (an installation) or without (a checkout)."""
    skip = ["__pycache__", "*.c", "*.html"] + ([] if compiled else ["*.so"])
    for package in PACKAGES:
        shutil.copytree(ROOT / package, target / package, ignore=shutil.ignore_patterns(*skip))


def test_a_catchup_started_from_a_checkout_imports_the_installed_applier(
    feed: Changefeed, tmp_path: Path
) -> None:
    installed, checkout = tmp_path / "site-packages", tmp_path / "checkout"
    _copy(installed, compiled=True)
    _copy(checkout, compiled=False)
    assert list(installed.rglob("*.so")) and not list(checkout.rglob("*.so"))

    sim, x, r = backlog_after_a_backup(feed, seed=43, transactions=60)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPLIER_", "PYTHONSAFEPATH"))}
    env["PYTHONPATH"] = str(installed)
    flags = catchup_flags(feed, x, "--catchup-class-archive", class_archive_directory())
    with tempfile.TemporaryFile() as out:
        proc = subprocess.run(
            [
                sys.executable,
                "-P",
                "-m",
                "applier",
                "catchup",
                *flags,
                "--spark-conf",
                "spark.driver.memory=1g",
            ],
            cwd=checkout,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
        out.seek(0)
        log = out.read().decode(errors="replace")
    assert proc.returncode == 0, log[-4000:]
    assert "cannot be imported" not in log
    assert feed.compare(sim, r) == []

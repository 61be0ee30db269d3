"""The systemd unit: ``systemd-analyze verify`` passes silently, and it says what the issue asks for.

``verify`` checks that ExecStart= exists, so it runs with ``--root`` on a scratch tree holding the
unit, the distribution's own unit directory (for the targets it references) and a stand-in
executable at the ExecStart path. Unknown keys and bad values only make ``verify`` warn, so any
output at all fails the test. ``systemd-analyze`` comes with the systemd package; ``make test``
installs it when missing (``make tools``).
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from pathlib import Path

from applier.settings.schema import resolve

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "ticdc-applier.service"


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: run `make tools` (apt-get install systemd)"
    return found


def _unit_dir() -> Path:
    for candidate in ("/usr/lib/systemd/system", "/lib/systemd/system"):
        if Path(candidate, "multi-user.target").exists():
            return Path(candidate)
    raise AssertionError("no systemd unit directory with multi-user.target: install the systemd package")


def _directives(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value (keys may repeat in unit files)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def _exec_path() -> str:
    return _directives(UNIT)["Service"]["ExecStart"][0].split()[0]


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    root = tmp_path / "root"
    shutil.copytree(_unit_dir(), root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system" / UNIT.name).write_text(unit_text)
    exe = root / _exec_path().lstrip("/")
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return subprocess.run(
        [_systemd_analyze(), "verify", f"--root={root}", UNIT.name],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""},
    )


def test_systemd_analyze_verify_prints_nothing(tmp_path: Path) -> None:
    done = _verify(UNIT.read_text(), tmp_path)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stdout + done.stderr


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    """The check is not vacuous: an unknown key and a bad value make verify speak."""
    broken = UNIT.read_text().replace("MemoryMax=2G", "MemoryMax=lots\nWatchdogSecs=5")
    done = _verify(broken, tmp_path)
    assert "Unknown key" in done.stderr and "Invalid memory limit" in done.stderr


def test_the_unit_has_what_operations_need() -> None:
    d = _directives(UNIT)
    svc = d["Service"]

    def one(key: str) -> str:
        assert key in svc, f"{key}= missing"
        return svc[key][-1]

    assert one("Type") == "notify"
    assert one("Restart") == "on-failure" and one("RestartSec")
    assert "StartLimitBurst" in d["Unit"] and "StartLimitIntervalSec" in d["Unit"]
    assert one("EnvironmentFile") == "-/etc/ticdc-applier/env"
    exec_start = one("ExecStart")
    assert exec_start.endswith("run --config /etc/ticdc-applier/applier.toml")
    assert "password" not in exec_start.lower() and "@" not in exec_start
    assert one("DynamicUser") == "yes" or "User" in svc
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "CapabilityBoundingSet": "",
    }.items():
        assert one(key) == value, key
    assert "@system-service" in svc["SystemCallFilter"]
    assert one("MemoryMax").endswith("G")
    # The watchdog is fed every WatchdogSec/3; the daemon exits within ~10 s of SIGTERM.
    watchdog = int(one("WatchdogSec").removesuffix("s"))
    stop = int(one("TimeoutStopSec").removesuffix("s"))
    assert watchdog >= 30 and stop >= 15
    assert one("RestartPreventExitStatus") == "2"  # configuration errors are not retried
    assert d["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_example_configuration_is_valid(tmp_path: Path) -> None:
    """The example applier.toml passes the same validation as `run` (certificate paths made real)."""
    example = (ROOT / "systemd" / "applier.toml").read_text()
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "ca.pem").write_text("x")
    path = tmp_path / "applier.toml"
    path.write_text(example.replace("/etc/ticdc-applier/tls", str(tls)))
    cfg = resolve("run", {"config": str(path)}, environ={})
    assert cfg.http_listen == "127.0.0.1:9400" and cfg.downstream_ssl_mode == "verify_identity"
    assert ":" not in cfg.downstream.split("@")[0].removeprefix("mysql://")  # no password in the URL
    env = configparser.ConfigParser()
    env.read_string("[env]\n" + (ROOT / "systemd" / "env.example").read_text())
    assert set(env["env"]) == {"applier_downstream_password"}


def test_the_transient_user_can_read_the_config_and_the_documentation_link_is_installed() -> None:
    """DynamicUser= runs the daemon as a user that is not root: the configuration directory must let
    it through (applier.toml is 0644, docs/operations.md), and Documentation= names the file that the
    wheel's data files put under the venv (pyproject.toml). tests/deploy/test_systemd.py checks both
    under a real systemd."""
    import tomllib

    d = _directives(UNIT)
    assert d["Service"]["DynamicUser"] == ["yes"]
    assert d["Service"]["ConfigurationDirectoryMode"] == ["0755"]
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    installed = {
        f"file:///opt/ticdc-applier/{where}/{Path(f).name}" for where, fs in data_files.items() for f in fs
    }
    assert d["Unit"]["Documentation"][0] in installed

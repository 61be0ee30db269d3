"""The pieces of the real container test: images built as docker/build-with-podman.sh builds them,
compose.yaml's service settings turned into ``podman run`` flags, and rootful podman driven from
Python (always with ``--runtime runc`` and explicit ulimits: crun cannot start containers on this
machine kind, and podman's default ulimits are the host's hard limits).

Podman here is the stand-in for Docker, so its differences from Docker are turned off where they
would hide a fault: ``--read-only`` alone would add tmpfs mounts on /tmp, /var/tmp and /run
(``--read-only-tmpfs``), which Docker does not; the test passes ``--read-only-tmpfs=false`` so
that the container has only the writable places compose.yaml declares.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
CACHE = Path(os.environ.get("APPLIER_CONTAINER_CACHE", "/var/cache/ticdc-applier-tests/container"))

RUNTIME = ["--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
LABEL = "ticdc-applier-test=container"  # on everything the test creates, so that it can all be found

# compose.yaml keys of a service that have no meaning for a single `podman run` on the host network:
# how the image is built (the test builds it), restarts, published ports (--network host instead),
# start order, profiles. Every other key must be translated below, or the test fails: a setting
# added to compose.yaml is then tested, not silently dropped.
NOT_FOR_PODMAN_RUN = {"build", "image", "restart", "ports", "depends_on", "profiles"}


def podman(*args: str, check: bool = True, timeout: float = 600, **kw: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise AssertionError(
            f"podman {shlex.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return done


def build_image(target: str, tag: str) -> float:
    """docker/build-with-podman.sh for ``target`` (base image and layers cached in podman's
    storage); returns its wall time in seconds."""
    started = time.monotonic()
    env = {**os.environ, "TARGET": target, "TAG": tag, "APPLIER_CONTAINER_CACHE": str(CACHE)}
    done = subprocess.run(
        ["bash", str(DOCKER / "build-with-podman.sh")], env=env, capture_output=True, text=True, timeout=3600
    )
    assert done.returncode == 0, f"build of {target} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return time.monotonic() - started


def image_size_mb(tag: str) -> float:
    return int(podman("image", "inspect", tag, "--format", "{{.Size}}").stdout.strip()) / 1e6


def compose_services() -> dict[str, dict[str, Any]]:
    """compose.yaml's services, with the ``x-applier`` anchor merged in (YAML merge keys)."""
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]


def _seconds(value: str | int) -> int:
    """A compose duration (``30s``, ``1m30s``, ``5m``) in whole seconds."""
    if isinstance(value, int):
        return value
    total, units = 0, {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)(h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"unsupported duration {value!r}"
    for n, u in parts:
        total += int(n) * units[u]
    return total


@dataclass
class ServiceRun:
    """A compose service as ``podman run`` flags: what compose.yaml says, with the test's own
    environment values (broker, downstream, ports) put over it."""

    name: str
    flags: list[str]
    command: list[str]
    environment: dict[str, str]
    stop_seconds: int
    healthcheck: dict[str, Any] | None
    volumes: list[str] = field(default_factory=list)  # named volumes the run needs


def service_run(
    name: str,
    *,
    secrets: dict[str, Path],
    environment: dict[str, str] | None = None,
    volume_prefix: str,
) -> ServiceRun:
    """Translate compose.yaml's service ``name``. ``secrets``: compose secret name -> host file
    (mounted read-only at ``/run/secrets/NAME``, compose's default target); ``environment``:
    values put over the service's; named volumes get ``volume_prefix`` (the test creates and
    removes them)."""
    svc = dict(compose_services()[name])
    flags = [*RUNTIME, *ULIMITS, "--network", "host", "--label", LABEL]
    env = {k: str(v) for k, v in (svc.pop("environment", None) or {}).items()}
    env.update(environment or {})
    volumes: list[str] = []
    stop_seconds = 10
    healthcheck = None
    command = list(svc.pop("command", None) or [])
    for key, value in svc.items():
        if key in NOT_FOR_PODMAN_RUN:
            continue
        if key == "user":
            flags += ["--user", str(value)]
        elif key == "read_only":
            flags += ["--read-only" if value else "--read-only=false", "--read-only-tmpfs=false"]
        elif key == "cap_drop":
            flags += [f"--cap-drop={cap}" for cap in value]
        elif key == "security_opt":
            flags += [f"--security-opt={opt}" for opt in value]
        elif key == "stop_signal":
            flags += ["--stop-signal", value]
        elif key == "stop_grace_period":
            stop_seconds = _seconds(value)
            flags += ["--stop-timeout", str(stop_seconds)]
        elif key == "tmpfs":
            for entry in [value] if isinstance(value, str) else value:
                flags += ["--tmpfs", entry]
        elif key == "volumes":
            for entry in value:
                assert isinstance(entry, str), (
                    f"{name}: only the short volume syntax is translated: {entry!r}"
                )
                source, target, *mode = entry.split(":")
                if source.startswith((".", "/")):  # a bind mount, relative to compose.yaml
                    source = str((DOCKER / source).resolve())
                else:
                    source = volume_prefix + source
                    volumes.append(source)
                flags += ["--volume", ":".join([source, target, *mode])]
        elif key == "secrets":
            for secret in value:
                assert isinstance(secret, str), f"{name}: only the short secret syntax is translated"
                flags += ["--volume", f"{secrets[secret]}:/run/secrets/{secret}:ro"]
        elif key == "healthcheck":
            if value.get("disable"):
                flags += ["--no-healthcheck"]
            else:
                healthcheck = value
                test = value["test"]
                assert test[0] == "CMD", test
                flags += ["--health-cmd", json.dumps(test[1:])]
                for opt, flag in (
                    ("interval", "--health-interval"),
                    ("timeout", "--health-timeout"),
                    ("retries", "--health-retries"),
                    ("start_period", "--health-start-period"),
                ):
                    if opt in value:
                        flags += [flag, str(value[opt])]
        else:
            raise AssertionError(f"compose.yaml service {name}: key {key!r} is not translated to podman run")
    for k, v in env.items():
        flags += ["--env", f"{k}={v}"]
    return ServiceRun(name, flags, command, env, stop_seconds, healthcheck, volumes)


def container_state(name: str) -> dict[str, Any]:
    return json.loads(podman("inspect", "--type", "container", name, "--format", "{{json .State}}").stdout)


def health_status(name: str) -> str:
    state = container_state(name)
    health = state.get("Health") or state.get("Healthcheck") or {}
    return health.get("Status", "")


def logs(name: str) -> str:
    done = podman("logs", name, check=False)
    return done.stdout + done.stderr


def remove_test_containers() -> None:
    """Every container and volume this test made (by label), running or not."""
    ids = podman("ps", "-a", "-q", "--filter", f"label={LABEL}", check=False).stdout.split()
    if ids:
        podman("rm", "--force", "--volumes", "--time", "0", *ids, check=False)
    vols = podman("volume", "ls", "-q", "--filter", f"label={LABEL}", check=False).stdout.split()
    if vols:
        podman("volume", "rm", "--force", *vols, check=False)

"""The images under a real container engine, as docker/README.md runs them.

docker/Dockerfile's ``runtime`` and ``catchup`` targets are built with docker/build-with-podman.sh
(a stand-in base made with mmdebstrap, the layers cached in podman's storage), then run with
rootful podman on the host network, read-only, as user 10001, with the database password as a
mounted secret file: every setting of compose.yaml's ``simulate``, ``applier`` and ``catchup``
services is turned into ``podman run`` flags (tests/deploy/container_support.py), so what
compose.yaml declares is what runs here. Upstream: an embedded broker on the host, filled by
``applier simulate`` run from the image. Downstream: the host's MariaDB, as a user holding only
the grants docs/operations.md names. Nothing trusts the applier's own account: the data is
compared with the simulator's model of the upstream.

Run with ``make test-container`` (not part of ``make test``: it needs root and builds images).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from applier.cli import _build_parser
from applier.commands.demo import _stream_config
from applier.kafka.embedded_broker import EmbeddedBroker
from applier.simulator import Simulation, simulate
from tests.deploy.container_support import (
    LABEL,
    build_image,
    container_state,
    health_status,
    image_size_mb,
    logs,
    podman,
    remove_test_containers,
    service_run,
)
from tests.deploy.database import admin, drop_objects
from tests.integration.catchup_support import restore_backup
from tests.integration.harness import Changefeed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREFIX = "dep_ctr_"
USER = f"{PREFIX}applier"
UPSTREAM = f"{PREFIX}up"  # the simulated upstream schema
CHECKPOINT = f"{PREFIX}ckpt"
GROUP = f"{PREFIX}group"
TAGS = {"runtime": "localhost/ticdc-applier-test:runtime", "catchup": "localhost/ticdc-applier-test:catchup"}
PORTS = range(19450, 19500)  # this test's HTTP endpoints (the host network is shared)


def _say(line: str) -> None:
    """Timings and sizes, in the test output (shown with pytest -s, as make test-container runs it)."""
    print(f"[container] {line}", flush=True)


def _free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Both targets built (a warm run reuses the base image and every layer)."""
    for target, tag in TAGS.items():
        seconds = build_image(target, tag)
        _say(f"built {target} as {tag} in {seconds:.0f}s: {image_size_mb(tag):.0f} MB")
    return TAGS


@pytest.fixture(scope="module")
def podman_clean() -> Iterator[None]:
    """Containers and volumes of the test removed before (a killed run's) and after, whatever happens."""
    remove_test_containers()
    try:
        yield
    finally:
        remove_test_containers()


def _drop_all(mariadb_params: dict) -> None:
    drop_objects(mariadb_params, (UPSTREAM, CHECKPOINT), USER)


@pytest.fixture(scope="module")
def database_user(mariadb_params: dict) -> Iterator[tuple[str, str]]:
    """(user, password): a user with exactly the grants of docs/operations.md ("The database user")
    on this test's checkpoint and upstream schemas; dropped with the schemas at the end."""
    password = secrets.token_hex(16)
    _drop_all(mariadb_params)  # what a killed run left
    conn = admin(mariadb_params)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (USER, password))
            cur.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{CHECKPOINT}`.* TO %s@'%%'", (USER,)
            )
            cur.execute(
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, REFERENCES, CREATE VIEW, "
                f"SHOW VIEW ON `{UPSTREAM}`.* TO %s@'%%'",
                (USER,),
            )
            cur.execute("GRANT PROCESS ON *.* TO %s@'%%'", (USER,))
    finally:
        conn.close()
    try:
        yield USER, password
    finally:
        _drop_all(mariadb_params)


@pytest.fixture(scope="module")
def secret_file(database_user: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The password as a file only the container's user can read (docker/README.md, "Password")."""
    path = tmp_path_factory.mktemp("secrets") / "db_password"
    path.write_text(database_user[1] + "\n")
    os.chown(path, 10001, 10001)
    path.chmod(0o400)
    return path


@pytest.fixture(scope="module")
def feed(broker: EmbeddedBroker, mariadb_params: dict) -> Changefeed:
    """The changefeed the containers apply, with the root connection for the checks."""
    p = mariadb_params
    return Changefeed(
        broker.bootstrap,
        f"{PREFIX}{uuid.uuid4().hex[:8]}",
        f"mysql://{USER}@{p['host']}:{p['port']}/",
        p,
        group_id=GROUP,
        checkpoint_schema=CHECKPOINT,
    )


def _settings(feed: Changefeed, port: int) -> dict[str, str]:
    """The test's values over compose.yaml's environment: where the broker and database are."""
    return {
        "APPLIER_KAFKA_BOOTSTRAP": feed.bootstrap,
        "APPLIER_TOPIC": feed.topic,
        "APPLIER_GROUP_ID": feed.group_id,
        "APPLIER_DOWNSTREAM": feed.downstream,
        "APPLIER_CHECKPOINT_SCHEMA": feed.checkpoint_schema,
        "APPLIER_HTTP_LISTEN": f"127.0.0.1:{port}",
    }


def _replace_option(command: list[str], option: str, value: str) -> list[str]:
    i = command.index(option)
    return [*command[: i + 1], value, *command[i + 2 :]]


@pytest.fixture(scope="module")
def backlog(images, podman_clean, feed: Changefeed, secret_file: Path) -> Simulation:
    """compose.yaml's ``simulate`` service run from the image against the host's broker: the topic
    holds the stream; the same stream is simulated here (same options, same seed) as the truth."""
    run = service_run("simulate", secrets={"db_password": secret_file}, volume_prefix=PREFIX)
    command = run.command
    for option, value in (
        ("--kafka-bootstrap", feed.bootstrap),
        ("--topic", feed.topic),
        ("--schema", UPSTREAM),
    ):
        command = _replace_option(command, option, value)
    started = time.monotonic()
    done = podman("run", "--rm", *run.flags, images["runtime"], *command, check=False, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _say(f"simulate in the runtime image: {time.monotonic() - started:.1f}s")
    return simulate(_stream_config(_build_parser().parse_args(command)))


def _wait_applied(feed: Changefeed, resolved: int, name: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    have = 0
    while time.monotonic() < deadline:
        state = container_state(name)
        assert state["Running"], f"the container stopped (exit {state['ExitCode']}):\n{logs(name)[-4000:]}"
        try:
            have = feed.checkpoint()[0]
        except pymysql.err.ProgrammingError:  # no checkpoint tables yet
            have = 0
        if have >= resolved:
            return
        time.sleep(1)
    raise AssertionError(f"checkpoint at {have} after {timeout}s, want {resolved}:\n{logs(name)[-4000:]}")


def _wait_healthy(name: str, timeout: float = 90) -> float:
    """Run the container's health check (podman runs none by itself without systemd) until it
    passes; returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if podman("healthcheck", "run", name, check=False).returncode == 0:
            return time.monotonic() - started
        time.sleep(1)
    raise AssertionError(f"not healthy after {timeout}s ({health_status(name)}):\n{logs(name)[-4000:]}")


def test_runtime_image_read_only_applies_the_stream_is_healthy_and_stops_on_sigterm(
    images, feed: Changefeed, backlog: Simulation, secret_file: Path
) -> None:
    env = _settings(feed, _free_port())
    # A small row cache: rows the barrier holds go to the spill directory, so the volume
    # compose.yaml declares is written for real.
    env["APPLIER_MAX_CACHED_BYTES"] = "64K"
    run = service_run("applier", secrets={"db_password": secret_file}, environment=env, volume_prefix=PREFIX)
    assert run.environment["APPLIER_DOWNSTREAM_PASSWORD_FILE"] == "/run/secrets/db_password"
    assert "--read-only" in run.flags and "--user" in run.flags and run.volumes
    for volume in run.volumes:
        podman("volume", "create", "--label", LABEL, volume)
    name = f"{PREFIX}applier"
    started = time.monotonic()
    podman("run", "--detach", "--name", name, *run.flags, images["runtime"], *run.command)

    _wait_applied(feed, backlog.final_resolved_ts, name)
    _say(f"applied the stream in {time.monotonic() - started:.1f}s")
    assert feed.compare(backlog, backlog.final_resolved_ts) == []
    took = _wait_healthy(name)
    assert health_status(name) == "healthy"
    _say(f"healthy {took:.1f}s after the stream was applied")

    # Read-only: nothing but the declared volume is writable (no tmpfs on /tmp as podman adds by default).
    probe = podman("exec", name, "python", "-c", "import tempfile; tempfile.mkstemp()", check=False)
    assert probe.returncode != 0 and "No usable temporary directory" in probe.stderr, probe.stderr
    text = logs(name)
    assert "moved to disk" in text, text[-4000:]  # the spill directory was used
    assert "Traceback" not in text, text[-4000:]

    stop_started = time.monotonic()
    podman("stop", "--time", str(run.stop_seconds), name, timeout=run.stop_seconds + 30)
    stopped_in = time.monotonic() - stop_started
    state = container_state(name)
    assert state["ExitCode"] == 0, logs(name)[-4000:]
    assert stopped_in < run.stop_seconds, f"stopped in {stopped_in:.1f}s: SIGKILLed after the grace period?"
    _say(f"SIGTERM: exit 0 in {stopped_in:.1f}s")


def test_catchup_image_applies_the_same_backlog(
    images, feed: Changefeed, backlog: Simulation, secret_file: Path, mariadb_params: dict
) -> None:
    """A downstream restored from a backup at X (the model's snapshot) and a fresh checkpoint: the
    catch-up, read-only in the catchup image with Spark in local mode, brings it to the topic's end."""
    conn = admin(mariadb_params)
    try:
        with conn.cursor() as cur:
            for schema in (UPSTREAM, CHECKPOINT):
                cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
    finally:
        conn.close()
    alter = next(ev for ev in backlog.ddl_events if ev.ddl_type == 5)
    x = max(ts for ts in backlog.resolved_points if ts < alter.commit_ts - 1)
    restore_backup(feed, backlog, x)

    env = _settings(feed, _free_port())
    run = service_run("catchup", secrets={"db_password": secret_file}, environment=env, volume_prefix=PREFIX)
    assert "--read-only" in run.flags
    for volume in run.volumes:
        podman("volume", "create", "--label", LABEL, volume)
    started = time.monotonic()
    done = podman(
        "run",
        "--name",
        f"{PREFIX}catchup",
        *run.flags,
        images["catchup"],
        "catchup",
        "--from-ts",
        str(x),
        "--spark-master",
        "local[2]",
        check=False,
        timeout=900,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    _say(f"catch-up in the catchup image: {time.monotonic() - started:.1f}s")
    assert "Traceback" not in output, output[-6000:]
    assert feed.checkpoint()[0] == backlog.final_resolved_ts, output[-4000:]
    assert feed.compare(backlog, backlog.final_resolved_ts) == []

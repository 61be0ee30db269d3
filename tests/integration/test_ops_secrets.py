"""The database password never appears in any output: logs (debug level), status, config check, errors.

A real MariaDB user with a password is created for the test, and the daemon applies a real stream
with it, the password coming from the environment, from a file, and (discouraged) from the URL.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from applier.simulator import StreamConfig, produce_simulation, simulate
from tests.integration.harness import Changefeed

pytestmark = pytest.mark.integration


@pytest.fixture
def db_user(mariadb_params: dict) -> Iterator[tuple[str, str]]:
    user = f"pw_{uuid.uuid4().hex[:8]}"
    password = f"Sekr1t.{uuid.uuid4().hex[:12]}~x"
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE USER %s@'127.0.0.1' IDENTIFIED BY %s", (user, password))
            cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO `{user}`@'127.0.0.1'")
        yield user, password
    finally:
        with conn.cursor() as cur:
            cur.execute("DROP USER IF EXISTS %s@'127.0.0.1'", (user,))
        conn.close()


@pytest.fixture
def feed(broker, mariadb_params, db_user, monkeypatch) -> Iterator[Changefeed]:
    user, _ = db_user
    for name in ("APPLIER_DOWNSTREAM_PASSWORD", "APPLIER_DOWNSTREAM_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    url = f"mysql://{user}@127.0.0.1:{mariadb_params['port']}/"
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", url, mariadb_params)
    cf.extra_args += ["--log-level", "debug", "--http-listen", "off"]
    yield cf
    cf.drop()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "applier", *args], capture_output=True, text=True, timeout=60
    )


def test_no_output_contains_the_password(feed: Changefeed, db_user, monkeypatch, tmp_path) -> None:
    user, password = db_user
    sim = simulate(StreamConfig(seed=41, partitions=2, transactions=60, schema=feed.new_schema()))
    produce_simulation(feed.bootstrap, feed.topic, sim)
    outputs: list[str] = []

    # 1. From the environment (what the systemd unit's EnvironmentFile does).
    monkeypatch.setenv("APPLIER_DOWNSTREAM_PASSWORD", password)
    done = feed.run_to_end()
    outputs += [done.stdout, done.stderr]
    assert done.returncode == 0, done.stderr
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    status_args = ["--downstream", feed.downstream, "--group-id", feed.group_id]
    status_args += ["--checkpoint-schema", feed.checkpoint_schema]
    for extra in ((), ("--json",)):
        out = _cli("status", *status_args, *extra)
        assert out.returncode == 0, out.stderr
        outputs += [out.stdout, out.stderr]
    check = _cli("config", "check", "--kafka-bootstrap", "x:1", "--topic", "t", *status_args)
    assert check.returncode == 0, check.stderr
    assert "variable APPLIER_DOWNSTREAM_PASSWORD" in check.stdout
    outputs += [check.stdout, check.stderr]
    monkeypatch.delenv("APPLIER_DOWNSTREAM_PASSWORD")

    # 2. From a file (downstream_password_file), resuming the same changefeed.
    secret = tmp_path / "db_password"
    secret.write_text(password + "\n")
    done = feed.run_to_end("--downstream-password-file", str(secret))
    outputs += [done.stdout, done.stderr]
    assert done.returncode == 0, done.stderr

    # 3. In the URL (discouraged, but it must still never be printed), also through config check.
    in_url = feed.downstream.replace(f"{user}@", f"{user}:{password}@")
    feed.downstream = in_url
    done = feed.run_to_end()
    outputs += [done.stdout, done.stderr]
    assert done.returncode == 0, done.stderr
    check = _cli(
        "config",
        "check",
        "--kafka-bootstrap",
        "x:1",
        "--topic",
        "t",
        "--group-id",
        "g",
        "--downstream",
        in_url,
        "--kafka-config",
        f"sasl.password={password}",
    )
    assert check.returncode == 0, check.stderr
    outputs += [check.stdout, check.stderr]

    # 4. Failures: an unreachable server and a refused login, with the password in the URL.
    feed.downstream = f"mysql://{user}:{password}@127.0.0.1:1/"
    done = feed.run_to_end(timeout=60)
    assert done.returncode != 0
    assert "cannot reach the downstream database" in done.stderr + done.stdout
    outputs += [done.stdout, done.stderr]
    feed.downstream = in_url.replace(password, password + "-wrong")
    done = feed.run_to_end(timeout=60)
    assert done.returncode != 0
    assert "refused the login" in done.stderr + done.stdout
    outputs += [done.stdout, done.stderr]

    everything = "\n".join(outputs)
    assert "window applied" in everything  # the logs really were captured, at debug level
    assert password not in everything
    assert password[:10] not in everything  # not even a prefix (e.g. a truncated URL)

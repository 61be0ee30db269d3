"""No secret ever appears in any output: logs (debug level), /metrics, status, config check, errors.

A real MariaDB user with a password is created for the test, and the daemon applies a real stream
with it, the password coming from the environment, from a file, and (discouraged) from the URL.
Then every secret at once (the password, a TLS client key, a SASL password in the ``[kafka]``
table), on a private TLS server, through every failure the daemon can be driven into.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pymysql
import pytest

from applier.kafka.embedded_broker import free_port
from applier.simulator import SimRecord, StreamConfig, produce_simulation, simulate
from applier.simulator.producer import produce_records
from tests.builders import frame_docs
from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.ops_support import http_base, http_get, wait_until
from tests.integration.private_mariadb import PrivateMariaDB, start_private_mariadb

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


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``applier ARGS`` run to its end, with ``env`` added to the test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "applier", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
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

    # 4. Failures: an unreachable server (waited for) and a refused login, with the password in
    # the URL.
    feed.downstream = f"mysql://{user}:{password}@127.0.0.1:1/"
    waiting = feed.start("--http-listen", "off")
    try:
        outputs.append(wait_for_output(waiting, "cannot reach the downstream database", 30))
    finally:
        stop(waiting, signal.SIGTERM)
    outputs.append(read_log(waiting))
    feed.downstream = in_url.replace(password, password + "-wrong")
    done = feed.run_to_end(timeout=60)
    assert done.returncode != 0
    assert "refused the login" in done.stderr + done.stdout
    outputs += [done.stdout, done.stderr]

    everything = "\n".join(outputs)
    assert "window applied" in everything  # the logs really were captured, at debug level
    assert password not in everything
    assert password[:10] not in everything  # not even a prefix (e.g. a truncated URL)


# --- every secret at once, on every error path the daemon can be driven into ----------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateMariaDB, str]]:
    """A private MariaDB refusing unencrypted sessions, with a user that needs both a password
    and a client certificate (so the key file is really read and used)."""
    server = start_private_mariadb(Path(tmp_path_factory.mktemp("mariadb-secrets")))
    password = f"Db.{uuid.uuid4().hex[:14]}~p"
    try:
        conn = server.root()
        with conn.cursor() as cur:
            cur.execute("CREATE USER 'applier'@'%%' IDENTIFIED BY %s REQUIRE X509", (password,))
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'applier'@'%'")
        conn.close()
        yield server, password
    finally:
        server.stop()


def _secret_lines(pem: str) -> list[str]:
    """The base64 lines of a PEM file: any of them in an output would be part of the key."""
    return [line for line in pem.splitlines() if line and not line.startswith("-----")]


def _finished(proc: subprocess.Popen, timeout: float = 120) -> str:
    proc.wait(timeout=timeout)
    return read_log(proc)


def test_no_secret_in_any_output_of_any_error_path(broker, tls_server, tmp_path) -> None:
    """The database password (from the environment), the client key of the TLS settings and the
    SASL password of the ``[kafka]`` table, all set at once; the daemon applies a stream, serves
    /metrics, ``status`` reads the checkpoint, then every failure it can be driven into: a bad
    record, a wrong password, an unreachable database, an unreachable broker, a SASL handshake
    the broker refuses, a key file that is no key. No output holds any secret.

    The key *path* is not a secret (``config check`` prints it, as it prints every file path);
    the key's content is.
    """
    server, password = tls_server
    sasl_password = f"Sasl.{uuid.uuid4().hex[:14]}~s"
    certs = server.certs
    key_pem = (certs / "client.key").read_text()
    config = tmp_path / "applier.toml"
    config.write_text(
        '[kafka]\n"security.protocol" = "plaintext"\n"debug" = "conf"\n"sasl.username" = "applier"\n'
        f'"sasl.password" = "{sasl_password}"\n'
    )
    tls = ["--downstream-ssl-ca", str(certs / "ca.pem"), "--downstream-ssl-cert", str(certs / "client.pem")]
    tls += ["--downstream-ssl-key", str(certs / "client.key")]
    with_password = {"APPLIER_DOWNSTREAM_PASSWORD": password}
    url = f"mysql://applier@127.0.0.1:{server.port}/"
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", url, server.params)
    cf.extra_args += ["--config", str(config), *tls, "--log-level", "debug", "--log-format", "json"]
    outputs: list[str] = []
    try:
        sim = simulate(StreamConfig(seed=43, partitions=2, transactions=30, schema=cf.new_schema()))
        produce_simulation(cf.bootstrap, cf.topic, sim)

        # 1. Apply the stream; scrape the endpoints and read the status while the daemon runs.
        proc = cf.start("--http-listen", "127.0.0.1:0", env=with_password)
        try:
            base = http_base(proc)

            def applied() -> bool:
                try:
                    return cf.checkpoint()[0] == sim.final_resolved_ts
                except pymysql.err.ProgrammingError:  # no checkpoint table yet
                    return False

            wait_until(applied, 120, "the stream applied", proc)
            for path in ("/metrics", "/healthz", "/readyz"):
                outputs.append(http_get(base + path)[1])
            status = ["status", "--downstream", url, "--group-id", cf.group_id]
            status += ["--checkpoint-schema", cf.checkpoint_schema, *tls]
            for extra in ((), ("--json",)):
                out = _cli(*status, *extra, env=with_password)
                assert out.returncode == 0, out.stderr
                outputs += [out.stdout, out.stderr]
            assert str(sim.final_resolved_ts) in outputs[-2]

            # 2. A bad record: the daemon stops at it, exit 1, naming its position.
            bad_key, bad_value = frame_docs(
                [b'{"ts":1,"scm":"s","tbl":"t","t":1}'], [b'{"u":{"a":{"t":3,"f":0,"v":"not an integer"}}}']
            )
            produce_records(cf.bootstrap, cf.topic, [SimRecord(0, bad_key, bad_value, [])])
            log = _finished(proc)
        finally:
            stop(proc)
        assert proc.returncode == 1 and "malformed TiCDC Open Protocol record" in log, log[-3000:]
        outputs.append(log)

        # 3. Failures to start, side by side (each on its own changefeed: no lock to wait for).
        def other() -> Changefeed:
            return replace(
                cf,
                group_id=f"cf_{uuid.uuid4().hex[:10]}",
                extra_args=[*cf.extra_args, "--http-listen", "off"],
            )

        key_is_password = tmp_path / "not-a-key.pem"
        key_is_password.write_text(password + "\n" + sasl_password + "\n")
        waits = {  # waited out at start-up: seen in the log, then stopped
            "cannot reach the downstream database": replace(
                other(), downstream=f"mysql://applier@127.0.0.1:{free_port()}/"
            ).start(env=with_password),
            "Broker transport failure": replace(other(), bootstrap=f"127.0.0.1:{free_port()}").start(
                env=with_password
            ),
        }
        try:
            for expected, run in waits.items():
                outputs.append(wait_for_output(run, expected, 60))
        finally:
            for run in waits.values():
                stop(run, signal.SIGTERM)
                outputs.append(read_log(run))
        runs = {
            "refused the login": other().start(env={"APPLIER_DOWNSTREAM_PASSWORD": password + "-wrong"}),
            "SASL": other().start(
                env={
                    **with_password,
                    "APPLIER_KAFKA_CONFIG": "security.protocol=SASL_PLAINTEXT,sasl.mechanism=PLAIN,"
                    f"sasl.username=applier,sasl.password={sasl_password}",
                }
            ),
            "cannot load the TLS files": other().start(
                "--downstream-ssl-key", str(key_is_password), env=with_password
            ),
        }
        try:
            for expected, run in runs.items():
                log = _finished(run)
                assert run.returncode != 0 and expected in log, f"{expected}:\n{log[-3000:]}"
                outputs.append(log)
        finally:
            for run in runs.values():
                stop(run)

        # 4. What config check prints of all of it.
        check = _cli("config", "check", *cf.args()[4:], "--http-listen", "off", env=with_password)
        assert check.returncode == 0, check.stderr
        outputs += [check.stdout, check.stderr]
    finally:
        cf.drop()

    everything = "\n".join(outputs)
    assert '"window applied"' in everything and "# TYPE applier_" in everything  # logs and metrics seen
    assert "sasl.password = [redacted]" in everything  # librdkafka's own dump of its settings
    for secret in (password, sasl_password, *_secret_lines(key_pem), key_pem.strip()):
        assert secret not in everything
    assert password[:10] not in everything and sasl_password[:10] not in everything

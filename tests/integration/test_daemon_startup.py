"""Start-up: what is not there yet is waited for, what a restart cannot fix ends the process at once.

At boot the database or the broker may come up after the daemon, and TiCDC creates the topic only
when the changefeed first writes. Under systemd an exit there would be restart, restart, then a
failed unit; so the daemon waits (capped backoff, one log line then summaries, ``/readyz`` 503 with
the reason, ``STATUS=`` and ``EXTEND_TIMEOUT_USEC=`` to systemd) and goes on when they appear.
A wrong password, a missing privilege, a setting librdkafka does not know or a config file the
service's user cannot read never heal: one line, exit 2 (``RestartPreventExitStatus=2``), no
traceback, nothing written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pymysql
import pytest

from applier.kafka.embedded_broker import free_port, start_broker
from applier.simulator import StreamConfig, produce_simulation, simulate
from applier.simulator.producer import ensure_topic
from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.ops_support import http_base, http_get, wait_until
from tests.integration.tcp_proxy import TcpProxy
from tests.notify_socket import bind_notify_socket

pytestmark = pytest.mark.integration


def _readyz(base: str) -> tuple[int, dict]:
    status, body = http_get(base + "/readyz")
    return status, json.loads(body)


def _waiting_for(base: str, text: str) -> bool:
    status, doc = _readyz(base)
    return status == 503 and doc.get("status") == "waiting" and text in doc.get("reason", "")


def _one_line_exit_2(
    proc: subprocess.CompletedProcess | subprocess.Popen, output: str, *needles: str
) -> None:
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output and "unexpected error" not in output, output[-3000:]
    for needle in needles:
        assert needle in output, f"{needle!r} not in:\n{output[-3000:]}"


def _exited(proc: subprocess.Popen) -> None:
    """Wait for a daemon that should exit by itself; one that waits instead is stopped, not left."""
    try:
        proc.wait(timeout=60)
    finally:
        stop(proc)


def _notify_lines(sock) -> list[str]:
    lines = []
    sock.settimeout(0)
    while True:
        try:
            lines += sock.recv(65536).decode().splitlines()
        except BlockingIOError:
            return lines


def test_a_database_down_at_start_is_waited_for(feed: Changefeed, mariadb_params: dict, monkeypatch) -> None:
    """The database refuses connections for the first seconds: not ready with the reason,
    STATUS= and EXTEND_TIMEOUT_USEC= to systemd, no READY=1; once it answers, every row arrives."""
    sim = simulate(StreamConfig(seed=5, partitions=2, transactions=60, schema=feed.new_schema()))
    produce_simulation(feed.bootstrap, feed.topic, sim)
    proxy = TcpProxy(int(mariadb_params["port"]))
    proxy.cut()  # refuses, as a server that is not up yet
    sock, notify = bind_notify_socket()
    monkeypatch.setenv("NOTIFY_SOCKET", notify)
    cf = replace(feed, downstream=f"mysql://{mariadb_params['user']}@127.0.0.1:{proxy.port}/")
    proc = cf.start("--http-listen", "127.0.0.1:0", "--log-format", "json", "--exit-when-caught-up")
    try:
        base = http_base(proc)
        wait_until(lambda: _waiting_for(base, "cannot reach the downstream database"), 30, "waiting", proc)
        sent = _notify_lines(sock)
        assert any(m.startswith("STATUS=starting: waiting for the downstream database") for m in sent), sent
        assert any(m.startswith("EXTEND_TIMEOUT_USEC=") for m in sent) and "READY=1" not in sent, sent
        assert proc.poll() is None
        proxy.restore()
        assert proc.wait(timeout=120) == 0, read_log(proc)[-3000:]
        assert "READY=1" in _notify_lines(sock)
    finally:
        stop(proc)
        proxy.close()
        sock.close()
    log = read_log(proc)
    assert log.count("transient downstream error, retrying the start-up") == 1  # then summaries
    assert "downstream recovered: the start-up goes on" in log
    resolved, _ = feed.checkpoint()
    assert resolved == sim.final_resolved_ts  # the whole stream, not an empty end
    assert feed.compare(sim, resolved) == []


def test_a_broker_and_a_topic_that_appear_later_are_waited_for(feed: Changefeed) -> None:
    """No broker at the bootstrap address, then a broker without the topic, then the topic: the
    daemon says which it waits for (``/readyz``) and applies the stream once it is there. With
    ``--start latest``: a topic created while the daemon waited is read from its beginning (the
    stream is produced whole while the daemon is stopped between two attempts)."""
    port = free_port()
    cf = replace(feed, bootstrap=f"127.0.0.1:{port}")
    sim = simulate(StreamConfig(seed=6, partitions=2, transactions=60, schema=feed.new_schema()))
    proc = cf.start("--http-listen", "127.0.0.1:0", "--log-format", "json", "--start", "latest")
    broker = None
    try:
        base = http_base(proc)
        wait_until(lambda: _waiting_for(base, "no broker answered"), 60, "waiting for a broker", proc)
        broker = start_broker(port)
        wait_until(lambda: _waiting_for(base, "does not exist"), 60, "waiting for the topic", proc)
        assert proc.poll() is None
        proc.send_signal(signal.SIGSTOP)  # the whole stream is in the topic before it looks again
        try:
            produce_simulation(cf.bootstrap, cf.topic, sim)
        finally:
            proc.send_signal(signal.SIGCONT)
        # Not --exit-when-caught-up: a daemon that found the new topic before its first record
        # would be caught up at once, with nothing applied.
        wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, 120, "the whole stream", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, read_log(proc)[-3000:]
        log = read_log(proc)
        assert "Kafka recovered: the topic is readable" in log
        resolved, _ = feed.checkpoint()
        assert resolved == sim.final_resolved_ts  # the whole stream, not an empty end
        assert feed.compare(sim, resolved) == []
    finally:
        stop(proc)
        if broker is not None:
            broker.stop()


def test_sigterm_while_waiting_exits_0_at_once(feed: Changefeed) -> None:
    cf = replace(feed, topic=f"never_{uuid.uuid4().hex[:8]}")
    proc = cf.start("--http-listen", "off")
    try:
        wait_for_output(proc, "transient Kafka error, waiting for the broker and the topic", 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        stop(proc)


@pytest.fixture
def unprivileged(mariadb_params: dict) -> Iterator[tuple[str, str]]:
    """A user that may log in and nothing else."""
    user, password = f"nopriv_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
        yield user, password
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP USER IF EXISTS %s@'%%'", (user,))
        admin.close()


def _as(feed: Changefeed, user: str, mariadb_params: dict) -> Changefeed:
    return replace(feed, downstream=f"mysql://{user}@127.0.0.1:{mariadb_params['port']}/")


def test_missing_privileges_name_the_grant(feed: Changefeed, unprivileged, mariadb_params: dict) -> None:
    """Without privileges on the checkpoint schema: one line with the GRANT that fixes it, exit 2;
    ``applier status`` without SELECT likewise."""
    user, password = unprivileged
    env = {"APPLIER_DOWNSTREAM_PASSWORD": password}
    cf = _as(feed, user, mariadb_params)
    proc = cf.start("--http-listen", "off", env=env)
    _exited(proc)
    grant = f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{feed.checkpoint_schema}`.* TO '{user}'@'%'"
    _one_line_exit_2(proc, read_log(proc), grant)

    admin = feed.connect()  # the schema exists (an operator made it), the user may not read it
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{feed.checkpoint_schema}`")
    admin.close()
    status = subprocess.run(
        [sys.executable, "-m", "applier", "status", "--group-id", cf.group_id, "--downstream", cf.downstream,
         "--checkpoint-schema", cf.checkpoint_schema],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    _one_line_exit_2(status, status.stderr, f"GRANT SELECT ON `{feed.checkpoint_schema}`.* TO '{user}'@'%'")


def test_a_refused_login_exits_2(feed: Changefeed, unprivileged, mariadb_params: dict) -> None:
    user, password = unprivileged
    proc = _as(feed, user, mariadb_params).start(
        "--http-listen", "off", env={"APPLIER_DOWNSTREAM_PASSWORD": password + "-wrong"}
    )
    _exited(proc)
    _one_line_exit_2(proc, read_log(proc), "refused the login")
    assert password not in read_log(proc)


def test_an_unknown_librdkafka_setting_exits_2_before_anything_is_written(feed: Changefeed) -> None:
    for setting, needle in (
        ("fetch.wiat.max.ms=100", "knows no setting 'fetch.wiat.max.ms'"),
        ("fetch.wait.max.ms=no-secret-value", "refuses the value of 'fetch.wait.max.ms'"),
    ):
        proc = feed.start("--http-listen", "off", "--kafka-config", setting)
        _exited(proc)
        log = read_log(proc)
        _one_line_exit_2(proc, log, needle)
        assert "secret-value" not in log  # librdkafka quotes the value; the daemon does not
        run_args = feed.args("--kafka-config", setting)  # python -m applier run ...
        check_args = [*run_args[:3], "config", "check", *run_args[4:]]
        check = subprocess.run(check_args, capture_output=True, text=True, timeout=60)
        _one_line_exit_2(check, check.stderr, needle)
    conn = feed.connect()
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
            (feed.checkpoint_schema,),
        )
        assert cur.fetchone()[0] == 0
    conn.close()


def test_an_unreadable_config_file_exits_2(tmp_path) -> None:
    """The file systemd's DynamicUser= cannot read: who asked and who owns it, in one line."""
    config = tmp_path / "applier.toml"
    config.write_text('topic = "t"\n')
    config.chmod(0o600)
    tmp_path.chmod(0o755)
    cmd = [sys.executable, "-m", "applier", "run", "--config", str(config)]
    if os.geteuid() == 0:  # root reads any file: ask as a user that is not the owner
        cmd = ["setpriv", "--reuid=61234", "--regid=61234", "--clear-groups", *cmd]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    else:
        config.chmod(0)
        env = dict(os.environ)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd="/")
    _one_line_exit_2(done, done.stderr, f"cannot read the config file {config}", "Permission denied")


def test_a_spill_directory_that_cannot_be_made_exits_2(feed: Changefeed) -> None:
    """A read-only root without a volume at the spill directory: one line naming the setting."""
    ensure_topic(feed.bootstrap, feed.topic, 1)
    proc = feed.start("--http-listen", "off", "--spill-dir", "/proc/ticdc-applier-test/spill")
    _exited(proc)
    _one_line_exit_2(proc, read_log(proc), "cannot make the spill directory", "APPLIER_SPILL_DIR")

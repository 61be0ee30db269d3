"""Network faults between the daemon and its peers: a slow path, connections cut mid-transaction, a
path that stalls without closing (half-open), to the database and to the broker.

Every fault is made by a forwarder in front of the real server (tests/integration/tcp_proxy.py): the
daemon's downstream URL (or the broker's advertised port) names the forwarder. The daemon must
notice a dead connection within a bounded time, replay what was in flight, and converge exactly.

A stalled database path is the hard case: the server keeps the daemon's old sessions, inside their
transactions and holding their row locks and the single-active lock, while the daemon waits for an
answer that never comes. The read timeout (``read_timeout``, 300 s by default; 3 s here) gives the
apply session up, the lock heartbeat's own short timeout gives the lock session up, and each new
session ends the old one on the server before going on (docs/operations.md, "Network faults").
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from applier.downstream.lock import lock_name
from applier.simulator import PRODUCER_MODES, StreamConfig, produce_simulation, simulate
from tests.integration.harness import Changefeed, DatabaseUser, read_log, stop, wait_for_output
from tests.integration.ops_support import wait_until
from tests.integration.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READ_TIMEOUT = 3


@pytest.fixture
def db_proxy(mariadb_params: dict) -> Iterator[TcpProxy]:
    proxy = TcpProxy(int(mariadb_params["port"]))
    try:
        yield proxy
    finally:
        proxy.close()


def proxied_url(proxy: TcpProxy, user: DatabaseUser, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"mysql://{user.name}:{user.password}@127.0.0.1:{proxy.port}/" + (f"?{query}" if query else "")


def stream(feed: Changefeed, mode: str, transactions: int = 900):
    sim = simulate(
        StreamConfig(
            seed=17, partitions=3, transactions=transactions, schema=feed.new_schema(), **PRODUCER_MODES[mode]
        )
    )
    produce_simulation(feed.bootstrap, feed.topic, sim)
    feed.extra_args += ["--max-txn-rows", "10"]  # many small transactions: faults land mid-transaction
    return sim


def converge(feed: Changefeed, proc, sim, timeout: float = 240) -> None:
    wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, timeout, "the final resolved ts", proc)
    assert proc.poll() is None, "the daemon exited instead of riding the fault out:\n" + read_log(proc)
    assert feed.compare(sim, sim.final_resolved_ts) == []


def sessions(admin: pymysql.connections.Connection, user: DatabaseUser) -> set[int]:
    """The daemon's sessions: those of its own database user (other tests' run beside them)."""
    with admin.cursor() as cur:
        cur.execute("SELECT id FROM information_schema.processlist WHERE user = %s", (user.name,))
        return {int(r[0]) for r in cur.fetchall()}


def test_a_slow_path_and_connections_cut_mid_transaction_converge(
    feed: Changefeed, db_proxy: TcpProxy, own_user: DatabaseUser
) -> None:
    """Every connection to the database reset three times (the lock session's too), on a path that
    adds latency to every packet: replays on new sessions, the lock taken again, exact result."""
    sim = stream(feed, "all-classic")
    db_proxy.latency = 0.001
    feed.downstream = proxied_url(db_proxy, own_user)
    proc = feed.start()
    try:
        wait_for_output(proc, "window applied", timeout=60)
        for _ in range(3):
            db_proxy.cut()
            db_proxy.restore()
            time.sleep(1.5)
        converge(feed, proc, sim)
        log = read_log(proc)
        assert "transient downstream error" in log and "lock re-taken" in log
    finally:
        stop(proc, signal.SIGTERM)


def test_a_stalled_database_path_is_given_up_and_its_sessions_ended(
    feed: Changefeed, db_proxy: TcpProxy, own_user: DatabaseUser
) -> None:
    """The path stops forwarding in both directions and closes nothing, mid-stream. The server keeps
    the old sessions (open transactions, row locks, the named lock); the daemon must give them up,
    end them on the server, take its lock again and replay, without exiting."""
    sim = stream(feed, "all-new")
    feed.downstream = proxied_url(db_proxy, own_user, read_timeout=READ_TIMEOUT)
    admin = feed.connect()
    proc = feed.start()
    try:
        wait_for_output(proc, "window applied", timeout=60)
        with admin.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s)", (lock_name(feed.checkpoint_schema, feed.group_id),))
            lock_holder = int(cur.fetchone()[0])
        stalled = sessions(admin, own_user)
        assert lock_holder in stalled
        assert db_proxy.stall() >= 2  # the apply and lock sessions at least
        converge(feed, proc, sim)
        with admin.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s)", (lock_name(feed.checkpoint_schema, feed.group_id),))
            assert cur.fetchone()[0] not in stalled, "the lock is still held by the stalled session"
            cur.execute("SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX")
            open_trx = {int(r[0]) for r in cur.fetchall()}
        assert not (open_trx & stalled), "a stalled session still holds a transaction"
        assert lock_holder not in sessions(admin, own_user), "the stalled lock session was not ended"
        log = read_log(proc)
        assert "lock re-taken" in log and "transient downstream error" in log
    finally:
        stop(proc, signal.SIGTERM)
        admin.close()


def test_a_stalled_broker_path_is_given_up(
    proxied_broker: TcpProxy, downstream_url: str, mariadb_params: dict
) -> None:
    """The broker path stalls mid-stream (nothing answered, nothing closed): the client gives the
    connections up after ``socket.timeout.ms`` (librdkafka's default is 60 s; 5 s here), connects
    again and the stream converges. Latency on the path costs nothing but time."""
    bootstrap = f"127.0.0.1:{proxied_broker.port}"
    feed = Changefeed(bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", downstream_url, mariadb_params)
    feed.extra_args += ["--kafka-config", "socket.timeout.ms=5000"]
    try:
        sim = stream(feed, "all-classic", transactions=600)
        proxied_broker.latency = 0.002
        proc = feed.start()
        try:
            wait_for_output(proc, "window applied", timeout=60)
            assert proxied_broker.stall() >= 1
            converge(feed, proc, sim)
        finally:
            stop(proc, signal.SIGTERM)
    finally:
        feed.drop()

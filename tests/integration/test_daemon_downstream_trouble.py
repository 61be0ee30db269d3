"""A downstream that refuses to store anything for a while: read-only, or out of space.

Both are transient (docs/operations.md, "Read-only and full downstreams"): the daemon replays the
window in flight, logs the class (``read_only``, ``disk_full``), counts it in
``applier_downstream_retries_total{class}``, reports not ready after ``retry_report_seconds``, never
exits, and converges exactly once the server stores again. A transaction too large for the
server's binary log cache is permanent: one line naming the setting, exit 1, and the stream
applies once the setting is raised.

Private servers (``start_plain_mariadb``): the shared server must not turn read-only or full under
other tests. ``read_only`` does not apply to a user with SUPER / READ_ONLY ADMIN (root), so the
daemon runs as a user with the grants of docs/operations.md ("The database user") only.

How "full" is made: the InnoDB system tablespace of fixed size (``innodb_data_file_path`` without
``autoextend``), every table in it (``innodb_file_per_table=0``), filled up by a filler table.
InnoDB then refuses to extend the tablespace, exactly as when the disk under a data file is full:
``1114 The table '...' is full`` from the same code path, for every table at once. The undo logs
live in undo tablespaces of their own, so that the operator's fix, dropping the filler, needs no
space in the full one (a DROP or DELETE whose undo log has no room fails with 1114 itself). A real
small filesystem would need a mount: root, or a user namespace, which a test cannot count on.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from applier.downstream.errors import is_transient
from applier.downstream.lock import ActiveLock, LockLost, LockSuspended
from applier.downstream.url import parse_downstream_url
from applier.kafka.embedded_broker import create_topic
from applier.simulator import PRODUCER_MODES, StreamConfig, simulate
from applier.simulator.producer import produce_records
from tests.integration import test_daemon_online_ddl as online
from tests.integration.ddl_script import Script
from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.ops_support import http_base, http_get, scrape, total, value, wait_until
from tests.integration.private_mariadb import PrivateMariaDB, start_plain_mariadb
from tests.integration.test_daemon_inputs import Rec, frame

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USER, PASSWORD = "applier_ro", uuid.uuid4().hex
READ_ONLY_SECONDS = 20
REPORT_SECONDS = 3
DEFAULT_BINLOG_CACHE = 18446744073709547520  # MariaDB's default max_binlog_cache_size
T0 = 450_000_000_000_000_000
STILL_FAILING = "downstream still failing, replaying the transaction"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    """Binary log on (row format, a small cache that spills early) for the binlog cache test."""
    srv = start_plain_mariadb(
        Path(tmp_path_factory.mktemp("mariadb-trouble")),
        "--log-bin=binlog", "--binlog-format=ROW", "--binlog-cache-size=4096",
    )  # fmt: skip
    try:
        conn = srv.root()
        with conn.cursor() as cur:
            cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (USER, PASSWORD))
            # docs/operations.md, "The database user" (on every schema: the test's are random)
            cur.execute(
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, REFERENCES, "
                "CREATE VIEW, SHOW VIEW, PROCESS ON *.* TO %s@'%%'",
                (USER,),
            )
        conn.close()
        yield srv
    finally:
        srv.stop()


def _global(server: PrivateMariaDB, name: str, value: object) -> None:
    conn = server.root()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SET GLOBAL {name} = %s", (value,))
    finally:
        conn.close()


def _feed(server: PrivateMariaDB, broker, partitions: int, *, user: bool = True) -> Changefeed:
    url = f"mysql://{USER}:{PASSWORD}@127.0.0.1:{server.port}/" if user else server.url
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", url, server.params)
    create_topic(cf.bootstrap, cf.topic, partitions)
    cf.extra_args += ["--retry-report-seconds", str(REPORT_SECONDS), "--log-format", "json"]
    return cf


@pytest.fixture
def feed(server: PrivateMariaDB, broker) -> Iterator[Changefeed]:
    cf = _feed(server, broker, 3)
    yield cf
    _global(server, "read_only", 0)
    _global(server, "max_binlog_cache_size", DEFAULT_BINLOG_CACHE)
    cf.drop()


def _lines(proc) -> list[dict]:
    out = []
    for line in read_log(proc).splitlines():
        with contextlib.suppress(ValueError):  # not a log line of the daemon
            out.append(json.loads(line))
    return out


def _logged(proc, **fields: object) -> dict | None:
    """The first log line holding every one of ``fields``, None while there is none."""
    for line in _lines(proc):
        if all(line.get(k) == v for k, v in fields.items()):
            return line
    return None


def _stream(feed: Changefeed, seed: int, mode: str, transactions: int = 600):
    """A simulated stream, and where to cut it: just before the first record of the ALTER half
    way, so that the part produced while the server refuses writes holds rows and a DDL."""
    sim = simulate(
        StreamConfig(
            seed=seed,
            partitions=3,
            transactions=transactions,
            schema=feed.new_schema(),
            **PRODUCER_MODES[mode],
        )
    )
    cut = next(
        i
        for i, rec in enumerate(sim.records)
        if any(e.kind == "ddl" and (e.ddl_query or "").startswith("ALTER") for e in rec.events)
    )
    return sim, sim.records[:cut], sim.records[cut:]


def _not_ready(base: str) -> dict | None:
    status, body = http_get(base + "/readyz")
    answer = json.loads(body)
    return answer if status == 503 and answer.get("status") == "retrying" else None


def _converge(feed: Changefeed, proc, sim, timeout: float = 120) -> None:
    wait_until(lambda: feed.checkpoint()[0] == sim.final_resolved_ts, timeout, "the final resolved ts", proc)
    assert proc.poll() is None, "the daemon exited instead of riding the trouble out:\n" + read_log(proc)
    assert feed.compare(sim, sim.final_resolved_ts) == []


def _start_mid_stream(feed: Changefeed, seed: int, mode: str):
    """Produce the first part of a stream and start the daemon on it; once it applies windows,
    return the stream, the part still to produce, the process and its HTTP base."""
    sim, first, rest = _stream(feed, seed=seed, mode=mode)
    feed.extra_args += ["--max-txn-rows", "10", "--http-listen", "127.0.0.1:0"]
    produce_records(feed.bootstrap, feed.topic, first)
    proc = feed.start()
    try:
        wait_for_output(proc, "window applied", timeout=60)
        return sim, rest, proc, http_base(proc)
    except BaseException:
        stop(proc)
        raise


def _check_reported(proc, base: str, code: int, cls: str) -> None:
    """The error is logged with its class, /readyz says retrying with it, the metric counts it."""
    line = wait_until(
        lambda: _logged(proc, event="transient downstream error, replaying the transaction", code=code),
        60,
        f"the error {code}",
        proc,
    )
    assert line["error_class"] == cls, line
    reason = wait_until(lambda: _not_ready(base), 30, "/readyz to say retrying", proc)["reason"]
    assert f"{cls}=" in reason and f"({code})" in reason, reason
    assert (value(scrape(base), "applier_downstream_retries_total", **{"class": cls}) or 0) >= 1


def test_read_only_for_20_s_mid_stream_is_ridden_out(feed: Changefeed, server: PrivateMariaDB) -> None:
    """``SET GLOBAL read_only = 1`` for 20 s while windows arrive: 1290 on rows and checkpoint
    writes, replayed with reports; the stream converges exactly once writes are allowed again."""
    sim, rest, proc, base = _start_mid_stream(feed, seed=17, mode="all-classic")
    try:
        _global(server, "read_only", 1)
        since = time.monotonic()
        produce_records(feed.bootstrap, feed.topic, rest)
        _check_reported(proc, base, 1290, "read_only")
        reported = f"{STILL_FAILING}; reported as not ready"  # at the first replay after 3 s
        wait_until(lambda: _logged(proc, event=reported), 30, "the log's report", proc)
        time.sleep(max(0.0, READ_ONLY_SECONDS - (time.monotonic() - since)))
        assert proc.poll() is None, "the daemon exited under read_only:\n" + read_log(proc)
        assert feed.checkpoint()[0] < sim.final_resolved_ts  # nothing got through meanwhile
        _global(server, "read_only", 0)
        _converge(feed, proc, sim)
        wait_until(lambda: http_get(base + "/readyz")[0] == 200, 30, "/readyz ready again", proc)
        assert _logged(proc, event="downstream recovered: the transaction committed after transient errors")
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0
    assert not any(line.get("level") == "error" and "fatal" in line.get("event", "") for line in _lines(proc))


def _ddl_records(schema: str) -> list[Rec]:
    return [
        Rec(0, *frame([{"ts": T0, "scm": schema, "t": 2}], [{"q": f"CREATE DATABASE `{schema}`", "t": 1}])),
        Rec(
            0,
            *frame(
                [{"ts": T0 + 1, "scm": schema, "tbl": "t", "t": 2}],
                [{"q": f"CREATE TABLE `{schema}`.`t` (id INT PRIMARY KEY)", "t": 3}],
            ),
        ),
        Rec(0, *frame([{"ts": T0 + 1, "t": 3}], [None])),  # resolved
    ]


def test_a_read_only_server_at_start_and_under_a_ddl_is_waited_out(server: PrivateMariaDB, broker) -> None:
    """Start-up on a read-only server: creating the checkpoint schema fails with 1290; the daemon
    waits (no exit, no restart loop) and starts once writes are allowed. Then a DDL arrives while
    the server is read-only again: its journal write fails the same way and it runs afterwards."""
    feed = _feed(server, broker, 1)
    _global(server, "read_only", 1)
    proc = feed.start("--http-listen", "off")
    try:
        line = wait_until(
            lambda: _logged(proc, event="transient downstream error, retrying the start-up"),
            60,
            "the start-up's read-only error",
            proc,
        )
        assert line["error_class"] == "read_only" and line["code"] == 1290, line
        time.sleep(REPORT_SECONDS + 1)
        assert proc.poll() is None and not _logged(proc, event="started")
        _global(server, "read_only", 0)
        wait_for_output(proc, "started", timeout=60)
        assert _logged(proc, event="downstream recovered: the start-up goes on after transient errors")

        _global(server, "read_only", 1)
        schema = feed.new_schema()
        produce_records(feed.bootstrap, feed.topic, _ddl_records(schema))  # type: ignore[arg-type]
        wait_until(
            lambda: _logged(proc, event="transient downstream error, replaying the transaction", code=1290),
            60,
            "the DDL's read-only error",
            proc,
        )
        time.sleep(2)
        assert proc.poll() is None and feed.applied_ddls() == 0
        _global(server, "read_only", 0)
        wait_until(lambda: feed.applied_ddls() == 2, 60, "both DDLs applied", proc)
    finally:
        stop(proc, signal.SIGTERM)
        _global(server, "read_only", 0)
        feed.drop()
    assert proc.returncode == 0, read_log(proc)


def _restart_in_background(server: PrivateMariaDB, *, crash: bool, down: float) -> threading.Thread:
    t = threading.Thread(target=server.restart, kwargs={"crash": crash, "down_seconds": down}, daemon=True)
    t.start()
    return t


def _lock(server: PrivateMariaDB, changefeed: str, poll: float) -> ActiveLock:
    cfg = parse_downstream_url(f"mysql://{USER}:{PASSWORD}@127.0.0.1:{server.port}/", env={})
    return ActiveLock(cfg, schema="ckpt", changefeed=changefeed, poll=poll, heartbeat=0.2, idle_timeout=5)


def test_the_lock_is_suspended_while_the_server_restarts_then_taken_again(server: PrivateMariaDB) -> None:
    """The lock's session dies with the server: while it is down nothing may commit (a transient
    error, the caller replays), and the lock is taken again once it is back. A standby that gets
    it first keeps it: the suspended holder has then lost it for good."""
    lock = _lock(server, f"cf-{uuid.uuid4().hex[:8]}", poll=0.5)
    try:
        assert lock.acquire(timeout=10)
        first = lock.connection_id
        restart = _restart_in_background(server, crash=True, down=2)
        with pytest.raises(LockSuspended) as raised:
            wait_until(lambda: lock.ensure_held() is not None, 5, "the lock to be suspended")
        assert is_transient(raised.value) and not lock.lost
        with pytest.raises(LockSuspended):
            lock.run_fenced(["SELECT 1"])
        restart.join(120)
        wait_until(lambda: lock.is_held() or None, 10, "the lock taken again")
        lock.ensure_held()
        conn = server.root()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT IS_USED_LOCK(%s)", (lock.name,))
                assert cur.fetchone()[0] == lock.connection_id != first
        finally:
            conn.close()
    finally:
        lock.release()

    name = f"cf-{uuid.uuid4().hex[:8]}"
    slow, standby = _lock(server, name, poll=8), _lock(server, name, poll=0.5)
    try:
        assert slow.acquire(timeout=10)
        restart = _restart_in_background(server, crash=False, down=1)
        wait_until(lambda: slow._suspended.is_set() or None, 5, "the lock to be suspended")
        assert standby.acquire(timeout=60)  # it asks every 0.5 s; the suspended holder every 8 s
        restart.join(120)
        wait_until(lambda: slow.lost or None, 15, "the suspended holder to find the lock taken")
        with pytest.raises(LockLost):
            slow.ensure_held()
        standby.ensure_held(check=True)
    finally:
        standby.release()
        slow.release()


RETAKEN = "single-active lock session failed; lock re-taken"
# A suspension is logged by the heartbeat, or by a DDL that was running on the lock's session
# when the server went away ("... during a DDL; the server does not answer").
SUSPENDED = (
    "single-active lock session failed and the server does not answer: nothing commits until the lock "
    "is re-taken",
    "single-active lock session failed during a DDL; the server does not answer",
)


def _count(proc, *events: str) -> int:
    return sum(1 for line in _lines(proc) if line.get("event") in events)


def test_database_restarts_mid_stream_are_ridden_out(feed: Changefeed, server: PrivateMariaDB) -> None:
    """The server crashes (SIGKILL) and later shuts down cleanly while windows and a DDL arrive:
    the daemon never exits, its lock is suspended and taken again each time, and the stream
    converges exactly (benchmarks/soak.py does this every ten minutes for half an hour)."""
    sim, rest, proc, _base = _start_mid_stream(feed, seed=23, mode="all-classic")
    try:
        produce_records(feed.bootstrap, feed.topic, rest)
        for n, crash in enumerate((True, False), 1):
            # Down longer than the lock's heartbeat (5 s): the lock session is found dead while
            # the server does not answer.
            server.restart(crash=crash, down_seconds=6)
            wait_until(lambda n=n: _count(proc, RETAKEN) >= n, 60, "the lock taken again", proc)
            assert proc.poll() is None, "the daemon exited on a database restart:\n" + read_log(proc)
        assert _count(proc, *SUSPENDED) == 2
        _converge(feed, proc, sim)
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)
    assert not any(line.get("level") == "error" and "fatal" in line.get("event", "") for line in _lines(proc))


def test_a_database_crash_while_an_index_builds_beside_the_stream_builds_it_once_after(
    feed: Changefeed, server: PrivateMariaDB
) -> None:
    """An index DDL waits on another session's metadata lock (applier.apply.online_ddl) while the
    other table's rows go on; the server crashes: the build and the lock are gone, the daemon rides
    the restart out, runs the DDL again from its ddl_online row and the index exists once."""
    db = feed.new_schema("online")
    script = Script(partitions=3)
    script.ddl(db, "", 1, f"CREATE DATABASE `{db}`")
    script.ddl(db, "big", 3, "CREATE TABLE big (a BIGINT PRIMARY KEY, b BIGINT)")
    script.ddl(db, "hot", 3, "CREATE TABLE hot (a BIGINT PRIMARY KEY, b BIGINT)")
    script.rows(db, "big", insert=[{"a": i, "b": i} for i in range(20)])
    script.produce(feed.bootstrap, feed.topic)
    proc = feed.start("--http-listen", "off")
    try:
        wait_until(lambda: online.table_rows(feed, db, "big") == 20, 60, "the first rows", proc)
        with online.holding(server.params, db, "big"):
            first = len(script.steps)
            script.ddl(db, "big", 7, online.ADD_I)
            script.rows(db, "hot", insert=[{"a": 1, "b": 1}])
            script.produce(feed.bootstrap, feed.topic, first)
            wait_until(lambda: online.table_rows(feed, db, "hot") == 1, 60, "hot's row after the DDL", proc)
            assert online.online_rows(feed) and online.indexes(feed, db, "big") == ["PRIMARY"]
            server.restart(crash=True, down_seconds=6)
        wait_until(lambda: not online.online_rows(feed), 90, "the DDL run again after the crash", proc)
        assert online.indexes(feed, db, "big") == ["PRIMARY", "ib"]
        more = len(script.steps)
        script.rows(db, "big", insert=[{"a": 100, "b": 100}])
        script.produce(feed.bootstrap, feed.topic, more)
        wait_until(lambda: online.table_rows(feed, db, "big") == 21, 60, "a row after the crash", proc)
    finally:
        stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, read_log(proc)
    log = read_log(proc)
    assert log.count("DDL applied beside the stream") == 1 and "beside the stream failed; retrying" in log
    assert not any(line.get("level") == "error" and "fatal" in line.get("event", "") for line in _lines(proc))


def test_a_window_too_large_for_the_binlog_cache_stops_with_the_setting_to_raise(
    feed: Changefeed, server: PrivateMariaDB
) -> None:
    """1197 is the same for every replay of the window: one line naming max_binlog_cache_size,
    exit 1, the checkpoint before the window; raised, the same stream applies exactly."""
    sim = simulate(StreamConfig(seed=5, partitions=3, transactions=300, schema=feed.new_schema()))
    produce_records(feed.bootstrap, feed.topic, sim.records)
    _global(server, "max_binlog_cache_size", 8192)  # sessions opened from now on
    done = feed.run_to_end("--http-listen", "off", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    fatal = [json.loads(x) for x in done.stderr.splitlines() + done.stdout.splitlines() if '"fatal: ' in x]
    assert len(fatal) == 1, done.stderr
    message = fatal[0]["event"]
    assert "does not fit the downstream's binary log cache (MySQL error 1197" in message, message
    assert "SET GLOBAL max_binlog_cache_size" in message and "lower max_txn_rows" in message, message
    assert "Traceback" not in done.stderr + done.stdout
    assert feed.checkpoint()[0] < sim.final_resolved_ts
    _global(server, "max_binlog_cache_size", 1 << 30)
    done = feed.run_to_end("--http-listen", "off", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []


FULL_TABLESPACE = "--innodb-data-file-path=ibdata1:24M"


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    """Every InnoDB table in one 24 MB data file that cannot grow; the undo logs apart."""
    shape = (FULL_TABLESPACE, "--innodb-file-per-table=0", "--innodb-undo-tablespaces=2")
    srv = start_plain_mariadb(tmp_path / "mariadb-full", *shape, install=shape)
    try:
        yield srv
    finally:
        srv.stop()


def _fill(server: PrivateMariaDB) -> int:
    """Fill the tablespace until InnoDB refuses (1114) even a small row: how many rows went in.

    Rows stored in their page (at most 4000 bytes), fewer and smaller ones once refused, so that
    what is left is what InnoDB keeps for itself: the next page any table needs is refused. A
    row's statement that hits the wall is then undone by removing records only. (MariaDB 10.11
    aborts when undoing a BLOB stored off-page into a full tablespace needs a page: "[FATAL]
    InnoDB: Error (Out of disk space) in rollback".)"""
    conn = server.root()
    n = 0
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE filler")
            cur.execute("CREATE TABLE filler.fill (id INT AUTO_INCREMENT PRIMARY KEY, b VARCHAR(4000))")
            for rows, size in ((50, 4000), (1, 4000), (1, 400), (1, 40)):
                values = ", ".join([f"(REPEAT('x', {size}))"] * rows)
                for _ in range(20_000 // rows):
                    try:
                        cur.execute(f"INSERT INTO filler.fill (b) VALUES {values}")
                    except pymysql.err.OperationalError as exc:
                        assert exc.args[0] == 1114, exc
                        break
                    n += rows
                else:
                    raise AssertionError("the tablespace never filled up")
    finally:
        conn.close()
    return n


def test_a_full_tablespace_is_ridden_out_until_space_is_added(small_server: PrivateMariaDB, broker) -> None:
    """The server cannot store more mid-stream (1114 on the daemon's rows): replayed with reports,
    no exit; the operator drops the table that filled it; exact result."""
    feed = _feed(small_server, broker, 3, user=False)
    sim, rest, proc, base = _start_mid_stream(feed, seed=23, mode="all-new")
    try:
        assert _fill(small_server) > 0
        produce_records(feed.bootstrap, feed.topic, rest)
        _check_reported(proc, base, 1114, "disk_full")
        assert proc.poll() is None and small_server.process.poll() is None
        assert feed.checkpoint()[0] < sim.final_resolved_ts
        conn = small_server.root()
        with conn.cursor() as cur:
            cur.execute("DROP TABLE filler.fill")
        conn.close()
        _converge(feed, proc, sim)
        assert total(scrape(base), "applier_downstream_retries_total") >= 1
    finally:
        stop(proc, signal.SIGTERM)
        feed.drop()
    assert proc.returncode == 0, read_log(proc)[-3000:]

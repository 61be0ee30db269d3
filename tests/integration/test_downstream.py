"""Downstream sessions, retry and the single-active lock against the real MariaDB."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pymysql
import pytest

from applier.apply.transaction import TransactionRunner
from applier.downstream.errors import DownstreamConnectError, DownstreamUnreachable
from applier.downstream.lock import ActiveLock, LockLost, LockWait
from applier.downstream.retry import Backoff, RetryInfo, run_with_retry
from applier.downstream.session import (
    DEFAULT_SQL_MODE,
    KEEPALIVE_IDLE,
    SessionRef,
    close_quietly,
    connect,
    end_session,
    session_ref,
)
from applier.downstream.url import ENV_PASSWORD, DownstreamConfig, Secret, parse_downstream_url

pytestmark = pytest.mark.integration

FAST = Backoff(initial=0.01, maximum=0.05)
SECRET = "s3cr3t-Do-Not-Print"


@pytest.fixture
def cfg(downstream_url: str) -> DownstreamConfig:
    return parse_downstream_url(downstream_url, env={})


@pytest.fixture
def admin(mariadb_params: dict) -> Iterator[pymysql.connections.Connection]:
    """A third, independent session used to KILL others and to look from outside."""
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    yield conn
    conn.close()


def scalar(conn: pymysql.connections.Connection, sql: str, args: tuple = ()) -> object:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchone()[0]


def kill(admin: pymysql.connections.Connection, connection_id: int) -> None:
    with admin.cursor() as cur:
        cur.execute(f"KILL {int(connection_id)}")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- session -------------------------------------------------------------------------------------


def test_session_settings(cfg: DownstreamConfig) -> None:
    conn = connect(cfg)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT @@autocommit, @@tx_isolation, @@foreign_key_checks, @@time_zone, @@sql_mode, "
                "@@character_set_client, @@character_set_connection, @@character_set_results"
            )
            row = cur.fetchone()
        assert row == (0, "READ-COMMITTED", 0, "+00:00", DEFAULT_SQL_MODE, "utf8mb4", "utf8mb4", "utf8mb4")
    finally:
        conn.close()


def test_session_time_zone_and_sql_mode_are_configurable(cfg: DownstreamConfig) -> None:
    conn = connect(cfg.with_options(time_zone="+08:00", sql_mode="NO_ENGINE_SUBSTITUTION"))
    try:
        assert scalar(conn, "SELECT @@time_zone") == "+08:00"
        assert scalar(conn, "SELECT @@sql_mode") == "NO_ENGINE_SUBSTITUTION"
    finally:
        conn.close()


def test_session_accepts_zero_and_invalid_dates_and_keeps_auto_increment_zero(
    cfg: DownstreamConfig, fresh_db: str
) -> None:
    conn = connect(cfg)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"CREATE TABLE `{fresh_db}`.t (id INT AUTO_INCREMENT PRIMARY KEY, d DATE, dt DATETIME(3), "
                "ts TIMESTAMP NULL)"
            )
            cur.execute(
                f"INSERT INTO `{fresh_db}`.t VALUES (%s, %s, %s, %s)",
                (0, "0000-00-00", "0000-00-00 00:00:00.000", "2020-01-01 08:00:00"),
            )
            cur.execute(f"INSERT INTO `{fresh_db}`.t (id, d) VALUES (%s, %s)", (5, "2020-02-30"))
            conn.commit()
            cur.execute(
                "SELECT id, CAST(d AS CHAR), CAST(dt AS CHAR), UNIX_TIMESTAMP(ts) "
                f"FROM `{fresh_db}`.t ORDER BY id"
            )
            rows = cur.fetchall()
        assert rows[0][:3] == (0, "0000-00-00", "0000-00-00 00:00:00.000")
        assert rows[0][3] == 1577865600  # interpreted in the session zone, +00:00
        assert rows[1][:2] == (5, "2020-02-30")
    finally:
        conn.close()


def test_unreachable_message_is_one_line_redacted_and_actionable() -> None:
    port = closed_port()
    cfg = DownstreamConfig(
        host="127.0.0.1", port=port, user="app", password=Secret(SECRET), connect_timeout=3
    )
    with pytest.raises(DownstreamUnreachable) as ei:
        connect(cfg)
    msg = str(ei.value)
    assert f"mysql://app:***@127.0.0.1:{port}/" in msg
    assert SECRET not in msg and SECRET not in repr(ei.value)
    assert "APPLIER_DOWNSTREAM" in msg and "--downstream" in msg
    assert "\n" not in msg
    assert ei.value.errno == 2003


def test_wrong_password_is_a_permanent_error_without_the_password(cfg: DownstreamConfig) -> None:
    bad = cfg.with_options(user="applier_no_such_user", password=Secret(SECRET))
    with pytest.raises(DownstreamConnectError) as ei:
        connect(bad)
    assert not isinstance(ei.value, DownstreamUnreachable)
    assert ei.value.errno in (1045, 1698)  # 1698 (no password accepted) when other test accounts exist
    assert SECRET not in str(ei.value) and "***" in str(ei.value) and "refused the login" in str(ei.value)


def test_unknown_time_zone_is_explained(cfg: DownstreamConfig) -> None:
    with pytest.raises(DownstreamConnectError, match=r"rejected time_zone 'Mars/Olympus'.*offset") as ei:
        connect(cfg.with_options(time_zone="Mars/Olympus"))
    assert ei.value.errno == 1298


def test_sessions_keep_tcp_alive_and_bound_unacknowledged_data(cfg: DownstreamConfig) -> None:
    """A peer that vanished without closing is noticed by the kernel within about a minute, even
    while the session waits for a long statement (docs/operations.md, "Network faults")."""
    conn = connect(cfg)
    try:
        sock = conn._sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) > 0
        assert conn._read_timeout == 300.0  # the default bound of every non-DDL statement
    finally:
        conn.close()


def listed(admin: pymysql.connections.Connection, session_id: int) -> bool:
    sql = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
    return bool(scalar(admin, sql, (session_id,)))


def _row_locked(admin: pymysql.connections.Connection, table: str) -> bool:
    """Whether another session holds the row lock on id 1 (a locking read that does not wait)."""
    admin.begin()
    try:
        with admin.cursor() as cur:
            cur.execute(f"SELECT * FROM {table} WHERE id = 1 FOR UPDATE NOWAIT")
        return False
    except pymysql.err.OperationalError as exc:
        assert exc.args[0] in (1205, 3572, 1213), exc
        return True
    finally:
        admin.rollback()


def test_end_session_ends_a_lost_session_and_its_transaction(
    cfg: DownstreamConfig, fresh_db: str, admin: pymysql.connections.Connection
) -> None:
    """The server keeps a session we lost contact with inside its transaction, row locks held:
    end_session kills it and returns once the server no longer lists it."""
    table = f"`{fresh_db}`.t"
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)")
        cur.execute(f"INSERT INTO {table} VALUES (1, 0)")
    lost = connect(cfg)
    ref = session_ref(lost)
    with lost.cursor() as cur:
        cur.execute(f"UPDATE {table} SET v = 1 WHERE id = 1")  # holds the row lock, uncommitted
    assert _row_locked(admin, table)
    other = connect(cfg)
    try:
        assert end_session(other, ref)
        assert (
            scalar(admin, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (ref.id,)) == 0
        )
        assert not _row_locked(admin, table)
        assert scalar(admin, f"SELECT v FROM {table} WHERE id = 1") == 0  # rolled back
        assert end_session(other, ref)  # already gone: nothing to do
        assert not other.get_autocommit() and scalar(other, "SELECT @@in_transaction") == 0
    finally:
        close_quietly(lost)
        other.close()


def test_end_session_never_kills_an_id_of_another_server_run(cfg: DownstreamConfig) -> None:
    """Ids restart with the server: a session of an earlier run of the server ended with it, and
    its id may now be someone else's. Nothing is killed then."""
    bystander = connect(cfg)
    other = connect(cfg)
    try:
        ref = session_ref(bystander)
        earlier = SessionRef(ref.id, ref.server_started - 3600)
        assert end_session(other, earlier)
        assert scalar(bystander, "SELECT 1") == 1  # still alive
    finally:
        bystander.close()
        other.close()


def test_a_reconnect_ends_the_previous_session_first(
    cfg: DownstreamConfig, fresh_db: str, admin: pymysql.connections.Connection
) -> None:
    """The transaction unit's new session ends the old one before the unit is replayed, so the
    replay never waits on the old session's row locks."""
    table = f"`{fresh_db}`.t"
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)")
        cur.execute(f"INSERT INTO {table} VALUES (1, 0)")
    runner = TransactionRunner(cfg, max_time=10)
    with runner.conn.cursor() as cur:
        cur.execute(f"UPDATE {table} SET v = 1 WHERE id = 1")
    old = runner.session
    assert old is not None
    runner._conn = None  # lost on our side only: the server keeps the session and its lock
    runner.reconnect()
    try:
        assert runner.session is not None and runner.session.id != old.id
        assert (
            scalar(admin, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (old.id,)) == 0
        )
        assert not _row_locked(admin, table)
    finally:
        runner.close()


# -- retry -----------------------------------------------------------------------------------------


class Session:
    """The caller's side of run_with_retry: one apply session, replaced on reconnect. It counts the
    reconnects and the attempts of its unit: how often a unit was replayed is what the tests check."""

    def __init__(self, cfg: DownstreamConfig) -> None:
        self.cfg = cfg
        self.conn = connect(cfg)
        self.reconnects = 0
        self.calls = 0

    def reconnect(self) -> None:
        close_quietly(self.conn)
        self.conn = connect(self.cfg)
        self.reconnects += 1

    def unit(self, body: Callable[[pymysql.cursors.Cursor, int], None]) -> Callable[[], None]:
        """The unit of work run_with_retry replays: ``body(cursor, attempt)`` (attempts count from 1)
        on the current session, then a commit."""

        def run() -> None:
            self.calls += 1
            with self.conn.cursor() as cur:
                body(cur, self.calls)
            self.conn.commit()

        return run


@pytest.mark.parametrize("kill_while", ["idle", "running"])
def test_retry_replays_the_unit_on_a_killed_session(
    cfg: DownstreamConfig, fresh_db: str, admin: pymysql.connections.Connection, kill_while: str
) -> None:
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_db}`.t (id INT PRIMARY KEY, v VARCHAR(10))")
    s = Session(cfg)

    def insert(cur: pymysql.cursors.Cursor, attempt: int) -> None:
        # A plain INSERT: it only succeeds on replay because the killed attempt was rolled back.
        cur.execute(f"INSERT INTO `{fresh_db}`.t VALUES (1, 'a'), (2, 'b')")
        if attempt == 1:
            cid = scalar(s.conn, "SELECT CONNECTION_ID()")
            if kill_while == "idle":
                kill(admin, cid)
                cur.execute(f"INSERT INTO `{fresh_db}`.t VALUES (3, 'c')")
            else:
                threading.Timer(0.3, kill, (admin, cid)).start()
                cur.execute("SELECT SLEEP(5)")
        else:
            cur.execute(f"INSERT INTO `{fresh_db}`.t VALUES (3, 'c')")

    seen: list[RetryInfo] = []
    started = time.monotonic()
    run_with_retry(s.unit(insert), reconnect=s.reconnect, backoff=FAST, max_attempts=3, on_retry=seen.append)
    assert time.monotonic() - started < 4
    assert s.calls == 2 and s.reconnects == 1
    assert len(seen) == 1 and isinstance(seen[0].error, pymysql.err.MySQLError)
    assert seen[0].error.args[0] in (2006, 2013, 1927)
    with admin.cursor() as cur:
        cur.execute(f"SELECT id, v FROM `{fresh_db}`.t ORDER BY id")
        assert cur.fetchall() == ((1, "a"), (2, "b"), (3, "c"))
    close_quietly(s.conn)


@pytest.mark.parametrize(
    ("sql", "code"),
    [("INSERT INTO `{db}`.t VALUES (1)", 1062), ("SELECT * FROM `{db}`.no_such_table", 1146)],
)
def test_retry_does_not_replay_permanent_errors(
    cfg: DownstreamConfig, fresh_db: str, admin: pymysql.connections.Connection, sql: str, code: int
) -> None:
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_db}`.t (id INT PRIMARY KEY)")
        cur.execute(f"INSERT INTO `{fresh_db}`.t VALUES (1)")
    s = Session(cfg)
    unit = s.unit(lambda cur, _attempt: cur.execute(sql.format(db=fresh_db)))
    with pytest.raises(pymysql.err.MySQLError) as ei:
        run_with_retry(unit, reconnect=s.reconnect, backoff=FAST, max_attempts=5)
    assert ei.value.args[0] == code
    assert s.calls == 1 and s.reconnects == 0
    close_quietly(s.conn)


def test_retry_rides_out_an_unreachable_server_until_the_budget_ends(cfg: DownstreamConfig) -> None:
    dead = cfg.with_options(port=closed_port(), connect_timeout=2)
    s = Session(cfg)
    s.cfg = dead  # every reconnect now fails with DownstreamUnreachable

    def lose_the_connection(cur: pymysql.cursors.Cursor, attempt: int) -> None:
        raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")

    with pytest.raises(DownstreamUnreachable):
        run_with_retry(s.unit(lose_the_connection), reconnect=s.reconnect, backoff=FAST, max_attempts=4)
    assert s.calls == 1  # the unit never ran again: there was no session to run it on


# -- single-active lock ----------------------------------------------------------------------------


def make_lock(cfg: DownstreamConfig, schema: str, changefeed: str = "cf", **kw: float) -> ActiveLock:
    kw.setdefault("poll", 0.5)
    kw.setdefault("heartbeat", 0.2)
    kw.setdefault("idle_timeout", 5)
    return ActiveLock(cfg, schema=schema, changefeed=changefeed, **kw)  # type: ignore[arg-type]


def acquire_in_thread(lock: ActiveLock) -> tuple[threading.Thread, dict]:
    result: dict = {"waits": []}

    def run() -> None:
        result["ok"] = lock.acquire(result["waits"].append, timeout=20)
        result["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


@pytest.fixture
def instances(cfg: DownstreamConfig, fresh_db: str) -> Iterator[tuple[ActiveLock, ActiveLock]]:
    """Two instances of one changefeed, (active, standby), contending for its lock: both let go of it
    after the test, whatever it left them holding."""
    active, standby = make_lock(cfg, fresh_db), make_lock(cfg, fresh_db)
    try:
        yield active, standby
    finally:
        standby.release()
        active.release()


def test_standby_waits_and_takes_over_when_the_holder_is_killed(
    instances: tuple[ActiveLock, ActiveLock], admin: pymysql.connections.Connection
) -> None:
    active, standby = instances
    assert active.acquire()
    holder = active.connection_id
    assert holder is not None and active.is_held()
    assert scalar(admin, "SELECT IS_USED_LOCK(%s)", (active.name,)) == holder

    waits: list[LockWait] = []
    assert standby.acquire(waits.append, timeout=1) is False
    assert waits and all(w.holder_connection_id == holder and w.error is None for w in waits)

    t, result = acquire_in_thread(standby)
    time.sleep(0.3)
    assert t.is_alive()  # still waiting
    killed_at = time.monotonic()
    kill(admin, holder)
    t.join(10)
    assert result["ok"] is True
    assert result["at"] - killed_at < 3
    assert standby.is_held()
    assert scalar(admin, "SELECT IS_USED_LOCK(%s)", (standby.name,)) == standby.connection_id

    # The killed instance finds out, and must stop.
    deadline = time.monotonic() + 3
    while not active.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active.lost  # noticed by the heartbeat, without anyone asking
    assert not active.is_held()
    with pytest.raises(LockLost):
        active.ensure_held()
    with pytest.raises(LockLost):
        active.acquire()


def test_standby_takes_over_when_the_holder_closes(instances: tuple[ActiveLock, ActiveLock]) -> None:
    active, standby = instances
    assert active.acquire()
    t, result = acquire_in_thread(standby)
    time.sleep(0.3)
    assert t.is_alive()
    released_at = time.monotonic()
    active.release()
    t.join(10)
    assert result["ok"] is True and result["at"] - released_at < 3
    standby.ensure_held(check=True)
    with pytest.raises(LockLost):
        active.ensure_held()  # released, not lost, but not held either


def test_standby_waits_out_its_own_lost_session(
    instances: tuple[ActiveLock, ActiveLock], admin: pymysql.connections.Connection
) -> None:
    active, standby = instances
    assert active.acquire()
    t, result = acquire_in_thread(standby)
    deadline = time.monotonic() + 5
    while not result["waits"] and time.monotonic() < deadline:
        time.sleep(0.05)
    standby_session = None
    while standby_session is None and time.monotonic() < deadline:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
                (f"SELECT GET_LOCK('{standby.name}'%",),
            )
            row = cur.fetchone()
        standby_session = row[0] if row else None
    kill(admin, standby_session)  # the standby's own lock session dies while waiting
    time.sleep(1.5)
    assert t.is_alive()
    active.release()
    t.join(10)
    assert result["ok"] is True
    assert any(w.error is not None for w in result["waits"])


def test_different_changefeeds_do_not_block_each_other(cfg: DownstreamConfig, fresh_db: str) -> None:
    a = make_lock(cfg, fresh_db, "feed-a")
    b = make_lock(cfg, fresh_db, "feed-b")
    long_name = make_lock(cfg, fresh_db, "Feed-" + "x" * 100)  # hashed name
    try:
        assert a.acquire(timeout=2) and b.acquire(timeout=2) and long_name.acquire(timeout=2)
        assert len({a.name, b.name, long_name.name}) == 3
        assert len(long_name.name) == 64
    finally:
        for lock in (a, b, long_name):
            lock.release()


def test_lock_session_idles_out_quickly_without_heartbeat(
    cfg: DownstreamConfig, fresh_db: str, admin: pymysql.connections.Connection
) -> None:
    """A holder that stops heart-beating (host gone) loses the lock after idle_timeout seconds."""
    holder = make_lock(cfg, fresh_db, heartbeat=0.4, idle_timeout=1)
    standby = make_lock(cfg, fresh_db)
    try:
        assert holder.acquire()
        holder._stop.set()  # simulate a frozen holder: no more heartbeats
        assert standby.acquire(timeout=8)
        assert not holder.is_held()
    finally:
        standby.release()
        holder.release()


def test_non_ascii_password_from_url_and_env(
    cfg: DownstreamConfig, admin: pymysql.connections.Connection
) -> None:
    user, password = f"applier_pw_{uuid.uuid4().hex[:8]}", "pä@ss:wörd/密码 😀"
    with admin.cursor() as cur:
        cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
    try:
        url = f"mysql://{user}:{quote(password, safe='')}@{cfg.host}:{cfg.port}/"
        for parsed in (
            parse_downstream_url(url, env={}),
            parse_downstream_url(f"mysql://{user}@{cfg.host}:{cfg.port}/", env={ENV_PASSWORD: password}),
        ):
            assert parsed.password.reveal() == password
            conn = connect(parsed)
            try:
                assert scalar(conn, "SELECT CURRENT_USER()").startswith(user + "@")
            finally:
                conn.close()
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP USER %s@'%%'", (user,))

"""Several statements a packet (applier.downstream.batch) against the real MariaDB: each statement
still answers for itself, and a window sent so reports the row the server refused and commits
nothing, its checkpoint included."""

from __future__ import annotations

import pymysql
import pytest

from applier.apply.window_applier import ApplyError, ApplySettings, WindowApplier
from applier.codec.events import Position, RowEvent, RowKind
from applier.downstream.batch import BatchFailed, execute_batch, multi_statements, packets
from applier.downstream.retry import Backoff
from applier.downstream.session import close_quietly, connect, session_ref
from applier.downstream.url import DownstreamConfig
from applier.stream.window import Window
from checkpoint import CheckpointStore, FencedOut
from sqlgen import MARIADB

pytestmark = pytest.mark.integration


@pytest.fixture(params=[True, False], ids=["multi", "one-a-packet"])
def session(request: pytest.FixtureRequest, fresh_db: str, downstream_url: str):
    conn = connect(DownstreamConfig.from_url(downstream_url), multi_statements=request.param)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_db}`.t (id INT PRIMARY KEY, v VARCHAR(64))")
    yield conn
    close_quietly(conn)


def _count(conn: pymysql.connections.Connection, db: str) -> int:
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM `{db}`.t")
        return int(cur.fetchone()[0])


def test_the_refused_statement_is_named_and_none_after_it_runs(session, fresh_db: str) -> None:
    texts = [
        f"INSERT INTO `{fresh_db}`.t VALUES (1, 'a')",
        "SELECT 42",
        f"INSERT INTO `{fresh_db}`.t VALUES (1, 'again')",  # duplicate key
        f"INSERT INTO `{fresh_db}`.t VALUES (2, 'never')",
    ]
    with session.cursor() as cur, pytest.raises(BatchFailed) as failed:
        execute_batch(cur, texts, fetch=[1])
    assert failed.value.index == 2 and failed.value.error.args[0] == 1062
    assert _count(session, fresh_db) == 1  # the first ran, in the open transaction; the last did not
    session.rollback()
    assert _count(session, fresh_db) == 0
    with session.cursor() as cur:  # the session goes on as usual
        assert execute_batch(cur, ["SELECT 1", "SELECT 'x', 2"], fetch=[0, 1]) == {0: ((1,),), 1: (("x", 2),)}


def test_statements_are_cut_into_packets_of_the_sessions_max_allowed_packet(session, fresh_db: str) -> None:
    texts = [f"INSERT INTO `{fresh_db}`.t VALUES ({i}, '{'x' * 60}')" for i in range(200)]
    texts.append(f"SELECT COUNT(*), SUM(id) FROM `{fresh_db}`.t")
    session.max_allowed_packet = 4096  # the client's view: a few dozen statements a packet
    assert len(list(packets(texts, 4096 - 1024))) > 5
    with session.cursor() as cur:
        rows = execute_batch(cur, texts, fetch=[200])
    assert rows == {200: ((200, sum(range(200))),)}


def test_sessions_take_several_statements_only_when_asked(downstream_url: str) -> None:
    cfg = DownstreamConfig.from_url(downstream_url)
    plain, multi = connect(cfg), connect(cfg, multi_statements=True)
    try:
        assert not multi_statements(plain) and multi_statements(multi)
        with plain.cursor() as cur, pytest.raises(pymysql.err.ProgrammingError):
            cur.execute("SELECT 1; SELECT 2")  # a statement smuggled after another is refused
        # The multi session read its id and server start while it was set up, in the same packet.
        assert session_ref(multi).id == multi.applier_session.id
        with multi.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID(), @@autocommit, @@time_zone, @@foreign_key_checks")
            assert cur.fetchone() == (session_ref(multi).id, 0, "+00:00", 0)
    finally:
        close_quietly(plain)
        close_quietly(multi)


def _row(schema: str, table: str, ts: int, pk: int, v: str) -> RowEvent:
    row = {"id": {"t": 3, "f": 0x01 | 0x02 | 0x08, "v": pk}, "v": {"t": 15, "f": 0x40, "v": v}}
    return RowEvent(ts, schema, table, RowKind.INSERT, row, None, None, Position("t", 0, ts, 0))


def _window(schema: str, rows: list[RowEvent], ts: int) -> Window:
    return Window(
        target_ts=ts,
        rows=rows,
        ddl=None,
        resume_offsets={0: ts},
        resolved={0: ts},
        tables=frozenset((r.schema, r.table) for r in rows),
        base_ts=0,
    )


@pytest.fixture
def applier_and_db(fresh_db: str, downstream_url: str, mariadb_params: dict):
    conn = pymysql.connect(**mariadb_params, database=fresh_db, autocommit=True)
    for table in ("a", "b", "c"):
        conn.query(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v VARCHAR(64))")
    store = CheckpointStore(f"{fresh_db}_ckpt", "cf")
    applier = WindowApplier(
        DownstreamConfig.from_url(downstream_url),
        store,
        ApplySettings(topic="t", dialect=MARIADB, owner="me"),
        backoff=Backoff(initial=0.01, maximum=0.01),
    )
    store.ensure_schema(applier.conn)
    store.claim(applier.conn, "me")
    try:
        yield applier, conn, store
    finally:
        applier.close()
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{fresh_db}_ckpt`")
        conn.close()


def _counts(conn: pymysql.connections.Connection, db: str) -> tuple[int, ...]:
    with conn.cursor() as cur:
        out = []
        for t in ("a", "b", "c"):
            cur.execute(f"SELECT COUNT(*) FROM `{db}`.`{t}`")
            out.append(int(cur.fetchone()[0]))
        cur.execute(f"SELECT COALESCE(MAX(resolved_ts), 0) FROM `{db}_ckpt`.changefeed")
        out.append(int(cur.fetchone()[0]))
        return tuple(out)


def test_a_window_in_one_packet_names_the_refused_row_and_commits_nothing(
    applier_and_db, fresh_db: str
) -> None:
    applier, conn, _store = applier_and_db
    applier.apply(_window(fresh_db, [_row(fresh_db, t, 100, 1, "ok") for t in ("a", "b", "c")], 100))
    assert _counts(conn, fresh_db) == (1, 1, 1, 100)
    with conn.cursor() as cur:  # b's statement, between a's and c's in the packet, is refused
        cur.execute(
            "CREATE TRIGGER b_refuses BEFORE INSERT ON b FOR EACH ROW "
            "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'b takes no rows'"
        )
    rows = [_row(fresh_db, t, 200, 2, "ok") for t in ("a", "b", "c")]
    with pytest.raises(ApplyError, match=r"refused REPLACE on .*\.b \(first key \(2,\).*b takes no rows"):
        applier.apply(_window(fresh_db, rows, 200))
    assert _counts(conn, fresh_db) == (1, 1, 1, 100)


def test_the_fence_read_in_the_windows_packet_still_stops_the_commit(applier_and_db, fresh_db: str) -> None:
    applier, conn, store = applier_and_db
    store.claim(conn, "another")  # another instance took the changefeed over
    with pytest.raises(FencedOut, match="another"):
        applier.apply(_window(fresh_db, [_row(fresh_db, "a", 300, 3, "late")], 300))
    assert _counts(conn, fresh_db) == (0, 0, 0, 0)

"""Worker sessions (``apply_workers``, applier.apply.workers) against the real server: who writes
what, a failing worker, and an instance that lost the changefeed."""

from __future__ import annotations

from collections.abc import Iterator

import pymysql
import pytest

from applier.apply.window_applier import ApplySettings, WindowApplier
from applier.codec.events import Position, RowEvent, RowKind
from applier.downstream.retry import Backoff
from applier.downstream.url import DownstreamConfig
from applier.stream.window import Window
from checkpoint import CheckpointStore, FencedOut
from sqlgen import MARIADB

pytestmark = pytest.mark.integration

KEYED = 6_000  # above workers.MIN_ROWS: the window is split
ID = {"t": 3, "f": 0x01 | 0x02 | 0x08}  # int, primary key, handle key


def _event(
    schema: str, table: str, kind: RowKind, new: dict | None, old: dict | None, ts: int = 100
) -> RowEvent:
    return RowEvent(ts, schema, table, kind, new, old, None, Position("t", 0, ts // 100 - 1, 0))


def _keyed(i: int, v: str) -> dict:
    return {"id": {**ID, "v": i}, "v": {"t": 15, "f": 0, "v": v}}


def _keyless(k: int) -> dict:
    return {"k": {"t": 3, "f": 0x40, "v": k}, "v": {"t": 15, "f": 0x40, "v": "same"}}


def _window(schema: str) -> Window:
    """Rows 1-3000 updated, 3001-4000 deleted, 5001-7000 inserted (6,000 keyed row events), and
    two identical keyless rows inserted: one upstream transaction at ts 100."""
    rows: list[RowEvent] = []
    for i in range(1, 3001):
        rows.append(_event(schema, "kv", RowKind.UPDATE, _keyed(i, "new"), _keyed(i, "old")))
    for i in range(3001, 4001):
        rows.append(_event(schema, "kv", RowKind.DELETE, None, _keyed(i, "old")))
    for i in range(5001, 7001):
        rows.append(_event(schema, "kv", RowKind.INSERT, _keyed(i, "new"), None))
    rows += [_event(schema, "keyless", RowKind.INSERT, _keyless(1), None)] * 2
    return Window(
        target_ts=100,
        rows=rows,
        ddl=None,
        resume_offsets={0: 1},
        resolved={0: 100},
        tables=frozenset({(schema, "kv"), (schema, "keyless")}),
        base_ts=0,
    )


@pytest.fixture
def setup(
    fresh_db: str, mariadb_params: dict
) -> Iterator[tuple[pymysql.connections.Connection, CheckpointStore]]:
    conn = pymysql.connect(**mariadb_params, database=fresh_db, autocommit=True)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE kv (id INT PRIMARY KEY, v VARCHAR(10) NOT NULL)")
        cur.execute("CREATE TABLE keyless (k INT NULL, v VARCHAR(10) NULL)")
        cur.execute("INSERT INTO kv SELECT seq, 'old' FROM seq_1_to_4000")
    store = CheckpointStore(f"{fresh_db}_ckpt", "cf")
    try:
        yield conn, store
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{fresh_db}_ckpt`")
        conn.close()


def _applier(downstream_url: str, store: CheckpointStore, owner: str | None = None) -> WindowApplier:
    applier = WindowApplier(
        DownstreamConfig.from_url(downstream_url),
        store,
        ApplySettings(topic="t", dialect=MARIADB, owner=owner, workers=2),
        backoff=Backoff(initial=0.01, maximum=0.01),
    )
    store.ensure_schema(applier.conn)  # connects: the window's SQL is bound ahead from now on
    return applier


def _state(conn: pymysql.connections.Connection, ckpt: str) -> tuple[int, int, int, int, int | None]:
    """kv rows, of them 'new', the highest id, keyless rows, the checkpoint's resolved ts."""
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*), SUM(v = 'new'), MAX(id) FROM kv")
        n, new, top = cur.fetchone()
        cur.execute("SELECT COUNT(*) FROM keyless")
        keyless = cur.fetchone()[0]
        cur.execute(f"SELECT MAX(resolved_ts) FROM `{ckpt}`.changefeed")
        return int(n), int(new or 0), int(top), int(keyless), cur.fetchone()[0]


def test_the_workers_write_the_keyed_rows_and_keyless_rows_stay_with_the_checkpoint(
    setup, fresh_db: str, downstream_url: str
) -> None:
    conn, store = setup
    applier = _applier(downstream_url, store)
    try:
        prepared = applier.prepare(_window(fresh_db))
        split = applier._workers.split(prepared.plan, prepared.statements, applier._router)  # type: ignore[union-attr]
        assert split is not None
        own, shares = split
        assert {prepared.statements[i].table for i in own} == {"keyless"}
        assert all(shares) and {prepared.statements[i].table for s in shares for i in s} == {"kv"}
        applier.apply(prepared)
        assert applier._workers_used == 2
        assert _state(conn, store.schema) == (5000, 5000, 7000, 2, 100)
    finally:
        applier.close()


def test_a_failing_worker_leaves_the_whole_window_to_its_own_session(
    setup, fresh_db: str, downstream_url: str
) -> None:
    conn, store = setup
    applier = _applier(downstream_url, store)
    workers = applier._workers
    assert workers is not None
    fence, failures = workers._fence, []

    def deadlocked_once(cur: pymysql.cursors.Cursor) -> None:
        if not failures:  # one worker's statements ran; it fails before its commit
            failures.append(True)
            raise pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
        fence(cur)

    workers._fence = deadlocked_once
    try:
        applier.apply(_window(fresh_db))
        assert failures and applier._workers_used == 0  # written on the window's own session
        assert _state(conn, store.schema) == (5000, 5000, 7000, 2, 100)  # the keyless rows once
        # The failed worker's session is replaced: the next large window is split again (two
        # REPLACE statements: 5,000 rows is the most one holds).
        new, again = RowKind.INSERT, RowKind.UPDATE
        rows = [
            _event(fresh_db, "kv", again, _keyed(i, "again"), _keyed(i, "new"), ts=200)
            for i in [*range(1, 3001), *range(5001, 7001)]
        ] + [_event(fresh_db, "kv", new, _keyed(i, "again"), None, ts=200) for i in range(7001, 8001)]
        window = Window(
            target_ts=200,
            rows=rows,
            ddl=None,
            resume_offsets={0: 2},
            resolved={0: 200},
            tables=frozenset({(fresh_db, "kv")}),
            base_ts=100,
        )
        applier.apply(window)
        assert applier._workers_used == 2
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM kv WHERE v = 'again'")
            assert cur.fetchone()[0] == 6000
    finally:
        applier.close()


def test_the_workers_of_an_instance_that_lost_the_changefeed_write_nothing(
    setup, fresh_db: str, downstream_url: str, mariadb_params: dict
) -> None:
    conn, store = setup
    applier = _applier(downstream_url, store, owner="first")
    store.claim(applier.conn, "first")
    other = pymysql.connect(**mariadb_params)
    try:
        store.claim(other, "second")  # another instance took over
        with pytest.raises(FencedOut):
            applier.apply(_window(fresh_db))
        assert _state(conn, store.schema) == (4000, 0, 4000, 0, 0)
    finally:
        other.close()
        applier.close()

"""Early writes (applier.apply.early) against the real server: the barrier, the applier and the
database as the daemon drives them, one step at a time.

What must hold: nothing written early is visible before its window commits; a window that holds
exactly the early rows commits them with the rest; any other (a late row, a DDL first, a lost
session) rolls them back and is written whole, and a DDL never waits for their row locks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pymysql
import pytest

from applier.apply.ddl import DDLExecutor
from applier.apply.window_applier import ApplySettings, WindowApplier
from applier.codec.events import RowEvent, RowKind
from applier.downstream.lock import ActiveLock
from applier.downstream.retry import Backoff
from applier.downstream.url import DownstreamConfig
from applier.stream.barrier import Barrier
from applier.stream.window import Window
from checkpoint import CheckpointStore
from sqlgen import MARIADB
from tests.builders import ddl_event, keyed_row, resolved_event
from tests.unit.test_stream_barrier import Feeds

pytestmark = pytest.mark.integration


class Rig:
    """A barrier over two partitions, an applier with early writes, and a session that reads."""

    def __init__(self, db: str, downstream_url: str, mariadb_params: dict) -> None:
        self.db = db
        cfg = DownstreamConfig.from_url(downstream_url)
        self.store = CheckpointStore(f"{db}_ck", "cf")
        self.reader = pymysql.connect(**mariadb_params, database=db, autocommit=True)
        with self.reader.cursor() as cur:
            cur.execute("CREATE TABLE k (id INT PRIMARY KEY, val VARCHAR(20) NULL)")
        self.lock = ActiveLock(cfg, schema=self.store.schema, changefeed="cf")
        assert self.lock.acquire()
        self.applier = WindowApplier(
            cfg,
            self.store,
            ApplySettings(topic="t", dialect=MARIADB, owner=self.lock.owner_token, early_rows=1),
            backoff=Backoff(initial=0.01, maximum=0.01),
            ddl_executor=DDLExecutor(self.store, MARIADB, self.lock, owner=self.lock.owner_token),
        )
        self.store.ensure_schema(self.applier.conn)
        self.store.claim(self.applier.conn, self.lock.owner_token)
        self.applier.conn.commit()
        self.barrier = Barrier([0, 1])
        self.feed = Feeds(self.barrier)

    def row(self, ts: int, key: int, value: str = "v", kind: RowKind = RowKind.INSERT) -> RowEvent:
        return replace(keyed_row(ts, key, value, kind=kind), schema=self.db)

    def write_early(self) -> Window | None:
        """What the daemon does while nothing can be released: one early piece, if there is one."""
        early = self.applier.early.open
        base = early.target_ts if early is not None else self.barrier.applied_ts
        piece = self.barrier.early_window(base, 1, 1000)
        if piece is not None:
            self.applier.write_early_async(piece).result()
        return piece

    def release(self) -> dict:
        """Apply every window the barrier releases; the row counts they wrote."""
        counts: dict = {}
        while (window := self.barrier.next_window(1000)) is not None:
            for key, n in self.applier.apply(self.applier.prepare(window)).items():
                counts[key] = counts.get(key, 0) + n
            self.barrier.mark_applied(window)
        return counts

    def table(self) -> list[tuple]:
        with self.reader.cursor() as cur:
            cur.execute("SELECT id, val FROM k ORDER BY id")
            return list(cur.fetchall())

    def close(self) -> None:
        self.applier.close()
        self.lock.release()
        with self.reader.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{self.store.schema}`")
        self.reader.close()


@pytest.fixture
def rig(fresh_db: str, downstream_url: str, mariadb_params: dict) -> Iterator[Rig]:
    r = Rig(fresh_db, downstream_url, mariadb_params)
    try:
        yield r
    finally:
        r.close()


def test_early_rows_are_invisible_until_their_window_commits_them(rig: Rig) -> None:
    f = rig.feed
    f(0, rig.row(10, 1, "a"), rig.row(20, 2, "b"), rig.row(30, 3, "c"))
    f(1, rig.row(15, 1, "a2", RowKind.UPDATE), rig.row(35, 4, "d"))
    first = rig.write_early()
    assert first is not None and first.target_ts == 29 and len(first.rows) == 3
    f(0, rig.row(40, 2, kind=RowKind.DELETE))
    second = rig.write_early()
    assert second is not None and (second.base_ts, second.target_ts) == (29, 34)
    assert rig.table() == []  # READ COMMITTED: nothing of it is visible yet
    f(0, resolved_event(38))
    f(1, resolved_event(38))
    counts = rig.release()
    assert rig.table() == [(1, "a2"), (2, "b"), (3, "c"), (4, "d")]
    assert rig.applier.early.used == 4
    assert counts == {(rig.db, "k", "replace"): 4}  # every piece's ops are counted with the window
    assert rig.barrier.applied_ts == 38 and rig.applier.early.open is None
    with rig.reader.cursor() as cur:
        cur.execute(f"SELECT resolved_ts FROM `{rig.store.schema}`.changefeed")
        assert cur.fetchone()[0] == 38


def test_a_row_arriving_after_its_piece_rolls_the_piece_back_and_the_window_is_written_whole(
    rig: Rig,
) -> None:
    f = rig.feed
    f(0, rig.row(10, 1, "a"), rig.row(30, 3, "c"))
    f(1, rig.row(15, 2, "b"), rig.row(35, 4, "d"))
    assert rig.write_early() is not None  # up to 29: rows 1 and 2
    f(1, rig.row(12, 1, "late", RowKind.UPDATE))  # a late first copy below the piece's target
    f(0, resolved_event(40))
    f(1, resolved_event(40))
    rig.release()
    assert rig.table() == [(1, "late"), (2, "b"), (3, "c"), (4, "d")]
    assert rig.applier.early.used == 0
    assert not rig.applier.early.allowed()  # paused for the next window after a miss


def test_early_rows_go_with_the_window_before_a_ddl_and_never_across_it(rig: Rig) -> None:
    f = rig.feed
    f(0, rig.row(10, 1, "a"), rig.row(20, 2, "b"), rig.row(30, 3, "c"))
    f(1, rig.row(15, 4, "d"), rig.row(25, 5, "e"))
    assert rig.write_early() is not None  # up to 24: rows 1, 4, 2
    alter = replace(ddl_event(26, "ALTER TABLE k ADD COLUMN c INT", "k", partition=0), schema=rig.db)
    for p in (0, 1):
        f(p, alter)
    assert rig.write_early() is None  # the DDL comes next: nothing at or above it is written early
    for p in (0, 1):
        f(p, resolved_event(40))
    before = rig.barrier.next_window(1000)
    assert before is not None and before.target_ts == 25
    rig.applier.apply(rig.applier.prepare(before))
    rig.barrier.mark_applied(before)
    assert rig.applier.early.used == 3
    assert rig.write_early() is None
    rig.release()  # the DDL (on the lock's session), then the row above it
    with rig.reader.cursor() as cur:
        cur.execute("SELECT id, val, c FROM k ORDER BY id")
        expected = [(1, "a", None), (2, "b", None), (3, "c", None), (4, "d", None), (5, "e", None)]
        assert list(cur.fetchall()) == expected


def test_a_ddl_window_rolls_back_early_rows_before_it_runs(rig: Rig) -> None:
    """Never built by the daemon (early rows stop below a pending DDL), but a DDL must never wait
    for the apply session's row locks: the applier rolls them back first whatever it is given."""
    f = rig.feed
    f(0, rig.row(10, 1, "a"), rig.row(20, 2, "b"))
    f(1, rig.row(15, 4, "d"), rig.row(25, 5, "e"))
    assert rig.write_early() is not None
    alter = replace(ddl_event(5, "ALTER TABLE k ADD COLUMN c INT", "k", partition=0), schema=rig.db)
    ddl = Window(4, [], alter, {0: None, 1: None}, {}, frozenset({(rig.db, "k")}), base_ts=0)
    rig.applier.apply(ddl)  # would wait for the metadata lock (and time out) with the rows open
    assert rig.applier.early.open is None
    assert rig.table() == []


def test_a_lost_session_loses_the_early_rows_and_the_window_is_written_whole(
    rig: Rig, mariadb_params: dict
) -> None:
    f = rig.feed
    f(0, rig.row(10, 1, "a"), rig.row(30, 3, "c"))
    f(1, rig.row(15, 2, "b"), rig.row(35, 4, "d"))
    assert rig.write_early() is not None
    with rig.reader.cursor() as cur:
        cur.execute(f"KILL CONNECTION {rig.applier._connection_id}")
    f(0, resolved_event(40))
    f(1, resolved_event(40))
    rig.release()  # the early path fails on the dead session; the replay writes the window whole
    assert rig.table() == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert rig.applier.early.used == 0

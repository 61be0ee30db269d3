"""A connection lost during COMMIT after the server committed: the window must not be applied twice.

Keyless INSERTs are not idempotent, so replaying a transaction that did land would duplicate
rows. The applier asks the checkpoint (written in the same transaction) before replaying.
"""

from __future__ import annotations

import pymysql
import pytest

from applier.apply.window_applier import ApplySettings, WindowApplier
from applier.codec.events import Position, RowEvent, RowKind
from applier.downstream.retry import Backoff
from applier.downstream.url import DownstreamConfig
from applier.stream.window import Window
from checkpoint import CheckpointStore
from sqlgen import MARIADB

pytestmark = pytest.mark.integration


def _insert(schema: str, ts: int, k: int) -> RowEvent:
    row = {"k": {"t": 3, "f": 0x40, "v": k}, "v": {"t": 15, "f": 0x40, "v": "same"}}
    return RowEvent(ts, schema, "keyless", RowKind.INSERT, row, None, None, Position("t", 0, 0, 0))


def test_commit_that_landed_is_not_replayed(fresh_db: str, downstream_url: str, mariadb_params: dict) -> None:
    conn = pymysql.connect(**mariadb_params, database=fresh_db, autocommit=True)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE keyless (k INT NULL, v VARCHAR(10) NULL)")
    store = CheckpointStore(f"{fresh_db}_ckpt", "cf")
    applier = WindowApplier(
        DownstreamConfig.from_url(downstream_url),
        store,
        ApplySettings(topic="t", dialect=MARIADB),
        backoff=Backoff(initial=0.01, maximum=0.01),
    )
    store.ensure_schema(applier.conn)
    real_commit = applier.conn.commit
    lost = []

    def commit_then_lose_the_connection() -> None:
        real_commit()  # the server has committed ...
        if not lost:
            lost.append(True)
            raise pymysql.err.OperationalError(
                2013, "Lost connection to server during query"
            )  # ... the client never hears

    applier.conn.commit = commit_then_lose_the_connection  # type: ignore[method-assign]
    rows = [_insert(fresh_db, 100, 1), _insert(fresh_db, 100, 1)]  # two identical keyless rows
    window = Window(
        target_ts=100,
        rows=rows,
        ddl=None,
        resume_offsets={0: 1},
        resolved={0: 100},
        tables=frozenset({(fresh_db, "keyless")}),
        base_ts=0,
    )
    try:
        applier.apply(window)
        assert lost, "the simulated loss did not happen"
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM keyless")
            assert cur.fetchone()[0] == 2
            cur.execute(f"SELECT resolved_ts FROM `{fresh_db}_ckpt`.changefeed")
            assert cur.fetchone()[0] == 100
    finally:
        applier.close()
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{fresh_db}_ckpt`")
        conn.close()

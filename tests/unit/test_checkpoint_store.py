"""How the checkpoint store cuts its multi-row upserts (no database)."""

from __future__ import annotations

import pymysql

from checkpoint.store import _STATEMENT_BYTES, _chunks


def test_checkpoint_upserts_are_cut_by_rows_and_by_size() -> None:
    short = [("cf", "db", f"t{i}", i) for i in range(1200)]
    assert [len(c) for c in _chunks(short)] == [500, 500, 200]
    # thousands of tables with 255-character names in a 4-byte script: cut by size, bound below the cap
    long = [("c" * 255, "表" * 255, "😀" * 254 + str(i % 10), i) for i in range(1000)]
    chunks = list(_chunks(long))
    assert sum(len(c) for c in chunks) == 1000 and len(chunks) > 2
    conn = pymysql.connections.Connection(defer_connect=True, charset="utf8mb4")
    conn.server_status = 0
    cur = conn.cursor()
    row_sql = "(%s, %s, %s, %s, UTC_TIMESTAMP(6))"
    for chunk in chunks:
        bound = cur.mogrify(", ".join([row_sql] * len(chunk)), [v for r in chunk for v in r])
        assert len(bound.encode()) <= _STATEMENT_BYTES

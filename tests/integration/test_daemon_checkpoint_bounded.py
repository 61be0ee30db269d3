"""The checkpoint tables stay bounded under a stream of DDLs, and pruning them loses nothing.

A stream creates a table, writes to it and drops the previous one, 55 times (111 DDLs, more than
the ``applied_ddl`` history kept). The daemon is killed at random points of it, lands in the middle
of DDLs too (their records are settled by the restart, and pruned there as well), and after the
last restart the producer replays the whole stream from its start, as TiCDC does from an old
checkpoint: every DDL arrives again, most of them with their records long pruned. The downstream
must hold exactly the stream's final state (no dropped table created again, no row twice or
missing) and the checkpoint tables what README.md's "The checkpoint tables" says remains.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from applier.kafka.embedded_broker import create_topic
from checkpoint.store import DDL_HISTORY
from tests.integration.ddl_script import Script, snapshot
from tests.integration.harness import Changefeed, kill_loop

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CYCLES = 55


def _stream(s: Script, db: str) -> dict[str, list[tuple[int, int]]]:
    """The steps of the stream; the rows each table holds at its end."""
    s.ddl(db, "", 1, f"CREATE DATABASE `{db}`")
    s.ddl(db, "keep", 3, "CREATE TABLE keep (a BIGINT PRIMARY KEY, b BIGINT)")
    keep: dict[int, int] = {}
    for i in range(1, CYCLES + 1):
        s.ddl(db, f"t{i}", 3, f"CREATE TABLE t{i} (a BIGINT PRIMARY KEY, b BIGINT)")
        s.rows(db, f"t{i}", insert=[{"a": i, "b": i * 10}, {"a": i + 1, "b": 0}])
        if i % 3 and keep:
            a = min(keep)
            s.rows(db, "keep", update=[({"a": a, "b": keep[a]}, {"a": a, "b": keep[a] + 1})])
            keep[a] += 1
        s.rows(db, "keep", insert=[{"a": i, "b": i}])
        keep[i] = i
        if i % 5 == 0:
            s.rows(db, "keep", delete=[{"a": i - 1, "b": keep.pop(i - 1)}])
        if i > 1:
            s.ddl(db, f"t{i - 1}", 4, f"DROP TABLE `t{i - 1}`")
    return {"keep": sorted(keep.items()), f"t{CYCLES}": [(CYCLES, CYCLES * 10), (CYCLES + 1, 0)]}


def _checkpoint_rows(feed: Changefeed) -> dict[str, list[tuple]]:
    conn = feed.connect()
    q = f"`{feed.checkpoint_schema}`"
    try:
        with conn.cursor() as cur:
            out = {}
            for table, columns in (
                ("table_checkpoint", "schema_name, table_name"),
                ("partition_offset", "topic, partition_id"),
                ("applied_ddl", "commit_ts"),
                ("ddl_journal", "commit_ts"),
            ):
                cur.execute(
                    f"SELECT {columns} FROM {q}.{table} WHERE changefeed = %s ORDER BY {columns}",
                    (feed.group_id,),
                )
                out[table] = list(cur.fetchall())
            return out
    finally:
        conn.close()


def test_kills_and_a_full_replay_over_pruned_checkpoint_tables_converge_exactly(
    feed: Changefeed, tmp_path
) -> None:
    db = feed.new_schema("bounded")
    script = Script(partitions=2)
    expected = _stream(script, db)
    ddls = sum(1 for step in script.steps if b'"t": 2}' in step[0].key)
    assert ddls > DDL_HISTORY + 10
    create_topic(feed.bootstrap, feed.topic, 2)
    script.produce(feed.bootstrap, feed.topic)

    log_path = str(tmp_path / "daemon.log")
    kill_loop(feed, log_path, random.Random(5), runs=4, delay=(0.3, 2.0))
    script.produce(feed.bootstrap, feed.topic)  # the whole stream once more: every DDL replayed
    done = feed.run_to_end(timeout=180)
    log = Path(log_path).read_text(errors="replace") + done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "DDL effect already present downstream" not in log  # no DDL ran twice

    conn = feed.connect()
    try:
        state = snapshot(conn, [db])[db]
    finally:
        conn.close()
    assert {name: rows for name, (_create, rows) in state.items()} == expected

    rows = _checkpoint_rows(feed)
    assert rows["table_checkpoint"] == [(db, "keep"), (db, f"t{CYCLES}")]  # the dropped tables' rows left
    assert rows["partition_offset"] == [(feed.topic, 0), (feed.topic, 1)]
    assert rows["ddl_journal"] == []
    resolved, _ = feed.checkpoint()
    assert len(rows["applied_ddl"]) == DDL_HISTORY  # the last DDL's too: the stream ends with rows
    assert all(ts <= resolved for (ts,) in rows["applied_ddl"])

"""A DDL event whose text is not the DDL it claims to be stops the daemon before anything runs.

Whoever can write to the topic must not get the daemon's database privileges: a "create table"
event whose text is a GRANT, a "drop table" event keyed to the changefeed's table that drops
another schema's table or the checkpoint, a second statement after ``;`` (docs/open-protocol.md
§8.2). Each is produced after good rows; the daemon applies those, then exits 1 with one line
naming the record's topic, partition and offset, and nothing outside the changefeed changes.
"""

from __future__ import annotations

import pytest

from applier.kafka.embedded_broker import create_topic
from tests.integration.harness import Changefeed
from tests.integration.test_daemon_inputs import Rec, frame, send

pytestmark = pytest.mark.integration

TS = 450000000000000000

# (id, DDL type, key table, query template: {canary} and {ckpt} are schema names)
HOSTILE = [
    ("grant", 3, "t2", "GRANT ALL ON *.* TO 'hostile_user'@'%' IDENTIFIED BY 'x'"),
    ("create-user", 3, "t2", "CREATE USER 'hostile_user'@'%'"),
    ("drop-other-schema", 4, "t", "DROP TABLE `{canary}`.`canary`"),
    ("drop-checkpoint", 4, "t", "DROP TABLE `{ckpt}`.`changefeed`"),
    ("second-statement", 3, "t2", "CREATE TABLE t2 (a INT); DROP DATABASE `{canary}`"),
    ("alter-checkpoint", 5, "t", "ALTER TABLE `{ckpt}`.`changefeed` ADD COLUMN x INT"),
]


def _count(feed: Changefeed, sql: str) -> int:
    conn = feed.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("ddl_type", "table", "template"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_ddl_event_stops_the_daemon_and_touches_nothing(
    feed: Changefeed, ddl_downstream_url: str, ddl_type: int, table: str, template: str
) -> None:
    feed.downstream = ddl_downstream_url  # as root (what proves the guard) and as the least-privilege user
    schema = feed.new_schema("hostile")
    canary = feed.new_schema("hostile_canary")
    conn = feed.connect()
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{canary}`")
        cur.execute(f"CREATE TABLE `{canary}`.canary (a INT PRIMARY KEY)")
        cur.execute(f"INSERT INTO `{canary}`.canary VALUES (1), (2), (3)")
    conn.close()

    def row(ts: int, a: int) -> tuple[dict, dict]:
        return {"ts": ts, "scm": schema, "tbl": "t", "t": 1}, {
            "u": {"a": {"t": 3, "f": 11, "h": True, "v": a}}
        }

    good = [
        Rec(0, *frame([{"ts": TS, "scm": schema, "t": 2}], [{"q": f"CREATE DATABASE `{schema}`", "t": 1}])),
        Rec(
            0,
            *frame(
                [{"ts": TS + 1, "scm": schema, "tbl": "t", "t": 2}],
                [{"q": "CREATE TABLE t (a INT PRIMARY KEY)", "t": 3}],
            ),
        ),
        Rec(0, *frame(*map(list, zip(row(TS + 10, 1), row(TS + 10, 2), strict=True)))),
        Rec(0, *frame([{"ts": TS + 11, "t": 3}], [None])),
    ]
    query = template.format(canary=canary, ckpt=feed.checkpoint_schema)
    hostile = Rec(
        0, *frame([{"ts": TS + 20, "scm": schema, "tbl": table, "t": 2}], [{"q": query, "t": ddl_type}])
    )
    after = [
        Rec(0, *frame(*map(list, zip(row(TS + 30, 3), strict=True)))),
        Rec(0, *frame([{"ts": TS + 31, "t": 3}], [None])),
    ]
    create_topic(feed.bootstrap, feed.topic, 1)
    send(feed, [*good, hostile, *after])

    done = feed.run_to_end(timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    lines = [ln for ln in out.splitlines() if "DDL text does not match its event" in ln]
    assert len(lines) == 1, out
    assert f"topic '{feed.topic}' partition 0 offset {len(good)}" in lines[0], lines[0]

    assert _count(feed, f"SELECT COUNT(*) FROM `{schema}`.t") == 2  # the rows before it, not after
    assert _count(feed, f"SELECT COUNT(*) FROM `{canary}`.canary") == 3
    # The account the hostile texts name (not the number of accounts: tests beside this one make theirs).
    assert _count(feed, "SELECT COUNT(*) FROM mysql.user WHERE user = 'hostile_user'") == 0
    assert (
        _count(feed, f"SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{schema}'") == 1
    )
    assert (
        _count(
            feed,
            "SELECT COUNT(*) FROM information_schema.columns "
            f"WHERE table_schema = '{feed.checkpoint_schema}' AND table_name = 'changefeed' "
            "AND column_name = 'x'",
        )
        == 0
    )
    applied, offsets = feed.checkpoint()
    assert applied == TS + 11
    assert offsets[0] <= len(good)

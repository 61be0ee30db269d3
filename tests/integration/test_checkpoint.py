"""The checkpoint store against the real MariaDB."""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from applier.downstream.session import connect
from applier.downstream.url import DownstreamConfig, parse_downstream_url
from applier.stream.progress import SharedProgress
from checkpoint import (
    ROW_HOLD_OPEN,
    SCHEMA_VERSION,
    Checkpoint,
    CheckpointSchemaError,
    CheckpointStore,
    FencedOut,
    ddl_digest,
    ensure_schema,
    status_report,
)

pytestmark = pytest.mark.integration

U64 = (1 << 64) - 1
HOSTILE = [
    ("db`; DROP TABLE x; --", "t'\"\\%_"),
    ("ünïcödé", "表格😀"),
    ("nul\x00inside", "tab\tnew\nline"),
    ("trailing", "t"),
    ("trailing", "t "),  # distinct from "t": needs a NO PAD collation
    ("Case", "T"),
    ("case", "t"),
    ("l" * 255, "😀" * 255),  # longest allowed, 4-byte characters
    ("", "schema-less"),
]


@pytest.fixture
def cfg(downstream_url: str) -> DownstreamConfig:
    return parse_downstream_url(downstream_url, env={})


@pytest.fixture
def conn(cfg: DownstreamConfig) -> Iterator[pymysql.connections.Connection]:
    """An applier session (autocommit off, READ COMMITTED, permissive sql_mode)."""
    c = connect(cfg)
    yield c
    c.close()


@pytest.fixture
def store(conn: pymysql.connections.Connection, fresh_db: str) -> CheckpointStore:
    s = CheckpointStore(fresh_db, "group-1")
    s.ensure_schema(conn)
    return s


def write(store: CheckpointStore, conn, **kw) -> None:
    kw.setdefault("topic", "cdc")
    kw.setdefault("resolved_ts", 0)
    kw.setdefault("tables", {})
    kw.setdefault("offsets", {})
    kw.setdefault("partition_resolved", {})
    with conn.cursor() as cur:
        store.write(cur, **kw)
    conn.commit()


# -- schema ----------------------------------------------------------------------------------------


def test_ensure_schema_creates_database_and_is_idempotent(conn, mariadb_params: dict) -> None:
    schema = f"applier_ckpt_{uuid.uuid4().hex[:10]}"
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        assert ensure_schema(conn, schema) == SCHEMA_VERSION
        store = CheckpointStore(schema, "cf")
        write(store, conn, resolved_ts=42)
        assert ensure_schema(conn, schema) == SCHEMA_VERSION  # second run: no error, data kept
        store.ensure_schema(conn)
        assert store.load(conn).resolved_ts == 42
        with admin.cursor() as cur:
            cur.execute(
                "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY 1",
                (schema,),
            )
            assert cur.fetchall() == (
                ("applied_ddl", "InnoDB"),
                ("changefeed", "InnoDB"),
                ("ddl_journal", "InnoDB"),
                ("ddl_online", "InnoDB"),
                ("partition_applied", "InnoDB"),
                ("partition_offset", "InnoDB"),
                ("row_hold", "InnoDB"),
                ("schema_version", "InnoDB"),
                ("table_checkpoint", "InnoDB"),
            )
            cur.execute(f"SELECT id, version FROM `{schema}`.schema_version")
            assert cur.fetchall() == ((1, SCHEMA_VERSION),)
            cur.execute(
                "SELECT DISTINCT COLLATION_NAME FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = %s AND COLUMN_NAME IN ('changefeed', 'schema_name', 'table_name')",
                (schema,),
            )
            assert cur.fetchall() == (("utf8mb4_nopad_bin",),)
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
        admin.close()


def test_newer_layout_is_refused(conn, store: CheckpointStore) -> None:
    with conn.cursor() as cur:
        cur.execute(f"UPDATE `{store.schema}`.schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    conn.commit()
    with pytest.raises(CheckpointSchemaError, match="newer than this applier"):
        store.ensure_schema(conn)


def test_a_version_1_layout_gains_the_ddl_journal_the_online_ddls_and_partition_applied(
    conn, store: CheckpointStore
) -> None:
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE `{store.schema}`.ddl_journal")
        cur.execute(f"DROP TABLE `{store.schema}`.ddl_online")
        cur.execute(f"DROP TABLE `{store.schema}`.partition_applied")
        cur.execute(f"DROP TABLE `{store.schema}`.row_hold")
        cur.execute(f"UPDATE `{store.schema}`.schema_version SET version = 1")
    conn.commit()
    assert ensure_schema(conn, store.schema) == SCHEMA_VERSION == 4
    with conn.cursor() as cur:
        assert store.pending_ddl(cur) is None
        assert store.online_ddls(cur) == []
        assert store.committed_partition_ts(cur, "cdc", 0) == 0
    conn.commit()


def test_row_mode_partitions_write_their_own_rows_only(conn, store: CheckpointStore, mariadb_params) -> None:
    """A partition's progress (shared fence, its offset and applied ts) leaves the changefeed row
    alone, so two partitions' transactions never wait for each other; load reads them back."""
    store.claim(conn, "me")
    write(store, conn, resolved_ts=5, owner="me")
    other = pymysql.connect(**mariadb_params)
    try:
        with conn.cursor() as cur, other.cursor() as cur2:
            store.write(cur, **progress(offsets={0: 11}, partition_applied={0: 30}, shared=True, owner="me"))
            # Open beside the first: with an exclusive fence this one would wait for the lock.
            store.write(cur2, **progress(offsets={1: 21}, partition_applied={1: 20}, shared=True, owner="me"))
        conn.commit()
        other.commit()
    finally:
        other.close()
    ckpt = store.load(conn)
    assert ckpt.resolved_ts == 5  # the changefeed row was not written by the partitions
    # ``applier status``: what every partition is applied up to, the lowest partition's.
    assert status_report(conn, store.schema, store.changefeed)["resolved_ts"] == 20
    assert ckpt.offsets == {0: 11, 1: 21}
    assert ckpt.partition_applied == {("cdc", 0): 30, ("cdc", 1): 20}
    with conn.cursor() as cur:
        assert store.committed_partition_ts(cur, "cdc", 0) == 30
    conn.commit()
    # The joint release is kept by the apply session's writes: open, then until a ts, then ended.
    for hold, loaded in ((ROW_HOLD_OPEN, ROW_HOLD_OPEN), (40, 40), (None, None)):
        write(store, conn, resolved_ts=6, owner="me", row_hold=hold)
        assert store.load(conn).row_hold == loaded
    write(store, conn, resolved_ts=6, owner="me", row_hold=ROW_HOLD_OPEN)
    with conn.cursor() as cur:
        store.forget_partition_applied(cur)
    conn.commit()
    ckpt = store.load(conn)
    assert ckpt.partition_applied == {} and ckpt.row_hold is None


def progress(**kw) -> dict:
    kw.setdefault("topic", "cdc")
    kw.setdefault("resolved_ts", 0)
    kw.setdefault("tables", {})
    kw.setdefault("offsets", {})
    kw.setdefault("partition_resolved", {})
    return kw


def test_online_ddls_are_journaled_one_row_each_until_they_end(conn, store: CheckpointStore) -> None:
    add = {"commit_ts": 20, "schema": "db", "table": "t", "ddl_type": 7, "query": "CREATE INDEX i ON t (a)"}
    drop = {**add, "commit_ts": 10, "ddl_type": 8, "query": "DROP INDEX j ON t"}
    with conn.cursor() as cur:
        store.begin_online_ddl(cur, catalogue="{}", **add)
        store.begin_online_ddl(cur, catalogue="{}", **drop)
        store.begin_online_ddl(cur, catalogue="{}", **drop)  # a replay of its recording: one row
    conn.commit()
    with conn.cursor() as cur:
        listed = [(e.commit_ts, e.query) for e in store.online_ddls(cur)]
        assert listed == [(10, drop["query"]), (20, add["query"])]
        store.end_online_ddl(cur, 10, drop["query"])
        assert [e.commit_ts for e in store.online_ddls(cur)] == [20]
    conn.commit()


def test_schema_name_is_quoted(conn, mariadb_params: dict) -> None:
    schema = f"ck`pt {uuid.uuid4().hex[:6]}"
    try:
        store = CheckpointStore(schema, "cf")
        store.ensure_schema(conn)
        write(store, conn, resolved_ts=7)
        assert store.load(conn).resolved_ts == 7
    finally:
        with conn.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS `" + schema.replace("`", "``") + "`")


# -- round trips -----------------------------------------------------------------------------------


def test_new_changefeed_loads_empty(conn, store: CheckpointStore) -> None:
    ckpt = store.load(conn)
    assert ckpt == Checkpoint()
    assert ckpt.table_ts("s", "t") == 0


def test_round_trip_with_hostile_names_and_extreme_values(conn, store: CheckpointStore) -> None:
    tables = {name: U64 - i for i, name in enumerate(HOSTILE)}
    offsets = {0: 0, 1: (1 << 63) - 1, (1 << 31) - 1: 12345}
    presolved = {0: U64, 1: 1, (1 << 31) - 1: 0}
    write(
        store,
        conn,
        topic="tópic.😀",
        resolved_ts=U64,
        tables=tables,
        offsets=offsets,
        partition_resolved=presolved,
    )
    ckpt = store.load(conn)
    assert ckpt.resolved_ts == U64
    assert ckpt.topic == "tópic.😀"
    assert ckpt.tables == tables
    assert ckpt.offsets == offsets
    assert ckpt.partition_resolved == presolved


def test_values_never_move_backwards(conn, store: CheckpointStore) -> None:
    write(
        store, conn, resolved_ts=100, tables={("s", "a"): 150}, offsets={0: 10}, partition_resolved={0: 120}
    )
    write(
        store,
        conn,
        resolved_ts=90,
        tables={("s", "a"): 10, ("s", "b"): 5},
        offsets={0: 3},
        partition_resolved={0: 1},
    )
    ckpt = store.load(conn)
    assert (ckpt.resolved_ts, ckpt.offsets, ckpt.partition_resolved) == (100, {0: 10}, {0: 120})
    assert ckpt.tables == {("s", "a"): 150, ("s", "b"): 5}
    assert (
        ckpt.table_ts("s", "a") == 150 and ckpt.table_ts("s", "b") == 100 and ckpt.table_ts("x", "y") == 100
    )
    write(
        store,
        conn,
        resolved_ts=200,
        tables={("s", "a"): 210},
        offsets={0: 11, 1: 4},
        partition_resolved={1: 9},
    )
    ckpt = store.load(conn)
    assert (ckpt.resolved_ts, ckpt.tables[("s", "a")], ckpt.offsets, ckpt.partition_resolved) == (
        200,
        210,
        {0: 11, 1: 4},
        {0: 120, 1: 9},
    )


def test_write_in_a_rolled_back_transaction_leaves_nothing(conn, store: CheckpointStore) -> None:
    with conn.cursor() as cur:
        store.write(
            cur, topic="cdc", resolved_ts=5, tables={("s", "t"): 6}, offsets={0: 7}, partition_resolved={0: 5}
        )
        store.record_ddl(cur, commit_ts=5, schema="s", table="t", ddl_type=3, query="CREATE TABLE t (a INT)")
    conn.rollback()
    assert store.load(conn) == Checkpoint()
    # ...and once written, a rolled-back later write leaves the earlier state.
    write(store, conn, resolved_ts=5, tables={("s", "t"): 6}, offsets={0: 7})
    with conn.cursor() as cur:
        store.write(
            cur, topic="cdc", resolved_ts=50, tables={("s", "t"): 60}, offsets={0: 70}, partition_resolved={}
        )
    conn.rollback()
    ckpt = store.load(conn)
    assert (ckpt.resolved_ts, ckpt.tables, ckpt.offsets) == (5, {("s", "t"): 6}, {0: 7})


def test_checkpoint_commits_atomically_with_data_rows(conn, store: CheckpointStore, fresh_db: str) -> None:
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_db}`.data (id INT PRIMARY KEY)")  # DDL: commits by itself
        cur.execute(f"INSERT INTO `{fresh_db}`.data VALUES (1)")
        store.write(cur, topic="cdc", resolved_ts=9, tables={}, offsets={0: 1}, partition_resolved={})
    conn.rollback()
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM `{fresh_db}`.data")
        assert cur.fetchone()[0] == 0
    assert store.load(conn).resolved_ts == 0


def test_changefeeds_are_isolated(conn, store: CheckpointStore) -> None:
    other = CheckpointStore(store.schema, "group-2")
    # The same table and partition in both, each with values of its own.
    for cs, topic, ts, offset in ((store, "a", 10, 1), (other, "b", 20, 2)):
        write(
            cs,
            conn,
            topic=topic,
            resolved_ts=ts,
            tables={("s", "t"): ts + 1},
            offsets={0: offset},
            partition_resolved={0: ts},
        )
    with conn.cursor() as cur:
        store.record_ddl(
            cur, commit_ts=10, schema="s", table="t", ddl_type=5, query="ALTER TABLE t ADD c INT"
        )
    conn.commit()
    a, b = store.load(conn), other.load(conn)
    assert (a.topic, a.resolved_ts, a.tables, a.offsets) == ("a", 10, {("s", "t"): 11}, {0: 1})
    assert (b.topic, b.resolved_ts, b.tables, b.offsets) == ("b", 20, {("s", "t"): 21}, {0: 2})
    assert a.applied_ddls and not b.applied_ddls
    store.reset(conn)
    assert store.load(conn) == Checkpoint()
    assert other.load(conn).resolved_ts == 20


def test_offsets_of_a_previous_topic_are_not_loaded(conn, store: CheckpointStore) -> None:
    write(store, conn, topic="old", resolved_ts=10, offsets={0: 100, 1: 200})
    write(store, conn, topic="new", resolved_ts=10, offsets={0: 5})
    ckpt = store.load(conn)
    assert ckpt.topic == "new" and ckpt.offsets == {0: 5}
    write(store, conn, topic=None, resolved_ts=11)  # None keeps the stored topic
    assert store.load(conn).topic == "new"


# -- DDL -------------------------------------------------------------------------------------------


def test_record_and_recognise_ddls(conn, store: CheckpointStore) -> None:
    q1, q2 = "ALTER TABLE `t` ADD COLUMN `ü` INT", "ALTER TABLE `t` DROP COLUMN `ü`"
    with conn.cursor() as cur:
        store.record_ddl(cur, commit_ts=U64, schema="s😀", table="t", ddl_type=5, query=q1)
        store.record_ddl(cur, commit_ts=U64, schema="s😀", table="t", ddl_type=6, query=q2)  # same ts
        store.record_ddl(cur, commit_ts=U64, schema="s😀", table="t", ddl_type=5, query=q1)  # replay: no-op
        store.record_ddl(cur, commit_ts=1, schema="", table="", ddl_type=1, query="CREATE DATABASE x")
    conn.commit()
    ckpt = store.load(conn)
    assert ckpt.applied_ddls == {
        (U64, ddl_digest(q1)),
        (U64, ddl_digest(q2)),
        (1, ddl_digest("CREATE DATABASE x")),
    }
    assert store.ddl_applied(ckpt, U64, q1) and store.ddl_applied(ckpt, U64, q2)
    assert not store.ddl_applied(ckpt, U64 - 1, q1)
    assert not store.ddl_applied(ckpt, U64, q1 + " ")
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT schema_name, ddl_type, query FROM `{store.schema}`.applied_ddl WHERE query_digest = %s",
            (ddl_digest(q1),),
        )
        assert cur.fetchall() == (("s😀", 5, q1),)
    conn.commit()


# -- pruning ---------------------------------------------------------------------------------------


def _record(store: CheckpointStore, conn, ts: int, *, prune: bool, ddl_type: int = 5, schema: str = "s",
            table: str = "t") -> None:  # fmt: skip
    ddl = {"commit_ts": ts, "schema": schema, "table": table, "ddl_type": ddl_type, "query": f"DDL {ts}"}
    with conn.cursor() as cur:
        store.record_ddl(cur, **ddl)
        if prune:
            store.prune(cur, **ddl)
    conn.commit()


def _answers(ckpt: Checkpoint, ddl_ts: range, tables: list[tuple[str, str]]) -> tuple[list, list]:
    """What a restart from ``ckpt`` takes for applied (each DDL of ``ddl_ts``) and each table's
    floor: the questions the daemon asks (``SharedProgress``), answered from the loaded rows."""
    progress = SharedProgress(ckpt)
    return (
        [progress.is_ddl_applied((ts, ddl_digest(f"DDL {ts}"))) for ts in ddl_ts],
        [ckpt.table_ts(*t) for t in tables],
    )


def test_prune_keeps_the_ddls_above_the_resolved_ts_and_the_newest_history(
    conn, store: CheckpointStore
) -> None:
    other = CheckpointStore(store.schema, "group-2")
    write(other, conn, resolved_ts=1000)
    for ts in range(1, 11):
        _record(other, conn, ts, prune=False)
    write(store, conn, resolved_ts=40)
    for ts in range(1, 151):
        _record(store, conn, ts, prune=False)
    everything = range(1, 160)
    assert _answers(store.load(conn), everything, [])[0] == [ts <= 150 for ts in everything]
    _record(store, conn, 151, prune=True)  # a DDL step: the resolved ts stays below its DDL
    ckpt = store.load(conn)
    # 1-40 are at or below the resolved ts and older than the newest 100: gone. The DDLs above it
    # stay whatever their number (41-151: 111 rows), and so does the record of the DDL in flight.
    assert sorted(ts for ts, _ in ckpt.applied_ddls) == list(range(41, 152))
    assert _answers(ckpt, everything, [])[0] == [ts <= 151 for ts in everything]
    write(store, conn, resolved_ts=500)
    _record(store, conn, 501, prune=True)
    ckpt = store.load(conn)
    assert sorted(ts for ts, _ in ckpt.applied_ddls) == [*range(53, 152), 501]  # the newest 100
    assert all(_answers(ckpt, range(1, 501), [])[0])
    assert len(other.load(conn).applied_ddls) == 10  # another changefeed's rows are its own


def test_prune_on_a_drop_forgets_only_table_rows_the_resolved_ts_covers(conn, store: CheckpointStore) -> None:
    tables = {("s", "gone"): 90, ("s", "kept"): 100, ("s2", "x"): 80, ("s2", "ahead"): 200, ("s3", "y"): 10}
    write(store, conn, resolved_ts=100, tables=tables)
    names = sorted(tables)
    before = _answers(store.load(conn), range(0), names)
    _record(store, conn, 101, prune=True, ddl_type=4, schema="s", table="gone")  # DROP TABLE
    assert set(store.load(conn).tables) == set(tables) - {("s", "gone")}
    _record(store, conn, 102, prune=True, ddl_type=2, schema="s2", table="")  # DROP DATABASE
    ckpt = store.load(conn)
    # s2.ahead is above the resolved ts (a floor a catch-up left): it stays.
    assert set(ckpt.tables) == {("s", "kept"), ("s2", "ahead"), ("s3", "y")}
    assert _answers(ckpt, range(0), names) == before


def test_prune_leaves_every_topics_offsets(conn, store: CheckpointStore) -> None:
    """A changefeed may read several topics: every topic's offset rows are live, whatever the
    changefeed row's topic says."""
    write(store, conn, topic="old", offsets={0: 100, 1: 200})
    write(store, conn, topic="new", resolved_ts=10, offsets={0: 5})
    _record(store, conn, 11, prune=True)
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT topic, partition_id, next_offset FROM `{store.schema}`.partition_offset ORDER BY 1, 2"
        )
        assert cur.fetchall() == (("new", 0, 5), ("old", 0, 100), ("old", 1, 200))
    conn.commit()


def test_ddl_digest_is_sha256_of_utf8() -> None:
    q = "CREATE TABLE `ü` (a INT)"
    assert ddl_digest(q) == hashlib.sha256(q.encode("utf-8")).hexdigest()
    assert len(ddl_digest("")) == 64


# -- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"resolved_ts": U64 + 1},
        {"resolved_ts": -1},
        {"resolved_ts": True},
        {"resolved_ts": 1.0},
        {"tables": {("s", "t"): U64 + 1}},
        {"tables": {("s" * 256, "t"): 1}},
        {"tables": {("s", "t" * 256): 1}},
        {"offsets": {0: -1}},
        {"offsets": {0: 1 << 63}},
        {"offsets": {-1: 0}},
        {"offsets": {1 << 31: 0}},
        {"offsets": {0: 1}, "partition_resolved": {1: 5}},
        {"offsets": {0: 1}, "topic": None},
        {"topic": "x" * 256},
    ],
)
def test_invalid_values_are_rejected_before_sql(conn, store: CheckpointStore, kw: dict) -> None:
    args = {"topic": "cdc", "resolved_ts": 1, "tables": {}, "offsets": {}, "partition_resolved": {}} | kw
    with conn.cursor() as cur, pytest.raises(ValueError):
        store.write(cur, **args)
    conn.rollback()
    assert store.load(conn) == Checkpoint()


def test_invalid_store_names() -> None:
    with pytest.raises(ValueError):
        CheckpointStore("ticdc_applier", "")
    with pytest.raises(ValueError):
        CheckpointStore("ticdc_applier", "x" * 256)
    with pytest.raises(ValueError):
        CheckpointStore("x" * 65, "cf")
    with pytest.raises(ValueError):
        CheckpointStore("trailing ", "cf")


# -- fencing ---------------------------------------------------------------------------------------


def test_owner_fence(cfg: DownstreamConfig, conn, store: CheckpointStore) -> None:
    store.claim(conn, "instance-A")
    write(store, conn, resolved_ts=10, owner="instance-A")
    assert store.load(conn).owner == "instance-A"

    # A is mid-transaction (the fence check holds the changefeed row) when B claims.
    with conn.cursor() as cur:
        store.write(
            cur, topic="cdc", resolved_ts=20, tables={}, offsets={}, partition_resolved={}, owner="instance-A"
        )
    other = connect(cfg)
    claimed = threading.Event()
    t = threading.Thread(target=lambda: (store.claim(other, "instance-B"), claimed.set()), daemon=True)
    t.start()
    time.sleep(0.4)
    assert not claimed.is_set()  # B waits for A's in-flight transaction...
    conn.commit()
    t.join(10)
    assert claimed.is_set()
    ckpt = store.load(other)  # ...so B's load sees A's last commit
    assert (ckpt.resolved_ts, ckpt.owner) == (20, "instance-B")

    with conn.cursor() as cur, pytest.raises(FencedOut, match="instance-B"):
        store.write(
            cur, topic="cdc", resolved_ts=30, tables={}, offsets={}, partition_resolved={}, owner="instance-A"
        )
    conn.rollback()
    assert store.load(conn).resolved_ts == 20
    other.close()


def test_fence_without_claim_fails(conn, store: CheckpointStore) -> None:
    with conn.cursor() as cur, pytest.raises(FencedOut):
        store.write(cur, topic="cdc", resolved_ts=1, tables={}, offsets={}, partition_resolved={}, owner="me")
    conn.rollback()


# -- status ----------------------------------------------------------------------------------------


def test_status_report(conn, store: CheckpointStore) -> None:
    now = 1_700_000_000.0
    ts_5s_ago = int((now - 5) * 1000) << 18 | 7  # physical ms << 18 | logical
    ts_2s_ago = int((now - 2) * 1000) << 18
    write(
        store,
        conn,
        topic="cdc",
        resolved_ts=ts_5s_ago,
        tables={("s", "ahead"): ts_2s_ago, ("s", "behind"): 1},
        offsets={1: 40, 0: 30},
        partition_resolved={0: ts_2s_ago, 1: ts_5s_ago},
    )
    with conn.cursor() as cur:
        store.record_ddl(
            cur,
            commit_ts=ts_5s_ago,
            schema="s",
            table="ahead",
            ddl_type=3,
            query="CREATE TABLE ahead (a INT)",
        )
    conn.commit()
    r = status_report(conn, store.schema, store.changefeed, now=now)
    assert r["found"] is True and r["topic"] == "cdc" and r["resolved_ts"] == ts_5s_ago
    assert r["lag_seconds"] == pytest.approx(5.0)
    assert [(t["table"], t["checkpoint_ts"], t["effective_ts"]) for t in r["tables"]] == [
        ("ahead", ts_2s_ago, ts_2s_ago),
        ("behind", 1, ts_5s_ago),
    ]
    assert [t["lag_seconds"] for t in r["tables"]] == [pytest.approx(2.0), pytest.approx(5.0)]
    assert [(p["partition"], p["next_offset"], p["lag_seconds"]) for p in r["partitions"]] == [
        (0, 30, pytest.approx(2.0)),
        (1, 40, pytest.approx(5.0)),
    ]
    assert r["applied_ddls"] == 1 and r["last_ddl"]["table"] == "ahead"
    assert r["updated_at"].endswith("Z")


def test_status_report_for_missing_things(conn, store: CheckpointStore) -> None:
    assert status_report(conn, store.schema, "never-written")["found"] is False
    r = status_report(conn, f"no_such_schema_{uuid.uuid4().hex[:8]}", "cf")
    assert r["found"] is False and r["tables"] == [] and r["lag_seconds"] is None

"""The daemon and the catch-up writer against a server's ``max_allowed_packet``: statements sized
to it, a row beyond it stops with one clear error, and raising the setting lets the stream apply.

A private server (``start_plain_mariadb``) started with ``--max-allowed-packet=1M``: the shared
test server's setting must not change under other tests. Each test sets the global value it
needs; the daemon reads its session's value at start.
"""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from applier.apply.ddl import detect_dialect
from applier.catchup.writer import WriteError, WriteSpec, write_keyless
from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig
from applier.kafka.embedded_broker import create_topic
from applier.simulator.producer import produce_records
from checkpoint import CheckpointStore
from sqlgen import MARIADB, KeylessOp, TablePlan
from sqlgen.dialect import packet_needed
from tests.integration.harness import Changefeed
from tests.integration.private_mariadb import PrivateMariaDB, start_plain_mariadb
from tests.integration.test_daemon_inputs import Rec, frame

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MIB = 1 << 20
T0 = 450_000_000_000_000_000  # commit ts of the DDLs; rows follow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    srv = start_plain_mariadb(Path(tmp_path_factory.mktemp("mariadb-packet")), "--max-allowed-packet=1M")
    try:
        yield srv
    finally:
        srv.stop()


def _set_packet(server: PrivateMariaDB, size: int) -> None:
    """The server's global value: what every session opened from now on starts with."""
    conn = server.root()
    try:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL max_allowed_packet = %s", (size,))
    finally:
        conn.close()


@pytest.fixture
def feed(server: PrivateMariaDB, broker) -> Iterator[Changefeed]:
    _set_packet(server, MIB)
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", server.url, server.params)
    cf.extra_args += ["--http-listen", "off"]
    create_topic(cf.bootstrap, cf.topic, 1)
    yield cf
    _set_packet(server, 16 * MIB)  # big enough to drop what the test wrote
    cf.drop()
    _set_packet(server, MIB)


def _ddl(schema: str, column: str) -> list[Rec]:
    return [
        Rec(0, *frame([{"ts": T0, "scm": schema, "t": 2}], [{"q": f"CREATE DATABASE `{schema}`", "t": 1}])),
        Rec(
            0,
            *frame(
                [{"ts": T0 + 1, "scm": schema, "tbl": "t", "t": 2}],
                [{"q": f"CREATE TABLE `{schema}`.`t` (id INT PRIMARY KEY, body {column})", "t": 3}],
            ),
        ),
        _resolved(T0 + 1),
    ]


def _row(schema: str, ts: int, rid: int, body: bytes, *, binary: bool) -> Rec:
    """One upsert of ``t`` in its own record; LONGBLOB/LONGTEXT values travel base64-encoded."""
    cols = {
        "id": {"t": 3, "f": 0x02 | 0x08, "v": rid},
        "body": {"t": 251, "f": 0x41 if binary else 0x40, "v": base64.b64encode(body).decode()},
    }
    return Rec(0, *frame([{"ts": ts, "scm": schema, "tbl": "t", "t": 1}], [{"u": cols}]))


def _resolved(ts: int) -> Rec:
    return Rec(0, *frame([{"ts": ts, "t": 3}], [None]))


def _send(cf: Changefeed, records: list[Rec]) -> None:
    produce_records(cf.bootstrap, cf.topic, records, max_message_bytes=8 * MIB)  # type: ignore[arg-type]


def _stored(cf: Changefeed, schema: str) -> dict[int, bytes]:
    conn = cf.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, body FROM `{schema}`.`t` ORDER BY id")
            return {int(i): bytes(b) if isinstance(b, bytes) else b.encode() for i, b in cur.fetchall()}
    finally:
        conn.close()


def _ids(cf: Changefeed, schema: str) -> list[int]:
    conn = cf.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id FROM `{schema}`.`t` ORDER BY id")  # no 4 MiB values through 1 MiB
            return [int(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()


def test_a_row_beyond_max_allowed_packet_stops_with_one_error_and_applies_once_it_is_raised(
    feed: Changefeed, server: PrivateMariaDB
) -> None:
    schema = feed.new_schema()
    rng = random.Random(7)
    small = {i: rng.randbytes(1000) for i in range(1, 6)}
    t1 = T0 + 10
    _send(feed, [*_ddl(schema, "LONGBLOB"), *(_row(schema, t1, i, b, binary=True) for i, b in small.items())])
    _send(feed, [_resolved(t1)])
    done = feed.run_to_end()
    assert done.returncode == 0, done.stderr
    before = feed.checkpoint()
    assert before[0] == t1

    # Later: two rows of 4 MiB (one transaction, with small rows), then more small rows.
    big = {100: rng.randbytes(4 * MIB), 101: rng.randbytes(4 * MIB)}
    t2, t3, t4 = T0 + 20, T0 + 30, T0 + 40
    more = {6: rng.randbytes(500), 7: rng.randbytes(500)}
    after = {8: rng.randbytes(500)}
    recs = [_row(schema, t2, i, b, binary=True) for i, b in more.items()]
    recs.append(_resolved(t2))
    recs += [_row(schema, t3, i, b, binary=True) for i, b in big.items()]
    recs += [_row(schema, t3, 9, b"with the big ones", binary=True), _resolved(t3)]
    recs += [_row(schema, t4, i, b, binary=True) for i, b in after.items()]
    recs.append(_resolved(t4))
    _send(feed, recs)

    done = feed.run_to_end()
    assert done.returncode == 1, done.stderr
    output = done.stdout + done.stderr
    lines = [ln for ln in output.splitlines() if "error" in ln]
    assert len(lines) == 1, output
    line = lines[0]
    assert f"`{schema}`.`t` cannot be applied" in line and "for key (100)" in line
    assert "max_allowed_packet = 1048576 bytes" in line and "raise max_allowed_packet" in line
    assert "Traceback" not in output
    statement = int(line.split(" is ")[1].split(" bytes")[0])
    assert statement > 8 * MIB  # the 4 MiB value as hex
    assert f"at least {packet_needed(statement)}" in line and packet_needed(statement) == 9 * MIB
    # Nothing of the failing window: the checkpoint stands before it, at most past the t2 rows.
    resolved, offsets = feed.checkpoint()
    assert resolved in (t1, t2)
    assert offsets[0] >= before[1][0]
    expected_ids = sorted([*small, *(more if resolved == t2 else {})])
    assert _ids(feed, schema) == expected_ids

    # Raised on the server, as the message says: the same stream applies, byte for byte.
    _set_packet(server, 16 * MIB)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stderr
    assert feed.checkpoint()[0] == t4
    assert _stored(feed, schema) == {**small, **more, **big, 9: b"with the big ones", **after}


def test_rows_of_300_kb_are_split_over_several_statements_within_1_mib(
    feed: Changefeed, server: PrivateMariaDB
) -> None:
    schema = feed.new_schema()
    rng = random.Random(11)
    alphabet = "abc 'quote' \"dq\" back\\slash\nnewline é 表 😀"
    rows = {i: "".join(rng.choices(alphabet, k=250_000)).encode() for i in range(1, 13)}
    assert all(270_000 < len(v) < 330_000 for v in rows.values())
    ts = T0 + 10
    _send(feed, [*_ddl(schema, "LONGTEXT"), *(_row(schema, ts, i, v, binary=False) for i, v in rows.items())])
    _send(feed, [_resolved(ts)])

    def replaces() -> int:
        conn = server.root()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW GLOBAL STATUS LIKE 'Com_replace'")
                return int(cur.fetchone()[1])
        finally:
            conn.close()

    conn = server.root()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@SESSION.max_allowed_packet")
            assert cur.fetchone()[0] == MIB  # what the daemon's sessions get
    finally:
        conn.close()
    replaced = replaces()
    done = feed.run_to_end()
    assert done.returncode == 0, done.stderr
    statements = replaces() - replaced
    budget = MARIADB.with_max_allowed_packet(MIB).packet_budget
    assert statements >= -(-sum(len(v) for v in rows.values()) // budget) and statements < len(rows)
    assert feed.checkpoint()[0] == ts
    _set_packet(server, 16 * MIB)  # read back the whole window at once
    assert _stored(feed, schema) == rows


def test_the_catchup_writer_refuses_a_row_beyond_the_packet_before_writing_anything(
    server: PrivateMariaDB,
) -> None:
    schema, ckpt = f"up_{uuid.uuid4().hex[:10]}", f"ckpt_{uuid.uuid4().hex[:10]}"
    _set_packet(server, MIB)
    downstream = DownstreamConfig.from_url(server.url)
    conn = connect(downstream)
    try:
        store = CheckpointStore(ckpt, "cf")
        store.ensure_schema(conn)
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{schema}`")
            cur.execute(f"CREATE TABLE `{schema}`.`t` (body LONGBLOB)")  # keyless: one transaction
        dialect = detect_dialect(conn)
        assert dialect.max_allowed_packet == MIB and conn.max_allowed_packet == MIB  # client follows
    finally:
        close_quietly(conn)
    values = [b"small", random.Random(3).randbytes(2 * MIB)]
    plan = TablePlan(schema, "t", keyed=False, events=2)
    plan.ops = [KeylessOp("insert", ("body",), (251,), (v,)) for v in values]

    def spec(dialect) -> WriteSpec:
        return WriteSpec(downstream, dialect, "topic", 1, 0, T0, checkpoint_schema=ckpt, changefeed="cf")

    try:
        with pytest.raises(WriteError) as refused:
            write_keyless(plan, spec(dialect))
        message = str(refused.value)
        assert f"`{schema}`.`t` cannot be applied" in message and "(keyless table)" in message
        assert "max_allowed_packet = 1048576 bytes" in message and "epoch 1" in message
        conn = server.root()
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM `{schema}`.`t`")
            assert cur.fetchone()[0] == 0  # not even the small row: one transaction, rolled back
            cur.execute(f"SELECT COUNT(*) FROM `{ckpt}`.`table_checkpoint`")
            assert cur.fetchone()[0] == 0
        conn.close()

        _set_packet(server, 16 * MIB)
        conn = connect(downstream)
        try:
            raised = detect_dialect(conn)
        finally:
            close_quietly(conn)
        write_keyless(plan, spec(raised))
        conn = server.root()
        with conn.cursor() as cur:
            cur.execute(f"SELECT body FROM `{schema}`.`t` ORDER BY LENGTH(body)")
            assert [r[0] for r in cur.fetchall()] == values
        conn.close()
    finally:
        _set_packet(server, 16 * MIB)
        conn = server.root()
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
            cur.execute(f"DROP DATABASE IF EXISTS `{ckpt}`")
        conn.close()
        _set_packet(server, MIB)

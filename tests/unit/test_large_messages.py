"""Large messages without services: claim-check objects, the historical read's statements, the
resolver's jobs and errors, and the queue that keeps each partition's records in order."""

from __future__ import annotations

import base64
import struct
import sys
import threading
import time
from typing import Any

import cramjam
import orjson
import pytest

from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.errors import MalformedRecordError
from applier.codec.events import (
    LargeMessageEvent,
    Position,
    ResolvedEvent,
    RowEvent,
    RowKind,
    claim_check_name,
)
from applier.large_messages.claim_check import BadClaimCheckObject, row_from_object
from applier.large_messages.errors import LargeMessageNotConfigured, LargeMessageUnavailable
from applier.large_messages.resolver import LargeMessageQueue, LargeMessageResolver
from applier.large_messages.storage import ObjectStoreError
from applier.large_messages.upstream import UpstreamRowMissing, UpstreamUnreachable, select_as_of
from tests.builders import column

U64 = struct.Struct(">Q")
TOPIC = "t"


def frame(pairs: list[tuple[dict, dict | None]], compression: str | None = None) -> tuple[bytes, bytes]:
    key, value = U64.pack(1), b""
    for k, v in pairs:
        kb = orjson.dumps(k)
        vb = b"" if v is None else orjson.dumps(v)
        if vb and compression == "snappy":
            vb = bytes(cramjam.snappy.compress_raw(vb))
        elif vb and compression == "lz4":
            vb = bytes(cramjam.lz4.compress(vb))
        key += U64.pack(len(kb)) + kb
        value += U64.pack(len(vb)) + vb
    return key, value


BIG = "é" * 200_000
FULL = {"u": {"id": column(8, 7, 11), "body": column(252, base64.b64encode(BIG.encode()).decode())}}
KEY_ONLY = {"u": {"id": column(8, 7, 11)}}


def cc_object(key: dict, value: dict, compression: str | None = None) -> bytes:
    k, v = frame([(key, value)], compression)
    return orjson.dumps({"key": base64.b64encode(k).decode(), "value": base64.b64encode(v).decode()})


def reference(ts: int = 100, name: str = "abc.json", kind_value: dict | None = None) -> LargeMessageEvent:
    key = {"ts": ts, "scm": "s", "tbl": "w", "t": 1, "ccl": f"file:///producer/{name}"}
    k, v = frame([(key, kind_value if kind_value is not None else KEY_ONLY)])
    (ev,) = decode_record(k, v, topic=TOPIC, partition=1, offset=9)
    assert isinstance(ev, LargeMessageEvent)
    return ev


# --------------------------------------------------------------------------- claim-check objects


@pytest.mark.parametrize("compression", [None, "snappy", "lz4"])
def test_object_gives_the_full_row_at_the_references_position(compression: str | None) -> None:
    ref = reference()
    data = cc_object({"ts": 100, "scm": "s", "tbl": "w", "t": 1}, FULL, compression)
    row = row_from_object(data, ref, DecoderOptions(compression=compression))
    assert isinstance(row, RowEvent) and row.kind is RowKind.INSERT
    assert row.new is not None and row.new["body"]["v"] == BIG and row.new["id"]["v"] == 7
    assert row.pos == Position(TOPIC, 1, 9, 0)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"key": "AAAA"}', '"value"'),
        (b'{"key": "***", "value": ""}', "not base64"),
        (orjson.dumps({"key": base64.b64encode(b"x").decode(), "value": ""}), "malformed"),
    ],
)
def test_bad_objects_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(BadClaimCheckObject, match=reason):
        row_from_object(data, reference(), DecoderOptions())


def test_an_object_of_another_row_is_refused() -> None:
    ref = reference(ts=100)
    other_ts = cc_object({"ts": 101, "scm": "s", "tbl": "w", "t": 1}, FULL)
    with pytest.raises(BadClaimCheckObject, match="commit ts 101"):
        row_from_object(other_ts, ref, DecoderOptions())
    other_table = cc_object({"ts": 100, "scm": "s", "tbl": "x", "t": 1}, FULL)
    with pytest.raises(BadClaimCheckObject, match=r"`s`\.`x`"):
        row_from_object(other_table, ref, DecoderOptions())
    delete = cc_object({"ts": 100, "scm": "s", "tbl": "w", "t": 1}, {"d": FULL["u"]})
    with pytest.raises(BadClaimCheckObject, match="holds a delete"):
        row_from_object(delete, ref, DecoderOptions())
    two = frame([({"ts": 100, "scm": "s", "tbl": "w", "t": 1}, FULL)] * 2)
    doc = orjson.dumps({"key": base64.b64encode(two[0]).decode(), "value": base64.b64encode(two[1]).decode()})
    with pytest.raises(BadClaimCheckObject, match="one row event"):
        row_from_object(doc, ref, DecoderOptions())


@pytest.mark.parametrize(
    ("location", "name"),
    [
        ("s3://bucket/prefix/0a-b.json", "0a-b.json"),
        ("file:///data/cc/x.json", "x.json"),
        ("file:////data/cc/x.json", "x.json"),  # TiCDC v7.5's four slashes
        ("x.json", "x.json"),
    ],
)
def test_only_the_base_name_of_a_location_is_used(location: str, name: str) -> None:
    assert claim_check_name(location) == name


@pytest.mark.parametrize(
    "location", ["", "s3://bucket/prefix/", "file:///a/..", "file:///a/.", "x\\..\\y", "a/b\x00c"]
)
def test_a_location_without_a_plain_name_is_malformed_input(location: str) -> None:
    key, value = frame([({"ts": 5, "scm": "s", "tbl": "w", "t": 1, "ccl": location}, KEY_ONLY)])
    with pytest.raises(MalformedRecordError, match="plain object name") as err:
        decode_record(key, value, topic=TOPIC, partition=2, offset=44)
    assert (err.value.partition, err.value.offset) == (2, 44)


def test_new_architecture_duplicate_ohk_key_is_a_claim_check_reference() -> None:
    # TiCDC v9 writes "ohk":true and then "ohk":false into a claim-check reference's key.
    kb = b'{"ts":5,"scm":"s","tbl":"w","t":1,"ohk":true,"ohk":false,"ccl":"s3://b/p/n.json"}'
    vb = orjson.dumps(KEY_ONLY)
    key = U64.pack(1) + U64.pack(len(kb)) + kb
    value = U64.pack(len(vb)) + vb
    (ev,) = decode_record(key, value, topic=TOPIC, partition=0, offset=1)
    assert isinstance(ev, LargeMessageEvent)
    assert ev.claim_check_name == "n.json" and not ev.handle_key_only


def test_handle_key_only_without_columns_is_malformed_input() -> None:
    key, value = frame([({"ts": 5, "scm": "s", "tbl": "w", "t": 1, "ohk": True}, None)])
    with pytest.raises(MalformedRecordError, match="no handle-key columns"):
        decode_record(key, value, topic=TOPIC, partition=0, offset=3)


# --------------------------------------------------------------------------- the historical read


class RecordingCursor:
    def __init__(self, columns: list[str], rows: list[tuple], fail_select: Exception | None = None) -> None:
        self.statements: list[tuple[str, Any]] = []
        self._columns, self._rows, self._fail = columns, rows, fail_select
        self._last: list[tuple] = []

    def execute(self, sql: str, params: Any = None) -> None:
        self.statements.append((sql, params))
        if "information_schema" in sql:
            self._last = [(c,) for c in self._columns]
        elif sql.startswith("SELECT"):
            if self._fail is not None:
                raise self._fail
            self._last = self._rows
        else:
            self._last = []

    def fetchall(self) -> list[tuple]:
        return self._last


def test_the_historical_read_sets_and_clears_tidb_snapshot() -> None:
    cur = RecordingCursor(["id", "body"], [("7", "x")])
    names, rows = select_as_of(cur, 4242, "s", "w`x", "(`id`) IN ((%s))", [7])
    assert (names, rows) == (["id", "body"], [("7", "x")])
    sqls = [s for s, _p in cur.statements]
    assert cur.statements[0] == ("SET @@tidb_snapshot = %s", (4242,))
    assert "information_schema.COLUMNS" in sqls[1] and cur.statements[1][1] == ("s", "w`x")
    assert sqls[2] == "SELECT `id`, `body` FROM `s`.`w``x` WHERE (`id`) IN ((%s))"
    assert cur.statements[2][1] == (7,)
    assert sqls[3] == "SET @@tidb_snapshot = ''"


def test_the_snapshot_is_cleared_when_the_read_fails() -> None:
    cur = RecordingCursor(["id"], [], fail_select=RuntimeError("boom"))
    with pytest.raises(RuntimeError):
        select_as_of(cur, 1, "s", "w", "1", [])
    assert cur.statements[-1] == ("SET @@tidb_snapshot = ''", None)


# --------------------------------------------------------------------------- resolver and queue


class MemoryStore:
    """An object store in memory; ``gate`` holds reads back until set."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.reads: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def read(self, name: str) -> bytes:
        self.gate.wait(5)
        self.reads.append(name)
        if name not in self.objects:
            raise ObjectStoreError(f"object {name!r} not found")
        return self.objects[name]

    def describe(self) -> str:
        return "memory://"


class FakeUpstream:
    def __init__(
        self, rows: dict[tuple[int, int], dict] | None = None, fail: Exception | None = None
    ) -> None:
        self.rows = rows or {}
        self.fail = fail
        self.calls: list[tuple[int, str, str, int]] = []

    def rows_as_of(self, ts: int, schema: str, table: str, keys: list[dict]) -> list[dict]:
        self.calls.append((ts, schema, table, len(keys)))
        if self.fail is not None:
            raise self.fail
        out = []
        for k in keys:
            full = self.rows.get((ts, k["id"]["v"]))
            if full is None:
                raise UpstreamRowMissing(f"no row id={k['id']['v']}")
            out.append({"id": k["id"], **full})
        return out

    def describe(self) -> str:
        return "mysql://up"

    def close(self) -> None:
        pass


def ohk_record(ts: int, ids: list[int], kind: str = "u", offset: int = 0, partition: int = 0) -> list:
    pairs = [
        ({"ts": ts, "scm": "s", "tbl": "w", "t": 1, "ohk": True}, {kind: {"id": column(8, i, 11)}})
        for i in ids
    ]
    key, value = frame(pairs)
    return decode_record(key, value, topic=TOPIC, partition=partition, offset=offset)


def test_handle_key_only_rows_are_read_once_per_table_and_ts_and_deletes_not_at_all() -> None:
    up = FakeUpstream({(10, 1): {"body": column(15, "a")}, (10, 2): {"body": column(15, "b")}})
    resolver = LargeMessageResolver(options=DecoderOptions(), upstream=up)  # type: ignore[arg-type]
    events = ohk_record(10, [1, 2]) + ohk_record(11, [3], kind="d")
    out, size = resolver.resolve(events)
    assert up.calls == [(10, "s", "w", 2)]
    assert [type(e) for e in out] == [RowEvent] * 3
    assert [e.new["body"]["v"] for e in out[:2]] == ["a", "b"]  # type: ignore[index]
    assert out[2].kind is RowKind.DELETE and out[2].old is not None and out[2].old["id"]["v"] == 3
    assert size == sys.getsizeof("a") + sys.getsizeof("b")  # what the values hold in memory


def test_missing_sources_name_the_setting_to_add() -> None:
    resolver = LargeMessageResolver(options=DecoderOptions())
    with pytest.raises(LargeMessageNotConfigured, match="--upstream") as err:
        resolver.resolve(ohk_record(10, [1], offset=5))
    assert "offset 5" in str(err.value)
    with pytest.raises(LargeMessageNotConfigured, match="--claim-check-storage-uri"):
        resolver.resolve([reference()])


def test_a_missing_row_or_object_is_unavailable_with_its_position() -> None:
    resolver = LargeMessageResolver(options=DecoderOptions(), upstream=FakeUpstream())  # type: ignore[arg-type]
    with pytest.raises(LargeMessageUnavailable, match="no row id=1") as err:
        resolver.resolve(ohk_record(10, [1], offset=8, partition=3))
    assert (err.value.position.partition, err.value.position.offset) == (3, 8)
    store = MemoryStore({})
    resolver = LargeMessageResolver(options=DecoderOptions(), store=store)  # type: ignore[arg-type]
    with pytest.raises(LargeMessageUnavailable, match=r"'abc\.json'.*restore the object"):
        resolver.resolve([reference()])


def test_an_unreachable_upstream_is_asked_again_then_reported() -> None:
    up = FakeUpstream(fail=UpstreamUnreachable("refused"))
    resolver = LargeMessageResolver(options=DecoderOptions(), upstream=up, retry_seconds=1.2)  # type: ignore[arg-type]
    with pytest.raises(LargeMessageUnavailable, match="retried"):
        resolver.resolve(ohk_record(10, [1]))
    assert len(up.calls) >= 2


def _drain(queue: LargeMessageQueue, timeout: float = 5.0) -> tuple[list, list]:
    done: list = []
    failures: list = []
    deadline = time.monotonic() + timeout
    while queue.busy() and time.monotonic() < deadline:
        queue.wait(0.2)
        d, f = queue.ready()
        done += d
        failures += f
    return done, failures


def test_the_queue_keeps_a_partitions_records_in_order_behind_a_fetch() -> None:
    name = "abc.json"
    store = MemoryStore({name: cc_object({"ts": 100, "scm": "s", "tbl": "w", "t": 1}, FULL)})
    store.gate.clear()
    queue = LargeMessageQueue(LargeMessageResolver(options=DecoderOptions(), store=store))  # type: ignore[arg-type]
    try:
        queue.add(1, "rec-9", [reference()], 100)
        assert queue.holds(1) and not queue.holds(0)
        plain = [ResolvedEvent(100, Position(TOPIC, 1, 10, 0))]
        queue.add(1, "rec-10", plain, 10)  # nothing to fetch, but it must wait behind rec-9
        assert queue.ready() == ([], [])
        store.gate.set()
        done, failures = _drain(queue)
        assert failures == [] and [item for item, _e, _n in done] == ["rec-9", "rec-10"]
        assert isinstance(done[0][1][0], RowEvent) and done[0][2] > 200_000
        assert not queue.busy()
    finally:
        queue.close()


def test_a_failed_fetch_drops_the_partitions_waiting_records_only() -> None:
    store = MemoryStore({"ok.json": cc_object({"ts": 100, "scm": "s", "tbl": "w", "t": 1}, FULL)})
    queue = LargeMessageQueue(LargeMessageResolver(options=DecoderOptions(), store=store))  # type: ignore[arg-type]
    try:
        queue.add(1, "bad", [reference(name="gone.json")], 1)
        queue.add(1, "after-bad", [ResolvedEvent(5, Position(TOPIC, 1, 11, 0))], 1)
        queue.add(2, "good", [reference(name="ok.json")], 1)
        done, failures = _drain(queue)
        assert [item for item, _e, _n in done] == ["good"]
        assert len(failures) == 1 and "gone.json" in str(failures[0])
        assert not queue.holds(1)
    finally:
        queue.close()


def test_waiting_bytes_over_the_bound_pause_the_partitions_that_hold_them() -> None:
    store = MemoryStore({})
    store.gate.clear()
    queue = LargeMessageQueue(
        LargeMessageResolver(options=DecoderOptions(), store=store),  # type: ignore[arg-type]
        max_waiting_bytes=100,
    )
    try:
        queue.add(0, "a", [reference(name="a.json")], 60)
        assert queue.over_limit() == set()
        queue.add(3, "b", [reference(name="b.json")], 60)
        assert queue.over_limit() == {0, 3}
    finally:
        store.gate.set()
        queue.close()


def test_fetched_bytes_not_fed_yet_count_against_the_bound() -> None:
    store = MemoryStore({"abc.json": cc_object({"ts": 100, "scm": "s", "tbl": "w", "t": 1}, FULL)})
    queue = LargeMessageQueue(
        LargeMessageResolver(options=DecoderOptions(), store=store),  # type: ignore[arg-type]
        max_waiting_bytes=100_000,
    )
    try:
        queue.add(2, "small record, large object", [reference()], 50)
        deadline = time.monotonic() + 5
        while queue.over_limit() == set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queue.over_limit() == {2}  # the 400 KB object waits in memory
        done, _ = queue.ready()
        assert len(done) == 1 and queue.over_limit() == set()
    finally:
        queue.close()


def test_the_upstream_password_is_its_own_and_errors_say_upstream(tmp_path) -> None:
    from applier.downstream.url import DownstreamConfigError
    from applier.large_messages.settings import LargeMessageSettings
    from applier.settings.schema import Config

    cfg = Config({"upstream": "mysql://reader@tidb:4000/", "time_zone": "+08:00"})
    env = {"APPLIER_DOWNSTREAM_PASSWORD": "down", "APPLIER_UPSTREAM_PASSWORD": "up"}
    up = LargeMessageSettings.from_config(cfg, env=env).upstream
    assert up is not None and up.password.reveal() == "up" and up.time_zone == "+08:00"
    assert (
        LargeMessageSettings.from_config(
            cfg, env={"APPLIER_DOWNSTREAM_PASSWORD": "down"}
        ).upstream.password.reveal()
        == ""
    )
    pw = tmp_path / "pw"
    pw.write_text("fromfile\n")
    cfg = Config({"upstream": "mysql://reader@tidb:4000/", "upstream_password_file": str(pw)})
    assert LargeMessageSettings.from_config(cfg, env={}).upstream.password.reveal() == "fromfile"
    with pytest.raises(DownstreamConfigError, match="upstream URL") as err:
        LargeMessageSettings.from_config(Config({"upstream": "http://reader:secret@tidb/"}), env={})
    assert "secret" not in str(err.value)
    assert not LargeMessageSettings.from_config(Config({}), env={}).configured


class _FailingCursor:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __enter__(self) -> _FailingCursor:
        return self

    def __exit__(self, *a: object) -> None:
        pass

    def execute(self, sql: str, params: Any = None) -> None:
        raise self.exc


class _FakeSession:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def cursor(self) -> _FailingCursor:
        return _FailingCursor(self.exc)


@pytest.mark.parametrize(
    ("code", "raised", "text"),
    [
        (8055, UpstreamRowMissing, "garbage-collected"),
        (1146, UpstreamRowMissing, "refused the read"),
        (2013, UpstreamUnreachable, "2013"),
    ],
)
def test_upstream_errors_are_told_apart(code: int, raised: type, text: str, monkeypatch) -> None:
    import pymysql

    from applier.downstream.url import DownstreamConfig
    from applier.large_messages.upstream import UpstreamReader

    reader = UpstreamReader(DownstreamConfig(host="tidb", port=4000, user="reader"))
    monkeypatch.setattr(reader, "_session", lambda: _FakeSession(pymysql.err.OperationalError(code, "boom")))
    key = {"id": column(8, 1, 11)}
    with pytest.raises(raised, match=text):
        reader.rows_as_of(5, "s", "w", [key])

"""decode_record: framing, event kinds, rows, DDL, resolved, large messages, compression and every
class of malformed input (docs/open-protocol.md §1-§3 and §7)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import cramjam
import orjson
import pytest

from applier.codec.decoder import DEFAULT_OPTIONS, DecoderOptions, decode_record
from applier.codec.errors import MalformedRecordError
from applier.codec.events import (
    DDLEvent,
    LargeMessageEvent,
    Position,
    ResolvedEvent,
    RowEvent,
    RowKind,
    handle_key_names,
)
from applier.errors import InputError
from tests.builders import DOC_EXAMPLE_LOG, column, frame_key, frame_value, record

U64 = struct.Struct(">Q")
TOPIC, PARTITION, OFFSET = "cdc-topic", 3, 1234


def decode(key: bytes | None, value: bytes | None, options: DecoderOptions = DEFAULT_OPTIONS) -> list[Any]:
    return decode_record(key, value, topic=TOPIC, partition=PARTITION, offset=OFFSET, options=options)


def pos(index: int) -> Position:
    return Position(TOPIC, PARTITION, OFFSET, index)


def row_key(ts: int = 100, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "scm": "db", "tbl": "tb", "t": 1, **extra}


# --- framing -----------------------------------------------------------------------------------


def test_a_record_with_many_events_of_every_kind() -> None:
    key, value = record(
        (row_key(10), {"u": {"id": column(3, 1, 11)}}),
        ({"ts": 11, "scm": "db", "tbl": "other", "t": 1}, {"d": {"id": column(3, 2, 11)}}),
        ({"ts": 12, "scm": "db", "tbl": "tb", "t": 2}, {"q": "ALTER TABLE tb ADD c INT", "t": 5}),
        ({"ts": 13, "t": 3}, None),
    )
    events = decode(key, value)
    assert events == [
        RowEvent(10, "db", "tb", RowKind.INSERT, {"id": column(3, 1, 11)}, None, None, pos(0)),
        RowEvent(11, "db", "other", RowKind.DELETE, None, {"id": column(3, 2, 11)}, None, pos(1)),
        DDLEvent(12, "db", "tb", "ALTER TABLE tb ADD c INT", 5, pos(2)),
        ResolvedEvent(13, pos(3)),
    ]


def test_sixteen_events_keep_their_order_and_index() -> None:
    pairs = [(row_key(1000 + i), {"u": {"id": column(3, i)}}) for i in range(16)]
    events = decode(*record(*pairs))
    assert [e.commit_ts for e in events] == [1000 + i for i in range(16)]
    assert [e.pos.index for e in events] == list(range(16))
    assert [e.new["id"]["v"] for e in events] == list(range(16))


@pytest.mark.parametrize("value", [U64.pack(0), b"", None])
def test_resolved_value_may_be_zero_length_empty_or_absent(value: bytes | None) -> None:
    key = frame_key([b'{"ts":415508881038376963,"t":3}'])
    assert decode(key, value) == [ResolvedEvent(415508881038376963, pos(0))]


def test_key_field_order_does_not_matter_and_unknown_fields_are_ignored() -> None:
    key = frame_key([b'{"t":1,"future":[1,2],"tbl":"tb","rid":77,"ts":5,"scm":"db"}'])
    value = frame_value([b'{"u":{"a":{"t":3,"f":0,"v":1}}}'])
    (event,) = decode(key, value)
    assert (event.commit_ts, event.schema, event.table, event.partition_id) == (5, "db", "tb", None)


def test_missing_schema_and_table_become_empty_strings() -> None:
    key, value = record(({"ts": 7, "t": 2}, {"q": "CREATE DATABASE x", "t": 1}))
    assert decode(key, value) == [DDLEvent(7, "", "", "CREATE DATABASE x", 1, pos(0))]
    key, value = record(({"ts": 7, "scm": "x", "t": 1}, {"u": {"a": column(3, 1)}}))
    assert decode(key, value)[0].table == ""


def test_partition_id_of_partitioned_tables() -> None:
    (event,) = decode(*record((row_key(ptn=98765), {"u": {"a": column(3, 1)}})))
    assert event.partition_id == 98765 and event.table == "tb"


def test_ts_up_to_uint64_max() -> None:
    key = frame_key([b'{"ts":18446744073709551615,"t":3}'])
    assert decode(key, U64.pack(0))[0].ts == 2**64 - 1


def test_record_key_may_be_a_bytearray_or_memoryview() -> None:
    key, value = record(({"ts": 1, "t": 3}, None))
    assert decode(bytearray(key), memoryview(value)) == [ResolvedEvent(1, pos(0))]


# --- rows --------------------------------------------------------------------------------------


def test_insert_update_delete() -> None:
    new = {"id": column(3, 1, 11), "v": column(15, "b")}
    old = {"id": column(3, 1, 11), "v": column(15, "a")}
    ins, upd, dele = decode(
        *record(
            (row_key(), {"u": new}),
            (row_key(), {"u": new, "p": old}),
            (row_key(), {"d": old}),
        )
    )
    assert (ins.kind, ins.new, ins.old) == (RowKind.INSERT, new, None)
    assert (upd.kind, upd.new, upd.old) == (RowKind.UPDATE, new, old)
    assert (dele.kind, dele.new, dele.old) == (RowKind.DELETE, None, old)
    assert handle_key_names(upd.old) == ["id"]


def test_only_output_updated_columns_fills_old_from_new() -> None:
    value = {
        "u": {
            "id": column(3, 1, 11),
            "a": column(15, "new-a"),
            "b": column(12, "2020-01-01 00:00:00"),
            "c": column(3, 9),
        },
        "p": {"a": column(15, "old-a")},
    }
    (event,) = decode(*record((row_key(), value)))
    assert event.kind is RowKind.UPDATE
    assert list(event.old) == ["id", "a", "b", "c"]  # the new image's column order
    assert event.old["a"]["v"] == "old-a"
    assert event.old["id"] == event.new["id"] and event.old["b"] == event.new["b"]
    # copies, not shared dicts: changing one image never changes the other
    assert event.old["id"] is not event.new["id"]
    event.old["c"]["v"] = 0
    assert event.new["c"]["v"] == 9
    assert handle_key_names(event.old) == ["id"]


def test_filled_old_columns_are_decoded_values() -> None:
    value = {"u": {"id": column(3, 1, 11), "bin": column(15, "\\x00\\x01", 1)}, "p": {"id": column(3, 1, 11)}}
    (event,) = decode(*record((row_key(), value)))
    assert event.old["bin"]["v"] == b"\x00\x01"


def test_old_only_columns_are_kept() -> None:
    value = {"u": {"id": column(3, 1)}, "p": {"id": column(3, 1), "gone": column(3, 5)}}
    (event,) = decode(*record((row_key(), value)))
    assert list(event.old) == ["id", "gone"]


def test_delete_with_only_handle_key_columns() -> None:
    value = {"d": {"id": {"t": 3, "h": True, "f": 11, "v": 42}, "k2": column(15, "x", 2 | 8)}}
    (event,) = decode(*record((row_key(), value)))
    assert event.kind is RowKind.DELETE
    assert event.old == {"id": column(3, 42, 11), "k2": column(15, "x", 10)}
    assert handle_key_names(event.old) == ["id", "k2"]


def test_row_without_handle_key_columns() -> None:
    (event,) = decode(*record((row_key(), {"u": {"a": column(3, 1, 64), "b": column(15, None, 64)}})))
    assert handle_key_names(event.new) == []


def test_empty_row_image_is_accepted() -> None:
    (event,) = decode(*record((row_key(), {"u": {}})))
    assert event.new == {}


# --- DDL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ddl_type", "query"),
    [
        (1, "CREATE DATABASE s"),
        (3, "CREATE TABLE t (a int)"),
        (14, "RENAME TABLE x TO t"),
        (36, "DROP SEQUENCE t"),
        (61, "ALTER TABLE t ADD COLUMN b int, DROP COLUMN c"),
        (999, "ALTER TABLE s.t ADD COLUMN b int"),
    ],
)
def test_ddl_any_type_code(ddl_type: int, query: str) -> None:
    key, value = record(({"ts": 5, "scm": "s", "tbl": "t", "t": 2}, {"q": query, "t": ddl_type}))
    assert decode(key, value) == [DDLEvent(5, "s", "t", query, ddl_type, pos(0))]


@pytest.mark.parametrize("reserved", [frozenset(), frozenset({"ckpt"})])
def test_ddl_whose_text_is_not_its_event_is_malformed_input_with_its_position(reserved) -> None:
    key, value = record(({"ts": 5, "scm": "s", "tbl": "t", "t": 2}, {"q": "GRANT ALL ON *.* TO x", "t": 3}))
    with pytest.raises(MalformedRecordError) as info:
        decode(key, value, DecoderOptions(reserved_schemas=reserved))
    err = info.value
    assert (err.partition, err.offset, err.index) == (3, 1234, 0)
    assert err.reason.startswith("DDL text does not match its event: GRANT")
    assert err.excerpt == b"GRANT ALL ON *.* TO x"


def test_ddl_on_a_reserved_schema_is_malformed_input_only_when_that_schema_is_reserved() -> None:
    key, value = record(({"ts": 5, "scm": "ckpt", "tbl": "t", "t": 2}, {"q": "DROP TABLE t", "t": 4}))
    assert decode(key, value)[0].query == "DROP TABLE t"
    with pytest.raises(MalformedRecordError, match="reserved schema 'ckpt'"):
        decode(key, value, DecoderOptions(reserved_schemas=frozenset({"ckpt"})))


def test_ddl_without_type_code_defaults_to_zero() -> None:
    key, value = record(({"ts": 5, "scm": "s", "t": 2}, {"q": "CREATE DATABASE s"}))
    assert decode(key, value)[0].ddl_type == 0


# --- large messages ----------------------------------------------------------------------------


def test_handle_key_only_message() -> None:
    value = {"u": {"id": {"t": 3, "h": True, "f": 11, "v": 5}}}
    (event,) = decode(*record((row_key(77, ohk=True), value)))
    assert isinstance(event, LargeMessageEvent)
    assert (event.commit_ts, event.schema, event.table) == (77, "db", "tb")
    assert event.handle_key_only is True and event.claim_check_location is None
    assert event.row == RowEvent(77, "db", "tb", RowKind.INSERT, {"id": column(3, 5, 11)}, None, None, pos(0))
    assert event.pos == pos(0)


def test_claim_check_message() -> None:
    ccl = "s3://bucket/changefeed/claim-check/abc.json"
    (event,) = decode(*record((row_key(78, ccl=ccl), None)))
    assert event == LargeMessageEvent(78, "db", "tb", False, ccl, None, pos(0))
    (event,) = decode(*record((row_key(78, ccl=ccl, ohk=False), {})))
    assert event.row is None and event.claim_check_location == ccl
    (event,) = decode(*record((row_key(78, ccl=ccl, ohk=True), {"d": {"id": column(3, 1, 11)}})))
    assert event.handle_key_only and event.row.kind is RowKind.DELETE


def test_ohk_false_is_an_ordinary_row() -> None:
    (event,) = decode(*record((row_key(ohk=False), {"u": {"a": column(3, 1)}})))
    assert isinstance(event, RowEvent)


# --- compression -------------------------------------------------------------------------------


def _compressed_record(compress: Any) -> tuple[bytes, bytes]:
    keys = [
        orjson.dumps(row_key(1)),
        orjson.dumps({"ts": 2, "scm": "db", "tbl": "tb", "t": 2}),
        orjson.dumps({"ts": 3, "t": 3}),
        orjson.dumps(row_key(4)),
    ]
    values = [
        bytes(compress(orjson.dumps({"u": {"id": column(3, 1, 11), "b": column(15, "\\xff", 1)}}))),
        bytes(compress(orjson.dumps({"q": "TRUNCATE TABLE tb", "t": 11}))),
        b"",  # a resolved event's empty value is never compressed
        bytes(
            compress(orjson.dumps({"u": {"t": column(252, "aGVsbG8=", 0)}, "p": {"t": column(252, "", 0)}}))
        ),
    ]
    return frame_key(keys), frame_value(values)


@pytest.mark.parametrize(
    "name, compress", [("snappy", cramjam.snappy.compress_raw), ("lz4", cramjam.lz4.compress)]
)
def test_compression_round_trip(name: str, compress: Any) -> None:
    events = decode(*_compressed_record(compress), DecoderOptions(compression=name))
    assert events == [
        RowEvent(
            1,
            "db",
            "tb",
            RowKind.INSERT,
            {"id": column(3, 1, 11), "b": column(15, b"\xff", 1)},
            None,
            None,
            pos(0),
        ),
        DDLEvent(2, "db", "tb", "TRUNCATE TABLE tb", 11, pos(1)),
        ResolvedEvent(3, pos(2)),
        RowEvent(
            4, "db", "tb", RowKind.UPDATE, {"t": column(252, "hello")}, {"t": column(252, "")}, None, pos(3)
        ),
    ]


def test_compressed_large_message_value() -> None:
    value = frame_value([bytes(cramjam.lz4.compress(orjson.dumps({"u": {"id": column(3, 9, 11)}})))])
    key = frame_key([orjson.dumps(row_key(ohk=True))])
    (event,) = decode(key, value, DecoderOptions(compression="lz4"))
    assert event.row.new == {"id": column(3, 9, 11)}


def test_unknown_compression_is_rejected_at_configuration() -> None:
    with pytest.raises(ValueError):
        DecoderOptions(compression="zstd")


def test_options_are_hashable_and_default() -> None:
    assert DecoderOptions() == DEFAULT_OPTIONS
    assert hash(DecoderOptions(True, "lz4")) == hash(
        DecoderOptions(legacy_base64_strings=True, compression="lz4")
    )


# --- malformed input ---------------------------------------------------------------------------

GOOD_KEY = b'{"ts":1,"scm":"s","tbl":"t","t":1}'
GOOD_VALUE = b'{"u":{"a":{"t":3,"f":0,"v":1}}}'


def one(key_doc: bytes, value_doc: bytes) -> tuple[bytes, bytes]:
    return frame_key([key_doc]), frame_value([value_doc])


FRAMING_ERRORS: dict[str, tuple[bytes | None, bytes | None]] = {
    "no key": (None, frame_value([GOOD_VALUE])),
    "empty key": (b"", frame_value([GOOD_VALUE])),
    "key shorter than the version": (b"\x00\x00\x00\x01", frame_value([GOOD_VALUE])),
    "wrong version": (frame_key([GOOD_KEY], version=2), frame_value([GOOD_VALUE])),
    "version zero": (frame_key([GOOD_KEY], version=0), frame_value([GOOD_VALUE])),
    "version only": (U64.pack(1), frame_value([GOOD_VALUE])),
    "truncated key length": (U64.pack(1) + b"\x00\x00\x00", frame_value([GOOD_VALUE])),
    "key length beyond the buffer": (U64.pack(1) + U64.pack(1000) + GOOD_KEY, frame_value([GOOD_VALUE])),
    "negative int64 key length": (U64.pack(1) + b"\xff" * 8 + GOOD_KEY, frame_value([GOOD_VALUE])),
    "key trailing garbage": (frame_key([GOOD_KEY]) + b"\x01\x02", frame_value([GOOD_VALUE])),
    "truncated value length": (frame_key([GOOD_KEY]), frame_value([GOOD_VALUE]) + b"\x00\x00"),
    "value length beyond the buffer": (frame_key([GOOD_KEY]), U64.pack(999) + GOOD_VALUE),
    "value shorter than 8 bytes": (frame_key([GOOD_KEY]), b"\x00\x00\x00"),
    "more values than keys": (frame_key([GOOD_KEY]), frame_value([GOOD_VALUE, GOOD_VALUE])),
    "more keys than values": (frame_key([GOOD_KEY, GOOD_KEY]), frame_value([GOOD_VALUE])),
}


def _malformed(key: bytes, value: bytes) -> MalformedRecordError:
    """The error that decoding the record raises, checked to name the record's place in the topic:
    what an operator needs to find the record."""
    with pytest.raises(MalformedRecordError) as info:
        decode(key, value)
    err = info.value
    assert (err.topic, err.partition, err.offset) == (TOPIC, PARTITION, OFFSET)
    return err


@pytest.mark.parametrize("case", list(FRAMING_ERRORS))
def test_framing_errors(case: str) -> None:
    err = _malformed(*FRAMING_ERRORS[case])
    assert err.index == -1  # the record as a whole
    assert TOPIC in str(err) and str(OFFSET) in str(err)


EVENT_ERRORS: dict[str, tuple[bytes, bytes]] = {
    "key invalid json": one(b'{"ts":1,', GOOD_VALUE),
    "key empty document": one(b"", GOOD_VALUE),
    "key not an object": one(b"[1,2]", GOOD_VALUE),
    "key is a number": one(b"1", GOOD_VALUE),
    "unknown kind": one(b'{"ts":1,"t":4}', GOOD_VALUE),
    "kind zero": one(b'{"ts":1,"t":0}', GOOD_VALUE),
    "kind as string": one(b'{"ts":1,"t":"1"}', GOOD_VALUE),
    "kind as bool": one(b'{"ts":1,"t":true}', GOOD_VALUE),
    "kind missing": one(b'{"ts":1,"scm":"s"}', GOOD_VALUE),
    "missing ts": one(b'{"scm":"s","tbl":"t","t":1}', GOOD_VALUE),
    "negative ts": one(b'{"ts":-1,"t":3}', b""),
    "ts as string": one(b'{"ts":"1","t":3}', b""),
    "ts as float": one(b'{"ts":1.5,"t":3}', b""),
    "ts beyond uint64": one(b'{"ts":18446744073709551616,"t":3}', b""),
    "ts as bool": one(b'{"ts":true,"t":3}', b""),
    "scm not a string": one(b'{"ts":1,"scm":5,"tbl":"t","t":1}', GOOD_VALUE),
    "tbl not a string": one(b'{"ts":1,"scm":"s","tbl":null,"t":2}', b'{"q":"x","t":1}'),
    "ptn not an int": one(b'{"ts":1,"scm":"s","tbl":"t","t":1,"ptn":"p1"}', GOOD_VALUE),
    "ohk not a bool": one(b'{"ts":1,"scm":"s","tbl":"t","t":1,"ohk":1}', GOOD_VALUE),
    "ccl not a string": one(b'{"ts":1,"scm":"s","tbl":"t","t":1,"ccl":5}', GOOD_VALUE),
    "value invalid json": one(GOOD_KEY, b'{"u":{"a":'),
    "value not an object": one(GOOD_KEY, b'["u"]'),
    "value trailing characters": one(GOOD_KEY, GOOD_VALUE + b"x"),
    "row value empty": one(GOOD_KEY, b""),
    "row value without u or d": one(GOOD_KEY, b"{}"),
    "row value with only p": one(GOOD_KEY, b'{"p":{"a":{"t":3,"f":0,"v":1}}}'),
    "column not an object": one(GOOD_KEY, b'{"u":{"a":[3,0,1]}}'),
    "column missing t": one(GOOD_KEY, b'{"u":{"a":{"f":0,"v":1}}}'),
    "bad base64": one(GOOD_KEY, b'{"u":{"a":{"t":252,"f":1,"v":"!!"}}}'),
    "bad escape": one(GOOD_KEY, b'{"u":{"a":{"t":15,"f":1,"v":"\\\\z"}}}'),
    "string for int": one(GOOD_KEY, b'{"u":{"a":{"t":3,"f":0,"v":"1"}}}'),
    "int beyond uint64": one(GOOD_KEY, b'{"u":{"a":{"t":8,"f":0,"v":18446744073709551616}}}'),
    "int below int64": one(GOOD_KEY, b'{"u":{"a":{"t":8,"f":0,"v":-9223372036854775809}}}'),
    "bool for int": one(GOOD_KEY, b'{"u":{"a":{"t":1,"f":0,"v":true}}}'),
    "bad decimal": one(GOOD_KEY, b'{"u":{"a":{"t":246,"f":0,"v":"12a"}}}'),
    "number for datetime": one(GOOD_KEY, b'{"u":{"a":{"t":12,"f":0,"v":20200101}}}'),
    "number for varchar": one(GOOD_KEY, b'{"u":{"a":{"t":15,"f":0,"v":1}}}'),
    "bad old image": one(GOOD_KEY, b'{"u":{"a":{"t":3,"f":0,"v":1}},"p":{"a":{"t":3,"f":0,"v":"x"}}}'),
    "bad delete image": one(GOOD_KEY, b'{"d":{"a":{"t":3,"f":0}}}'),
    "ddl without q": one(b'{"ts":1,"scm":"s","t":2}', b'{"t":3}'),
    "ddl q not a string": one(b'{"ts":1,"scm":"s","t":2}', b'{"q":5,"t":3}'),
    "ddl type not an int": one(b'{"ts":1,"scm":"s","t":2}', b'{"q":"x","t":"3"}'),
    "ddl empty value": one(b'{"ts":1,"scm":"s","t":2}', b""),
    "ddl value not an object": one(b'{"ts":1,"scm":"s","t":2}', b'"CREATE TABLE x"'),
    "large message value invalid": one(b'{"ts":1,"scm":"s","tbl":"t","t":1,"ohk":true}', b"{"),
    "large message row without u or d": one(b'{"ts":1,"scm":"s","tbl":"t","t":1,"ohk":true}', b'{"p":{}}'),
}


@pytest.mark.parametrize("case", list(EVENT_ERRORS))
def test_event_errors(case: str) -> None:
    err = _malformed(*EVENT_ERRORS[case])
    assert err.index == 0
    assert err.reason
    assert "event #0" in str(err)


def test_error_index_points_at_the_bad_event_and_carries_its_bytes() -> None:
    bad_value = b'{"u":{"a":{"t":3,"f":0,"v":"not-an-int"}}}'
    key = frame_key([GOOD_KEY, GOOD_KEY, GOOD_KEY])
    value = frame_value([GOOD_VALUE, GOOD_VALUE, bad_value])
    with pytest.raises(MalformedRecordError) as info:
        decode(key, value)
    assert info.value.index == 2
    assert b"not-an-int" in info.value.excerpt
    assert "'a'" in info.value.reason


def test_key_error_excerpt_is_the_key_document() -> None:
    key, value = one(b'{"ts":-5,"t":3}', b"")
    with pytest.raises(MalformedRecordError) as info:
        decode(key, value)
    assert info.value.excerpt == b'{"ts":-5,"t":3}'


def test_framing_error_excerpt_shows_the_bad_bytes() -> None:
    with pytest.raises(MalformedRecordError) as info:
        decode(frame_key([GOOD_KEY], version=7), frame_value([GOOD_VALUE]))
    assert info.value.excerpt == U64.pack(7)


@pytest.mark.parametrize("name", ["snappy", "lz4"])
@pytest.mark.parametrize("payload", [b"not compressed at all", GOOD_VALUE, b"\x00"])
def test_decompression_failure(name: str, payload: bytes) -> None:
    with pytest.raises(MalformedRecordError) as info:
        decode(*one(GOOD_KEY, payload), DecoderOptions(compression=name))
    assert info.value.index == 0


def test_compressed_garbage_after_decompression_is_malformed() -> None:
    bad = bytes(cramjam.snappy.compress_raw(b'{"u":'))
    with pytest.raises(MalformedRecordError) as info:
        decode(*one(GOOD_KEY, bad), DecoderOptions(compression="snappy"))
    assert info.value.excerpt == b'{"u":'  # the decompressed bytes are shown


def test_malformed_error_derives_from_the_project_root_only() -> None:
    """Not a ValueError: an ``except ValueError`` in parsing code cannot swallow it."""
    with pytest.raises(MalformedRecordError):
        decode(*one(b"\xff\xfe", GOOD_VALUE))
    assert issubclass(MalformedRecordError, InputError) and not issubclass(MalformedRecordError, ValueError)


# --- the documentation's example stream (seed 000, logs 1-14, old form): DOC_EXAMPLE_LOG -----------


def test_documentation_example_stream() -> None:
    opts = DecoderOptions(legacy_base64_strings=True)
    next_offset = {0: 0, 1: 0}
    got: list[tuple[int, Any]] = []
    for log, partition, key_json, value_json in DOC_EXAMPLE_LOG:
        key = frame_key([key_json.encode()])
        value = b"" if not value_json else frame_value([value_json.encode()])
        offset = next_offset[partition]
        next_offset[partition] += 1
        (event,) = decode_record(key, value, topic="t1-cdc", partition=partition, offset=offset, options=opts)
        assert event.pos == Position("t1-cdc", partition, offset, 0)
        got.append((log, event))

    def rid(v: int) -> dict[str, Any]:
        return {"t": 3, "f": 2, "v": v}  # "h": true became the handle-key flag

    def row(ts: int, kind: RowKind, new: Any, old: Any) -> tuple[Any, ...]:
        return ("row", ts, "test", "t1", kind, new, old, None)

    create = "CREATE TABLE test.t1(id int primary key, val varchar(16))"
    expected = {
        1: ("ddl", 415508856908021766, "test", "t1", create, 3),
        2: ("resolved", 415508856908021766),
        3: ("ddl", 415508856908021766, "test", "t1", create, 3),
        4: ("resolved", 415508856908021766),
        5: row(415508878783938562, RowKind.INSERT, {"id": rid(1), "val": {"t": 15, "f": 0, "v": "aa"}}, None),
        6: row(415508878783938562, RowKind.INSERT, {"id": rid(2), "val": {"t": 15, "f": 0, "v": "bb"}}, None),
        7: row(415508878783938562, RowKind.INSERT, {"id": rid(3), "val": {"t": 15, "f": 0, "v": "cc"}}, None),
        8: row(415508878783938562, RowKind.INSERT, {"id": rid(3), "val": {"t": 15, "f": 0, "v": "cc"}}, None),
        9: row(415508881418485761, RowKind.DELETE, None, {"id": rid(1)}),
        10: row(415508881418485761, RowKind.DELETE, None, {"id": rid(2)}),
        11: row(
            415508881418485761, RowKind.INSERT, {"id": rid(3), "val": {"t": 15, "f": 0, "v": "dd"}}, None
        ),
        12: row(
            415508881418485761, RowKind.INSERT, {"id": rid(4), "val": {"t": 15, "f": 0, "v": "ee"}}, None
        ),
        13: ("resolved", 415508881038376963),
        14: ("resolved", 415508881038376963),
    }

    def summary(event: Any) -> tuple[Any, ...]:
        if isinstance(event, DDLEvent):
            return ("ddl", event.commit_ts, event.schema, event.table, event.query, event.ddl_type)
        if isinstance(event, ResolvedEvent):
            return ("resolved", event.ts)
        assert isinstance(event, RowEvent)
        return (
            "row",
            event.commit_ts,
            event.schema,
            event.table,
            event.kind,
            event.new,
            event.old,
            event.partition_id,
        )

    assert {log: summary(event) for log, event in got} == expected
    assert [log for log, e in got if e.pos.partition == 1] == [3, 4, 6, 10, 14]
    assert [e.pos.offset for _, e in got if e.pos.partition == 1] == [0, 1, 2, 3, 4]


def test_documentation_example_row_without_legacy_option_keeps_base64_text() -> None:
    # The old form cannot be detected from the data: without the option, "YWE=" is just text.
    key = frame_key([DOC_EXAMPLE_LOG[4][2].encode()])
    (event,) = decode(key, frame_value([DOC_EXAMPLE_LOG[4][3].encode()]))
    assert event.new["val"]["v"] == "YWE="


def test_without_its_compiled_fast_path_the_decoder_does_not_import() -> None:
    """No silent slow fallback: an install that lacks the compiled module (applier/codec/
    _fastpath.pyx) fails at import, and the last line says how to build it."""
    root = Path(__file__).resolve().parents[2]
    code = "import sys; sys.modules['applier.codec._fastpath'] = None; import applier.codec.decoder"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the decoder's compiled fast path") and "pip install -e ." in last

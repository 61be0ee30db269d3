"""decode_record's fast path (applier/codec/_fastpath.pyx) against the careful path it falls back to
(decoder.py).

decode_record tries every event with a fast path written for what current producers send and, at
the first thing it does not expect, decodes the event again with the careful path. The fast path
must therefore never accept what the careful path rejects, nor produce anything else than it:
these tests feed both the same records, ordinary and hostile, in any key order, and require the
same events (same types, same dict order) or the same MalformedRecordError (reason, index, excerpt).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
from typing import Any

import cramjam
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codec import decoder, framing
from applier.codec._fastpath import compact_image
from applier.codec.decoder import DecoderOptions, decode_record, decode_record_careful
from applier.codec.errors import MalformedRecordError
from applier.codec.events import FLAG_HANDLE_KEY, CompactImage, Position, RowEvent, RowKind, key_only

U64 = struct.Struct(">Q")
OPTIONS = [
    DecoderOptions(),
    DecoderOptions(legacy_base64_strings=True),
    DecoderOptions(compression="snappy"),
    DecoderOptions(compression="lz4"),
]
COMPRESS = {None: None, "snappy": cramjam.snappy.compress_raw, "lz4": cramjam.lz4.compress}


def frame(key_docs: list[bytes], value_docs: list[bytes], options: DecoderOptions) -> tuple[bytes, bytes]:
    compress = COMPRESS[options.compression]
    if compress is not None:
        value_docs = [bytes(compress(d)) if d else d for d in value_docs]
    key = U64.pack(1) + b"".join(U64.pack(len(d)) + d for d in key_docs)
    return key, b"".join(U64.pack(len(d)) + d for d in value_docs)


def dumps(obj: Any, ascii_only: bool = False) -> bytes:
    """JSON like TiCDC writes it; unlike orjson, json writes integers beyond 64 bits."""
    return json.dumps(obj, ensure_ascii=ascii_only, separators=(",", ":")).encode()


def _columns(image: Any) -> list[tuple[str, Any, Any, Any]] | None:
    """An image (a dict, or the compact form the fast path gives keyed new images) as its columns
    in order: the same whichever form, and the order of ``t``, ``f``, ``v`` inside a column (which
    the compact form does not keep, and nothing reads) left out."""
    if image is None:
        return None
    return [(name, col["t"], col["f"], col["v"]) for name, col in image.items()]


def _event_repr(event: Any) -> str:
    if type(event) is RowEvent:
        rest = dataclasses.replace(event, new=None, old=None)
        return repr((rest, _columns(event.new), _columns(event.old)))
    return repr(event)


def outcome(fn: Any, key: bytes, value: bytes, options: DecoderOptions) -> tuple[str, Any]:
    """What a decoder makes of a record, in a form where 1, 1.0, True, b"" and "" all differ and
    column order counts (repr), so that equal outcomes mean the same events. Either way the record's
    position must be where it says: the error's, or every event's."""
    try:
        events = fn(key, value, topic="tp", partition=1, offset=2, options=options)
    except MalformedRecordError as e:
        assert (e.topic, e.partition, e.offset) == ("tp", 1, 2)
        return "error", (e.reason, e.index, e.excerpt)
    assert [(e.pos.topic, e.pos.partition, e.pos.offset, e.pos.index) for e in events] == [
        ("tp", 1, 2, i) for i in range(len(events))
    ]
    for e in events:
        # the new image's values taken for planning (fast path only) are exactly the image's
        taken = getattr(e, "new_values", None)
        if taken is not None:
            assert repr(taken) == repr(tuple(c["v"] for c in e.new.values()))
        if type(e) is RowEvent and e.new is not None:
            # keyed new images come compact from the fast path, everything else as dicts
            keyed = any(col["f"] & FLAG_HANDLE_KEY for col in e.new.values())
            assert type(e.new) is (CompactImage if keyed and fn is decode_record and taken else dict)
    return "events", "[" + ", ".join(_event_repr(e) for e in events) + "]"


def assert_same(key: bytes, value: bytes, options: DecoderOptions) -> tuple[str, Any]:
    fast = outcome(decode_record, key, value, options)
    careful = outcome(decode_record_careful, key, value, options)
    assert fast == careful
    return fast


# --- hostile but plausible documents -------------------------------------------------------------

CODES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 225, 245, 246, 247, 248, 249, 250]
CODES += [251, 252, 253, 254, 255, 230, 0, -1, 999]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "0", "-0.5", "12.", ".5", ".", "1.2.3", "١٢", "+7", "1e5", "12a", " 1"]),
    st.sampled_from(["YWE=", "YWE", "5rWL6K+VdGV4dA==", "//79", "@@", "aGk=\n", "é"]),
    st.sampled_from(["\\x89PNG\\r\\n", "\\q", "\\", "\\u00e9", "\\U0001f600", "\\101", "\\12", "\\\\x41"]),
    st.sampled_from(["\\x4", '\\"', "\\'", "\\\n", "a\\\\", "2020-01-01 00:00:00", "中文"]),
    st.text(max_size=12),
)
VALUES = (
    SCALARS
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=2), st.integers(), max_size=1)
)
FLAGS = st.one_of(
    st.integers(0, 255),
    st.integers(-300, 300),
    st.sampled_from([1, 2, 3, 11, 65, 64, 256, -1, -256, -257, 2**40]),
    st.booleans(),
    st.sampled_from([1.0, "1", None, [1]]),
)
MISSING = object()


def shuffled(draw: st.DrawFn, obj: dict[str, Any]) -> dict[str, Any]:
    """The same object with its keys in the order producers use (mostly) or in any other: the
    order carries no meaning, and each order must give the same result on both paths."""
    if draw(st.integers(0, 3)):
        return obj
    return dict(draw(st.permutations(list(obj.items()))))


@st.composite
def column(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 30)) == 0:
        return draw(st.sampled_from([[], 5, "x", None, [3, 0, 1]]))
    col: dict[str, Any] = {}
    t = draw(st.sampled_from(CODES) | st.sampled_from([True, 3.0, 246.0, 15.0, "3", None]))
    f = draw(FLAGS | st.just(MISSING))
    h = draw(st.sampled_from([MISSING, MISSING, MISSING, True, False, 1, "yes", None]))
    v = draw(VALUES | st.just(MISSING))
    if draw(st.integers(0, 20)) != 0:
        col["t"] = t
    if h is not MISSING:
        col["h"] = h
    if f is not MISSING:
        col["f"] = f
    if v is not MISSING:
        col["v"] = v
    if draw(st.integers(0, 10)) == 0:
        col["x"] = "future"
    return shuffled(draw, col)


@st.composite
def good_column(draw: st.DrawFn) -> dict[str, Any]:
    """Columns as current producers write them (the fast path's home ground)."""
    t = draw(st.sampled_from([1, 3, 5, 8, 12, 15, 246, 252, 254, 245]))
    binary = draw(st.booleans())
    f = draw(st.integers(0, 255)) & ~1 | (1 if binary else 0)
    if t in (1, 3, 8):
        v: Any = draw(st.integers(-(2**63), 2**64 - 1))
    elif t == 5:
        v = draw(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53))
    elif t == 246:
        v = draw(st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{0,10})?", fullmatch=True))
    elif t == 252:
        v = draw(st.sampled_from(["", "aGVsbG8=", "/w==", "5rWL6K+VdGV4dA=="]))
    elif t in (15, 254) and binary:
        v = draw(st.sampled_from(["", "abc", "\\x89PNG\\r\\n\\x1a\\n", "\\\\x41", "\\u00e9", "中"]))
    else:
        v = draw(st.text(max_size=10))
    if draw(st.integers(0, 5)) == 0:
        v = None
    col: dict[str, Any] = {"t": t}
    if f & 2 and draw(st.booleans()):
        col["h"] = True
    col["f"] = f
    col["v"] = v
    return shuffled(draw, col)


NAMES = st.text(min_size=1, max_size=4)
ROWS = st.dictionaries(NAMES, column() | good_column(), max_size=5)
GOOD_ROWS = st.dictionaries(NAMES, good_column(), max_size=6)


@st.composite
def row_value(draw: st.DrawFn) -> Any:
    rows = ROWS if draw(st.booleans()) else GOOD_ROWS
    shape = draw(st.sampled_from(["u", "up", "d", "du", "p", "none", "junk", "partial"]))
    if shape == "junk":
        return draw(st.sampled_from([[], "x", 5, None, {"u": None}, {"u": []}, {"u": {}, "p": []}]))
    value: dict[str, Any] = {}
    if "u" in shape:
        value["u"] = draw(rows)
    if "p" in shape:
        value["p"] = draw(rows)
    if "d" in shape:
        value["d"] = draw(rows)
    if shape == "partial":  # only-output-updated-columns
        new = draw(GOOD_ROWS)
        keep = draw(st.lists(st.sampled_from(sorted(new)), unique=True)) if new else []
        value = {"u": new, "p": {name: draw(good_column()) for name in keep}}
    return shuffled(draw, value)


@st.composite
def key_doc(draw: st.DrawFn) -> Any:
    key: dict[str, Any] = {}
    if draw(st.integers(0, 15)):
        key["ts"] = draw(st.integers(0, 2**64 - 1) | st.sampled_from([-1, 2**64, 1.5, "1", True, None]))
    if draw(st.integers(0, 3)):
        key["scm"] = draw(st.text(max_size=3) | st.sampled_from([5, None]))
    if draw(st.integers(0, 3)):
        key["tbl"] = draw(st.text(max_size=3) | st.sampled_from([None, []]))
    key["t"] = draw(st.sampled_from([1, 1, 1, 1, 2, 3, 0, 4, True, 1.0, "1"]))
    for name, values in (
        ("ptn", [5, -1, "p", None]),
        ("ohk", [True, False, 0, 1, None]),
        ("ccl", ["s3://x", None, 5]),
        ("rid", [1]),
    ):
        if draw(st.integers(0, 6)) == 0:
            key[name] = draw(st.sampled_from(values))
    if draw(st.integers(0, 40)) == 0:
        return draw(st.sampled_from([[], "x", 5]))
    return shuffled(draw, key)


@st.composite
def record(draw: st.DrawFn) -> tuple[bytes, bytes, DecoderOptions]:
    options = draw(st.sampled_from(OPTIONS))
    keys, values = [], []
    for _ in range(draw(st.integers(1, 4))):
        key = draw(key_doc())
        kind = key.get("t") if isinstance(key, dict) else None
        if kind == 2:
            value: Any = draw(st.sampled_from([{"q": "CREATE TABLE x (a int)", "t": 3}, {"q": 5}, None]))
        elif kind == 3:
            value = None
        else:
            value = draw(row_value())
        ascii_only = draw(st.booleans())  # \u escapes in keys and strings, or raw UTF-8
        keys.append(dumps(key, ascii_only))
        values.append(b"" if value is None else dumps(value, ascii_only))
    key_bytes, value_bytes = frame(keys, values, options)
    return key_bytes, value_bytes, options


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record())
def test_fast_and_careful_paths_agree(case: tuple[bytes, bytes, DecoderOptions]) -> None:
    assert_same(*case)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), GOOD_ROWS, st.booleans()), min_size=1, max_size=16))
def test_agree_on_what_current_producers_send(rows: list[tuple[int, dict[str, Any], bool]]) -> None:
    keys = [orjson.dumps({"ts": ts, "scm": "db", "tbl": "tb", "t": 1}) for ts, _, _ in rows]
    values = [orjson.dumps({"u": row, "p": row} if update else {"u": row}) for _, row, update in rows]
    kind, _ = assert_same(*frame(keys, values, DecoderOptions()), DecoderOptions())
    assert kind == "events"


# --- literal documents orjson.dumps cannot write ---------------------------------------------------

LITERAL_VALUES = [
    b'{"u":{"a":{"t":3,"f":0,"v":18446744073709551615}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":18446744073709551616}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":-9223372036854775809}}}',
    b'{"u":{"a":{"t":5,"f":0,"v":1e400}}}',
    b'{"u":{"a":{"t":5,"f":0,"v":2}}}',
    b'{"u":{"a":{"t":3,"f":11.0,"v":1}}}',
    b'{"u":{"a":{"t":3,"f":1e1,"v":1}}}',
    b'{"u":{"a":{"t":3.0,"f":0,"v":1}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":1,"v":"x"}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":"x","v":1}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":1},"a":{"t":3,"f":0,"v":"x"}}}',
    b'{"u":{"a":{"t":3,"\\u0068":true,"f":0,"v":1}}}',
    b'{"u":{"a":{"t":3,"h":true,"h":false,"f":0,"v":1}}}',
    b'{"u":{"a":{"t":15,"f":1,"v":"\\ud800"}}}',
    b'{"u":{"a":{"t":15,"f":1,"v":"\\u005cx41"}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":1}},"d":null}',
    b'{"d":{"a":{"t":3,"f":0,"v":1}},"u":{"a":{"t":3,"f":0,"v":"x"}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":1}},"p":null}',
    b'{"u":{"a":{"t":3,"f":0,"v":1}}} ',
    b'{"u":{"a":{"t":3,"f":0,"v":1}}}\x00',
    # keys in other orders, the images in another order, a member the protocol does not have
    b'{"u":{"a":{"v":1.5,"t":5,"f":0}}}',
    b'{"u":{"a":{"v":7,"f":0,"t":3}}}',
    b'{"u":{"a":{"f":1,"v":"\\\\x41","t":15}}}',
    b'{"u":{"a":{"h":true,"t":3,"f":0,"v":1}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":1,"h":true}}}',
    b'{"u":{"a":{"t":3,"h":true,"f":1,"v":1}}}',
    b'{"p":{"a":{"t":3,"f":0,"v":1}},"u":{"a":{"t":3,"f":0,"v":2}}}',
    b'{"u":{"a":{"t":12,"f":0,"v":"x"}},"u":{"a":{"t":3,"f":0,"v":1}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":1}},"x":1}',
    # escapes in names and values, numbers at the edges of JSON and of orjson's ranges
    b'{"u":{"a\\u00e9":{"t":3,"f":0,"v":1}}}',
    b'{"u":{"\\u0061":{"t":3,"f":0,"v":1},"a":{"t":3,"f":0,"v":2}}}',
    b'{"u":{"a":{"t":15,"f":0,"v":"\\ud83d\\ude00 \\/ \\u00e9 \\u0000"}}}',
    b'{"u":{"a":{"t":15,"f":1,"v":"\\ud83d\\ude00\\\\x41\\u00e9"}}}',
    b'{"u":{"a":{"t":15,"f":1,"v":"\\\\u00e9\\\\U0001F600\\\\377\\\\a\\\\\'"}}}',
    b'{"u":{"a":{"t":15,"f":0,"v":"\\udc00"}}}',
    b'{"u":{"a":{"t":252,"f":0,"v":"aGk\\u003d"}}}',
    b'{"u":{"a":{"t":252,"f":0,"v":"aGl="}}}',
    b'{"u":{"a":{"t":246,"f":0,"v":"\\u0031"}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":-0}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":01}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":-9223372036854775808}}}',
    b'{"u":{"a":{"t":5,"f":0,"v":-0.0}}}',
    b'{"u":{"a":{"t":5,"f":0,"v":1E2}}}',
    b'{"u":{"a":{"t":5,"f":0,"v":0.1e-400}}}',
    b'{"u":{"a":{"t":5,"f":0,"v":18446744073709551615}}}',
    b'{"u":{"a":{"t":5,"f":0,"v":1.}}}',
    b'{"u":{"a":{"t":3,"f":4611686018427387904,"v":1}}}',
    b'{"u":{"a":{"t":3,"f":18446744073709551615,"v":1}}}',
    # bytes that are not JSON, or not UTF-8
    b'{"u":{"a":{"t":15,"f":0,"v":"a\x01b"}}}',
    b'{"u":{"a":{"t":15,"f":0,"v":"\xff"}}}',
    b'{"u":{"a":{"t":15,"f":1,"v":"\xed\xa0\x80"}}}',
    b'{"u":{"a":{"t":15,"f":1,"v":"\xc3\xa9"}}}',
    b'{"u":{"a":{"t":3,"f":0,"v":1}}',
    b'{"u":{"a":{"t":3,"f":0,"v":tru}}}',
]
LITERAL_KEYS = [
    b'{"ts":1,"scm":"s","tbl":"t","t":1}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1,"t":3}',
    b'{"ts":1,"ts":-1,"scm":"s","tbl":"t","t":1}',
    b'{"ts":1.0,"scm":"s","tbl":"t","t":1}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1.0}',
    b'{"ts":18446744073709551616,"scm":"s","tbl":"t","t":1}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1,"ohk":false}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1,"ohk":0,"ccl":null}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1,"ccl":"x"}',
    b'{"ts":1,"scm":"s","t":1,"ptn":7}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1,"ptn":7.0}',
    b'{"t":1,"tbl":"t","scm":"s","ts":1}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1,"ptn":null,"rid":-5}',
    b'{"ts":18446744073709551615,"scm":"s","tbl":"t","t":1,"rid":9223372036854775808}',
    b'{"ts":1,"scm":"s\\u00e9","tbl":"t","t":1}',
    b'{"\\u0074s":1,"scm":"s","tbl":"t","t":1}',
    b'{"ts":1,"scm":"s","tbl":"t","t":1,"x":1}',
    b'{"ts":1,"scm":"s","tbl":"t","t":2}',
    b'{"ts":1,"scm":null,"tbl":"t","t":3}',
    b'{"ts":-0,"scm":"s","tbl":"t","t":1}',
]


@pytest.mark.parametrize("key_doc", LITERAL_KEYS)
@pytest.mark.parametrize("value_doc", LITERAL_VALUES)
def test_agree_on_literal_documents(key_doc: bytes, value_doc: bytes) -> None:
    for options in OPTIONS:
        assert_same(*frame([key_doc], [value_doc], options), options)


# --- every type code against every kind of value, exhaustively ---------------------------------

GRID_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 7, 2**63, 2**64 - 1, 1.5, -0.0, 1e300, [], [1], {}, {"a": 1},
    "", "0", "12", "-0.5", "+7", "12.", ".5", ".", "1.2.3", "1..2", "12a", " 1", "1e5", "١٢", "²",
    "NaN", "YWE=", "YWE", "//79", "5rWL6K+VdGV4dA==", "aGk=\n", "é", "中文", "plain",
    "\\x89PNG\\r\\n", "\\x4", "\\q", "\\", "a\\", "\\u00e9", "\\U0001f600", "\\101", "\\12", "\\8",
    "\\\\x41", '\\"', "\\'", "\\\n", "\\N{BULLET}", "2020-01-01 00:00:00", "-838:59:59",
]  # fmt: skip
GRID_CODES: list[Any] = [*sorted(set(CODES)), True, 3.0, 5.0, 15.0, 246.0, 252.0, 6.0]
GRID_SHAPES: list[dict[str, Any]] = [
    {"f": 0}, {"f": 1}, {"f": 64}, {"f": 65}, {"f": -1}, {"f": -255}, {"f": 255}, {"f": 256},
    {"f": True}, {"f": 1.0}, {}, {"h": True, "f": 0}, {"h": True, "f": 11}, {"h": True, "f": 1},
    {"h": False, "f": 1}, {"h": True}, {"h": 1, "f": 2},
]  # fmt: skip


def grid_records() -> list[tuple[bytes, bytes]]:
    key = b'{"ts":5,"scm":"s","tbl":"t","t":1}'
    out = []
    for t in GRID_CODES:
        for shape in GRID_SHAPES:
            docs = [dumps({"u": {"c": {"t": t, **shape, "v": v}}}) for v in GRID_VALUES]
            out.extend(frame([key], [doc], DecoderOptions()) for doc in docs)
    return out


@pytest.mark.parametrize("options", [DecoderOptions(), DecoderOptions(legacy_base64_strings=True)])
def test_agree_on_every_code_flag_and_value(options: DecoderOptions) -> None:
    accepted = 0
    for key, value in grid_records():
        kind, _ = assert_same(key, value, options)
        accepted += kind == "events"
    assert accepted > 1000  # the grid exercises acceptance, not only errors


# --- framing: the one-call split of same-length key documents ------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=6), min_size=0, max_size=20), st.binary(max_size=10))
def test_uniform_key_split_equals_the_general_split(docs: list[bytes], tail: bytes) -> None:
    buf = U64.pack(1) + b"".join(U64.pack(len(d)) + d for d in docs)
    for candidate in (buf, buf + tail, buf[: len(buf) - len(tail)]):
        uniform = framing._split_uniform(candidate, 8)
        if uniform is None:
            continue
        assert uniform and uniform == framing._split(candidate, 8, "key")


def test_uniform_key_split_is_used_for_same_length_keys() -> None:
    docs = [b'{"ts":%d,"t":3}' % ts for ts in range(100, 116)]
    buf = U64.pack(1) + b"".join(U64.pack(len(d)) + d for d in docs)
    assert framing._split_uniform(buf, 8) == docs
    assert framing._split_uniform(buf + b"\x00", 8) is None  # a trailing byte: the general split decides
    uneven = U64.pack(1) + b"".join(U64.pack(len(d)) + d for d in [b"{}", b'{"a":1}'])
    assert framing._split_uniform(uneven, 8) is None


# --- old images reduced to their key (the catch-up's readers) -----------------------------------------


def _key_names(image: Any) -> list[str]:
    return [name for name, col in image.items() if col["f"] & FLAG_HANDLE_KEY]


def assert_reduced_old_images_agree(key: bytes, value: bytes, options: DecoderOptions) -> int:
    """``decode_record(old_keys_only=True)`` against the careful path: the same events or the same
    error, but for old images it gives reduced, each exactly the handle-key columns of the careful
    path's old image, and only where that image has its new image's columns in the same order and
    the same columns flagged handle key. Returns how many it reduced."""
    where = {"topic": "tp", "partition": 1, "offset": 2, "options": options}
    try:
        careful = decode_record_careful(key, value, **where)
    except MalformedRecordError as e:
        with pytest.raises(MalformedRecordError) as raised:
            decode_record(key, value, old_keys_only=True, **where)
        got = raised.value
        assert (got.reason, got.index, got.excerpt) == (e.reason, e.index, e.excerpt)
        return 0
    events = decode_record(key, value, old_keys_only=True, **where)
    assert len(events) == len(careful)
    reduced = 0
    for event, ref in zip(events, careful, strict=True):
        if type(event) is RowEvent and type(event.old) is CompactImage:
            names = _key_names(ref.new)
            assert event.kind is RowKind.UPDATE and names
            assert list(ref.old) == list(ref.new) and _key_names(ref.old) == names
            assert _columns(event.old) == _columns(key_only(ref.old, names))
            event = dataclasses.replace(event, old=ref.old)
            reduced += 1
        assert _event_repr(event) == _event_repr(ref)
    return reduced


@st.composite
def same_columns_update(draw: st.DrawFn) -> tuple[bytes, bytes, DecoderOptions]:
    """An update whose old image has the new image's column names (the producers' case), with the
    old columns' flags mostly the new ones' (sometimes not: the key moved), values ordinary or
    hostile, and now and then a column more, fewer, or in another order."""
    options = draw(st.sampled_from(OPTIONS))
    new = draw(GOOD_ROWS.filter(bool))
    name = draw(st.sampled_from(sorted(new)))
    new[name] = {**new[name], "f": new[name]["f"] | 2}  # at least one handle-key column
    old: dict[str, Any] = {}
    for n, col in new.items():
        pick = draw(st.integers(0, 9))
        if pick < 6:  # the column as in the new image, or its value, with or without an h marker
            other = {k: v for k, v in col.items() if k != "h" or pick}
        elif pick < 9:  # another value (and type), the new image's flags
            other = {**draw(good_column()), "f": col["f"]}
        else:  # anything: other flags (the key may move), hostile values
            other = draw(column() | good_column())
        old[n] = other
    change = draw(st.sampled_from(["none"] * 6 + ["more", "fewer", "order"]))
    if change == "more":
        old["zz"] = draw(good_column())
    elif change == "fewer":
        old.pop(name)
    elif change == "order":
        old = dict(reversed(old.items()))
    value = {"u": new, "p": old} if draw(st.integers(0, 5)) else {"p": old, "u": new}
    ascii_only = draw(st.booleans())
    k = dumps({"ts": draw(st.integers(0, 2**64 - 1)), "scm": "s", "tbl": "t", "t": 1})
    return *frame([k], [dumps(value, ascii_only)], options), options


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(same_columns_update() | record())
def test_old_images_reduced_to_their_key_agree_with_the_careful_path(
    case: tuple[bytes, bytes, DecoderOptions],
) -> None:
    assert_reduced_old_images_agree(*case)


def test_old_images_are_reduced_to_their_key_for_what_producers_send() -> None:
    """An update of a keyed row as TiCDC sends it: its old image comes as its key column alone
    (checked against the careful path); an insert, a delete and a keyless update stay whole."""
    row = {
        "c": {"t": 254, "f": 0, "v": "some text"},
        "id": {"t": 3, "h": True, "f": 11, "v": 1},
        "k": {"t": 3, "f": 1, "v": 7},
    }
    keyless = {n: {**col, "f": 0} for n, col in row.items() if n != "id"}
    moved = {**row, "id": {**row["id"], "v": 2}, "c": {**row["c"], "v": "other text"}}
    values = [{"u": row}, {"u": moved, "p": row}, {"d": row}, {"u": keyless, "p": keyless}]
    keys = [dumps({"ts": 10 + i, "scm": "db", "tbl": "tb", "t": 1}) for i in range(len(values))]
    key, value = frame(keys, [dumps(v) for v in values], DecoderOptions())
    assert assert_reduced_old_images_agree(key, value, DecoderOptions()) == 1
    events = decode_record(key, value, topic="tp", partition=1, offset=2, old_keys_only=True)
    assert dict(events[1].old.items()) == {"id": {"t": 3, "f": 11 | FLAG_HANDLE_KEY, "v": 1}}
    assert events[1].new["id"]["v"] == 2  # the new image whole
    assert [type(e.old) for e in events] == [type(None), CompactImage, dict, dict]


# --- the fast path is really taken ------------------------------------------------------------


def test_current_producer_records_never_need_the_careful_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agreement alone would also hold for a fast path that always gives up: check that what
    current TiCDC sends (handle-key h markers, every common type, NULLs, updates with partial old
    images, deletes, partitioned tables, resolved events) stays on the fast path."""
    calls: list[Any] = []
    careful = decoder._careful_event
    monkeypatch.setattr(decoder, "_careful_event", lambda *a: calls.append(a) or careful(*a))
    row = {
        "id": {"t": 3, "h": True, "f": 11, "v": 1},
        "big": {"t": 8, "f": 128, "v": 2**64 - 1},
        "name": {"t": 15, "f": 64, "v": "名前"},
        "bin": {"t": 254, "f": 65, "v": "\\x89PNG\\r\\n"},
        "amount": {"t": 246, "f": 64, "v": "-12.50"},
        "day": {"t": 10, "f": 64, "v": "2024-05-01"},
        "blob": {"t": 252, "f": 65, "v": "AAEC"},
        "text": {"t": 252, "f": 64, "v": "aGk="},
        "score": {"t": 5, "f": 64, "v": 2},
        "json": {"t": 245, "f": 64, "v": "{}"},
        "none": {"t": 12, "f": 64, "v": None},
    }
    keys = [
        {"ts": 10, "scm": "db", "tbl": "tb", "t": 1},
        {"ts": 11, "scm": "db", "tbl": "tb", "t": 1},
        {"ts": 12, "scm": "db", "tbl": "tb", "t": 1, "ptn": 7},
        {"ts": 13, "scm": "db", "tbl": "tb", "t": 1},
        {"ts": 14, "t": 3},
    ]
    values = [{"u": row}, {"u": row, "p": {"amount": row["amount"]}}, {"d": row}, {"u": row, "p": row}, None]
    docs = [b"" if v is None else dumps(v) for v in values]
    for options in (DecoderOptions(), DecoderOptions(compression="lz4")):
        events = decode_record(
            *frame([dumps(k) for k in keys], docs, options),
            topic="tp",
            partition=1,
            offset=2,
            options=options,
        )
        assert len(events) == 5
        assert events[0].new["bin"]["v"] == b"\x89PNG\r\n" and events[0].new["text"]["v"] == "hi"
        # the new image's values, taken for planning, in column order; a delete has none
        for e in events[:4]:
            want = None if e.new is None else tuple(c["v"] for c in e.new.values())
            assert e.new_values == want
    assert calls == []


def test_events_are_ordinary_instances() -> None:
    """The fast path builds events without calling __init__: they must be indistinguishable."""
    key, value = frame(
        [b'{"ts":7,"scm":"s","tbl":"t","t":1}'], [b'{"u":{"a":{"t":3,"f":2,"v":1}}}'], OPTIONS[0]
    )
    (event,) = decode_record(key, value, topic="tp", partition=1, offset=2)
    expected = RowEvent(
        7, "s", "t", RowKind.INSERT, {"a": {"t": 3, "f": 2, "v": 1}}, None, None, Position("tp", 1, 2, 0)
    )
    assert event == expected and repr(event) == repr(expected)
    assert type(event) is RowEvent and type(event.pos) is Position
    assert event.new_values == (1,) and expected.new_values is None  # not part of the identity


def test_long_strings_and_many_names_stay_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strings longer than the fast path's stack buffer (escaped or not), and more distinct column
    names than its name cache holds, some too long for it: same events, and no careful path."""
    calls: list[Any] = []
    careful = decoder._careful_event
    monkeypatch.setattr(decoder, "_careful_event", lambda *a: calls.append(a) or careful(*a))
    text = 'é中 \\x89"\n\u2028😀' * 700
    raw = bytes(range(256)) * 30
    row = {
        "text": {"t": 15, "f": 0, "v": text},
        "quoted": {"t": 254, "f": 1, "v": "\\x89PNG\\r\\n\\u00e9\\377" * 800},
        "blob": {"t": 252, "f": 1, "v": base64.b64encode(raw).decode()},
        "clob": {"t": 252, "f": 0, "v": base64.b64encode(text.encode()).decode()},
        "plain": {"t": 12, "f": 0, "v": "x" * 9000},
    }
    names = {f"column {i} " * (1 + i % 12): {"t": 3, "f": 0, "v": i} for i in range(3000)}
    key = dumps({"ts": 5, "scm": "s", "tbl": "t", "t": 1})
    for ascii_only in (False, True):
        docs = [dumps({"u": row}, ascii_only), dumps({"u": names, "p": names}, ascii_only)]
        record = frame([key, key], docs, OPTIONS[0])
        assert_same(*record, OPTIONS[0])
        calls.clear()
        new = decode_record(*record, topic="tp", partition=1, offset=2)[0].new
        assert calls == []
        assert new["text"]["v"] == text and new["blob"]["v"] == raw


# --- compact images (the daemon's row cache) ---------------------------------------------------------

_LAYOUT_COLUMNS = st.lists(
    st.tuples(
        st.sampled_from(["id", "k", "c", "pad"]),
        st.sampled_from([3, 8, 15, 254]),
        st.sampled_from([0, 2, 11, 64, 256]),
    ),
    max_size=4,
    unique_by=lambda col: col[0],
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_LAYOUT_COLUMNS, st.integers()), min_size=1, max_size=12))
def test_compact_images_read_as_their_images_and_share_a_layout_only_when_it_is_equal(rows: list) -> None:
    """Images of random layouts (the same names with other types or flags, as after a DDL), all
    compacted with one shape cache as a listener does: each reads as the image it stands for, and
    an image shares a layout object only with images of equal names, types and flags."""
    shapes: dict = {}
    made = []
    for columns, seed in rows:
        image = {name: {"t": t, "f": f, "v": seed + i} for i, (name, t, f) in enumerate(columns)}
        values = tuple(c["v"] for c in image.values())
        compact = compact_image(image, values, shapes)
        assert type(compact) is CompactImage and compact == image and dict(compact.items()) == image
        assert compact.shape.layout == tuple((c["t"], c["f"]) for c in image.values())
        assert compact.shape.names == tuple(image) and compact.column_values is values
        assert compact.shape.key_names == tuple(n for n, c in image.items() if c["f"] & FLAG_HANDLE_KEY)
        made.append(compact)
    assert shapes[tuple(made[-1])] is made[-1].shape
    for a in made:
        for b in made:
            if a.shape is b.shape:
                assert (a.shape.names, a.shape.layout) == (b.shape.names, b.shape.layout)


_INT_LAYOUT_COLUMNS = st.lists(
    st.tuples(
        st.sampled_from(["id", "k", "c", "pad"]),
        st.sampled_from([1, 2, 3, 8]),  # integer types: every value below is valid for each
        st.sampled_from([0, 2, 11, 64, 256]),
    ),
    max_size=4,
    unique_by=lambda col: col[0],
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_INT_LAYOUT_COLUMNS, st.integers(0, 100), st.sampled_from(["t1", "t2"])),
        min_size=1,
        max_size=12,
    )
)
def test_the_fast_path_gives_keyed_new_images_compact_with_a_layout_shared_only_when_equal(
    rows: list,
) -> None:
    """New images of random layouts (the same names with other types or flags, as after a DDL; two
    tables), decoded one record after another as the daemon does: a keyed one comes compact and
    reads as the image sent, a keyless one as a dict, and images share a layout object only when
    their names, types and flags are equal (the decoder keeps its layouts across records)."""
    made = []
    for columns, seed, table in rows:
        image = {name: {"t": t, "f": f, "v": seed + i} for i, (name, t, f) in enumerate(columns)}
        key, value = frame(
            [dumps({"ts": 1, "scm": "s", "tbl": table, "t": 1})], [dumps({"u": image})], OPTIONS[0]
        )
        (event,) = decode_record(key, value, topic="tp", partition=1, offset=2)
        keyed = any(c["f"] & FLAG_HANDLE_KEY for c in image.values())
        assert type(event.new) is (CompactImage if keyed else dict)
        assert event.new == image and [(n, c["t"], c["f"], c["v"]) for n, c in event.new.items()] == [
            (n, c["t"], c["f"], c["v"]) for n, c in image.items()
        ]
        if keyed:
            assert event.new.column_values is event.new_values
            made.append(event.new)
    for a in made:
        for b in made:
            if a.shape is b.shape:
                assert (a.shape.names, a.shape.layout) == (b.shape.names, b.shape.layout)

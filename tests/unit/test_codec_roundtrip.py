"""Property tests: decode(encode(x)) == x with a small encoder written here, independently of the
decoder (Go strconv.Quote-style escaping, base64, old and new column shapes, framing, compression).
"""

from __future__ import annotations

import base64
import string
import struct
from dataclasses import dataclass
from typing import Any

import cramjam
import orjson
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import (
    FLAG_BINARY,
    FLAG_HANDLE_KEY,
    DDLEvent,
    Position,
    ResolvedEvent,
    RowEvent,
    RowKind,
)
from sqlgen.ddl_guard import ALWAYS_RESERVED
from sqlgen.quoting import quote_ident

# --- the independent encoder -------------------------------------------------------------------

NAMED_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _utf8_rune_at(raw: bytes, i: int) -> tuple[str, int] | None:
    """The valid UTF-8 character starting at raw[i] and its length, or None."""
    lead = raw[i]
    size = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4
    try:
        ch = raw[i : i + size].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return (ch, size) if len(ch) == 1 else None


def go_quote(raw: bytes, *, octal: bool = False, upper_hex: bool = False) -> str:
    """Like Go's strconv.Quote without the outer quotes: printable characters kept, named escapes,
    other bytes \\xNN (or, as the decoder also accepts, octal \\NNN), non-printable characters
    \\uXXXX / \\UXXXXXXXX."""

    def byte_escape(b: int) -> str:
        if octal:
            return f"\\{b:03o}"
        return f"\\x{b:02X}" if upper_hex else f"\\x{b:02x}"

    out: list[str] = []
    i = 0
    while i < len(raw):
        rune = _utf8_rune_at(raw, i)
        if rune is None:
            out.append(byte_escape(raw[i]))
            i += 1
            continue
        ch, size = rune
        i += size
        cp = ord(ch)
        if ch in NAMED_ESCAPES:
            out.append(NAMED_ESCAPES[ch])
        elif ch == "\\" or ch == '"':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif cp < 0x80:
            out.append(byte_escape(cp))
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    return "".join(out)


def frame(key_docs: list[bytes], value_docs: list[bytes]) -> tuple[bytes, bytes]:
    key = struct.pack(">q", 1) + b"".join(struct.pack(">q", len(d)) + d for d in key_docs)
    return key, b"".join(struct.pack(">q", len(d)) + d for d in value_docs)


def b64(raw: bytes) -> str:
    return base64.standard_b64encode(raw).decode("ascii")


# --- strategies: (wire column, expected decoded column) ----------------------------------------


@dataclass
class Style:
    legacy_strings: bool  # DecoderOptions.legacy_base64_strings
    octal: bool
    upper_hex: bool


INT64 = st.integers(-(2**63), 2**63 - 1)
UINT64 = st.integers(0, 2**64 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
DATETIMES = st.datetimes().map(lambda d: d.isoformat(" "))


@st.composite
def column(draw: st.DrawFn, style: Style) -> tuple[dict[str, Any], dict[str, Any]]:
    """One column: its wire JSON object and the Column dict the decoder must produce."""
    kind = draw(
        st.sampled_from(
            [
                "int",
                "uint",
                "bit",
                "float",
                "decimal",
                "time",
                "text",
                "binary",
                "blob",
                "textblob",
                "json",
                "null",
            ]
        )
    )
    flags = draw(st.integers(0, 255)) & ~(FLAG_BINARY | FLAG_HANDLE_KEY)
    binary = False
    if kind == "int":
        t, v = draw(st.sampled_from([1, 2, 3, 8, 9, 13, 247, 248])), draw(INT64)
        wire, expected = v, v
    elif kind == "uint":
        t, v = 8, draw(UINT64)
        wire, expected = v, v
    elif kind == "bit":
        t, v = 16, draw(UINT64)
        wire, expected = v, v
    elif kind == "float":
        t = draw(st.sampled_from([4, 5]))
        wire = draw(FINITE | st.integers(-(2**53), 2**53))
        expected = float(wire)
    elif kind == "decimal":
        t = 246
        d = draw(st.decimals(allow_nan=False, allow_infinity=False, places=draw(st.integers(0, 30))))
        wire = expected = format(d, "f")
    elif kind == "time":
        t = draw(st.sampled_from([7, 10, 11, 12, 14]))
        wire = expected = draw(
            DATETIMES | st.sampled_from(["-838:59:59", "0000-00-00 00:00:00", "2000-01-01"])
        )
    elif kind == "text":
        t = draw(st.sampled_from([15, 253, 254]))
        text = draw(st.text(max_size=40))
        wire = b64(text.encode()) if style.legacy_strings else text
        expected = text
    elif kind == "binary":
        t, binary = draw(st.sampled_from([15, 253, 254])), True
        raw = draw(st.binary(max_size=40) | st.text(max_size=20).map(str.encode))
        wire = (
            b64(raw) if style.legacy_strings else go_quote(raw, octal=style.octal, upper_hex=style.upper_hex)
        )
        expected = raw
    elif kind == "blob":
        t, binary = draw(st.sampled_from([249, 250, 251, 252])), True
        raw = draw(st.binary(max_size=60))
        wire, expected = b64(raw), raw
    elif kind == "textblob":
        t = draw(st.sampled_from([249, 250, 251, 252]))
        text = draw(st.text(max_size=40))
        wire, expected = b64(text.encode()), text
    elif kind == "json":
        t = draw(st.sampled_from([245, 225]))
        wire = expected = orjson.dumps(draw(st.dictionaries(st.text(max_size=5), INT64, max_size=3))).decode()
    else:
        t = draw(st.sampled_from([1, 3, 6, 8, 12, 15, 246, 252, 254]))
        wire = expected = None
    handle = draw(st.booleans())
    if binary:
        flags |= FLAG_BINARY
    if handle:
        flags |= FLAG_HANDLE_KEY
    # Column shape: current (t, h on handle keys, f, v), minimal (t, f, v) or old (t, h, v: no f,
    # which also means no binary flag).
    shape = draw(st.sampled_from(["current", "minimal", "old"] if not binary else ["current", "minimal"]))
    if shape == "old":
        wire_col: dict[str, Any] = {"t": t, "v": wire}
        if handle or draw(st.booleans()):
            wire_col = {"t": t, "h": handle, "v": wire}
        flags = FLAG_HANDLE_KEY if handle else 0
    elif shape == "current" and handle:
        wire_col = {"t": t, "h": True, "f": flags, "v": wire}
    else:
        wire_col = {"t": t, "f": flags, "v": wire}
    if t == 6:
        expected = None
    return wire_col, {"t": t, "f": flags, "v": expected}


NAMES = st.text(min_size=1, max_size=8)


@st.composite
def row_image(draw: st.DrawFn, style: Style) -> tuple[dict[str, Any], dict[str, Any]]:
    names = draw(st.lists(NAMES, min_size=0, max_size=8, unique=True))
    wire, expected = {}, {}
    for name in names:
        wire[name], expected[name] = draw(column(style))
    return wire, expected


@st.composite
def event(draw: st.DrawFn, style: Style) -> tuple[dict[str, Any], dict[str, Any] | None, Any]:
    """(key object, value object or None, a function pos -> expected event)."""
    ts = draw(UINT64)
    scm, tbl = draw(st.text(max_size=6)), draw(st.text(max_size=6))
    key: dict[str, Any] = {"ts": ts}
    if scm or draw(st.booleans()):
        key["scm"] = scm
    if tbl or draw(st.booleans()):
        key["tbl"] = tbl
    what = draw(st.sampled_from(["insert", "update", "partial-update", "delete", "ddl", "resolved"]))
    if what == "resolved":
        key = {"ts": ts, "t": 3}
        return key, None, lambda pos: ResolvedEvent(ts, pos)
    if what == "ddl":
        key["t"] = 2
        # DDL text must be the DDL its event describes (sqlgen.ddl_guard): a comment change of
        # the key's table, under a known and an unknown type code.
        assume(scm.casefold() not in ALWAYS_RESERVED)
        comment = draw(st.text(alphabet=string.ascii_letters + " ", max_size=20))
        q = f"ALTER TABLE {quote_ident(tbl)} COMMENT = '{comment}'"
        ddl_type = draw(st.sampled_from([17, 999]))
        return key, {"q": q, "t": ddl_type}, lambda pos: DDLEvent(ts, scm, tbl, q, ddl_type, pos)
    key["t"] = 1
    ptn = draw(st.none() | INT64)
    if ptn is not None:
        key["ptn"] = ptn
    rid = draw(st.none() | INT64)
    if rid is not None:
        key["rid"] = rid
    new_wire, new = draw(row_image(style))
    if what == "insert":
        value, kind, exp_new, exp_old = {"u": new_wire}, RowKind.INSERT, new, None
    elif what == "delete":
        value, kind, exp_new, exp_old = {"d": new_wire}, RowKind.DELETE, None, new
    elif what == "update":
        old_wire, old = draw(row_image(style))
        # a full old image has the new image's columns (plus, in this test, maybe others)
        for name in new:
            if name not in old:
                old_wire[name], old[name] = new_wire[name].copy(), dict(new[name])
        value, kind, exp_new = {"u": new_wire, "p": old_wire}, RowKind.UPDATE, new
        exp_old = {name: old[name] for name in new} | {n: c for n, c in old.items() if n not in new}
    else:  # only-output-updated-columns: p holds a subset of the columns, with other values
        keep = draw(st.lists(st.sampled_from(sorted(new)), unique=True)) if new else []
        old_wire, old = {}, {}
        for name in keep:
            old_wire[name], old[name] = draw(column(style))
        value, kind, exp_new = {"u": new_wire, "p": old_wire}, RowKind.UPDATE, new
        exp_old = {name: old.get(name, new[name]) for name in new}
    return key, value, lambda pos: RowEvent(ts, scm, tbl, kind, exp_new, exp_old, ptn, pos, rid)


COMPRESSORS = {None: None, "snappy": cramjam.snappy.compress_raw, "lz4": cramjam.lz4.compress}


@st.composite
def record_case(draw: st.DrawFn) -> tuple[DecoderOptions, bytes, bytes, list[Any]]:
    style = Style(draw(st.booleans()), draw(st.booleans()), draw(st.booleans()))
    compression = draw(st.sampled_from(list(COMPRESSORS)))
    events = draw(st.lists(event(style), min_size=1, max_size=16))
    compress = COMPRESSORS[compression]
    keys, values, makers = [], [], []
    for key, value, make in events:
        keys.append(orjson.dumps(key))
        doc = b"" if value is None else orjson.dumps(value)
        if compress is not None and doc:
            doc = bytes(compress(doc))
        values.append(doc)
        makers.append(make)
    k, v = frame(keys, values)
    if all(not d for d in values) and draw(st.booleans()):
        v = b""  # all resolved: the value may be missing entirely
    expected = [make(Position("rt", 5, 99, i)) for i, make in enumerate(makers)]
    options = DecoderOptions(legacy_base64_strings=style.legacy_strings, compression=compression)
    return options, k, v, expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_case())
def test_decode_inverts_encode(case: tuple[DecoderOptions, bytes, bytes, list[Any]]) -> None:
    options, key, value, expected = case
    got = decode_record(key, value, topic="rt", partition=5, offset=99, options=options)
    assert got == expected
    for ev in got:
        for image in (getattr(ev, "new", None), getattr(ev, "old", None)):
            for col in (image or {}).values():
                assert set(col) == {"t", "f", "v"}
                assert type(col["f"]) is int


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.booleans(), st.booleans())
def test_binary_strings_round_trip(raw: bytes, octal: bool, upper_hex: bool) -> None:
    col = {"t": 15, "f": FLAG_BINARY, "v": go_quote(raw, octal=octal, upper_hex=upper_hex)}
    key, value = frame([b'{"ts":1,"scm":"s","tbl":"t","t":1}'], [orjson.dumps({"u": {"c": col}})])
    (ev,) = decode_record(key, value, topic="rt", partition=0, offset=0)
    assert ev.new["c"]["v"] == raw


def test_go_quote_matches_known_go_output() -> None:
    # Known outputs of Go's strconv.Quote (minus quotes), to keep this encoder honest.
    assert go_quote(b"\x89PNG\r\n\x1a\n") == "\\x89PNG\\r\\n\\x1a\\n"
    assert go_quote("中".encode()) == "中"
    assert go_quote(b'a"b\\c') == 'a\\"b\\\\c'
    assert go_quote("\u00a0".encode()) == "\\u00a0"
    assert go_quote(b"\x7f\x00") == "\\x7f\\x00"

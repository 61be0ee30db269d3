"""The simulator's wire format: Go-compatible formatting, then whole records read back.

Expected strings are what Go produces (strconv.Quote documentation, encoding/json rules). Records
are read back with a small reader (its framing: tests/builders.py's split_record) and Go-style
unquoter written from the specification, independent of the project's decoder, and compared with
the events the simulator says it sent.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier.simulator import SimEvent, StreamConfig, simulate
from applier.simulator.golang import Float32, go_float, go_json, go_quote
from tests.builders import decompress_value, split_record

_SHORT = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


def go_unquote(text: str) -> bytes:
    """strconv.Unquote for a quoted body: \\xNN is one byte, \\u/\\U a code point's UTF-8."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        esc = text[i + 1]
        if esc in _SHORT:
            out.append(_SHORT[esc])
            i += 2
        elif esc == "x":
            out.append(int(text[i + 2 : i + 4], 16))
            i += 4
        elif esc == "u":
            out += chr(int(text[i + 2 : i + 6], 16)).encode("utf-8")
            i += 6
        elif esc == "U":
            out += chr(int(text[i + 2 : i + 10], 16)).encode("utf-8")
            i += 10
        else:  # pragma: no cover - would be a bug in go_quote
            raise ValueError(f"bad escape {esc!r}")
    return bytes(out)


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [
        (b"\x89PNG\r\n\x1a\n", "\\x89PNG\\r\\n\\x1a\\n"),  # the example in TiCDC's documentation
        (b"\x07\x08\x0c\n\r\t\x0b", "\\a\\b\\f\\n\\r\\t\\v"),
        (b'say "hi" \\ ok', 'say \\"hi\\" \\\\ ok'),
        (b"\x00\x1b\x7f", "\\x00\\x1b\\x7f"),
        ("é😀漢".encode(), "é😀漢"),  # printable runes stay UTF-8
        ("\u00a0".encode(), "\\u00a0"),  # a space separator other than ASCII space: not printable
        ("\u200b\u2028".encode(), "\\u200b\\u2028"),  # format / line separator
        ("\U000e0001".encode(), "\\U000e0001"),  # non-printable beyond the BMP
        ("\ufffd".encode(), "\ufffd"),  # a real U+FFFD is printable
        (b"\xff\xfe", "\\xff\\xfe"),  # invalid bytes
        (b"\xed\xa0\x80", "\\xed\\xa0\\x80"),  # an encoded surrogate is invalid UTF-8 in Go
        (b"\xc0\x80", "\\xc0\\x80"),  # overlong NUL
        (b"\xe2\x82", "\\xe2\\x82"),  # truncated sequence at the end
        (b"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"),  # above U+10FFFF
        (b"", ""),
    ],
)
def test_go_quote_matches_go(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_go_quote_round_trips_any_bytes(raw: bytes) -> None:
    quoted = go_quote(raw)
    assert go_unquote(quoted) == raw
    # Only escapes and printable characters remain: no raw control characters or quotes.
    assert not any(ord(ch) < 0x20 or ch == "\x7f" for ch in quoted)
    assert '"' not in quoted.replace('\\"', "")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=32))
def test_go_quote_round_trips_valid_utf8(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    assert go_unquote(go_quote(raw)) == raw


@pytest.mark.parametrize(
    ("value", "bits", "text"),
    [
        (1.0, 64, "1"),
        (-0.0, 64, "-0"),
        (0.1, 64, "0.1"),
        (-2.5, 64, "-2.5"),
        (0.30000000000000004, 64, "0.30000000000000004"),
        (1e20, 64, "100000000000000000000"),
        (1e21, 64, "1e+21"),
        (0.000001, 64, "0.000001"),
        (1e-7, 64, "1e-7"),
        (1.5e-300, 64, "1.5e-300"),
        (1.2345678901234567e300, 64, "1.2345678901234567e+300"),
        (123456789.125, 64, "123456789.125"),
        (0.1, 32, "0.1"),  # float32(0.1) prints with float32's shortest digits
        (999.75, 32, "999.75"),
        (16777217.0, 32, "16777216"),  # not representable in float32: rounds like Go's float32()
        (3.4028234663852886e38, 32, "3.4028235e+38"),
    ],
)
def test_go_float(value: float, bits: int, text: str) -> None:
    assert go_float(value, bits) == text


def test_go_float_rejects_nan_and_infinity() -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError):
            go_float(bad)


def test_go_json_is_compact_ordered_and_html_escaped() -> None:
    doc = {
        "z": 1,
        "a": [True, False, None],
        "s": '<a href="x">&\u2028\x01\x08\x0c\n',
        "f": Float32(0.25),
        "u": "é😀",
    }
    out = go_json(doc)
    assert out == (
        b'{"z":1,"a":[true,false,null],"s":"\\u003ca href=\\"x\\"\\u003e\\u0026\\u2028\\u0001\\b\\f\\n",'
        b'"f":0.25,"u":"' + "é😀".encode() + b'"}'
    )
    assert json.loads(out) == {**doc, "f": 0.25}


def test_go_json_big_integers_stay_exact() -> None:
    assert go_json({"v": 2**64 - 1, "w": -(2**63)}) == b'{"v":18446744073709551615,"w":-9223372036854775808}'


def test_go_json_rejects_unknown_types() -> None:
    with pytest.raises(TypeError):
        go_json({"v": object()})


# ---------------------------------------------------------------------------------------------
# Records: read back with a reader written here from the specification, compared with the events.

ALL_TYPE_CODES = {1, 2, 9, 3, 8, 4, 5, 246, 10, 12, 7, 11, 13, 254, 15, 249, 250, 251, 252, 16, 247, 248, 245}
_STRING_CODES = {15, 253, 254}
_BLOB_CODES = {249, 250, 251, 252}


def read_record(key: bytes, value: bytes, compression: str | None) -> list[tuple[dict, dict | None]]:
    """(key JSON, value JSON or None for an empty value) pairs of one record, per docs/open-protocol.md §1."""
    return [
        (json.loads(k), json.loads(decompress_value(v, compression)) if v else None)
        for k, v in split_record(key, value)
    ]


def decode_column(col: dict, legacy: bool) -> tuple[int, int, object]:
    t, v = col["t"], col["v"]
    if legacy:
        assert "f" not in col
        f = 0x02 if col.get("h") else 0
    else:
        f = col["f"]
        assert col.get("h", False) == bool(f & 0x02)
    if v is not None:
        if t in _STRING_CODES:
            if legacy:
                v = base64.b64decode(v, validate=True)
            elif f & 0x01:
                v = go_unquote(v)
        elif t in _BLOB_CODES:
            v = base64.b64decode(v, validate=True)
            if not f & 0x01 and not legacy:
                v = v.decode("utf-8")
    return t, f, v


def comparable(image: dict | None, legacy: bool) -> dict | None:
    """A SimEvent image as the reader above returns it (legacy text arrives as UTF-8 bytes)."""
    if image is None:
        return None
    out = {}
    for name, (t, f, v) in image.items():
        if isinstance(v, str) and legacy and (t in _BLOB_CODES or t in _STRING_CODES):
            v = v.encode("utf-8")
        out[name] = (t, f, v)
    return out


def check_event(ev: SimEvent, key: dict, value: dict | None, legacy: bool) -> None:
    assert key["ts"] == ev.commit_ts
    assert key["t"] == {"row": 1, "ddl": 2, "resolved": 3}[ev.kind]
    if ev.kind == "resolved":
        assert value is None and set(key) == {"ts", "t"}
        return
    assert key["scm"] == ev.schema
    assert key.get("tbl", "") == ev.table
    if ev.kind == "ddl":
        assert value == {"q": ev.ddl_query, "t": ev.ddl_type}
        return
    assert value is not None
    images = {k: {n: decode_column(c, legacy) for n, c in cols.items()} for k, cols in value.items()}
    assert set(images) <= {"u", "p", "d"}
    if ev.row_kind == "delete":
        assert set(images) == {"d"}
        assert images["d"] == comparable(ev.old, legacy)
    else:
        assert images["u"] == comparable(ev.new, legacy)
        assert images.get("p") == comparable(ev.old or None, legacy)


CONFIGS = {
    "default": StreamConfig(seed=5, transactions=80),
    "legacy": StreamConfig(seed=6, transactions=60, legacy_strings=True),
    "only-updated": StreamConfig(seed=7, transactions=60, only_updated_columns=True),
    "delete-handle-only": StreamConfig(seed=8, transactions=60, delete_only_handle_key=True),
    "no-old-value": StreamConfig(seed=9, transactions=60, old_value=False),
    "snappy": StreamConfig(seed=10, transactions=60, compression="snappy"),
    "lz4": StreamConfig(seed=11, transactions=60, compression="lz4", row_ids=True),
    "table-dispatch": StreamConfig(seed=12, transactions=60, dispatcher="table", partitions=3),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_record_reads_back_as_its_events(name: str) -> None:
    cfg = CONFIGS[name]
    sim = simulate(cfg)
    for rec in sim.records:
        pairs = read_record(rec.key, rec.value, cfg.compression)
        assert len(pairs) == len(rec.events)
        for ev, (key, value) in zip(rec.events, pairs, strict=True):
            check_event(ev, key, value, cfg.legacy_strings)


def test_json_field_order_and_sorted_columns_like_go() -> None:
    sim = simulate(StreamConfig(seed=13, transactions=30, row_ids=True))
    seen_rid = False
    for rec in sim.records:
        for raw, _ in split_record(rec.key, rec.value):
            fields = list(json.loads(raw))
            order = ["ts", "scm", "tbl", "rid", "t"]
            assert fields == [f for f in order if f in fields]
            seen_rid |= "rid" in fields
            assert b" " not in raw  # compact, like json.Marshal
        for _, value in read_record(rec.key, rec.value, None):
            if value is None or "q" in value:
                continue
            assert list(value) == [k for k in ("u", "p", "d") if k in value]
            for cols in value.values():
                assert list(cols) == sorted(cols)  # Go marshals the column map sorted by name
                for col in cols.values():
                    assert list(col) == [k for k in ("t", "h", "f", "v") if k in col]
    assert seen_rid


def test_resolved_values_are_eight_zero_bytes_and_keys_never_compressed() -> None:
    sim = simulate(StreamConfig(seed=14, transactions=30, compression="lz4"))
    for rec in sim.records:
        if rec.events[0].kind == "resolved":
            assert rec.value == b"\x00" * 8
        assert rec.key[16:17] == b"{"
        if rec.events[0].kind != "resolved":
            assert rec.value[8:12] == b"\x04\x22\x4d\x18"  # the LZ4 frame magic number


def test_legacy_producer_shape() -> None:
    sim = simulate(StreamConfig(seed=15, transactions=60, legacy_strings=True))
    raw = b"".join(r.value for r in sim.records)
    assert b'"f":' not in raw and b'"p":' not in raw
    assert b'"h":true' in raw
    tables = {ev.table for r in sim.records for ev in r.events if ev.kind == "row"}
    assert "keyless" not in tables  # TiCDC needs old values to replicate a table without a key
    for rec in sim.records:
        for (_, value), ev in zip(read_record(rec.key, rec.value, None), rec.events, strict=True):
            if ev.kind == "row" and ev.row_kind == "delete":
                spec = sim.table_spec(ev.table)
                assert spec is not None
                assert set(value["d"]) == set(spec.handle_key)  # no old value: handle key only


def test_all_types_covers_every_storable_type_code() -> None:
    sim = simulate(StreamConfig(seed=16, transactions=300))
    spec = sim.table_spec("all_types")
    assert spec is not None
    assert {c.type_code for c in spec.columns} == ALL_TYPE_CODES
    values: dict[str, set] = {}
    for rec in sim.records:
        for ev in rec.events:
            if ev.kind == "row" and ev.table == "all_types" and ev.new:
                for name, (_, _, v) in ev.new.items():
                    values.setdefault(name, set()).add(v if not isinstance(v, bytes | str) else type(v))
    for name, vals in values.items():
        if spec.column(name).nullable and not spec.column(name).is_generated:
            assert None in vals, f"{name} never NULL"
    for name in ("c_bigint_u", "c_bit"):  # beyond BIGINT's signed range, up to 2**64-1
        assert max(v for v in values[name] if v is not None) >= 2**63
    times = {
        ev.new["c_time"][2]
        for r in sim.records
        for ev in r.events
        if ev.kind == "row" and ev.new and ev.table == "all_types"
    }
    assert any(t and t.startswith("-") for t in times) and any(
        t and int(t.lstrip("-")[:-6]) > 24 for t in times
    )

"""Column values of every type code and flag (docs/open-protocol.md §3-§4), through decode_record.

Each test frames a one-column row event the way TiCDC does and checks the decoded Column dict:
exact ints, floats, exact decimals, strings, bytes from Go-quoted and base64 values, NULLs, flags.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.errors import MalformedRecordError
from applier.codec.events import FLAG_BINARY, FLAG_GENERATED, FLAG_HANDLE_KEY, RowEvent, RowKind
from applier.codec.values import go_unquote
from tests.builders import frame_docs


def decode_row_value(value_json: bytes, options: DecoderOptions | None = None) -> RowEvent:
    key, value = frame_docs([b'{"ts":1,"scm":"s","tbl":"t","t":1}'], [value_json])
    kwargs = {} if options is None else {"options": options}
    (event,) = decode_record(key, value, topic="tp", partition=2, offset=7, **kwargs)
    assert isinstance(event, RowEvent)
    return event


def decode_col(col: dict[str, Any], options: DecoderOptions | None = None) -> dict[str, Any]:
    """Decode ``{"u": {"c": col}}`` and return the decoded column."""
    event = decode_row_value(orjson.dumps({"u": {"c": col}}), options)
    assert event.kind is RowKind.INSERT
    assert event.new is not None
    return dict(event.new["c"])


def decode_col_raw(col_json: bytes) -> dict[str, Any]:
    """Like decode_col, from literal column JSON (for values orjson.dumps cannot write)."""
    event = decode_row_value(b'{"u":{"c":' + col_json + b"}}")
    assert event.new is not None
    return dict(event.new["c"])


def assert_malformed(col: dict[str, Any] | bytes, options: DecoderOptions | None = None) -> None:
    value = b'{"u":{"c":' + col + b"}}" if isinstance(col, bytes) else orjson.dumps({"u": {"c": col}})
    with pytest.raises(MalformedRecordError) as info:
        decode_row_value(value, options)
    err = info.value
    assert (err.topic, err.partition, err.offset, err.index) == ("tp", 2, 7, 0)
    assert "'c'" in err.reason  # the column is named


# --- integers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [1, 2, 3, 8, 9, 13, 16, 247, 248])
@pytest.mark.parametrize("v", [0, 1, -1, 127, 2021, 2**31 - 1])
def test_integer_codes_keep_the_exact_int(code: int, v: int) -> None:
    col = decode_col({"t": code, "f": 0, "v": v})
    assert col == {"t": code, "f": 0, "v": v}
    assert type(col["v"]) is int


@pytest.mark.parametrize(
    "literal, expected",
    [
        (b"18446744073709551615", 2**64 - 1),  # BIGINT UNSIGNED max
        (b"18446744073709551614", 2**64 - 2),
        (b"9223372036854775808", 2**63),
        (b"9223372036854775807", 2**63 - 1),
        (b"-9223372036854775808", -(2**63)),  # BIGINT min
        (b"-1", -1),
    ],
)
def test_bigint_limits_are_exact(literal: bytes, expected: int) -> None:
    col = decode_col_raw(b'{"t":8,"f":128,"v":' + literal + b"}")
    assert col["v"] == expected
    assert type(col["v"]) is int


def test_bit64_max_is_exact() -> None:
    assert decode_col_raw(b'{"t":16,"f":128,"v":18446744073709551615}')["v"] == 2**64 - 1


@pytest.mark.parametrize(
    "literal",
    [
        b"18446744073709551616",  # 2^64
        b"-9223372036854775809",  # -2^63 - 1
        b"123456789012345678901234567890",
        b"1.0",
        b"1e3",
        b'"1"',
        b"true",
        b"false",
        b"[1]",
        b"{}",
    ],
)
def test_integer_code_rejects_what_is_not_a_64_bit_int(literal: bytes) -> None:
    assert_malformed(b'{"t":8,"f":0,"v":' + literal + b"}")


# --- floats ------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [4, 5])
def test_float_codes(code: int) -> None:
    col = decode_col({"t": code, "f": 0, "v": 153.123})
    assert col["v"] == 153.123 and type(col["v"]) is float
    as_int = decode_col_raw(b'{"t":%d,"f":0,"v":2}' % code)  # Go writes 2.0 as 2
    assert as_int["v"] == 2.0 and type(as_int["v"]) is float
    big = decode_col_raw(b'{"t":%d,"f":0,"v":1e+300}' % code)
    assert big["v"] == 1e300


@pytest.mark.parametrize("literal", [b'"1.5"', b"true", b"null-ish"])
def test_float_code_rejects_non_numbers(literal: bytes) -> None:
    if literal == b"null-ish":
        literal = b"[1.5]"
    assert_malformed(b'{"t":5,"f":0,"v":' + literal + b"}")


# --- decimal -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "v",
    [
        "129012.1230000",
        "0",
        "-0.5",
        "12345678901234567890123456789012345.123456789012345678901234567890",
        "-99999999999999999999999999999999999999999999999999999999999999999",
        "0.000000000000000000000000000001",
    ],
)
def test_decimal_stays_an_exact_string(v: str) -> None:
    col = decode_col({"t": 246, "f": 64, "v": v})
    assert col["v"] == v and type(col["v"]) is str


@pytest.mark.parametrize("v", ["", "abc", "1.2.3", "1e5", "NaN", " 1", "1,5", "--1", "١٢"])
def test_decimal_rejects_what_is_not_a_decimal_literal(v: str) -> None:
    assert_malformed({"t": 246, "f": 0, "v": v})


def test_decimal_rejects_a_json_number() -> None:
    assert_malformed(b'{"t":246,"f":0,"v":1.5}')


# --- dates and times, JSON, vector ---------------------------------------------------------------


@pytest.mark.parametrize(
    "code, v",
    [
        (10, "2000-01-01"),
        (14, "2000-01-01"),
        (12, "2015-12-20 23:58:58"),
        (12, "2015-12-20 23:58:58.123456"),
        (12, "0000-00-00 00:00:00"),
        (7, "1973-12-30 15:30:00"),
        (11, "23:59:59"),
        (11, "-838:59:59"),
        (11, "838:59:59.000000"),
        (245, '{"key1": "value1"}'),
        (225, "[1,2,3]"),
    ],
)
def test_textual_codes_keep_the_string(code: int, v: str) -> None:
    assert decode_col({"t": code, "f": 0, "v": v}) == {"t": code, "f": 0, "v": v}


@pytest.mark.parametrize("code", [7, 10, 11, 12, 14, 245, 225, 15, 253, 254])
def test_string_codes_reject_non_strings(code: int) -> None:
    assert_malformed({"t": code, "f": 0, "v": 20000101})


def test_year() -> None:
    assert decode_col({"t": 13, "f": 0, "v": 1970})["v"] == 1970


# --- character strings -------------------------------------------------------------------------


@pytest.mark.parametrize("code", [15, 253, 254])
@pytest.mark.parametrize("v", ["test", "", "中文 ü", "a\\x89b", 'quote " and \\'])
def test_text_strings_are_kept_verbatim(code: int, v: str) -> None:
    # Without the binary flag a backslash is just a backslash: no unescaping.
    col = decode_col({"t": code, "f": 64, "v": v})
    assert col["v"] == v and type(col["v"]) is str


@pytest.mark.parametrize(
    "wire, expected",
    [
        ("\\x89PNG\\r\\n\\x1a\\n", b"\x89PNG\r\n\x1a\n"),
        ("\\xe4\\xb8\\xad", b"\xe4\xb8\xad"),  # three \xNN escapes are three bytes
        ("中", "中".encode()),  # a printable rune is its UTF-8 bytes
        ("\\x00\\x01\\xff", b"\x00\x01\xff"),
        ("\\a\\b\\f\\n\\r\\t\\v\\\\\\\"\\'", b"\a\b\f\n\r\t\v\\\"'"),
        ("\\u00a0", "\u00a0".encode()),  # a non-printable rune: \u is a code point in UTF-8
        ("\\u200b", "\u200b".encode()),
        ("\\U0001f600", "\U0001f600".encode()),
        ("\\U000e0001", "\U000e0001".encode()),
        ("\\101\\377\\000", b"A\xff\x00"),  # octal: one byte each
        ("\\\\x41", b"\\x41"),  # an escaped backslash followed by text
        ("\\\\u00e9", b"\\u00e9"),
        ("plain ascii", b"plain ascii"),
        ("", b""),
        ("\\xAB\\xcd", b"\xab\xcd"),
    ],
)
@pytest.mark.parametrize("code", [15, 253, 254])
def test_binary_strings_undo_go_strconv_quote(code: int, wire: str, expected: bytes) -> None:
    col = decode_col({"t": code, "f": FLAG_BINARY, "v": wire})
    assert col["v"] == expected and type(col["v"]) is bytes


def test_go_unquote_differs_from_unicode_escape() -> None:
    assert go_unquote("\\x89") == b"\x89"
    assert b"\\x89".decode("unicode_escape").encode() == b"\xc2\x89"  # what we must not do


@pytest.mark.parametrize(
    "wire",
    [
        "\\q",
        "\\",  # trailing backslash
        "abc\\",
        "\\x4",
        "\\x4g",
        "\\u12",
        "\\u12x4",
        "\\U0010ffff0",  # fine by itself...
        "\\U00110000",  # beyond U+10FFFF
        "\\ud800",  # a surrogate
        "\\400",  # octal above \377
        "\\12",  # octal needs three digits
        "\\8",
        "\\\n",  # Python's line continuation is not Go
        "\\N{BULLET}",
    ],
)
def test_invalid_escapes_are_malformed(wire: str) -> None:
    if wire == "\\U0010ffff0":
        assert decode_col({"t": 15, "f": 1, "v": wire})["v"] == "\U0010ffff".encode() + b"0"
        return
    assert_malformed({"t": 15, "f": 1, "v": wire})


def test_binary_string_must_be_a_string() -> None:
    assert_malformed({"t": 254, "f": 1, "v": 12})


def test_legacy_base64_strings() -> None:
    opts = DecoderOptions(legacy_base64_strings=True)
    assert decode_col({"t": 15, "v": "YWE="}, opts) == {"t": 15, "f": 0, "v": "aa"}
    assert decode_col({"t": 254, "v": base64.b64encode("中文".encode()).decode()}, opts)["v"] == "中文"
    assert decode_col({"t": 253, "f": 1, "v": base64.b64encode(b"\x89\x00").decode()}, opts)["v"] == (
        b"\x89\x00"
    )
    assert decode_col({"t": 15, "v": base64.b64encode(b"\xff\xfe").decode()}, opts)["v"] == b"\xff\xfe"
    # other codes are untouched by the option
    assert decode_col({"t": 12, "v": "2020-01-01 00:00:00"}, opts)["v"] == "2020-01-01 00:00:00"
    assert decode_col({"t": 252, "f": 0, "v": "YWE="}, opts)["v"] == "aa"


@pytest.mark.parametrize("v", ["YWE", "Y WE=", "YWE=YWE=", "é", 5])
def test_legacy_base64_string_rejects_bad_base64(v: Any) -> None:
    assert_malformed({"t": 15, "v": v}, DecoderOptions(legacy_base64_strings=True))


# --- blobs and texts ---------------------------------------------------------------------------


@pytest.mark.parametrize("code", [249, 250, 251, 252])
def test_blob_and_text(code: int) -> None:
    raw = bytes(range(256))
    assert decode_col({"t": code, "f": 1, "v": base64.b64encode(raw).decode()})["v"] == raw
    text = decode_col({"t": code, "f": 0, "v": "5rWL6K+VdGV4dA=="})  # the docs' example
    assert text["v"] == "测试text" and type(text["v"]) is str
    # a TEXT whose bytes are not UTF-8 keeps its bytes rather than losing them
    assert decode_col({"t": code, "f": 0, "v": base64.b64encode(b"\xff\x00a").decode()})["v"] == b"\xff\x00a"
    assert decode_col({"t": code, "f": 1, "v": ""})["v"] == b""
    assert decode_col({"t": code, "f": 0, "v": ""})["v"] == ""


@pytest.mark.parametrize("v", ["YWE", "Y WE=", "YWE==", "YWE=\n", "@@@@", "é", 7, True])
def test_blob_rejects_bad_base64(v: Any) -> None:
    assert_malformed({"t": 252, "f": 1, "v": v})


# --- NULL, unknown codes -------------------------------------------------------------------------


@pytest.mark.parametrize("code", [1, 3, 4, 8, 12, 15, 16, 245, 246, 247, 252, 254, 6, 225, 999])
def test_null_of_any_type(code: int) -> None:
    assert decode_col({"t": code, "f": 65, "v": None}) == {"t": code, "f": 65, "v": None}


def test_null_type_code() -> None:
    assert decode_col({"t": 6, "f": 0, "v": None})["v"] is None


@pytest.mark.parametrize("v", ["POINT(1 1)", 7, 2.5])
def test_unknown_type_code_keeps_scalars(v: Any) -> None:
    assert decode_col({"t": 230, "f": 0, "v": v})["v"] == v
    assert decode_col({"t": 255, "f": 0, "v": v})["v"] == v  # GEOMETRY: unsupported by TiCDC


@pytest.mark.parametrize("v", [[1], {"a": 1}, True])
def test_unknown_type_code_rejects_non_scalars(v: Any) -> None:
    assert_malformed({"t": 230, "f": 0, "v": v})


@pytest.mark.parametrize("t", ["3", None, [3], {"a": 1}])
def test_type_code_must_be_an_integer(t: Any) -> None:
    # (A JSON 1.0 or true equal to a known code is looked up as that code: the hot loop does not
    # spend a type check on t. No producer writes those, and they behave like the int downstream.)
    assert_malformed({"t": t, "f": 0, "v": 5})


# --- flags and column shape ----------------------------------------------------------------------


def test_flags_are_kept() -> None:
    for f in (0, 1, 2, 4, 8, 11, 46, 85, 128, 255):
        assert decode_col({"t": 3, "f": f, "v": 1})["f"] == f
    gen = decode_col({"t": 3, "f": FLAG_GENERATED | 0x40, "v": 1})
    assert gen["f"] & FLAG_GENERATED


def test_legacy_h_marker_becomes_the_handle_flag() -> None:
    assert decode_col({"t": 3, "h": True, "v": 1}) == {"t": 3, "f": FLAG_HANDLE_KEY, "v": 1}
    assert decode_col({"t": 3, "h": False, "v": 1}) == {"t": 3, "f": 0, "v": 1}
    # current TiCDC sends both; h is dropped and the flag kept
    assert decode_col({"t": 3, "h": True, "f": 11, "v": 1}) == {"t": 3, "f": 11, "v": 1}
    # h true with a flag that lacks the bit: the bit is added
    assert decode_col({"t": 3, "h": True, "f": 8, "v": 1}) == {"t": 3, "f": 8 | FLAG_HANDLE_KEY, "v": 1}
    assert decode_col({"t": 15, "h": True, "f": 1, "v": "\\x01"}) == {"t": 15, "f": 3, "v": b"\x01"}


def test_missing_flags_default_to_zero() -> None:
    assert decode_col({"t": 3, "v": 1}) == {"t": 3, "f": 0, "v": 1}
    assert decode_col({"t": 15, "v": None}) == {"t": 15, "f": 0, "v": None}


def test_extra_column_fields_are_ignored() -> None:
    col = decode_col({"t": 3, "f": 2, "v": 1, "x": "future"})
    assert (col["t"], col["f"], col["v"]) == (3, 2, 1)


@pytest.mark.parametrize(
    "col",
    [
        b"[]",
        b"5",
        b'"x"',
        b"null",
        b'{"f":0,"v":1}',  # no t
        b'{"t":3,"f":0}',  # no v
        b'{"t":3}',
        b'{"t":3,"f":"2","v":1}',
        b'{"t":3,"f":1.0,"v":1}',
        b'{"t":3,"f":null,"v":1}',
        b'{"t":3,"h":"yes","v":1}',
        b'{"t":3,"h":1,"f":2,"v":1}',
    ],
)
def test_malformed_columns(col: bytes) -> None:
    assert_malformed(col)


def test_error_names_the_right_column_after_good_ones() -> None:
    value = b'{"u":{"a":{"t":3,"f":0,"v":1},"b":{"t":3,"h":true,"f":2,"v":2},"bad":{"t":3,"f":0,"v":"x"}}}'
    with pytest.raises(MalformedRecordError) as info:
        decode_row_value(value)
    assert "'bad'" in info.value.reason


def test_a_bad_column_after_an_old_style_column_is_still_reported() -> None:
    value = b'{"u":{"a":{"t":3,"h":true,"v":1},"b":{"t":3,"v":"x"}}}'
    with pytest.raises(MalformedRecordError) as info:
        decode_row_value(value)
    assert "'b'" in info.value.reason


def test_row_image_must_be_an_object() -> None:
    for value in (b'{"u":[1]}', b'{"u":"x"}', b'{"d":5}', b'{"u":{},"p":[]}'):
        with pytest.raises(MalformedRecordError):
            decode_row_value(value)


def test_columns_are_the_parsed_dicts_in_producer_order() -> None:
    event = decode_row_value(
        b'{"u":{"z":{"t":3,"f":0,"v":1},"a":{"t":3,"f":0,"v":2},"m":{"t":3,"f":0,"v":3}}}'
    )
    assert event.new is not None
    assert list(event.new) == ["z", "a", "m"]

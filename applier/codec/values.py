"""Column values: wire form -> what the database needs (docs/open-protocol.md §4).

The rules here are the reference: the decoder's careful path applies them to what orjson parsed,
and its compiled fast path (applier/codec/_fastpath.pyx, which takes its type-code lists from this
module) applies the same rules to the record's bytes. The careful path runs for every event the
fast path gives up on, and for whole streams of old producers, so it is organised for speed too,
around two lookup tables built once per option set (see :class:`ValuePlan`):

* ``plain``: type code -> the Python type the wire value already has when no conversion is
  needed (ints, date/time strings, JSON text, CHAR/VARCHAR text...). The loop only checks
  ``type(v) is expected``, then, for CHAR/VARCHAR codes only, whether the binary flag asks for
  Go-unquoting. A mismatch goes to :func:`coerce_plain` (FLOAT/DOUBLE sent as a JSON integer
  become floats, everything else is malformed).
* ``convs``: type code -> a function ``(v, flags) -> value`` for the codes that always need
  work: base64 BLOB/TEXT, DECIMAL validation, the NULL type, legacy base64 strings.

Columns are the dicts orjson built; they are normalised in place (``f`` added, ``h`` folded into
``f`` and dropped, ``v`` replaced) so no object is allocated per column.

Decisions worth knowing: a TEXT (BLOB code without the binary flag) or legacy string whose bytes
are not valid UTF-8 is kept as ``bytes`` so nothing is lost; integers are exact because orjson
parses every integer in [-2^63, 2^64-1] as ``int`` (anything beyond becomes a float, which the
type check rejects); DECIMAL stays the producer's string, checked to be a decimal literal.
"""

from __future__ import annotations

import binascii
import codecs
import re
from collections.abc import Callable
from typing import Any

from applier.codec.events import FLAG_BINARY, FLAG_HANDLE_KEY, Row
from applier.codec.problem import Problem

Conv = Callable[[Any, int], Any]

# Type codes (docs/open-protocol.md §4).
TINYINT, SMALLINT, INT, FLOAT, DOUBLE, NULL, TIMESTAMP, BIGINT, MEDIUMINT = 1, 2, 3, 4, 5, 6, 7, 8, 9
DATE, TIME, DATETIME, YEAR, NEWDATE, VARCHAR, BIT = 10, 11, 12, 13, 14, 15, 16
VECTOR, JSON, DECIMAL, ENUM, SET = 225, 245, 246, 247, 248
TINYBLOB, MEDIUMBLOB, LONGBLOB, BLOB, VAR_STRING, STRING, GEOMETRY = 249, 250, 251, 252, 253, 254, 255

INT_CODES = (TINYINT, SMALLINT, INT, BIGINT, MEDIUMINT, YEAR, BIT, ENUM, SET)
FLOAT_CODES = (FLOAT, DOUBLE)
TEXTUAL_CODES = (TIMESTAMP, DATE, TIME, DATETIME, NEWDATE, JSON, VECTOR)
STRING_CODES = (VARCHAR, VAR_STRING, STRING)
BLOB_CODES = (TINYBLOB, MEDIUMBLOB, LONGBLOB, BLOB)


# --- Go strconv.Quote (without the outer quotes) -> bytes --------------------------------------

# A backslash followed by anything but the escapes that CPython's bytes-literal decoder handles
# exactly like Go (\xNN as one byte, \a \b \f \n \r \t \v \\ \" \'). What Go's strconv.Quote
# writes for ordinary binary data never matches, so such values take the C-speed path. It may
# also fire on the second backslash of an escaped backslash followed by a letter (the text
# \\u), which only costs speed: the slow path decodes it correctly.
# A malformed \x escape or a trailing backslash makes the C decoder raise, which is what we want.
_NEEDS_SLOW_PATH = re.compile(rb"\\[^abfnrtvx\\\"']")
_ESCAPE = re.compile(rb"\\(?:(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|[abfnrtv\\\"'])|)")
_SIMPLE_ESCAPES = {
    ord("a"): b"\a",
    ord("b"): b"\b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("v"): b"\v",
    ord("\\"): b"\\",
    ord('"'): b'"',
    ord("'"): b"'",
}
_escape_decode = codecs.escape_decode  # C implementation of bytes-literal escapes


def _replace_escape(m: re.Match[bytes]) -> bytes:
    body = m.group(1)
    if body is None:
        raise Problem("invalid escape sequence in a binary string", m.string[m.start() : m.start() + 12])
    lead = body[0]
    if lead == 0x78:  # \xNN: one byte, never a code point
        return bytes((int(body[1:], 16),))
    if lead == 0x75 or lead == 0x55:  # \uXXXX, \UXXXXXXXX: a code point, written as UTF-8
        cp = int(body[1:], 16)
        if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
            raise Problem("escape is not a valid Unicode code point", m.group())
        return chr(cp).encode("utf-8")
    if 0x30 <= lead <= 0x37:  # \NNN octal: one byte
        n = int(body, 8)
        if n > 0xFF:
            raise Problem("octal escape above \\377", m.group())
        return bytes((n,))
    return _SIMPLE_ESCAPES[lead]


def go_unquote(s: str) -> bytes:
    """Bytes of a BINARY/VARBINARY value written with Go's ``strconv.Quote`` minus the quotes.

    Printable characters stand for their UTF-8 bytes; ``\\xNN`` and octal ``\\NNN`` are one byte
    each; ``\\uXXXX``/``\\UXXXXXXXX`` are a code point in UTF-8. Python's ``unicode_escape``
    would turn ``\\x89`` into U+0089 (two bytes in UTF-8), so it cannot be used. Any other
    backslash sequence is malformed input.
    """
    if "\\" not in s:
        return s.encode("utf-8")
    raw = s.encode("utf-8")
    if _NEEDS_SLOW_PATH.search(raw) is None:
        try:
            return _escape_decode(raw)[0]
        except ValueError as e:
            raise Problem(f"invalid escape sequence in a binary string ({e})", raw) from None
    return _ESCAPE.sub(_replace_escape, raw)


# --- converters (v is never None here) ---------------------------------------------------------

_a2b_base64 = binascii.a2b_base64
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_decimal_match = _DECIMAL.fullmatch


def _text_or_bytes(raw: bytes) -> str | bytes:
    """Text from a non-binary column. Invalid UTF-8 is kept as bytes: the database then receives
    exactly what upstream stored instead of a lossy replacement."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _unbase64(v: Any, what: str) -> bytes:
    """Standard base64 with padding, strictly (as Go's StdEncoding decodes it)."""
    try:
        return _a2b_base64(v, strict_mode=True)
    except (ValueError, TypeError) as e:  # binascii.Error, non-ASCII text, not a string
        raise Problem(f"{what} value is not a base64 JSON string ({e})", repr(v)) from None


def conv_legacy_string(v: Any, f: int) -> str | bytes:
    """TiCDC < v4.0.5 sent CHAR/VARCHAR as base64; binary columns stay bytes."""
    raw = _unbase64(v, "legacy base64 string")
    if f & FLAG_BINARY:
        return raw
    return _text_or_bytes(raw)


def conv_blob(v: Any, f: int) -> str | bytes:
    """BLOB/TEXT: base64 on the wire for both; TEXT (no binary flag) becomes str when valid UTF-8."""
    try:  # _unbase64 inlined: this is the hot path of every BLOB/TEXT column
        raw = _a2b_base64(v, strict_mode=True)
    except (ValueError, TypeError) as e:
        raise Problem(f"BLOB/TEXT value is not a base64 JSON string ({e})", repr(v)) from None
    if f & FLAG_BINARY:
        return raw
    return _text_or_bytes(raw)


def conv_decimal(v: Any, f: int) -> str:
    """DECIMAL stays an exact decimal string; it is validated so garbage never reaches SQL."""
    if type(v) is not str or _decimal_match(v) is None:
        raise Problem("DECIMAL value is not a decimal literal", repr(v))
    return v


def conv_null(v: Any, f: int) -> None:
    return None


def coerce_plain(t: int, v: Any) -> Any:
    """Slow path of a ``plain`` code whose wire value has an unexpected Python type.

    Only FLOAT/DOUBLE sent as a JSON integer (Go writes 1.0 as ``1``) is legitimate; every other
    mismatch (a str for INT, a bool, an integer orjson could only give as float because it is
    beyond 64 bits) is malformed.
    """
    if t in FLOAT_CODES and type(v) is int:
        return float(v)
    if t in INT_CODES:
        if type(v) is float:
            # orjson gives integers beyond [-2^63, 2^64-1] as floats: say so, the repr misleads
            raise Problem(f"type {t} value is a fraction or beyond the 64-bit integer range", repr(v))
        raise Problem(f"type {t} value is not an integer", repr(v))
    if t in FLOAT_CODES:
        raise Problem(f"type {t} value is not a number", repr(v))
    raise Problem(f"type {t} value is not a JSON string", repr(v))


def coerce_unknown(t: Any, v: Any) -> Any:
    """Unknown type codes (newer TiDB types): pass scalars through rather than stop the stream."""
    if type(t) is not int:
        raise Problem("column type code t is not an integer", repr(t))
    tv = type(v)
    if tv is str or tv is int or tv is float:
        return v
    raise Problem(f"value of unknown type code {t} is not a string or number", repr(v))


class ValuePlan:
    """The per-option lookup tables of the hot loop (see module docstring)."""

    __slots__ = ("convs", "plain")

    def __init__(self, *, legacy_base64_strings: bool) -> None:
        plain: dict[int, type] = {}
        for code in INT_CODES:
            plain[code] = int
        for code in FLOAT_CODES:
            plain[code] = float
        for code in TEXTUAL_CODES:
            plain[code] = str
        convs: dict[int, Conv] = {DECIMAL: conv_decimal, NULL: conv_null}
        for code in BLOB_CODES:
            convs[code] = conv_blob
        for code in STRING_CODES:
            if legacy_base64_strings:
                convs[code] = conv_legacy_string
            else:
                # Text strings need no work; binary ones are recognised by the flag check
                # that follows the type check in normalize_row (see _GO_QUOTED).
                plain[code] = str
        self.plain = plain
        self.convs = convs


_GO_QUOTED = frozenset(STRING_CODES)


def _convert(col: dict[str, Any], t: Any, v: Any, f: int, plan: ValuePlan) -> None:
    """Store the database value of a non-null ``v`` (careful path; same rules as the fast loop)."""
    expected = plan.plain.get(t)
    if expected is not None and type(v) is expected:
        if f & FLAG_BINARY and t in _GO_QUOTED:
            col["v"] = go_unquote(v)
        return
    conv = plan.convs.get(t)
    if conv is not None:
        col["v"] = conv(v, f)
    elif expected is not None:
        col["v"] = coerce_plain(t, v)
    else:
        col["v"] = coerce_unknown(t, v)


def _normalize_column(col: Any, plan: ValuePlan) -> None:
    """Careful, fully checked normalisation of one column, with precise error reasons.

    Handles every shape the fast loop does not: old producers without ``f`` (and their ``h``
    marker), extra fields, and anything malformed. It may run on a column the fast loop already
    half-processed (``h`` folded into ``f``); that is harmless because ``v`` is only ever
    replaced as the very last step.
    """
    if type(col) is not dict:
        raise Problem("column is not a JSON object", repr(col))
    if "t" not in col:
        raise Problem("column has no type code t", repr(col))
    if "v" not in col:
        raise Problem("column has no value v", repr(col))
    f = col.get("f", 0)
    if not isinstance(f, int):
        raise Problem("column flags f is not an integer", repr(f))
    h = col.pop("h", None)
    if h is not None:
        if type(h) is not bool:
            raise Problem("column handle marker h is not a boolean", repr(h))
        if h:
            f |= FLAG_HANDLE_KEY
    col["f"] = f
    v = col["v"]
    if v is not None:
        _convert(col, col["t"], v, f, plan)


def normalize_row(row: Any, plan: ValuePlan) -> Row:
    """Validate and convert one row image in place; return it typed as a Row.

    The fast loop is written for CPython's speed: subscripts instead of checks for presence, one
    dict lookup and one identity check for the common columns, conversions only for the codes
    that need them, and ``f & 1`` doubling as the check that ``f`` is an integer. Whatever it
    does not handle raises (KeyError, TypeError...) and the rest of the row, from that column
    on, goes through the careful :func:`_normalize_column`, which either copes (old producers
    without ``f``) or raises a precise Problem. try/except costs nothing until it fires
    (CPython >= 3.11).
    """
    if type(row) is not dict:
        raise Problem("row image is not a JSON object", repr(row))
    plain_get = plan.plain.get
    conv_get = plan.convs.get
    quoted = _GO_QUOTED
    col: Any = None
    try:
        for col in row.values():
            f = col["f"]
            t = col["t"]
            v = col["v"]
            if len(col) != 3:
                # Current TiCDC still marks handle-key columns with "h": true next to f (which
                # then already has the handle bit); anything else goes the careful way.
                if len(col) != 4 or col.get("h") is not True:
                    raise LookupError("not a {t, f, v} column")
                del col["h"]
                if not f & FLAG_HANDLE_KEY:
                    f |= FLAG_HANDLE_KEY
                    col["f"] = f
            binary = f & FLAG_BINARY
            if type(v) is plain_get(t):
                if binary and t in quoted:
                    col["v"] = go_unquote(v)
                continue
            if v is None:
                continue
            conv = conv_get(t)
            if conv is not None:
                col["v"] = conv(v, f)
            else:
                _convert(col, t, v, f, plan)
    except Problem as e:
        raise Problem(f"column {_column_name(row, col)!r}: {e.reason}", e.excerpt) from e
    except Exception:
        _normalize_rest(row, col, plan)
    return row


def _normalize_rest(row: dict[str, Any], failed: Any, plan: ValuePlan) -> None:
    """Careful path for the columns from ``failed`` (where the fast loop gave up) to the end."""
    started = False
    for name, col in row.items():
        if not started:
            if col is not failed:
                continue
            started = True
        try:
            _normalize_column(col, plan)
        except Problem as e:
            raise Problem(f"column {name!r}: {e.reason}", e.excerpt) from e
        except MemoryError:  # not the input's fault (see applier.codec.decoder)
            raise
        except Exception as e:
            raise Problem(f"column {name!r}: {type(e).__name__}: {e}", repr(col)) from e


def _column_name(row: dict[str, Any], col: Any) -> str | None:
    for name, c in row.items():
        if c is col:
            return name
    return None


def fill_old(old: Row, new: Row) -> Row:
    """``only-output-updated-columns``: ``p`` omits unchanged columns, so take them from ``u``.

    Copies are made so that a later in-place change to one image never leaks into the other. The
    result follows the new image's column order; columns only in ``p`` are kept at the end.
    """
    filled: Row = {}
    for name, col in new.items():
        prev = old.get(name)
        filled[name] = prev if prev is not None else col.copy()  # type: ignore[assignment]
    for name, col in old.items():
        if name not in filled:
            filled[name] = col
    return filled

"""Byte-exact imitations of the Go standard-library formatting TiCDC's encoder relies on.

TiCDC is written in Go and builds Open Protocol messages with ``encoding/json`` and
``strconv.Quote``. A consumer that only ever sees Python's ``json.dumps`` output would never meet
Go's quirks (``<`` written as ``\\u003c``, ``1.0`` written as ``1``, binary strings escaped with
``\\xNN``), so the simulator reproduces them here, written from the Go documentation and observed
behaviour:

* :func:`go_quote` - ``strconv.Quote`` without the outer quotes, used for BINARY/VARBINARY values;
* :func:`go_float` - how ``encoding/json`` prints a float64 or float32;
* :func:`go_json` - ``json.Marshal`` for the plain values the encoder builds (dicts keep the order
  the caller gives them; Go sorts map keys, so callers sort where TiCDC uses a map);
* :func:`go_json_fields` - an object written field by field, as TiCDC v9's JSON writer does,
  which may repeat a field name.
"""

from __future__ import annotations

import math
import re
import struct
import unicodedata
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

__all__ = ["Float32", "go_float", "go_json", "go_json_fields", "go_quote", "go_string"]

_HEX = "0123456789abcdef"

# Single-character escapes strconv.Quote uses (besides the quote and the backslash).
_QUOTE_SHORT = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v"}


def _is_go_printable(ch: str) -> bool:
    """Go's ``unicode.IsPrint``: letters, marks, numbers, punctuation, symbols and ASCII space.

    Python's Unicode tables may be a version older than Go's; code points assigned only in the
    newer version are escaped here and kept by Go. That changes the escaping, never the bytes a
    decoder recovers, and the workload does not use such code points.
    """
    if ch == " ":
        return True
    return unicodedata.category(ch)[0] in "LMNPS"


def _utf8_sequence_length(lead: int) -> int:
    """Length a UTF-8 lead byte announces, 0 when it cannot start a sequence."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def go_quote(data: bytes) -> str:
    """``strconv.Quote(string(data))`` without the surrounding double quotes.

    Go walks the bytes rune by rune: an invalid UTF-8 byte (including surrogate halves, overlong
    forms and truncated sequences) becomes ``\\xNN`` and consumes one byte; a printable rune is
    kept as UTF-8; ``\\a \\b \\f \\n \\r \\t \\v \\\\ \\"`` use their short forms; other runes below
    U+0020 and U+007F become ``\\xNN``; remaining non-printable runes become ``\\uXXXX`` or
    ``\\UXXXXXXXX``. Hex digits are lower case, as in Go.
    """
    out: list[str] = []
    i = 0
    n = len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            if b == 0x22:
                out.append('\\"')
            elif b == 0x5C:
                out.append("\\\\")
            elif 0x20 <= b < 0x7F:
                out.append(chr(b))
            elif b in _QUOTE_SHORT:
                out.append(_QUOTE_SHORT[b])
            else:
                out.append("\\x" + _HEX[b >> 4] + _HEX[b & 0xF])
            i += 1
            continue
        width = _utf8_sequence_length(b)
        rune = None
        if width and i + width <= n:
            try:
                # Python's strict decoder rejects exactly what Go's utf8.DecodeRune rejects:
                # overlong forms, surrogates and code points above U+10FFFF.
                rune = data[i : i + width].decode("utf-8")
            except UnicodeDecodeError:
                rune = None
        if rune is None:
            out.append("\\x" + _HEX[b >> 4] + _HEX[b & 0xF])
            i += 1
            continue
        cp = ord(rune)
        if _is_go_printable(rune):
            out.append(rune)
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
        i += width
    return "".join(out)


class Float32(float):
    """A float that ``go_json`` prints as a Go ``float32`` (TiCDC sends FLOAT columns as float32)."""

    __slots__ = ()


def _shortest_float32_digits(value: float) -> str:
    """Shortest decimal string that reads back as the same float32 (Go's 'g', -1, 32)."""
    target = struct.unpack("<f", struct.pack("<f", value))[0]
    for precision in range(1, 10):
        text = f"{target:.{precision}g}"
        try:
            if struct.unpack("<f", struct.pack("<f", float(text)))[0] == target:
                return text
        except OverflowError:  # rounded up beyond float32's range near its maximum
            continue
    return repr(target)  # pragma: no cover - 9 significant digits always round-trip a float32


def go_float(value: float, bits: int = 64) -> str:
    """Format a float the way Go's ``encoding/json`` does.

    Shortest round-trip digits; plain notation for 1e-6 <= |x| < 1e21 (so ``1.0`` is ``1`` and
    ``1e20`` is ``100000000000000000000``), otherwise exponent notation with at least two exponent
    digits, except that a negative one-digit exponent loses its zero (``1e-7``, ``1e+21``).
    NaN and infinities are rejected, as Go's ``json.Marshal`` rejects them.
    """
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"JSON cannot carry {value!r}")
    digits = _shortest_float32_digits(value) if bits == 32 else repr(float(value))
    dec = Decimal(digits)
    magnitude = abs(dec)
    if magnitude != 0 and (magnitude < Decimal("1e-6") or magnitude >= Decimal("1e21")):
        sign, coefficient, exponent = dec.normalize().as_tuple()
        mantissa_digits = "".join(str(d) for d in coefficient)
        exp10 = exponent + len(mantissa_digits) - 1  # type: ignore[operator]
        mantissa = mantissa_digits[0] + ("." + mantissa_digits[1:] if len(mantissa_digits) > 1 else "")
        exp_text = f"{exp10:+03d}"
        if exp_text.startswith("-0"):
            exp_text = "-" + exp_text[2:]
        return ("-" if sign else "") + mantissa + "e" + exp_text
    text = format(dec.normalize(), "f")
    return text


# encoding/json escapes these in strings: control characters, the quote, the backslash, the HTML
# characters < > & (HTMLEscape is on for json.Marshal) and the JavaScript line terminators.
_JSON_ESCAPE_RE = re.compile('[\x00-\x1f"\\\\<>&\u2028\u2029]')
_JSON_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _json_escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    short = _JSON_SHORT.get(ch)
    if short is not None:
        return short
    return f"\\u{ord(ch):04x}"


def go_string(text: str) -> str:
    """A JSON string literal as Go's ``encoding/json`` writes it (quotes included)."""
    return '"' + _JSON_ESCAPE_RE.sub(_json_escape, text) + '"'


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(go_string(value))
    elif isinstance(value, Float32):
        out.append(go_float(value, 32))
    elif isinstance(value, float):
        out.append(go_float(value, 64))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(go_string(key))
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"go_json cannot encode {type(value).__name__}")


def go_json(value: Any) -> bytes:
    """Compact JSON like Go's ``json.Marshal``: no spaces, dict order as given, UTF-8 bytes."""
    out: list[str] = []
    _write(value, out)
    return "".join(out).encode("utf-8")


def go_json_fields(fields: Sequence[tuple[str, Any]]) -> bytes:
    """A compact JSON object of ``fields`` in the given order, repeated names kept (a dict cannot
    hold them): what a writer emitting one field after another produces."""
    out: list[str] = ["{"]
    for index, (name, item) in enumerate(fields):
        if index:
            out.append(",")
        out.append(go_string(name))
        out.append(":")
        _write(item, out)
    out.append("}")
    return "".join(out).encode("utf-8")

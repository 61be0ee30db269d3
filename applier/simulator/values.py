"""Random column values that stress a consumer, yet round-trip exactly through MySQL/MariaDB.

Every generator draws from the caller's seeded ``random.Random``, so a seed reproduces a stream.
The values deliberately include edge cases (type limits, 2**64-1, negative and >24h TIME, NUL
bytes, quotes, backslashes, 4-byte UTF-8, invalid UTF-8 in binary columns, HTML characters that
Go escapes), but stay inside what the database stores unchanged:

* FLOAT values are multiples of 1/4 below 1000 in magnitude, exact in single precision and
  printed in full by the server's six-digit FLOAT output;
* CHAR values never end in a space (CHAR strips trailing spaces on read);
* BINARY(n) values are exactly n bytes (shorter ones would be padded with NULs);
* dates stay in 1000..9999, TIMESTAMPs in the range valid in UTC; no zero dates.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import Any

from applier.simulator.tables import ColumnSpec, Kind

_TEXT_PIECES = (
    "a", "b", "z", "Q", "0", "9", " ", "-", "_", ".", "'", '"', "\\", "\\\\", "\x00", "\n", "\t", "\r",
    "%", "<", ">", "&", "é", "ß", "ñ", "e\u0301", "Ω", "漢字", "ключ", "שלום", "\u2028", "\u200b",
    "\x7f", "\x01", "😀", "𝄞", "🇨🇭", "\ufeff", "\u00a0",
)  # fmt: skip
_SAFE_TEXT_PIECES = ("a", "b", "k", "x", "0", "7", "-", "_", "é", "ß", "Ω", "漢", "ключ", "😀")
_BYTE_PIECES = (
    b"\x89PNG\r\n\x1a\n", b"\xed\xa0\x80", b"\xc0\x80", b"\xff\xfe", b"\xe2\x82", b"\xf4\x90\x80\x80",
    "é".encode(), "😀".encode(), "\u00a0".encode(), "\u200b".encode(), "\U000e0001".encode(),
    "\ufffd".encode(), b"\\", b'"', b"'", b"\x00", b"\x07", b"\x0b", b"\x7f", b"\x1b[0m", b"plain",
)  # fmt: skip

# Wide values are drawn a byte at a time and mapped to characters through this table: mostly
# ASCII, with multi-byte UTF-8 (two to four bytes), NUL, controls, quotes and backslashes mixed in.
_WIDE_PIECES = (
    "é", "ß", "Ω", "ж", "漢", "字", "😀", "𝄞", "\u2028", "\ufeff", "\x00", "\n", "\t", "\r", "'", '"',
    "\\", "<", "&", "\x7f",
)  # fmt: skip
_WIDE_ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-"
_WIDE_TEXT_TABLE = dict(enumerate([*(_WIDE_ASCII * 4)[: 256 - len(_WIDE_PIECES)], *_WIDE_PIECES]))
_WIDE_TEXT_BYTES_PER_256 = sum(len(piece.encode()) for piece in _WIDE_TEXT_TABLE.values())

_TIMESTAMP_MIN = dt.datetime(1970, 1, 1, 0, 0, 1)
_TIMESTAMP_MAX = dt.datetime(2038, 1, 19, 3, 14, 7)
_DATE_MIN = dt.date(1000, 1, 1)
_DATE_MAX = dt.date(9999, 12, 31)


class ValueGenerator:
    """Draws model values for columns (see ``tables.Kind`` for each kind's representation)."""

    def __init__(self, rng: random.Random, *, null_rate: float = 0.1, big_value_rate: float = 0.02) -> None:
        self.rng = rng
        self.null_rate = null_rate
        self.big_value_rate = big_value_rate

    def value(self, col: ColumnSpec) -> Any:
        """A random value for ``col``: NULL sometimes when the column is nullable."""
        if col.nullable and self.rng.random() < self.null_rate:
            return None
        return self.non_null(col)

    def non_null(self, col: ColumnSpec) -> Any:
        rng = self.rng
        kind = col.kind
        if kind in (Kind.INT, Kind.BIT, Kind.YEAR):
            assert col.int_range is not None
            return self.integer(*col.int_range)
        if kind is Kind.FLOAT32:
            return rng.randint(-3999, 3999) / 4
        if kind is Kind.FLOAT64:
            return self.double()
        if kind is Kind.DECIMAL:
            return self.decimal(20 - col.scale, col.scale)
        if kind is Kind.DATE:
            return self.date().isoformat()
        if kind is Kind.DATETIME:
            return self.datetime_text(self.datetime(_DATE_MIN, _DATE_MAX), col.fsp)
        if kind is Kind.TIMESTAMP:
            return self.datetime_text(self.timestamp(), col.fsp)
        if kind is Kind.TIME:
            return self.time()
        if kind is Kind.TEXT:
            return self.text(col.max_len, no_trailing_space=col.sql_type.startswith("CHAR"))
        if kind is Kind.BYTES:
            if col.sql_type.startswith("BINARY"):
                return self.raw_bytes(col.max_len, col.max_len)
            return self.raw_bytes(0, col.max_len)
        if kind is Kind.BLOB:
            return self.raw_bytes(0, self.blob_limit(col))
        if kind is Kind.TEXT_BLOB:
            return self.text_bytes_limited(self.blob_limit(col))
        if kind is Kind.ENUM:
            return rng.randint(1, len(col.members))
        if kind is Kind.SET:
            return rng.randint(0, 2 ** len(col.members) - 1)
        if kind is Kind.JSON:
            return self.json_text()
        raise AssertionError(kind)  # pragma: no cover

    # -- numbers ----------------------------------------------------------------------------

    def integer(self, low: int, high: int) -> int:
        rng = self.rng
        roll = rng.random()
        if roll < 0.2:
            return rng.choice([v for v in (low, high, 0, 1, -1, low + 1, high - 1) if low <= v <= high])
        if roll < 0.5:
            return max(low, min(high, rng.randint(-1000, 1000)))
        return rng.randint(low, high)

    def double(self) -> float:
        rng = self.rng
        roll = rng.random()
        if roll < 0.15:
            return rng.choice(
                [0.1, 0.3, -2.5, 1e-7, 1.5e-300, 1.2345678901234567e300, 1e21, 123456789.125, 1.0]
            )
        if roll < 0.5:
            return rng.randint(-(10**6), 10**6) / 8
        return rng.uniform(-1e9, 1e9)

    def decimal(self, int_digits: int, scale: int) -> str:
        rng = self.rng
        whole = rng.choice([0, rng.randint(0, 999), rng.randint(0, 10**int_digits - 1)])
        frac = rng.randint(0, 10**scale - 1) if scale else 0
        negative = rng.random() < 0.3 and (whole or frac)
        text = f"{whole}.{frac:0{scale}d}" if scale else str(whole)
        return ("-" if negative else "") + text

    # -- time -------------------------------------------------------------------------------

    def date(self) -> dt.date:
        span = (_DATE_MAX - _DATE_MIN).days
        return _DATE_MIN + dt.timedelta(days=self.rng.randint(0, span))

    def datetime(self, low: dt.date, high: dt.date) -> dt.datetime:
        day = low + dt.timedelta(days=self.rng.randint(0, (high - low).days))
        seconds = self.rng.randint(0, 86399)
        micro = self.rng.choice([0, self.rng.randint(0, 999_999)])
        return dt.datetime(day.year, day.month, day.day) + dt.timedelta(seconds=seconds, microseconds=micro)

    def timestamp(self) -> dt.datetime:
        span = int((_TIMESTAMP_MAX - _TIMESTAMP_MIN).total_seconds())
        return _TIMESTAMP_MIN + dt.timedelta(seconds=self.rng.randint(0, span))

    @staticmethod
    def datetime_text(value: dt.datetime, fsp: int) -> str:
        """TiDB's text form: exactly ``fsp`` fraction digits (none when fsp is 0)."""
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        if fsp:
            text += "." + f"{value.microsecond:06d}"[:fsp]
        return text

    def time(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:
            return rng.choice(["-838:59:59", "838:59:59", "100:00:00", "00:00:00", "-00:00:01", "23:59:59"])
        seconds = rng.randint(-838 * 3600, 838 * 3600 + 59 * 60 + 59)
        return format_time(seconds)

    # -- strings ----------------------------------------------------------------------------

    def text(self, max_chars: int, *, no_trailing_space: bool = False, safe: bool = False) -> str:
        """Up to ``max_chars`` characters mixing ASCII, escapes-worthy characters and UTF-8."""
        rng = self.rng
        pieces = _SAFE_TEXT_PIECES if safe else _TEXT_PIECES
        target = rng.choice([0, 1, rng.randint(1, 12), rng.randint(1, max_chars)])
        out = ""
        while len(out) < target:
            piece = rng.choice(pieces)
            if len(out) + len(piece) > max_chars:
                break
            out += piece
        if no_trailing_space:
            out = out.rstrip(" ")
        return out

    def text_bytes_limited(self, max_bytes: int) -> str:
        """Text whose UTF-8 encoding fits ``max_bytes``."""
        rng = self.rng
        target = rng.choice([0, rng.randint(1, 40), rng.randint(1, max_bytes)])
        chunks: list[str] = []
        size = 0
        while size < target:
            piece = rng.choice(_TEXT_PIECES)
            n = len(piece.encode())
            if size + n > max_bytes:
                break
            chunks.append(piece)
            size += n
        return "".join(chunks)

    def raw_bytes(self, min_len: int, max_len: int) -> bytes:
        """Arbitrary bytes with invalid UTF-8, non-printable runes and Go escape triggers."""
        rng = self.rng
        target = rng.randint(min_len, max(min_len, min(max_len, rng.choice([min_len, 16, max_len]))))
        out = bytearray()
        while len(out) < target:
            if rng.random() < 0.5:
                out += rng.choice(_BYTE_PIECES)
            else:
                out += rng.randbytes(rng.randint(1, 8))
        return bytes(out[:target])

    def wide_text(self, size: int) -> str:
        """Text of exactly ``size`` UTF-8 bytes (multi-byte characters included), drawn fast enough
        for megabytes: random bytes mapped through a table of characters. Now and then a short
        random paragraph repeated, which compresses well, unlike the rest."""
        rng = self.rng
        if rng.random() < 0.3:
            paragraph = self.wide_text(rng.randint(200, 2000)) + "\n"
            text = paragraph * max(1, size // len(paragraph.encode()))
        else:
            chars = max(1, size * 256 // _WIDE_TEXT_BYTES_PER_256)
            text = rng.randbytes(chars).decode("latin-1").translate(_WIDE_TEXT_TABLE)
        excess = len(text.encode()) - size
        if excess > 0:
            text = text[: max(0, len(text) - excess)]  # each character is at least one byte
        return text + "x" * (size - len(text.encode()))

    def blob_limit(self, col: ColumnSpec) -> int:
        """Mostly small values; rarely one just above 64 KiB for the MEDIUM/LONG types."""
        if col.max_len > 65535 and self.rng.random() < self.big_value_rate:
            return 66_000 + self.rng.randint(0, 4000)
        return min(col.max_len, 600)

    def json_text(self) -> str:
        """JSON text formatted as TiDB prints it (sorted keys, ``", "`` and ``": "`` separators)."""
        rng = self.rng

        def scalar() -> Any:
            return rng.choice([
                rng.randint(-1000, 1000), rng.randint(0, 40) / 4, True, False, None,
                self.text(12, safe=rng.random() < 0.5), "<tag> & \"quoted\" \\ back",
            ])  # fmt: skip

        def build(depth: int) -> Any:
            roll = rng.random()
            if depth > 2 or roll < 0.3:
                return scalar()
            if roll < 0.65:
                return {self.text(8, safe=True) or "k": build(depth + 1) for _ in range(rng.randint(0, 4))}
            return [build(depth + 1) for _ in range(rng.randint(0, 4))]

        doc = rng.choice([build(0), {"id": rng.randint(1, 100), "tags": ["a", "b"]}])
        return json.dumps(doc, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


def format_time(seconds: int) -> str:
    """TiDB's TIME text for a signed number of seconds: ``[-]HH:MM:SS`` (hours may exceed 99)."""
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}"

"""Decoder throughput: decode_record versus a bare orjson.loads of the same documents.

Builds a realistic in-memory mix (records of 16 row events, 10 columns of mixed types, ~30%
updates carrying the old image), then times
  (a) decode_record over every record,
  (b) orjson.loads of every key and value JSON document of those records (the bare parse floor),
  (c) decode_record_careful, the decoder's reference path alone (what (a) does for an event its
      fast path gives up on), for information,
  (d) decode_record as ``applier run`` and the catch-up's readers call it, an update's old image
      reduced to its handle key (``old_keys_only``), for information (the ratio line stays (a)'s,
      comparable with earlier versions),
over several repetitions, interleaved so that machine noise hits all alike, and prints the median
events/s of each and the ratio of (b) to (a). It prints, never asserts: the numbers depend on the
machine. The garbage collector is left as it is in production (enabled).

Run: .venv/bin/python benchmarks/decode.py [--records N] [--repeat R]
"""

from __future__ import annotations

import argparse
import base64
import platform
import random
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

import orjson

from applier.codec.decoder import decode_record, decode_record_careful

EVENTS_PER_RECORD = 16
_U64 = struct.Struct(">Q")


def go_quote_body(raw: bytes) -> str:
    """Enough of Go's strconv.Quote for benchmark data (ASCII printable kept, rest escaped)."""
    out = []
    named = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v", 92: "\\\\", 34: '\\"'}
    for b in raw:
        if b in named:
            out.append(named[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def make_row(rng: random.Random, row_id: int) -> dict:
    token = b"\x89PNG\r\n\x1a\n" + rng.randbytes(4) + b"id%d" % row_id
    return {
        "id": {"t": 3, "h": True, "f": 11, "v": row_id},
        "user_id": {"t": 8, "f": 128 | 64, "v": rng.randrange(2**63, 2**64)},
        "name": {"t": 15, "f": 64, "v": f"customer-{rng.randrange(10**6)} 名前"},
        "amount": {"t": 246, "f": 64, "v": f"{rng.randrange(10**7)}.{rng.randrange(10**4):04d}"},
        "created": {"t": 12, "f": 64, "v": f"2024-05-{rng.randrange(1, 29):02d} 12:34:56.123456"},
        "token": {"t": 15, "f": 65, "v": go_quote_body(token)},
        "payload": {"t": 252, "f": 65, "v": base64.b64encode(rng.randbytes(48)).decode()},
        "note": {"t": 15, "f": 64, "v": None},
        "score": {"t": 5, "f": 64, "v": rng.random() * 1000},
        "status": {"t": 1, "f": 64, "v": rng.randrange(4)},
    }


def frame(docs: list[bytes], version: bool) -> bytes:
    parts = [_U64.pack(1)] if version else []
    for d in docs:
        parts.append(_U64.pack(len(d)))
        parts.append(d)
    return b"".join(parts)


def build(records: int, seed: int = 42) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """Return the framed records and the flat list of every JSON document inside them."""
    rng = random.Random(seed)
    out: list[tuple[bytes, bytes]] = []
    all_docs: list[bytes] = []
    row_id = 0
    ts = 449_000_000_000_000_000
    for _ in range(records):
        keys, values = [], []
        for _ in range(EVENTS_PER_RECORD):
            row_id += 1
            ts += rng.randrange(1, 1000)
            key = orjson.dumps({"ts": ts, "scm": "shop", "tbl": "orders", "t": 1})
            new = make_row(rng, row_id)
            if rng.random() < 0.3:
                old = make_row(rng, row_id)
                value = orjson.dumps({"u": new, "p": old})
            else:
                value = orjson.dumps({"u": new})
            keys.append(key)
            values.append(value)
        out.append((frame(keys, True), frame(values, False)))
        all_docs.extend(keys)
        all_docs.extend(values)
    return out, all_docs


def time_decode(
    records: list[tuple[bytes, bytes]], decode: Callable[..., Any] = decode_record, **options: Any
) -> float:
    start = time.perf_counter()
    for i, (k, v) in enumerate(records):
        decode(k, v, topic="bench", partition=0, offset=i, **options)
    return time.perf_counter() - start


def time_loads(docs: list[bytes]) -> float:
    loads = orjson.loads
    start = time.perf_counter()
    for d in docs:
        loads(d)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()

    records, docs = build(args.records)
    events = args.records * EVENTS_PER_RECORD
    value_bytes = sum(len(v) for _, v in records)
    decode_record(*records[0], topic="bench", partition=0, offset=0)  # warm caches and tables

    decode_times, loads_times, careful_times, keys_times = [], [], [], []
    for _ in range(args.repeat):  # interleaved so machine noise hits all alike
        decode_times.append(time_decode(records))
        loads_times.append(time_loads(docs))
        careful_times.append(time_decode(records, decode_record_careful))
        keys_times.append(time_decode(records, old_keys_only=True))
    dec = events / statistics.median(decode_times)
    bare = events / statistics.median(loads_times)
    careful = events / statistics.median(careful_times)
    keys = events / statistics.median(keys_times)

    impl = platform.python_implementation()
    print(f"python {platform.python_version()} ({impl}), orjson {orjson.__version__}")
    print(
        f"{args.records} records x {EVENTS_PER_RECORD} row events, 10 columns, "
        f"{value_bytes / events:.0f} value bytes/event, {args.repeat} repetitions (median)"
    )
    print(f"decode_record       : {dec:12,.0f} events/s")
    print(f"orjson.loads (bare) : {bare:12,.0f} events/s  ({len(docs)} documents)")
    print(f"ratio bare/decode   : {bare / dec:.2f}x")
    print(f"careful path alone  : {careful:12,.0f} events/s  (reference path, for information)")
    print(
        f"old images as keys  : {keys:12,.0f} events/s  (as applier run decodes, old_keys_only: "
        f"{bare / keys:.2f}x the bare parse)"
    )


if __name__ == "__main__":
    main()

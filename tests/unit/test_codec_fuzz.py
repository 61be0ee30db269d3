"""Fuzzing decode_record: records mutated from valid ones, and what may come out of the decoder.

The property (docs/open-protocol.md §1-§4): whatever bytes a record holds, decoding either gives
events or raises :class:`MalformedRecordError` carrying the record's position; no other exception
(KeyError, TypeError, RecursionError, MemoryError...), no crash of the process, no hang. And the
fast path and the careful path agree on every input (tests/unit/test_codec_fastpath.py).

The inputs start from valid records: streams of the simulator (classic and new producers,
legacy strings, snappy and lz4 values, handle-key-only and claim-check large messages, partitioned
tables, DDLs, resolved events) and the shared builders' DDL records. Each is then mutated at three
levels: the JSON documents (a node replaced by another JSON type, a huge number, NaN/Infinity,
bad base64, bad UTF-8, deep nesting, a duplicated key; events dropped, repeated or swapped), the
compressed values (a snappy header claiming gigabytes, a value decoded with another compression
than it was written with) and the framed bytes (bits flipped, bytes inserted or deleted,
truncation, length prefixes changed). Claim-check objects (docs/open-protocol.md §9.1) wrap such
records in base64 and are fuzzed the same way: only BadClaimCheckObject may escape them.

Memory: decoding runs under an address-space limit of 1 GiB more than the process already uses,
so a small input that makes the decoder (or a library under it) allocate gigabytes fails here
instead of going unnoticed on a machine with memory to spare. Hangs: a watchdog
(``faulthandler``) dumps every thread's stack and ends the process when one example runs for a
minute.

``make test`` runs a bounded number of inputs (:data:`EXAMPLES`). A longer run by hand::

    APPLIER_FUZZ_EXAMPLES=200000 PYTHONPATH=. .venv/bin/python -m pytest -q -p no:cacheprovider \\
        --hypothesis-show-statistics tests/unit/test_codec_fuzz.py

(``--hypothesis-show-statistics`` prints how many inputs ran; ``--hypothesis-seed=N`` varies them.)
"""

from __future__ import annotations

import base64
import faulthandler
import json
import os
import resource
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codec import decoder
from applier.codec.compression import decompressor, snappy_bound
from applier.codec.decoder import DecoderOptions, decode_record, decode_record_careful
from applier.codec.errors import MalformedRecordError
from applier.codec.events import LargeMessageEvent, Position, RowEvent
from applier.codec.framing import split_record
from applier.large_messages.claim_check import BadClaimCheckObject, row_from_object
from applier.simulator import StreamConfig, simulate
from tests.builders import compress_value, ddl_event
from tests.unit.test_codec_fastpath import assert_same

EXAMPLES = int(os.environ.get("APPLIER_FUZZ_EXAMPLES", "3000"))
"""Mutated records: bounded for ``make test``, raised by hand for a longer run (random bytes get
half as many, claim-check objects a sixth)."""

HANG_SECONDS = 60
U64 = struct.Struct(">Q")


# --- the valid records mutations start from ------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    """One valid record as documents: key JSONs, uncompressed value JSONs, the decoder options."""

    keys: tuple[bytes, ...]
    values: tuple[bytes, ...]
    options: DecoderOptions


SEED_STREAMS: list[dict[str, Any]] = [
    {"architecture": "classic", "row_ids": True},
    {"architecture": "new", "partitioned": True},
    {"legacy_strings": True},
    {"compression": "snappy", "only_updated_columns": True},
    {"compression": "lz4", "delete_only_handle_key": True},
    {"large_message": "handle-key-only", "max_message_bytes": 1500, "compression": "snappy"},
    {"large_message": "claim-check", "max_message_bytes": 1500, "architecture": "new"},
    {"large_message": "claim-check", "max_message_bytes": 1500, "compression": "lz4"},
]


def _decompress(doc: bytes, compression: str | None) -> bytes:
    if not doc or compression is None:
        return doc
    if compression == "snappy":
        return bytes(cramjam.snappy.decompress_raw(doc))
    return bytes(cramjam.lz4.decompress(doc))


def _seeds() -> list[Seed]:
    seeds = []
    for stream in SEED_STREAMS:
        cfg = StreamConfig(seed=7, partitions=2, transactions=12, max_batch_size=3, **stream)
        options = DecoderOptions(legacy_base64_strings=cfg.legacy_strings, compression=cfg.compression)
        for rec in simulate(cfg).records[:40]:
            keys, values = split_record(rec.key, rec.value)
            docs = tuple(_decompress(v, cfg.compression) for v in values)
            seeds.append(Seed(tuple(keys), docs, options))
    ddl = ddl_event(5)
    key = json.dumps({"ts": ddl.commit_ts, "scm": ddl.schema, "tbl": ddl.table, "t": 2}).encode()
    value = json.dumps({"q": ddl.query, "t": ddl.ddl_type}).encode()
    for options in (DecoderOptions(), DecoderOptions(reserved_schemas=frozenset({"ticdc_applier"}))):
        seeds.append(Seed((key,), (value,), options))
    return seeds


SEEDS = _seeds()
OPTIONS = [
    DecoderOptions(),
    DecoderOptions(legacy_base64_strings=True),
    DecoderOptions(compression="snappy"),
    DecoderOptions(compression="lz4"),
]


def test_the_seeds_are_valid_records() -> None:
    """Mutations start from records the decoder accepts, of every kind the seeds claim."""
    kinds = set()
    for seed in SEEDS:
        key, value = frame(
            list(seed.keys), [compress_value(v, seed.options.compression) for v in seed.values]
        )
        kind, events = assert_same(key, value, seed.options)
        assert kind == "events", events
        kinds.update(
            word for word in ("RowEvent", "DDLEvent", "ResolvedEvent", "LargeMessage") if word in events
        )
    assert kinds == {"RowEvent", "DDLEvent", "ResolvedEvent", "LargeMessage"}


# --- JSON documents with what orjson.dumps will not write -------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text written as is: NaN, numbers beyond 64 bits, bad UTF-8, deep nesting..."""

    text: bytes


@dataclass(frozen=True)
class Pairs:
    """A JSON object written from (name, value) pairs, so that a name can appear twice."""

    items: tuple[tuple[str, Any], ...]


def emit(node: Any, ascii_only: bool) -> bytes:
    if isinstance(node, Raw):
        return node.text
    if isinstance(node, Pairs | dict):
        items = node.items if isinstance(node, Pairs) else node.items()
        return b"{" + b",".join(emit(k, ascii_only) + b":" + emit(v, ascii_only) for k, v in items) + b"}"
    if isinstance(node, list):
        return b"[" + b",".join(emit(v, ascii_only) for v in node) + b"]"
    # surrogatepass: a lone surrogate in a string becomes bytes that are not UTF-8
    return json.dumps(node, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def _nest(depth: int, open_: bytes, close: bytes, inner: bytes = b"1") -> Raw:
    return Raw(open_ * depth + inner + close * depth)


HOSTILE_RAW = [
    Raw(t)
    for t in (
        b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1e-999", b"-0", b"1.0", b"0.1e1",
        b"18446744073709551615", b"18446744073709551616", b"-9223372036854775809", b"9" * 400,
        b'"\xff\xfe"', b'"\xc3"', b'"\xed\xa0\x80"', b'"\\ud800"', b'"\\udc00\\ud800"', b'"\x00"',
        b'"\\u0000"', b'"a\\', b"tru", b"nul", b"", b"{", b"[1,]", b'{"a":1,}', b"'x'", b"0x10", b"01",
        b'"@@@="', b'"YWJ"', b'"===="', b'"YW Jj"', b'"YWJj\\n"', b'"\\x41"', b'"\\\\x4"', b'"\\\\u12"',
        b'"\\\\777"', b'"\\\\U00110000"', b'"\\\\ud800"', b'"-.5e3"', b'"1_000"', b'"\\u0661"',
        b'{"t":3,"f":0,"v":1,"v":"x"}', b'{"t":3,"f":0,"h":true,"h":1,"v":1}', b'{"t":252,"f":1,"v":"%%%"}',
    )
] + [
    _nest(1023, b"[", b"]"), _nest(1024, b"[", b"]"), _nest(1025, b"[", b"]"), _nest(50000, b"[", b"]"),
    _nest(2000, b'{"a":', b"}"), _nest(100000, b"[", b""), Raw(b'"' + b"a" * 100000 + b'"'),
]  # fmt: skip
HOSTILE_STRINGS = [
    "", " ", "ALTER TABLE t ADD COLUMN c INT; DROP TABLE t", "DROP DATABASE ticdc_applier",
    "ALTER TABLE ticdc_applier.t ADD c INT", "(" * 5000, "ALTER TABLE t ADD c INT /*", "`" * 999,
    "CREATE TABLE `" + "a" * 70 + "` (a INT)", "ALTER TABLE t " + "ADD c INT, " * 2000 + "ADD d INT",
    "/*!50000 " * 500, "'" * 1001, "ALTER TABLE t COMMENT '" + "\\" * 999 + "'",
    "s3://bucket/../x.json", "file:///etc/passwd", "../../x", "x.json", "\udcff",
]  # fmt: skip
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),  # NaN and infinities too: json.dumps writes them as NaN/Infinity
    st.text(max_size=20),
    st.sampled_from(HOSTILE_STRINGS),
)
REPLACEMENTS = st.one_of(
    JSON_SCALARS,
    st.sampled_from(HOSTILE_RAW),
    st.just([]),
    st.just({}),
    st.lists(JSON_SCALARS, max_size=3),
    st.dictionaries(
        st.sampled_from(["t", "f", "v", "h", "u", "p", "d", "q", "ts", "x"]), JSON_SCALARS, max_size=4
    ),
)


def _nodes(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, node
    if isinstance(node, dict):
        for name, child in node.items():
            yield from _nodes(child, (*path, name))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _nodes(child, (*path, i))


def _replace(node: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {name: _replace(child, rest, new) if name == head else child for name, child in node.items()}
    return [_replace(child, rest, new) if i == head else child for i, child in enumerate(node)]


@st.composite
def mutated_document(draw: st.DrawFn, doc: bytes) -> bytes:
    """``doc`` with one node changed: replaced, a name duplicated, removed or renamed."""
    try:
        # A document already nested deeply by an earlier mutation is not parsed again: whether
        # json.loads manages depends on the stack depth, which differs from run to run.
        if doc.count(b"[") + doc.count(b"{") > 500:
            raise ValueError("too deep to parse here")
        tree = json.loads(doc)
    except ValueError:  # an empty value, or one of the above: write something in its place
        return emit(draw(REPLACEMENTS), draw(st.booleans()))
    nodes = list(_nodes(tree))
    path, node = nodes[draw(st.integers(0, len(nodes) - 1))]
    op = draw(st.sampled_from(["replace", "replace", "duplicate", "remove", "rename"]))
    if op != "replace" and isinstance(node, dict) and node:
        name = draw(st.sampled_from(sorted(node)))
        items = tuple(node.items())
        if op == "duplicate":  # the same name again, before or after, with another value
            extra = ((name, draw(REPLACEMENTS)),)
            new: Any = Pairs(extra + items if draw(st.booleans()) else items + extra)
        elif op == "remove":
            new = {k: v for k, v in items if k != name}
        else:
            other = draw(
                st.sampled_from(["t", "f", "v", "h", "u", "p", "d", "ts", "scm", "ohk", "ccl", "T", ""])
            )
            new = Pairs(tuple((other if k == name else k, v) for k, v in items))
    else:
        new = draw(REPLACEMENTS)
    return emit(_replace(tree, path, new), draw(st.booleans()))


# --- framed bytes ----------------------------------------------------------------------------------


def frame(keys: list[bytes], values: list[bytes]) -> tuple[bytes, bytes]:
    return U64.pack(1) + b"".join(U64.pack(len(d)) + d for d in keys), b"".join(
        U64.pack(len(d)) + d for d in values
    )


def _prefixes(buf: bytes, start: int) -> list[int]:
    """Offsets of the length prefixes of a framed buffer (as far as they frame)."""
    out = []
    pos = start
    while pos + 8 <= len(buf):
        out.append(pos)
        pos += 8 + U64.unpack_from(buf, pos)[0]
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@st.composite
def mutated_bytes(draw: st.DrawFn, buf: bytes, start: int) -> bytes:
    """``buf`` (a framed key or value; documents from ``start``) with one byte-level change."""
    op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "prefix", "prefix", "overwrite"]))
    if op == "prefix":
        prefixes = _prefixes(buf, start)
        if not prefixes:
            return buf + draw(st.binary(max_size=16))
        at = draw(st.sampled_from(prefixes))
        (length,) = U64.unpack_from(buf, at)
        bogus = draw(st.sampled_from([0, 1, length - 1, length + 1, length + 8, 2**31, 2**63, 2**64 - 1]))
        return buf[:at] + U64.pack(bogus % 2**64) + buf[at + 8 :]
    at = draw(st.integers(0, len(buf)))
    if op == "flip" and buf:
        at = min(at, len(buf) - 1)
        return buf[:at] + bytes((buf[at] ^ (1 << draw(st.integers(0, 7))),)) + buf[at + 1 :]
    if op == "insert":
        return buf[:at] + draw(st.binary(min_size=1, max_size=9)) + buf[at:]
    if op == "delete":
        return buf[:at] + buf[at + draw(st.integers(1, 16)) :]
    if op == "overwrite":
        patch = draw(
            st.binary(min_size=1, max_size=9) | st.sampled_from([b"\xff" * 8, b"\x00" * 8, b'"', b"\\"])
        )
        return buf[:at] + patch + buf[at + len(patch) :]
    return buf[:at]


@st.composite
def compressed(draw: st.DrawFn, doc: bytes, compression: str | None) -> bytes:
    """A value document compressed as configured, sometimes with a corrupt or lying header."""
    out = compress_value(doc, compression)
    if not out or draw(st.integers(0, 7)):
        return out
    if compression == "snappy":  # the header is the uncompressed length, a varint
        claim = draw(st.sampled_from([0, len(doc) + 1, 2**20, 2**30, 2**32 - 1, 2**35]))
        body = out[len(_varint(len(doc))) :]
        return _varint(claim) + body
    return draw(mutated_bytes(out, 0))


@st.composite
def fuzzed_record(draw: st.DrawFn) -> tuple[bytes, bytes, DecoderOptions]:
    seed = draw(st.sampled_from(SEEDS))
    keys, values = list(seed.keys), list(seed.values)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(
            st.sampled_from(["key", "value", "value", "drop-key", "drop-value", "repeat", "swap-values"])
        )
        docs = keys if op in ("key", "drop-key", "repeat") else values
        if not docs:
            continue
        i = draw(st.integers(0, len(docs) - 1))
        if op in ("key", "value"):
            docs[i] = draw(mutated_document(docs[i]))
        elif op.startswith("drop"):
            del docs[i]
        elif op == "repeat":  # the whole event, twice
            keys.insert(i, keys[i])
            values.insert(i, values[i] if i < len(values) else b"")
        else:
            values.insert(0, values.pop(i))
    keys = keys or list(seed.keys[:1])
    options = seed.options if draw(st.integers(0, 9)) else draw(st.sampled_from(OPTIONS))
    written = (
        seed.options.compression
        if draw(st.integers(0, 9))
        else draw(st.sampled_from([None, "snappy", "lz4"]))
    )
    key, value = frame(keys, [draw(compressed(v, written)) for v in values])
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.booleans()):
            key = draw(mutated_bytes(key, 8))
        else:
            value = draw(mutated_bytes(value, 0))
    return key, value, options


# --- the property ------------------------------------------------------------------------------------


@contextmanager
def bounded_memory_and_time() -> Iterator[None]:
    """Allocations of more than 1 GiB fail, and a minute without returning ends the process with
    every thread's stack: how a small input asking for gigabytes, or a hang, shows up here."""
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = used + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # no timing assertion: hangs are the watchdog's
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@pytest.mark.slow
@FUZZ
@given(fuzzed_record())
def test_mutated_records_decode_or_raise_malformed_record(case: tuple[bytes, bytes, DecoderOptions]) -> None:
    """Only MalformedRecordError escapes (at the record's position), and both paths agree."""
    with bounded_memory_and_time():
        assert_same(*case)


@settings(FUZZ, max_examples=max(EXAMPLES // 2, 1))
@given(st.binary(max_size=64), st.binary(max_size=256), st.sampled_from(OPTIONS))
def test_random_bytes_decode_or_raise_malformed_record(
    key: bytes, value: bytes, options: DecoderOptions
) -> None:
    """Bytes with no structure at all, behind a valid version head half of the time."""
    with bounded_memory_and_time():
        assert_same(key, value, options)
        assert_same(U64.pack(1) + key, value, options)


@st.composite
def claim_check_object(draw: st.DrawFn) -> tuple[bytes, LargeMessageEvent, DecoderOptions]:
    """A claim-check object around a fuzzed record (its fields sometimes no base64 string at
    all), and a reference naming the row of the record's first key when that key still parses."""
    key, value, options = draw(fuzzed_record())
    fields: dict[str, Any] = {
        "key": base64.b64encode(key).decode(),
        "value": base64.b64encode(value).decode(),
    }
    for name in draw(st.lists(st.sampled_from(["key", "value", "extra"]), max_size=2)):
        fields[name] = draw(REPLACEMENTS)
    try:
        first = json.loads(key[16 : 16 + U64.unpack_from(key, 8)[0]])
        ts, schema, table = int(first["ts"]), str(first.get("scm", "")), str(first.get("tbl", ""))
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error, RecursionError):
        ts, schema, table = 1, "s", "t"  # ("ts": Infinity overflows int())
    ref = LargeMessageEvent(ts, schema, table, False, "file:///cc/a.json", None, Position("tp", 1, 2, 0))
    return emit(fields, draw(st.booleans())), ref, options


@settings(FUZZ, max_examples=max(EXAMPLES // 6, 1))
@given(claim_check_object())
def test_claim_check_objects_give_a_row_or_raise_bad_claim_check_object(
    case: tuple[bytes, LargeMessageEvent, DecoderOptions],
) -> None:
    """A claim-check object is decoder input too: only BadClaimCheckObject may escape."""
    data, ref, options = case
    with bounded_memory_and_time():
        try:
            row = row_from_object(data, ref, options)
        except BadClaimCheckObject:
            return
    assert type(row) is RowEvent and row.pos == ref.pos


@pytest.mark.parametrize("options", OPTIONS)
def test_no_key_or_no_value(options: DecoderOptions) -> None:
    key, _ = frame([b'{"ts":1,"t":3}'], [b""])
    for k, v in ((None, None), (None, b"x"), (key, None), (b"", b""), (key, b"")):
        assert_same(k, v, options)  # type: ignore[arg-type]


# --- what the fuzzer found ---------------------------------------------------------------------------


def test_a_snappy_header_claiming_gigabytes_is_a_malformed_record() -> None:
    """Found by the fuzzer: a raw snappy block starts with its uncompressed length, which the
    library allocated before looking further; 4 GiB claimed by a 7-byte value aborted the
    process (a Rust allocation failure, no Python exception) under an address-space limit. Such
    a claim is now refused by the bound the format puts on it (snappy_bound)."""
    key, value = frame([b'{"ts":1,"scm":"s","tbl":"t","t":1}'], [_varint(2**32 - 1) + b"\x00a"])
    with bounded_memory_and_time(), pytest.raises(MalformedRecordError, match="claims 4294967295") as info:
        decode_record(key, value, topic="tp", partition=1, offset=2, options=OPTIONS[2])
    assert (info.value.topic, info.value.partition, info.value.offset, info.value.index) == ("tp", 1, 2, 0)
    with bounded_memory_and_time():
        assert_same(key, value, OPTIONS[2])


def test_snappy_bound_holds_for_the_most_compressible_input() -> None:
    for data in (b"\x00" * (4 << 20), b"ab" * (1 << 20), b"x", b""):
        packed = bytes(cramjam.snappy.compress_raw(data))
        assert len(data) <= snappy_bound(len(packed))
        assert bytes(decompressor("snappy")(packed)) == data  # type: ignore[misc]


def test_running_out_of_memory_is_not_reported_as_a_malformed_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MemoryError is this process's trouble, not the record's: it escapes as itself (so that
    the fuzzer sees a small input asking for too much, and an operator is not sent looking for a
    bad record), from both paths. The fast path gives the event to the careful one, which meets
    the error again (here in the JSON parser, or in the decompressor the fast path also calls)."""

    def exhausted(doc: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(decoder, "_loads", exhausted)
    monkeypatch.setattr(decoder, "decompressor", lambda name: exhausted)
    monkeypatch.setattr(decoder, "_plans", {})
    spaced = frame([b'{"ts": 1, "scm": "s", "tbl": "t", "t": 1}'], [b'{"u":{}}'])  # careful path only
    compressed = frame([b'{"ts":1,"scm":"s","tbl":"t","t":1}'], [b"packed"])
    for (key, value), options in (
        (spaced, DecoderOptions()),
        (compressed, DecoderOptions(compression="lz4")),
    ):
        for fn in (decode_record, decode_record_careful):
            with pytest.raises(MemoryError):
                fn(key, value, topic="tp", partition=1, offset=2, options=options)

"""TiCDC Open Protocol decoder: one Kafka record -> its events (docs/open-protocol.md §1-§4).

``decode_record`` is the applier's hot path: it frames the record, parses every key and value
document, and validates and converts every column value (values.py states the rules). Every kind
of bad input surfaces as :class:`MalformedRecordError` carrying the record's position. A
MemoryError is the one exception that is never turned into it: it says that this process ran
out of memory, not that the record is bad, and no small input may cause one (the fuzz tests,
tests/unit/test_codec_fuzz.py, decode under an address-space limit to check that).

Each event is decoded by one of two paths with the same results:

* the *fast path*, compiled (applier/codec/_fastpath.pyx, built by Cython when the package is
  installed), handles what current producers send (row events with ``{t, f, v}`` columns,
  resolved events): it reads the record's bytes in place and builds only the objects the events
  keep, and gives up on an event at the first thing it does not expect;
* the *careful path*, :func:`_careful_event`, the reference, in Python over orjson: every field
  checked in order, with a precise reason for whatever is wrong. It decodes again, from its
  bytes, every event the fast path gave up on (DDL and large-message events, old producers,
  malformed input), and every record whose framing is not exact (it then says why).

So the fast path never needs an error message; it only must never accept what the careful path
rejects nor produce anything else (tests/unit/test_codec_fastpath.py feeds both the same records).

Why compiled: in Python, parsing with orjson and then normalising every column cost about 2.5
times the bare parse (the column loop alone about as much as the parse); compiled, decoding takes
about 1.2 times as long as orjson parsing the same documents (``make bench``). Without its compiled module
the decoder does not import: a silently slower decoder would only show as a growing lag.

Every DDL event (careful path only: they are rare) is also checked by :mod:`sqlgen.ddl_guard`:
its text must be the DDL its type code and key describe, touching no reserved schema. A DDL
text is input like any other, and one that is not what its event says is malformed input, so it
stops the reader at that record before anything at or after it runs. The guard is the codec's one
import from outside it: a pure function over tokens (:mod:`sqlgen.sqltokens`), no database.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import orjson

from applier.codec.compression import Decompressor, decompressor
from applier.codec.errors import MalformedRecordError
from applier.codec.events import (
    KIND_DDL,
    KIND_RESOLVED,
    KIND_ROW,
    DDLEvent,
    Event,
    LargeMessageEvent,
    Position,
    ResolvedEvent,
    Row,
    RowEvent,
    RowKind,
    claim_check_name,
)
from applier.codec.framing import split_record
from applier.codec.problem import Problem
from applier.codec.values import ValuePlan, fill_old, normalize_row
from applier.errors import ApplierError, compiled_module_missing
from sqlgen.ddl_guard import HostileDDL, check_ddl

try:
    from applier.codec._fastpath import decode_record_fast as _decode_fast
except ImportError as _e:  # one clear line instead of a slow decoder nobody asked for
    raise compiled_module_missing(
        "the decoder's compiled fast path", "applier/codec/_fastpath.pyx", _e
    ) from _e

__all__ = ["DEFAULT_OPTIONS", "DecoderOptions", "decode_record"]


@dataclass(frozen=True, slots=True)
class DecoderOptions:
    """Producer settings that cannot be detected from the data itself.

    ``legacy_base64_strings``: TiCDC < v4.0.5 sent CHAR/VARCHAR (15, 253, 254) values as base64
    (and no ``f``); they are decoded to bytes, then to str unless the column is binary.
    ``compression``: None, ``"snappy"`` (raw block format) or ``"lz4"`` (frame format); applies to
    every non-empty value document, never to keys.
    ``reserved_schemas``: schemas no DDL event may touch besides the server's own (the
    checkpoint schema); see :mod:`sqlgen.ddl_guard`.
    """

    legacy_base64_strings: bool = False
    compression: str | None = None
    reserved_schemas: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        decompressor(self.compression)  # reject an unknown algorithm at configuration time


DEFAULT_OPTIONS = DecoderOptions()

# The careful path builds events with positional arguments (about twice as fast as keywords for
# these slotted dataclasses); the argument order is the field order of the contract in events.py.
_loads = orjson.loads
_INSERT, _UPDATE, _DELETE = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE
_plans: dict[DecoderOptions, tuple[ValuePlan, Decompressor | None]] = {}


def _plan_for(options: DecoderOptions) -> tuple[ValuePlan, Decompressor | None]:
    plan = _plans.get(options)
    if plan is None:
        plan = (
            ValuePlan(legacy_base64_strings=options.legacy_base64_strings),
            decompressor(options.compression),
        )
        _plans[options] = plan
    return plan


def _row_images(val: Any, plan: ValuePlan) -> tuple[RowKind, Row | None, Row | None]:
    """Kind, new image and old image of a row value document (``u``/``p``/``d``)."""
    d = val.get("d")
    if d is not None:
        return _DELETE, None, normalize_row(d, plan)
    u = val.get("u")
    if u is None:
        raise Problem("row value has neither u nor d")
    new = normalize_row(u, plan)
    p = val.get("p")
    if p is None:
        return _INSERT, new, None
    old = normalize_row(p, plan)
    if old.keys() != new.keys():
        old = fill_old(old, new)
    return _UPDATE, new, old


def _parse_object(doc: bytes | memoryview, what: str) -> dict[str, Any]:
    obj = _loads(doc)
    if type(obj) is not dict:
        raise Problem(f"{what} JSON is not an object")
    return obj


def _large_row(
    vdoc: bytes | memoryview,
    plan: ValuePlan,
    ts: int,
    scm: str,
    tbl: str,
    ptn: int | None,
    pos: Position,
    rid: int | None = None,
) -> RowEvent | None:
    """What an ``ohk``/``ccl`` event's value carries, decoded like any row, if it carries a row."""
    if not vdoc:
        return None
    val = _parse_object(vdoc, "value")
    if "u" not in val and "d" not in val and "p" not in val:
        return None
    kind, new, old = _row_images(val, plan)
    return RowEvent(ts, scm, tbl, kind, new, old, ptn, pos, rid)


def _malformed(
    reason: str, excerpt: Any, topic: str, partition: int, offset: int, index: int
) -> MalformedRecordError:
    if excerpt is None:
        excerpt = b""
    elif not isinstance(excerpt, bytes | str):
        excerpt = bytes(excerpt[: MalformedRecordError.EXCERPT_BYTES])
    return MalformedRecordError(
        reason, topic=topic, partition=partition, offset=offset, index=index, excerpt=excerpt
    )


@lru_cache(maxsize=2048)
def _guard_verdict(
    query: str, ddl_type: int, schema: str, table: str, reserved: frozenset[str]
) -> str | None:
    """Why the DDL guard refuses the event (None: it accepts it). TiCDC writes every DDL to each
    partition of the topic: one reading of the text serves all its copies."""
    try:
        check_ddl(query, ddl_type, schema, table, reserved_schemas=reserved)
    except HostileDDL as e:
        return str(e)
    return None


def _careful_event(
    kdoc: bytes,
    vdoc: Any,
    plan: ValuePlan,
    decompress: Decompressor | None,
    pos: Position,
    reserved: frozenset[str] = frozenset(),
) -> Event:
    """Decode one event with every check spelled out: the reference behaviour.

    Raises :class:`_EventError` (reason, excerpt) for bad input: the excerpt is the Problem's own
    when it has one, else the document being looked at (the key, then the decompressed value).
    """
    doc: Any = kdoc
    try:
        k = _loads(kdoc)
        if type(k) is not dict:
            raise Problem("key JSON is not an object")
        ts = k.get("ts")
        if type(ts) is not int or ts < 0:
            raise Problem("key ts is missing or not an unsigned integer")
        kind = k.get("t")
        if kind == KIND_ROW and type(kind) is int:
            scm = k.get("scm", "")
            tbl = k.get("tbl", "")
            if type(scm) is not str or type(tbl) is not str:
                raise Problem("key scm/tbl is not a string")
            ptn = k.get("ptn")
            if ptn is not None and type(ptn) is not int:
                raise Problem("key ptn is not an integer")
            rid = k.get("rid")
            if rid is not None and type(rid) is not int:
                raise Problem("key rid is not an integer")
            ohk = k.get("ohk")
            ccl = k.get("ccl")
            large = ohk or ccl is not None
            if large:
                if type(ohk) is not bool and ohk is not None:
                    raise Problem("key ohk is not a boolean")
                if ccl is not None:
                    if type(ccl) is not str:
                        raise Problem("key ccl is not a string")
                    try:
                        claim_check_name(ccl)
                    except ValueError as e:
                        raise Problem(str(e), kdoc) from None
            if decompress is not None and vdoc:
                vdoc = decompress(vdoc)
            doc = vdoc
            if large:
                row = _large_row(vdoc, plan, ts, scm, tbl, ptn, pos, rid)
                if ccl is None and row is None:
                    raise Problem("handle-key-only event carries no handle-key columns (no u or d)")
                return LargeMessageEvent(ts, scm, tbl, bool(ohk), ccl, row, pos)
            if not vdoc:
                raise Problem("row event has an empty value")
            val = _loads(vdoc)
            if type(val) is not dict:
                raise Problem("value JSON is not an object")
            row_kind, new, old = _row_images(val, plan)
            return RowEvent(ts, scm, tbl, row_kind, new, old, ptn, pos, rid)
        if kind == KIND_RESOLVED and type(kind) is int:
            return ResolvedEvent(ts, pos)
        if kind == KIND_DDL and type(kind) is int:
            scm = k.get("scm", "")
            tbl = k.get("tbl", "")
            if type(scm) is not str or type(tbl) is not str:
                raise Problem("key scm/tbl is not a string")
            if decompress is not None and vdoc:
                vdoc = decompress(vdoc)
            doc = vdoc
            if not vdoc:
                raise Problem("DDL event has an empty value")
            val = _parse_object(vdoc, "value")
            query = val.get("q")
            if type(query) is not str:
                raise Problem("DDL value has no query string q")
            ddl_type = val.get("t", 0)
            if type(ddl_type) is not int:
                raise Problem("DDL type t is not an integer")
            refused = _guard_verdict(query, ddl_type, scm, tbl, reserved)
            if refused is not None:
                raise Problem(f"DDL text does not match its event: {refused}", query)
            return DDLEvent(ts, scm, tbl, query, ddl_type, pos)
        raise Problem(f"unknown event kind t={kind!r}")
    except Problem as e:
        raise _EventError(e.reason, e.excerpt if e.excerpt is not None else doc) from e
    except MemoryError:  # running out of memory says nothing about the input (see module docstring)
        raise
    except Exception as e:
        raise _EventError(f"{type(e).__name__}: {e}", doc) from e


class _EventError(ApplierError):
    """An event that the careful path rejected: reason and excerpt, position still to be added."""

    def __init__(self, reason: str, excerpt: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.excerpt = excerpt


def _split(key: Any, value: Any, topic: str, partition: int, offset: int) -> tuple[list[bytes], list[bytes]]:
    try:
        return split_record(key, value)
    except Problem as e:
        raise _malformed(e.reason, e.excerpt, topic, partition, offset, -1) from None
    except MemoryError:
        raise
    except Exception as e:  # e.g. a key of a type that is not bytes-like
        raise _malformed(f"{type(e).__name__}: {e}", key, topic, partition, offset, -1) from None


def _careful_event_at(
    kdoc: bytes,
    vdoc: Any,
    plan: ValuePlan,
    decompress: Decompressor | None,
    options: DecoderOptions,
    topic: str,
    partition: int,
    offset: int,
    index: int,
) -> Event:
    """:func:`_careful_event` of the event at ``index`` of a record, a rejection raised as the
    record's :class:`MalformedRecordError`: for every event the fast path gave up on, and for every
    event with ``fast=False``."""
    try:
        return _careful_event(
            kdoc, vdoc, plan, decompress, Position(topic, partition, offset, index), options.reserved_schemas
        )
    except _EventError as e:
        raise _malformed(e.reason, e.excerpt, topic, partition, offset, index) from e.__cause__


def decode_record(
    key: bytes | None,
    value: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    options: DecoderOptions = DEFAULT_OPTIONS,
    fast: bool = True,
    old_keys_only: bool = False,
) -> list[Event]:
    """Decode every event of one Kafka record, in record order.

    Raises MalformedRecordError for any input that is not valid Open Protocol; its ``index`` is
    the event's index in the record, or -1 when the framing itself is broken.

    ``fast=False`` (:func:`decode_record_careful`) decodes every event by :func:`_careful_event`
    alone: the reference the fast path is tested against (same results, same errors); not for
    production use, it is slower.

    ``old_keys_only`` (the daemon and the catch-up's readers): the old image of an update whose
    columns and handle key are those of its new image comes as a CompactImage of the handle-key
    columns alone, the other columns checked but their values not built. Neither reads anything
    else of it (whether the update moves the key: the daemon's listener drops it when the key is
    kept, ``sqlgen.update_keeps_key``), and building the values they drop is a good part of the
    decode's time (docs/performance.md). Other old images come whole, as always.
    """
    plan, decompress = _plan_for(options)
    # Producers older than v4.0.5 send no column flags, which the fast path always gives up on.
    if fast and not options.legacy_base64_strings:
        events = _decode_fast(
            key, value, topic, partition, offset, plan, decompress, options, _careful_event_at, old_keys_only
        )
        if events is not None:
            return events
    # The careful path alone; also every record the fast path does not frame (it then raises).
    keys, values = _split(key, value, topic, partition, offset)
    return [
        _careful_event_at(
            keys[index], values[index], plan, decompress, options, topic, partition, offset, index
        )
        for index in range(len(keys))
    ]


# The reference decoder by its own name (the fast-path tests and the decode benchmark compare the
# two): one signature, so that both always take the same arguments.
decode_record_careful = partial(decode_record, fast=False)

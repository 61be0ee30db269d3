"""TiCDC Open Protocol decoder: one Kafka record -> its events (docs/open-protocol.md §1-§4).

``decode_record`` is the applier's hot path. It frames the record, parses every key and value
document with orjson, validates and converts column values in place (see values.py). Every kind
of bad input surfaces as :class:`MalformedRecordError` carrying the record's position. A
MemoryError is the one exception that is never turned into it: it says that this process ran
out of memory, not that the record is bad, and no small input may cause one (the fuzz tests,
tests/unit/test_codec_fuzz.py, decode under an address-space limit to check that).

Each event is decoded by one of two paths with the same results:

* the *fast path*, inlined in :func:`decode_record`, handles what current producers send (row
  events with ``{t, f, v}`` columns, resolved events) with as few Python operations per column as
  possible, and gives up at the first thing it does not expect, by raising anything at all;
* the *careful path*, :func:`_careful_event`, the reference: every field checked in order, with a
  precise reason for whatever is wrong. It decodes again, from its bytes, every event the fast
  path gave up on (DDL and large-message events, old producers, malformed input).

So the fast path never needs an error message; it only must never accept what the careful path
rejects nor produce anything else (tests/unit/test_codec_fastpath.py feeds both the same records).

Every DDL event (careful path only: they are rare) is also checked by :mod:`sqlgen.ddl_guard`:
its text must be the DDL its type code and key describe, touching no reserved schema. A DDL
text is input like any other, and one that is not what its event says is malformed input, so it
stops the reader at that record before anything at or after it runs. The guard is the codec's one
import from outside it: a pure function over tokens (:mod:`sqlgen.sqltokens`), no database.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import orjson

from applier.codec.compression import Decompressor, decompressor
from applier.codec.errors import MalformedRecordError
from applier.codec.events import (
    FLAG_HANDLE_KEY,
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
from applier.codec.values import (
    K_BLOB,
    K_DECIMAL,
    K_QUOTED,
    K_TEXT,
    ValuePlan,
    fast_kinds,
    go_unquote,
    normalize_row,
)
from applier.codec.values import a2b_base64 as _a2b_base64
from applier.codec.values import decimal_match as _decimal_match
from applier.codec.values import escape_decode as _escape_decode
from applier.codec.values import search_slow_escape as _search_slow_escape
from applier.errors import ApplierError
from sqlgen.ddl_guard import HostileDDL, check_ddl

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
# The fast path compares the key's kind by identity: CPython keeps one object per small int, so
# an int 1 from the parser *is* KIND_ROW; anything else (true, 1.0) just takes the careful path.
_ROW, _RESOLVED = KIND_ROW, KIND_RESOLVED
_KINDS = fast_kinds()
_plans: dict[DecoderOptions, tuple[ValuePlan, Decompressor | None]] = {}

# The fast path builds Position and RowEvent objects without calling their __init__
# (object.__new__ and one slot store per field: two thirds of the cost of the dataclass call).
# That is the same object only while __init__ does nothing else; should events.py change these
# classes, importing the decoder fails instead of building incomplete events.
_new = object.__new__
_POSITION_FIELDS = ("topic", "partition", "offset", "index")
_ROW_EVENT_FIELDS = ("commit_ts", "schema", "table", "kind", "new", "old", "partition_id", "pos", "row_id")


def _check_event_layout() -> None:
    for cls, names in ((Position, _POSITION_FIELDS), (RowEvent, _ROW_EVENT_FIELDS)):
        if (
            tuple(f.name for f in fields(cls)) != names
            or getattr(cls, "__slots__", None) != names
            or hasattr(cls, "__post_init__")
        ):
            raise RuntimeError(f"{cls.__name__} changed: update decode_record's fast path")


_check_event_layout()


def _plan_for(options: DecoderOptions) -> tuple[ValuePlan, Decompressor | None]:
    plan = _plans.get(options)
    if plan is None:
        plan = (
            ValuePlan(legacy_base64_strings=options.legacy_base64_strings),
            decompressor(options.compression),
        )
        _plans[options] = plan
    return plan


def _fill_old(old: Row, new: Row) -> Row:
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
        old = _fill_old(old, new)
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
            try:
                check_ddl(query, ddl_type, scm, tbl, reserved_schemas=reserved)
            except HostileDDL as e:
                raise Problem(f"DDL text does not match its event: {e}", query) from None
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


class _Slow(Exception):
    """The fast path's "not sure": the event goes to the careful path."""


def decode_record(
    key: bytes | None,
    value: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    options: DecoderOptions = DEFAULT_OPTIONS,
    fast: bool = True,
) -> list[Event]:
    """Decode every event of one Kafka record, in record order.

    Raises MalformedRecordError for any input that is not valid Open Protocol; its ``index`` is
    the event's index in the record, or -1 when the framing itself is broken.

    ``fast=False`` (:func:`decode_record_careful`) decodes every event by :func:`_careful_event`
    alone: the reference the fast path is tested against (same results, same errors); not for
    production use, it is slower.
    """
    keys, values = _split(key, value, topic, partition, offset)
    plan, decompress = _plan_for(options)
    if not fast or options.legacy_base64_strings:
        # Producers older than v4.0.5 send no column flags, which the fast path always gives up on.
        return [
            _careful_event_at(
                keys[index], values[index], plan, decompress, options, topic, partition, offset, index
            )
            for index in range(len(keys))
        ]
    kinds = _KINDS
    loads = _loads
    new_object = _new
    decimal_match = _decimal_match
    escape_decode = _escape_decode
    search_slow_escape = _search_slow_escape
    a2b = _a2b_base64
    events: list[Event] = []
    append = events.append
    for index in range(len(keys)):
        kdoc = keys[index]
        # --- the fast path: any exception, or _Slow, sends the event to the careful path --------
        try:
            k = loads(kdoc)
            ts = k["ts"]
            kind = k["t"]
            if type(ts) is not int or ts < 0:
                raise _Slow
            if kind is _ROW:
                if len(k) == 4:  # the four fields TiCDC always sends, and nothing else
                    scm = k["scm"]
                    tbl = k["tbl"]
                    ptn = rid = None
                else:
                    scm = k.get("scm", "")
                    tbl = k.get("tbl", "")
                    ptn = k.get("ptn")
                    rid = k.get("rid")
                    if (ptn is not None and type(ptn) is not int) or (
                        rid is not None and type(rid) is not int
                    ):
                        raise _Slow
                    if k.get("ohk") or k.get("ccl") is not None:
                        raise _Slow  # a large message
                if type(scm) is not str or type(tbl) is not str:
                    raise _Slow
                vdoc = values[index]
                if decompress is not None and vdoc:
                    vdoc = decompress(vdoc)
                val = loads(vdoc)
                # Membership tests rather than .get: a null u, p or d then fails on .values().
                if "d" not in val:
                    new = val["u"]
                    if "p" not in val:
                        row_kind = _INSERT
                        old = None
                        cols = new.values()
                    else:
                        row_kind = _UPDATE
                        old = val["p"]
                        cols = [*new.values(), *old.values()]
                else:
                    row_kind = _DELETE
                    new = None
                    old = val["d"]
                    cols = old.values()
                # Every column of both images, normalised in place like values.normalize_row does
                # (see values.Kinds). The common column costs four subscripts, one membership
                # test and one type identity check.
                for col in cols:
                    v = col["v"]
                    vk = kinds[col["t"]][col["f"]]
                    if "h" in col:  # current TiCDC: "h": true on handle-key columns
                        if col.pop("h") is not True:
                            raise _Slow
                        f = col["f"]
                        if not f & FLAG_HANDLE_KEY:
                            col["f"] = f | FLAG_HANDLE_KEY
                    if type(v) is vk or v is None:
                        continue
                    if vk is K_DECIMAL:
                        # [0-9]*.?[0-9]* with a digit (isdigit is exact on ASCII) costs less
                        # than the regex, which decides everything else
                        if not (v.isascii() and v.replace(".", "", 1).isdigit()) and decimal_match(v) is None:
                            raise _Slow
                    elif vk is K_QUOTED:
                        if "\\" in v:
                            raw = v.encode()
                            col["v"] = (
                                escape_decode(raw)[0] if search_slow_escape(raw) is None else go_unquote(v)
                            )
                        else:
                            col["v"] = v.encode()
                    elif vk is K_BLOB:
                        col["v"] = a2b(v, strict_mode=True)
                    elif vk is K_TEXT:
                        raw = a2b(v, strict_mode=True)
                        try:
                            col["v"] = raw.decode()
                        except UnicodeDecodeError:
                            col["v"] = raw
                    elif vk is float and type(v) is int:  # Go writes 2.0 as 2
                        col["v"] = float(v)
                    else:
                        raise _Slow
                if row_kind is _UPDATE and old.keys() != new.keys():
                    old = _fill_old(old, new)
                pos = new_object(Position)
                pos.topic = topic
                pos.partition = partition
                pos.offset = offset
                pos.index = index
                event = new_object(RowEvent)
                event.commit_ts = ts
                event.schema = scm
                event.table = tbl
                event.kind = row_kind
                event.new = new
                event.old = old
                event.partition_id = ptn
                event.pos = pos
                event.row_id = rid
                append(event)
                continue
            if kind is _RESOLVED:
                append(ResolvedEvent(ts, Position(topic, partition, offset, index)))
                continue
        except Exception:
            pass
        # --- the careful path: this event again, from its bytes --------------------------------
        append(
            _careful_event_at(kdoc, values[index], plan, decompress, options, topic, partition, offset, index)
        )
    return events


# The reference decoder by its own name (the fast-path tests and the decode benchmark compare the
# two): one signature, so that both always take the same arguments.
decode_record_careful = partial(decode_record, fast=False)

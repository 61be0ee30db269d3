"""TiCDC Open Protocol encoding of simulated events, as TiCDC's Kafka sink writes it.

Written from docs/open-protocol.md §1-§4 and §7, independently of the project's decoder so
that decoding what this module produces is a real test:

* key JSON as each architecture writes it (docs/open-protocol.md §2): the classic one marshals
  a Go struct, ``{"ts","scm","tbl","rid","ptn","t"}`` in field order with empty fields omitted;
  the new one (TiCDC v9) writes ``{"ts","scm","tbl","t"}`` field by field, ``scm`` and ``tbl``
  even when empty, never ``rid``, and ``ptn`` last;
* ``ptn`` (the physical partition id) only on rows of partitioned tables;
* row value ``{"u","p","d"}`` with columns sorted by name (TiCDC marshals a Go map);
* column ``{"t","h","f","v"}``: ``h`` only on handle-key columns, as TiCDC still sends it;
* BINARY/VARBINARY values escaped like Go's ``strconv.Quote``, BLOB/TEXT values base64;
* optional value compression (snappy raw block / lz4 frame), never on keys or resolved values;
* record framing: key = 8-byte big-endian version 1 + (8-byte length + key JSON)*,
  value = (8-byte length + value JSON)*;
* large messages (docs/open-protocol.md §9): an event's size as TiCDC measures it against
  ``max-message-bytes``, the key of a handle-key-only event (``ohk``) and of a claim-check
  reference (``ccl``), the value holding only the handle-key columns, and the claim-check object.

The legacy mode reproduces producers before v4.0.5: CHAR/VARCHAR values base64 as well, no ``f``
field (``h`` marks the handle), and no old values.
"""

from __future__ import annotations

import base64
import random
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from applier.codec.events import FLAG_BINARY, FLAG_HANDLE_KEY
from applier.simulator.golang import Float32, go_json, go_json_fields, go_quote
from applier.simulator.tables import BLOB_TYPES, STRING_TYPES, TYPE_FLOAT

if TYPE_CHECKING:
    from applier.simulator.model import SimEvent

PROTOCOL_VERSION = 1
KEY_ROW = 1
KEY_DDL = 2
KEY_RESOLVED = 3

COMPRESSIONS = (None, "snappy", "lz4")
ARCHITECTURES = ("classic", "new")

_U64 = struct.Struct(">Q")

CLAIM_CHECK = "claim-check"
HANDLE_KEY_ONLY = "handle-key-only"
LARGE_MESSAGE_OPTIONS = (CLAIM_CHECK, HANDLE_KEY_ONLY)  # TiCDC's large-message-handle-option

# What TiCDC adds to an event's key and value bytes when it checks max-message-bytes: the Kafka
# client's worst-case record overhead (five 32-bit varints, one 64-bit varint and an attributes
# byte), the two 8-byte length prefixes and the 8-byte version head.
MAX_RECORD_OVERHEAD = 5 * 5 + 10 + 1
EVENT_OVERHEAD = MAX_RECORD_OVERHEAD + 16 + 8


@dataclass(frozen=True)
class EncoderOptions:
    """The encoding choices a TiCDC changefeed makes (the row contents are decided upstream)."""

    legacy_strings: bool = False  # pre-v4.0.5: CHAR/VARCHAR base64, no "f"
    compression: str | None = None  # None | "snappy" | "lz4" (large-message-handle-compression)
    row_ids: bool = False  # send "rid" (the classic architecture does)
    architecture: str = "classic"  # "classic" | "new": decides the key layout

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, not {self.compression!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, not {self.architecture!r}")
        if self.row_ids and self.architecture == "new":
            raise ValueError("row_ids=True is impossible with architecture='new': it never sends rid")


def wire_value(type_code: int, flags: int, value: Any, legacy_strings: bool = False) -> Any:
    """The JSON value TiCDC writes for one column value (docs/open-protocol.md §4)."""
    if value is None:
        return None
    if type_code in STRING_TYPES:
        if legacy_strings:
            return _b64(value)
        if flags & FLAG_BINARY:
            if not isinstance(value, bytes):
                raise TypeError(f"binary string column needs bytes, got {type(value).__name__}")
            return go_quote(value)
        if not isinstance(value, str):
            raise TypeError(f"text string column needs str, got {type(value).__name__}")
        return value
    if type_code in BLOB_TYPES:
        return _b64(value)
    if type_code == TYPE_FLOAT:
        return Float32(value)
    if isinstance(value, bool):  # guard: bools are ints in Python but never column values
        raise TypeError("bool is not a column value")
    return value


def _b64(value: bytes | str) -> str:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return base64.b64encode(raw).decode("ascii")


def _column_json(type_code: int, flags: int, value: Any, legacy: bool) -> dict[str, Any]:
    col: dict[str, Any] = {"t": type_code}
    if flags & FLAG_HANDLE_KEY:
        col["h"] = True
    if not legacy:
        col["f"] = flags
    col["v"] = wire_value(type_code, flags, value, legacy)
    return col


def _image_json(image: dict[str, tuple[int, int, Any]], legacy: bool) -> dict[str, Any]:
    return {name: _column_json(*image[name], legacy) for name in sorted(image)}


def key_json(
    event: SimEvent, opts: EncoderOptions, *, handle_key_only: bool = False, claim_check: str | None = None
) -> bytes:
    """The key JSON of one event, in the field order of the configured architecture.

    ``handle_key_only`` marks a large event sent with its handle-key columns only (``ohk``);
    ``claim_check`` is the location of the stored full event that a reference carries (``ccl``).
    """
    kind = {"row": KEY_ROW, "ddl": KEY_DDL, "resolved": KEY_RESOLVED}[event.kind]
    if opts.architecture == "new":
        # The new encoder writes field by field: scm and tbl unconditionally for rows and DDLs,
        # then t, the large-message fields, then ptn for partitioned tables; it has no rid. A
        # claim-check reference is built as a handle-key-only event, so "ohk":true is written,
        # and then "ohk":false once more before "ccl": the key holds "ohk" twice.
        fields: list[tuple[str, Any]] = [("ts", event.commit_ts)]
        if event.kind != "resolved":
            fields += [("scm", event.schema), ("tbl", event.table)]
        fields.append(("t", kind))
        if handle_key_only or claim_check is not None:
            fields.append(("ohk", True))
        if claim_check is not None:
            fields += [("ohk", False), ("ccl", claim_check)]
        if event.kind == "row" and event.partition_id is not None:
            fields.append(("ptn", event.partition_id))
        return go_json_fields(fields)
    # The classic encoder marshals a struct: ts, scm, tbl, rid, ptn, t, ohk, ccl, empty ones
    # omitted. A claim-check reference has ohk false, so it carries ccl alone.
    key: dict[str, Any] = {"ts": event.commit_ts}
    if event.kind != "resolved":
        if event.schema:
            key["scm"] = event.schema
        if event.table:
            key["tbl"] = event.table
    if event.kind == "row":
        if opts.row_ids and event.row_id:
            key["rid"] = event.row_id
        if event.partition_id is not None:
            key["ptn"] = event.partition_id
    key["t"] = kind
    if handle_key_only and claim_check is None:
        key["ohk"] = True
    if claim_check is not None:
        key["ccl"] = claim_check
    return go_json(key)


def value_json(event: SimEvent, opts: EncoderOptions) -> bytes:
    """The value JSON of one event, before compression (empty for resolved events)."""
    if event.kind == "resolved":
        return b""
    if event.kind == "ddl":
        return go_json({"q": event.ddl_query, "t": event.ddl_type})
    body: dict[str, Any] = {}
    if event.row_kind == "delete":
        assert event.old is not None
        body["d"] = _image_json(event.old, opts.legacy_strings)
    else:
        assert event.new is not None
        body["u"] = _image_json(event.new, opts.legacy_strings)
        if event.old:
            body["p"] = _image_json(event.old, opts.legacy_strings)
    return go_json(body)


def _handle_key_image(image: dict[str, tuple[int, int, Any]]) -> dict[str, tuple[int, int, Any]]:
    return {name: col for name, col in image.items() if col[1] & FLAG_HANDLE_KEY}


def handle_key_value_json(event: SimEvent, opts: EncoderOptions) -> bytes:
    """The value JSON of a large row event reduced to its handle-key columns, before compression.

    What a handle-key-only event and a claim-check reference carry: every image the full event
    has, with only the handle-key columns. An update's "p" follows the full event's: absent
    without old values; with only-updated-columns it holds the changed handle-key columns, which
    are none (a handle-key change is split into a delete and an insert), so the classic encoder
    leaves the empty "p" out (it marshals a map with omitempty) while the new one writes
    ``"p":{}`` (it writes the field, then whatever columns qualify).
    """
    assert event.kind == "row"
    images: dict[str, dict[str, tuple[int, int, Any]]]
    if event.row_kind == "delete":
        assert event.old is not None
        images = {"d": _handle_key_image(event.old)}
    else:
        assert event.new is not None
        images = {"u": _handle_key_image(event.new)}
        if event.old is not None:
            old = _handle_key_image(event.old)
            if old or opts.architecture == "new":
                images["p"] = old
    if not images.get("d", images.get("u")):
        # A table without a handle key: both encoders refuse the event.
        raise ValueError(
            f"a large event of {event.schema}.{event.table} has no handle-key columns to send; "
            "TiCDC fails the changefeed here"
        )
    return go_json({name: _image_json(image, opts.legacy_strings) for name, image in images.items()})


def compress(data: bytes, algorithm: str | None) -> bytes:
    """Compress one value JSON the way TiCDC's ``large-message-handle-compression`` does."""
    if algorithm is None or not data:
        return data
    import cramjam

    if algorithm == "snappy":
        return bytes(cramjam.snappy.compress_raw(data))
    if algorithm == "lz4":
        return bytes(cramjam.lz4.compress(data))
    raise ValueError(f"unknown compression {algorithm!r}")


def encode_event(event: SimEvent, opts: EncoderOptions) -> tuple[bytes, bytes]:
    """(key JSON, value bytes as framed: compressed when configured) of one event."""
    return key_json(event, opts), compress(value_json(event, opts), opts.compression)


def frame(pairs: Sequence[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """Kafka record key and value carrying the given (key JSON, value) pairs in order."""
    key = bytearray(_U64.pack(PROTOCOL_VERSION))
    value = bytearray()
    for k, v in pairs:
        key += _U64.pack(len(k))
        key += k
        value += _U64.pack(len(v))
        value += v
    return bytes(key), bytes(value)


def framed_size(pairs: Sequence[tuple[bytes, bytes]]) -> int:
    """Bytes of key plus value of a record holding these pairs (for max-message-bytes)."""
    return 8 + sum(16 + len(k) + len(v) for k, v in pairs)


def event_size(key: bytes, value: bytes) -> int:
    """The size TiCDC compares with max-message-bytes for one encoded event (key JSON, value as
    framed): the bytes of a record holding it alone plus the Kafka client's record overhead."""
    return len(key) + len(value) + EVENT_OVERHEAD


def claim_check_name(rng: random.Random) -> str:
    """A claim-check object name as TiCDC makes it: a random (version 4) UUID plus ".json"."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4)) + ".json"


def claim_check_location(storage_uri: str, name: str) -> str:
    """The ``ccl`` of a reference: the storage URI without a trailing "/", "/", the object name."""
    return storage_uri.removesuffix("/") + "/" + name


def claim_check_object(key: bytes, value: bytes) -> bytes:
    """The stored form of a full event (key JSON, value as framed): JSON with the event's record
    key and value bytes (framed as a record of that one event) under "key" and "value", each
    base64 as Go marshals a byte slice."""
    record_key, record_value = frame([(key, value)])
    return go_json({"key": _b64(record_key), "value": _b64(record_value)})

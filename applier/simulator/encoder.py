"""TiCDC Open Protocol encoding of simulated events, as TiCDC's Kafka sink writes it.

Written from docs/open-protocol.md (§1-§4 and §7), independently of the project's decoder so
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
  value = (8-byte length + value JSON)*.

The legacy mode reproduces producers before v4.0.5: CHAR/VARCHAR values base64 as well, no ``f``
field (``h`` marks the handle), and no old values.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from applier.simulator.golang import Float32, go_json, go_quote
from applier.simulator.tables import (
    BLOB_TYPES,
    FLAG_BINARY,
    FLAG_HANDLE_KEY,
    STRING_TYPES,
    TYPE_FLOAT,
)

if TYPE_CHECKING:
    from applier.simulator.stream import SimEvent

PROTOCOL_VERSION = 1
KEY_ROW = 1
KEY_DDL = 2
KEY_RESOLVED = 3

COMPRESSIONS = (None, "snappy", "lz4")
ARCHITECTURES = ("classic", "new")

_U64 = struct.Struct(">Q")


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


def key_json(event: SimEvent, opts: EncoderOptions) -> bytes:
    """The key JSON of one event, in the field order of the configured architecture."""
    key: dict[str, Any] = {"ts": event.commit_ts}
    kind = {"row": KEY_ROW, "ddl": KEY_DDL, "resolved": KEY_RESOLVED}[event.kind]
    if opts.architecture == "new":
        # The new encoder writes scm and tbl unconditionally for rows and DDLs, then t, then
        # ptn for partitioned tables; it has no rid field.
        if event.kind != "resolved":
            key["scm"] = event.schema
            key["tbl"] = event.table
        key["t"] = kind
        if event.kind == "row" and event.partition_id is not None:
            key["ptn"] = event.partition_id
        return go_json(key)
    # The classic encoder marshals a struct: ts, scm, tbl, rid, ptn, t, empty ones omitted.
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

"""Claim-check objects: the full row event TiCDC kept outside Kafka (docs/open-protocol.md §9.1).

An object is JSON ``{"key": base64, "value": base64}``. Decoded, the two are exactly a Kafka record
of one event in the protocol's own framing (key: version 1, length, key JSON; value: length, value
JSON compressed like any value of the changefeed), so the daemon's decoder reads them as it reads
a record, with every check it makes there. The event must be the row the reference announced:
same commit ts, schema and table (and, when the reference carried one, the same kind of change);
anything else is bad input, reported at the reference's position with the object's name.
"""

from __future__ import annotations

import binascii
from typing import Any

import orjson

from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.errors import MalformedRecordError
from applier.codec.events import LargeMessageEvent, RowEvent
from applier.errors import ApplierError


class BadClaimCheckObject(ApplierError):
    """The object is not a claim-check message for its reference event; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _b64(doc: dict[str, Any], field: str) -> bytes:
    text = doc.get(field)
    if type(text) is not str:
        raise BadClaimCheckObject(f'the object has no base64 string "{field}"')
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise BadClaimCheckObject(f'"{field}" is not base64 ({exc})') from None


def row_from_object(data: bytes, ref: LargeMessageEvent, options: DecoderOptions) -> RowEvent:
    """The row event a claim-check object holds, placed at its reference's position.

    Raises :class:`BadClaimCheckObject` when the bytes are not such an object or hold another
    event than the reference announced.
    """
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadClaimCheckObject(f"the object is not JSON ({exc})") from None
    if type(doc) is not dict:
        raise BadClaimCheckObject("the object is not a JSON object")
    key, value = _b64(doc, "key"), _b64(doc, "value")
    pos = ref.pos
    try:
        events = decode_record(
            key, value, topic=pos.topic, partition=pos.partition, offset=pos.offset, options=options
        )
    except MalformedRecordError as exc:
        raise BadClaimCheckObject(f"the event inside is malformed: {exc.reason}") from None
    if len(events) != 1 or type(events[0]) is not RowEvent:
        kinds = ", ".join(type(e).__name__ for e in events) or "nothing"
        raise BadClaimCheckObject(f"the object must hold one row event, not {kinds}")
    row = events[0]
    if (row.commit_ts, row.schema, row.table) != (ref.commit_ts, ref.schema, ref.table):
        raise BadClaimCheckObject(
            f"the object holds a row of `{row.schema}`.`{row.table}` at commit ts {row.commit_ts}, "
            f"the reference one of `{ref.schema}`.`{ref.table}` at {ref.commit_ts}"
        )
    if ref.row is not None and ref.row.kind is not row.kind:
        raise BadClaimCheckObject(
            f"the object holds a {row.kind.name.lower()}, the reference a {ref.row.kind.name.lower()}"
        )
    row.pos = pos
    if row.row_id is None and ref.row is not None:
        row.row_id = ref.row.row_id
    return row

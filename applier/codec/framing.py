"""Kafka record framing of the TiCDC Open Protocol (docs/open-protocol.md §1).

Key: 8-byte big-endian version (must be 1), then ``[8-byte BE length, key JSON]*``.
Value: ``[8-byte BE length, value JSON]*``. The i-th key document belongs to the i-th value
document. This module only cuts the buffers into documents; it does not parse JSON, so framing
errors can be reported with event index -1 before any event is looked at.
"""

from __future__ import annotations

import struct

from applier.codec.problem import Problem

PROTOCOL_VERSION = 1

_U64 = struct.Struct(">Q")
_unpack_u64 = _U64.unpack_from


def _split(buf: bytes, start: int, what: str) -> list[bytes]:
    """Cut ``buf[start:]`` into length-prefixed documents; anything that does not frame exactly
    (truncated length, length beyond the buffer, trailing bytes) is a Problem.

    The loop checks nothing per document: a short length prefix makes ``unpack_from`` raise and a
    length beyond the buffer leaves ``pos`` past the end; both are diagnosed afterwards by
    :func:`_diagnose`, which keeps the common (valid) path to a handful of operations.
    """
    docs: list[bytes] = []
    append = docs.append
    pos = start
    end = len(buf)
    try:
        while pos < end:
            body = pos + 8
            pos = body + _unpack_u64(buf, pos)[0]
            append(buf[body:pos])
    except struct.error:
        pos = -1
    if pos != end:
        raise _diagnose(buf, start, what)
    return docs


_UNIFORM_MAX_DOCS = 64
_uniform_structs: dict[tuple[int, int], struct.Struct] = {}


def _split_uniform(buf: bytes, start: int) -> list[bytes] | None:
    """Cut ``buf[start:]`` in one C call when its documents all have the first one's length.

    That is the usual shape of a record's key: the events of a batch mostly share schema, table
    and the digit count of their commit ts. One ``Struct`` per (length, count), cached, unpacks
    every prefix and document at once; the buffer's size and every prefix are then checked, so
    the result is exactly what :func:`_split` would return. Anything else returns None.
    """
    try:
        (length,) = _unpack_u64(buf, start)
    except struct.error:
        return None
    count, rest = divmod(len(buf) - start, 8 + length)
    if rest or count > _UNIFORM_MAX_DOCS:
        return None
    layout = _uniform_structs.get((length, count))
    if layout is None:
        if len(_uniform_structs) >= 256:  # lengths of many tables over time: keep it bounded
            _uniform_structs.clear()
        layout = struct.Struct(f">{f'Q{length}s' * count}")
        _uniform_structs[(length, count)] = layout
    parts = layout.unpack_from(buf, start)
    if parts[0::2].count(length) != count:
        return None
    return list(parts[1::2])


def _diagnose(buf: bytes, start: int, what: str) -> Problem:
    """Explain why ``buf`` does not frame (slow path, only after _split found that it does not)."""
    pos = start
    end = len(buf)
    while end - pos >= 8:
        (length,) = _unpack_u64(buf, pos)
        if length > end - pos - 8:
            return Problem(
                f"{what}: document length {length} exceeds the {end - pos - 8} remaining bytes", buf[pos:]
            )
        pos += 8 + length
    return Problem(f"{what}: truncated length prefix ({end - pos} trailing bytes)", buf[pos:])


def split_record(key: bytes | None, value: bytes | None) -> tuple[list[bytes], list[bytes]]:
    """Return the key documents and the value documents of one record, pairwise aligned.

    An absent or empty value is accepted as "every event has an empty value" because a resolved
    event's value may reach us as nothing at all rather than as 8 zero bytes; whether an empty
    value is acceptable for each event's kind is the caller's decision.
    """
    if key is None:
        raise Problem("record has no key")
    if type(key) is not bytes:
        key = bytes(key)
    if len(key) < 8:
        raise Problem(f"key shorter than the 8-byte version ({len(key)} bytes)", key)
    (version,) = _unpack_u64(key, 0)
    if version != PROTOCOL_VERSION:
        raise Problem(f"unsupported protocol version {version} (expected {PROTOCOL_VERSION})", key[:8])
    keys = _split_uniform(key, 8) or _split(key, 8, "key")
    if not keys:
        raise Problem("key holds a version but no event", key)
    if not value:
        return keys, [b""] * len(keys)
    if type(value) is not bytes:
        value = bytes(value)
    values = _split(value, 0, "value")
    if len(values) != len(keys):
        raise Problem(f"record holds {len(keys)} key documents but {len(values)} value documents", value)
    return keys, values

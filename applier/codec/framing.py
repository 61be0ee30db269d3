"""Kafka record framing of the TiCDC Open Protocol (open-protocol.md section 1).

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
    keys = _split(key, 8, "key")
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

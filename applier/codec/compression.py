"""Value decompression (``large-message-handle-compression``, docs/open-protocol.md §1.4).

TiCDC compresses each row/DDL value JSON on its own and puts no marker in the message, so the
algorithm comes from configuration. ``cramjam`` is used because it offers both snappy's *raw block*
format (what TiCDC writes, not the framed stream format) and lz4's *frame* format.
"""

from __future__ import annotations

from collections.abc import Callable

import cramjam

from applier.codec.problem import Problem

Decompressor = Callable[[bytes], memoryview]

SUPPORTED = ("snappy", "lz4")


def snappy_bound(compressed: int) -> int:
    """The most bytes a raw snappy block of ``compressed`` bytes can decompress to.

    No element of the format yields more than 64 bytes from 3 bytes of input (a copy with a
    2-byte offset), so more than 64 bytes per 3 cannot be honest.
    """
    return 64 * (compressed // 3 + 1)


def _snappy(doc: bytes) -> memoryview:
    # The block starts with its uncompressed length, which the library allocates before reading
    # further: a few bytes claiming 4 GiB would abort the process under an address-space limit.
    claimed = cramjam.snappy.decompress_raw_len(doc)
    if claimed > snappy_bound(len(doc)):
        raise Problem(
            f"snappy value claims {claimed} uncompressed bytes, more than its {len(doc)} bytes can hold",
            doc,
        )
    # cramjam returns its own Buffer type; orjson accepts a memoryview over it without a copy.
    return memoryview(cramjam.snappy.decompress_raw(doc))


def _lz4(doc: bytes) -> memoryview:
    return memoryview(cramjam.lz4.decompress(doc))


def decompressor(name: str | None) -> Decompressor | None:
    """The function that undoes ``name`` compression, or None when values are not compressed.

    Unknown names raise ValueError at configuration time rather than on the first record.
    """
    if name is None or name == "" or name == "none":
        return None
    if name == "snappy":
        return _snappy
    if name == "lz4":
        return _lz4
    raise ValueError(f"unsupported compression {name!r}; expected one of {SUPPORTED} or None")

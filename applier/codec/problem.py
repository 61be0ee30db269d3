"""The decoder's internal "this input is bad" signal.

The codec's helpers raise :class:`Problem` with a human reason (and, when they know it better than
the caller, the offending bytes). Only :func:`applier.codec.decoder.decode_record` knows the
topic/partition/offset/index, so it alone turns a Problem into the public
:class:`~applier.codec.errors.MalformedRecordError`. Keeping the helpers free of position
arguments keeps their signatures small and the hot loop cheap.
"""

from __future__ import annotations

from applier.errors import ApplierError


class Problem(ApplierError):
    """Bad input found by a codec helper; converted to MalformedRecordError by the decoder."""

    def __init__(self, reason: str, excerpt: bytes | str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.excerpt = excerpt

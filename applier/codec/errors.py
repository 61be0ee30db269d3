"""The one error the decoder raises for bad input."""

from __future__ import annotations

from applier.errors import InputError


class MalformedRecordError(InputError):
    """A Kafka record that is not valid TiCDC Open Protocol.

    Carries where it was found (topic, partition, offset, the event's index in the record, -1
    when the record framing itself is broken) and a short excerpt of the offending bytes, so an
    operator can find the record with any Kafka tool.
    """

    EXCERPT_BYTES = 64

    def __init__(
        self,
        reason: str,
        *,
        topic: str,
        partition: int,
        offset: int,
        index: int = -1,
        excerpt: bytes | str = b"",
    ) -> None:
        if isinstance(excerpt, str):
            excerpt = excerpt.encode("utf-8", "backslashreplace")
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.index = index
        self.excerpt = excerpt[: self.EXCERPT_BYTES]
        where = f"topic {topic!r} partition {partition} offset {offset}"
        if index >= 0:
            where += f" event #{index}"
        super().__init__(
            f"malformed TiCDC Open Protocol record at {where}: {reason} (bytes: {self.excerpt!r})"
        )

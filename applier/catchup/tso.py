"""``--from-ts`` / ``--until``: a TiDB TSO integer or an ISO-8601 time, as a TSO.

A TSO is ``physical_ms << 18 | logical``. A time converts to the first TSO of its millisecond
(logical 0), so ``--from-ts 2024-05-01T10:00:00Z`` means "everything committed after that
instant's first TSO". A time without a zone is taken as UTC: the backup tools print UTC times and
a host's local zone must not silently shift the window. Pure Python: imported by the
configuration schema, so it must not pull in pyspark.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

PHYSICAL_SHIFT = 18
MAX_TSO = (1 << 63) - 1  # what the catch-up's Arrow columns (int64) and the checkpoint accept
_MS = timedelta(milliseconds=1)


def time_to_tso(moment: datetime) -> int:
    """The first TSO of ``moment``'s millisecond (naive datetimes are UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ms = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // _MS
    if ms < 0:
        raise ValueError("a time before 1970 has no TSO")
    return ms << PHYSICAL_SHIFT


def tso_to_time(ts: int) -> datetime:
    """The UTC time of a TSO's physical part (for messages)."""
    return datetime.fromtimestamp((ts >> PHYSICAL_SHIFT) / 1000.0, tz=UTC)


def parse_ts(text: str | int) -> int:
    """A TSO from ``text``: digits are a TSO as is, anything else must be an ISO-8601 time.

    Raises ValueError with a message that says which forms are accepted.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        s = str(text).strip()
        if s.isdigit():
            value = int(s)
        else:
            try:
                moment = datetime.fromisoformat(s.replace("z", "Z"))
            except ValueError:
                raise ValueError(
                    f"{s!r} is neither a TSO (an integer) nor an ISO-8601 time such as 2024-05-01T10:00:00Z"
                ) from None
            value = time_to_tso(moment)
    if not 0 <= value <= MAX_TSO:
        raise ValueError(f"TSO {value} is out of range [0, 2^63-1]")
    return value


def parse_until(text: str | int) -> int | None:
    """``--until``: ``latest`` (None: whatever the topic holds when the job starts) or a TS."""
    if isinstance(text, str) and text.strip().lower() == "latest":
        return None
    return parse_ts(text)

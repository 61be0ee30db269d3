"""Typed events decoded from TiCDC Open Protocol records.

These types are the contract between the decoder and everything downstream of it (listeners,
barrier, SQL planning, the Spark catch-up). They are deliberately light: one slotted object per
event, and columns as plain dicts (a ``Column`` TypedDict), except the new image of a keyed row
decoded by the fast path, which comes as a :class:`CompactImage` (it reads as the same dict).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, TypedDict

# Column flag bits (docs/open-protocol.md §3.3).
FLAG_BINARY = 0x01
FLAG_HANDLE_KEY = 0x02
FLAG_GENERATED = 0x04
FLAG_PRIMARY_KEY = 0x08
FLAG_UNIQUE_KEY = 0x10
FLAG_MULTIPLE_KEY = 0x20
FLAG_NULLABLE = 0x40
FLAG_UNSIGNED = 0x80

# Key "t" values.
KIND_ROW = 1
KIND_DDL = 2
KIND_RESOLVED = 3


class Column(TypedDict):
    """One column of a row image: ``t`` type code, ``f`` flags, ``v`` decoded value.

    ``f`` is always present after decoding and carries FLAG_HANDLE_KEY also when the producer
    used the legacy ``"h": true`` marker. ``v`` is what the database needs: int, float, str,
    bytes or None (DECIMAL stays an exact str).
    """

    t: int
    f: int
    v: Any


Row = dict[str, Column]
"""A row image: column name -> Column, in the producer's column order."""


class RowKind(enum.IntEnum):
    """What a row change event does. INSERT may also be an update whose old image was not sent,
    so it must be applied as an upsert."""

    INSERT = 1
    UPDATE = 2
    DELETE = 3


ROW_KINDS: dict[int, RowKind] = {int(k): k for k in RowKind}
"""RowKind by its number: a dict lookup where rows are rebuilt by the million (spill files, the
catch-up's Arrow columns and pickles), cheaper than calling the enum."""


@dataclass(slots=True)
class Position:
    """Where an event came from: used in error messages and for resume offsets."""

    topic: str
    partition: int
    offset: int
    index: int  # the event's index inside its Kafka record


@dataclass(slots=True)
class RowEvent:
    """A row change. ``new`` is set for INSERT/UPDATE, ``old`` for UPDATE (when sent) and DELETE."""

    commit_ts: int
    schema: str
    table: str
    kind: RowKind
    new: Row | None
    old: Row | None
    partition_id: int | None  # ``ptn``: physical partition of a partitioned table, informational
    pos: Position
    # ``rid``: the row's int handle (int primary key, or ``_tidb_rowid`` of a table without a
    # clustered key), sent by the classic architecture only. For a keyless table it is the
    # row's identity (docs/open-protocol.md §5.6).
    row_id: int | None = None
    # The new image's values in its column order, taken while the row is still in the CPU cache
    # (by the decoder's fast path as it builds the image, else by the daemon's listener): planning
    # reads them here instead of walking the image again a window later, when reading them cost
    # most of planning's time. None: not taken (planning reads the image). Never part of an
    # event's identity.
    new_values: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class DDLEvent:
    commit_ts: int
    schema: str
    table: str
    query: str
    ddl_type: int
    pos: Position


@dataclass(slots=True)
class ResolvedEvent:
    ts: int
    pos: Position


@dataclass(slots=True)
class LargeMessageEvent:
    """A row event sent with ``ohk`` (only handle-key columns) or ``ccl`` (claim check).

    Its value carries only the handle-key columns; the full row is read from upstream TiDB as of
    the commit ts (``ohk``) or from the claim-check object (``ccl``) by
    :mod:`applier.large_messages` before the listeners see the event (docs/open-protocol.md §9).
    A ``ccl`` wins over ``ohk``, as in TiCDC's consumers.
    """

    commit_ts: int
    schema: str
    table: str
    handle_key_only: bool
    claim_check_location: str | None
    row: RowEvent | None  # what the value carried, decoded like any row event, if anything
    pos: Position

    @property
    def claim_check_name(self) -> str | None:
        """The object name the reference points to (the decoder checked it is a plain name)."""
        if self.claim_check_location is None:
            return None
        return claim_check_name(self.claim_check_location)


Event = RowEvent | DDLEvent | ResolvedEvent | LargeMessageEvent


def claim_check_name(location: str) -> str:
    """The base name of a claim-check location: the only part of it a consumer may use.

    The location is the producer's full URI of the object (``s3://bucket/prefix/<uuid>.json``,
    ``file:///dir/<uuid>.json``); the consumer reads the object of that name under its own,
    configured storage root and never opens the location itself, so a record cannot point the
    daemon at another file or bucket. Raises ValueError when the base name is not a plain object
    name (empty, ``.``, ``..``, or holding a backslash or NUL).
    """
    name = location.rpartition("/")[2]
    if name in ("", ".", "..") or "\\" in name or "\x00" in name:
        raise ValueError(f"claim-check location {location[:200]!r} does not end in a plain object name")
    return name


def tso_physical_ms(ts: int) -> int:
    """Milliseconds since the epoch of a TiDB TSO (``physical << 18 | logical``)."""
    return ts >> 18


_TYPE_AND_FLAGS = itemgetter("t", "f")


class ImageShape:
    """What rows of one column layout share: names, type codes and flags, and where the handle key
    is. One instance serves every compact image of that layout (:class:`CompactImage`)."""

    __slots__ = ("flags", "index", "key_index", "key_names", "layout", "names", "types")

    def __init__(self, names: tuple[str, ...], layout: tuple[tuple[int, int], ...]) -> None:
        self.names = names
        self.layout = layout  # (type code, flags) per column
        self.types = tuple([t for t, _f in layout])
        self.flags = tuple([f for _t, f in layout])
        self.index = {n: i for i, n in enumerate(names)}
        self.key_index = tuple([i for i, f in enumerate(self.flags) if f & FLAG_HANDLE_KEY])
        self.key_names = tuple([names[i] for i in self.key_index])

    @classmethod
    def of(cls, row: Row) -> ImageShape:
        return cls(tuple(row), tuple(map(_TYPE_AND_FLAGS, row.values())))


@dataclass(slots=True, eq=False, repr=False)
class CompactImage(Mapping[str, Column]):
    """A row image held as its shared :class:`ImageShape` and a tuple of values.

    Why: a decoded image is a dict of ``{t, f, v}`` dicts, about 1 KB for four columns, and the
    daemon's row cache holds tens of thousands of rows while they wait for their window; the
    names, types and flags are the same for every row of a table. The decoder's fast path gives
    a keyed row's new image in this form (the dicts were built only to be converted and freed),
    and the daemon's listener converts the ones the careful path decoded before caching them
    (``applier.codec._fastpath`` builds both slot by slot: keep this a slotted dataclass of these
    two fields). It reads as the dict it replaces (a ``Column`` dict is built on each lookup, so
    it equals the original image, but for the order of ``t``, ``f`` and ``v`` inside a column);
    the listener, planning and the catch-up read ``shape`` and ``column_values`` directly.
    """

    shape: ImageShape
    column_values: tuple[Any, ...]

    def __getitem__(self, name: str) -> Column:
        shape = self.shape
        i = shape.index[name]
        return {"t": shape.types[i], "f": shape.flags[i], "v": self.column_values[i]}

    def __iter__(self) -> Iterator[str]:
        return iter(self.shape.names)

    def __len__(self) -> int:
        return len(self.shape.names)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def has_handle_key(row: Row | None) -> bool:
    """True when a column of ``row`` (an image, compact or not, or None) is flagged handle key."""
    if not row:
        return False
    if type(row) is CompactImage:
        return bool(row.shape.key_index)
    return any(col["f"] & FLAG_HANDLE_KEY for col in row.values())


def handle_key_names(row: Row) -> list[str]:
    """Names of the handle-key columns of a row image, in column order."""
    return [name for name, col in row.items() if col["f"] & FLAG_HANDLE_KEY]


def key_only(row: Row, names: Sequence[str]) -> Row:
    """The handle-key columns ``names`` of ``row`` (all planning reads of a keyed delete's image),
    key columns it lacks skipped."""
    return {n: row[n] for n in names if n in row}

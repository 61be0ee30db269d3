"""Turn one window of row events into a per-table plan of final row states.

A *window* is every row event with commit ts in ``(previous resolved, resolved]``, from all
Kafka partitions, in arrival order (not ts order across partitions), possibly with exact
duplicates from TiCDC replays. Nothing here talks to a database: the result is plain, picklable
data that :mod:`sqlgen.dml` renders as SQL. The daemon plans one window at a time; the
Spark catch-up job plans one DDL epoch per executor, so no function keeps state between calls.

Keyed tables (some column carries FLAG_HANDLE_KEY)
--------------------------------------------------
Every event is turned into ops on a *handle key* (the values of the handle-key columns): DELETE
-> delete of its old key; INSERT (or an UPDATE without old image) -> upsert of its new key;
UPDATE -> upsert of its key (taken from the old image), or, if the new image has a different
key (TiCDC splits such updates, but be safe), delete of the old key plus upsert of the new one.
Ops are ordered by ``(commit_ts, deletes before upserts, arrival)`` — a stable sort — and the
last op per key wins: the key ends *deleted* or *upserted with its last new image*.

Why applying "all deletes, then ``REPLACE INTO`` all upserts" converges
----------------------------------------------------------------------
The final upserts are, key by key, the rows as they are in upstream at the window's resolved
ts: one upstream snapshot, so they are mutually consistent — no two of them share a value of any
unique key. ``REPLACE`` first deletes every downstream row that conflicts with the new row on
*any* unique key, then inserts it. A downstream row R that conflicts with a final upsert U cannot
be in that snapshot holding the conflicting value, so R was changed or deleted in this window:
either R's key is in the delete set, or R's own final image is among the upserts and is
REPLACEd (back) too. And no REPLACE can remove a row written by another final upsert, because
they do not conflict. Hence unique values swapped between two rows, a primary-key change split
into DELETE + INSERT (same ts, different partitions, any arrival order), delete-then-reinsert
and replays all end in exactly the upstream state, without error 1062 and whatever order the
statements of one kind run in. The ordering rule "deletes before inserts at equal ts" is what
makes a split PK change (delete old key, insert new key, same ts) come out right when the new
key equals another row's old key.

This does not regroup a transaction into "deletes, updates, inserts" as TiCDC's own consumer once
did (docs/open-protocol.md §6): there are no UPDATE statements at all, only whole-row REPLACEs of final
states, which is why swaps converge here.

Keyless tables (no column flagged handle key in any image of the window)
------------------------------------------------------------------------
Rows cannot be identified, so nothing is collapsed or deduplicated: events are ordered the same
way and become an ordered list of ops — DELETE old row (all non-generated columns, LIMIT 1) and
INSERT new row; an UPDATE is delete old + insert new. An INSERT, or an UPDATE whose old image was
not sent, is a plain INSERT: the upsert it may stand for is impossible without a key (this can
leave the pre-update row behind; TiCDC only replicates keyless tables with ``force-replicate``
and sends the old image by default). Exact duplicates are applied as given: they are
indistinguishable from legitimately identical rows, so replay safety for keyless tables has to
come from the caller's checkpoint.

Images: generated columns (FLAG_GENERATED) are never written nor matched. Upserts are grouped by
their column list, so each REPLACE has one explicit column list even when images of a table
carry different column sets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal

from applier.codec.events import (
    FLAG_GENERATED,
    FLAG_HANDLE_KEY,
    CompactImage,
    Row,
    RowEvent,
    RowKind,
    has_handle_key,
)
from applier.errors import InputError, compiled_module_missing

try:
    from sqlgen._plan import plan_keyed
except ImportError as _e:  # an install from before the module existed: one clear line
    raise compiled_module_missing("the compiled planning", "sqlgen/_plan.pyx", _e) from _e

_DELETE = RowKind.DELETE
_UPDATE = RowKind.UPDATE
_HK = FLAG_HANDLE_KEY
_GEN = FLAG_GENERATED

TableId = tuple[str, str]
Key = tuple[tuple[str, ...], tuple[Any, ...]]
"""A handle key: (column names, values), both in image column order."""


class PlanError(InputError):
    """An event that cannot be applied safely (e.g. a delete with no usable WHERE columns)."""

    def __init__(self, reason: str, event: RowEvent) -> None:
        self.reason = reason
        self.event = event
        p = event.pos
        super().__init__(
            f"cannot plan row event for `{event.schema}`.`{event.table}` at commit ts {event.commit_ts} "
            f"(topic {p.topic!r} partition {p.partition} offset {p.offset} event #{p.index}): {reason}"
        )


@dataclass(slots=True)
class DeleteGroup:
    """Handle keys to delete, all with the same key columns."""

    columns: tuple[str, ...]
    types: tuple[int, ...]
    keys: list[tuple[Any, ...]] = field(default_factory=list)


@dataclass(slots=True)
class UpsertGroup:
    """Final row images with the same written column list; ``keys[i]`` is the handle key of ``rows[i]``."""

    columns: tuple[str, ...]
    types: tuple[int, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    keys: list[tuple[Any, ...]] = field(default_factory=list)


@dataclass(slots=True)
class KeylessOp:
    """One ordered operation on a keyless table: delete one matching row, or insert a row."""

    kind: Literal["delete", "insert"]
    columns: tuple[str, ...]
    types: tuple[int, ...]
    values: tuple[Any, ...]


@dataclass(slots=True)
class TablePlan:
    """What to do to one table: for keyed tables ``deletes`` then ``upserts``; else ``ops`` in order."""

    schema: str
    table: str
    keyed: bool
    events: int = 0
    deletes: list[DeleteGroup] = field(default_factory=list)
    upserts: list[UpsertGroup] = field(default_factory=list)
    ops: list[KeylessOp] = field(default_factory=list)

    @property
    def delete_keys(self) -> list[tuple[Any, ...]]:
        """All handle-key tuples whose final state is deleted."""
        return [k for g in self.deletes for k in g.keys]

    def row_counts(self) -> dict[str, int]:
        """Rows per statement kind: ``delete``, ``replace`` (keyed) and ``insert`` (keyless)."""
        if self.keyed:
            return {
                "delete": sum(len(g.keys) for g in self.deletes),
                "replace": sum(len(g.rows) for g in self.upserts),
                "insert": 0,
            }
        n_del = sum(1 for op in self.ops if op.kind == "delete")
        return {"delete": n_del, "replace": 0, "insert": len(self.ops) - n_del}


@dataclass(slots=True)
class WindowPlan:
    """Plans of every table touched by one window, keyed by (schema, table)."""

    tables: dict[TableId, TablePlan] = field(default_factory=dict)
    events: int = 0

    def row_counts(self) -> dict[TableId, dict[str, int]]:
        """``{(schema, table): {"delete": n, "replace": n, "insert": n}}`` for metrics and logs."""
        return {tid: tp.row_counts() for tid, tp in self.tables.items()}

    def totals(self) -> dict[str, int]:
        """Row counts summed over tables, plus ``events`` (input events)."""
        out = {"events": self.events, "delete": 0, "replace": 0, "insert": 0}
        for tp in self.tables.values():
            for k, v in tp.row_counts().items():
                out[k] += v
        return out


def plan_window(events: Iterable[RowEvent], tables: Collection[TableId] | None = None) -> WindowPlan:
    """Plan one window (see the module docstring for the semantics). Raises :class:`PlanError`.

    ``tables``, when the caller knows them (the daemon's window does), are the tables of
    ``events``; with a single one the per-event grouping by table is skipped.
    """
    if tables is not None and len(tables) == 1:
        ((schema, table),) = tables
        evs = events if isinstance(events, list) else list(events)
        plan = WindowPlan(events=len(evs))
        if evs:
            plan.tables[(schema, table)] = plan_table(schema, table, evs)
        return plan
    groups: dict[TableId, list[RowEvent]] = {}
    n = 0
    for ev in events:
        n += 1
        tid = (ev.schema, ev.table)
        lst = groups.get(tid)
        if lst is None:
            groups[tid] = [ev]
        else:
            lst.append(ev)
    plan = WindowPlan(events=n)
    for (schema, table), evs in groups.items():
        plan.tables[(schema, table)] = plan_table(schema, table, evs)
    return plan


def plan_table(schema: str, table: str, events: list[RowEvent]) -> TablePlan:
    """Plan the events of one table, given in arrival order."""
    tp = plan_keyed(events) if _any_handle_key(events) else _plan_keyless(events)
    tp.schema = schema
    tp.table = table
    tp.events = len(events)
    return tp


def _any_handle_key(events: list[RowEvent]) -> bool:
    """True when any image flags a handle-key column (usually decided by the first event)."""
    return any(has_handle_key(ev.new) or has_handle_key(ev.old) for ev in events)


class _KeyReader:
    """Handle keys of images, with the key column names cached per image column list.

    Finding the key columns means testing every column's flags; caching that per column list
    makes it one dict lookup per event. Flags only change with a DDL, and a window (or a Spark
    DDL epoch) never spans one, so the column list identifies the key columns.
    """

    __slots__ = ("cache",)

    def __init__(self, cache: dict[tuple[str, ...], tuple[str, ...]] | None = None) -> None:
        self.cache: dict[tuple[str, ...], tuple[str, ...]] = {} if cache is None else cache

    def key(self, row: Row) -> Key:
        names = tuple(row)
        knames = self.cache.get(names)
        if knames is None:
            knames = tuple([n for n, col in row.items() if col["f"] & _HK])
            self.cache[names] = knames
        return knames, tuple([row[n]["v"] for n in knames])

    def old_key(self, old: Row, new: Row, new_key: Key) -> Key:
        """Key of an update's old image; key columns it lacks are taken from the new image."""
        key = self.key(old)
        if key[0] == new_key[0] or not new_key[0]:
            return key
        return new_key[0], tuple([old[n]["v"] if n in old else new[n]["v"] for n in new_key[0]])


def update_keeps_key(ev: RowEvent) -> bool:
    """True when ``ev`` is an update of a keyed row whose old image names the same row as its new
    image (the handle key did not change, read as :func:`plan_table` reads it).

    Planning such an update reads its new image only (the upsert of that key), exactly as for an
    update sent without its old image, so whoever holds the event until it is planned may drop
    the old image: the daemon's row cache does, for half of such a row's memory. The key columns
    are read from the images' flags each time, with no cache: a long-lived caller sees DDLs that
    move the key without changing the column list. Values compare as the key tuples of
    :class:`_KeyReader` do (identical, or equal), without building them: this runs for every
    update the daemon caches. An old image the decoder reduced to its key columns (a
    CompactImage, ``decode_record(old_keys_only=True)``) is read by position, not through the
    column dicts its lookups would build.
    """
    old, new = ev.old, ev.new
    if ev.kind is not _UPDATE or old is None or new is None:
        return False
    if type(new) is CompactImage:  # the decoder's keyed new images: key positions known
        shape, values = new.shape, new.column_values
        pairs = [(n, values[i]) for n, i in zip(shape.key_names, shape.key_index, strict=True)]
    else:
        pairs = [(n, col["v"]) for n, col in new.items() if col["f"] & _HK]
    if not pairs:
        return False
    # The old key: the old image's values of these columns when it flags the same ones, else read
    # over these columns with those it lacks taken from the new image (only-output-updated-
    # columns); either way a column the old image lacks compares equal.
    if type(old) is CompactImage:  # reduced to its key columns by the decoder (old_keys_only)
        index, olds = old.shape.index, old.column_values
        for n, b in pairs:
            i = index.get(n)
            if i is not None and not (olds[i] is b or olds[i] == b):
                return False
        return True
    for n, b in pairs:
        col = old.get(n)
        if col is not None and not (col["v"] is b or col["v"] == b):
            return False
    return True


def _plan_keyed(events: list[RowEvent]) -> TablePlan:
    """The plan of a keyed table's events: the definition of :func:`plan_keyed`.

    The daemon runs the compiled ``plan_keyed`` (``sqlgen/_plan.pyx``), the same loops with the
    codec's slots read by offset; this one is what it is tested against
    (``tests/unit/test_sqlgen_plan_compiled.py``).
    """
    # One pass, no sort: for each handle key keep the op with the highest (commit_ts, priority),
    # the later one on ties: exactly the last op of a stable sort by (ts, priority), in O(n).
    # priority: 0 = delete, 1 = upsert (deletes before inserts at equal ts).
    # finals: key column names -> key values -> (ts, priority, new image or None, source image,
    # column names of the new image); usually a single key-column tuple per table.
    finals: dict[tuple[str, ...], dict[tuple[Any, ...], tuple[Any, ...]]] = {}
    knames_of: dict[tuple[str, ...], tuple[str, ...]] = {}  # image column names -> key columns
    keys = _KeyReader(knames_of)
    last_kn: tuple[str, ...] | None = None
    fin: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for ev in events:
        kind = ev.kind
        ts = ev.commit_ts
        if kind is _DELETE:
            img = ev.old
            if img is None:
                raise PlanError("delete event without old image", ev)
            new = None
            prio = 0
        else:
            img = new = ev.new
            if new is None:
                raise PlanError(f"{kind.name.lower()} event without new image", ev)
            prio = 1
        if type(img) is CompactImage:  # the daemon's cached new images: layout shared, values a tuple
            shape = img.shape
            names, kn, ki = shape.names, shape.key_names, shape.key_index
            if not kn:
                raise PlanError("row image of a keyed table carries no handle-key column", ev)
            vals = img.column_values
            kv = (vals[ki[0]],) if len(ki) == 1 else tuple([vals[i] for i in ki])
        else:
            names, kn, kv = _image_key(img, knames_of, ev, new is None)
        if kn is not last_kn:
            fin = finals.setdefault(kn, {})
            last_kn = kn
        if kind is _UPDATE and ev.old is not None:
            old = ev.old
            okn, okv = keys.old_key(old, new, (kn, kv))  # type: ignore[arg-type]
            if okv != kv or okn != kn:
                ofin = finals.setdefault(okn, {})
                cur = ofin.get(okv)
                if cur is None or ts > cur[0] or (ts == cur[0] and cur[1] == 0):
                    ofin[okv] = (ts, 0, None, old, None, None)
        cur = fin.get(kv)
        if cur is None or ts > cur[0] or (ts == cur[0] and prio >= cur[1]):
            fin[kv] = (ts, prio, new, img, names, ev.new_values)

    tp = TablePlan(schema="", table="", keyed=True)
    # image column names -> (group, indexes of written columns or None when all are written)
    shapes: dict[tuple[str, ...], tuple[UpsertGroup, list[int] | None]] = {}
    by_columns: dict[tuple[str, ...], UpsertGroup] = {}
    for knames, fin in finals.items():
        dg: DeleteGroup | None = None
        for kvals, (_ts, _prio, new, src, names, vals) in _by_key(fin):
            if new is None:
                if dg is None:
                    dg = DeleteGroup(knames, tuple(src[n]["t"] for n in knames))
                    tp.deletes.append(dg)
                dg.keys.append(kvals)
                continue
            shape = shapes.get(names)
            if shape is None:
                shape = upsert_group(new, by_columns, tp.upserts)
                shapes[names] = shape
            ug, keep = shape
            if vals is None:
                vals = tuple([c["v"] for c in new.values()])
            ug.rows.append(vals if keep is None else tuple([vals[i] for i in keep]))
            ug.keys.append(kvals)
    return tp


def _image_key(
    img: Row, knames_of: dict[tuple[str, ...], tuple[str, ...]], ev: RowEvent, deleting: bool
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Any, ...]]:
    """Column names, handle-key column names and key values of an image that is not compact (a
    delete's, or one the careful decoder gave): what planning reads of it, for both loops (this
    module's and ``sqlgen/_plan.pyx``'s). ``knames_of`` caches the key columns per column list."""
    names = tuple(img)
    kn = knames_of.get(names)
    if kn is None:
        kn = knames_of[names] = tuple([n for n, col in img.items() if col["f"] & _HK])
    if not kn:
        if deleting:
            raise PlanError("delete of a keyed table carries no handle-key column", ev)
        raise PlanError("row image of a keyed table carries no handle-key column", ev)
    kv = (img[kn[0]]["v"],) if len(kn) == 1 else tuple([img[n]["v"] for n in kn])
    return names, kn, kv


def _by_key(fin: dict[tuple[Any, ...], tuple[Any, ...]]) -> Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """Final states in handle-key order when the keys compare (else in arrival order).

    Only for the database's sake: rows written in key order touch each B-tree page once and
    let InnoDB append new keys at the end of the index instead of splitting pages, which made
    REPLACE of a window about 20% faster than partition-interleaved order. Keys are unique in
    ``fin``, so the sort never compares the states themselves.
    """
    items = list(fin.items())
    with contextlib.suppress(TypeError):  # e.g. a NULL in a key of an odd schema: any order will do
        items.sort(key=_first)
    return items


_first = itemgetter(0)


def _ts_prio(op: tuple[Any, ...]) -> tuple[int, int]:
    return op[0], op[1]


def upsert_group(
    img: Row, by_columns: dict[tuple[str, ...], UpsertGroup], groups: list[UpsertGroup]
) -> tuple[UpsertGroup, list[int] | None]:
    """The upsert group for images with ``img``'s column names, and the indexes of the written
    (non-generated) columns, or None when every column is written (no per-row selection).

    Shapes are cached per window by column names alone: whether a column is generated only
    changes with a DDL, and a window never spans one.
    """
    items = list(img.items())
    keep = [i for i, (_name, col) in enumerate(items) if not col["f"] & _GEN]
    cols = tuple(items[i][0] for i in keep)
    ug = by_columns.get(cols)
    if ug is None:
        ug = UpsertGroup(cols, tuple(items[i][1]["t"] for i in keep))
        by_columns[cols] = ug
        groups.append(ug)
    return ug, (None if len(keep) == len(items) else keep)


def _written(img: Row) -> tuple[tuple[str, ...], tuple[int, ...], tuple[Any, ...]]:
    names: list[str] = []
    types: list[int] = []
    vals: list[Any] = []
    for name, col in img.items():
        if col["f"] & _GEN:
            continue
        names.append(name)
        types.append(col["t"])
        vals.append(col["v"])
    return tuple(names), tuple(types), tuple(vals)


def _plan_keyless(events: list[RowEvent]) -> TablePlan:
    staged: list[tuple[int, int, KeylessOp]] = []
    for ev in events:
        kind = ev.kind
        if kind is _DELETE or (kind is _UPDATE and ev.old is not None):
            if ev.old is None:
                raise PlanError("delete event without old image", ev)
            names, types, vals = _written(ev.old)
            if not names:
                raise PlanError("delete from a keyless table with no columns to match", ev)
            staged.append((ev.commit_ts, 0, KeylessOp("delete", names, types, vals)))
        if kind is not _DELETE:
            if ev.new is None:
                raise PlanError(f"{kind.name.lower()} event without new image", ev)
            names, types, vals = _written(ev.new)
            staged.append((ev.commit_ts, 1, KeylessOp("insert", names, types, vals)))
    staged.sort(key=_ts_prio)
    return TablePlan(schema="", table="", keyed=False, ops=[s[2] for s in staged])


def split_phases(ev: RowEvent) -> tuple[RowEvent | None, RowEvent | None]:
    """The part of ``ev`` that belongs to the *delete phase* of its commit ts, and the part that
    belongs to its *upsert phase* (either may be None).

    Why: a transaction too large to plan at once is applied in pieces (``applier.stream.spill``), all
    deletes of its commit ts first, then all upserts, which is the order :func:`plan_window`
    gives the ops of one commit ts ("deletes before upserts at equal ts"). A DELETE is a delete,
    an INSERT an upsert; an UPDATE is an upsert of its new image, preceded by a delete of its old
    image when that one names another row: always for keyless tables (delete old row, insert new
    one), and for keyed tables when the handle key changed. The parts are plain events
    (``RowKind.DELETE`` with the old image, ``RowKind.INSERT`` with the new one), so planning them
    in that order yields exactly the ops planning ``ev`` would: for a keyed update with a new
    key, the delete carries the old image completed with the new image's columns it lacks
    (``only-output-updated-columns``), which is how :class:`_KeyReader` reads the old key.
    """
    kind = ev.kind
    if kind is _DELETE:
        return ev, None
    old, new = ev.old, ev.new
    if kind is not _UPDATE or old is None or new is None:
        return None, ev  # an insert, an update without old image (an upsert), or a PlanError later
    keys = _KeyReader()
    new_key = keys.key(new)
    if new_key[0]:
        if keys.old_key(old, new, new_key) == new_key:
            return None, ev  # same row: the upsert alone
        old = {**new, **old}
    elif _any_handle_key([ev]):
        return None, ev  # only the old image carries the key: planned as one event, like plan_table
    ts, schema, table, ptn, pos, rid = ev.commit_ts, ev.schema, ev.table, ev.partition_id, ev.pos, ev.row_id
    return (
        RowEvent(ts, schema, table, _DELETE, None, old, ptn, pos, rid),
        RowEvent(ts, schema, table, RowKind.INSERT, new, None, ptn, pos, rid),
    )

"""Per-partition state of the streaming applier: what a Kafka partition has delivered so far.

The Kafka loop calls ``PartitionListener.feed`` with the decoded events of each record, in offset
order. The listener keeps the rows that still need applying (grouped by commit ts), the DDLs that
wait for the barrier and the partition's resolved ts, and drops the copies it can prove are copies.

What the producers guarantee, and nothing more (docs/open-protocol.md §5.1-§5.4): delivery is at
least once; a resolved event R on a partition is TiCDC's persisted checkpoint, so every first copy with
commit ts <= R was delivered before it, and every replay restarts at or above it. First copies are
*not* in commit-ts order on a partition: the physical partitions of a partitioned table, a span
restarted after a failed produce ("B, then A, then B again") and, in the new architecture, the
tables a DDL does not block all deliver older first copies after newer rows. So no rule here
infers a replay from the order in which rows arrive. A row is dropped only when:

1. ``commit_ts <= max(applied ts, the table's checkpoint ts)``: applied before (the checkpoint).
2. ``commit_ts <= the highest resolved ts read on this partition``: the first copy came before that
   resolved event, so this is a copy (§5.3). Only resolved events count: a DDL says nothing about
   the rows of the tables it does not block (§5.4).
3. Keyless rows (no handle-key column) that carry ``rid`` (classic architecture: the row's int
   handle, ``_tidb_rowid``): the version ``(table, commit ts, kind, rid)`` was already kept, on any
   partition (a key may move partitions when the partition count grows, §5.7). Exact (§5.6).
4. Keyless rows without ``rid`` (new architecture): a replayed row cannot be told from a second
   identical row of the same transaction. The only copy recognised is a byte-identical copy of an
   earlier record of this partition holding keyless rows above its resolved ts (a producer retry
   re-sent the same batch); its keyless rows are dropped. Other replays of such rows above the
   resolved ts are applied again (an insert adds a second row, a delete removes a second identical
   one): the stated limit of the protocol, logged once per table. (Two genuinely different batches
   with exactly the same bytes would be taken for one.)

Keyed rows above the resolved ts are all kept, copies included: the window sorts by commit ts and
collapses per handle key (``sqlgen.collapse``), so a copy of a version changes nothing and a late
first copy is applied in its commit-ts place, below any newer version of the same key.

Resume offsets: ``resume_offset`` is the offset of the oldest record still holding a row or DDL
not yet applied, so restarting there loses nothing. When the resolved ts in force at that record is
above the applied ts, it is moved back to the record that set it: a restarted listener then drops
exactly the copies this one dropped by rule 2 (rule 4 relies on it). That is at most one resolved
interval further back.
"""

from __future__ import annotations

import hashlib
import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from operator import itemgetter

from applier.codec._fastpath import compact_image
from applier.codec.events import (
    FLAG_HANDLE_KEY,
    FLAG_PRIMARY_KEY,
    FLAG_UNIQUE_KEY,
    CompactImage,
    DDLEvent,
    Event,
    ImageShape,
    LargeMessageEvent,
    Position,
    ResolvedEvent,
    RowEvent,
    RowKind,
    handle_key_names,
    key_only,
)
from applier.errors import InputError
from applier.large_messages.errors import LargeMessageNotConfigured
from applier.ops.logs import get_logger
from applier.stream.progress import DDLKey, SharedProgress, TableKey, ddl_key
from applier.stream.spill import GroupPart, SpillDir, SpillFiles
from sqlgen.collapse import update_keeps_key

_HK = FLAG_HANDLE_KEY
_UPDATE = RowKind.UPDATE
_DELETE = RowKind.DELETE
_K_ROW, _K_RESOLVED, _K_DDL = 0, 1, 2


class RowsBehindWatermark(InputError):
    """A partition the barrier had left out as empty delivered a row the watermark already passed.

    TiCDC starts writing to a partition it did not use (the default topic after a changefeed
    restart, or any topic after its partition count grew) with rows above every resolved ts it had
    broadcast, so this only happens when those rows were fetched later than a resolved ts read on
    the other partitions. Rows at or below the applied ts would be skipped: stop instead, naming
    where, rather than lose them silently. Raised before the listener changes any state.
    """

    def __init__(self, row: RowEvent, applied_ts: int) -> None:
        self.position: Position = row.pos
        p = row.pos
        super().__init__(
            f"topic {p.topic!r} partition {p.partition} offset {p.offset}: a row of "
            f"`{row.schema}`.`{row.table}` at commit ts {row.commit_ts} arrived on a partition that "
            f"had been empty, after rows up to ts {applied_ts} were applied without it; rows may be "
            "missing downstream: compare the table with upstream, or reload it (applier catchup), "
            "before going on (docs/open-protocol.md §5.7)"
        )


@dataclass(slots=True)
class ListenerStats:
    """Counters for logs and metrics."""

    rows_kept: int = 0
    rows_skipped: int = 0  # at or below the checkpoint (rule 1)
    rows_replayed: int = 0  # dropped as a copy (rules 2-4)
    ddls_queued: int = 0
    ddls_dropped: int = 0  # already applied or already pending
    resolved_ignored: int = 0  # older than the partition's resolved ts


class KeylessVersions:
    """Versions of keyless rows kept and not yet applied, shared by the listeners of one topic.

    ``(table, commit ts, kind, rid)`` for rows that carry ``rid`` (rule 3): shared because after a
    partition-count change a replayed copy can arrive on another partition than its first copy.
    Also remembers which keyless tables came without ``rid`` (rule 4), to warn once per table.
    """

    __slots__ = ("_by_ts", "_log", "_seen", "_ts_heap", "warned")

    def __init__(self) -> None:
        self._seen: set[tuple] = set()
        self._by_ts: dict[int, list[tuple]] = {}
        self._ts_heap: list[int] = []  # the keys of _by_ts, lowest first: every listener calls
        # forget_upto after each window, so all but the first call must cost nothing
        self.warned: set[TableKey] = set()
        self._log = None

    def add(self, table: TableKey, row: RowEvent) -> bool:
        """Record the version of ``row`` (which carries ``rid``); False when it is already kept."""
        version = (table, row.commit_ts, row.kind, row.row_id)
        if version in self._seen:
            return False
        self._seen.add(version)
        at_ts = self._by_ts.get(row.commit_ts)
        if at_ts is None:
            at_ts = self._by_ts[row.commit_ts] = []
            heapq.heappush(self._ts_heap, row.commit_ts)
        at_ts.append(version)
        return True

    def forget_upto(self, ts: int) -> None:
        """Versions at or below the applied ts: rule 1 drops their copies from now on."""
        heap = self._ts_heap
        while heap and heap[0] <= ts:
            self._seen.difference_update(self._by_ts.pop(heapq.heappop(heap)))

    def warn_without_rid(self, table: TableKey, pos: Position) -> None:
        if table in self.warned:
            return
        self.warned.add(table)
        if self._log is None:
            self._log = get_logger(component="listener")
        self._log.warning(
            "keyless table without rid: a replayed row above the resolved ts cannot be told from a "
            "second identical row and may be applied twice (docs/open-protocol.md §5.6)",
            schema=table[0],
            table=table[1],
            topic=pos.topic,
            partition=pos.partition,
            offset=pos.offset,
        )


class _TsGroup:
    """Kept rows of one commit ts, in arrival order, and the tables they belong to.

    Once spilled (``applier.stream.spill``), the oldest rows are in ``spilled`` and ``rows`` holds the
    ones kept since; ``nbytes`` counts the rows in memory only.
    """

    __slots__ = ("first_offset", "more_tables", "nbytes", "rows", "spilled", "spilled_nbytes", "table")

    def __init__(self, first_offset: int, table: TableKey, row: RowEvent, nbytes: int) -> None:
        self.first_offset = first_offset
        self.table = table
        self.rows: list[RowEvent] = [row]
        self.nbytes = nbytes
        self.more_tables: set[TableKey] | None = None  # other tables than ``table``, if any
        self.spilled: SpillFiles | None = None
        self.spilled_nbytes = 0

    @property
    def count(self) -> int:
        return len(self.rows) + (self.spilled.rows if self.spilled is not None else 0)


def _touches(group: _TsGroup, held: Callable[[TableKey], bool]) -> bool:
    """Whether a group holds rows of a table ``held`` is true for."""
    return held(group.table) or (group.more_tables is not None and any(map(held, group.more_tables)))


def _only(group: _TsGroup, held: Callable[[TableKey], bool]) -> bool:
    """Whether every row of a group is of a table ``held`` is true for (no row to look at)."""
    return held(group.table) and (group.more_tables is None or all(map(held, group.more_tables)))


@dataclass(slots=True)
class _Pending:
    event: DDLEvent
    offset: int


ROW_BYTES = 320
COLUMN_BYTES = 230
"""Memory of a decoded row beyond its record bytes: the event and position objects, and a dict
per column (checked against tracemalloc for narrow and wide rows: docs/performance.md)."""


def cache_bytes(record_bytes: int, events: Sequence[Event]) -> int:
    """Estimated memory of a record's decoded rows: what ``feed`` should count as ``record_bytes``,
    so that ``max_cached_bytes`` bounds memory rather than bytes on the wire (a decoded row is
    4x its record bytes for narrow rows, more with many small columns)."""
    total = record_bytes
    for ev in events:
        if type(ev) is RowEvent:
            new, old = ev.new, ev.old
            # a compact image is counted as the dicts it stands for, as before
            columns = len(new.column_values) if type(new) is CompactImage else len(new) if new else 0
            if old is not None:
                columns += len(old.column_values) if type(old) is CompactImage else len(old)
            total += ROW_BYTES + COLUMN_BYTES * columns
    return total


def _classify(ev: object) -> int:
    """Kind of an event whose type is not exactly one of the three (subclasses), or raise."""
    if isinstance(ev, LargeMessageEvent):
        raise LargeMessageNotConfigured(ev)
    if isinstance(ev, RowEvent):
        return _K_ROW
    if isinstance(ev, ResolvedEvent):
        return _K_RESOLVED
    if isinstance(ev, DDLEvent):
        return _K_DDL
    raise TypeError(f"not a decoded event: {type(ev).__name__}")


def _handle_key_column(row: RowEvent) -> str | None:
    """Name of a column flagged handle key in either image of ``row``; None for a keyless row."""
    for image in (row.new, row.old):
        if image:
            for name, col in image.items():
                if col["f"] & _HK:
                    return name
    return None


def _compact_keyed(ev: RowEvent, shapes: dict[tuple[str, ...], ImageShape]) -> None:
    """Make a keyed row cheap to hold and to plan before it waits in the cache.

    What planning never reads of its old image goes (:func:`_trim_old_image`). Its new image
    is a :class:`CompactImage` (the decoder's fast path gives it so; one the careful path decoded
    is converted here): the values (``RowEvent.new_values``) and the layout shared with every row
    of the same column names, types and flags (``shapes``, by column names; checked row by row,
    since a DDL can change types or flags under the same names). That is an eighth of the dicts'
    memory, and planning reads the key and values without a dict lookup.
    """
    if ev.old is not None:
        _trim_old_image(ev)
    new = ev.new
    if new is None or type(new) is CompactImage:
        return
    values = ev.new_values
    if values is None:
        values = ev.new_values = tuple([c["v"] for c in new.values()])
    ev.new = compact_image(new, values, shapes)


def _trim_old_image(ev: RowEvent) -> None:
    """Drop what planning never reads of a keyed row's old image before it waits in the cache.

    An update that keeps its handle key is planned from its new image alone
    (:func:`sqlgen.update_keeps_key`): its old image goes. The daemon decodes that image reduced to
    its key columns where it has the new image's columns (``decode_record(old_keys_only=True)``),
    and an update that moves its key keeps them: all planning reads of it. A delete is planned
    from its key columns (the ``delete-only-handle-key`` form TiCDC can send): the other columns
    go. ``record_bytes`` still counts what was dropped, so the byte bound errs on the safe side.
    """
    old = ev.old
    assert old is not None
    kind = ev.kind
    if kind is _UPDATE:
        if update_keeps_key(ev):
            ev.old = None
    elif kind is _DELETE:
        names = handle_key_names(old)
        if names and len(names) < len(old):
            ev.old = key_only(old, names)


class PartitionListener:
    """Replay-aware buffer of one Kafka partition. See the module docstring for the rules.

    ``progress`` is shared with the barrier and the other listeners, and so is ``versions`` (a
    listener without one gets its own); ``start_offset`` is where this session started reading
    (returned by ``resume_offset`` until something was fed); ``spill`` is where ``spill_group``
    writes (a listener without one never spills).
    Not thread-safe: one thread feeds and builds windows.
    """

    def __init__(
        self,
        partition: int,
        progress: SharedProgress,
        start_offset: int | None = None,
        versions: KeylessVersions | None = None,
        spill: SpillDir | None = None,
    ) -> None:
        self.partition = partition
        self._spill = spill
        # Counters for the caller to read (only the listener writes them): the cache's bytes as
        # counted by ``feed`` and its rows, in memory and moved to disk; the last offset fed.
        self.cached_bytes = 0
        self.cached_rows = 0
        self.spilled_bytes = 0
        self.spilled_rows = 0
        self.last_offset: int | None = None
        self.stats = ListenerStats()
        self._progress = progress
        self._versions = versions if versions is not None else KeylessVersions()
        self._start_offset = start_offset
        self._obs: int | None = None  # highest resolved ts read in this session (rule 2)
        # Set when the barrier stops treating this partition as empty: until its first resolved
        # ts, a row at or below this applied ts means the watermark passed it (RowsBehindWatermark).
        self.rejoin_floor: int | None = None
        self.floor = 0
        """Rows at or below it are applied (rule 1) though the applied ts is lower: what the
        checkpoint says of this partition after a run in row mode (``Checkpoint.partition_applied``)."""
        self.unique_tables: set[TableKey] | None = None
        """Row mode: where to note the tables with a unique key besides their handle key (shared by
        the partitions, ``applier.stream.row_release``); None: not noted."""
        self._unique_seen: set[TableKey] = set()  # tables looked at for it (again after their DDLs)
        # (offset, resolved ts) each time _obs rose, in offset order: for resume offsets.
        self._res_log: list[tuple[int, int]] = []
        # Cache of kept rows.
        self._groups: dict[int, _TsGroup] = {}  # insertion order == first_offset order
        self._ts_sorted: list[int] = []
        # _cum[i] - _cum_base = rows cached at or below _ts_sorted[i]: lets the barrier size a
        # window with a bisection instead of walking every cached commit ts. A row below the
        # highest cached ts (spans out of step) leaves _cum stale from index _stale on; it is
        # recounted once, when next read, not once per row.
        self._cum: list[int] = []
        self._cum_base = 0
        self._stale: int | None = None
        self._pending: dict[DDLKey, _Pending] = {}  # arrival order == offset order
        self._pending_keys: list[DDLKey] = []  # the same keys in ts order: the oldest go first
        # Rule 4: digests of records holding keyless rows without rid above the resolved ts ->
        # their highest such ts.
        self._keyless_records: dict[bytes, int] = {}
        # Per table, a column that carried the handle-key flag in the last keyed row seen: makes
        # the keyless test one dict probe per row (verified on every row, so DDLs cannot fool it).
        self._hk_names: dict[TableKey, str] = {}
        # Layouts of the compact new images of cached keyed rows, by column names (_compact_keyed).
        self._shapes: dict[tuple[str, ...], ImageShape] = {}

    # ------------------------------------------------------------------ read-only views

    @property
    def resolved(self) -> int:
        """Partition resolved ts: no row <= this will be kept from now on. Never below the applied ts."""
        g = self._progress.front_ts
        return g if self._obs is None or self._obs < g else self._obs

    @property
    def observed_resolved(self) -> int | None:
        """Highest resolved ts read in this session, if any."""
        return self._obs

    @property
    def held_rows(self) -> int:
        """Rows not applied yet, in memory or on disk."""
        return self.cached_rows + self.spilled_rows

    def pending_ddls(self) -> list[DDLEvent]:
        """DDLs waiting for the barrier, in arrival order."""
        return [p.event for p in self._pending.values()]

    def has_pending_ddl(self, key: DDLKey) -> bool:
        return key in self._pending

    def min_pending_ddl_ts(self) -> int | None:
        return self._pending_keys[0][0] if self._pending_keys else None

    def cached_ts_upto(self, ts: int) -> list[int]:
        """Distinct commit ts of cached rows that are <= ``ts``, ascending."""
        return self._ts_sorted[: bisect_right(self._ts_sorted, ts)]

    def count_upto(self, ts: int) -> int:
        """Number of cached rows (in memory or spilled) with commit ts <= ``ts``."""
        i = bisect_right(self._ts_sorted, ts)
        if self._stale is not None:
            self._recount()
        return self._cum[i - 1] - self._cum_base if i else 0

    def max_cached_ts_upto(self, ts: int) -> int | None:
        """Highest cached commit ts <= ``ts``, if any."""
        i = bisect_right(self._ts_sorted, ts)
        return self._ts_sorted[i - 1] if i else None

    def min_cached_ts(self) -> int | None:
        return self._ts_sorted[0] if self._ts_sorted else None

    def max_cached_ts(self) -> int | None:
        return self._ts_sorted[-1] if self._ts_sorted else None

    def min_cached_ts_above(self, ts: int) -> int | None:
        """Lowest cached commit ts > ``ts``, if any."""
        i = bisect_right(self._ts_sorted, ts)
        return self._ts_sorted[i] if i < len(self._ts_sorted) else None

    def collect(
        self,
        after: int,
        upto: int,
        rows: list[RowEvent],
        tables: set[TableKey],
        held: Callable[[TableKey], bool] | None = None,
    ) -> None:
        """Append the cached rows with ``after < commit ts <= upto`` to ``rows`` (ascending ts,
        arrival order within one ts) and their tables to ``tables``; ``held``: leave out the rows
        of the tables it is true for (they wait for a DDL running beside the stream)."""
        ts_sorted = self._ts_sorted
        groups = self._groups
        extend = rows.extend
        last: TableKey | None = None
        for t in ts_sorted[bisect_right(ts_sorted, after) : bisect_right(ts_sorted, upto)]:
            group = groups[t]
            if held is not None and _touches(group, held):
                if _only(group, held):
                    continue
                for row in group.rows:
                    table = (row.schema, row.table)
                    if not held(table):
                        rows.append(row)
                        tables.add(table)
                continue
            extend(group.rows)
            if group.table is not last:  # feed() shares one tuple per run of rows: usually skipped
                last = group.table
                tables.add(last)
            if group.more_tables:
                tables.update(group.more_tables)

    def has_spilled(self, after: int, upto: int) -> bool:
        """Whether a cached commit ts in ``(after, upto]`` has rows on disk."""
        if not self.spilled_rows:
            return False
        ts_sorted, groups = self._ts_sorted, self._groups
        return any(
            groups[t].spilled is not None
            for t in ts_sorted[bisect_right(ts_sorted, after) : bisect_right(ts_sorted, upto)]
        )

    def collect_parts(self, after: int, upto: int, parts: list[GroupPart], tables: set[TableKey]) -> None:
        """Like ``collect``, for a window with rows on disk: one ``GroupPart`` per commit ts.

        The groups of a window never change any more (rule 2 drops every later row at or below
        the resolved ts, and only groups above the global resolved ts are spilled), so the
        parts share their in-memory row lists.
        """
        ts_sorted, groups = self._ts_sorted, self._groups
        for t in ts_sorted[bisect_right(ts_sorted, after) : bisect_right(ts_sorted, upto)]:
            group = groups[t]
            parts.append(GroupPart(t, self.partition, group.spilled, group.rows))
            tables.add(group.table)
            if group.more_tables:
                tables.update(group.more_tables)

    def spill_candidates(self, above: int) -> list[tuple[int, int]]:
        """``(bytes in memory, commit ts)`` of the groups above ``above`` holding rows in memory."""
        ts_sorted, groups = self._ts_sorted, self._groups
        return [(groups[t].nbytes, t) for t in ts_sorted[bisect_right(ts_sorted, above) :] if groups[t].rows]

    def spill_group(self, ts: int) -> int:
        """Move the in-memory rows of commit ts ``ts`` to the spill files; returns how many.

        Only for a commit ts above the global resolved ts (no window holds its rows yet); rows
        kept later for it stay in memory after the spilled ones, in arrival order.
        """
        if self._spill is None:
            raise RuntimeError("this listener has no spill directory")
        group = self._groups[ts]
        rows = group.rows
        if not rows:
            return 0
        if group.spilled is None:
            group.spilled = self._spill.files(self.partition, ts)
        group.spilled.append(rows)
        n = len(rows)
        group.rows = []
        group.spilled_nbytes += group.nbytes
        self.cached_bytes -= group.nbytes
        self.spilled_bytes += group.nbytes
        group.nbytes = 0
        self.cached_rows -= n
        self.spilled_rows += n
        return n

    def rows_upto(self, ts: int) -> list[RowEvent]:
        """Cached rows with commit ts <= ``ts``: ascending ts, arrival order within one ts."""
        out: list[RowEvent] = []
        for t in self.cached_ts_upto(ts):
            out.extend(self._groups[t].rows)
        return out

    # ------------------------------------------------------------------ feeding

    def feed(
        self,
        offset: int,
        events: Sequence[Event],
        record_bytes: int = 0,
        raw: tuple[bytes | None, bytes | None] | None = None,
    ) -> None:
        """Take the decoded events of the Kafka record at ``offset``.

        ``record_bytes`` (the record value's size) is split evenly over its events to account for
        cached memory. Offsets must increase: a listener is one pass over a partition; a restart
        uses a new listener. Raises ``LargeMessageNotConfigured`` (state untouched) for an ohk/ccl
        event: they are resolved before the listener (applier.large_messages), or refused.

        ``raw`` (the record's key and value bytes) lets the listener recognise a byte-identical
        copy of an earlier record holding keyless rows without ``rid`` (rule 4); without it only
        rules 1-3 apply.

        This is the per-event hot path of the daemon (a million events a minute), so it is written
        as two flat loops with local variables rather than one method call per event: the first
        validates the record and finds its keyless rows without changing anything, the second
        changes the state.
        """
        if self.last_offset is not None and offset <= self.last_offset:
            raise ValueError(
                f"partition {self.partition}: offset {offset} fed after {self.last_offset}; "
                "records must be fed once each, in offset order"
            )
        if self.rejoin_floor is not None:
            self._check_rejoin(events)
        # Pass 1: nothing changes yet (a LargeMessageNotConfigured leaves the state untouched).
        # Consecutive rows of one table (the usual record) share one table tuple and its lookups.
        kinds: list[int] = []
        tables: list[TableKey | None] = []
        keyless: set[int] | None = None  # indexes of keyless rows, usually none
        anonymous_top = -1  # highest commit ts of a keyless row without rid in the record
        hk_names = self._hk_names
        schema = name = hk = None
        table: TableKey | None = None
        for i, ev in enumerate(events):
            tp = type(ev)
            if tp is RowEvent:
                kind = _K_ROW
            elif tp is ResolvedEvent:
                kind = _K_RESOLVED
            elif tp is DDLEvent:
                kind = _K_DDL
            else:
                kind = _classify(ev)
            kinds.append(kind)
            if kind != _K_ROW:
                tables.append(None)
                continue
            if ev.table != name or ev.schema != schema:  # type: ignore[union-attr]
                schema, name = ev.schema, ev.table  # type: ignore[union-attr]
                table = (schema, name)  # type: ignore[assignment]
                hk = hk_names.get(table)  # type: ignore[arg-type]
                if self.unique_tables is not None and table not in self._unique_seen:
                    self._note_unique(table, ev)  # type: ignore[arg-type]
            tables.append(table)
            # Keyless? One dict probe when the column that carried the handle-key flag last time
            # still carries it (exact: the flag is in this very image); a full scan otherwise.
            img = ev.new if ev.new is not None else ev.old  # type: ignore[union-attr]
            if type(img) is CompactImage and img.shape.key_index:
                continue  # keyed: the decoder compacts only images with a handle-key column
            col = img.get(hk) if (hk is not None and img is not None) else None
            if col is None or not col["f"] & _HK:
                found = _handle_key_column(ev)  # type: ignore[arg-type]
                if found is None:
                    if keyless is None:
                        keyless = set()
                    keyless.add(i)
                    if ev.row_id is None and ev.commit_ts > anonymous_top:  # type: ignore[union-attr]
                        anonymous_top = ev.commit_ts  # type: ignore[union-attr]
                else:
                    hk = hk_names[table] = found  # type: ignore[index]
        obs = self._obs
        dup_record = (
            raw is not None
            and anonymous_top >= 0
            and (obs is None or anonymous_top > obs)
            and self._seen_anonymous_record(raw, anonymous_top)
        )

        # Pass 2: apply the record to the state, event by event.
        n = len(events)
        share, extra = divmod(max(record_bytes, 0), n) if n else (0, 0)
        progress = self._progress
        applied = progress.applied_ts
        if self.floor > applied:
            applied = self.floor
        table_ts = progress.table_ts
        groups = self._groups
        ts_sorted = self._ts_sorted
        cum = self._cum
        kept = skipped = replayed = kept_bytes = 0
        run: TableKey | None = None  # table of the current run of rows
        threshold = applied
        for i, ev in enumerate(events):
            kind = kinds[i]
            if kind != _K_ROW:
                if kind == _K_RESOLVED:
                    self._on_resolved(offset, ev.ts)  # type: ignore[union-attr]
                    obs = self._obs
                else:
                    self._on_ddl(offset, ev)  # type: ignore[arg-type]
                continue
            table = tables[i]
            if table is not run:
                run = table
                threshold = applied
                if table_ts:
                    floor = table_ts.get(table)  # type: ignore[arg-type]
                    if floor is not None and floor > applied:
                        threshold = floor
            ts = ev.commit_ts  # type: ignore[union-attr]
            if ts <= threshold:  # rule 1
                skipped += 1
                continue
            if obs is not None and ts <= obs:  # rule 2
                replayed += 1
                continue
            if keyless is not None and i in keyless:
                if ev.row_id is not None:  # type: ignore[union-attr]
                    if not self._versions.add(table, ev):  # type: ignore[arg-type]  # rule 3
                        replayed += 1
                        continue
                else:
                    self._versions.warn_without_rid(table, ev.pos)  # type: ignore[arg-type, union-attr]
                    if dup_record:  # rule 4
                        replayed += 1
                        continue
            if keyless is None or i not in keyless:
                _compact_keyed(ev, self._shapes)  # type: ignore[arg-type]
            nbytes = share + 1 if i < extra else share
            group = groups.get(ts)
            if group is None:
                groups[ts] = _TsGroup(offset, table, ev, nbytes)  # type: ignore[arg-type]
                if ts_sorted and ts < ts_sorted[-1]:
                    self._insert_ts(ts)
                else:
                    ts_sorted.append(ts)
                    cum.append(cum[-1] if cum else self._cum_base)
            else:
                group.rows.append(ev)  # type: ignore[arg-type]
                group.nbytes += nbytes
                if table != group.table:
                    if group.more_tables is None:
                        group.more_tables = set()
                    group.more_tables.add(table)  # type: ignore[arg-type]
            if ts == ts_sorted[-1]:
                cum[-1] += 1
            else:
                self._mark_stale(ts)
            kept += 1
            kept_bytes += nbytes
        self.cached_bytes += kept_bytes
        self.cached_rows += kept
        stats = self.stats
        stats.rows_kept += kept
        stats.rows_skipped += skipped
        stats.rows_replayed += replayed
        self.last_offset = offset

    def observe_drained(self, end_offset: int, ts: int) -> None:
        """This partition was read up to ``end_offset`` by a fetch made after the resolved ts ``ts``
        was read on another partition: it holds nothing more at or below ``ts`` but copies, since
        TiCDC writes ``ts`` only once every row and DDL at or below it is in Kafka, in every topic
        (docs/open-protocol.md §5.10). So it counts as a resolved event ``ts`` read just before
        ``end_offset``: the same rules 1-2 and resume offsets. For partitions that get no
        resolved events (a topic whose tables do not change); every record before ``end_offset``
        must have been fed.
        """
        self.rejoin_floor = None
        self._on_resolved(end_offset, ts)

    def _check_rejoin(self, events: Sequence[Event]) -> None:
        floor = self.rejoin_floor
        for ev in events:
            if type(ev) is ResolvedEvent:
                self.rejoin_floor = None  # from here on rule 2 and the watermark cover it
                return
            if type(ev) is RowEvent and ev.commit_ts <= floor:  # type: ignore[operator]
                raise RowsBehindWatermark(ev, floor)  # type: ignore[arg-type]

    def _insert_ts(self, ts: int) -> None:
        """A new commit ts below the highest cached one (tables, or spans of one table, out of step)."""
        i = bisect_left(self._ts_sorted, ts)
        self._ts_sorted.insert(i, ts)
        self._cum.insert(i, 0)
        self._mark_stale(ts, i)

    def _mark_stale(self, ts: int, i: int | None = None) -> None:
        """A row at a cached ts below the highest: the counts from its index on are stale."""
        if i is None:
            i = bisect_left(self._ts_sorted, ts)
        if self._stale is None or i < self._stale:
            self._stale = i

    def _recount(self) -> None:
        cum, groups, ts_sorted = self._cum, self._groups, self._ts_sorted
        i = self._stale or 0
        total = cum[i - 1] if i else self._cum_base
        for j in range(i, len(ts_sorted)):
            total += groups[ts_sorted[j]].count
            cum[j] = total
        self._stale = None

    def _seen_anonymous_record(self, raw: tuple[bytes | None, bytes | None], top: int) -> bool:
        """Rule 4: is this a byte-identical copy of a record holding keyless rows without rid?

        ``top`` is the highest commit ts of those rows; records are forgotten once the partition's
        resolved ts passes it (rule 2 then drops their copies anyway).
        """
        h = hashlib.blake2b(raw[0] or b"", digest_size=16)
        h.update(b"\x00")
        h.update(raw[1] or b"")
        digest = h.digest()
        if digest in self._keyless_records:
            return True
        self._keyless_records[digest] = top
        return False

    def _on_resolved(self, offset: int, ts: int) -> None:
        # An older resolved ts comes with a replay: it says nothing new (docs/open-protocol.md §5.3).
        if self._obs is not None and ts <= self._obs:
            if ts < self._obs:
                self.stats.resolved_ignored += 1
            return
        self._obs = ts
        self._res_log.append((offset, ts))
        if self._keyless_records:
            self._keyless_records = {d: top for d, top in self._keyless_records.items() if top > ts}

    def _note_unique(self, table: TableKey, row: RowEvent) -> None:
        """Row mode: note ``table`` when its columns' flags show a unique key besides the handle
        key (TiCDC flags every column of every index, docs/open-protocol.md §3.3): a unique column
        outside the handle key, or any unique column beside a primary key."""
        img = row.new
        if img is None or self.unique_tables is None:
            return  # a delete's image may hold the handle key only: the next insert or update tells
        self._unique_seen.add(table)
        flags = [img[name]["f"] for name in img]
        primary = any(f & FLAG_PRIMARY_KEY for f in flags)
        if any(f & FLAG_UNIQUE_KEY and (primary or not f & FLAG_HANDLE_KEY) for f in flags):
            self.unique_tables.add(table)

    def first_ts_of(self, tables: AbstractSet[TableKey], above: int) -> int | None:
        """Row mode: the lowest cached commit ts above ``above`` holding a row of one of ``tables``."""
        if not tables:
            return None
        groups = self._groups
        for ts in self._ts_sorted[bisect_right(self._ts_sorted, above) :]:
            group = groups[ts]
            if group.table in tables or (
                group.more_tables is not None and not group.more_tables.isdisjoint(tables)
            ):
                return ts
        return None

    def _on_ddl(self, offset: int, ddl: DDLEvent) -> None:
        # A DDL is broadcast to every partition: each listener queues its copy (its record must
        # stay readable until the DDL is applied); the barrier runs it once.
        self._unique_seen.discard((ddl.schema, ddl.table))  # its keys may have changed
        key = ddl_key(ddl)
        if key in self._pending or self._progress.is_ddl_applied(key):
            self.stats.ddls_dropped += 1
            return
        self._pending[key] = _Pending(ddl, offset)
        insort(self._pending_keys, key)
        self.stats.ddls_queued += 1

    def _keep_held(self, cut: int, held: Callable[[TableKey], bool]) -> None:
        """``discard_applied`` while some tables wait for a DDL: of the first ``cut`` commit ts,
        only those tables' rows stay (no such group is on disk: the barrier builds no window of
        spilled rows while a table waits)."""
        groups, ts_sorted = self._groups, self._ts_sorted
        kept_ts: list[int] = []
        for ts in ts_sorted[:cut]:
            group = groups[ts]
            if _only(group, held):  # a group kept before: every row still waits
                kept_ts.append(ts)
                continue
            rows = []
            if _touches(group, held):
                rows = [row for row in group.rows if held((row.schema, row.table))]
            if not rows:
                del groups[ts]
                self.cached_bytes -= group.nbytes
                self.cached_rows -= len(group.rows)
                continue
            share = group.nbytes // len(group.rows)
            self.cached_bytes -= group.nbytes - share * len(rows)
            self.cached_rows -= len(group.rows) - len(rows)
            group.nbytes = share * len(rows)
            group.rows = rows
            group.table = (rows[0].schema, rows[0].table)
            others = {(row.schema, row.table) for row in rows} - {group.table}
            group.more_tables = others or None
            kept_ts.append(ts)
        base = self._cum[cut - 1] if cut else self._cum_base
        del ts_sorted[:cut]
        del self._cum[:cut]
        self._cum_base = base
        if kept_ts:
            ts_sorted[:0] = kept_ts
            self._cum[:0] = [0] * len(kept_ts)
            self._cum_base = 0
            self._stale = 0

    # ------------------------------------------------------------------ resume offsets

    def _oldest_unapplied(self, after_applied_ts: int, excluding_ddl: DDLKey | None) -> int | None:
        found = None
        for ts, group in self._groups.items():  # ascending first_offset: the first match is the oldest
            if ts > after_applied_ts:
                found = group.first_offset
                break
        for key, pending in self._pending.items():  # ascending offset
            if key != excluding_ddl:
                if found is None or pending.offset < found:
                    found = pending.offset
                break
        if found is not None:
            return found
        return self._start_offset if self.last_offset is None else self.last_offset + 1

    def resume_offset(
        self, after_applied_ts: int | None = None, *, excluding_ddl: DDLKey | None = None
    ) -> int | None:
        """Offset to restart this partition from once everything <= ``after_applied_ts`` (default:
        the current applied ts) and the DDL ``excluding_ddl`` are applied.

        The oldest record that still holds a cached row above that ts or a pending DDL; without one,
        the record after the last one fed; without any, the start offset (None if unknown). Then
        moved back to the record of the resolved ts in force there when that is above the applied
        ts (module docstring), so a restart drops the same copies.
        """
        after = self._progress.applied_ts if after_applied_ts is None else after_applied_ts
        r = self._oldest_unapplied(after, excluding_ddl)
        if r is None:
            return None
        i = bisect_left(self._res_log, (r,))
        if i:
            off, ts = self._res_log[i - 1]
            if ts > after:
                return off
        return r

    # ------------------------------------------------------------------ after a window

    def discard_applied(
        self, applied_ddl: DDLKey | None = None, held: Callable[[TableKey], bool] | None = None
    ) -> None:
        """Forget what the barrier just applied (``progress`` already updated): every row at or
        below the front ts but those of the tables ``held`` is true for. Barrier use only."""
        g = self._progress.applied_ts
        ts_sorted = self._ts_sorted
        cut = bisect_right(ts_sorted, self._progress.front_ts)
        if self._stale is not None:
            self._recount()
        if cut and held is not None:
            self._keep_held(cut, held)
        elif cut:
            pop = self._groups.pop
            nbytes = spilled_rows = spilled_bytes = 0
            for ts in ts_sorted[:cut]:
                group = pop(ts)
                nbytes += group.nbytes
                if group.spilled is not None:
                    spilled_rows += group.spilled.rows
                    spilled_bytes += group.spilled_nbytes
                    group.spilled.remove()
            self.cached_bytes -= nbytes
            self.spilled_bytes -= spilled_bytes
            self.spilled_rows -= spilled_rows
            self.cached_rows -= self._cum[cut - 1] - self._cum_base - spilled_rows
            self._cum_base = self._cum[cut - 1]
            del ts_sorted[:cut]
            del self._cum[:cut]
        # Applied: at or below the applied ts, or one of the few applied above it. Found through
        # the ts order, not by asking about every pending DDL: thousands can wait (one per CREATE
        # TABLE of a new schema's tables), and this runs once per window.
        keys = self._pending_keys
        cut = bisect_right(keys, g, key=itemgetter(0))
        for key in keys[:cut]:
            del self._pending[key]
        del keys[:cut]
        for key in self._progress.applied_ddls | {applied_ddl}:
            if key in self._pending:
                del self._pending[key]
                keys.remove(key)
        self._versions.forget_upto(g)
        # Resolved-log entries before the one in force at the oldest unapplied record are never
        # needed again: that offset only grows.
        r = self._oldest_unapplied(g, None)
        if r is not None:
            i = bisect_left(self._res_log, (r,))
            if i > 1:
                del self._res_log[: i - 1]

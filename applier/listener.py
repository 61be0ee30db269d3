"""Per-partition state of the streaming applier: what a Kafka partition has delivered so far.

The Kafka loop calls ``PartitionListener.feed`` with the decoded events of each record, in offset
order. The listener keeps the rows that still need applying (grouped by commit ts), the DDLs that
wait for the barrier, the partition's resolved ts, and drops replayed copies.

How replays are recognised (open-protocol.md section 5: delivery is at least once; in one
partition the first copy of each version arrives in commit-ts order per table; a resolved R
means every row <= R of that partition was already sent):

1. ``commit_ts <= max(applied ts, table checkpoint ts)``: applied before, skipped.
2. ``commit_ts <= partition resolved``: sent before the resolved event that we already read, so
   this copy is a replay. A DDL with ts D also counts as a resolved D - 1 for its partition
   (DDLs are broadcast after every earlier row); not D itself.
3. ``commit_ts < max commit ts seen for its table in this partition``: first copies of a table
   arrive in ts order, so a lower ts is a replay. Applied to keyed tables too (saves work).
4. Keyless tables at ``commit_ts ==`` that max: an identical event may be a second identical row of
   the same transaction (legitimate) or a replay; the protocol cannot tell them apart. The
   listener counts identical events (same table, ts, kind, images) per "pass" and accepts one only
   when the current pass has seen more copies than were accepted so far.

   A pass approximates one producer session. A record starts a new pass when it goes backwards
   compared with what the current pass has seen: a row at or below the pass's highest resolved ts
   (DDL-implied ones included) or below the pass's highest ts for its table, or a resolved ts /
   DDL below the pass's highest resolved ts. The whole record joins the new pass: one Kafka record
   is written by one producer session. Comparing with the current pass only, not with everything
   seen, matters: inside one replay every replayed row is "old", yet the replay is a single
   session whose identical rows must still be counted together.

5. A byte-identical copy of an earlier record of this partition that holds keyless rows above the
   partition's resolved ts (the producer re-sent the same batch: a retry without idempotence, or a
   replay that re-encoded the same events the same way) has its keyless rows dropped. Limitation:
   two genuinely different batches with exactly the same bytes (a transaction inserting identical
   keyless rows that happen to be split into identical batches) are taken for one.

   Limitation: a replay that starts exactly at the transaction seen last, with nothing in front of
   it that goes backwards (e.g. the producer restarts from a checkpoint equal to the last resolved
   ts it sent and resends the interrupted transaction first), is not recognised: its keyless rows
   at that ts are applied a second time. Keyed tables do no counting at all: an identical keyed
   copy at the max ts reaches the window, where REPLACE/DELETE by key makes it harmless.

Resume offsets: ``resume_offset`` is the offset of the oldest record still holding an event not yet
applied, so restarting there loses nothing. It is moved further back, when needed, to the records
that set the current pass's detection horizon at that point (its highest resolved ts, and a
table's highest ts when that is above it): a restarted listener then takes exactly the same
keep/drop decisions as the one it replaces, so rule 4 stays exact across restarts. Those extra
records only hold events that the checkpoint skips; normally they are one resolved interval old.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from applier.codec.events import (
    FLAG_HANDLE_KEY,
    DDLEvent,
    Event,
    LargeMessageEvent,
    Position,
    ResolvedEvent,
    Row,
    RowEvent,
)
from applier.progress import DDLKey, SharedProgress, TableKey, ddl_key

_HK = FLAG_HANDLE_KEY
_K_ROW, _K_RESOLVED, _K_DDL = 0, 1, 2


class LargeMessageNotSupported(NotImplementedError):
    """A large-message event (``ohk`` handle-key-only, or ``ccl`` claim-check) was read.

    Applying it needs the full row from upstream TiDB or from external storage, which the applier
    does not do. The daemon must stop at ``position`` rather than skip the row silently.
    Raised before the listener changes any state for the record, so nothing of it is half-applied.
    """

    def __init__(self, event: LargeMessageEvent) -> None:
        self.event = event
        self.position: Position = event.pos
        how = "handle-key-only (ohk)" if event.handle_key_only else "claim-check (ccl)"
        p = event.pos
        super().__init__(
            f"{how} large-message event for `{event.schema}`.`{event.table}` at commit ts {event.commit_ts} "
            f"(topic {p.topic!r} partition {p.partition} offset {p.offset} event #{p.index}) "
            "is not supported: the full row would have to be fetched from upstream or external storage"
        )


@dataclass(slots=True)
class ListenerStats:
    """Counters for logs and metrics."""

    rows_kept: int = 0
    rows_skipped: int = 0  # at or below the checkpoint
    rows_replayed: int = 0  # dropped as a replayed copy
    ddls_queued: int = 0
    ddls_dropped: int = 0  # already applied or already pending
    resolved_ignored: int = 0  # older than the partition's resolved ts
    passes: int = 0  # records that went backwards and started a new pass (replays seen)


class _TsGroup:
    """Kept rows of one commit ts, in arrival order, and the tables they belong to."""

    __slots__ = ("first_offset", "more_tables", "nbytes", "rows", "table")

    def __init__(self, first_offset: int, table: TableKey, row: RowEvent, nbytes: int) -> None:
        self.first_offset = first_offset
        self.table = table
        self.rows: list[RowEvent] = [row]
        self.nbytes = nbytes
        self.more_tables: set[TableKey] | None = None  # other tables than ``table``, if any


@dataclass(slots=True)
class _Pending:
    event: DDLEvent
    offset: int


@dataclass(slots=True)
class _KeylessCounts:
    """Identical-event counts (by kind and images) of one keyless table at its max commit ts:
    how many copies were accepted in total, and how many the current pass has seen."""

    ts: int
    pass_no: int
    accepted: dict[Any, int] = field(default_factory=dict)
    seen_in_pass: dict[Any, int] = field(default_factory=dict)


def _classify(ev: object) -> int:
    """Kind of an event whose type is not exactly one of the three (subclasses), or raise."""
    if isinstance(ev, LargeMessageEvent):
        raise LargeMessageNotSupported(ev)
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


def _image_key(image: Row | None) -> tuple[tuple[str, Any], ...] | None:
    if image is None:
        return None
    return tuple((name, col["v"]) for name, col in image.items())


def _content_key(row: RowEvent) -> tuple[Any, ...]:
    return (row.kind, _image_key(row.new), _image_key(row.old))


def _last_before(log: list[tuple[int, ...]], offset: int) -> tuple[int, ...] | None:
    """Last entry of an offset-ordered log whose offset (first item) is < ``offset``."""
    i = bisect_left(log, (offset,))
    return log[i - 1] if i else None


def _append_log(log: list[tuple[int, int, int]], offset: int, pass_no: int, value: int) -> None:
    """Record that ``value`` became the pass maximum at ``offset``; one entry per record and pass."""
    if log and log[-1][0] == offset and log[-1][1] == pass_no:
        log[-1] = (offset, pass_no, value)
    else:
        log.append((offset, pass_no, value))


class PartitionListener:
    """Replay-aware buffer of one Kafka partition. See the module docstring for the rules.

    ``progress`` is shared with the barrier and the other listeners; ``start_offset`` is where
    this session started reading (returned by ``resume_offset`` until something was fed).
    Not thread-safe: one thread feeds and builds windows.
    """

    def __init__(self, partition: int, progress: SharedProgress, start_offset: int | None = None) -> None:
        self.partition = partition
        self.stats = ListenerStats()
        self._progress = progress
        self._start_offset = start_offset
        self._last_offset: int | None = None
        # Everything seen in this session: drives the drop rules 2 and 3.
        self._obs: int | None = None  # highest resolved ts read (explicit or DDL-implied)
        self._max_seen: dict[TableKey, int] = {}
        # Cache of kept rows.
        self._groups: dict[int, _TsGroup] = {}  # insertion order == first_offset order
        self._ts_sorted: list[int] = []
        # _cum[i] - _cum_base = rows cached at or below _ts_sorted[i]: lets the barrier size a
        # window with a bisection instead of walking every cached commit ts.
        self._cum: list[int] = []
        self._cum_base = 0
        self._cached_bytes = 0
        self._cached_rows = 0
        self._pending: dict[DDLKey, _Pending] = {}  # arrival order == offset order
        # The current pass: drives rule 4.
        self._pass_no = 0
        self._pass_res: int | None = None
        self._pass_max: dict[TableKey, int] = {}
        self._keyless: dict[TableKey, _KeylessCounts] = {}
        # Where passes started and where their horizon was set, for resume offsets.
        # Entries (offset, pass_no[, value]), in offset order.
        self._pass_starts: list[tuple[int, int]] = []
        self._res_log: list[tuple[int, int, int]] = []
        self._max_logs: dict[TableKey, list[tuple[int, int, int]]] = {}
        # Rule 5: digests of unresolved records holding keyless rows -> their highest keyless ts.
        self._keyless_records: dict[bytes, int] = {}
        self._dup_record = False
        # Per table, a column that carried the handle-key flag in the last keyed row seen: makes
        # the keyless test one dict probe per row (verified on every row, so DDLs cannot fool it).
        self._hk_names: dict[TableKey, str] = {}

    # ------------------------------------------------------------------ read-only views

    @property
    def resolved(self) -> int:
        """Partition resolved ts: no row <= this will be kept from now on. Never below the applied ts."""
        g = self._progress.applied_ts
        return g if self._obs is None or self._obs < g else self._obs

    @property
    def observed_resolved(self) -> int | None:
        """Highest resolved ts read in this session (DDL-implied ones included), if any."""
        return self._obs

    @property
    def last_offset(self) -> int | None:
        return self._last_offset

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    @property
    def cached_rows(self) -> int:
        return self._cached_rows

    def pending_ddls(self) -> list[DDLEvent]:
        """DDLs waiting for the barrier, in arrival order."""
        return [p.event for p in self._pending.values()]

    def has_pending_ddl(self, key: DDLKey) -> bool:
        return key in self._pending

    def min_pending_ddl_ts(self) -> int | None:
        return min((k[0] for k in self._pending), default=None)

    def cached_ts_upto(self, ts: int) -> list[int]:
        """Distinct commit ts of cached rows that are <= ``ts``, ascending."""
        return self._ts_sorted[: bisect_right(self._ts_sorted, ts)]

    def row_count_at(self, ts: int) -> int:
        g = self._groups.get(ts)
        return 0 if g is None else len(g.rows)

    def count_upto(self, ts: int) -> int:
        """Number of cached rows with commit ts <= ``ts``."""
        i = bisect_right(self._ts_sorted, ts)
        return self._cum[i - 1] - self._cum_base if i else 0

    def max_cached_ts_upto(self, ts: int) -> int | None:
        """Highest cached commit ts <= ``ts``, if any."""
        i = bisect_right(self._ts_sorted, ts)
        return self._ts_sorted[i - 1] if i else None

    def min_cached_ts(self) -> int | None:
        return self._ts_sorted[0] if self._ts_sorted else None

    def min_cached_ts_above(self, ts: int) -> int | None:
        """Lowest cached commit ts > ``ts``, if any."""
        i = bisect_right(self._ts_sorted, ts)
        return self._ts_sorted[i] if i < len(self._ts_sorted) else None

    def collect(self, after: int, upto: int, rows: list[RowEvent], tables: set[TableKey]) -> None:
        """Append the cached rows with ``after < commit ts <= upto`` to ``rows`` (ascending ts,
        arrival order within one ts) and their tables to ``tables``."""
        ts_sorted = self._ts_sorted
        groups = self._groups
        extend = rows.extend
        last: TableKey | None = None
        for t in ts_sorted[bisect_right(ts_sorted, after) : bisect_right(ts_sorted, upto)]:
            group = groups[t]
            extend(group.rows)
            if group.table is not last:  # feed() shares one tuple per run of rows: usually skipped
                last = group.table
                tables.add(last)
            if group.more_tables:
                tables.update(group.more_tables)

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
        uses a new listener. Raises ``LargeMessageNotSupported`` (state untouched) for ohk/ccl.

        ``raw`` (the record's key and value bytes) lets the listener recognise a byte-identical
        copy of an earlier record of this partition that holds keyless rows and is not yet
        resolved: a producer retry or a replay re-sending the same batch. Its keyless rows are
        dropped (rule 5 in the module docstring); without ``raw`` only rules 1-4 apply.

        This is the per-event hot path of the daemon (a million events a minute), so it is written
        as two flat loops with local variables rather than one method call per event: the first
        validates the record and takes every decision that needs the state *before* the record
        (does it go backwards, which rows are keyless), the second changes the state.
        """
        if self._last_offset is not None and offset <= self._last_offset:
            raise ValueError(
                f"partition {self.partition}: offset {offset} fed after {self._last_offset}; "
                "records must be fed once each, in offset order"
            )
        # Pass 1: nothing changes yet (a LargeMessageNotSupported leaves the state untouched).
        # Consecutive rows of one table (the usual record) share one table tuple and its lookups.
        kinds: list[int] = []
        tables: list[TableKey | None] = []
        keyless: set[int] | None = None  # indexes of keyless rows, usually none
        keyless_top = -1  # highest commit ts of a keyless row in the record
        backwards = False
        res = self._pass_res
        pass_max = self._pass_max
        seen: dict[TableKey, int] = {}
        hk_names = self._hk_names
        schema = name = hk = top = None
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
            if kind == _K_ROW:
                ts = ev.commit_ts  # type: ignore[union-attr]
                if ev.table != name or ev.schema != schema:  # type: ignore[union-attr]
                    if table is not None and top is not None:
                        seen[table] = top
                    schema, name = ev.schema, ev.table  # type: ignore[union-attr]
                    table = (schema, name)  # type: ignore[assignment]
                    hk = hk_names.get(table)  # type: ignore[arg-type]
                    top = seen.get(table)  # type: ignore[arg-type]
                    if top is None:
                        top = pass_max.get(table)  # type: ignore[arg-type]
                tables.append(table)
                # Keyless? One dict probe when the column that carried the handle-key flag last time
                # still carries it (exact: the flag is in this very image); a full scan otherwise.
                img = ev.new if ev.new is not None else ev.old  # type: ignore[union-attr]
                col = img.get(hk) if (hk is not None and img is not None) else None
                if col is None or not col["f"] & _HK:
                    found = _handle_key_column(ev)  # type: ignore[arg-type]
                    if found is None:
                        if keyless is None:
                            keyless = set()
                        keyless.add(i)
                        if ts > keyless_top:
                            keyless_top = ts
                    else:
                        hk = hk_names[table] = found  # type: ignore[index]
                if not backwards:
                    if (res is not None and ts <= res) or (top is not None and ts < top):
                        backwards = True
                    elif top is None or ts > top:
                        top = ts
            else:
                tables.append(None)
                if not backwards:
                    ts = ev.ts if kind == _K_RESOLVED else ev.commit_ts - 1  # type: ignore[union-attr]
                    if res is not None and ts < res:
                        backwards = True
                    elif res is None or ts > res:
                        res = ts
        if backwards:
            self._pass_no += 1
            self._pass_res = None
            self._pass_max = {}
            self._pass_starts.append((offset, self._pass_no))
            self.stats.passes += 1
        self._dup_record = (
            raw is not None and keyless_top >= 0 and self._seen_keyless_record(raw, keyless_top)
        )

        # Pass 2: apply the record to the state, event by event. Per run of rows of one table the
        # table's maxima live in local variables and are written back once (_end_run).
        n = len(events)
        share, extra = divmod(max(record_bytes, 0), n) if n else (0, 0)
        progress = self._progress
        applied = progress.applied_ts
        table_ts = progress.table_ts
        pass_max = self._pass_max
        max_seen = self._max_seen
        groups = self._groups
        ts_sorted = self._ts_sorted
        cum = self._cum
        kept = skipped = replayed = kept_bytes = 0
        run: TableKey | None = None  # table of the current run of rows
        top = seen_max = None
        top_changed = False
        threshold = applied
        for i, ev in enumerate(events):
            kind = kinds[i]
            if kind != _K_ROW:
                if run is not None:
                    self._end_run(offset, run, top, top_changed, seen_max)
                    run = None
                if kind == _K_RESOLVED:
                    self._on_resolved(offset, ev.ts)  # type: ignore[union-attr]
                else:
                    self._on_ddl(offset, ev)  # type: ignore[arg-type]
                continue
            table = tables[i]
            if table is not run:
                if run is not None:
                    self._end_run(offset, run, top, top_changed, seen_max)
                run = table
                top = pass_max.get(table)  # type: ignore[arg-type]
                top_changed = False
                seen_max = max_seen.get(table)  # type: ignore[arg-type]
                threshold = applied
                if table_ts:
                    floor = table_ts.get(table)  # type: ignore[arg-type]
                    if floor is not None and floor > applied:
                        threshold = floor
            ts = ev.commit_ts  # type: ignore[union-attr]
            if top is None or ts > top:
                top = ts
                top_changed = True
            prev_max = seen_max
            if seen_max is None or ts > seen_max:
                seen_max = ts
            if ts <= threshold:
                skipped += 1
                continue
            obs = self._obs
            if (
                (obs is not None and ts <= obs)
                or (prev_max is not None and ts < prev_max)
                or (
                    keyless is not None
                    and i in keyless
                    and (self._dup_record or not self._accept_keyless(table, ev))  # type: ignore[arg-type]
                )
            ):
                replayed += 1
                continue
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
                self._count_row_below_top(ts)
            kept += 1
            kept_bytes += nbytes
        if run is not None:
            self._end_run(offset, run, top, top_changed, seen_max)
        self._cached_bytes += kept_bytes
        self._cached_rows += kept
        stats = self.stats
        stats.rows_kept += kept
        stats.rows_skipped += skipped
        stats.rows_replayed += replayed
        self._last_offset = offset

    def _end_run(
        self, offset: int, table: TableKey, top: int | None, top_changed: bool, seen_max: int | None
    ) -> None:
        """Write back the maxima of a run of rows of ``table`` kept in local variables by feed()."""
        if top_changed:
            self._pass_max[table] = top  # type: ignore[assignment]
            log = self._max_logs.get(table)
            if log is None:
                log = self._max_logs[table] = []
            _append_log(log, offset, self._pass_no, top)  # type: ignore[arg-type]
        if seen_max is not None:
            self._max_seen[table] = seen_max

    def _insert_ts(self, ts: int) -> None:
        """A new commit ts below the highest cached one (rare: tables out of step in a partition)."""
        i = bisect_left(self._ts_sorted, ts)
        self._ts_sorted.insert(i, ts)
        self._cum.insert(i, self._cum[i - 1] if i else self._cum_base)

    def _count_row_below_top(self, ts: int) -> None:
        """One more row at a cached ts that is not the highest: shift the cumulative counts."""
        cum = self._cum
        for j in range(bisect_left(self._ts_sorted, ts), len(cum)):
            cum[j] += 1

    def _seen_keyless_record(self, raw: tuple[bytes | None, bytes | None], top: int) -> bool:
        """Rule 5: is this a byte-identical copy of an unresolved record holding keyless rows?

        ``top`` is the highest commit ts of the record's keyless rows.
        """
        h = hashlib.blake2b(raw[0] or b"", digest_size=16)
        h.update(b"\x00")
        h.update(raw[1] or b"")
        digest = h.digest()
        if digest in self._keyless_records:
            return True
        self._keyless_records[digest] = top
        return False

    def _raise_resolved(self, offset: int, ts: int) -> None:
        if self._obs is None or ts > self._obs:
            self._obs = ts
        if self._pass_res is None or ts > self._pass_res:
            self._pass_res = ts
            _append_log(self._res_log, offset, self._pass_no, ts)

    def _on_resolved(self, offset: int, ts: int) -> None:
        if self._obs is not None and ts < self._obs:
            self.stats.resolved_ignored += 1
        self._raise_resolved(offset, ts)
        if self._keyless_records:
            # A copy of a record whose rows are all <= the resolved ts is dropped by rule 2 anyway.
            obs = self._obs
            self._keyless_records = {d: top for d, top in self._keyless_records.items() if top > obs}

    def _on_ddl(self, offset: int, ddl: DDLEvent) -> None:
        # Always raise the horizon, even for an applied DDL: a restarted listener re-reading this
        # record must end up with the same horizon as the listener that first read it.
        self._raise_resolved(offset, ddl.commit_ts - 1)
        key = ddl_key(ddl)
        if key in self._pending or self._progress.is_ddl_applied(key):
            self.stats.ddls_dropped += 1
            return
        self._pending[key] = _Pending(ddl, offset)
        self.stats.ddls_queued += 1

    def _accept_keyless(self, table: TableKey, row: RowEvent) -> bool:
        """Rule 4: count identical copies at the table's max ts per pass (see module docstring)."""
        counts = self._keyless.get(table)
        if counts is None or counts.ts != row.commit_ts:
            # The row is at the table's new max ts: older counts can no longer matter.
            counts = self._keyless[table] = _KeylessCounts(row.commit_ts, self._pass_no)
        elif counts.pass_no != self._pass_no:
            counts.seen_in_pass.clear()
            counts.pass_no = self._pass_no
        key = _content_key(row)
        seen = counts.seen_in_pass.get(key, 0) + 1
        counts.seen_in_pass[key] = seen
        if seen > counts.accepted.get(key, 0):
            counts.accepted[key] = seen
            return True
        return False

    # ------------------------------------------------------------------ resume offsets

    def _oldest_unapplied(self, after_applied_ts: int, excluding_ddl: DDLKey | None) -> int | None:
        found = None
        for ts, group in self._groups.items():  # ascending first_offset
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
        return self._start_offset if self._last_offset is None else self._last_offset + 1

    def _pass_at(self, offset: int) -> int:
        """The pass in force after every record before ``offset``."""
        entry = _last_before(self._pass_starts, offset)
        return 0 if entry is None else entry[1]

    def resume_offset(
        self, after_applied_ts: int | None = None, *, excluding_ddl: DDLKey | None = None
    ) -> int | None:
        """Offset to restart this partition from once everything <= ``after_applied_ts`` (default:
        the current applied ts) and the DDL ``excluding_ddl`` are applied.

        The oldest record that still holds a cached row above that ts or a pending DDL; without one,
        the record after the last one fed; without any, the start offset (None if unknown). Then
        moved back to the records that set the pass horizon in force there (module docstring),
        so a restart reproduces this listener's decisions exactly.
        """
        after = self._progress.applied_ts if after_applied_ts is None else after_applied_ts
        r = self._oldest_unapplied(after, excluding_ddl)
        if r is None:
            return None
        current = self._pass_at(r)
        resume = r
        horizon = None
        entry = _last_before(self._res_log, r)
        if entry is not None and entry[1] == current:
            resume = min(resume, entry[0])
            horizon = entry[2]
        for log in self._max_logs.values():
            entry = _last_before(log, r)
            # A table max widens detection beyond the resolved horizon only when above it + 1.
            if entry is not None and entry[1] == current and (horizon is None or entry[2] > horizon + 1):
                resume = min(resume, entry[0])
        return resume

    # ------------------------------------------------------------------ after a window

    def discard_applied(self, applied_ddl: DDLKey | None = None) -> None:
        """Forget what the barrier just applied (``progress`` already updated). Barrier use only."""
        g = self._progress.applied_ts
        ts_sorted = self._ts_sorted
        cut = bisect_right(ts_sorted, g)
        if cut:
            pop = self._groups.pop
            nbytes = 0
            for ts in ts_sorted[:cut]:
                nbytes += pop(ts).nbytes
            self._cached_bytes -= nbytes
            self._cached_rows -= self._cum[cut - 1] - self._cum_base
            self._cum_base = self._cum[cut - 1]
            del ts_sorted[:cut]
            del self._cum[:cut]
        for key in [k for k in self._pending if k == applied_ddl or self._progress.is_ddl_applied(k)]:
            del self._pending[key]
        for table in [t for t, c in self._keyless.items() if c.ts <= g]:
            del self._keyless[table]
        self._prune_logs(self._oldest_unapplied(g, None))

    def _prune_logs(self, r: int | None) -> None:
        """Drop log entries no future ``resume_offset`` can need: its raw offset only grows."""
        if r is None:
            return
        current = self._pass_at(r)
        _keep_from_last_before(self._pass_starts, r)
        _keep_from_last_before(self._res_log, r)
        if self._res_log and self._res_log[0][0] < r and self._res_log[0][1] != current:
            del self._res_log[0]
        first = self._res_log[0] if self._res_log else None
        horizon = first[2] if first is not None and first[0] < r else None
        for table in list(self._max_logs):
            log = self._max_logs[table]
            _keep_from_last_before(log, r)
            if (
                log
                and log[0][0] < r
                and (log[0][1] != current or (horizon is not None and log[0][2] <= horizon + 1))
            ):
                del log[0]
            if not log:
                del self._max_logs[table]


def _keep_from_last_before(log: list, offset: int) -> None:
    i = bisect_left(log, (offset,))
    if i > 1:
        del log[: i - 1]

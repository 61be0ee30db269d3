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
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from applier.codec.events import DDLEvent, Event, LargeMessageEvent, Position, ResolvedEvent, Row, RowEvent
from applier.progress import DDLKey, SharedProgress, TableKey, ddl_key
from applier.window import is_keyless


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


@dataclass(slots=True)
class _TsGroup:
    """Kept rows of one commit ts, in arrival order."""

    first_offset: int
    rows: list[RowEvent] = field(default_factory=list)
    nbytes: int = 0


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
        """
        if self._last_offset is not None and offset <= self._last_offset:
            raise ValueError(
                f"partition {self.partition}: offset {offset} fed after {self._last_offset}; "
                "records must be fed once each, in offset order"
            )
        for ev in events:
            if isinstance(ev, LargeMessageEvent):
                raise LargeMessageNotSupported(ev)
            if not isinstance(ev, RowEvent | DDLEvent | ResolvedEvent):
                raise TypeError(f"not a decoded event: {type(ev).__name__}")
        if self._goes_backwards(events):
            self._pass_no += 1
            self._pass_res = None
            self._pass_max = {}
            self._pass_starts.append((offset, self._pass_no))
            self.stats.passes += 1
        self._dup_record = raw is not None and self._seen_keyless_record(raw, events)
        n = len(events)
        share, extra = divmod(max(record_bytes, 0), n) if n else (0, 0)
        for i, ev in enumerate(events):
            if isinstance(ev, RowEvent):
                self._on_row(offset, ev, share + (1 if i < extra else 0))
            elif isinstance(ev, ResolvedEvent):
                self._on_resolved(offset, ev.ts)
            else:
                self._on_ddl(offset, ev)
        self._last_offset = offset

    def _seen_keyless_record(self, raw: tuple[bytes | None, bytes | None], events: Sequence[Event]) -> bool:
        """Rule 5: is this a byte-identical copy of an unresolved record holding keyless rows?"""
        top = -1
        for ev in events:
            if isinstance(ev, RowEvent) and ev.commit_ts > top and is_keyless(ev):
                top = ev.commit_ts
        if top < 0:
            return False
        h = hashlib.blake2b(raw[0] or b"", digest_size=16)
        h.update(b"\x00")
        h.update(raw[1] or b"")
        digest = h.digest()
        if digest in self._keyless_records:
            return True
        self._keyless_records[digest] = top
        return False

    def _goes_backwards(self, events: Sequence[Event]) -> bool:
        """Does this record go backwards against the current pass (starting a new one)?"""
        res = self._pass_res
        seen: dict[TableKey, int] = {}
        for ev in events:
            if isinstance(ev, RowEvent):
                ts = ev.commit_ts
                table = (ev.schema, ev.table)
                top = seen.get(table)
                if top is None:
                    top = self._pass_max.get(table)
                if (res is not None and ts <= res) or (top is not None and ts < top):
                    return True
                if top is None or ts > top:
                    seen[table] = ts
            else:
                ts = ev.ts if isinstance(ev, ResolvedEvent) else ev.commit_ts - 1
                if res is not None and ts < res:
                    return True
                if res is None or ts > res:
                    res = ts
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

    def _on_row(self, offset: int, row: RowEvent, nbytes: int) -> None:
        ts = row.commit_ts
        table = (row.schema, row.table)
        top = self._pass_max.get(table)
        if top is None or ts > top:
            self._pass_max[table] = ts
            _append_log(self._max_logs.setdefault(table, []), offset, self._pass_no, ts)
        prev_max = self._max_seen.get(table)
        if prev_max is None or ts > prev_max:
            self._max_seen[table] = ts
        if ts <= self._progress.skip_threshold(table):
            self.stats.rows_skipped += 1
            return
        if (
            (self._obs is not None and ts <= self._obs)
            or (prev_max is not None and ts < prev_max)
            or (is_keyless(row) and (self._dup_record or not self._accept_keyless(table, row)))
        ):
            self.stats.rows_replayed += 1
            return
        group = self._groups.get(ts)
        if group is None:
            group = self._groups[ts] = _TsGroup(offset)
            insort(self._ts_sorted, ts)
        group.rows.append(row)
        group.nbytes += nbytes
        self._cached_bytes += nbytes
        self._cached_rows += 1
        self.stats.rows_kept += 1

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
        cut = bisect_right(self._ts_sorted, g)
        for ts in self._ts_sorted[:cut]:
            group = self._groups.pop(ts)
            self._cached_bytes -= group.nbytes
            self._cached_rows -= len(group.rows)
        del self._ts_sorted[:cut]
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

"""From row events to Kafka records as TiCDC's sink makes them: dispatch to partitions, spans
that hold rows back, batches per partition, flushes, broadcasts, and the faults (lost produces,
restarts, replays). The driver (:mod:`applier.simulator.driver`) hands it the workload in commit
order.

What this module reproduces (docs/open-protocol.md §1, §2, §5 and §7):

* a realistic TSO clock (``physical_ms << 18 | logical``), strictly increasing;
* ``CREATE DATABASE`` and one ``CREATE TABLE`` per table first, and an ``ALTER TABLE ... ADD
  COLUMN`` half way (rows after it carry the new column);
* one event per changed row per transaction, updates of a primary key or NOT NULL unique key
  split into a DELETE plus an INSERT with the same commit ts;
* partition dispatch by table or by handle-key value (keyless tables by table);
* row records batching up to ``max_batch_size`` events of one partition (and below
  ``max_message_bytes``), flushed at random moments as TiCDC's time-based flush does;
* resolved events broadcast to every partition, one event per record, only once every row at
  or below them was delivered to its partition;
* at-least-once delivery after simulated restarts: a partition, or all of them, re-sends
  everything after an earlier checkpoint (starting with that older resolved ts, re-batched),
  and now and then a record is sent twice;
* a final resolved ts broadcast that covers everything.

Producer orders that depend on the architecture and the tables (docs/open-protocol.md §5.1-§5.4),
each a :class:`StreamConfig` option; :data:`PRODUCER_MODES` names ready-made combinations:

* ``architecture``: the classic one (TiCDC up to v8.5) sends ``rid`` and writes a DDL only after
  every earlier row of every table; the new one (TiCDC v9) sends no ``rid`` and writes a DDL as
  soon as the tables it blocks have flushed (``ALTER TABLE X``: X; ``CREATE TABLE``: none), so
  rows of other tables with a smaller ts follow it, and a ``CREATE TABLE`` written at once by
  the table trigger dispatcher overtakes an earlier ``ALTER TABLE`` that waits for its table;
* ``partitioned``: a ``PARTITION BY HASH`` table whose four physical partitions are separate
  spans, each holding its rows back and flushing on its own, so one logical table's rows reach a
  Kafka partition out of ts order (every row key carries ``ptn``, the physical partition id);
* ``late_first_copies``: a produced record is lost, newer rows of its spans are delivered, then
  the sink restarts and each of those spans re-sends from its own checkpoint: the first copy of
  a lost row arrives after newer rows of its table ("BAB"), still above the last resolved ts;
* ``ddl_lag``: the mid-stream ``ALTER TABLE X`` is written only just before the next resolved
  broadcast (the latest a producer may): it blocks X alone (in both architectures), so rows of
  other tables with a larger ts reach the partitions before it, while X's newer rows wait for it;
* ``partition_growth``: the producer first uses only half of the topic's partitions (TiCDC keeps
  the partition count it started with, docs/open-protocol.md §5.7): rows, DDLs and resolved
  events go there only, the other partitions stay empty; a third of the way in, it picks up the
  full count and re-hashes, so rows of a key move to another partition while its older versions
  may still be unread on the old one, and the empty partitions start receiving records;
* with replays, also single spans re-created from their own checkpoint, which re-send only their
  part of a transaction's rows (partial first copies).

Large messages (docs/open-protocol.md §9), with ``large_message`` set: a row event larger than
``max_message_bytes`` as TiCDC measures it travels in its record as a claim-check reference (the
full event is stored as an object in :attr:`Simulation.claim_check_objects`, the key names it in
``ccl``) or with its handle-key columns only (``ohk``). A record sent twice carries the same
reference; a restart encodes the event again, which stores it once more under a new name.
``wide_rows`` adds a table whose rows make such events.

The result, a :class:`Simulation`, keeps the records in production order and can tell what the
upstream looked like at any ts, which is what a downstream must converge to.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NoReturn

from applier.codec.events import FLAG_HANDLE_KEY
from applier.simulator.encoder import (
    CLAIM_CHECK,
    HANDLE_KEY_ONLY,
    claim_check_location,
    claim_check_name,
    claim_check_object,
    compress,
    encode_event,
    event_size,
    frame,
    framed_size,
    handle_key_value_json,
    key_json,
)
from applier.simulator.model import Image, LargeMessage, SimEvent, SimRecord, StreamConfig
from applier.simulator.tables import (
    TableSpec,
)
from applier.simulator.workload import DELETE, INSERT, Row, RowChange


def partition_of(cfg: StreamConfig, spec: TableSpec, event: SimEvent, used: int | None = None) -> int:
    """The partition TiCDC's dispatcher picks for a row event, among the ``used`` first partitions
    (default: all of them; fewer while the producer has not picked up a larger count).

    ``table``: a hash of schema and table. ``index-value``: a hash of schema, table and the
    handle-key column names and values (tables without a handle key fall back to the table).
    A stable CRC-32, not TiCDC's exact hash function: only the grouping matters to a consumer.
    """
    h = zlib.crc32(cfg.schema.encode())
    h = zlib.crc32(b"\x00" + spec.name.encode(), h)
    if cfg.dispatcher == "index-value" and spec.handle_key:
        image = event.new if event.new is not None else event.old
        assert image is not None
        for name in spec.handle_key:
            value = image[name][2]
            raw = value if isinstance(value, bytes) else str(value).encode()
            h = zlib.crc32(b"\x00" + name.encode() + b"=" + raw, h)
    return h % (used or cfg.partitions)


def row_event(cfg: StreamConfig, spec: TableSpec, change: RowChange) -> SimEvent:
    """The event TiCDC sends for one net row change, with the images its settings produce."""
    flags = spec.flags
    legacy = cfg.legacy_strings

    def image(row: Row, names: list[str] | None = None) -> Image:
        out: Image = {}
        for col in spec.columns:
            if names is not None and col.name not in names:
                continue
            f = flags[col.name] & FLAG_HANDLE_KEY if legacy else flags[col.name]
            out[col.name] = (col.type_code, f, row[col.name])
        return out

    # A row's physical partition: the deleted image's for a DELETE, else the new image's (a key
    # change that moves the row was split into a DELETE and an INSERT, one per partition).
    located = change.old if change.kind == DELETE else change.new
    assert located is not None
    ev = SimEvent("row", 0, cfg.schema, spec.name, change.kind, row_id=change.row_id)
    ev.partition_id = spec.physical_id(located)
    if change.kind == DELETE:
        assert change.old is not None
        handle_only = (cfg.delete_only_handle_key or not cfg.sends_old_value) and spec.handle_key
        ev.old = image(change.old, list(spec.handle_key) if handle_only else None)
    elif change.kind == INSERT:
        assert change.new is not None
        ev.new = image(change.new)
    else:
        assert change.new is not None and change.old is not None
        ev.new = image(change.new)
        if cfg.sends_old_value:
            changed = None
            if cfg.only_updated_columns:
                changed = [c for c in spec.column_names if change.old[c] != change.new[c]]
            ev.old = image(change.old, changed)
    return ev


Span = tuple[str, int | None]
"""A table span: the table and, for a partitioned table, the physical partition id."""

_SPAN_FLUSH_CHANCE = 0.3  # per transaction: a span that holds rows back hands them to the sink
_FAILED_PRODUCE_CHANCE = 0.08  # per row record, with late_first_copies: its produce fails
_SINK_RESTART_CHANCE = 0.3  # per transaction: the sink notices the failure and restarts
SPAN_REPLAY_CHANCE = 0.03  # per transaction, with span_replays: one span is re-created


@dataclass(slots=True, eq=False)
class _Entry:
    """One encoded event on its way to a record."""

    event: SimEvent
    key: bytes
    value: bytes
    partition: int = -1  # the Kafka partition of a row (broadcasts go everywhere)
    span: Span | None = None  # None for DDL and resolved events
    seq: int = 0  # for rows: the order in which the sink received them
    large: LargeMessage | None = None  # how a row over max_message_bytes travels
    stored: bytes = b""  # for a claim-check reference: the object (stored again on a re-send)


class Emitter:
    """Carries rows from their spans through the sink's batches to records, with the faults.

    A row goes through three stages, as in TiCDC: its span may hold it back (``spans``); the
    sink batches it per Kafka partition (``pending``); a flush produces the record, which is
    delivered, or lost when late first copies are simulated (``lost``, re-sent by a restart).
    ``sent`` keeps, per partition, the first copies in delivery order: what a restart from a
    checkpoint sends again.
    """

    ACTIVE_BROADCASTS = 0
    """Topic dispatcher: a table's topic gets resolved events while its last row is at most this
    many broadcasts old (0: since the last one); tables that do not change make quiet topics."""

    def __init__(self, cfg: StreamConfig, rng: random.Random, table_topics: list[str] | None = None) -> None:
        self.cfg = cfg
        self.rng = rng
        # Topic dispatcher: topic 0 is the default topic, topic i the table table_topics[i - 1];
        # slot = topic * cfg.partitions + partition.
        self.table_topics = table_topics or []
        self.slot_count = cfg.partitions * (1 + len(self.table_topics))
        self._broadcasts = 0
        self._row_at: dict[str, int] = {}  # table -> broadcasts seen when its last row came
        self.opts = cfg.encoder_options
        self.spans: dict[Span, list[_Entry]] = {}  # rows held back by their span
        self.parked: dict[str, list[tuple[int, SimEvent, bool]]] = {}  # rows waiting for a DDL
        self.pending: list[list[_Entry]] = [[] for _ in range(self.slot_count)]
        self.sent: list[list[_Entry]] = [[] for _ in range(self.slot_count)]  # first copies
        self.delivered: list[set[int]] = [set() for _ in range(self.slot_count)]  # id() of rows
        self.handed: dict[Span, list[_Entry]] = {}  # every row a span gave the sink, in order
        self.lost: list[_Entry] = []  # rows of a record whose produce failed, not re-sent yet
        self._lost_at = (0, 0)  # (partition, len(sent[partition])) when the record was lost
        self.last_resolved = 0
        self.records: list[SimRecord] = []
        self._recent: list[list[SimRecord]] = [[] for _ in range(self.slot_count)]
        self._seq = 0
        self.objects: dict[str, bytes] = {}  # claim-check objects written
        # Object names come from their own generator, seeded from the seed: drawing them leaves
        # the rest of the stream as it is with the other options (the same seed, the same events).
        self.names = random.Random(f"claim-check {cfg.seed}")
        self.faults = cfg.replays  # duplicates on; switched off for the closing broadcast
        # Partitions the producer writes to: rows are hashed over them, broadcasts reach them.
        self.used = max(1, cfg.partitions // 2) if cfg.partition_growth else self.slot_count

    def entry(self, event: SimEvent) -> _Entry:
        """An event encoded as TiCDC's encoder does; a row over max_message_bytes as the
        large-message option says (a claim-check object is written now, before any produce)."""
        key, value = encode_event(event, self.opts)
        if event_size(key, value) <= self.cfg.max_message_bytes:
            return _Entry(event, key, value)
        if event.kind != "row" or self.cfg.large_message is None:
            self._too_large(event, "")
        reduced = compress(handle_key_value_json(event, self.opts), self.opts.compression)
        if self.cfg.large_message == CLAIM_CHECK:
            return self._claim_check(_Entry(event, key, reduced, stored=claim_check_object(key, value)))
        key = key_json(event, self.opts, handle_key_only=True)
        if event_size(key, reduced) > self.cfg.max_message_bytes:
            self._too_large(event, " even with its handle-key columns only")
        return _Entry(event, key, reduced, large=LargeMessage(HANDLE_KEY_ONLY))

    def _claim_check(self, entry: _Entry) -> _Entry:
        """Store ``entry.stored`` under a new name and return the reference to it: ``entry`` with
        the key naming the object (the value, the handle-key columns, stays the same)."""
        name = claim_check_name(self.names)
        self.objects[name] = entry.stored
        location = claim_check_location(self.cfg.claim_check_uri, name)
        key = key_json(entry.event, self.opts, claim_check=location)
        if event_size(key, entry.value) > self.cfg.max_message_bytes:
            self._too_large(entry.event, " even as a claim-check reference")
        return replace(entry, key=key, large=LargeMessage(CLAIM_CHECK, location, name))

    def _too_large(self, event: SimEvent, how: str) -> NoReturn:
        raise ValueError(
            f"a single event of {event.schema}.{event.table} at ts {event.commit_ts} exceeds "
            f"max_message_bytes ({self.cfg.max_message_bytes}){how}; TiCDC fails the changefeed here"
        )

    def _reencoded(self, entry: _Entry) -> _Entry:
        """A row as a restarted producer encodes it again: a claim-check reference names a new
        object (TiCDC draws a new name and writes the event again); everything else is unchanged."""
        if entry.large is None or entry.large.option != CLAIM_CHECK:
            return entry
        return self._claim_check(entry)

    # -- rows: span, then the sink's batch ----------------------------------------------------

    def add_row(self, partition: int, event: SimEvent, *, hold_back: bool = False) -> None:
        """A row of a committed transaction, for ``partition``; its span keeps it if ``hold_back``."""
        parked = self.parked.get(event.table)
        if parked is not None:
            parked.append((partition, event, hold_back))
            return
        entry = self.entry(event)
        entry.partition = partition
        entry.span = (event.table, event.partition_id)
        if hold_back:
            self.spans.setdefault(entry.span, []).append(entry)
        else:
            self._hand(entry, may_fail=True)

    def park(self, tables: set[str]) -> None:
        """Rows of ``tables`` committed from now on wait until ``unpark``: a DDL of theirs is
        finished but not written yet, and the DDL blocks its own table at its ts."""
        for table in tables:
            self.parked[table] = []

    def unpark(self, tables: set[str]) -> None:
        """The DDL is written: the rows that waited for it go on, in commit order."""
        for table in sorted(tables):
            for partition, event, hold_back in self.parked.pop(table):
                self.add_row(partition, event, hold_back=hold_back)

    def _hand(self, entry: _Entry, *, may_fail: bool) -> None:
        """The sink takes a row into its batch for the row's partition."""
        assert entry.span is not None
        entry.seq = self._seq
        self._seq += 1
        self.handed.setdefault(entry.span, []).append(entry)
        partition = entry.partition
        pending = self.pending[partition]
        if pending and _size([*pending, entry]) > self.cfg.max_message_bytes:
            self.flush(partition, may_fail=may_fail)
        pending.append(entry)
        if len(pending) >= self.cfg.max_batch_size:
            self.flush(partition, may_fail=may_fail)

    def _release(self, span: Span, *, may_fail: bool) -> None:
        """A span hands everything it held back to the sink, in commit order."""
        held = self.spans[span]
        rows = list(held)
        held.clear()
        for entry in rows:
            self._hand(entry, may_fail=may_fail)

    def flush(self, partition: int, *, may_fail: bool = False) -> None:
        """Produce the partition's batch as one record (lost, now and then, if ``may_fail``)."""
        pending = self.pending[partition]
        if not pending:
            return
        batch = list(pending)
        pending.clear()
        if may_fail and self._produce_fails():
            self.lost.extend(batch)
            self._lost_at = (partition, len(self.sent[partition]))
            return
        self._emit(partition, batch)

    def _produce_fails(self) -> bool:
        # One failure at a time: the sink restarts before the checkpoint (and so the next
        # resolved broadcast) can pass the lost rows.
        return self.cfg.late_first_copies and not self.lost and self.rng.random() < _FAILED_PRODUCE_CHANCE

    def flush_all(self) -> None:
        for p in range(self.slot_count):
            self.flush(p)

    def random_flushes(self) -> None:
        """Spans and the sink also flush on timers, so batches are often smaller than the
        maximum and spans run at their own pace; a failed produce is noticed after a while."""
        for span, held in self.spans.items():
            if held and self.rng.random() < _SPAN_FLUSH_CHANCE:
                self._release(span, may_fail=True)
        for p in range(self.slot_count):
            if self.pending[p] and self.rng.random() < 0.3:
                self.flush(p, may_fail=True)
        if self.lost and self._newer_rows_landed() and self.rng.random() < _SINK_RESTART_CHANCE:
            self.restart_failed_spans()

    def _newer_rows_landed(self) -> bool:
        """Whether a record produced after the lost one delivered rows of the same spans to the
        same partition: the "B" that a consumer receives before the late first copy of "A".
        (A barrier restarts the sink even without them.)"""
        partition, mark = self._lost_at
        spans = {e.span for e in self.lost}
        return any(e.span in spans for e in self.sent[partition][mark:])

    # -- broadcasts ---------------------------------------------------------------------------

    def broadcast(self, event: SimEvent, blocked: set[str] | None = None) -> None:
        """A DDL or resolved event to every partition, after the rows it must follow.

        ``blocked`` None: after every row handed over so far (resolved events, and every DDL of
        the classic architecture, whose owner runs a DDL only once the checkpoint reached it).
        A set of tables: only after those tables' rows (a DDL of the new architecture waits for
        the dispatchers of the tables it blocks); other spans keep what they hold back.
        """
        entry = self.entry(event)
        for span in list(self.spans):
            if self.spans[span] and (blocked is None or span[0] in blocked):
                self._release(span, may_fail=False)
        if self.lost and (blocked is None or any(e.span and e.span[0] in blocked for e in self.lost)):
            self.restart_failed_spans()
        # Every partition's rows first, then the event everywhere: TiCDC writes a resolved ts
        # (or runs a DDL) only once the rows it must follow were acknowledged on *every*
        # partition, so no row below it reaches any partition after it reached one. (Flushing
        # and emitting partition by partition put a new partition's first rows after the
        # resolved ts the others had already received.)
        for p in range(self.slot_count):
            if blocked is None or any(e.span and e.span[0] in blocked for e in self.pending[p]):
                self.flush(p)
        for p in self._targets(event):
            self._emit(p, [entry])

    def _topic_slots(self, topic: int) -> range:
        n = self.cfg.partitions
        return range(topic * n, (topic + 1) * n)

    def _targets(self, event: SimEvent) -> Iterator[int]:
        """The partitions a broadcast reaches: all that are used; with the topic dispatcher, a
        table DDL's table topic, a schema DDL's default topic, a resolved event's default topic
        and active table topics."""
        if not self.table_topics:
            yield from range(self.used)
            return
        if event.kind == "ddl" and event.table:
            yield from self._topic_slots(1 + self.table_topics.index(event.table))
            return
        yield from self._topic_slots(0)
        if event.kind == "resolved":
            for i, table in enumerate(self.table_topics, 1):
                seen = self._row_at.get(table)
                if seen is not None and self._broadcasts - seen <= self.ACTIVE_BROADCASTS:
                    yield from self._topic_slots(i)

    def row_slot(self, spec: TableSpec, event: SimEvent) -> int:
        """The partition of a row: TiCDC's dispatcher within its topic (``partition_of``)."""
        if not self.table_topics:
            return partition_of(self.cfg, spec, event, self.used)
        self._row_at[spec.name] = self._broadcasts
        return self.cfg.partitions * (1 + self.table_topics.index(spec.name)) + partition_of(
            self.cfg, spec, event
        )

    def resolved(self, ts: int) -> None:
        """A resolved ts: every row at or below it is delivered first (the checkpoint is the
        minimum over all spans of what Kafka acknowledged)."""
        self.broadcast(SimEvent("resolved", ts))
        self.last_resolved = ts
        self._broadcasts += 1

    # -- records and faults -------------------------------------------------------------------

    def _emit(self, partition: int, entries: list[_Entry], *, replay: bool = False) -> None:
        key, value = frame([(e.key, e.value) for e in entries])
        large = [e.large for e in entries]
        rec = SimRecord(
            partition,
            key,
            value,
            [e.event for e in entries],
            replay=replay,
            large=large if any(large) else None,
        )
        self.records.append(rec)
        delivered = self.delivered[partition]
        for e in entries:
            if e.event.kind == "row":
                if id(e.event) in delivered:
                    continue
                delivered.add(id(e.event))
            elif replay:
                continue
            self.sent[partition].append(e)
        recent = self._recent[partition]
        recent.append(rec)
        del recent[:-3]
        if self.faults and self.rng.random() < self.cfg.duplicate_rate:
            # A producer retry after a lost acknowledgement: the same bytes again, possibly after
            # records that followed the original.
            orig = self.rng.choice(recent)
            self.records.append(
                SimRecord(
                    partition,
                    orig.key,
                    orig.value,
                    list(orig.events),
                    replay=orig.replay,
                    duplicate=True,
                    large=None if orig.large is None else list(orig.large),
                )
            )

    def _resend(self, partition: int, checkpoint: _Entry, entries: list[_Entry]) -> None:
        """A restart on one partition: the checkpoint's resolved ts, then ``entries`` in order,
        re-batched (rows of several spans may share a record again, DDLs travel alone). The
        restarted encoder writes claim-check objects again, under new names."""
        self._emit(partition, [checkpoint], replay=True)
        batch: list[_Entry] = []
        cap = self.rng.randint(1, self.cfg.max_batch_size)
        for entry in entries:
            if entry.event.kind != "row":
                if batch:
                    self._emit(partition, batch, replay=True)
                    batch = []
                self._emit(partition, [entry], replay=True)
                continue
            entry = self._reencoded(entry)
            if batch and (len(batch) >= cap or _size([*batch, entry]) > self.cfg.max_message_bytes):
                self._emit(partition, batch, replay=True)
                batch = []
                cap = self.rng.randint(1, self.cfg.max_batch_size)
            batch.append(entry)
        if batch:
            self._emit(partition, batch, replay=True)

    def replay(self, partitions: list[int], checkpoint_ts: int) -> None:
        """A restart from checkpoint ``checkpoint_ts``: the partitions get that (older) resolved ts
        again, then every first copy delivered after it, in delivery order, re-batched."""
        for p in partitions:
            self.flush(p)
        checkpoint = self.entry(SimEvent("resolved", checkpoint_ts))
        for p in partitions:
            self._resend(p, checkpoint, [e for e in self.sent[p] if e.event.commit_ts > checkpoint_ts])

    def replay_span(self, span: Span, checkpoint_ts: int) -> None:
        """One span re-created from its own checkpoint (a node restart in the new architecture, a
        table sink restart or a table moved in the classic one): only its rows after the
        checkpoint come again, so a transaction that also touched other spans on a partition
        is re-sent there only in part."""
        checkpoint = self.entry(SimEvent("resolved", checkpoint_ts))
        for p in range(self.slot_count):
            rows = [e for e in self.sent[p] if e.span == span and e.event.commit_ts > checkpoint_ts]
            if rows:
                self._resend(p, checkpoint, rows)

    def restart_failed_spans(self) -> None:
        """The sink restarts after a failed produce ("BAB", docs/open-protocol.md §5.1).

        Records produced after the lost one may have landed (newer rows of the same spans). The
        sink is torn down, dropping the rows it had not produced yet, and every span with a
        lost row restarts from its own checkpoint: at or above the last resolved broadcast (the
        changefeed checkpoint is their minimum) and below its oldest unacknowledged row. It
        sends everything after that checkpoint again, the lost rows' first copies among them.
        """
        spans = sorted({e.span for e in self.lost if e.span is not None}, key=_span_order)
        lost_partition = self._lost_at[0]
        if any(e.span in spans for e in self.pending[lost_partition]):
            # What was already in flight behind the lost record lands before the teardown.
            self.flush(lost_partition)
        self.lost = []
        resend: list[_Entry] = []
        for span in spans:
            handed = self.handed[span]
            oldest_unacked = min(
                e.event.commit_ts for e in handed if id(e.event) not in self.delivered[e.partition]
            )
            acked = {e.event.commit_ts for e in handed if e.event.commit_ts < oldest_unacked}
            choices = sorted({self.last_resolved} | {ts for ts in acked if ts > self.last_resolved})
            checkpoint_ts = self.rng.choice(choices)
            resend += [e for e in handed if e.event.commit_ts > checkpoint_ts]
        restarted = set(spans)
        for pending in self.pending:
            pending[:] = [e for e in pending if e.span not in restarted]
        resend.sort(key=lambda e: e.seq)
        # The resolved ts the consumer sees before the re-sent rows is the last broadcast one:
        # no span's checkpoint is below it, and none above it may be announced.
        checkpoint = self.entry(SimEvent("resolved", self.last_resolved))
        for p in range(self.slot_count):
            rows = [e for e in resend if e.partition == p]
            if rows:
                self._resend(p, checkpoint, rows)

    def spans_with_rows(self) -> list[Span]:
        """Spans that handed rows to the sink, in the order they first did."""
        return list(self.handed)


def _size(entries: list[_Entry]) -> int:
    return framed_size([(e.key, e.value) for e in entries])


def _span_order(span: Span | None) -> tuple[str, int]:
    assert span is not None
    return span[0], -1 if span[1] is None else span[1]

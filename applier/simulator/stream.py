"""Turn simulated upstream transactions into the Kafka records a TiCDC changefeed would produce.

What this module reproduces (open-protocol.md sections 1, 5 and 7):

* a realistic TSO clock (``physical_ms << 18 | logical``), strictly increasing;
* ``CREATE DATABASE`` and one ``CREATE TABLE`` per table first, and an ``ALTER TABLE ... ADD
  COLUMN`` half way (rows after it carry the new column);
* one event per changed row per transaction, updates of a primary key or NOT NULL unique key
  split into a DELETE plus an INSERT with the same commit ts;
* partition dispatch by table or by handle-key value (keyless tables by table);
* row records batching up to ``max_batch_size`` events of one partition (and below
  ``max_message_bytes``), flushed at random moments as TiCDC's time-based flush does;
* resolved and DDL events broadcast to every partition, one event per record, always after every
  earlier row event of that partition;
* at-least-once delivery after simulated restarts: a partition, or all of them, re-sends
  everything after an earlier checkpoint (starting with that older resolved ts, re-batched),
  and now and then a record is sent twice;
* a final resolved ts broadcast that covers everything.

The result, a :class:`Simulation`, keeps the records in production order and can tell what the
upstream looked like at any ts, which is what a downstream must converge to.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from applier.simulator.encoder import EncoderOptions, encode_event, frame, framed_size
from applier.simulator.tables import (
    DDL_ADD_COLUMN,
    DDL_CREATE_SCHEMA,
    DDL_CREATE_TABLE,
    FLAG_HANDLE_KEY,
    TableSpec,
    add_column_sql,
    quote_ident,
)
from applier.simulator.workload import DELETE, INSERT, UPDATE, Row, RowChange, Upstream

DISPATCHERS = ("index-value", "table")

Image = dict[str, tuple[int, int, Any]]
"""A row image as sent: column name -> (type code, flags, model value)."""


@dataclass
class StreamConfig:
    """What to simulate: the workload size and the changefeed settings TiCDC would have."""

    seed: int = 1
    partitions: int = 4
    transactions: int = 200
    dispatcher: str = "index-value"  # "index-value" | "table"
    resolved_every: int = 5  # broadcast a resolved ts after every N transactions
    old_value: bool = True  # output-old-value: "p" on updates, full "d" on deletes
    only_updated_columns: bool = False  # "p" holds only the changed columns
    legacy_strings: bool = False  # pre-v4.0.5 producer: base64 CHAR/VARCHAR, no "f", no "p"
    delete_only_handle_key: bool = False  # delete-only-output-handle-key-columns
    compression: str | None = None  # None | "snappy" | "lz4"
    replays: bool = True  # simulate restarts (re-sends from a checkpoint) and duplicated records
    duplicate_rate: float = 0.03  # chance that a record is sent twice (with replays on)
    ddl_mid_stream: bool = True  # ALTER TABLE ... ADD COLUMN half way
    schema: str = "sim"
    max_batch_size: int = 16  # TiCDC max-batch-size
    max_message_bytes: int = 1 << 20  # TiCDC max-message-bytes (kept within Kafka's default)
    row_ids: bool = False  # send "rid" in row keys like older producers
    start_physical_ms: int | None = None  # first TSO's physical time; derived from the seed if None

    def validate(self) -> None:
        """Raise ValueError for settings no TiCDC changefeed could have."""
        if self.partitions < 1:
            raise ValueError("partitions must be at least 1")
        if self.transactions < 0:
            raise ValueError("transactions must not be negative")
        if self.dispatcher not in DISPATCHERS:
            raise ValueError(f"dispatcher must be one of {DISPATCHERS}, not {self.dispatcher!r}")
        if self.resolved_every < 1:
            raise ValueError("resolved_every must be at least 1")
        if not self.max_batch_size >= 1:
            raise ValueError("max_batch_size must be at least 1")
        if not self.schema:
            raise ValueError("schema must not be empty")
        EncoderOptions(compression=self.compression)  # validates the compression name

    @property
    def sends_old_value(self) -> bool:
        """Whether updates carry "p" and deletes carry full rows (legacy producers never did)."""
        return self.old_value and not self.legacy_strings

    @property
    def include_keyless(self) -> bool:
        """TiCDC replicates keyless tables only with old values and full delete images."""
        return self.sends_old_value and not self.delete_only_handle_key

    @property
    def encoder_options(self) -> EncoderOptions:
        return EncoderOptions(
            legacy_strings=self.legacy_strings, compression=self.compression, row_ids=self.row_ids
        )


@dataclass(slots=True)
class SimEvent:
    """One event as produced: what a decoder should get back from the wire.

    ``kind`` is "row", "ddl" or "resolved". For rows, ``row_kind`` is the upstream change
    ("insert", "update", "delete"), ``new`` the "u" image, ``old`` the "p" image of an update
    (None when old values are off) or the "d" image of a delete. Images map column name to
    (type code, flags, model value); model values are int, float, str (text, DECIMAL, dates,
    JSON), bytes (binary strings and BLOBs) or None. Flags are those on the wire: in legacy mode
    only the handle-key bit (the "h" marker) remains, and CHAR/VARCHAR text travels as base64, so
    a decoder may return it as UTF-8 bytes.
    """

    kind: str
    commit_ts: int
    schema: str = ""
    table: str = ""
    row_kind: str | None = None
    new: Image | None = None
    old: Image | None = None
    ddl_query: str | None = None
    ddl_type: int | None = None
    row_id: int | None = None

    @property
    def wire_kind(self) -> str | None:
        """How a consumer must treat the event: a "u"-only update is indistinguishable from an
        insert (and applied as an upsert)."""
        if self.kind != "row":
            return None
        if self.row_kind == DELETE:
            return DELETE
        return UPDATE if self.old else INSERT


@dataclass(slots=True)
class SimRecord:
    """One Kafka record: its partition, its bytes and the events it carries."""

    partition: int
    key: bytes
    value: bytes
    events: list[SimEvent]
    replay: bool = False  # re-sent after a simulated restart (copies of earlier events)
    duplicate: bool = False  # a byte-identical second copy of an earlier record


@dataclass(slots=True)
class _Step:
    """One upstream change in commit order, for rebuilding the state as of a ts."""

    ts: int
    kind: str  # "create" | "add_column" | "txn"
    table: str = ""
    spec: TableSpec | None = None
    changes: list[RowChange] = field(default_factory=list)


@dataclass
class Simulation:
    """A simulated stream: the records in production order, and the upstream history."""

    config: StreamConfig
    records: list[SimRecord]
    resolved_points: list[int]  # resolved ts of the original broadcasts, increasing
    final_resolved_ts: int
    ddl_events: list[SimEvent]  # first copies, in commit order
    commit_ts: list[int]  # commit ts of the transactions that changed something
    steps: list[_Step] = field(repr=False, default_factory=list)

    @property
    def schema(self) -> str:
        return self.config.schema

    @property
    def ddl_statements(self) -> list[str]:
        """The query texts of the DDL events, in commit order."""
        return [ev.ddl_query or "" for ev in self.ddl_events]

    def tables_at(self, ts: int) -> dict[str, TableSpec]:
        """Table definitions in effect after every DDL with commit ts <= ts."""
        specs: dict[str, TableSpec] = {}
        for step in self.steps:
            if step.ts > ts:
                break
            if step.kind in ("create", "add_column") and step.spec is not None:
                specs[step.table] = step.spec
        return specs

    def table_spec(self, table: str, ts: int | None = None) -> TableSpec | None:
        """A table's definition as of ``ts`` (default: the end of the stream)."""
        return self.tables_at(self.final_resolved_ts if ts is None else ts).get(table)

    def expected_snapshot(self, resolved_ts: int) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """The upstream state after every transaction and DDL with commit ts <= ``resolved_ts``.

        Keys are (schema, table) for every table created by then; rows are plain dicts of model
        values in column order (generated columns included), sorted for stable output. A table
        added a column by then has it in every row (older rows hold the column default).
        """
        rows: dict[str, dict[Any, Row]] = {}
        specs: dict[str, TableSpec] = {}
        for step in self.steps:
            if step.ts > resolved_ts:
                break
            if step.kind == "create":
                assert step.spec is not None
                rows[step.table] = {}
                specs[step.table] = step.spec
            elif step.kind == "add_column":
                assert step.spec is not None
                col = step.spec.columns[-1]
                specs[step.table] = step.spec
                rows[step.table] = {k: {**r, col.name: col.default} for k, r in rows[step.table].items()}
            else:
                for change in step.changes:
                    table = rows[change.table]
                    if change.kind == DELETE:
                        del table[change.key]
                    else:
                        assert change.new is not None
                        table[change.key] = change.new
        return {
            (self.schema, name): sorted((dict(r) for r in table.values()), key=_row_sort_key)
            for name, table in rows.items()
        }

    def records_by_partition(self) -> dict[int, list[SimRecord]]:
        """Records of each partition, in the order the partition receives them."""
        out: dict[int, list[SimRecord]] = {p: [] for p in range(self.config.partitions)}
        for rec in self.records:
            out[rec.partition].append(rec)
        return out

    def summary(self) -> dict[str, Any]:
        """Counts a user (or the CLI) wants to see after producing the stream."""
        kinds: Counter[str] = Counter()
        for rec in self.records:
            for ev in rec.events:
                kinds[ev.row_kind if ev.kind == "row" else ev.kind] += 1  # type: ignore[index]
        final = self.expected_snapshot(self.final_resolved_ts)
        return {
            "schema": self.schema,
            "partitions": self.config.partitions,
            "dispatcher": self.config.dispatcher,
            "records": len(self.records),
            "replayed_records": sum(r.replay for r in self.records),
            "duplicate_records": sum(r.duplicate for r in self.records),
            "transactions": len(self.commit_ts),
            "events": dict(sorted(kinds.items())),
            "ddl": [ev.ddl_query for ev in self.ddl_events],
            "resolved_points": len(self.resolved_points),
            "final_resolved_ts": self.final_resolved_ts,
            "rows_at_end": {table: len(rows) for (_, table), rows in final.items()},
        }


def format_summary(sim: Simulation) -> str:
    """Human-readable multi-line summary of a simulation, for ``applier simulate``."""
    s = sim.summary()
    events = ", ".join(f"{k} {v}" for k, v in s["events"].items())
    rows = ", ".join(f"{t} {n}" for t, n in s["rows_at_end"].items())
    return "\n".join(
        [
            f"schema {s['schema']!r}: {s['transactions']} transactions, {len(s['ddl'])} DDL statements",
            f"{s['records']} records over {s['partitions']} partitions (dispatcher {s['dispatcher']}), "
            f"{s['replayed_records']} replayed, {s['duplicate_records']} duplicated",
            f"events (all copies): {events}",
            f"{s['resolved_points']} resolved broadcasts; final resolved ts {s['final_resolved_ts']}",
            f"rows upstream at the final resolved ts: {rows}",
        ]
    )


def _row_sort_key(row: dict[str, Any]) -> tuple:
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in row.values())


class TsoClock:
    """TiDB-style timestamps: ``physical_ms << 18 | logical``, strictly increasing."""

    def __init__(self, rng: random.Random, start_physical_ms: int) -> None:
        self.rng = rng
        self.physical = start_physical_ms

    def next(self) -> int:
        self.physical += self.rng.randint(1, 40)
        return self.physical << 18 | self.rng.randint(0, 63)


def partition_of(cfg: StreamConfig, spec: TableSpec, event: SimEvent) -> int:
    """The partition TiCDC's dispatcher picks for a row event.

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
    return h % cfg.partitions


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

    ev = SimEvent("row", 0, cfg.schema, spec.name, change.kind, row_id=change.row_id)
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


_Entry = tuple[SimEvent, bytes, bytes]  # event, key JSON, value bytes


class _Emitter:
    """Batches events into records per partition and simulates the delivery faults."""

    def __init__(self, cfg: StreamConfig, rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self.opts = cfg.encoder_options
        self.pending: list[list[_Entry]] = [[] for _ in range(cfg.partitions)]
        self.sent: list[list[_Entry]] = [[] for _ in range(cfg.partitions)]  # first copies
        self.records: list[SimRecord] = []
        self._recent: list[list[SimRecord]] = [[] for _ in range(cfg.partitions)]
        self.faults = cfg.replays  # duplicates on; switched off for the closing broadcast

    def entry(self, event: SimEvent) -> _Entry:
        key, value = encode_event(event, self.opts)
        if framed_size([(key, value)]) > self.cfg.max_message_bytes:
            raise ValueError(
                f"a single event of {event.schema}.{event.table} at ts {event.commit_ts} exceeds "
                f"max_message_bytes ({self.cfg.max_message_bytes}); TiCDC fails the changefeed here"
            )
        return event, key, value

    def add_row(self, partition: int, event: SimEvent) -> None:
        entry = self.entry(event)
        pending = self.pending[partition]
        if pending and framed_size([(k, v) for _, k, v in [*pending, entry]]) > self.cfg.max_message_bytes:
            self.flush(partition)
        pending.append(entry)
        if len(pending) >= self.cfg.max_batch_size:
            self.flush(partition)

    def flush(self, partition: int) -> None:
        pending = self.pending[partition]
        if pending:
            self._emit(partition, list(pending))
            self.sent[partition].extend(pending)
            pending.clear()

    def flush_all(self) -> None:
        for p in range(self.cfg.partitions):
            self.flush(p)

    def random_flushes(self) -> None:
        """TiCDC also flushes on a timer, so batches are often smaller than the maximum."""
        for p in range(self.cfg.partitions):
            if self.pending[p] and self.rng.random() < 0.3:
                self.flush(p)

    def broadcast(self, event: SimEvent) -> None:
        """A DDL or resolved event to every partition, after that partition's earlier rows."""
        entry = self.entry(event)
        for p in range(self.cfg.partitions):
            self.flush(p)
            self._emit(p, [entry])
            self.sent[p].append(entry)

    def _emit(self, partition: int, entries: list[_Entry], *, replay: bool = False) -> None:
        key, value = frame([(k, v) for _, k, v in entries])
        rec = SimRecord(partition, key, value, [e for e, _, _ in entries], replay=replay)
        self.records.append(rec)
        recent = self._recent[partition]
        recent.append(rec)
        del recent[:-3]
        if self.faults and self.rng.random() < self.cfg.duplicate_rate:
            # A producer retry after a lost acknowledgement: the same bytes again, possibly after
            # records that followed the original.
            orig = self.rng.choice(recent)
            self.records.append(
                SimRecord(
                    partition, orig.key, orig.value, list(orig.events), replay=orig.replay, duplicate=True
                )
            )

    def replay(self, partitions: list[int], checkpoint_ts: int) -> None:
        """A restart from checkpoint ``checkpoint_ts``: the partitions get that (older) resolved ts
        again, then every event after it, re-encoded in their original order but re-batched."""
        for p in partitions:
            self.flush(p)
        checkpoint = self.entry(SimEvent("resolved", checkpoint_ts))
        for p in partitions:
            self._emit(p, [checkpoint], replay=True)
            batch: list[_Entry] = []
            cap = self.rng.randint(1, self.cfg.max_batch_size)
            for entry in (e for e in self.sent[p] if e[0].commit_ts > checkpoint_ts):
                if entry[0].kind != "row":
                    if batch:
                        self._emit(p, batch, replay=True)
                        batch = []
                    self._emit(p, [entry], replay=True)
                    continue
                pairs = [(k, v) for _, k, v in batch] + [(entry[1], entry[2])]
                if batch and (len(batch) >= cap or framed_size(pairs) > self.cfg.max_message_bytes):
                    self._emit(p, batch, replay=True)
                    batch = []
                    cap = self.rng.randint(1, self.cfg.max_batch_size)
                batch.append(entry)
            if batch:
                self._emit(p, batch, replay=True)


def simulate(cfg: StreamConfig) -> Simulation:
    """Simulate a TiCDC changefeed over a random workload; deterministic for a given config."""
    cfg.validate()
    rng = random.Random(cfg.seed)
    start_ms = (
        cfg.start_physical_ms
        if cfg.start_physical_ms is not None
        else 1_700_000_000_000 + rng.randint(0, 10**10)
    )
    clock = TsoClock(rng, start_ms)
    upstream = Upstream(rng, include_keyless=cfg.include_keyless)
    emitter = _Emitter(cfg, rng)
    steps: list[_Step] = []
    ddl_events: list[SimEvent] = []
    resolved_points: list[int] = []
    commit_ts: list[int] = []

    def ddl(table: str, query: str, ddl_type: int) -> int:
        ts = clock.next()
        ev = SimEvent("ddl", ts, cfg.schema, table, ddl_query=query, ddl_type=ddl_type)
        ddl_events.append(ev)
        emitter.broadcast(ev)
        return ts

    def resolved() -> None:
        ts = clock.next()
        resolved_points.append(ts)
        emitter.broadcast(SimEvent("resolved", ts))

    ddl("", f"CREATE DATABASE {quote_ident(cfg.schema)}", DDL_CREATE_SCHEMA)
    for spec in upstream.specs.values():
        ts = ddl(spec.name, spec.create_table_sql(), DDL_CREATE_TABLE)
        steps.append(_Step(ts, "create", spec.name, spec))
    resolved()

    n = cfg.transactions
    alter_at = n // 2 if cfg.ddl_mid_stream else -1
    planned_replays = {n // 3: "one", (2 * n) // 3: "all"} if cfg.replays and n >= 6 else {}
    for i in range(n):
        if i == alter_at:
            added = upstream.add_column()
            spec = upstream.specs[added.table]
            ts = ddl(added.table, add_column_sql(added.table, added.column), DDL_ADD_COLUMN)
            steps.append(_Step(ts, "add_column", added.table, spec))
        changes = upstream.random_transaction()
        if changes:
            ts = clock.next()
            commit_ts.append(ts)
            steps.append(_Step(ts, "txn", changes=changes))
            for change in changes:
                spec = upstream.specs[change.table]
                ev = row_event(cfg, spec, change)
                ev.commit_ts = ts
                emitter.add_row(partition_of(cfg, spec, ev), ev)
        emitter.random_flushes()
        if (i + 1) % cfg.resolved_every == 0:
            resolved()
        scope = planned_replays.get(i)
        if scope is None and cfg.replays and rng.random() < 0.02:
            scope = rng.choice(["one", "all"])
        if scope is not None and len(resolved_points) >= 2:
            checkpoint = rng.choice(resolved_points[-6:-1])
            targets = list(range(cfg.partitions)) if scope == "all" else [rng.randrange(cfg.partitions)]
            emitter.replay(targets, checkpoint)

    emitter.flush_all()
    emitter.faults = False  # the stream ends with the final resolved broadcast, nothing after it
    resolved()
    return Simulation(
        config=cfg,
        records=emitter.records,
        resolved_points=resolved_points,
        final_resolved_ts=resolved_points[-1],
        ddl_events=ddl_events,
        commit_ts=commit_ts,
        steps=steps,
    )

"""Turn simulated upstream transactions into the Kafka records a TiCDC changefeed would produce.

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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from applier.codec.events import FLAG_HANDLE_KEY
from applier.simulator.encoder import (
    CLAIM_CHECK,
    HANDLE_KEY_ONLY,
    LARGE_MESSAGE_OPTIONS,
    EncoderOptions,
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
from applier.simulator.tables import (
    BULK_TABLE,
    DDL_ADD_COLUMN,
    DDL_CREATE_SCHEMA,
    DDL_CREATE_TABLE,
    LATE_TABLE,
    TableSpec,
    add_column_sql,
    bulk_table,
    late_table,
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
    row_ids: bool | None = None  # "rid" in row keys; None: as the architecture does (classic only)
    start_physical_ms: int | None = None  # first TSO's physical time; derived from the seed if None
    architecture: str = "classic"  # "classic" (TiCDC <= v8.5) | "new" (TiCDC v9): DDL order, rid
    partitioned: bool = False  # add ptbl: PARTITION BY HASH, each physical partition its own span
    late_first_copies: bool = False  # failed produces: spans restart, first copies arrive late
    ddl_lag: bool = False  # the ALTER is written late: other tables' newer rows precede it
    partition_growth: bool = False  # half the partitions used at first, then all (keys re-hashed)
    huge_transaction: int = 0  # rows of the two bulk transactions (a third and two thirds in), 0: none
    # TiCDC's large-message-handle-option for row events over max_message_bytes: None (the
    # changefeed fails, so does the simulation), "claim-check" or "handle-key-only".
    large_message: str | None = None
    claim_check_uri: str = "file:///var/lib/ticdc/claim-check"  # claim-check-storage-uri, for "ccl"
    wide_rows: bool = False  # add the table "wide": rows of 300 KB to a few MB, about 1 txn in 10
    # TiCDC's topic dispatcher (docs/open-protocol.md §5.10): each table's rows and DDLs in a topic of
    # its own, ``partitions`` partitions each; schema DDLs to the default topic; resolved events
    # to the default topic and the topics of the active tables (a row since the last broadcast,
    # ``_Emitter.ACTIVE_BROADCASTS``), so a table that does not change gets none: quiet topics.
    topic_dispatcher: bool = False

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
        if self.partition_growth and self.partitions < 2:
            raise ValueError("partition_growth needs at least 2 partitions")
        if self.partition_growth and self.topic_dispatcher:
            raise ValueError("partition_growth is simulated for one topic only")
        if self.max_message_bytes < 1:
            raise ValueError("max_message_bytes must be at least 1")
        if self.large_message is not None:
            if self.large_message not in LARGE_MESSAGE_OPTIONS:
                raise ValueError(
                    f"large_message must be None or one of {LARGE_MESSAGE_OPTIONS}, "
                    f"not {self.large_message!r}"
                )
            if self.legacy_strings:
                raise ValueError("large_message is impossible with legacy_strings: TiCDC < 4.0.5 had none")
            if self.large_message == CLAIM_CHECK and not self.claim_check_uri:
                raise ValueError("large_message 'claim-check' needs a claim_check_uri")
        # EncoderOptions checks the compression name, the architecture, and rid against it.
        EncoderOptions(
            compression=self.compression, row_ids=bool(self.row_ids), architecture=self.architecture
        )

    @property
    def sends_old_value(self) -> bool:
        """Whether updates carry "p" and deletes carry full rows (legacy producers never did)."""
        return self.old_value and not self.legacy_strings

    @property
    def include_keyless(self) -> bool:
        """TiCDC replicates keyless tables only with old values and full delete images."""
        return self.sends_old_value and not self.delete_only_handle_key

    @property
    def sends_row_ids(self) -> bool:
        """Whether row keys carry "rid": as asked, else only the classic architecture sends it."""
        return self.architecture == "classic" if self.row_ids is None else self.row_ids

    def holds_back(self, spec: TableSpec) -> bool:
        """Whether the table's spans buffer rows and flush them on their own schedule.

        Every span does in TiCDC, but only two cases change what a consumer sees: the physical
        partitions of a partitioned table (its rows interleave out of ts order), and every table
        in the new architecture (whose DDLs wait only for the tables they block). Other tables
        hand each transaction's rows to the sink at once, which keeps them in ts order.
        """
        return self.architecture == "new" or spec.partitioned

    @property
    def span_replays(self) -> bool:
        """Replays also re-create single spans from their own checkpoints (with the producer
        orders that make spans independent)."""
        return self.replays and (self.architecture == "new" or self.partitioned or self.late_first_copies)

    @property
    def encoder_options(self) -> EncoderOptions:
        return EncoderOptions(
            legacy_strings=self.legacy_strings,
            compression=self.compression,
            row_ids=self.sends_row_ids,
            architecture=self.architecture,
        )


PRODUCER_MODES: dict[str, dict[str, Any]] = {
    # The classic stream with rid and without restarts: the baseline order.
    "classic": {"architecture": "classic", "row_ids": True, "replays": False},
    # Physical partitions of ptbl flushed independently: one table out of ts order on a partition.
    "classic-partitioned": {"architecture": "classic", "partitioned": True, "replays": False},
    # Failed produces and span restarts: late first copies after newer rows of their table.
    "classic-late-copies": {"architecture": "classic", "late_first_copies": True, "replays": False},
    # The ALTER is written after newer rows of the tables it does not block.
    "classic-ddl-lag": {"architecture": "classic", "ddl_lag": True, "replays": False},
    # DDLs wait only for the tables they block; a later CREATE TABLE overtakes the ALTER.
    "new-ddl-order": {"architecture": "new", "replays": False},
    "new-ddl-lag": {"architecture": "new", "ddl_lag": True, "replays": False},
    "new-partitioned": {"architecture": "new", "partitioned": True, "replays": False},
    # Half the partitions at first, then all: keys re-hashed, empty partitions start receiving.
    "classic-partition-growth": {"architecture": "classic", "partition_growth": True, "replays": False},
    "new-partition-growth": {"architecture": "new", "partition_growth": True, "replays": False},
    # Everything a producer of each architecture may do, replays and duplicates included.
    "all-classic": {
        "architecture": "classic",
        "partitioned": True,
        "late_first_copies": True,
        "ddl_lag": True,
        "replays": True,
    },
    "all-new": {
        "architecture": "new",
        "partitioned": True,
        "late_first_copies": True,
        "ddl_lag": True,
        "replays": True,
    },
}
"""Named :class:`StreamConfig` keyword sets, one per producer order (``StreamConfig(**mode)``)."""


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
    partition_id: int | None = None  # "ptn": physical partition of a partitioned table's row

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
    # Re-sent after a simulated restart: copies of earlier events, except that a span restarting
    # after a failed produce also sends the first copy of the rows that were lost.
    replay: bool = False
    duplicate: bool = False  # a byte-identical second copy of an earlier record
    # None when every event travels whole; else one entry per event: None for a whole one, how a
    # large one was sent otherwise.
    large: list[LargeMessage | None] | None = None


@dataclass(frozen=True, slots=True)
class LargeMessage:
    """How a row event too large for max_message_bytes travels in its record.

    ``option`` is "claim-check" (a reference: the full event is the object ``object_name`` of
    :attr:`Simulation.claim_check_objects`, the key's ``ccl`` is ``location``) or
    "handle-key-only" (the key has ``ohk`` true). Either way the value holds only the handle-key
    columns; the record's :class:`SimEvent` is still the full event, what a consumer gets back
    by reading the object (or, for handle-key-only, the upstream as of the commit ts).
    """

    option: str
    location: str | None = None
    object_name: str | None = None


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
    # Claim-check objects in the order they were written: name (a UUID plus ".json") -> content.
    # More than the references: a re-sent event is stored again, a lost record's stays behind.
    claim_check_objects: dict[str, bytes] = field(repr=False, default_factory=dict)
    # With the topic dispatcher: the table of each topic after the default one ("" is the default
    # topic); a record's ``partition`` is then a slot over all topics (``topic_of``).
    table_topics: list[str] = field(default_factory=list)

    @property
    def schema(self) -> str:
        return self.config.schema

    @property
    def slot_count(self) -> int:
        """Partitions of all topics: ``config.partitions`` per topic."""
        return self.config.partitions * (1 + len(self.table_topics))

    def topic_of(self, slot: int, default_topic: str) -> tuple[str, int]:
        """The Kafka topic and partition of a record's ``partition`` when produced with
        ``default_topic`` as the sink URI's topic; table topics are ``{default}_{schema}_{table}``."""
        index, partition = divmod(slot, self.config.partitions)
        if index == 0:
            return default_topic, partition
        return f"{default_topic}_{self.schema}_{self.table_topics[index - 1]}", partition

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

    @property
    def exact_keyless(self) -> bool:
        """Whether a consumer can rebuild keyless tables exactly.

        Without ``rid`` a re-sent keyless row cannot be told from a second identical row, so
        when rows are sent more than once (replays, duplicates, late first copies) a consumer
        may keep extra copies, or delete a second identical row for a re-sent delete: compare
        with ``compare_downstream(..., keyless_rows=False)``.
        """
        cfg = self.config
        return cfg.sends_row_ids or not (cfg.replays or cfg.late_first_copies)

    def first_copies(self) -> dict[int, list[SimEvent]]:
        """Per partition, the first delivery of every event, in the order the partition gets them.

        Duplicated records hold none. Replayed records hold no first DDL or resolved event, but
        a span restarting after a failed produce delivers the lost rows first there.
        """
        out: dict[int, list[SimEvent]] = {p: [] for p in range(self.slot_count)}
        for rec, ev in self._first_deliveries():
            out[rec.partition].append(ev)
        return out

    def _first_deliveries(self) -> Iterator[tuple[SimRecord, SimEvent]]:
        seen: set[tuple[int, int]] = set()
        for rec in self.records:
            if rec.duplicate:
                continue
            for ev in rec.events:
                if rec.replay and ev.kind != "row":
                    continue
                mark = (rec.partition, id(ev))
                if mark not in seen:
                    seen.add(mark)
                    yield rec, ev

    def records_by_partition(self) -> dict[int, list[SimRecord]]:
        """Records of each partition, in the order the partition receives them."""
        out: dict[int, list[SimRecord]] = {p: [] for p in range(self.slot_count)}
        for rec in self.records:
            out[rec.partition].append(rec)
        return out

    def summary(self) -> dict[str, Any]:
        """Counts a user (or the CLI) wants to see after producing the stream."""
        kinds: Counter[str] = Counter()
        large: Counter[str] = Counter()
        for rec in self.records:
            for ev in rec.events:
                kinds[ev.row_kind if ev.kind == "row" else ev.kind] += 1  # type: ignore[index]
            for form in rec.large or ():
                if form is not None:
                    large[form.option] += 1
        final = self.expected_snapshot(self.final_resolved_ts)
        return {
            "schema": self.schema,
            "architecture": self.config.architecture,
            "partitions": self.config.partitions,
            "dispatcher": self.config.dispatcher,
            "records": len(self.records),
            "replayed_records": sum(r.replay for r in self.records),
            "duplicate_records": sum(r.duplicate for r in self.records),
            "late_first_copies": sum(rec.replay for rec, _ in self._first_deliveries()),
            "transactions": len(self.commit_ts),
            "events": dict(sorted(kinds.items())),
            "claim_check_references": large[CLAIM_CHECK],
            "handle_key_only_events": large[HANDLE_KEY_ONLY],
            "claim_check_objects": len(self.claim_check_objects),
            "claim_check_bytes": sum(len(data) for data in self.claim_check_objects.values()),
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
    large = []
    if s["claim_check_references"] or s["claim_check_objects"]:
        large.append(
            f"large events (all copies): {s['claim_check_references']} claim-check references, "
            f"{s['claim_check_objects']} objects ({s['claim_check_bytes']} bytes)"
        )
    if s["handle_key_only_events"]:
        large.append(f"large events (all copies): {s['handle_key_only_events']} handle-key-only")
    return "\n".join(
        [
            f"schema {s['schema']!r}: {s['transactions']} transactions, {len(s['ddl'])} DDL statements",
            f"{s['records']} records over {s['partitions']} partitions (dispatcher {s['dispatcher']}, "
            f"{s['architecture']} architecture), {s['replayed_records']} replayed, "
            f"{s['duplicate_records']} duplicated, {s['late_first_copies']} late first copies",
            f"events (all copies): {events}",
            *large,
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
_SPAN_REPLAY_CHANCE = 0.03  # per transaction, with span_replays: one span is re-created


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


class _Emitter:
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
    upstream = Upstream(
        rng, include_keyless=cfg.include_keyless, partitioned=cfg.partitioned, wide=cfg.wide_rows
    )
    table_topics = None
    if cfg.topic_dispatcher:
        table_topics = sorted({*upstream.specs, LATE_TABLE, BULK_TABLE})
    emitter = _Emitter(cfg, rng, table_topics)
    steps: list[_Step] = []
    ddl_events: list[SimEvent] = []
    resolved_points: list[int] = []
    commit_ts: list[int] = []
    new_architecture = cfg.architecture == "new"

    def ddl(table: str, query: str, ddl_type: int) -> SimEvent:
        """A DDL finished upstream now (its ts); the caller decides when it is written."""
        ev = SimEvent("ddl", clock.next(), cfg.schema, table, ddl_query=query, ddl_type=ddl_type)
        ddl_events.append(ev)
        return ev

    def write_ddl(ev: SimEvent, blocked: set[str]) -> None:
        # Classic: the owner writes a DDL once every table reached it. New: the DDL waits only
        # for the dispatchers of the tables it blocks (none for CREATE DATABASE / TABLE).
        emitter.broadcast(ev, blocked if new_architecture else None)

    lagging: list[tuple[SimEvent, set[str]]] = []  # finished DDLs not written yet

    def write_lagging() -> None:
        while lagging:
            ev, blocked = lagging.pop()
            write_ddl(ev, blocked)
            emitter.unpark(blocked)

    def resolved() -> None:
        # The checkpoint, and so the resolved ts, cannot pass a DDL that is not written yet.
        write_lagging()
        ts = clock.next()
        resolved_points.append(ts)
        emitter.resolved(ts)

    write_ddl(ddl("", f"CREATE DATABASE {quote_ident(cfg.schema)}", DDL_CREATE_SCHEMA), set())
    if cfg.huge_transaction:
        upstream.add_table(bulk_table())
    for spec in upstream.specs.values():
        ev = ddl(spec.name, spec.create_table_sql(), DDL_CREATE_TABLE)
        steps.append(_Step(ev.commit_ts, "create", spec.name, spec))
        write_ddl(ev, set())
    resolved()

    n = cfg.transactions
    alter_at = n // 2 if cfg.ddl_mid_stream else -1
    if new_architecture and cfg.resolved_every > 1 and alter_at % cfg.resolved_every == 0:
        # Between two resolved broadcasts, where spans still hold rows older than the DDLs.
        alter_at += 1
    planned_replays = {n // 3: "one", (2 * n) // 3: "all"} if cfg.replays and n >= 6 else {}
    grow_at = n // 3 if cfg.partition_growth else -1
    huge_at = {n // 3 + 1, (2 * n) // 3 + 1} if cfg.huge_transaction else set()
    for i in range(n):
        if i == grow_at:
            # The producer's periodic metadata refresh sees the larger partition count: from now
            # on rows are hashed over all partitions and broadcasts reach them all.
            emitter.used = cfg.partitions
        if i == alter_at:
            added = upstream.add_column()
            spec = upstream.specs[added.table]
            alter = ddl(added.table, add_column_sql(added.table, added.column), DDL_ADD_COLUMN)
            steps.append(_Step(alter.commit_ts, "add_column", added.table, spec))
            if new_architecture:
                # A table created after the ALTER finished: the table trigger dispatcher writes
                # its CREATE TABLE at once, while the ALTER waits for its table's dispatcher,
                # so the partitions get the two DDLs out of commit-ts order.
                late = upstream.add_table(late_table())
                create = ddl(late.name, late.create_table_sql(), DDL_CREATE_TABLE)
                steps.append(_Step(create.commit_ts, "create", late.name, late))
                write_ddl(create, set())
            if cfg.ddl_lag:
                # An ALTER TABLE blocks only its own table (classic: a non-global DDL gets a
                # table barrier; new: only that table's dispatcher waits). The other tables go
                # on past its ts, so their newer rows reach the partitions before it is written,
                # at the latest just before the next resolved broadcast.
                emitter.park({added.table})
                lagging.append((alter, {added.table}))
            else:
                write_ddl(alter, {added.table})
        if i in huge_at:
            changes = upstream.bulk_transaction(cfg.huge_transaction)
        else:
            changes = upstream.random_transaction()
        if changes:
            ts = clock.next()
            commit_ts.append(ts)
            steps.append(_Step(ts, "txn", changes=changes))
            for change in changes:
                spec = upstream.specs[change.table]
                ev = row_event(cfg, spec, change)
                ev.commit_ts = ts
                partition = emitter.row_slot(spec, ev)
                emitter.add_row(partition, ev, hold_back=cfg.holds_back(spec))
        emitter.random_flushes()
        if (i + 1) % cfg.resolved_every == 0:
            resolved()
        scope = planned_replays.get(i)
        if scope is None and cfg.replays and rng.random() < 0.02:
            scope = rng.choice(["one", "all"])
        if scope is not None and len(resolved_points) >= 2:
            checkpoint = rng.choice(resolved_points[-6:-1])
            used = [p for p in range(emitter.used) if emitter.sent[p] or not cfg.topic_dispatcher]
            targets = used if scope == "all" else [rng.choice(used)]
            emitter.replay(targets, checkpoint)
        if cfg.span_replays and rng.random() < _SPAN_REPLAY_CHANCE:
            spans = emitter.spans_with_rows()
            if spans:
                emitter.replay_span(rng.choice(spans), rng.choice(resolved_points[-3:]))

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
        claim_check_objects=emitter.objects,
        table_topics=emitter.table_topics,
    )

"""What the simulator produces: its settings (:class:`StreamConfig`, :data:`PRODUCER_MODES`), the
events and records of the stream, and the :class:`Simulation`, which keeps the records in
production order and can tell what the upstream looked like at any ts (what a downstream must
converge to). How the records are made: :mod:`applier.simulator.emitter`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from applier.simulator.encoder import (
    CLAIM_CHECK,
    HANDLE_KEY_ONLY,
    LARGE_MESSAGE_OPTIONS,
    EncoderOptions,
)
from applier.simulator.tables import (
    TableSpec,
)
from applier.simulator.workload import DELETE, INSERT, UPDATE, Row, RowChange

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
    index_ddls: bool = True  # CREATE INDEX a quarter in, DROP INDEX three quarters in (one keyed table)
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
class Step:
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
    steps: list[Step] = field(repr=False, default_factory=list)
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

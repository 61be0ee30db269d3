"""The simulation's driver: a random upstream workload in commit order, with its DDLs, resolved
broadcasts and restarts, handed to the emitter (:mod:`applier.simulator.emitter`)."""

from __future__ import annotations

import random

from applier.simulator.emitter import SPAN_REPLAY_CHANCE, Emitter, row_event
from applier.simulator.model import SimEvent, Simulation, Step, StreamConfig
from applier.simulator.tables import (
    BULK_TABLE,
    DDL_ADD_COLUMN,
    DDL_ADD_INDEX,
    DDL_CREATE_SCHEMA,
    DDL_CREATE_TABLE,
    DDL_DROP_INDEX,
    LATE_TABLE,
    add_column_sql,
    bulk_table,
    late_table,
    quote_ident,
)
from applier.simulator.workload import Upstream


class TsoClock:
    """TiDB-style timestamps: ``physical_ms << 18 | logical``, strictly increasing."""

    def __init__(self, rng: random.Random, start_physical_ms: int) -> None:
        self.rng = rng
        self.physical = start_physical_ms

    def next(self) -> int:
        self.physical += self.rng.randint(1, 40)
        return self.physical << 18 | self.rng.randint(0, 63)


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
    emitter = Emitter(cfg, rng, table_topics)
    steps: list[Step] = []
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
        steps.append(Step(ev.commit_ts, "create", spec.name, spec))
        write_ddl(ev, set())
    resolved()

    n = cfg.transactions
    alter_at = n // 2 if cfg.ddl_mid_stream else -1
    if new_architecture and cfg.resolved_every > 1 and alter_at % cfg.resolved_every == 0:
        # Between two resolved broadcasts, where spans still hold rows older than the DDLs.
        alter_at += 1
    planned_replays = {n // 3: "one", (2 * n) // 3: "all"} if cfg.replays and n >= 6 else {}
    grow_at = n // 3 if cfg.partition_growth else -1
    # An index DDL changes no row: it only has to reach the downstream once, in its place, while the
    # rows around it go on (the applier builds it beside the stream).
    index_at = {n // 4: DDL_ADD_INDEX, (3 * n) // 4: DDL_DROP_INDEX} if cfg.index_ddls and n >= 8 else {}
    indexed = min((s for s in upstream.specs.values() if s.handle_key), key=lambda s: s.name, default=None)
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
            steps.append(Step(alter.commit_ts, "add_column", added.table, spec))
            if new_architecture:
                # A table created after the ALTER finished: the table trigger dispatcher writes
                # its CREATE TABLE at once, while the ALTER waits for its table's dispatcher,
                # so the partitions get the two DDLs out of commit-ts order.
                late = upstream.add_table(late_table())
                create = ddl(late.name, late.create_table_sql(), DDL_CREATE_TABLE)
                steps.append(Step(create.commit_ts, "create", late.name, late))
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
        if i in index_at and indexed is not None:
            q, column = quote_ident(indexed.name), quote_ident(indexed.handle_key[0])
            query = (
                f"CREATE INDEX `ix_sim` ON {q} ({column})"
                if index_at[i] == DDL_ADD_INDEX
                else f"DROP INDEX `ix_sim` ON {q}"
            )
            write_ddl(ddl(indexed.name, query, index_at[i]), {indexed.name})
        if i in huge_at:
            changes = upstream.bulk_transaction(cfg.huge_transaction)
        else:
            changes = upstream.random_transaction()
        if changes:
            ts = clock.next()
            commit_ts.append(ts)
            steps.append(Step(ts, "txn", changes=changes))
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
        if cfg.span_replays and rng.random() < SPAN_REPLAY_CHANCE:
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

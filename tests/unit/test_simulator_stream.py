"""Shape of the simulated TiCDC stream: batching, broadcasts, ordering, splits, replays, snapshots.

Each property below is a producer guarantee from docs/open-protocol.md §5 (or a fault the
producer is allowed to commit); the snapshot test replays the produced events with a tiny applier
written here and compares the result with ``expected_snapshot`` at every resolved ts.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest

from applier.codec import events as flags
from applier.simulator import (
    PRODUCER_MODES,
    SimEvent,
    SimRecord,
    Simulation,
    StreamConfig,
    simulate,
)
from applier.simulator.tables import workload_tables


@pytest.fixture(scope="module")
def sim() -> Simulation:
    return simulate(StreamConfig(seed=21, transactions=200, partitions=4))


def first_copies(sim: Simulation) -> dict[int, list[SimEvent]]:
    """Per partition, the events of original (not replayed, not duplicated) records, in order."""
    out: dict[int, list[SimEvent]] = {p: [] for p in range(sim.config.partitions)}
    for rec in sim.records:
        if not rec.replay and not rec.duplicate:
            out[rec.partition].extend(rec.events)
    assert out == sim.first_copies()  # without failed produces, no replayed record holds one
    return out


def handle_values(sim: Simulation, ev: SimEvent) -> tuple:
    spec = sim.table_spec(ev.table, ev.commit_ts)
    assert spec is not None
    image = ev.new if ev.new is not None else ev.old
    assert image is not None
    return tuple(image[c][2] for c in spec.handle_key)


def test_batches_respect_max_batch_size(sim: Simulation) -> None:
    sizes = Counter()
    for rec in sim.records:
        kinds = {ev.kind for ev in rec.events}
        if kinds != {"row"}:
            assert len(rec.events) == 1  # DDL and resolved events travel alone
        assert 1 <= len(rec.events) <= 16
        assert len(rec.key) + len(rec.value) <= sim.config.max_message_bytes
        sizes[len(rec.events)] += 1
    assert len(sizes) > 5  # batches of many sizes: TiCDC also flushes on a timer


@pytest.mark.parametrize("cap", [16, 3])
def test_batches_fill_up_to_max_batch_size(cap: int) -> None:
    one = simulate(StreamConfig(seed=3, transactions=100, partitions=1, max_batch_size=cap))
    assert max(len(r.events) for r in one.records) == cap


def test_every_partition_gets_every_ddl_and_resolved_ts(sim: Simulation) -> None:
    markers = {
        p: [(ev.kind, ev.commit_ts) for ev in evs if ev.kind != "row"] for p, evs in first_copies(sim).items()
    }
    expected = sorted(
        [("ddl", ev.commit_ts) for ev in sim.ddl_events] + [("resolved", r) for r in sim.resolved_points],
        key=lambda m: m[1],
    )
    assert all(m == expected for m in markers.values())
    assert [ev.ddl_type for ev in sim.ddl_events] == [1, 3, 3, 3, 3, 7, 5, 8]


def test_first_copies_arrive_in_commit_order_per_table(sim: Simulation) -> None:
    for events in first_copies(sim).values():
        last: dict[str, int] = {}
        for ev in events:
            if ev.kind == "row":
                assert ev.commit_ts >= last.get(ev.table, 0)
                last[ev.table] = ev.commit_ts


def test_ddl_and_resolved_follow_every_earlier_row_of_their_partition(sim: Simulation) -> None:
    for events in first_copies(sim).values():
        for i, marker in enumerate(events):
            if marker.kind == "row":
                continue
            before = [ev.commit_ts for ev in events[:i] if ev.kind == "row"]
            after = [ev.commit_ts for ev in events[i + 1 :] if ev.kind == "row"]
            if marker.kind == "ddl":
                assert all(ts < marker.commit_ts for ts in before) and all(
                    ts > marker.commit_ts for ts in after
                )
            else:
                assert all(ts > marker.commit_ts for ts in after)


def test_stream_ends_with_a_final_resolved_ts_everywhere(sim: Simulation) -> None:
    for records in sim.records_by_partition().values():
        last = records[-1]
        assert [ev.kind for ev in last.events] == ["resolved"] and not last.replay and not last.duplicate
        assert last.events[0].commit_ts == sim.final_resolved_ts
    assert sim.final_resolved_ts > max(sim.commit_ts) and sim.final_resolved_ts > sim.ddl_events[-1].commit_ts


def test_index_value_dispatch_keeps_each_row_in_one_partition(sim: Simulation) -> None:
    where: dict[tuple, set[int]] = defaultdict(set)
    split_across = 0
    by_ts_rowid: dict[tuple, set[int]] = defaultdict(set)
    for rec in sim.records:
        for ev in rec.events:
            if ev.kind != "row":
                continue
            spec = sim.table_spec(ev.table, ev.commit_ts)
            assert spec is not None
            if spec.handle_key:
                where[(ev.table, handle_values(sim, ev))].add(rec.partition)
            else:
                where[(ev.table,)].add(rec.partition)  # keyless tables are dispatched by table
            if ev.table == "uniq_only":
                by_ts_rowid[(ev.commit_ts, ev.row_id)].add(rec.partition)
    assert all(len(parts) == 1 for parts in where.values())
    split_across = sum(len(parts) > 1 for parts in by_ts_rowid.values())
    assert split_across > 0  # a handle change: its DELETE and INSERT on different partitions
    assert len({p for parts in where.values() for p in parts}) == sim.config.partitions


def test_table_dispatcher_keeps_each_table_in_one_partition() -> None:
    sim = simulate(StreamConfig(seed=4, transactions=80, dispatcher="table", partitions=8))
    where: dict[str, set[int]] = defaultdict(set)
    for rec in sim.records:
        for ev in rec.events:
            if ev.kind == "row":
                where[ev.table].add(rec.partition)
    assert set(where) == {"all_types", "composite", "uniq_only", "keyless"}
    assert all(len(p) == 1 for p in where.values())


def test_key_changes_are_split_into_delete_and_insert(sim: Simulation) -> None:
    events = [ev for evs in first_copies(sim).values() for ev in evs if ev.kind == "row"]
    for ev in events:
        if ev.row_kind == "update":
            spec = sim.table_spec(ev.table, ev.commit_ts)
            assert spec is not None and ev.old is not None and ev.new is not None
            for col in spec.split_key_columns:
                assert ev.old[col][2] == ev.new[col][2], f"update of {ev.table} changes key column {col}"
    by_ts = defaultdict(list)
    for ev in events:
        by_ts[(ev.commit_ts, ev.table)].append(ev)
    # composite: same primary key, new NOT NULL unique value -> DELETE + INSERT at one commit ts.
    composite_splits = 0
    uniq_swaps = 0
    for (_, table), evs in by_ts.items():
        deletes = {handle_values(sim, e): e for e in evs if e.row_kind == "delete"}
        inserts = {handle_values(sim, e): e for e in evs if e.row_kind == "insert"}
        if table == "composite":
            for key in deletes.keys() & inserts.keys():
                composite_splits += deletes[key].old["u"][2] != inserts[key].new["u"][2]  # type: ignore[index]
        if table == "uniq_only":
            # u values swapped between two rows: each row's old u is another row's new u
            rowids_del = {e.row_id: e.old["u"][2] for e in evs if e.row_kind == "delete"}  # type: ignore[index]
            rowids_ins = {e.row_id: e.new["u"][2] for e in evs if e.row_kind == "insert"}  # type: ignore[index]
            moved = [
                r
                for r in rowids_del.keys() & rowids_ins.keys()
                if rowids_del[r] in rowids_ins.values() and rowids_ins[r] != rowids_del[r]
            ]
            uniq_swaps += len(moved) >= 2
    assert composite_splits > 0 and uniq_swaps > 0


def test_one_event_per_row_per_transaction(sim: Simulation) -> None:
    seen: Counter[tuple] = Counter()
    for evs in first_copies(sim).values():
        for ev in evs:
            if ev.kind == "row":
                ident = ev.row_id if ev.row_id is not None else handle_values(sim, ev)
                seen[(ev.commit_ts, ev.table, ident, ev.row_kind)] += 1
    assert max(seen.values()) == 1


def test_replays_resend_everything_after_a_checkpoint(sim: Simulation) -> None:
    replayed_partitions = set()
    runs = 0
    older_resolved_seen = False
    for p, records in sim.records_by_partition().items():
        sent: list[SimEvent] = []
        max_resolved = 0
        i = 0
        while i < len(records):
            rec = records[i]
            for ev in rec.events:
                if ev.kind == "resolved":
                    older_resolved_seen |= ev.commit_ts < max_resolved
                    max_resolved = max(max_resolved, ev.commit_ts)
            if rec.duplicate:
                assert any(other.key == rec.key and other.value == rec.value for other in records[:i])
                i += 1
                continue
            if not rec.replay:
                sent.extend(rec.events)
                i += 1
                continue
            # A replay run: the checkpoint's resolved ts, then every earlier event after it, in order.
            replayed_partitions.add(p)
            runs += 1
            (checkpoint,) = rec.events
            assert checkpoint.kind == "resolved" and checkpoint.commit_ts in sim.resolved_points
            resent: list[SimEvent] = []
            i += 1
            while (
                i < len(records)
                and (records[i].replay or records[i].duplicate)
                and not _starts_run(records[i], sent)
            ):
                if not records[i].duplicate:
                    resent.extend(records[i].events)
                i += 1
            expected = [ev for ev in sent if ev.commit_ts > checkpoint.commit_ts]
            assert [id(e) for e in resent] == [id(e) for e in expected]
    assert runs >= 2 and len(replayed_partitions) == sim.config.partitions  # an all-partition replay
    assert older_resolved_seen
    assert any(r.duplicate for r in sim.records)


def _starts_run(rec: SimRecord, sent: list[SimEvent]) -> bool:
    """A replay run starts with a new resolved event (the checkpoint), not a re-sent one."""
    first = rec.events[0]
    return not rec.duplicate and first.kind == "resolved" and not any(first is ev for ev in sent)


def test_no_faults_without_replays() -> None:
    clean = simulate(StreamConfig(seed=21, transactions=100, replays=False))
    assert not any(r.replay or r.duplicate for r in clean.records)


def _apply(state: dict[str, list[dict[str, Any]]], sim: Simulation, ev: SimEvent) -> None:
    """Apply one event the way a correct consumer would (old images completed from new ones)."""
    spec = sim.table_spec(ev.table, ev.commit_ts)
    assert spec is not None
    rows = state[ev.table]
    new = {k: v[2] for k, v in ev.new.items()} if ev.new else None
    old = {k: v[2] for k, v in ev.old.items()} if ev.old else None
    if old is not None and new is not None:
        old = {**new, **old}  # only-updated-columns: unchanged columns are missing from "p"

    def find(image: dict[str, Any]) -> int:
        names = spec.handle_key or tuple(image)
        matches = [i for i, r in enumerate(rows) if all(r[n] == image[n] for n in names)]
        assert matches, f"{ev.table}: no row matches {image}"
        if len(names) == len(spec.columns):
            assert rows[matches[0]] == image
        return matches[0]

    if ev.row_kind == "delete":
        assert old is not None
        rows.pop(find(old))
    elif ev.row_kind == "update" and old is not None:
        rows[find(old)] = new  # type: ignore[assignment]
    else:
        assert new is not None
        if spec.handle_key:
            existing = [i for i, r in enumerate(rows) if all(r[n] == new[n] for n in spec.handle_key)]
            for i in reversed(existing):
                rows.pop(i)
        rows.append(new)


@pytest.mark.parametrize(
    "cfg",
    [
        StreamConfig(seed=31, transactions=150),
        StreamConfig(seed=32, transactions=120, only_updated_columns=True, dispatcher="table"),
        StreamConfig(seed=33, transactions=120, delete_only_handle_key=True, partitions=2),
        StreamConfig(seed=34, transactions=150, **PRODUCER_MODES["all-classic"]),
        StreamConfig(seed=35, transactions=150, dispatcher="table", **PRODUCER_MODES["all-new"]),
    ],
    ids=["default", "only-updated", "delete-handle-only", "all-classic", "all-new"],
)
def test_expected_snapshot_equals_the_applied_first_copies(cfg: StreamConfig) -> None:
    sim = simulate(cfg)
    events = sorted(
        (ev for evs in sim.first_copies().values() for ev in evs if ev.kind != "resolved"),
        key=lambda ev: (ev.commit_ts, ev.kind != "ddl", ev.row_kind != "delete"),
    )
    state: dict[str, list[dict[str, Any]]] = {}
    applied_ddl: set[int] = set()
    checkpoints = iter([*sim.resolved_points])
    next_check = next(checkpoints)

    def check(ts: int) -> None:
        expected = sim.expected_snapshot(ts)
        assert set(expected) == {(sim.schema, t) for t in state}
        for (_, table), rows in expected.items():
            assert Counter(map(_freeze, rows)) == Counter(map(_freeze, state[table])), f"{table} at {ts}"

    for ev in events:
        while next_check is not None and ev.commit_ts > next_check:
            check(next_check)
            next_check = next(checkpoints, None)
        if ev.kind == "ddl":
            if ev.commit_ts in applied_ddl:
                continue
            applied_ddl.add(ev.commit_ts)
            if ev.ddl_type == 3:
                state[ev.table] = []
            elif ev.ddl_type == 5:
                spec = sim.table_spec(ev.table, ev.commit_ts)
                assert spec is not None
                col = spec.columns[-1]
                state[ev.table] = [{**r, col.name: col.default} for r in state[ev.table]]
            continue
        _apply(state, sim, ev)
    while next_check is not None:
        check(next_check)
        next_check = next(checkpoints, None)


def _freeze(row: dict[str, Any]) -> tuple:
    return tuple(sorted(row.items()))


def test_snapshot_semantics(sim: Simulation) -> None:
    create_ts = [ev.commit_ts for ev in sim.ddl_events if ev.ddl_type == 3]
    alter_ts = next(ev.commit_ts for ev in sim.ddl_events if ev.ddl_type == 5)
    assert sim.expected_snapshot(create_ts[0] - 1) == {}
    assert sim.expected_snapshot(create_ts[1]) == {
        (sim.schema, "all_types"): [],
        (sim.schema, "composite"): [],
    }
    before = sim.expected_snapshot(alter_ts - 1)[(sim.schema, "composite")]
    at = sim.expected_snapshot(alter_ts)[(sim.schema, "composite")]
    assert before and all("extra" not in r for r in before)
    assert sorted(map(_freeze, (dict(r, extra=7) for r in before))) == sorted(map(_freeze, at))
    final = sim.expected_snapshot(sim.final_resolved_ts)
    assert any(r["extra"] != 7 for r in final[(sim.schema, "composite")])
    for ts in [*sim.resolved_points[::5], sim.final_resolved_ts]:
        snap = sim.expected_snapshot(ts)
        for (_, table), rows in snap.items():
            spec = sim.table_spec(table, ts)
            assert spec is not None
            for idx in spec.unique_indexes:
                keys = [tuple(r[c] for c in idx.columns) for r in rows]
                keys = [k for k in keys if None not in k]
                assert len(keys) == len(set(keys)), f"{table}.{idx.name} not unique at {ts}"
            if table == "all_types":
                assert all(r["c_gen"] == r["id"] * 2 for r in rows)
    assert len(final[(sim.schema, "keyless")]) > len(
        {_freeze(r) for r in final[(sim.schema, "keyless")]}
    ) or any(
        len(s[(sim.schema, "keyless")]) > len({_freeze(r) for r in s[(sim.schema, "keyless")]})
        for s in (sim.expected_snapshot(t) for t in sim.resolved_points)
    )  # identical rows happen in the keyless table


def test_determinism_by_seed() -> None:
    cfg = StreamConfig(seed=41, transactions=60)
    a, b = simulate(cfg), simulate(StreamConfig(seed=41, transactions=60))
    assert [(r.partition, r.key, r.value) for r in a.records] == [
        (r.partition, r.key, r.value) for r in b.records
    ]
    c = simulate(StreamConfig(seed=42, transactions=60))
    assert [r.value for r in a.records] != [r.value for r in c.records]


def test_timestamps_are_realistic_tsos(sim: Simulation) -> None:
    assert sim.commit_ts == sorted(set(sim.commit_ts))
    assert sim.resolved_points == sorted(set(sim.resolved_points))
    all_ts = sorted({ev.commit_ts for r in sim.records for ev in r.events})
    for ts in all_ts:
        physical_ms = ts >> 18
        assert 1_600_000_000_000 < physical_ms < 1_900_000_000_000  # 2020..2030
    explicit = simulate(StreamConfig(seed=1, transactions=5, start_physical_ms=1_750_000_000_000))
    assert explicit.ddl_events[0].commit_ts >> 18 > 1_750_000_000_000


def test_column_flags_follow_ticdc() -> None:
    tables = {t.name: t for t in workload_tables()}
    at = tables["all_types"].flags
    assert at["id"] == flags.FLAG_BINARY | flags.FLAG_PRIMARY_KEY | flags.FLAG_HANDLE_KEY
    assert at["c_gen"] == flags.FLAG_BINARY | flags.FLAG_GENERATED | flags.FLAG_NULLABLE
    assert at["c_bigint_u"] == flags.FLAG_BINARY | flags.FLAG_UNSIGNED | flags.FLAG_NULLABLE
    assert (
        at["c_int"] == flags.FLAG_BINARY | flags.FLAG_MULTIPLE_KEY
    )  # NOT NULL, first column of a 2-column KEY
    assert (
        at["c_varchar"] == flags.FLAG_NULLABLE
        and at["c_varbinary"] == flags.FLAG_BINARY | flags.FLAG_NULLABLE
    )
    assert at["c_text"] == flags.FLAG_NULLABLE and at["c_blob"] == flags.FLAG_BINARY | flags.FLAG_NULLABLE
    comp = tables["composite"].flags
    assert (
        comp["a"]
        == flags.FLAG_BINARY | flags.FLAG_PRIMARY_KEY | flags.FLAG_MULTIPLE_KEY | flags.FLAG_HANDLE_KEY
    )
    assert comp["b"] == flags.FLAG_PRIMARY_KEY | flags.FLAG_MULTIPLE_KEY | flags.FLAG_HANDLE_KEY
    assert comp["u"] == flags.FLAG_BINARY | flags.FLAG_UNIQUE_KEY
    uniq = tables["uniq_only"]
    assert (
        uniq.handle_key == ("u",)
        and uniq.flags["u"] == flags.FLAG_BINARY | flags.FLAG_UNIQUE_KEY | flags.FLAG_HANDLE_KEY
    )
    assert uniq.flags["alt"] == flags.FLAG_UNIQUE_KEY | flags.FLAG_NULLABLE
    assert tables["keyless"].handle_key == () and not any(
        f & flags.FLAG_HANDLE_KEY for f in tables["keyless"].flags.values()
    )


def test_only_updated_columns_trims_old_images() -> None:
    sim = simulate(StreamConfig(seed=51, transactions=80, only_updated_columns=True))
    updates = [ev for r in sim.records for ev in r.events if ev.kind == "row" and ev.row_kind == "update"]
    assert updates
    for ev in updates:
        assert ev.old and ev.new
        assert all(ev.old[c][2] != ev.new[c][2] for c in ev.old)  # only changed columns in "p"
    assert any(len(ev.old) < len(ev.new) for ev in updates)  # type: ignore[arg-type]


def test_delete_only_handle_key_columns() -> None:
    sim = simulate(StreamConfig(seed=52, transactions=80, delete_only_handle_key=True))
    deletes = [ev for r in sim.records for ev in r.events if ev.kind == "row" and ev.row_kind == "delete"]
    assert deletes
    for ev in deletes:
        spec = sim.table_spec(ev.table, ev.commit_ts)
        assert spec is not None and ev.old is not None
        assert tuple(ev.old) == spec.handle_key
    assert "keyless" not in {ev.table for ev in deletes}


def test_no_old_value_sends_updates_without_p() -> None:
    sim = simulate(StreamConfig(seed=53, transactions=60, old_value=False))
    rows = [ev for r in sim.records for ev in r.events if ev.kind == "row"]
    assert any(ev.row_kind == "update" for ev in rows)
    assert all(ev.old is None for ev in rows if ev.row_kind == "update")
    assert all(ev.wire_kind == "insert" for ev in rows if ev.row_kind == "update")


def test_rows_after_the_alter_carry_the_new_column(sim: Simulation) -> None:
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    assert alter.ddl_query == "ALTER TABLE `composite` ADD COLUMN `extra` INT NOT NULL DEFAULT 7"
    for evs in first_copies(sim).values():
        for ev in evs:
            if ev.kind == "row" and ev.table == "composite":
                image = ev.new or ev.old
                assert image is not None
                assert ("extra" in image) == (ev.commit_ts > alter.commit_ts)


def test_message_size_limit() -> None:
    with pytest.raises(ValueError, match="max_message_bytes"):
        simulate(StreamConfig(seed=1, transactions=20, max_message_bytes=2000))
    sim = simulate(StreamConfig(seed=2, transactions=40, max_message_bytes=1 << 20))
    assert all(len(r.key) + len(r.value) <= 1 << 20 for r in sim.records)


@pytest.mark.parametrize(
    "bad",
    [
        {"partitions": 0},
        {"dispatcher": "columns"},
        {"compression": "zstd"},
        {"resolved_every": 0},
        {"schema": ""},
        {"max_batch_size": 0},
    ],
)
def test_invalid_settings_are_rejected(bad: dict) -> None:
    with pytest.raises(ValueError):
        simulate(StreamConfig(**bad))


def test_summary_mentions_the_essentials(sim: Simulation) -> None:
    from applier.simulator import format_summary

    text = format_summary(sim)
    assert f"{len(sim.records)} records over 4 partitions" in text
    assert str(sim.final_resolved_ts) in text
    summary = sim.summary()
    assert summary["transactions"] == len(sim.commit_ts)
    assert sum(summary["events"].values()) == sum(len(r.events) for r in sim.records)

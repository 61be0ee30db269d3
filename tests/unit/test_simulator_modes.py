"""The producer orders of PRODUCER_MODES, checked on the records each mode produces.

Every property is a fact about real TiCDC producers (docs/open-protocol.md §5): what a consumer
may rely on (a resolved ts follows every first copy at or below it; restarts begin with a resolved
ts no higher than the last broadcast one) must hold in every mode, and what a mode exists for
(rows of one table out of ts order, late first copies, DDLs before older rows of other tables and
out of ts order, partial first copies) must really happen.
"""

from __future__ import annotations

import json
import struct
from collections import Counter, defaultdict
from functools import cache

import pytest

from applier.codec.decoder import decode_record
from applier.simulator import PRODUCER_MODES, Simulation, StreamConfig, simulate
from applier.simulator.tables import LATE_TABLE, PARTITION_IDS, PARTITIONED_TABLE
from tests.simulated import assert_decoded_matches

MODES = sorted(PRODUCER_MODES)
PARTITIONED = [m for m in MODES if PRODUCER_MODES[m].get("partitioned")]
LATE = [m for m in MODES if PRODUCER_MODES[m].get("late_first_copies")]
NEW = [m for m in MODES if PRODUCER_MODES[m]["architecture"] == "new"]
CLASSIC = [m for m in MODES if PRODUCER_MODES[m]["architecture"] == "classic"]
WITH_REPLAYS = [m for m in MODES if PRODUCER_MODES[m].get("replays")]
DDL_LAG = [m for m in MODES if PRODUCER_MODES[m].get("ddl_lag")]


@cache
def mode_sim(mode: str, seed: int = 7) -> Simulation:
    return simulate(StreamConfig(seed=seed, transactions=200, **PRODUCER_MODES[mode]))


def key_documents(key: bytes) -> list[dict]:
    """The key JSON documents of a record, in order (framing of docs/open-protocol.md §1.1)."""
    docs, at = [], 8
    while at < len(key):
        (length,) = struct.unpack_from(">Q", key, at)
        docs.append(json.loads(key[at + 8 : at + 8 + length], object_pairs_hook=dict))
        at += 8 + length
    return docs


def broadcasts(sim: Simulation, every: list, got: list) -> list:
    """What a partition must have received of ``every`` broadcast: all of them, or with
    ``partition_growth`` (a partition the producer picked up late) the newest ones, at least one."""
    if not sim.config.partition_growth or len(got) == len(every):
        return every
    assert got, "a partition the producer picked up never got a broadcast"
    return every[len(every) - len(got) :]


def last_broadcasts(sim: Simulation, partition: int):
    """(record, resolved ts of the newest first broadcast before it) for a partition's records."""
    resolved = 0
    for rec in sim.records_by_partition()[partition]:
        yield rec, resolved
        if not rec.replay and not rec.duplicate and rec.events[0].kind == "resolved":
            resolved = max(resolved, rec.events[0].commit_ts)


@pytest.mark.parametrize("mode", MODES)
def test_every_first_copy_precedes_the_first_resolved_ts_at_or_above_it(mode: str) -> None:
    sim = mode_sim(mode)
    for events in sim.first_copies().values():
        resolved = [ev.commit_ts for ev in events if ev.kind == "resolved"]
        # every broadcast once, in order, on every partition (from the moment the producer uses it)
        assert resolved == broadcasts(sim, sim.resolved_points, resolved)
        newest = 0
        for ev in events:
            if ev.kind == "resolved":
                newest = ev.commit_ts
            else:
                assert ev.commit_ts > newest, (
                    f"{ev.kind} {ev.table} at {ev.commit_ts} after resolved {newest}"
                )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [7, 11, 77])
def test_no_first_copy_reaches_any_partition_after_a_resolved_ts_above_it_reached_one(
    mode: str, seed: int
) -> None:
    """Across partitions, in the order records are produced: TiCDC writes a resolved ts only once
    every row at or below it was acknowledged on every partition. A partition the producer picks
    up late (partition_growth) therefore starts with rows above every resolved ts already written
    elsewhere: what lets a consumer leave it out while it is empty (docs/open-protocol.md §5.7)."""
    sim = mode_sim(mode, seed)
    newest = 0
    for rec in sim.records:
        if rec.replay or rec.duplicate:
            continue
        for ev in rec.events:
            if ev.kind == "resolved":
                newest = max(newest, ev.commit_ts)
            elif ev.kind == "row":
                assert ev.commit_ts > newest, (rec.partition, ev.commit_ts, newest)


@pytest.mark.parametrize("mode", MODES)
def test_every_restart_begins_with_a_resolved_ts_no_higher_than_the_last_broadcast(mode: str) -> None:
    sim = mode_sim(mode)
    runs = 0
    for p in range(sim.config.partitions):
        in_run = False
        for rec, newest in last_broadcasts(sim, p):
            if rec.duplicate:
                continue
            if rec.replay and not in_run:
                runs += 1
                assert rec.events[0].kind == "resolved" and len(rec.events) == 1
            if rec.replay and rec.events[0].kind == "resolved":
                assert rec.events[0].commit_ts <= newest
            in_run = rec.replay
    assert (runs > 0) == (mode in WITH_REPLAYS or mode in LATE)


@pytest.mark.parametrize("mode", MODES)
def test_every_row_of_every_transaction_is_delivered(mode: str) -> None:
    sim = mode_sim(mode)
    rows = {id(ev) for evs in sim.first_copies().values() for ev in evs if ev.kind == "row"}
    assert len(rows) == sum(len(step.changes) for step in sim.steps)


@pytest.mark.parametrize("mode", MODES)
def test_the_decoder_reads_every_record_with_ptn_and_rid_where_the_producer_sends_them(mode: str) -> None:
    sim = mode_sim(mode)
    cfg = sim.config
    order = (
        ["ts", "scm", "tbl", "t", "ptn"]
        if cfg.architecture == "new"
        else ["ts", "scm", "tbl", "rid", "ptn", "t"]
    )
    seen = Counter()
    for offset, rec in enumerate(sim.records):
        decoded = decode_record(rec.key, rec.value, topic="t", partition=rec.partition, offset=offset)
        docs = key_documents(rec.key)
        assert len(decoded) == len(rec.events) == len(docs)
        for got, sent, doc in zip(decoded, rec.events, docs, strict=True):
            assert [k for k in order if k in doc] == list(doc)  # the architecture's field order
            assert_decoded_matches(got, sent, cfg)
            if sent.kind != "resolved" and cfg.architecture == "new":
                assert "scm" in doc and "tbl" in doc  # written even when empty
            if sent.kind != "row":
                continue
            assert sent.partition_id == doc.get("ptn")
            assert (sent.partition_id is not None) == (sent.table == PARTITIONED_TABLE)
            assert doc.get("rid") == (sent.row_id if cfg.sends_row_ids and sent.row_id else None)
            seen["ptn"] += "ptn" in doc
            seen["rid"] += "rid" in doc
    assert (seen["ptn"] > 0) == (mode in PARTITIONED)
    assert (seen["rid"] > 0) == (mode in CLASSIC)


@pytest.mark.parametrize("mode", MODES)
def test_a_seed_reproduces_the_stream(mode: str) -> None:
    again = simulate(StreamConfig(seed=7, transactions=200, **PRODUCER_MODES[mode]))
    assert [(r.partition, r.key, r.value, r.replay, r.duplicate) for r in again.records] == [
        (r.partition, r.key, r.value, r.replay, r.duplicate) for r in mode_sim(mode).records
    ]
    other = simulate(StreamConfig(seed=8, transactions=200, **PRODUCER_MODES[mode]))
    assert [r.value for r in other.records] != [r.value for r in again.records]


@pytest.mark.parametrize("mode", PARTITIONED)
def test_physical_partitions_interleave_one_table_out_of_ts_order(mode: str) -> None:
    sim = mode_sim(mode)
    inversions = 0
    for events in sim.first_copies().values():
        newest = 0
        newest_by_ptn: dict[int, int] = {}
        for ev in events:
            if ev.kind != "row" or ev.table != PARTITIONED_TABLE:
                continue
            assert ev.partition_id in PARTITION_IDS
            inversions += ev.commit_ts < newest
            newest = max(newest, ev.commit_ts)
            if mode not in LATE:  # one span: its first copies stay in ts order
                assert ev.commit_ts >= newest_by_ptn.get(ev.partition_id, 0)
            newest_by_ptn[ev.partition_id] = ev.commit_ts
    assert inversions > 0


@pytest.mark.parametrize("mode", PARTITIONED)
def test_transactions_touch_several_physical_partitions_and_move_rows_between_them(mode: str) -> None:
    sim = mode_sim(mode)
    by_ts: dict[int, list] = defaultdict(list)
    for events in sim.first_copies().values():
        for ev in events:
            if ev.kind == "row" and ev.table == PARTITIONED_TABLE:
                by_ts[ev.commit_ts].append(ev)
    assert {ev.partition_id for evs in by_ts.values() for ev in evs} == set(PARTITION_IDS)
    assert any(len({ev.partition_id for ev in evs}) >= 2 for evs in by_ts.values())
    kinds = Counter(ev.row_kind for evs in by_ts.values() for ev in evs)
    assert kinds["insert"] and kinds["update"] and kinds["delete"]

    def rest(image) -> dict:
        return {name: col[2] for name, col in image.items() if name != "id"}

    moved = [
        (d, i)
        for evs in by_ts.values()
        for d in evs
        if d.row_kind == "delete"
        for i in evs
        if i.row_kind == "insert" and rest(i.new) == rest(d.old) and i.partition_id != d.partition_id
    ]
    assert moved  # a primary-key change: DELETE in one physical partition, INSERT in another


@pytest.mark.parametrize("mode", LATE)
def test_late_first_copies_follow_newer_rows_of_their_table_above_the_resolved_ts(mode: str) -> None:
    sim = mode_sim(mode)
    late = 0
    for p in range(sim.config.partitions):
        delivered: set[int] = set()
        newest: dict[str, int] = {}
        for rec, resolved in last_broadcasts(sim, p):
            for ev in rec.events:
                if ev.kind != "row":
                    continue
                if not rec.duplicate and id(ev) not in delivered:
                    delivered.add(id(ev))
                    if ev.commit_ts < newest.get(ev.table, 0):
                        assert ev.commit_ts > resolved  # never below what the consumer was promised
                        late += 1
                newest[ev.table] = max(newest.get(ev.table, 0), ev.commit_ts)
    assert late > 0


@pytest.mark.parametrize("mode", WITH_REPLAYS)
def test_replays_re_send_part_of_a_transaction_on_a_partition(mode: str) -> None:
    sim = mode_sim(mode)
    partial = 0
    for recs in sim.records_by_partition().values():
        copies: Counter[int] = Counter()
        txn_rows: dict[int, set[int]] = defaultdict(set)
        for rec in recs:
            if rec.duplicate:
                continue
            for ev in rec.events:
                if ev.kind == "row":
                    copies[id(ev)] += 1
                    txn_rows[ev.commit_ts].add(id(ev))
        partial += sum(
            1
            for rows in txn_rows.values()
            if min(copies[r] for r in rows) == 1 < max(copies[r] for r in rows)
        )
    assert partial > 0


@pytest.mark.parametrize("mode", NEW)
def test_new_architecture_ddls_wait_only_for_the_tables_they_block(mode: str) -> None:
    sim = mode_sim(mode)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    create = next(ev for ev in sim.ddl_events if ev.table == LATE_TABLE)
    assert sim.ddl_events == sorted(sim.ddl_events, key=lambda ev: ev.commit_ts)
    assert create.commit_ts > alter.commit_ts
    older_rows_after_a_ddl = 0
    for events in sim.first_copies().values():
        ddls = [ev for ev in events if ev.kind == "ddl"]
        assert ddls.index(create) < ddls.index(alter)  # the later CREATE TABLE is written first
        at = events.index(alter)
        assert all(
            ev.commit_ts > alter.commit_ts
            for ev in events[at + 1 :]
            if ev.kind == "row" and ev.table == alter.table
        )
        for ev in events[events.index(create) + 1 :]:
            if ev.kind == "row" and ev.commit_ts < alter.commit_ts and ev.table != alter.table:
                older_rows_after_a_ddl += 1
    assert older_rows_after_a_ddl > 0


@pytest.mark.parametrize("mode", DDL_LAG)
def test_a_lagging_alter_follows_newer_rows_of_other_tables_and_precedes_its_own(mode: str) -> None:
    sim = mode_sim(mode)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    newer_rows_before = 0
    for events in sim.first_copies().values():
        at = events.index(alter)
        for ev in events[:at]:
            if ev.kind == "row" and ev.commit_ts > alter.commit_ts:
                assert ev.table != alter.table  # the ALTER blocks its own table at its ts
                newer_rows_before += 1
        assert all(ev.commit_ts < alter.commit_ts for ev in events[:at] if ev.kind == "resolved")
    assert newer_rows_before > 0


@pytest.mark.parametrize("mode", CLASSIC)
def test_classic_ddls_follow_every_earlier_row_in_commit_order(mode: str) -> None:
    sim = mode_sim(mode)
    for events in sim.first_copies().values():
        ddls = [ev for ev in events if ev.kind == "ddl"]
        assert ddls == broadcasts(sim, sim.ddl_events, ddls)
        for ddl in ddls:
            after = events[events.index(ddl) + 1 :]
            assert all(ev.commit_ts > ddl.commit_ts for ev in after if ev.kind == "row")


@pytest.mark.parametrize("mode", NEW)
def test_the_model_applies_ddls_by_commit_ts(mode: str) -> None:
    sim = mode_sim(mode)
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    create = next(ev for ev in sim.ddl_events if ev.table == LATE_TABLE)
    assert LATE_TABLE not in sim.tables_at(alter.commit_ts)
    assert "extra" in sim.tables_at(alter.commit_ts)["composite"].column_names
    assert (sim.schema, LATE_TABLE) not in sim.expected_snapshot(create.commit_ts - 1)
    assert sim.expected_snapshot(create.commit_ts)[(sim.schema, LATE_TABLE)] == []
    assert sim.expected_snapshot(sim.final_resolved_ts)[(sim.schema, LATE_TABLE)]
    rows = [
        ev for evs in sim.first_copies().values() for ev in evs if ev.kind == "row" and ev.table == LATE_TABLE
    ]
    assert rows and min(ev.commit_ts for ev in rows) > create.commit_ts


@pytest.mark.parametrize(
    ("options", "rid", "exact"),
    [
        ({}, True, True),
        ({"row_ids": False}, False, False),
        ({"row_ids": False, "replays": False}, False, True),
        ({"architecture": "new"}, False, False),
        ({"architecture": "new", "replays": False}, False, True),
        ({"architecture": "new", "replays": False, "late_first_copies": True}, False, False),
        ({"architecture": "new", "row_ids": False, "partitioned": True, "replays": False}, False, True),
    ],
)
def test_rid_follows_the_architecture_and_decides_whether_keyless_tables_are_exact(
    options: dict, rid: bool, exact: bool
) -> None:
    sim = simulate(StreamConfig(seed=3, transactions=12, **options))
    assert sim.config.sends_row_ids is rid
    assert sim.exact_keyless is exact
    keys = [doc for rec in sim.records for doc in key_documents(rec.key) if doc["t"] == 1]
    assert any("rid" in doc for doc in keys) is rid


@pytest.mark.parametrize(
    "bad",
    [{"architecture": "v9"}, {"architecture": "new", "row_ids": True}],
)
def test_impossible_producer_settings_are_rejected(bad: dict) -> None:
    with pytest.raises(ValueError):
        simulate(StreamConfig(**bad))


def test_every_mode_is_a_valid_config_with_its_own_order() -> None:
    assert {
        "classic",
        "classic-partitioned",
        "classic-late-copies",
        "new-ddl-order",
        "new-partitioned",
    } <= set(PRODUCER_MODES)
    assert PRODUCER_MODES["all-classic"] == {
        "architecture": "classic",
        "partitioned": True,
        "late_first_copies": True,
        "ddl_lag": True,
        "replays": True,
    }
    assert PRODUCER_MODES["all-new"] == {**PRODUCER_MODES["all-classic"], "architecture": "new"}
    for options in PRODUCER_MODES.values():
        StreamConfig(**options).validate()


@pytest.mark.parametrize("mode", ["classic-partition-growth", "new-partition-growth"])
def test_partition_growth_leaves_partitions_empty_then_moves_keys_onto_them(mode: str) -> None:
    """The producer uses half the partitions, then all: the others start with rows (no resolved ts
    before them), and some key's versions sit on two partitions (docs/open-protocol.md §5.7)."""
    sim = mode_sim(mode)
    half = sim.config.partitions // 2
    late = range(half, sim.config.partitions)
    first_records = [sim.records_by_partition()[p][0] for p in late if sim.records_by_partition()[p]]
    assert first_records and all(rec.events[0].kind != "resolved" for rec in first_records)
    start = min(i for i, rec in enumerate(sim.records) if any(rec is r for r in first_records))
    assert all(rec.partition < half for rec in sim.records[:start])
    where: dict[tuple, set[int]] = {}
    for rec in sim.records:
        for ev in rec.events:
            if ev.kind == "row" and ev.table == "composite":
                image = ev.new or ev.old
                where.setdefault((image["a"][2], image["b"][2]), set()).add(rec.partition)
    assert any(len(parts) > 1 for parts in where.values())

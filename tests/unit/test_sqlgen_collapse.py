"""Collapse semantics of sqlgen.collapse.plan_window (pure, no database)."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier.codec.events import (
    FLAG_GENERATED,
    CompactImage,
    ImageShape,
    Row,
    RowEvent,
    RowKind,
)
from applier.stream.listener import _compact_keyed
from sqlgen import PlanError, plan_window, update_keeps_key
from tests.builders import PK, KeyedRows, apply_keyed_plan, keyed_image, keyless_image, row_event

INT, VARCHAR, FLOAT, JSON = 3, 15, 4, 245


INS, UPD, DEL = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE


def final_state(events: list[RowEvent]) -> tuple[set, dict]:
    """(deleted keys, {key: (u, v)}) of the single table in the plan."""
    plan = plan_window(events)
    (tp,) = plan.tables.values()
    assert tp.keyed
    ups: dict = {}
    for g in tp.upserts:
        for key, row in zip(g.keys, g.rows, strict=True):
            d = dict(zip(g.columns, row, strict=True))
            ups[key] = (d["u"], d["v"])
    deleted = set(tp.delete_keys)
    assert not deleted & set(ups), "a key is both deleted and upserted"
    return deleted, ups


def test_update_chain_keeps_last_image_and_replays_collapse() -> None:
    evs = [
        row_event(INS, 10, keyed_image(1, "a", "v1")),
        row_event(UPD, 11, keyed_image(1, "a", "v2"), keyed_image(1, "a", "v1")),
        row_event(UPD, 12, keyed_image(1, "b", "v3"), keyed_image(1, "a", "v2")),
    ]
    replayed = evs + [row_event(e.kind, e.commit_ts, e.new, e.old) for e in evs]  # exact duplicates
    assert final_state(replayed) == (set(), {(1,): ("b", "v3")})


def test_order_is_by_commit_ts_not_arrival() -> None:
    evs = [
        row_event(UPD, 12, keyed_image(1, "a", "late"), keyed_image(1, "a", "mid"), partition=1),
        row_event(INS, 10, keyed_image(1, "a", "early"), partition=0),
        row_event(UPD, 11, keyed_image(1, "a", "mid"), keyed_image(1, "a", "early"), partition=0),
    ]
    assert final_state(evs) == (set(), {(1,): ("a", "late")})


def test_delete_then_reinsert_and_insert_then_delete() -> None:
    reinsert = [
        row_event(INS, 11, keyed_image(1, "x", "new")),
        row_event(DEL, 10, old=keyed_image(1, "x", "old")),
    ]
    assert final_state(reinsert) == (set(), {(1,): ("x", "new")})
    gone = [row_event(DEL, 11, old=keyed_image(1, "x", "v")), row_event(INS, 10, keyed_image(1, "x", "v"))]
    assert final_state(gone) == ({(1,)}, {})


def test_pk_change_split_across_partitions_arrival_reversed() -> None:
    # UPDATE id 1 -> 2 sent as DELETE(1) + INSERT(2), same ts, on different partitions;
    # the insert arrives first.
    evs = [
        row_event(INS, 10, keyed_image(2, "a", "v"), partition=1),
        row_event(DEL, 10, old=keyed_image(1, "a", "v"), partition=0),
    ]
    assert final_state(evs) == ({(1,)}, {(2,): ("a", "v")})


def test_pk_swap_split_converges_to_two_upserts() -> None:
    # A: id 1 -> 2, B: id 2 -> 1 in one transaction; deletes must not win over the inserts.
    evs = [
        row_event(INS, 10, keyed_image(2, "A", "a"), partition=1),
        row_event(INS, 10, keyed_image(1, "B", "b"), partition=0),
        row_event(DEL, 10, old=keyed_image(1, "A", "a"), partition=0),
        row_event(DEL, 10, old=keyed_image(2, "B", "b"), partition=1),
    ]
    assert final_state(evs) == (set(), {(2,): ("A", "a"), (1,): ("B", "b")})


def test_unique_value_swap_is_two_upserts() -> None:
    evs = [
        row_event(UPD, 10, keyed_image(2, "a", "y"), keyed_image(2, "b", "y"), partition=1),
        row_event(UPD, 10, keyed_image(1, "b", "x"), keyed_image(1, "a", "x"), partition=0),
    ]
    assert final_state(evs) == (set(), {(1,): ("b", "x"), (2,): ("a", "y")})


def test_update_with_changed_key_in_one_event_is_delete_plus_upsert_ordered_as_delete() -> None:
    # Same ts: another row takes key 1 (arrives first), and the UPDATE moves key 1 -> 3.
    evs = [
        row_event(INS, 10, keyed_image(1, "n", "new")),
        row_event(UPD, 10, keyed_image(3, "o", "moved"), keyed_image(1, "o", "moved")),
    ]
    assert final_state(evs) == (set(), {(1,): ("n", "new"), (3,): ("o", "moved")})
    assert final_state([row_event(UPD, 10, keyed_image(3, "o", "m"), keyed_image(1, "o", "m"))]) == (
        {(1,)},
        {(3,): ("o", "m")},
    )


def test_insert_without_old_image_is_an_upsert() -> None:
    assert final_state(
        [row_event(INS, 10, keyed_image(1, "a", "v")), row_event(INS, 11, keyed_image(1, "a", "w"))]
    ) == (
        set(),
        {(1,): ("a", "w")},
    )


def test_composite_and_null_keys() -> None:
    def img(a: Any, b: Any, v: Any) -> Row:
        return {
            "a": {"t": INT, "f": PK, "v": a},
            "b": {"t": VARCHAR, "f": PK, "v": b},
            "v": {"t": INT, "f": 0, "v": v},
        }

    plan = plan_window(
        [
            row_event(DEL, 10, old=img(1, None, 0)),
            row_event(DEL, 10, old=img(1, "x", 0)),
            row_event(INS, 10, img(2, "y", 5)),
        ]
    )
    tp = plan.tables[("s", "t")]
    (dg,) = tp.deletes
    assert dg.columns == ("a", "b") and dg.types == (INT, VARCHAR)
    assert sorted(dg.keys, key=repr) == sorted([(1, None), (1, "x")], key=repr)
    (ug,) = tp.upserts
    assert ug.columns == ("a", "b", "v") and ug.rows == [(2, "y", 5)] and ug.keys == [(2, "y")]


def test_generated_columns_excluded_and_upserts_grouped_by_columns() -> None:
    with_gen = keyed_image(1, "a", "v") | {"g": {"t": INT, "f": FLAG_GENERATED, "v": 99}}
    narrow = {"id": {"t": INT, "f": PK, "v": 2}, "v": {"t": VARCHAR, "f": 0, "v": "w"}}
    plan = plan_window(
        [
            row_event(INS, 10, with_gen),
            row_event(INS, 10, narrow),
            row_event(INS, 11, keyed_image(3, "c", "z")),
        ]
    )
    groups = {g.columns: g for g in plan.tables[("s", "t")].upserts}
    assert set(groups) == {("id", "u", "v"), ("id", "v")}
    assert groups[("id", "u", "v")].rows == [(1, "a", "v"), (3, "c", "z")]
    assert groups[("id", "u", "v")].types == (INT, VARCHAR, VARCHAR)
    assert groups[("id", "v")].rows == [(2, "w")]


def test_keyless_order_duplicates_and_update_split() -> None:
    evs = [
        row_event(INS, 11, keyless_image(3, "c")),
        row_event(INS, 10, keyless_image(1, "a")),
        row_event(
            INS, 10, keyless_image(1, "a")
        ),  # duplicate kept: indistinguishable from a second equal row
        row_event(UPD, 11, keyless_image(2, "B"), keyless_image(2, "b")),
        row_event(DEL, 11, old=keyless_image(1, "a")),
        row_event(UPD, 12, keyless_image(4, "d")),  # update without old image: plain insert
    ]
    plan = plan_window(evs)
    tp = plan.tables[("s", "t")]
    assert not tp.keyed
    got = [(op.kind, op.values) for op in tp.ops]
    assert got == [
        ("insert", (1, "a")),
        ("insert", (1, "a")),
        ("delete", (2, "b")),  # deletes first at ts 11, in arrival order
        ("delete", (1, "a")),
        ("insert", (3, "c")),
        ("insert", (2, "B")),
        ("insert", (4, "d")),
    ]
    assert tp.ops[0].columns == ("a", "b") and tp.ops[0].types == (INT, VARCHAR)
    assert plan.row_counts() == {("s", "t"): {"delete": 2, "replace": 0, "insert": 5}}


def test_keyless_generated_column_not_matched() -> None:
    old = keyless_image(1, "a") | {"g": {"t": INT, "f": FLAG_GENERATED, "v": 2}}
    (op,) = plan_window([row_event(DEL, 10, old=old)]).tables[("s", "t")].ops
    assert op.columns == ("a", "b") and op.values == (1, "a")


def test_multi_table_counts_and_totals() -> None:
    evs = [
        row_event(INS, 10, keyed_image(1, "a", "v"), table="k"),
        row_event(DEL, 10, old=keyed_image(2, "b", "v"), table="k"),
        row_event(INS, 10, keyless_image(1), table="n"),
        row_event(INS, 10, keyed_image(1, "a", "w"), table="k"),
    ]
    plan = plan_window(evs)
    assert plan.row_counts() == {
        ("s", "k"): {"delete": 1, "replace": 1, "insert": 0},
        ("s", "n"): {"delete": 0, "replace": 0, "insert": 1},
    }
    assert plan.totals() == {"events": 4, "delete": 1, "replace": 1, "insert": 1}
    assert plan.tables[("s", "k")].events == 3


def test_unplannable_events_raise_with_position() -> None:
    no_key_delete = row_event(DEL, 10, old={"v": {"t": VARCHAR, "f": 0, "v": "x"}})
    with pytest.raises(PlanError, match="no handle-key column") as info:
        plan_window([row_event(INS, 9, keyed_image(1)), no_key_delete])
    assert info.value.event is no_key_delete
    assert f"offset {no_key_delete.pos.offset}" in str(info.value)
    with pytest.raises(PlanError, match="no columns to match"):
        plan_window([row_event(DEL, 10, old={"g": {"t": INT, "f": FLAG_GENERATED, "v": 1}})])


def test_plan_pickles() -> None:
    plan = plan_window(
        [
            row_event(INS, 10, keyed_image(1, "a", "v")),
            row_event(DEL, 10, old=keyed_image(2)),
            row_event(INS, 10, keyless_image(1), table="n"),
        ]
    )
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan


# --- model-based property: applying the plan reproduces upstream ------------------------------


def _simulate(seed: int, dispatch: str) -> None:
    """Random upstream transactions on (id PK, u UNIQUE, v) -> TiCDC-like events (PK changes split
    into delete+insert, rows spread over partitions, random interleaving, replayed duplicates),
    windows of several transactions; apply each window's plan to a model of the downstream with
    REPLACE semantics and compare with upstream after every window."""
    rnd = random.Random(seed)
    upstream = KeyedRows(ids=range(8), us=range(8))
    rows = upstream.rows
    for _ in range(4):
        rid = next(upstream.rids)
        rows[rid] = (rid, rid, "init")
    downstream: dict[int, tuple[str, str]] = {r[0]: (str(r[1]), r[2]) for r in rows.values()}
    shapes: dict = {}  # the compact images' layouts, kept across windows as a listener keeps them
    ts = 100
    for _window in range(6):
        partitions: dict[int, list[RowEvent]] = {p: [] for p in range(3)}
        for _txn in range(rnd.randint(1, 4)):
            ts += 1
            before = dict(rows)
            for _op in range(rnd.randint(1, 4)):
                upstream.statement(rnd, rnd.random(), (0.25, 0.4, 0.6, 0.8, 1.0), ts)
            for old, new in upstream.changes(before):
                o = keyed_image(old[0], str(old[1]), old[2]) if old else None
                n = keyed_image(new[0], str(new[1]), new[2]) if new else None
                if old and new and old[0] == new[0]:
                    out = [(UPD, n, o, new[0])]
                elif old and new:
                    out = [(DEL, None, o, old[0]), (INS, n, None, new[0])]
                elif new:
                    out = [(INS, n, None, new[0])]
                else:
                    out = [(DEL, None, o, old[0])]
                for kind, nn, oo, key in out:
                    p = key % 3 if dispatch == "index-value" else 0
                    partitions[p].append(row_event(kind, ts, nn, oo, partition=p))
        # replay: a random tail of each partition is sent again
        for p, lst in partitions.items():
            if lst and rnd.random() < 0.5:
                lst.extend(
                    row_event(e.kind, e.commit_ts, e.new, e.old, partition=p)
                    for e in lst[rnd.randrange(len(lst)) :]
                )
        # interleave partitions randomly, keeping each partition's order
        arrival: list[RowEvent] = []
        queues = [list(lst) for lst in partitions.values() if lst]
        while queues:
            q = rnd.choice(queues)
            arrival.append(q.pop(0))
            if not q:
                queues.remove(q)
        if not arrival:
            continue
        plan = plan_window(arrival)
        # What the daemon's row cache does to the rows it holds (the new image made compact, the
        # old image of an update that keeps its key dropped, a delete's cut to its key columns)
        # changes nothing planned.
        trimmed = [row_event(e.kind, e.commit_ts, e.new, e.old, pos=e.pos) for e in arrival]
        for e in trimmed:
            _compact_keyed(e, shapes)
        assert any(e.old is None for e in trimmed if e.kind is UPD) or not any(e.kind is UPD for e in arrival)
        assert all((e.new_values is None) == (e.new is None) for e in trimmed)
        assert all(type(e.new) is CompactImage for e in trimmed if e.new is not None)
        assert [e.new for e in trimmed] == [e.new for e in arrival]  # reads as the image it replaced
        assert plan_window(trimmed) == plan
        (tp,) = plan.tables.values()
        apply_keyed_plan(tp, downstream)
        expected = {r[0]: (str(r[1]), r[2]) for r in rows.values()}
        assert downstream == expected, f"seed {seed} diverged at ts {ts}"


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dispatch=st.sampled_from(["table", "index-value"]))
def test_plan_reproduces_upstream(seed: int, dispatch: str) -> None:
    _simulate(seed, dispatch)


def test_update_keeps_key_reads_the_key_as_planning_does() -> None:
    """Only an update whose old image names the same row is planned without it (the daemon's row
    cache then drops that image); the key is read from each event's own flags."""
    same = row_event(UPD, 5, keyed_image(1, "a", "new"), keyed_image(1, "a", "old"))
    moved = row_event(UPD, 5, keyed_image(2, "a", "new"), keyed_image(1, "a", "old"))
    assert update_keeps_key(same)
    assert not update_keeps_key(moved)
    assert not update_keeps_key(row_event(INS, 5, keyed_image(1, "a")))
    assert not update_keeps_key(row_event(DEL, 5, None, keyed_image(1, "a")))
    assert not update_keeps_key(row_event(UPD, 5, keyed_image(1, "a"), None))
    assert not update_keeps_key(row_event(UPD, 5, keyless_image(1, "b"), keyless_image(1, "a")))
    # only-output-updated-columns: the old image holds the changed columns only
    only_v = {"v": {"t": VARCHAR, "f": 0, "v": "old"}}
    assert update_keeps_key(row_event(UPD, 5, keyed_image(1, "a", "new"), only_v))
    only_id = {"id": {"t": INT, "f": PK, "v": 7}}
    assert not update_keeps_key(row_event(UPD, 5, keyed_image(1, "a", "new"), only_id))

    # a composite key one part of which changed
    def two(a: int, b: int) -> Row:
        return {
            "a": {"t": INT, "f": PK, "v": a},
            "b": {"t": INT, "f": PK, "v": b},
            "c": {"t": INT, "f": 0, "v": 0},
        }

    assert update_keeps_key(row_event(UPD, 5, two(1, 2), two(1, 2)))
    assert not update_keeps_key(row_event(UPD, 5, two(1, 3), two(1, 2)))

    # a DDL moved the key to another column of the same column list: the flags tell, not a cache
    def moved_key(a: int, b: int) -> Row:
        return {
            "a": {"t": INT, "f": 0, "v": a},
            "b": {"t": INT, "f": PK, "v": b},
            "c": {"t": INT, "f": 0, "v": 0},
        }

    assert update_keeps_key(row_event(UPD, 5, two(1, 2), two(1, 2)))
    assert not update_keeps_key(row_event(UPD, 6, moved_key(1, 3), moved_key(1, 2)))


_IMAGES = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.tuples(st.sampled_from([0, PK]), st.sampled_from([None, 0, 1, 1.0, "1", b"1", float("nan")])),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(new=_IMAGES, old=_IMAGES)
def test_update_keeps_key_agrees_with_the_key_reader_of_plan_table(new: dict, old: dict) -> None:
    """Any images, flags and values: the same answer as reading both keys the way planning does."""
    from sqlgen.collapse import _KeyReader

    def image(cols: dict) -> Row:
        return {n: {"t": INT, "f": f, "v": v} for n, (f, v) in cols.items()}

    ev = row_event(UPD, 5, image(new), image(old))
    keys = _KeyReader()
    new_key = keys.key(ev.new)
    expected = bool(new_key[0]) and keys.old_key(ev.old, ev.new, new_key) == new_key
    assert update_keeps_key(ev) == expected

    # the same images compact: the decoder's keyed new images, and the old images it reduces to
    # their key columns for the daemon (decode_record's old_keys_only)
    def compact(row: Row) -> CompactImage:
        return CompactImage(ImageShape.of(row), tuple([col["v"] for col in row.values()]))

    for n, o in ((compact(ev.new), ev.old), (ev.new, compact(ev.old)), (compact(ev.new), compact(ev.old))):
        assert update_keeps_key(row_event(UPD, 5, n, o)) == expected

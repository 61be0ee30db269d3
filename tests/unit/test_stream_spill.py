"""Spilling rows of huge transactions to disk, reading them back, and applying them in pieces."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from applier.codec.events import (
    Position,
    ResolvedEvent,
    RowEvent,
    RowKind,
)
from applier.stream.barrier import Barrier
from applier.stream.spill import GroupPart, SpillDir, StreamedRows, pack_row, unpack_row
from sqlgen import plan_window, split_phases
from tests.builders import PK, KeyedRows, apply_keyed_plan, keyed_image, keyless_image, row_event

INS, UPD, DEL = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE


def test_a_row_survives_packing_with_every_kind_of_value() -> None:
    image = {
        "i": {"t": 8, "f": PK, "v": 2**64 - 1},
        "f": {"t": 5, "f": 0, "v": -1.5},
        "s": {"t": 15, "f": 0, "v": "ключ 漢字"},
        "b": {"t": 252, "f": 1, "v": b"\x00\xff"},
        "n": {"t": 3, "f": 0x40, "v": None},
    }
    row = RowEvent(7, "db", "tbl", UPD, image, dict(image), 3, Position("topic", 2, 99, 4), 42)
    assert unpack_row(pack_row(row)) == row


def test_split_phases_sends_deletes_and_changed_keys_to_the_delete_phase() -> None:
    delete = row_event(DEL, 1, old=keyed_image(1, "a"))
    insert = row_event(INS, 1, new=keyed_image(1, "a"))
    same_key = row_event(UPD, 1, new=keyed_image(1, "b"), old=keyed_image(1, "a"))
    assert split_phases(delete) == (delete, None)
    assert split_phases(insert) == (None, insert)
    assert split_phases(same_key) == (None, same_key)
    without_old = row_event(UPD, 1, new=keyed_image(1, "b"))
    assert split_phases(without_old) == (None, without_old)
    # A key change in one event (TiCDC splits them, but be safe): delete old key, upsert new one.
    d, u = split_phases(row_event(UPD, 1, new=keyed_image(2, "b", "x"), old=keyed_image(1, "a", "x")))
    assert d is not None and d.kind is DEL and d.old is not None and d.old["id"]["v"] == 1
    assert u is not None and u.kind is INS and u.new is not None and u.new["id"]["v"] == 2
    # only-output-updated-columns: the old image lacks unchanged columns; they come from the new one.
    partial_old = {"id": keyed_image(1)["id"]}
    d, _u = split_phases(row_event(UPD, 1, new=keyed_image(2, "b", "x"), old=partial_old))
    assert d is not None and d.old is not None and d.old["id"]["v"] == 1 and d.old["u"]["v"] == "b"
    # Keyless: delete the old row, insert the new one.
    d, u = split_phases(row_event(UPD, 1, new=keyless_image(2), old=keyless_image(1), table="n"))
    assert d is not None and d.kind is DEL and u is not None and u.kind is INS


def test_spill_files_keep_arrival_order_per_phase_and_are_removed(tmp_path: Path) -> None:
    files = SpillDir(tmp_path, "cf").open().files(0, 5)
    rows = [row_event(INS, 5, new=keyed_image(i, str(i))) for i in range(2500)]
    rows += [row_event(DEL, 5, old=keyed_image(i, str(i))) for i in range(10)]
    files.append(rows[:1200])
    files.append(rows[1200:])
    assert files.rows == len(rows)
    assert [r for b in files.read("d") for r in b] == rows[2500:]
    assert [r for b in files.read("u") for r in b] == rows[:2500]
    files.remove()
    assert list(tmp_path.rglob("*.spill")) == []


def test_opening_the_spill_directory_removes_what_an_earlier_run_left(tmp_path: Path) -> None:
    first = SpillDir(tmp_path, "orders/cf").open()
    first.files(1, 9).append([row_event(INS, 9, new=keyed_image(1))])
    assert list(first.path.iterdir())
    again = SpillDir(tmp_path, "orders/cf").open()
    assert again.path == first.path and list(again.path.iterdir()) == []
    assert first.path.parent == tmp_path and "/" not in first.path.name


def test_chunks_keep_small_commit_ts_whole_and_cut_a_large_one_deletes_first(tmp_path: Path) -> None:
    spill = SpillDir(tmp_path, "cf").open()
    small = [row_event(INS, 1, new=keyed_image(i)) for i in range(3)]
    big_ins = [row_event(INS, 2, new=keyed_image(100 + i)) for i in range(7)]
    big_del = [row_event(DEL, 2, old=keyed_image(i)) for i in range(3)]
    files = spill.files(0, 2)
    files.append(big_ins[:4] + big_del[:2])
    parts = (
        GroupPart(1, 0, None, small),
        GroupPart(2, 0, files, big_ins[4:]),
        GroupPart(2, 1, None, big_del[2:]),
        GroupPart(3, 0, None, [row_event(INS, 3, new=keyed_image(7))]),
        GroupPart(4, 1, None, [row_event(INS, 4, new=keyed_image(8))]),
    )
    streamed = StreamedRows(parts)
    assert streamed.count == 15
    chunks = list(streamed.chunks(4))
    assert chunks[0] == small
    kinds = [[r.kind for r in c] for c in chunks[1:-1]]
    assert kinds == [[DEL, DEL, DEL], [INS] * 4, [INS] * 3]
    assert chunks[-1] == parts[3].rows + parts[4].rows


# -- the pieces converge: a model of the downstream with REPLACE and DELETE ... LIMIT 1 --------


def _apply(plan_rows: list[RowEvent], keyed_db: dict, keyless_db: Counter) -> None:
    plan = plan_window(plan_rows)
    for tp in plan.tables.values():
        if tp.keyed:
            apply_keyed_plan(tp, keyed_db)
        else:
            for op in tp.ops:
                row = dict(zip(op.columns, op.values, strict=True))
                key = (row["a"], row["b"])
                if op.kind == "delete":
                    if keyless_db[key]:
                        keyless_db[key] -= 1
                else:
                    keyless_db[key] += 1


def _workload(rnd: random.Random, ts: int, ops: int, rows: dict, bag: Counter) -> list[RowEvent]:
    """One upstream transaction of ``ops`` statements on t (id PK, u UNIQUE) and keyless n, as
    TiCDC sends it (one net change per row; primary-key changes split, or sometimes not)."""
    before, bag_before = dict(rows), Counter(bag)
    rids = itertools.count(max(rows, default=0) + 1)  # above every row of ``before``
    upstream = KeyedRows(ids=range(40), us=range(40), rows=rows, rids=rids)
    for _ in range(ops):
        choice = rnd.random()
        if upstream.statement(rnd, choice, (0.25, 0.35, 0.5, 0.65, 0.8), ts):
            continue  # a statement on t; the draws above 0.8 are statements on the keyless n
        if choice < 0.9:
            bag[(rnd.randint(1, 3), rnd.choice("xy"))] += 1
        elif bag:
            key = rnd.choice(sorted(bag))
            bag[key] -= 1
            if not bag[key]:
                del bag[key]
    out: list[RowEvent] = []
    for old, new in upstream.changes(before):
        o = keyed_image(old[0], str(old[1]), old[2]) if old else None
        n = keyed_image(new[0], str(new[1]), new[2]) if new else None
        if old and new and (old[0] == new[0] or rnd.random() < 0.3):
            out.append(row_event(UPD, ts, n, o))
        else:
            if old:
                out.append(row_event(DEL, ts, old=o))
            if new:
                out.append(row_event(INS, ts, new=n))
    for key in set(bag_before) | set(bag):
        diff = bag[key] - bag_before[key]
        kind, image = (INS, {"new": keyless_image(*key)}) if diff > 0 else (DEL, {"old": keyless_image(*key)})
        out += [row_event(kind, ts, table="n", **image) for _ in range(abs(diff))]
    rnd.shuffle(out)  # any arrival order; TiCDC orders deletes first, but partitions interleave
    return out


def _converges(seed: int, tmp_path: Path) -> None:
    rnd = random.Random(seed)
    rows: dict[int, tuple[int, int, str]] = {}
    bag: Counter = Counter()
    keyed_db: dict = {}
    keyless_db: Counter = Counter()
    spill = SpillDir(tmp_path, f"cf{seed}").open()
    ts = 100
    for _window in range(4):
        parts: list[GroupPart] = []
        for _txn in range(rnd.randint(1, 4)):
            ts += 1
            events = _workload(rnd, ts, rnd.choice([1, 2, 12, 30]), rows, bag)
            for p in range(3):
                mine = [e for i, e in enumerate(events) if i % 3 == p]
                if not mine:
                    continue
                cut = rnd.randint(0, len(mine))
                files = None
                if cut:
                    files = spill.files(p, ts)
                    files.append(mine[:cut])
                parts.append(GroupPart(ts, p, files, mine[cut:]))
        for chunk in StreamedRows(tuple(parts)).chunks(rnd.randint(1, 6)):
            _apply(chunk, keyed_db, keyless_db)
        assert keyed_db == {r[0]: (str(r[1]), r[2]) for r in rows.values()}, f"seed {seed} at ts {ts}"
        assert +keyless_db == +bag, f"seed {seed} at ts {ts}"


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_pieces_of_a_window_converge_like_the_whole_window(seed: int, tmp_path_factory) -> None:
    _converges(seed, tmp_path_factory.mktemp("spill"))


# -- the barrier ----------------------------------------------------------------------------------


def _feed(barrier: Barrier, partition: int, offset: int, events: list, size: int = 1000) -> None:
    barrier.feed(partition, offset, events, size * len(events))


def test_the_barrier_spills_the_biggest_waiting_commit_ts_and_applies_it_streamed(tmp_path: Path) -> None:
    spill = SpillDir(tmp_path, "cf").open()
    barrier = Barrier([0, 1], spill=spill)
    huge = 50
    _feed(
        barrier, 0, 0, [row_event(INS, 10, new=keyed_image(1)), ResolvedEvent(10, Position("topic", 0, 0, 1))]
    )
    _feed(barrier, 1, 0, [ResolvedEvent(10, Position("topic", 1, 0, 0))])
    _feed(barrier, 0, 1, [row_event(INS, huge, new=keyed_image(i)) for i in range(100, 140)])
    _feed(barrier, 1, 1, [row_event(INS, huge, new=keyed_image(i)) for i in range(200, 230)])
    resume_before = barrier.resume_offsets()
    assert barrier.spill_over(100_000) == 0  # under the bound: nothing moves
    moved = barrier.spill_over(20_000)
    # The rows at ts 10 are releasable (about to be applied): only the waiting commit ts moves,
    # the biggest part first, until memory is under half the bound.
    assert moved == 40 + 30
    assert barrier.total_cached_rows() == 1 and barrier.total_spilled_bytes() == 70 * 1000
    assert barrier.resume_offsets() == resume_before  # spilling never moves a resume offset
    # Back-pressure counts spilled rows: the partitions ahead stay paused while the disk holds them.
    _feed(barrier, 1, 2, [ResolvedEvent(huge, Position("topic", 1, 2, 0))])
    assert barrier.partitions_to_pause(20_000) == {1}
    _feed(
        barrier,
        0,
        2,
        [row_event(INS, huge, new=keyed_image(99)), ResolvedEvent(huge, Position("topic", 0, 2, 1))],
    )
    first = barrier.next_window(max_rows=10)
    assert first is not None and first.streamed is None and first.target_ts == 10
    barrier.mark_applied(first)
    window = barrier.next_window(max_rows=10)
    assert window is not None and window.rows == [] and window.streamed is not None
    assert window.row_count == 71 and window.target_ts == huge
    applied = [r for chunk in window.streamed.chunks(25) for r in chunk]
    assert sorted(r.new["id"]["v"] for r in applied) == [99, *range(100, 140), *range(200, 230)]
    barrier.mark_applied(window)
    assert list(spill.path.iterdir()) == []
    assert barrier.total_cached_bytes() == 0 and barrier.total_spilled_bytes() == 0
    assert barrier.total_cached_rows() == 0


def test_without_a_spill_directory_nothing_is_spilled() -> None:
    barrier = Barrier([0])
    _feed(barrier, 0, 0, [row_event(INS, 5, new=keyed_image(i)) for i in range(10)])
    assert barrier.spill_over(1) == 0 and barrier.total_cached_rows() == 10

"""Decoded events as Arrow rows and back: nothing of what sqlgen.plan_table needs is lost or changed."""

from __future__ import annotations

import pickle
import zlib

import pyarrow as pa
import pytest

from applier.catchup._batch_builder import BatchBuilder
from applier.catchup.rows import (
    ARROW_SCHEMA,
    ROW,
    ROWS,
    WRITER_ROW,
    rebuild_row_events,
    unbundle,
    writer_event,
    writer_rows,
)
from applier.catchup.writer import WriteSpec, _plan_group, plan_final_rows, plan_keyed_events
from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import Position, RowEvent, RowKind
from applier.simulator import StreamConfig, simulate
from applier.stream.window import is_keyless
from sqlgen import Dialect, plan_table, plan_window
from tests.builders import id_val_image, position, row_event

HK = 0x02 | 0x08
INS, UPD, DEL = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE
AT = position(topic="x")  # where the rows of these tests were read


def _table(builder: BatchBuilder) -> pa.Table:
    """What the builder wrote, the skeleton rows out of their bundle (first, then the others)."""
    return unbundle(pa.Table.from_batches([builder.flush(final=True)], schema=ARROW_SCHEMA))


def _written(t: pa.Table, *names: str) -> list[tuple]:
    """Fields ``names`` of the writer rows in ``t``'s ROWS rows, in order; ``key`` is (names, values)."""
    out = []
    for row in writer_rows(t):
        fields = dict(zip(WRITER_ROW, row, strict=True))
        fields["key"] = (fields["key_names"], fields["key_values"])
        out.append(tuple(fields[n] for n in names))
    return out


def test_a_key_change_becomes_a_delete_and_an_insert_each_on_its_own_key() -> None:
    b = BatchBuilder(lower_ts=0)
    b.add_record(0, 7, [row_event(UPD, 10, id_val_image(2, "x"), id_val_image(1, "x"), pos=AT)], (b"k", b"v"))
    t = _table(b)
    assert _written(t, "op", "key") == [
        (int(RowKind.DELETE), (("id",), (1,))),
        (int(RowKind.INSERT), (("id",), (2,))),
    ]
    events = [ev for _t, ev in rebuild_row_events(t, "x")]
    assert events[0].old == {"id": {"t": 3, "f": HK, "v": 1}} and events[0].new is None
    assert dict(events[1].new) == id_val_image(2, "x") and events[1].old is None
    assert events[1].new_values == (2, "x")


def test_skeleton_marks_first_and_last_per_table_or_everything_when_ts_go_back() -> None:
    b = BatchBuilder(lower_ts=0)
    rows = [
        row_event(INS, ts, id_val_image(i, "v"), pos=position(index=i, topic="x"))
        for i, ts in enumerate([5, 5, 6, 7])
    ]
    other = [
        row_event(INS, ts, id_val_image(i, "v"), table="u", pos=position(index=10 + i, topic="x"))
        for i, ts in enumerate([9, 8, 9])
    ]
    keyless = [
        row_event(INS, 4, id_val_image(i, "v", key_flags=0), table="k", pos=position(index=20 + i, topic="x"))
        for i in range(2)
    ]
    b.add_record(0, 1, [*rows, *other, *keyless], (b"k", b"v"))
    t = _table(b)
    stubs = t.filter(t["skel"])
    assert stubs["img"].null_count == stubs.num_rows - 2  # only the keyless rows carry images
    written = sorted(_written(t, "tbl", "idx"))
    assert written == [("t", 0), ("t", 1), ("t", 2), ("t", 3), ("u", 4), ("u", 5), ("u", 6)]
    marked = set(zip(stubs["tbl"].to_pylist(), stubs["idx"].to_pylist(), strict=True))
    assert {i for tb, i in marked if tb == "t"} == {0, 3}  # first and last, ts never decrease
    assert {i for tb, i in marked if tb == "u"} == {4, 5, 6}  # index in the record; ts go back: all
    assert {i for tb, i in marked if tb == "k"} == {7, 8}  # keyless: always
    assert t.filter(pa.compute.equal(t["tbl"], "k"))["rec"].null_count == 0


@pytest.mark.parametrize(
    ("stamps", "marked"), [([5, 5, 6, 7], {0, 3}), ([5, 7, 6, 8], {0, 1, 2, 3}), ([9], {0})]
)
@pytest.mark.parametrize("same_objects", [True, False])
def test_a_record_of_one_table_marks_the_same_rows_whatever_its_names_objects(
    stamps: list[int], marked: set[int], same_objects: bool
) -> None:
    """A record of one table (the builder's shortcut) is marked by the rule for any record: the
    first and last row when the ts never decrease, else all; also when its events carry the
    table's name in equal but distinct strings (the decoder's name cache can be full)."""

    def name(text: str) -> str:
        return text if same_objects else "".join(list(text))  # equal, not the same object

    b = BatchBuilder(lower_ts=0)
    rows = [
        row_event(
            INS, ts, id_val_image(i, "v"), schema=name("shop"), table=name("orders"), pos=position(index=i)
        )
        for i, ts in enumerate(stamps)
    ]
    b.add_record(0, 1, rows, (b"k", b"v"))
    t = _table(b)
    stubs = t.filter(t["skel"])
    assert set(stubs["idx"].to_pylist()) == marked
    assert sorted(_written(t, "idx")) == [(i,) for i in range(len(stamps))]


def test_a_commit_ts_beyond_64_bit_signed_names_the_record() -> None:
    with pytest.raises(ValueError, match="commit ts 9223372036854775808 at partition 3 offset 12"):
        BatchBuilder(0).add_record(3, 12, [row_event(INS, 1 << 63, id_val_image(1, "v"), pos=AT)], (b"", b""))


def test_rows_at_or_below_the_lower_bound_travel_only_as_skeleton_stubs() -> None:
    b = BatchBuilder(lower_ts=6)
    rows = [
        row_event(INS, ts, id_val_image(i, "v"), pos=position(index=i, topic="x"))
        for i, ts in enumerate([5, 5, 6, 7])
    ]
    b.add_record(0, 1, rows, (b"k", b"v"))
    t = _table(b)
    stubs = t.filter(t["skel"])
    got = list(zip(stubs["ts"].to_pylist(), stubs["img"].is_valid().to_pylist(), strict=True))
    assert got == [(5, False), (7, False)]
    assert _written(t, "ts", "idx") == [(7, 3)]


def test_large_messages_stop_the_read_like_the_daemon() -> None:
    from applier.codec.events import LargeMessageEvent
    from applier.large_messages.errors import LargeMessageNotConfigured

    ev = LargeMessageEvent(5, "s", "t", True, None, None, Position("x", 0, 3, 0))
    with pytest.raises(LargeMessageNotConfigured):
        BatchBuilder(0).add_record(0, 3, [ev], (b"k", b"v"))


def test_collapse_keeps_the_last_op_per_key_but_never_across_a_ddl_record() -> None:
    from applier.codec.events import DDLEvent

    b = BatchBuilder(lower_ts=0, collapse_upto=1 << 62)
    b.add_record(
        0,
        1,
        [row_event(INS, 10, id_val_image(1, "a"), pos=AT), row_event(INS, 11, id_val_image(2, "a"), pos=AT)],
        (b"", b""),
    )
    b.add_record(0, 2, [row_event(UPD, 12, id_val_image(1, "b"), id_val_image(1, "a"), pos=AT)], (b"", b""))
    b.add_record(0, 3, [row_event(DEL, 12, None, id_val_image(2, "a"), pos=AT)], (b"", b""))
    b.add_record(
        0, 4, [DDLEvent(13, "s", "t", "ALTER TABLE t ADD c INT", 5, Position("x", 0, 4, 0))], (b"", b"")
    )
    b.add_record(0, 5, [row_event(UPD, 14, id_val_image(1, "c"), id_val_image(1, "b"), pos=AT)], (b"", b""))
    t = _table(b)
    got = sorted(_written(t, "ts", "lo", "key_values", "op"))
    assert got == [
        (12, 10, (1,), int(RowKind.UPDATE)),
        (12, 11, (2,), int(RowKind.DELETE)),
        (14, 14, (1,), int(RowKind.UPDATE)),
    ]


def test_tables_with_the_same_columns_and_other_keys_are_keyed_each_by_its_own() -> None:
    b = BatchBuilder(lower_ts=0, collapse_upto=1 << 62)
    by_id = id_val_image(1, "a")
    by_val = {"id": {"t": 3, "f": 0, "v": 1}, "val": {"t": 15, "f": HK, "v": "a"}}
    b.add_record(
        0,
        1,
        [row_event(INS, 10, by_id, table="a", pos=AT), row_event(INS, 10, by_val, table="b", pos=AT)],
        (b"", b""),
    )
    t = _table(b)
    assert sorted(_written(t, "tbl", "key")) == [("a", (("id",), (1,))), ("b", (("val",), ("a",)))]


def test_a_ddl_that_moves_the_handle_key_to_other_columns_is_seen_at_once() -> None:
    """ALTER TABLE ... ADD PRIMARY KEY keeps the column list and moves the handle key: rows after
    its DDL record are keyed by the new key, even though the columns look the same."""
    from applier.codec.events import DDLEvent

    def image(id_: int, val: str, *, key_on_val: bool) -> dict:
        flags = (0, HK) if key_on_val else (HK, 0)
        return {"id": {"t": 3, "f": flags[0], "v": id_}, "val": {"t": 15, "f": flags[1], "v": val}}

    b = BatchBuilder(lower_ts=0, collapse_upto=1 << 62)
    b.add_record(0, 1, [row_event(INS, 10, image(1, "a", key_on_val=True), pos=AT)], (b"", b""))
    b.add_record(
        0,
        2,
        [DDLEvent(11, "s", "t", "ALTER TABLE t ADD PRIMARY KEY (id)", 5, Position("x", 0, 2, 0))],
        (b"", b""),
    )
    moved = image(2, "a", key_on_val=False), image(1, "a", key_on_val=False)
    b.add_record(0, 3, [row_event(UPD, 12, *moved, pos=AT)], (b"", b""))
    t = _table(b)
    after = [(key, op) for ts, key, op in _written(t, "ts", "key", "op") if ts > 11]  # the rows after the DDL
    assert sorted(after) == [((("id",), (1,)), int(RowKind.DELETE)), ((("id",), (2,)), int(RowKind.INSERT))]


@pytest.mark.parametrize("collapse", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_plans_through_arrow_equal_the_daemons_plans(seed: int, collapse: bool) -> None:
    """Every keyed row of a simulated stream, through Arrow and the writer's planning, gives the same
    final states as sqlgen.plan_window over the original events (replays, swaps, key changes); the
    builder is given the events as the readers decode them (old images reduced to their key)."""
    sim = simulate(
        StreamConfig(seed=seed, partitions=3, transactions=150, ddl_mid_stream=False, index_ddls=False)
    )
    b = BatchBuilder(lower_ts=0, collapse_upto=(1 << 62) if collapse else None, max_keys=50)  # flush often
    originals: list[RowEvent] = []
    offsets: dict[int, int] = {}
    for rec in sim.records:
        off = offsets.get(rec.partition, 0)
        offsets[rec.partition] = off + 1
        events = decode_record(
            rec.key, rec.value, topic="x", partition=rec.partition, offset=off, options=DecoderOptions()
        )
        # The readers decode the old images of updates reduced to their key where they can.
        reduced = decode_record(
            rec.key, rec.value, topic="x", partition=rec.partition, offset=off, old_keys_only=True
        )
        b.add_record(rec.partition, off, reduced, (rec.key, rec.value))
        originals.extend(e for e in events if isinstance(e, RowEvent) and not is_keyless(e))
    t = _table(b)
    keyed = t.filter(pa.compute.equal(t["kind"], ROWS))
    by_table: dict = {}
    for table, ev in rebuild_row_events(keyed, "x"):
        by_table.setdefault(table, []).append(ev)
    mine = {(tp.schema, tp.table): tp for tp in plan_keyed_events(by_table)}
    originals.sort(key=lambda e: e.commit_ts)
    theirs = plan_window(originals).tables
    assert set(mine) == set(theirs)
    for tid, tp in theirs.items():
        assert _final(mine[tid]) == _final(tp), tid
    # The writers' own planning (one row per key planned as it is, else as events): the same plans.
    blobs = keyed["img"].to_pylist()
    grouped = {(tp.schema, tp.table): tp for tp in _plan_group(blobs, _SPEC)}
    assert grouped == mine
    # Each table's rows cut to one per key (the last of each; the readers' share usually is): the
    # short way plans them, exactly as the events' way does.
    unique: dict = {}
    for row in writer_rows(keyed):
        unique.setdefault((row[5], row[6]), {})[row[9]] = row
    for (schema, table), by_key in unique.items():
        cut = list(by_key.values())
        fast = plan_final_rows(schema, table, cut)
        assert fast is not None, (schema, table)
        assert [fast] == plan_keyed_events({(schema, table): [writer_event(r, "x") for r in cut]})


_SPEC = WriteSpec(downstream=None, dialect=Dialect("mariadb"), topic="x", epoch=1, lower=0, upper=1 << 62)  # type: ignore[arg-type]


def _writer_row(ts: int, key: int, value: str | None, *, table: str = "t") -> tuple:
    """A writer row of s.``table`` (id INT PK, val VARCHAR, gen INT GENERATED); ``value`` None: a delete."""
    from applier.codec.events import ImageShape

    if value is None:
        old = {"id": {"t": 3, "f": HK, "v": key}}
        return (ts, 0, 0, ts, 0, "s", table, int(DEL), ("id",), (key,), None, None, old, ts)
    shape = ImageShape(("id", "val", "gen"), ((3, HK), (15, 0), (3, 0x04)))
    return (ts, 1, 0, ts, 0, "s", table, int(UPD), ("id",), (key,), shape, (key, value, key * 2), None, ts)


def test_rows_of_unique_keys_are_planned_as_they_are_and_equal_the_events_plan() -> None:
    """One row per key: the plan is built from the rows (key order, generated column left out) and
    is exactly the one plan_table makes of their events; anything else goes the long way."""
    w = _writer_row
    rows = [w(30, 5, "e"), w(20, 2, None), w(10, 9, "i"), w(40, 1, None)]
    fast = plan_final_rows("s", "t", rows)
    assert fast == _events_plan(rows)
    assert fast is not None and [g.keys for g in fast.deletes] == [[(1,), (2,)]]
    assert [(g.columns, g.rows) for g in fast.upserts] == [(("id", "val"), [(5, "e"), (9, "i")])]

    assert plan_final_rows("s", "t", [*rows, _writer_row(50, 5, "again")]) is None  # two rows of key 5
    moved = _writer_row(60, 7, "m")
    moved = (*moved[:8], ("val",), ("m",), *moved[10:])  # keyed by another column list
    assert plan_final_rows("s", "t", [*rows, moved]) is None
    lacking = _writer_row(70, 8, None)
    lacking = (*lacking[:12], {}, *lacking[13:])  # a key change's old image without the key column
    assert plan_final_rows("s", "t", [*rows, lacking]) is None
    null = _writer_row(80, 0, "n")
    null = (*null[:9], (None,), *null[10:])
    assert plan_final_rows("s", "t", [*rows, null]) is None  # keys that do not compare
    # The long way gives the same plan for rows it could not plan as they are.
    twice = [*rows, _writer_row(50, 5, "again")]
    (grouped,) = _plan_group([pickle.dumps(twice)], _SPEC)
    assert grouped == _events_plan(twice)
    assert grouped.upserts[0].columns == ("id", "val") and (5, "again") in grouped.upserts[0].rows


def _events_plan(rows: list[tuple]):
    """plan_table of the events of writer rows of s.t, in commit ts order."""
    return plan_table("s", "t", sorted((writer_event(r, "x") for r in rows), key=lambda e: e.commit_ts))


def _final(tp) -> tuple:
    deletes = {(g.columns, k) for g in tp.deletes for k in g.keys}
    upserts = {(g.columns, row) for g in tp.upserts for row in g.rows}
    return deletes, upserts


def test_ops_above_the_collapse_bound_are_never_merged_into_a_winner() -> None:
    """An op above R must not hide the key's last op at or below R (the daemon applies the rest)."""
    b = BatchBuilder(lower_ts=0, collapse_upto=12)
    b.add_record(0, 1, [row_event(INS, 10, id_val_image(1, "a"), pos=AT)], (b"", b""))
    b.add_record(0, 2, [row_event(UPD, 12, id_val_image(1, "b"), id_val_image(1, "a"), pos=AT)], (b"", b""))
    b.add_record(0, 3, [row_event(UPD, 13, id_val_image(1, "c"), id_val_image(1, "b"), pos=AT)], (b"", b""))
    b.add_record(0, 4, [row_event(DEL, 14, None, id_val_image(1, "c"), pos=AT)], (b"", b""))
    t = _table(b)
    assert sorted(_written(t, "ts", "lo")) == [(12, 10), (13, 13), (14, 14)]


def test_keyed_rows_at_or_below_the_partitions_resolved_ts_are_replays_and_not_written() -> None:
    """The daemon's rule 2, per partition: only their skeleton stubs remain."""
    from applier.codec.events import ResolvedEvent

    b = BatchBuilder(lower_ts=0)
    b.add_record(0, 1, [row_event(INS, 10, id_val_image(1, "a"), pos=AT)], (b"", b""))
    b.add_record(0, 2, [ResolvedEvent(10, Position("x", 0, 2, 0))], (b"", b""))
    b.add_record(1, 1, [row_event(INS, 10, id_val_image(2, "a"), pos=AT)], (b"", b""))  # another partition
    b.add_record(
        0,
        3,
        [row_event(INS, 10, id_val_image(1, "a"), pos=AT), row_event(INS, 11, id_val_image(1, "b"), pos=AT)],
        (b"", b""),
    )
    t = _table(b)
    assert _written(t, "part", "off", "ts") == [(0, 1, 10), (1, 1, 10), (0, 3, 11)]
    stubs = t.filter(pa.compute.and_(t["skel"], pa.compute.equal(t["kind"], ROW)))
    assert (0, 3, 10) in set(
        zip(stubs["part"].to_pylist(), stubs["off"].to_pylist(), stubs["ts"].to_pylist(), strict=True)
    )


def test_writer_rows_of_one_key_share_a_bucket_whatever_reader_wrote_them() -> None:
    """The writers are partitioned by bucket, so every reader must put a key's rows in one bucket;
    a bucket's ROWS row carries the highest and lowest commit ts of its rows (the epochs' filter)."""
    readers = [BatchBuilder(lower_ts=0, buckets=16) for _ in range(2)]
    for part, b in enumerate(readers):
        b.add_record(
            part,
            1,
            [row_event(INS, 10 + part + i, id_val_image(i * 5000, "v"), pos=AT) for i in range(40)],
            (b"", b""),
        )
    buckets: dict = {}
    for b in readers:
        t = _table(b)
        rows = t.filter(pa.compute.equal(t["kind"], ROWS))
        columns = (rows[n].to_pylist() for n in ("idx", "ts", "lo", "img"))
        for idx, top, low, blob in zip(*columns, strict=True):
            written = list(writer_rows(pa.table({"kind": [ROWS], "img": [blob]})))
            assert top == max(r[0] for r in written) and low == min(r[13] for r in written)
            for r in written:
                buckets.setdefault(r[9], set()).add(idx)
    assert len(buckets) == 40 and all(len(found) == 1 for found in buckets.values())
    assert len({next(iter(found)) for found in buckets.values()}) > 4  # spread over the buckets


def test_integer_keys_go_to_buckets_in_runs_of_neighbours_other_keys_one_by_one() -> None:
    """A key of one integer column is bucketed by its run of 1,024 values (the writers then write
    stretches of the primary key); text keys are spread key by key."""
    b = BatchBuilder(lower_ts=0, buckets=64)
    ints = [row_event(INS, 10, id_val_image(i, "v"), pos=AT) for i in (*range(2048, 2048 + 300), 5000)]
    texts = [row_event(INS, 10, id_val_image(f"key-{i}", "v"), table="u", pos=AT) for i in range(300)]
    b.add_record(0, 1, [*ints, *texts], (b"", b""))
    t = _table(b)
    rows = t.filter(pa.compute.equal(t["kind"], ROWS))
    bucket_of: dict = {}
    for idx, blob in zip(rows["idx"].to_pylist(), rows["img"].to_pylist(), strict=True):
        for r in writer_rows(pa.table({"kind": [ROWS], "img": [blob]})):
            bucket_of[(r[6], r[9][0])] = idx
    assert len({bucket_of[("t", i)] for i in range(2048, 2048 + 300)}) == 1  # one run: one bucket
    # every reader must agree: the bucket is the run's CRC, whether remembered or computed
    run = pickle.dumps(("s", "t", ("id",), 2048 >> 10), pickle.HIGHEST_PROTOCOL)
    assert bucket_of[("t", 2048)] == zlib.crc32(run) % 64
    assert bucket_of[("t", 5000)] != bucket_of[("t", 2048)]  # another run (here: another bucket)
    assert len({bucket_of[("u", f"key-{i}")] for i in range(300)}) > 32


def test_straddling_rows_counts_collapsed_rows_whose_ops_lie_in_two_epochs() -> None:
    from applier.catchup.rows import straddling_rows

    b = BatchBuilder(lower_ts=0, collapse_upto=1 << 62)
    b.add_record(0, 1, [row_event(INS, 10, id_val_image(1, "a"), pos=AT)], (b"", b""))
    b.add_record(0, 2, [row_event(UPD, 20, id_val_image(1, "b"), id_val_image(1, "a"), pos=AT)], (b"", b""))
    b.add_record(0, 3, [row_event(INS, 30, id_val_image(2, "a"), pos=AT)], (b"", b""))
    t = _table(b)
    assert straddling_rows(t, [15]) == 1  # key 1: ops at 10 and 20
    assert straddling_rows(t, [5, 25]) == 0
    assert straddling_rows(t, [20]) == 0  # an epoch's upper bound is inside it


def test_a_writer_takes_whole_buckets_a_group_at_a_time_and_commits_by_rows(monkeypatch) -> None:
    """write_keyed's helpers: no bucket is split between two groups (its keys may have rows in
    several pickles, and batches), a bucket met again after another fails the task, and
    statements left over from a group wait for the next one's."""
    from applier.catchup import writer

    monkeypatch.setattr(writer, "GROUP_ROWS", 5)
    first = pa.table({"idx": [1, 1, 2], "off": [2, 1, 4], "img": [b"b", b"e", b"d"]})
    second = pa.table({"idx": [2, 3, 3], "off": [1, 2, 2], "img": [b"f", b"a", b"c"]})
    assert list(writer._bucket_groups(iter([first, second]))) == [[b"b", b"e", b"d", b"f"], [b"a", b"c"]]
    unsorted = pa.table({"idx": [3, 1, 3], "off": [2, 2, 2], "img": [b"a", b"b", b"c"]})
    with pytest.raises(RuntimeError, match="bucket 3 met again"):
        list(writer._bucket_groups(iter([unsorted])))

    class St:
        def __init__(self, rows: int) -> None:
            self.rows = rows

    pending = [St(3), St(3), St(1)]
    assert [[s.rows for s in c] for c in writer._chunks(pending, 5, whole=False)] == [[3, 3]]
    assert [s.rows for s in pending] == [1]
    assert [[s.rows for s in c] for c in writer._chunks(pending, 5)] == [[1]] and pending == []


class _WeakValue(str):
    """A column value that can be referenced weakly (and pickled: the builder pickles what it writes)."""


def test_the_final_flush_lets_go_of_the_collapse_winners() -> None:
    """Once the winners are written out, the builder holds none of them: the reader's task turns the
    cyclic collector back on right after (scan.read_range), and its first collection scanned every
    object still alive since the collector went off (0.2-0.3 s per 500K-event range while the
    builder still held the last table's winners)."""
    import gc
    import weakref

    b = BatchBuilder(lower_ts=0, collapse_upto=1 << 62)
    value = _WeakValue("a")
    b.add_record(0, 1, [row_event(INS, 10, id_val_image(1, value), pos=AT)], (b"", b""))
    gone = weakref.ref(value)
    del value
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as in the reader: only reference counting frees the winners
    try:
        batch = b.flush(final=True)
        assert batch.num_rows > 0
        del batch
        assert gone() is None
    finally:
        if gc_was_enabled:
            gc.enable()

"""PartitionListener: replay detection, DDL queueing, memory accounting, resume offsets, and the images
it caches."""

from __future__ import annotations

import pytest

from applier.codec.decoder import decode_record
from applier.codec.events import (
    FLAG_HANDLE_KEY,
    CompactImage,
    ImageShape,
    LargeMessageEvent,
    Position,
    RowEvent,
    RowKind,
)
from applier.large_messages.errors import LargeMessageNotConfigured
from applier.simulator import PRODUCER_MODES, StreamConfig, simulate
from applier.stream.listener import COLUMN_BYTES, PartitionListener, cache_bytes
from applier.stream.progress import SharedProgress, ddl_key
from applier.stream.window import is_keyless
from checkpoint import Checkpoint
from sqlgen import plan_window
from tests.builders import INT, ddl_event, keyed_row, keyless_row, record, resolved_event


def make(
    state: Checkpoint | None = None, start: int | None = None
) -> tuple[PartitionListener, SharedProgress]:
    progress = SharedProgress(state or Checkpoint())
    return PartitionListener(0, progress, start), progress


class Feeder:
    """Feeds one record per call with increasing offsets (like the Kafka loop)."""

    def __init__(self, listener: PartitionListener, first_offset: int = 0) -> None:
        self.listener = listener
        self.next = first_offset

    def __call__(self, *events, nbytes: int = 0) -> int:
        off = self.next
        self.listener.feed(off, list(events), nbytes)
        self.next += 1
        return off


def cached(listener: PartitionListener, upto: int = 10**18) -> list[RowEvent]:
    return listener.rows_upto(upto)


# ---------------------------------------------------------------------------- resolved ts


def test_listener_starts_at_checkpoint_ts_and_takes_max_resolved() -> None:
    lst, _ = make(Checkpoint(resolved_ts=50))
    assert lst.resolved == 50
    assert lst.observed_resolved is None
    feed = Feeder(lst)
    feed(resolved_event(40))  # below the checkpoint: still 50
    assert lst.resolved == 50
    feed(resolved_event(70))
    assert lst.resolved == 70
    feed(resolved_event(60))  # older resolved after a replay: ignored
    assert lst.resolved == 70
    assert lst.stats.resolved_ignored == 1


# ---------------------------------------------------------------------------- row drop rules


def test_rows_at_or_below_checkpoint_are_skipped() -> None:
    lst, _ = make(Checkpoint(resolved_ts=100, tables={("db", "k"): 120}))
    feed = Feeder(lst)
    feed(keyed_row(100, 1), keyed_row(101, 2, table="other"), keyed_row(120, 3), keyed_row(121, 4))
    assert [(r.table, r.commit_ts) for r in cached(lst)] == [("other", 101), ("k", 121)]
    assert lst.stats.rows_skipped == 2


def test_row_at_or_below_partition_resolved_is_a_replay() -> None:
    lst, _ = make()
    feed = Feeder(lst)
    feed(keyed_row(10, 1), keyed_row(20, 2))
    feed(resolved_event(20))
    feed(keyed_row(20, 2), keyed_row(10, 1))  # replays of rows already sent before resolved 20
    assert [r.commit_ts for r in cached(lst)] == [10, 20]
    assert lst.stats.rows_replayed == 2
    feed(keyed_row(21, 3))
    assert [r.commit_ts for r in cached(lst)] == [10, 20, 21]


def test_keyed_identical_copy_at_max_ts_is_kept_and_harmless_by_design() -> None:
    lst, _ = make()
    feed = Feeder(lst)
    feed(keyed_row(30, 1))
    feed(keyed_row(30, 1))
    assert len(cached(lst)) == 2  # REPLACE by key twice == once; no counting for keyed tables


def test_keyless_identical_rows_of_one_transaction_are_all_kept() -> None:
    lst, _ = make()
    feed = Feeder(lst)
    feed(keyless_row(30, 1), keyless_row(30, 1))
    feed(keyless_row(30, 1))  # third identical row of the same transaction, next record
    assert len(cached(lst)) == 3


def test_is_keyless_looks_at_both_images() -> None:
    assert is_keyless(keyless_row(1, 1))
    assert is_keyless(keyless_row(1, 1, kind=RowKind.DELETE))
    assert not is_keyless(keyed_row(1, 1))
    assert not is_keyless(keyed_row(1, 1, kind=RowKind.DELETE))


# ---------------------------------------------------------------------------- DDL


def test_ddls_sharing_a_commit_ts_are_distinct() -> None:
    lst, _ = make()
    feed = Feeder(lst)
    feed(ddl_event(50, "RENAME TABLE a TO b", "a"))
    feed(ddl_event(50, "RENAME TABLE c TO d", "c"))
    assert [d.query for d in lst.pending_ddls()] == ["RENAME TABLE a TO b", "RENAME TABLE c TO d"]
    assert lst.min_pending_ddl_ts() == 50


def test_ddl_applied_per_checkpoint_is_dropped() -> None:
    applied = ddl_event(50)
    lst, _ = make(Checkpoint(resolved_ts=49, applied_ddls=frozenset({ddl_key(applied)})))
    feed = Feeder(lst)
    feed(ddl_event(50))
    feed(ddl_event(40, "DROP TABLE x"))  # at or below the applied ts
    assert lst.pending_ddls() == []
    assert lst.stats.ddls_dropped == 2
    feed(ddl_event(60, "DROP TABLE y"))
    assert [d.commit_ts for d in lst.pending_ddls()] == [60]


# ---------------------------------------------------------------------------- misc feed rules


def test_large_message_raises_with_position_and_leaves_state_untouched() -> None:
    lst, _ = make()
    feed = Feeder(lst)
    feed(keyed_row(10, 1))
    big = LargeMessageEvent(20, "db", "k", True, None, None, Position("topic", 0, 7, 2))
    with pytest.raises(LargeMessageNotConfigured) as err:
        lst.feed(7, [keyed_row(15, 2), big])
    assert err.value.position == Position("topic", 0, 7, 2)
    assert "offset 7" in str(err.value) and "ohk" in str(err.value)
    assert [r.commit_ts for r in cached(lst)] == [10]
    assert lst.last_offset == 0


def test_offsets_must_increase() -> None:
    lst, _ = make()
    lst.feed(5, [keyed_row(10, 1)])
    with pytest.raises(ValueError, match="offset order"):
        lst.feed(5, [keyed_row(11, 1)])


def test_cached_bytes_apportion_the_record_size_to_kept_rows() -> None:
    lst, progress = make()
    feed = Feeder(lst)
    feed(keyed_row(10, 1), keyed_row(10, 2), keyed_row(20, 3), nbytes=301)  # 101 + 100 + 100
    feed(resolved_event(5), nbytes=8)
    feed(keyed_row(4, 9), keyed_row(30, 4), nbytes=50)  # the first one is a replay, not counted
    assert lst.cached_bytes == 301 + 25
    assert lst.cached_rows == 4
    progress.applied_ts = 10
    lst.discard_applied()
    assert lst.cached_bytes == 100 + 25
    assert [r.commit_ts for r in cached(lst)] == [20, 30]


def test_rows_upto_orders_by_ts_then_arrival() -> None:
    lst, _ = make()
    feed = Feeder(lst)
    feed(keyed_row(30, 1, table="a"), keyed_row(20, 2, table="b"))
    feed(keyed_row(30, 3, table="c"), keyed_row(25, 4, table="b"))
    assert [(r.commit_ts, r.new["id"]["v"]) for r in lst.rows_upto(29)] == [(20, 2), (25, 4)]
    assert [(r.commit_ts, r.new["id"]["v"]) for r in lst.rows_upto(30)] == [
        (20, 2),
        (25, 4),
        (30, 1),
        (30, 3),
    ]
    assert lst.cached_ts_upto(25) == [20, 25]


# ---------------------------------------------------------------------------- resume offsets


def test_resume_offset_start_then_next_record() -> None:
    lst, _ = make(start=100)
    assert lst.resume_offset() == 100
    lst.feed(100, [keyed_row(5, 1)])  # cached: above the applied ts 0
    assert lst.resume_offset() == 100
    lst.feed(101, [resolved_event(3)])
    lst.feed(102, [resolved_event(6)])
    assert lst.resume_offset() == 100
    # Row 5 applied: nothing left to apply; the record after the last is 103, but the resolved
    # record that set the replay-detection horizon (6, at 102) is re-read too.
    assert lst.resume_offset(after_applied_ts=5) == 102
    unknown, _ = make()
    assert unknown.resume_offset() is None


def test_discard_applied_drops_rows_and_the_applied_ddl() -> None:
    lst, progress = make()
    feed = Feeder(lst)
    feed(keyed_row(10, 1), keyed_row(20, 2))
    feed(ddl_event(30))
    progress.applied_ts = 29
    lst.discard_applied(ddl_key(ddl_event(30)))
    assert cached(lst) == []
    assert lst.pending_ddls() == []
    assert lst.cached_rows == 0 and lst.cached_bytes == 0


def _restart_equivalence(records: list[list], applied_ts: int) -> tuple[PartitionListener, PartitionListener]:
    """Feed ``records`` to a listener, apply up to ``applied_ts``, restart a second listener from the
    first one's resume offset: both must hold the same rows."""
    first, progress = make(Checkpoint(), start=0)
    for off, evs in enumerate(records):
        first.feed(off, evs)
    progress.applied_ts = applied_ts
    first.discard_applied()
    resume = first.resume_offset()
    assert resume is not None
    second, _ = make(Checkpoint(resolved_ts=applied_ts), start=resume)
    for off, evs in enumerate(records):
        if off >= resume:
            second.feed(off, evs)
    return first, second


# ---------------------------------------------------------------------------- producer orders
# docs/open-protocol.md §5: nothing but the resolved ts and the version's identity tells a copy.


def test_older_first_copies_of_a_table_after_newer_rows_are_kept_in_ts_order() -> None:
    """Physical partitions of one table flushed independently, or a late first copy (B, A, B):
    every row above the partition's resolved ts is kept and handed out in commit-ts order."""
    lst, _ = make()
    feed = Feeder(lst)
    feed(resolved_event(10))
    feed(keyed_row(30, 1, "b"))  # B
    feed(keyed_row(20, 1, "a"), keyed_row(25, 2))  # A, older, arrives later: a first copy, not a replay
    feed(keyed_row(30, 1, "b"))  # B again
    assert [(r.commit_ts, r.new["val"]["v"]) for r in cached(lst)] == [
        (20, "a"),
        (25, "v"),
        (30, "b"),
        (30, "b"),
    ]
    assert lst.stats.rows_replayed == 0


def test_a_ddl_says_nothing_about_rows_of_other_tables() -> None:
    """New architecture: a DDL at D waits only for the tables it blocks; rows of other tables
    below D may follow it on the partition, and they are first copies."""
    lst, _ = make()
    feed = Feeder(lst)
    feed(ddl_event(50))
    assert lst.resolved == 0 and lst.observed_resolved is None
    feed(keyed_row(40, 1, table="other"))
    assert [r.commit_ts for r in cached(lst)] == [40]
    feed(ddl_event(50))  # a replayed broadcast copy
    feed(ddl_event(45, "CREATE TABLE z (id INT PRIMARY KEY)", "z"))  # DDLs out of ts order
    assert [d.commit_ts for d in lst.pending_ddls()] == [50, 45]
    assert lst.min_pending_ddl_ts() == 45


def test_keyless_copies_with_rid_are_dropped_exactly() -> None:
    lst, _ = make()
    feed = Feeder(lst)
    feed(resolved_event(10))
    feed(keyless_row(30, 1, rid=1), keyless_row(30, 1, rid=2))  # two identical rows of one transaction
    feed(keyless_row(30, 1, rid=2))  # replayed copy of the second (partial first copies)
    feed(
        keyless_row(30, 1, rid=1), keyless_row(30, 1, rid=2), keyless_row(30, 1, rid=3)
    )  # replay + a new row
    feed(keyless_row(30, 1, rid=1, kind=RowKind.DELETE))  # same rid, other kind: another version
    assert sorted((r.row_id, r.kind) for r in cached(lst)) == [
        (1, RowKind.INSERT),
        (1, RowKind.DELETE),
        (2, RowKind.INSERT),
        (3, RowKind.INSERT),
    ]
    assert lst.stats.rows_replayed == 3


def test_keyless_versions_are_shared_by_the_partitions_and_forgotten_once_applied() -> None:
    from applier.stream.listener import KeylessVersions

    progress = SharedProgress(Checkpoint())
    versions = KeylessVersions()
    p0 = PartitionListener(0, progress, 0, versions)
    p1 = PartitionListener(1, progress, 0, versions)
    p0.feed(0, [keyless_row(30, 1, rid=7)])
    p1.feed(0, [keyless_row(30, 1, rid=7)])  # the key moved partitions (partition count grew)
    assert len(cached(p0)) == 1 and cached(p1) == []
    progress.applied_ts = 30
    p0.discard_applied()
    p1.discard_applied()
    p1.feed(1, [keyless_row(30, 1, rid=7)])  # at or below the applied ts: rule 1
    p1.feed(2, [keyless_row(31, 1, rid=7)])
    assert [r.commit_ts for r in cached(p1)] == [31]


def test_keyless_without_rid_drops_only_byte_identical_records_and_warns_once() -> None:
    from structlog.testing import capture_logs

    lst, _ = make()
    with capture_logs() as logs:
        lst.feed(0, [keyless_row(30, 1), keyless_row(30, 1)], raw=(b"k", b"v1"))
        lst.feed(1, [keyless_row(30, 1)], raw=(b"k", b"v2"))  # another record: a third identical row
        lst.feed(2, [keyless_row(30, 1), keyless_row(30, 1)], raw=(b"k", b"v1"))  # the same bytes again
    assert len(cached(lst)) == 3
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["table"] == "n"


def test_keyed_rows_never_take_the_keyless_path() -> None:
    lst, _ = make()
    lst.feed(0, [keyed_row(30, 1)], raw=(b"k", b"v"))
    lst.feed(1, [keyed_row(30, 1)], raw=(b"k", b"v"))
    assert len(cached(lst)) == 2


# ---------------------------------------------------------------------------- resume offsets


def test_resume_offset_is_the_oldest_unapplied_record_moved_back_to_its_resolved() -> None:
    lst, progress = make(start=0)
    lst.feed(0, [keyed_row(10, 1)])
    lst.feed(1, [resolved_event(10)])
    lst.feed(2, [keyed_row(30, 2)])
    lst.feed(3, [keyed_row(20, 3, table="b")])  # older first copy of another table
    lst.feed(4, [resolved_event(30)])
    lst.feed(5, [ddl_event(40)])
    assert lst.resume_offset() == 0
    # oldest unapplied is row 30 at 2 (row 20 at 3 is applied); resolved 10 in force there is
    # at or below the applied ts: no need to go back
    assert lst.resume_offset(after_applied_ts=20) == 2
    assert lst.resume_offset(after_applied_ts=9) == 0
    # only the DDL at 5 is left; resolved 30 in force there is not above the applied ts
    assert lst.resume_offset(after_applied_ts=30) == 5
    # the DDL and every row applied: the next record
    assert lst.resume_offset(after_applied_ts=39, excluding_ddl=ddl_key(ddl_event(40))) == 6
    progress.applied_ts = 10
    lst.discard_applied()
    assert lst.resume_offset() == 2


def test_a_restart_at_the_resume_offset_drops_the_same_copies() -> None:
    """Rows at or below a resolved ts read before the oldest unapplied record are copies; the
    restarted listener must read that resolved ts again to drop them too."""
    records = [
        [resolved_event(25)],
        [keyless_row(30, 1)],
        [keyless_row(20, 1)],  # a copy (<= 25): dropped by rule 2
        [keyless_row(40, 2)],
        [resolved_event(35)],
    ]
    first, progress = make(Checkpoint(resolved_ts=0), start=0)
    for off, evs in enumerate(records):
        first.feed(off, evs)
    progress.applied_ts = 15
    first.discard_applied()
    resume = first.resume_offset()
    assert resume == 0
    second, _ = make(Checkpoint(resolved_ts=15), start=resume)
    for off, evs in enumerate(records):
        if off >= resume:
            second.feed(off, evs)
    assert [r.commit_ts for r in cached(first)] == [r.commit_ts for r in cached(second)] == [30, 40]


def test_cached_rows_keep_only_the_old_image_columns_planning_reads() -> None:
    """Planning reads only its new image (``sqlgen.update_keeps_key``): the old one would be half
    of the row's memory. Updates that move the key, and keyless ones, keep both images; a keyed
    delete keeps its key columns."""
    lst, _ = make()
    feed = Feeder(lst)
    same = keyed_row(10, 1, "new", kind=RowKind.UPDATE)
    same.old = keyed_row(10, 1, "old").new
    moved = keyed_row(11, 2, "new", kind=RowKind.UPDATE)
    moved.old = keyed_row(11, 1, "old").new
    keyless = keyless_row(12, 1, "new", kind=RowKind.UPDATE)
    keyless.old = keyless_row(12, 1, "old").new
    deleted = keyed_row(13, 3, "gone", kind=RowKind.DELETE)
    keyless_deleted = keyless_row(14, 1, "gone", kind=RowKind.DELETE)
    key_column = deleted.old["id"]
    feed(same, moved, keyless, deleted, keyless_deleted)
    rows = cached(lst)
    assert [r.old is None for r in rows] == [True, False, False, False, False]
    assert [r.new is not None for r in rows] == [True, True, True, False, False]
    # a delete keeps its key columns only; a keyless one keeps its whole image (it names the row)
    assert rows[3].old == {"id": key_column} and list(rows[4].old) == ["a", "b"]
    assert rows[1].old["val"]["v"] == "old" and rows[2].old["b"]["v"] == "old"
    # a keyed row's new values are taken for planning, in column order; keyless rows are planned
    # from their images as they are
    assert [r.new_values for r in rows] == [(1, "new"), (2, "new"), None, None, None]


def test_cached_keyed_rows_hold_compact_new_images_that_read_as_the_decoded_ones() -> None:
    """A keyed row's new image is cached as a tuple of values with a layout shared by the rows of
    its column names, types and flags; a row whose flags changed under the same names (a DDL
    moved the key) gets a layout of its own. Keyless rows keep their images as they are."""
    lst, _ = make()
    feed = Feeder(lst)
    first, second = keyed_row(10, 1, "a"), keyed_row(11, 2, "b")
    decoded = [dict(first.new), dict(second.new)]
    moved = keyed_row(12, 3, "c")
    moved.new = {"id": {**moved.new["id"], "f": 0}, "val": {**moved.new["val"], "f": FLAG_HANDLE_KEY}}
    moved_decoded = dict(moved.new)
    keyless = keyless_row(13, 1)
    retyped = keyed_row(14, 4, "d")  # a DDL changed the type of val
    retyped.new = retyped_decoded = {**retyped.new, "val": {**retyped.new["val"], "t": INT}}
    feed(first, second, moved, keyless, retyped)
    rows = cached(lst)
    assert type(rows[4].new) is CompactImage and rows[4].new == retyped_decoded
    assert rows[4].new.shape.types == (INT, INT) != rows[0].new.shape.types
    assert rows[4].new.shape is not rows[0].new.shape
    rows = rows[:4]
    assert [type(r.new) for r in rows] == [CompactImage, CompactImage, CompactImage, dict]
    assert [rows[0].new, rows[1].new, rows[2].new] == [*decoded, moved_decoded]
    assert rows[0].new.shape is rows[1].new.shape and rows[2].new.shape is not rows[0].new.shape
    assert rows[2].new.shape.key_names == ("val",) and rows[0].new.shape.key_names == ("id",)
    assert rows[1].new["val"] == {"t": decoded[1]["val"]["t"], "f": decoded[1]["val"]["f"], "v": "b"}
    assert list(rows[1].new.items()) == list(decoded[1].items()) and len(rows[1].new) == 2
    assert [r.new_values for r in rows[:3]] == [(1, "a"), (2, "b"), (3, "c")]
    assert not is_keyless(rows[0]) and is_keyless(rows[3])


@pytest.mark.parametrize("mode", sorted(PRODUCER_MODES))
@pytest.mark.parametrize("only_updated_columns", [False, True])
def test_updates_decoded_with_their_old_image_reduced_to_the_key_plan_as_whole_ones(
    mode: str, only_updated_columns: bool
) -> None:
    """The daemon decodes an update's old image reduced to its handle key where the producer sends
    the new image's columns (``decode_record(old_keys_only=True)``): the listener drops it as it
    drops a whole one when the key is kept, keeps it (the key columns) when the key moved, and
    every table plans exactly as from the whole images, for every order a producer sends."""
    sim = simulate(
        StreamConfig(
            seed=5, transactions=150, only_updated_columns=only_updated_columns, **PRODUCER_MODES[mode]
        )
    )
    cached: dict[bool, list[RowEvent]] = {}
    reduced = 0
    for keys_only in (False, True):
        progress = SharedProgress(Checkpoint())
        listeners: dict[int, PartitionListener] = {}
        offsets: dict[int, int] = {}
        for rec in sim.records:
            p = rec.partition
            offset = offsets[p] = offsets.get(p, -1) + 1
            events = decode_record(
                rec.key, rec.value, topic="t", partition=p, offset=offset, old_keys_only=keys_only
            )
            reduced += sum(1 for e in events if type(e) is RowEvent and type(e.old) is CompactImage)
            lst = listeners.get(p)
            if lst is None:
                lst = listeners[p] = PartitionListener(p, progress, offset)
            lst.feed(offset, events, len(rec.value))
        cached[keys_only] = [row for p in sorted(listeners) for row in listeners[p].rows_upto(10**19)]
    whole, keys = cached[False], cached[True]
    assert reduced > 0 or only_updated_columns  # only-updated-columns images never have the new one's columns
    assert [(r.pos, r.commit_ts, r.new, r.old is None) for r in keys] == [
        (r.pos, r.commit_ts, r.new, r.old is None) for r in whole
    ]
    for r, w in zip(keys, whole, strict=True):
        if r.old is not None and type(r.old) is CompactImage:  # a key that moved: its key columns
            assert dict(r.old.items()) == {n: w.old[n] for n in r.old.shape.key_names}
    assert plan_window(keys) == plan_window(whole)


def test_cached_bytes_count_a_reduced_old_image_by_its_columns() -> None:
    """A row's estimate counts the columns it holds: an update's old image reduced to its key
    column counts one (its other columns were never built)."""
    row = keyed_row(10, 1, "new", kind=RowKind.UPDATE)
    whole = keyed_row(10, 1, "old").new
    row.old = whole
    counted_whole = cache_bytes(0, [row])
    shape = ImageShape(("id",), ((INT, whole["id"]["f"]),))
    row.old = CompactImage(shape, (1,))
    assert counted_whole - cache_bytes(0, [row]) == COLUMN_BYTES * (len(whole) - 1)


def test_an_update_that_moves_its_key_keeps_its_reduced_old_image() -> None:
    """An update sent whole that moves its key (TiCDC splits such updates, but be safe) keeps the
    old key columns the decoder reduced its old image to: planning deletes the old key."""
    row = {"id": {"t": INT, "h": True, "f": 11, "v": 1}, "k": {"t": INT, "f": 1, "v": 7}}
    moved = {**row, "id": {**row["id"], "v": 2}}
    kept = {**moved, "k": {**row["k"], "v": 8}}
    values = [{"u": row}, {"u": moved, "p": row}, {"u": kept, "p": moved}]
    key, value = record(
        *[({"ts": 10 + i, "scm": "db", "tbl": "tb", "t": 1}, v) for i, v in enumerate(values)]
    )
    plans = []
    for keys_only in (False, True):
        lst, _ = make()
        lst.feed(
            0,
            decode_record(key, value, topic="t", partition=0, offset=0, old_keys_only=keys_only),
            len(value),
        )
        rows = cached(lst)
        assert [r.old is None for r in rows] == [True, False, True]
        assert rows[1].old["id"]["v"] == 1 and (type(rows[1].old) is CompactImage) == keys_only
        plans.append(plan_window(rows))
    assert plans[0] == plans[1]
    (tp,) = plans[1].tables.values()
    assert [g.keys for g in tp.deletes] == [[(1,)]]

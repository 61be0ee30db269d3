"""Barrier: global resolved ts, DDL ordering, windows, back-pressure, and restart without loss."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codec.events import (
    FLAG_HANDLE_KEY,
    FLAG_NULLABLE,
    FLAG_PRIMARY_KEY,
    DDLEvent,
    Event,
    Position,
    ResolvedEvent,
    RowEvent,
    RowKind,
)
from applier.stream.barrier import Barrier, StaleWindowError
from applier.stream.progress import ddl_key
from applier.stream.window import Window, is_keyless
from checkpoint import Checkpoint
from tests.builders import ddl_event, keyed_row, keyless_row, position, resolved_event


class Feeds:
    """Feeds records to a barrier with per-partition increasing offsets."""

    def __init__(self, barrier: Barrier) -> None:
        self.barrier = barrier
        self.next: dict[int, int] = {p: 0 for p in barrier.listeners}

    def __call__(self, partition: int, *events: Event, nbytes: int = 0) -> int:
        off = self.next[partition]
        self.barrier.feed(partition, off, list(events), nbytes)
        self.next[partition] = off + 1
        return off

    def broadcast(self, event: Event) -> None:
        for p in self.next:
            self(p, event)


def ids(window: Window) -> list[tuple[int, int]]:
    return sorted((r.commit_ts, (r.new or r.old)["id"]["v"]) for r in window.rows)


def drain(barrier: Barrier, **kwargs) -> list[Window]:
    out = []
    while (w := barrier.next_window(**kwargs)) is not None:
        out.append(w)
        barrier.mark_applied(w)
    return out


# ---------------------------------------------------------------------------- global resolved


def test_global_resolved_is_the_minimum_over_all_partitions() -> None:
    b = Barrier([0, 1, 2], Checkpoint(resolved_ts=5))
    f = Feeds(b)
    assert b.global_resolved() == 5
    f(0, resolved_event(30))
    f(1, resolved_event(20))
    assert b.global_resolved() == 5  # partition 2 has said nothing yet
    assert b.holding_back() == 2
    f(2, resolved_event(40))
    assert b.global_resolved() == 20
    assert b.holding_back() == 1


def test_window_holds_only_rows_at_or_below_global_resolved() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(25, 2))
    f(1, keyed_row(15, 3), keyed_row(30, 4))
    f(0, resolved_event(28))
    assert b.next_window() is None  # partition 1 has no resolved yet
    f(1, resolved_event(20))
    w = b.next_window()
    assert w is not None
    assert w.target_ts == 20 and w.base_ts == 0
    assert ids(w) == [(10, 1), (15, 3)]
    assert w.resolved == {0: 28, 1: 20}
    assert w.tables == frozenset({("db", "k")})
    assert w.ddl is None
    b.mark_applied(w)
    assert b.applied_ts == 20
    assert b.next_window() is None
    f(1, resolved_event(35))
    w = b.next_window()
    assert w is not None and w.target_ts == 28 and ids(w) == [(25, 2)]


def test_next_window_does_not_change_state_until_marked_applied() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1), nbytes=100)
    f(0, resolved_event(10))
    first = b.next_window()
    again = b.next_window()
    assert first == again
    assert b.total_cached_bytes() == 100
    assert b.applied_ts == 0
    b.mark_applied(first)
    assert b.total_cached_bytes() == 0
    with pytest.raises(StaleWindowError):
        b.mark_applied(again)


def test_empty_window_moves_the_applied_ts_and_the_resume_offsets() -> None:
    b = Barrier([0], Checkpoint(offsets={0: 7}))
    b.listener(0).feed(7, [resolved_event(10)])
    w = b.next_window()
    assert w is not None and w.is_empty and w.target_ts == 10
    assert w.resume_offsets == {0: 8}
    assert b.listener(0).resume_offset(after_applied_ts=9) == 7  # resolved 10 still above: re-read it
    b.mark_applied(w)
    b.listener(0).feed(8, [resolved_event(12)])
    w = b.next_window()
    assert w is not None and w.resume_offsets == {0: 9}


def test_rows_come_back_in_ts_order_per_partition_and_partitions_concatenated() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(1, keyed_row(12, 1, table="a"), keyed_row(11, 2, table="b"))
    f(0, keyed_row(14, 3, table="a"), keyed_row(13, 4, table="b"))
    f.broadcast(resolved_event(20))
    w = b.next_window()
    assert [r.commit_ts for r in w.rows] == [13, 14, 11, 12]


# ---------------------------------------------------------------------------- DDL


def test_ddl_waits_for_the_watermark_then_rows_before_ddl_rows_after() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(10, 1))
    f(0, ddl_event(50))
    f(0, keyed_row(60, 2))
    f(0, resolved_event(70))
    f(1, keyed_row(20, 3))
    f(1, resolved_event(40))
    # The watermark (40) has not reached the DDL: rows up to 40 only.
    w = b.next_window()
    assert w.target_ts == 40 and ids(w) == [(10, 1), (20, 3)]
    b.mark_applied(w)
    f(1, keyed_row(45, 4))
    assert b.next_window() is None  # 45 not resolved on partition 1 yet
    f(1, ddl_event(50))
    f(1, keyed_row(55, 5))
    f(1, resolved_event(70))
    steps = drain(b)
    assert [(w.target_ts, w.ddl is not None, ids(w)) for w in steps] == [
        (49, False, [(45, 4)]),
        (49, True, []),
        (70, False, [(55, 5), (60, 2)]),
    ]
    assert steps[1].ddl.query == "ALTER TABLE k ADD COLUMN c INT"
    assert steps[1].tables == frozenset({("db", "k")})


def test_rows_after_a_pending_ddl_wait_even_when_resolved_is_past_it() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, ddl_event(50))
    f(0, keyed_row(60, 1))
    f(0, resolved_event(80))
    f(1, resolved_event(80))  # partition 1 reached 50 without the DDL (a resolved past it counts)
    steps = drain(b)
    assert [(w.target_ts, w.ddl is not None, ids(w)) for w in steps] == [
        (49, True, []),
        (80, False, [(60, 1)]),
    ]


def test_ddl_broadcast_to_all_partitions_runs_once() -> None:
    b = Barrier([0, 1, 2])
    f = Feeds(b)
    f.broadcast(ddl_event(50))
    f(0, ddl_event(50))  # a replayed copy as well
    assert drain(b) == []  # not before the watermark reaches it
    f.broadcast(resolved_event(50))
    steps = drain(b)
    assert [w.ddl is not None for w in steps] == [True, False]
    assert b.applied_ts == 50
    f(1, ddl_event(50))  # replayed after it ran
    assert drain(b) == []
    assert all(lst.pending_ddls() == [] for lst in b.listeners.values())


def test_ddl_applied_per_checkpoint_is_skipped() -> None:
    done = ddl_event(50)
    b = Barrier([0, 1], Checkpoint(resolved_ts=49, applied_ddls=frozenset({ddl_key(done)})))
    f = Feeds(b)
    f.broadcast(ddl_event(50))
    f(0, keyed_row(55, 1))
    f.broadcast(resolved_event(60))
    steps = drain(b)
    assert [(w.ddl is not None, ids(w)) for w in steps] == [(False, [(55, 1)])]


def test_ddls_sharing_a_commit_ts_run_in_arrival_order() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    for p in (0, 1):
        f(p, ddl_event(50, "RENAME TABLE a TO b", "a"))
        f(p, ddl_event(50, "RENAME TABLE c TO d", "c"))
    f.broadcast(resolved_event(50))
    steps = drain(b)
    assert [w.ddl.query for w in steps if w.ddl] == ["RENAME TABLE a TO b", "RENAME TABLE c TO d"]
    assert [w.target_ts for w in steps] == [49, 49, 50]


def test_resume_offsets_keep_unapplied_ddl_and_rows() -> None:
    b = Barrier([0, 1], Checkpoint(offsets={0: 0, 1: 0}))
    f = Feeds(b)
    f(0, resolved_event(5))  # 0
    f(0, keyed_row(10, 1))  # 1
    f(0, ddl_event(50))  # 2
    f(1, resolved_event(5))  # 0
    f(1, keyed_row(20, 2))  # 1
    f(1, resolved_event(30))  # 2
    f(0, resolved_event(30))  # 3
    w = b.next_window()
    assert w.target_ts == 30
    # p0: the DDL at 2 is still to run (resolved 5 in force there is applied) -> 2;
    # p1: nothing left -> the next record
    assert w.resume_offsets == {0: 2, 1: 3}
    b.mark_applied(w)
    assert b.resume_offsets() == w.resume_offsets
    f(1, ddl_event(50))  # 3
    assert b.next_window() is None  # the watermark is below the DDL
    f.broadcast(resolved_event(60))  # 4, 4
    w = b.next_window()
    assert w.ddl is not None
    # nothing left but rows <= 60 are not applied yet: re-read resolved 60 (above 49)
    assert w.resume_offsets == {0: 4, 1: 4}
    b.mark_applied(w)
    state = b.checkpoint()
    assert state == Checkpoint(resolved_ts=49, applied_ddls={ddl_key(ddl_event(50))}, offsets={0: 4, 1: 4})
    w = b.next_window()
    assert w.is_empty and w.target_ts == 60 and w.resume_offsets == {0: 5, 1: 5}


def test_rows_of_other_tables_below_a_ddl_that_arrive_after_it_are_applied_before_it() -> None:
    """New architecture: ALTER TABLE k waits for k's rows only; a row of table "o" below the
    DDL's ts may follow the DDL on a partition (docs/open-protocol.md §5.4)."""
    b = Barrier([0, 1])
    f = Feeds(b)
    f.broadcast(ddl_event(50))
    f(0, keyed_row(45, 1, table="o"))
    f(1, keyed_row(48, 2, table="o"))
    f.broadcast(resolved_event(60))
    steps = drain(b)
    assert [(w.target_ts, w.ddl is not None, ids(w)) for w in steps] == [
        (49, False, [(45, 1), (48, 2)]),
        (49, True, []),
        (60, False, []),
    ]


def test_ddls_arriving_out_of_ts_order_run_in_ts_order() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f.broadcast(ddl_event(60, "CREATE TABLE z (id INT PRIMARY KEY)", "z"))  # written at once
    f.broadcast(ddl_event(50))  # waited for table k's rows
    f(0, keyed_row(55, 1))
    f.broadcast(resolved_event(70))
    steps = drain(b)
    assert [(w.target_ts, w.ddl.commit_ts if w.ddl else None, ids(w)) for w in steps] == [
        (49, 50, []),
        (59, None, [(55, 1)]),
        (59, 60, []),
        (70, None, []),
    ]


def test_an_empty_partition_does_not_hold_the_watermark_until_it_delivers() -> None:
    b = Barrier([0, 1, 2])
    f = Feeds(b)
    f(0, keyed_row(10, 1))
    f(0, resolved_event(20))
    f(1, resolved_event(30))
    assert b.global_resolved() == 0
    b.set_empty(2, True)  # read to its end: it never held a record
    assert b.global_resolved() == 20 and b.holding_back() == 0
    drain(b)
    assert b.applied_ts == 20
    b.set_empty(2, False)  # its first record is coming
    f(2, keyed_row(25, 2))
    assert b.global_resolved() == 20 and b.next_window() is None
    f.broadcast(resolved_event(40))
    assert ids(drain(b)[0]) == [(25, 2)]


def test_a_rejoining_partition_with_rows_the_watermark_passed_stops_instead_of_skipping_them() -> None:
    from applier.stream.listener import RowsBehindWatermark

    b = Barrier([0, 1])
    f = Feeds(b)
    b.set_empty(1, True)
    f(0, resolved_event(20))
    drain(b)
    b.set_empty(1, False)
    with pytest.raises(RowsBehindWatermark, match=r"partition 0 offset 0: .* at commit ts 15 .* up to ts 20"):
        f(1, keyed_row(25, 1), keyed_row(15, 2))  # fetched late: 15 was passed by the watermark
    assert b.listener(1).cached_rows == 0  # nothing of the record was taken
    b.listener(1).feed(1, [resolved_event(30)])  # after its first resolved ts, rule 2 covers copies
    b.listener(1).feed(2, [keyed_row(10, 3)])
    assert b.listener(1).stats.rows_skipped == 1


def test_a_partition_added_while_running_holds_the_watermark_until_its_resolved() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(30, 2))
    f(0, resolved_event(20))
    assert ids(drain(b)[0]) == [(10, 1)]
    b.add_partition(1, 0)
    assert sorted(b.listeners) == [0, 1]
    f.next[1] = 0
    f(0, resolved_event(40))
    assert b.next_window() is None  # partition 1 has said nothing: the watermark stays at 20
    b.listener(1).feed(0, [keyed_row(35, 3)])  # a key re-hashed to the new partition
    b.listener(1).feed(1, [resolved_event(40)])
    w = b.next_window()
    assert w.target_ts == 40 and ids(w) == [(30, 2), (35, 3)]
    with pytest.raises(ValueError):
        b.add_partition(1)


# ---------------------------------------------------------------------------- merge, max_rows, chunks


def _three_transactions() -> Barrier:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(10, 2), keyed_row(20, 3))
    f(1, keyed_row(10, 4), keyed_row(30, 5))
    f.broadcast(resolved_event(40))
    return b


def test_merge_takes_everything_up_to_global_resolved() -> None:
    steps = drain(_three_transactions())
    assert [(w.target_ts, len(w.rows)) for w in steps] == [(40, 5)]


def test_unmerged_windows_take_one_commit_ts_each() -> None:
    steps = drain(_three_transactions(), merge=False)
    assert [(w.target_ts, ids(w)) for w in steps] == [
        (10, [(10, 1), (10, 2), (10, 4)]),
        (20, [(20, 3)]),
        (40, [(30, 5)]),
    ]


def test_max_rows_takes_whole_transactions() -> None:
    steps = drain(_three_transactions(), max_rows=4)
    assert [(w.target_ts, len(w.rows)) for w in steps] == [(20, 4), (40, 1)]
    steps = drain(_three_transactions(), max_rows=2)  # ts 10 alone has 3 rows: never split
    assert [(w.target_ts, len(w.rows)) for w in steps] == [(10, 3), (40, 2)]


# ---------------------------------------------------------------------------- back-pressure


def test_pause_partitions_ahead_when_over_the_limit_and_resume_with_hysteresis() -> None:
    b = Barrier([0, 1, 2])
    f = Feeds(b)
    f(0, keyed_row(10, 1), keyed_row(20, 2), nbytes=600)
    f(0, resolved_event(50))
    f(1, keyed_row(15, 3), nbytes=300)
    f(1, resolved_event(40))
    f(2, resolved_event(12))
    assert b.total_cached_bytes() == 900
    assert b.holding_back() == 2
    assert b.partitions_to_pause(1000) == set()
    assert b.partitions_to_pause(800) == {0, 1}
    paused = {0, 1}
    assert b.partitions_to_resume(paused, 800) == set()  # still ahead, still over 80 %
    f(2, resolved_event(45))
    assert b.holding_back() == 1
    assert b.partitions_to_resume(paused, 2000) == {0, 1}  # below 80 % of the limit
    b.mark_applied(b.next_window())  # applies up to 40: rows 10, 15, 20
    assert b.total_cached_bytes() == 0
    assert b.partitions_to_resume(paused, 800) == {0, 1}


def test_resume_partitions_no_longer_ahead_even_when_over_the_limit() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed_row(60, 1), nbytes=1000)
    f(0, resolved_event(50))
    f(1, resolved_event(10))
    assert b.partitions_to_pause(500) == {0}
    f(1, resolved_event(50))
    assert b.total_cached_bytes() == 1000  # row 60 cannot be released yet
    assert b.partitions_to_resume({0}, 500) == {0}


def test_mark_applied_refuses_a_window_built_on_another_state() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed_row(10, 1))
    f(0, resolved_event(10))
    w1 = b.next_window()
    f(0, keyed_row(20, 2))
    f(0, resolved_event(20))
    w2 = b.next_window()
    b.mark_applied(w2)
    with pytest.raises(StaleWindowError):
        b.mark_applied(w1)


def test_large_message_propagates_through_the_barrier() -> None:
    from applier.codec.events import LargeMessageEvent
    from applier.large_messages.errors import LargeMessageNotConfigured

    b = Barrier([0])
    big = LargeMessageEvent(20, "db", "k", False, "s3://x", None, Position("topic", 0, 3, 0))
    with pytest.raises(LargeMessageNotConfigured) as err:
        b.feed(0, 3, [big])
    assert err.value.position.offset == 3


# ---------------------------------------------------------------------------- property: no loss, no duplicate


TABLES = ("k1", "k2", "n1", "n2")  # k* keyed, n* keyless


@dataclass
class Stream:
    partitions: int
    records: dict[int, list[list[Event]]]
    rows: list[RowEvent]  # every upstream row once (ground truth)
    ddls: list[tuple[int, str]]


def _row(rnd: random.Random, ts: int, table: str, key: int, rid: int) -> RowEvent:
    kind = rnd.choice([RowKind.INSERT, RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE])
    if table.startswith("k"):
        new = {
            "id": {"t": 3, "f": FLAG_HANDLE_KEY | FLAG_PRIMARY_KEY, "v": key},
            "v": {"t": 3, "f": 0, "v": ts},
        }
        old = {
            "id": {"t": 3, "f": FLAG_HANDLE_KEY | FLAG_PRIMARY_KEY, "v": key},
            "v": {"t": 3, "f": 0, "v": 0},
        }
        rid = key
    else:  # tiny value domain so identical keyless rows are common; rid tells them apart
        kind = rnd.choice([RowKind.INSERT, RowKind.DELETE])
        new = {"a": {"t": 3, "f": FLAG_NULLABLE, "v": key}}
        old = dict(new)
    if kind is RowKind.INSERT:
        return RowEvent(ts, "db", table, kind, new, None, None, position(), rid)
    if kind is RowKind.DELETE:
        return RowEvent(ts, "db", table, kind, None, old, None, position(), rid)
    return RowEvent(ts, "db", table, kind, new, old, None, position(), rid)


def make_stream(seed: int) -> Stream:
    """A producer model that sends what docs/open-protocol.md §5 allows, and nothing kinder.

    - Each table span writes its rows in ts order; spans are independent: table k1 has two
      physical partitions (spans by key parity), so one table's rows interleave out of ts order.
    - A written record is now and then held back ("failed produce") and delivered after later
      records of its partition, followed by copies of those later records (B, A, B).
    - A DDL waits only for the table it blocks (k1's spans): rows of other tables below its ts may
      follow it; two DDLs in a row may be broadcast in the opposite ts order.
    - A resolved R is broadcast once every first copy <= R is delivered.
    - A crash loses the unwritten batches; the new session restarts from a resolved ts already
      broadcast (optionally re-broadcasting it first) and resends everything above it.
    Keyless rows carry rid (the classic architecture): identical rows differ by rid.
    """
    rnd = random.Random(seed)
    nparts = rnd.randint(1, 3)
    items: list[tuple[int, list[RowEvent] | list[str]]] = []
    truth_rows: list[RowEvent] = []
    truth_ddls: list[tuple[int, str]] = []
    ts = 100
    next_rid = 1000
    for _ in range(rnd.randint(1, 18)):
        ts += rnd.randint(1, 3)
        if rnd.random() < 0.12:
            queries = [f"ALTER TABLE k1 ADD COLUMN c{ts}"]
            if rnd.random() < 0.3:
                queries.append(f"RENAME TABLE x{ts} TO y{ts}")
            items.append((ts, queries))
            truth_ddls.extend((ts, q) for q in queries)
            continue
        rows = []
        used: set[tuple[str, int]] = set()
        for _ in range(rnd.randint(1, 5)):
            table = rnd.choice(TABLES)
            key = rnd.randint(1, 3)
            if table.startswith("k") and (table, key) in used:
                continue  # one event per row per transaction
            used.add((table, key))
            next_rid += 1
            rows.append(_row(rnd, ts, table, key, next_rid))
            if table.startswith("n") and rnd.random() < 0.3:
                next_rid += 1
                rows.append(replace(rows[-1], row_id=next_rid))  # an identical second row
        items.append((ts, rows))
        truth_rows.extend(rows)

    # A row goes to the same partition in every session (replays included).
    keyless_partition = {r.row_id: rnd.randrange(nparts) for r in truth_rows if not r.table.startswith("k")}

    def partition_of(row: RowEvent) -> int:
        if row.table.startswith("k"):  # index-value dispatcher
            return (row.new or row.old)["id"]["v"] % nparts
        return keyless_partition[row.row_id]

    def span_of(row: RowEvent) -> tuple[int, str, int]:
        physical = (row.new or row.old)["id"]["v"] % 2 if row.table == "k1" else 0
        return (partition_of(row), row.table, physical)

    records: dict[int, list[list[Event]]] = {p: [] for p in range(nparts)}
    buf: dict[int, list[Event]] = {p: [] for p in range(nparts)}
    held: dict[int, list[list[Event]]] = {p: [] for p in range(nparts)}  # failed produce, delivered late
    after_held: dict[int, list[list[Event]]] = {p: [] for p in range(nparts)}
    queues: dict[tuple[int, str, int], list[RowEvent]] = {}
    history: list[int] = []  # resolved ts broadcast so far (checkpoints a session may restart from)

    def deliver(p: int, record: list[Event]) -> None:
        records[p].append(record)
        if held[p]:
            after_held[p].append(record)

    def release_held(p: int) -> None:
        """The failed batches arrive (first copies), then the records sent meanwhile once more."""
        for record in held[p]:
            records[p].append(record)
        for record in after_held[p]:
            records[p].append(list(record))
        held[p], after_held[p] = [], []

    def close(p: int) -> None:
        if buf[p]:
            if rnd.random() < 0.15:
                held[p].append(buf[p])
            else:
                deliver(p, buf[p])
            buf[p] = []

    def emit_one(spans: list[tuple[int, str, int]]) -> None:
        key = rnd.choice(spans)
        p = key[0]
        buf[p].append(queues[key].pop(0))
        if len(buf[p]) >= rnd.randint(1, 4):
            close(p)

    def flush(table: str | None = None) -> None:
        """Deliver every queued row (of ``table`` only, if given), held batches included."""
        while spans := sorted(k for k, q in queues.items() if q and (table is None or k[1] == table)):
            emit_one(spans)
        for p in records:
            close(p)
            if rnd.random() < 0.5 or table is None:
                release_held(p)

    def frontier(now: int) -> int:
        """Every first copy <= this was delivered: the resolved ts the producer may broadcast."""
        heads = [q[0].commit_ts for q in queues.values() if q]
        heads += [ev.commit_ts for p in records for rec in [buf[p], *held[p]] for ev in rec]
        return min(heads) - 1 if heads else now

    def broadcast_ddl(ts: int, queries: list[str]) -> None:
        flush("k1")  # blocked table only: others may deliver rows below ts after the DDL
        for p in records:
            close(p)
            release_held(p)
            for q in queries:
                deliver(p, [DDLEvent(ts, "db", "k1", q, 5, position(p))])

    crashes = 0
    last_resolved = -1  # of this session: resolved ts never goes back inside one session
    waiting_ddl: tuple[int, list[str]] | None = None
    i = 0
    while i < len(items):
        ts, payload = items[i]
        i += 1
        if payload and isinstance(payload[0], str):
            if waiting_ddl is None and rnd.random() < 0.3 and i < len(items):
                waiting_ddl = (ts, payload)  # broadcast after the next DDL, if there is one
                continue
            broadcast_ddl(ts, payload)  # type: ignore[arg-type]
            if waiting_ddl is not None:
                broadcast_ddl(*waiting_ddl)  # out of ts order
                waiting_ddl = None
        else:
            if waiting_ddl is not None and rnd.random() < 0.5:
                broadcast_ddl(*waiting_ddl)
                waiting_ddl = None
            for row in payload:
                queues.setdefault(span_of(row), []).append(row)  # type: ignore[arg-type]
            for _ in range(rnd.randint(0, 3)):
                if spans := sorted(k for k, q in queues.items() if q):
                    emit_one(spans)
        if rnd.random() < 0.4 and waiting_ddl is None:
            # Resolved ts lag behind: rows above them may already be delivered.
            for p in records:
                close(p)
                if rnd.random() < 0.5:
                    release_held(p)
            top = frontier(ts)
            if top > last_resolved:
                r = rnd.randint(max(last_resolved + 1, top - 4), top)
                for p in records:
                    deliver(p, [ResolvedEvent(r, position(p))])
                history.append(r)
                last_resolved = r
        if crashes < 3 and history and waiting_ddl is None and rnd.random() < 0.2:
            crashes += 1
            c = rnd.choice(history[-3:])
            buf = {p: [] for p in records}  # unwritten and failed batches are lost
            held = {p: [] for p in records}
            after_held = {p: [] for p in records}
            queues.clear()
            if rnd.random() < 0.5:
                for p in records:
                    deliver(p, [ResolvedEvent(c, position(p))])
            i = next((j for j, item in enumerate(items) if item[0] > c), len(items))
            last_resolved = c
    if waiting_ddl is not None:
        broadcast_ddl(*waiting_ddl)
    flush()
    for p in records:
        deliver(p, [ResolvedEvent(ts + 1, position(p))])
    return Stream(nparts, records, truth_rows, truth_ddls)


def content(row: RowEvent) -> tuple:
    img = lambda i: None if i is None else tuple((n, c["v"]) for n, c in i.items())  # noqa: E731
    return (row.commit_ts, row.table, int(row.kind), img(row.new), img(row.old))


@dataclass
class Applied:
    windows: list[Window] = field(default_factory=list)
    snapshots: list[Checkpoint] = field(default_factory=list)  # after each window


def start_consuming(
    stream: Stream, state: Checkpoint, start: dict[int, int] | None
) -> tuple[Barrier, dict[int, int], Applied]:
    """Where every consumer of these tests begins: a barrier over the stream's partitions resumed
    from ``state``, the next record to read of each partition (``start``, else the first) and an
    empty record of what was applied."""
    return Barrier(range(stream.partitions), state), dict(start or {p: 0 for p in stream.records}), Applied()


def check_window(barrier: Barrier, w: Window) -> None:
    """What every window the barrier hands out holds, built ahead or not: nothing above the global
    resolved ts, rows only inside its ts range, and a DDL alone, right after everything below it."""
    assert w.target_ts <= barrier.global_resolved()
    assert all(w.base_ts < r.commit_ts <= w.target_ts for r in w.rows)
    if w.ddl is not None:
        assert not w.rows and w.target_ts == w.ddl.commit_ts - 1


def consume(
    stream: Stream, state: Checkpoint, rnd: random.Random, start: dict[int, int] | None = None
) -> Applied:
    """Feed the stream like the Kafka loop (random interleaving of partitions, random apply points)."""
    barrier, cursor, out = start_consuming(stream, state, start)

    def apply_some(everything: bool) -> None:
        while True:
            kwargs = rnd.choice([{}, {"merge": False}, {"max_rows": rnd.randint(1, 4)}])
            w = barrier.next_window(**kwargs)
            if w is None:
                return
            check_window(barrier, w)
            barrier.mark_applied(w)
            assert barrier.resume_offsets() == w.resume_offsets
            out.windows.append(w)
            out.snapshots.append(barrier.checkpoint())
            if not everything and rnd.random() < 0.5:
                return

    while True:
        left = [p for p in stream.records if cursor[p] < len(stream.records[p])]
        if not left:
            break
        p = rnd.choice(left)
        barrier.feed(p, cursor[p], stream.records[p][cursor[p]], 10)
        cursor[p] += 1
        if rnd.random() < 0.3:
            apply_some(False)
    apply_some(True)
    assert barrier.total_cached_bytes() == 0
    assert all(lst.cached_rows == 0 and not lst.pending_ddls() for lst in barrier.listeners.values())
    return out


def check_order(windows: list[Window], base: int) -> None:
    """Windows are contiguous in ts; a DDL runs when everything below it is applied."""
    for w in windows:
        assert w.base_ts == base
        base = w.target_ts


def assert_every_row_once(stream: Stream, windows: list[Window]) -> None:
    """The windows hold every row of the stream once (keyless rows as a multiset) and its DDLs in order."""
    keyless_rows, keyed_rows, ddls = summary(windows)
    assert keyless_rows == Counter(content(r) for r in stream.rows if is_keyless(r))
    assert keyed_rows == {content(r) for r in stream.rows if not is_keyless(r)}
    assert ddls == stream.ddls


def summary(windows: list[Window]) -> tuple[Counter, set, list]:
    """Keyless rows as a multiset (exactly once); keyed rows as a set, each in one window only
    (an identical keyed copy in the same window is harmless); DDLs in execution order."""
    keyless_rows: Counter = Counter()
    keyed_rows: set = set()
    for w in windows:
        in_window = set()
        for r in w.rows:
            c = content(r)
            if is_keyless(r):
                keyless_rows[c] += 1
            else:
                assert c not in keyed_rows, f"keyed row {c} applied in two windows"
                in_window.add(c)
        keyed_rows |= in_window
    ddls = [(w.ddl.commit_ts, w.ddl.query) for w in windows if w.ddl is not None]
    return keyless_rows, keyed_rows, ddls


def run_once_and_pick_a_crash(seed: int, rnd: random.Random, cut: float, consume_with) -> tuple:
    """The stream of ``seed`` consumed from the start (every row once, windows in order), and the
    window after which the property tests crash: (stream, run, k), k = 0 for no crash."""
    stream = make_stream(seed)
    start = Checkpoint(resolved_ts=0, offsets={p: 0 for p in stream.records})
    run = consume_with(stream, start, rnd)
    check_order(run.windows, 0)
    assert_every_row_once(stream, run.windows)
    return stream, run, int(cut * len(run.windows))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), consumer_seed=st.integers(0, 2**32 - 1), cut=st.floats(0, 1))
def test_every_row_applied_once_and_restart_from_any_checkpoint_reproduces_the_rest(
    seed: int, consumer_seed: int, cut: float
) -> None:
    rnd = random.Random(consumer_seed)
    stream, run, k = run_once_and_pick_a_crash(seed, rnd, cut, consume)
    if k == 0:
        return
    # Crash after window k (the checkpoint was written with it), restart from its checkpoint.
    state = run.snapshots[k - 1]
    assert state.offsets == run.windows[k - 1].resume_offsets
    rerun = consume(stream, state, rnd, start=dict(state.offsets))
    check_order(rerun.windows, state.resolved_ts)
    assert summary(rerun.windows) == summary(run.windows[k:])


def test_keyless_rows_with_rid_replayed_from_the_last_and_last_but_one_resolved_apply_exactly_once() -> None:
    """Replays that restart at the last resolved ts and at the one before it, one of them after a
    partial first copy of a transaction: the keyless multiset downstream is exact."""
    b = Barrier([0, 1])
    f = Feeds(b)

    def rows(ts: int, rids: list[int]) -> list[RowEvent]:
        return [replace(keyless_row(ts, 1), row_id=r) for r in rids]  # identical images, distinct rids

    f.broadcast(resolved_event(10))
    f(0, *rows(12, [1, 2]))
    f(1, *rows(15, [3]))
    f.broadcast(resolved_event(20))
    f(0, *rows(22, [4]))  # partial first copy of transaction 22 (rid 5 not sent yet)
    # restart from the last resolved ts (20): everything above it again, complete this time
    f(0, resolved_event(20))
    f(0, *rows(22, [4, 5]))
    f(1, *rows(25, [6, 7]))
    # restart from the last-but-one resolved ts (10): copies at or below 20 and above it
    f.broadcast(resolved_event(10))
    f(0, *rows(12, [1, 2]))
    f(1, *rows(15, [3]))
    f(0, *rows(22, [4, 5]))
    f(1, *rows(25, [6, 7]))
    f.broadcast(resolved_event(30))
    applied = Counter((r.commit_ts, r.row_id) for w in drain(b) for r in w.rows)
    assert applied == Counter(
        {(12, 1): 1, (12, 2): 1, (15, 3): 1, (22, 4): 1, (22, 5): 1, (25, 6): 1, (25, 7): 1}
    )

"""Barrier: global resolved ts, DDL ordering, windows, back-pressure, and restart without loss."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.barrier import Barrier, StaleWindowError
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
from applier.progress import CheckpointState, ddl_key
from applier.window import Window, is_keyless


def _pos(partition: int = 0) -> Position:
    return Position("topic", partition, 0, 0)


def keyed(ts: int, key: int, value: str = "v", table: str = "k", kind: RowKind = RowKind.INSERT) -> RowEvent:
    image = {
        "id": {"t": 3, "f": FLAG_HANDLE_KEY | FLAG_PRIMARY_KEY, "v": key},
        "val": {"t": 15, "f": FLAG_NULLABLE, "v": value},
    }
    if kind is RowKind.DELETE:
        return RowEvent(ts, "db", table, kind, None, image, None, _pos())
    return RowEvent(ts, "db", table, kind, image, None, None, _pos())


def keyless(ts: int, a: int, b: str = "x", table: str = "n", kind: RowKind = RowKind.INSERT) -> RowEvent:
    image = {"a": {"t": 3, "f": FLAG_NULLABLE, "v": a}, "b": {"t": 15, "f": FLAG_NULLABLE, "v": b}}
    if kind is RowKind.DELETE:
        return RowEvent(ts, "db", table, kind, None, image, None, _pos())
    return RowEvent(ts, "db", table, kind, image, None, None, _pos())


def resolved(ts: int) -> ResolvedEvent:
    return ResolvedEvent(ts, _pos())


def ddl(ts: int, query: str = "ALTER TABLE k ADD COLUMN c INT", table: str = "k") -> DDLEvent:
    return DDLEvent(ts, "db", table, query, 5, _pos())


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
    b = Barrier([0, 1, 2], CheckpointState(applied_ts=5))
    f = Feeds(b)
    assert b.global_resolved() == 5
    f(0, resolved(30))
    f(1, resolved(20))
    assert b.global_resolved() == 5  # partition 2 has said nothing yet
    assert b.holding_back() == 2
    f(2, resolved(40))
    assert b.global_resolved() == 20
    assert b.holding_back() == 1


def test_window_holds_only_rows_at_or_below_global_resolved() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed(10, 1), keyed(25, 2))
    f(1, keyed(15, 3), keyed(30, 4))
    f(0, resolved(28))
    assert b.next_window() is None  # partition 1 has no resolved yet
    f(1, resolved(20))
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
    f(1, resolved(35))
    w = b.next_window()
    assert w is not None and w.target_ts == 28 and ids(w) == [(25, 2)]


def test_next_window_does_not_change_state_until_marked_applied() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed(10, 1), nbytes=100)
    f(0, resolved(10))
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
    b = Barrier([0], CheckpointState(offsets={0: 7}))
    b.listener(0).feed(7, [resolved(10)])
    w = b.next_window()
    assert w is not None and w.is_empty and w.target_ts == 10
    assert w.resume_offsets == {0: 7}  # the resolved record is the detection horizon
    b.mark_applied(w)
    b.listener(0).feed(8, [resolved(12)])
    w = b.next_window()
    assert w is not None and w.resume_offsets == {0: 8}


def test_rows_come_back_in_ts_order_per_partition_and_partitions_concatenated() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(1, keyed(12, 1, table="a"), keyed(11, 2, table="b"))
    f(0, keyed(14, 3, table="a"), keyed(13, 4, table="b"))
    f.broadcast(resolved(20))
    w = b.next_window()
    assert [r.commit_ts for r in w.rows] == [13, 14, 11, 12]


# ---------------------------------------------------------------------------- DDL


def test_ddl_waits_for_every_partition_then_rows_before_ddl_rows_after() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed(10, 1))
    f(0, ddl(50))
    f(0, keyed(60, 2))
    f(0, resolved(70))
    f(1, keyed(20, 3))
    f(1, resolved(40))
    # Partition 1 has not reached the DDL: rows up to 40 only.
    w = b.next_window()
    assert w.target_ts == 40 and ids(w) == [(10, 1), (20, 3)]
    b.mark_applied(w)
    f(1, keyed(45, 4))
    assert b.next_window() is None  # 45 not resolved on partition 1 yet
    f(1, ddl(50))
    f(1, keyed(55, 5))
    f(1, resolved(70))
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
    f(0, ddl(50))
    f(0, keyed(60, 1))
    f(0, resolved(80))
    f(1, resolved(80))  # partition 1 reached 50 without the DDL (a resolved past it counts)
    steps = drain(b)
    assert [(w.target_ts, w.ddl is not None, ids(w)) for w in steps] == [
        (49, True, []),
        (80, False, [(60, 1)]),
    ]


def test_ddl_broadcast_to_all_partitions_runs_once() -> None:
    b = Barrier([0, 1, 2])
    f = Feeds(b)
    f.broadcast(ddl(50))
    f(0, ddl(50))  # a replayed copy as well
    steps = drain(b)
    assert [w.ddl is not None for w in steps] == [True]
    assert b.applied_ddl_keys() == frozenset({ddl_key(ddl(50))})
    f(1, ddl(50))  # replayed after it ran
    assert drain(b) == []
    assert all(lst.pending_ddls() == [] for lst in b.listeners.values())


def test_ddl_applied_per_checkpoint_is_skipped() -> None:
    done = ddl(50)
    b = Barrier([0, 1], CheckpointState(applied_ts=49, applied_ddls=frozenset({ddl_key(done)})))
    f = Feeds(b)
    f.broadcast(ddl(50))
    f(0, keyed(55, 1))
    f.broadcast(resolved(60))
    steps = drain(b)
    assert [(w.ddl is not None, ids(w)) for w in steps] == [(False, [(55, 1)])]


def test_ddls_sharing_a_commit_ts_run_in_arrival_order() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    for p in (0, 1):
        f(p, ddl(50, "RENAME TABLE a TO b", "a"))
        f(p, ddl(50, "RENAME TABLE c TO d", "c"))
    steps = drain(b)
    assert [w.ddl.query for w in steps] == ["RENAME TABLE a TO b", "RENAME TABLE c TO d"]
    assert [w.target_ts for w in steps] == [49, 49]


def test_resume_offsets_keep_unapplied_ddl_and_rows() -> None:
    b = Barrier([0, 1], CheckpointState(offsets={0: 0, 1: 0}))
    f = Feeds(b)
    f(0, resolved(5))  # 0
    f(0, keyed(10, 1))  # 1
    f(0, ddl(50))  # 2
    f(1, resolved(5))  # 0
    f(1, keyed(20, 2))  # 1
    f(1, resolved(30))  # 2
    w = b.next_window()
    assert w.target_ts == 30
    # p0: the DDL at 2 is still to run, horizon resolved 5 at 0 -> 0; p1: nothing left, horizon at 2
    assert w.resume_offsets == {0: 0, 1: 2}
    b.mark_applied(w)
    assert b.resume_offsets() == w.resume_offsets
    f(1, ddl(50))  # 3
    w = b.next_window()
    assert w.ddl is not None
    assert w.resume_offsets == {0: 2, 1: 3}
    b.mark_applied(w)
    state = b.checkpoint_state()
    assert state == CheckpointState(49, {}, frozenset({ddl_key(ddl(50))}), {0: 2, 1: 3})


# ---------------------------------------------------------------------------- merge, max_rows, chunks


def _three_transactions() -> Barrier:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed(10, 1), keyed(10, 2), keyed(20, 3))
    f(1, keyed(10, 4), keyed(30, 5))
    f.broadcast(resolved(40))
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


def _window(rows: list[RowEvent]) -> Window:
    return Window(100, rows, None, {}, {}, frozenset(), 0)


def test_chunks_split_keyed_rows_between_transactions_in_ts_order() -> None:
    w = _window([keyed(30, 1), keyed(10, 2), keyed(20, 3), keyed(10, 4), keyed(20, 5)])
    chunks = list(w.chunks(2))
    assert [[r.commit_ts for r in c] for c in chunks] == [[10, 10], [20, 20], [30]]
    assert [[r.commit_ts for r in c] for c in w.chunks(3)] == [[10, 10], [20, 20, 30]]
    assert [len(c) for c in w.chunks(None)] == [5]
    big_txn = _window([keyed(10, i) for i in range(5)])
    assert [len(c) for c in big_txn.chunks(2)] == [5]
    assert list(_window([]).chunks(2)) == []
    with pytest.raises(ValueError):
        list(w.chunks(0))


def test_chunks_never_split_a_window_with_keyless_rows() -> None:
    w = _window([keyed(10, 1), keyed(20, 2), keyless(30, 1), keyed(40, 3)])
    assert w.has_keyless_rows()
    assert [len(c) for c in w.chunks(1)] == [4]


# ---------------------------------------------------------------------------- back-pressure


def test_pause_partitions_ahead_when_over_the_limit_and_resume_with_hysteresis() -> None:
    b = Barrier([0, 1, 2])
    f = Feeds(b)
    f(0, keyed(10, 1), keyed(20, 2), nbytes=600)
    f(0, resolved(50))
    f(1, keyed(15, 3), nbytes=300)
    f(1, resolved(40))
    f(2, resolved(12))
    assert b.total_cached_bytes() == 900
    assert b.holding_back() == 2
    assert b.partitions_to_pause(1000) == set()
    assert b.partitions_to_pause(800) == {0, 1}
    paused = {0, 1}
    assert b.partitions_to_resume(paused, 800) == set()  # still ahead, still over 80 %
    f(2, resolved(45))
    assert b.holding_back() == 1
    assert b.partitions_to_resume(paused, 2000) == {0, 1}  # below 80 % of the limit
    b.mark_applied(b.next_window())  # applies up to 40: rows 10, 15, 20
    assert b.total_cached_bytes() == 0
    assert b.partitions_to_resume(paused, 800) == {0, 1}


def test_resume_partitions_no_longer_ahead_even_when_over_the_limit() -> None:
    b = Barrier([0, 1])
    f = Feeds(b)
    f(0, keyed(60, 1), nbytes=1000)
    f(0, resolved(50))
    f(1, resolved(10))
    assert b.partitions_to_pause(500) == {0}
    f(1, resolved(50))
    assert b.total_cached_bytes() == 1000  # row 60 cannot be released yet
    assert b.partitions_to_resume({0}, 500) == {0}


def test_mark_applied_refuses_a_window_built_on_another_state() -> None:
    b = Barrier([0])
    f = Feeds(b)
    f(0, keyed(10, 1))
    f(0, resolved(10))
    w1 = b.next_window()
    f(0, keyed(20, 2))
    f(0, resolved(20))
    w2 = b.next_window()
    b.mark_applied(w2)
    with pytest.raises(StaleWindowError):
        b.mark_applied(w1)


def test_large_message_propagates_through_the_barrier() -> None:
    from applier.codec.events import LargeMessageEvent
    from applier.listener import LargeMessageNotSupported

    b = Barrier([0])
    big = LargeMessageEvent(20, "db", "k", False, "s3://x", None, Position("topic", 0, 3, 0))
    with pytest.raises(LargeMessageNotSupported) as err:
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


def _row(rnd: random.Random, ts: int, table: str, key: int) -> RowEvent:
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
    else:  # tiny value domain so identical keyless rows are common
        kind = rnd.choice([RowKind.INSERT, RowKind.DELETE])
        new = {"a": {"t": 3, "f": FLAG_NULLABLE, "v": key}}
        old = dict(new)
    if kind is RowKind.INSERT:
        return RowEvent(ts, "db", table, kind, new, None, None, _pos())
    if kind is RowKind.DELETE:
        return RowEvent(ts, "db", table, kind, None, old, None, _pos())
    return RowEvent(ts, "db", table, kind, new, old, None, _pos())


def make_stream(seed: int) -> Stream:
    """A producer model that follows open-protocol.md section 5, with crashes and replays.

    Rows of different tables interleave freely per partition, rows of one table keep ts order;
    resolved R is broadcast after every row <= R was written (rows above R may be written already);
    DDLs are broadcast after every earlier row. A crash loses the unwritten batch and starts a new
    session from an earlier checkpoint C that resends everything above C. The new session's first
    record on each partition goes backwards against the previous session (an older resolved, or a
    row below what that session had sent), as the listener's keyless dedupe assumes; when it would
    not, the session first re-broadcasts resolved C there. A replay that does not go backwards at
    all is the documented limitation and is not generated.
    """
    rnd = random.Random(seed)
    nparts = rnd.randint(1, 3)
    items: list[tuple[int, list[RowEvent] | list[str]]] = []
    truth_rows: list[RowEvent] = []
    truth_ddls: list[tuple[int, str]] = []
    ts = 100
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
            rows.append(_row(rnd, ts, table, key))
            if table.startswith("n") and rnd.random() < 0.3:
                rows.append(replace(rows[-1]))  # an identical second row
        items.append((ts, rows))
        truth_rows.extend(rows)

    # A row goes to the same partition in every session (replays included).
    keyless_partition = {id(r): rnd.randrange(nparts) for r in truth_rows}

    def partition_of(row: RowEvent) -> int:
        if row.table.startswith("k"):  # index-value dispatcher
            return (row.new or row.old)["id"]["v"] % nparts
        return keyless_partition[id(row)]

    records: dict[int, list[list[Event]]] = {p: [] for p in range(nparts)}
    buf: dict[int, list[Event]] = {p: [] for p in range(nparts)}
    queues: dict[tuple[int, str], list[RowEvent]] = {}
    history: list[int] = []  # resolved ts broadcast so far (checkpoints a session may restart from)
    # Per partition, what the current and the previous session wrote: highest resolved ts (or DDL
    # ts - 1) and highest row ts per table.
    session_res = {p: -1 for p in records}
    session_max: dict[tuple[int, str], int] = {}
    prev_res = dict(session_res)
    prev_max: dict[tuple[int, str], int] = {}
    restart_from: dict[int, int] = {}  # partitions whose new session has not written yet -> C

    def backwards(p: int, record: list[Event]) -> bool:
        for ev in record:
            if isinstance(ev, RowEvent):
                top = prev_max.get((p, ev.table))
                if ev.commit_ts <= prev_res[p] or (top is not None and ev.commit_ts < top):
                    return True
            elif (ev.ts if isinstance(ev, ResolvedEvent) else ev.commit_ts - 1) < prev_res[p]:
                return True
        return False

    def write(p: int, record: list[Event]) -> None:
        if p in restart_from:
            c = restart_from.pop(p)
            if not backwards(p, record):
                write(p, [ResolvedEvent(c, _pos(p))])
        records[p].append(record)
        for ev in record:
            if isinstance(ev, RowEvent):
                key = (p, ev.table)
                session_max[key] = max(session_max.get(key, -1), ev.commit_ts)
            else:
                r = ev.ts if isinstance(ev, ResolvedEvent) else ev.commit_ts - 1
                session_res[p] = max(session_res[p], r)

    def close(p: int) -> None:
        if buf[p]:
            write(p, buf[p])
            buf[p] = []

    def emit_one() -> None:
        key = rnd.choice(sorted(k for k, q in queues.items() if q))
        p = key[0]
        buf[p].append(queues[key].pop(0))
        if len(buf[p]) >= rnd.randint(1, 4):
            close(p)

    def flush() -> None:
        while any(queues.values()):
            emit_one()
        for p in records:
            close(p)

    def frontier(now: int) -> int:
        """Every row <= this was written: the resolved ts the producer may broadcast."""
        heads = [q[0].commit_ts for q in queues.values() if q]
        return min(heads) - 1 if heads else now

    crashes = 0
    last_resolved = -1  # of this session: resolved ts never goes back inside one session
    i = 0
    while i < len(items):
        ts, payload = items[i]
        i += 1
        if payload and isinstance(payload[0], str):
            flush()
            for q in payload:
                for p in records:
                    write(p, [DDLEvent(ts, "db", "k1", q, 5, _pos(p))])
            last_resolved = max(last_resolved, ts - 1)  # the checkpoint passed ts - 1 to run it
        else:
            for row in payload:
                queues.setdefault((partition_of(row), row.table), []).append(row)
            for _ in range(rnd.randint(0, 3)):
                if any(queues.values()):
                    emit_one()
        if rnd.random() < 0.4:
            # Resolved ts lag behind: rows above them may already be written.
            for p in records:
                close(p)
            top = frontier(ts)
            if top > last_resolved:
                r = rnd.randint(max(last_resolved + 1, top - 4), top)
                for p in records:
                    write(p, [ResolvedEvent(r, _pos(p))])
                history.append(r)
                last_resolved = r
        # Restart points strictly below what this session already resolved on every partition, so
        # the new session can always start by going backwards (a resolved C) against this one.
        older = [c for c in history if c < min(session_res.values())]
        if crashes < 3 and older and rnd.random() < 0.2:
            crashes += 1
            c = rnd.choice(older)
            buf = {p: [] for p in records}  # the unwritten batch is lost
            queues.clear()
            prev_res, prev_max = dict(session_res), dict(session_max)
            session_res, session_max = {p: -1 for p in records}, {}
            restart_from = {p: c for p in records}
            if rnd.random() < 0.5:
                for p in records:
                    write(p, [ResolvedEvent(c, _pos(p))])
            i = next((j for j, item in enumerate(items) if item[0] > c), len(items))
            last_resolved = c
    flush()
    for p in records:
        write(p, [ResolvedEvent(ts + 1, _pos(p))])
    return Stream(nparts, records, truth_rows, truth_ddls)


def content(row: RowEvent) -> tuple:
    img = lambda i: None if i is None else tuple((n, c["v"]) for n, c in i.items())  # noqa: E731
    return (row.commit_ts, row.table, int(row.kind), img(row.new), img(row.old))


@dataclass
class Applied:
    windows: list[Window] = field(default_factory=list)
    snapshots: list[CheckpointState] = field(default_factory=list)  # after each window


def consume(
    stream: Stream, state: CheckpointState, rnd: random.Random, start: dict[int, int] | None = None
) -> Applied:
    """Feed the stream like the Kafka loop (random interleaving of partitions, random apply points)."""
    barrier = Barrier(range(stream.partitions), state)
    cursor = dict(start or {p: 0 for p in stream.records})
    out = Applied()

    def apply_some(everything: bool) -> None:
        while True:
            kwargs = rnd.choice([{}, {"merge": False}, {"max_rows": rnd.randint(1, 4)}])
            w = barrier.next_window(**kwargs)
            if w is None:
                return
            assert w.target_ts <= barrier.global_resolved()
            assert all(w.base_ts < r.commit_ts <= w.target_ts for r in w.rows)
            if w.ddl is not None:
                assert not w.rows and w.target_ts == w.ddl.commit_ts - 1
            barrier.mark_applied(w)
            assert barrier.resume_offsets() == w.resume_offsets
            out.windows.append(w)
            out.snapshots.append(barrier.checkpoint_state())
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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), consumer_seed=st.integers(0, 2**32 - 1), cut=st.floats(0, 1))
def test_every_row_applied_once_and_restart_from_any_checkpoint_reproduces_the_rest(
    seed: int, consumer_seed: int, cut: float
) -> None:
    stream = make_stream(seed)
    rnd = random.Random(consumer_seed)
    start = CheckpointState(applied_ts=0, offsets={p: 0 for p in stream.records})
    run = consume(stream, start, rnd)
    check_order(run.windows, 0)

    truth_keyless = Counter(content(r) for r in stream.rows if is_keyless(r))
    truth_keyed = {content(r) for r in stream.rows if not is_keyless(r)}
    keyless_rows, keyed_rows, ddls = summary(run.windows)
    assert keyless_rows == truth_keyless
    assert keyed_rows == truth_keyed
    assert ddls == stream.ddls

    # Crash after window k (the checkpoint was written with it), restart from its checkpoint.
    k = int(cut * len(run.windows))
    if k == 0:
        return
    state = run.snapshots[k - 1]
    assert state.offsets == run.windows[k - 1].resume_offsets
    rerun = consume(stream, state, rnd, start=dict(state.offsets))
    check_order(rerun.windows, state.applied_ts)
    assert summary(rerun.windows) == summary(run.windows[k:])

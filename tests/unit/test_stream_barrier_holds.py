"""Barrier with tables that wait for a DDL running beside the stream (ddl_blocking = "tables"):
the other tables go on, the waiting rows are applied once it finished, and the checkpoint never
says more than is applied."""

from __future__ import annotations

from applier.codec.events import DDLEvent, Event
from applier.stream.barrier import Barrier
from applier.stream.window import Window
from checkpoint import Checkpoint
from tests.builders import ddl_event, keyed_row, resolved_event

K, OT = ("db", "k"), ("db", "o")


class Holds:
    """Which tables wait: set by the test, as the running DDLs would."""

    def __init__(self) -> None:
        self.held: set[tuple[str, str]] = set()

    def tables(self) -> frozenset[tuple[str, str]]:
        return frozenset(self.held)

    def route(self, table: tuple[str, str]) -> tuple[str, str]:
        return table

    def scope(self, ddl: DDLEvent) -> frozenset[tuple[str, str]] | None:
        return frozenset({(ddl.schema, ddl.table)}) if ddl.table else None


def barrier(state: Checkpoint | None = None) -> tuple[Barrier, Holds]:
    b = Barrier([0, 1], state)
    holds = b.holds = Holds()
    return b, holds


def ids(window: Window) -> list[tuple[str, int, int]]:
    return sorted((r.table, r.commit_ts, (r.new or r.old)["id"]["v"]) for r in window.rows)


def apply(b: Barrier) -> Window:
    w = b.next_window()
    assert w is not None
    b.mark_applied(w)
    return w


def records() -> list[tuple[int, int, list[Event]]]:
    """(partition, offset, events): rows of k and o below and above a DDL of k at ts 20."""
    ddl = ddl_event(20)
    return [
        (0, 0, [keyed_row(10, 1), keyed_row(12, 1, table="o")]),
        (1, 0, [keyed_row(11, 2, table="o")]),
        (0, 1, [ddl]),
        (1, 1, [ddl]),
        (0, 2, [keyed_row(25, 1, "after"), keyed_row(26, 5, table="o")]),
        (1, 2, [keyed_row(30, 6, table="o"), keyed_row(31, 2, "after")]),
        (0, 3, [resolved_event(40)]),
        (1, 3, [resolved_event(40)]),
    ]


def feed(b: Barrier, recs: list[tuple[int, int, list[Event]]], since: dict[int, int] | None = None) -> None:
    for p, off, events in recs:
        if since is None or off >= since.get(p, 0):
            b.feed(p, off, events)


def test_other_tables_go_on_while_a_ddl_holds_its_table_and_the_checkpoint_stays_below_it() -> None:
    b, holds = barrier()
    feed(b, records())
    assert ids(apply(b)) == [("k", 10, 1), ("o", 11, 2), ("o", 12, 1)]
    ddl_window = apply(b)
    assert ddl_window.ddl is not None and ddl_window.target_ts == 19
    holds.held.add(K)  # the DDL now runs beside the stream

    w = apply(b)
    assert ids(w) == [("o", 26, 5), ("o", 30, 6)]
    assert (w.target_ts, w.resolved_ts, w.held, w.tables) == (40, 19, frozenset({K}), frozenset({OT}))
    ckpt = b.checkpoint()
    assert ckpt.resolved_ts == 19 and ckpt.tables == {OT: 40}
    assert ckpt.offsets == {0: 2, 1: 2}  # k's waiting rows are read again after a restart
    assert b.next_window() is None  # nothing else until the DDL finished
    assert b.early_window(40, 1, 100) is None

    holds.held.clear()
    w = apply(b)
    assert ids(w) == [("k", 25, 1), ("k", 31, 2)]
    assert (w.resolved_ts, w.held) == (40, frozenset())
    assert b.applied_ts == 40 and b.checkpoint().tables == {}
    assert b.listener(0).cached_rows == b.listener(1).cached_rows == 0


def test_a_restart_while_a_table_waits_applies_its_rows_once_and_the_others_not_again() -> None:
    b, holds = barrier()
    recs = records()
    feed(b, recs)
    apply(b)
    apply(b)
    holds.held.add(K)
    apply(b)
    ckpt = b.checkpoint()

    # Restart from that checkpoint, the DDL still journaled (it holds k again).
    b2, holds2 = barrier(ckpt)
    holds2.held.add(K)
    feed(b2, recs, since=ckpt.offsets)
    assert b2.next_window() is None or ids(b2.next_window()) == []
    holds2.held.clear()
    got = []
    while (w := b2.next_window()) is not None:
        got += ids(w)
        b2.mark_applied(w)
    assert got == [("k", 25, 1), ("k", 31, 2)]
    assert b2.applied_ts == 40


def test_a_ddl_of_a_waiting_table_waits_for_its_rows_and_one_of_another_table_does_not() -> None:
    b, holds = barrier()
    feed(b, records()[:6])
    later_k = ddl_event(35, "ALTER TABLE k DROP COLUMN c")
    later_o = ddl_event(33, "ALTER TABLE o ADD COLUMN c INT", table="o")
    for p in (0, 1):
        b.feed(p, 4, [later_o])
        b.feed(p, 5, [later_k])
        b.feed(p, 6, [keyed_row(36, 9 + p, table="o"), resolved_event(50)])
    apply(b)
    apply(b)
    holds.held.add(K)

    w = apply(b)  # o's rows below its DDL
    assert ids(w) == [("o", 26, 5), ("o", 30, 6)] and w.resolved_ts == 19
    w = apply(b)
    assert w.ddl is later_o and w.resolved_ts == 19  # another table's DDL goes on
    holds.held.add(OT)  # it runs beside too
    w = apply(b)
    assert (w.rows, w.target_ts, w.resolved_ts) == ([], 34, 19)
    assert b.next_window() is None  # k's DDL waits for k's DDL and rows; o waits for its own

    holds.held.discard(K)
    w = apply(b)
    assert ids(w) == [("k", 25, 1), ("k", 31, 2)] and w.resolved_ts == 32
    holds.held.clear()
    w = apply(b)
    assert w.ddl is later_k and w.resolved_ts == 34
    w = apply(b)
    assert ids(w) == [("o", 36, 9), ("o", 36, 10)] and w.resolved_ts == 50

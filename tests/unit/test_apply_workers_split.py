"""Which statements of a window the worker sessions may write (applier.apply.workers.split)."""

from __future__ import annotations

from applier.apply import workers as workers_module
from applier.apply.workers import WorkerSessions
from applier.downstream.url import DownstreamConfig
from sqlgen import DeleteGroup, Router, Statement, TablePlan, UpsertGroup, WindowPlan


def _st(table: str, kind: str, rows: int, key: tuple | None = (1,)) -> Statement:
    return Statement("SQL", (), kind, "db", table, rows, key)  # type: ignore[arg-type]


def _keyed(table: str, keys: list[tuple]) -> TablePlan:
    group = UpsertGroup(("id",), (3,), [(k[0],) for k in keys], keys)
    return TablePlan("db", table, keyed=True, upserts=[group])


def _sessions(count: int = 2) -> WorkerSessions:
    # No session is opened before a share is started.
    return WorkerSessions(DownstreamConfig.from_url("mysql://u@127.0.0.1:1/"), count, fence=lambda cur: None)


def test_keyed_statements_are_shared_by_rows_and_the_rest_stays_with_the_window() -> None:
    plan = WindowPlan(
        {
            ("db", "a"): _keyed("a", [(1,)]),
            ("db", "b"): _keyed("b", [(2,)]),
            ("db", "nokey"): TablePlan("db", "nokey", keyed=False),
        }
    )
    stmts = [
        _st("a", "delete", 1000),
        _st("a", "replace", 5000),
        _st("nokey", "insert", 10, None),
        _st("b", "replace", 3000),
        _st("a", "replace", 1500),
        _st("nokey", "delete", 1, None),
    ]
    sessions = _sessions()
    try:
        own, shares = sessions.split(plan, stmts, Router()) or ([], [])
    finally:
        sessions.close()
    assert own == [2, 5]  # keyless: with the checkpoint, in their order
    assert shares == [[0, 3, 4], [1]]  # each to the worker with the fewest rows so far, in order
    assert sum(stmts[i].rows for i in shares[0]) == 5500 and stmts[1].rows == 5000


def test_a_table_with_a_null_in_a_key_stays_with_the_window() -> None:
    plan = WindowPlan({("db", "a"): _keyed("a", [(1,), (None,)]), ("db", "b"): _keyed("b", [(2,)])})
    plan.tables[("db", "b")].deletes.append(DeleteGroup(("id",), (3,), [(3,)]))
    stmts = [_st("a", "replace", 4000), _st("b", "delete", 1000), _st("b", "replace", 3000)]
    sessions = _sessions()
    try:
        own, shares = sessions.split(plan, stmts, Router()) or ([], [])
    finally:
        sessions.close()
    assert own == [0]  # a replayed row with a NULL key could be written twice
    assert shares == [[1], [2]]


def test_small_windows_and_windows_of_one_statement_are_not_split() -> None:
    plan = WindowPlan({("db", "a"): _keyed("a", [(1,)])})
    sessions = _sessions()
    try:
        small = [_st("a", "delete", 1000), _st("a", "replace", 3999)]
        assert sum(s.rows for s in small) < workers_module.MIN_ROWS
        assert sessions.split(plan, small, Router()) is None
        assert sessions.split(plan, [_st("a", "replace", 5000)], Router()) is None  # one worker: no gain
        keyless = WindowPlan({("db", "n"): TablePlan("db", "n", keyed=False)})
        assert sessions.split(keyless, [_st("n", "insert", 3000, None)] * 2, Router()) is None
    finally:
        sessions.close()


def test_routed_tables_are_matched_by_their_downstream_names() -> None:
    plan = WindowPlan({("up", "a"): _keyed("a", [(1,)])})
    router = Router.from_rules(["up.*=down.{table}"])
    stmts = [Statement("SQL", (), "replace", "down", "a", 3000, (k,)) for k in (1, 2)]
    sessions = _sessions()
    try:
        own, shares = sessions.split(plan, stmts, router) or ([], [])
    finally:
        sessions.close()
    assert own == [] and shares == [[0], [1]]

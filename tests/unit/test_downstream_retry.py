"""run_with_retry: whole-unit replay with reconnect, backoff, and limits (fake units, no database)."""

from __future__ import annotations

import time

import pymysql
import pytest

from applier.downstream.retry import Backoff, RetryInfo, RetryLog, run_with_retry

LOST = pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
FAST = Backoff(initial=0.001, maximum=0.005, jitter=0.5)


class Unit:
    """A unit of work that fails with the given errors first, then returns 'done'."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.reconnects = 0
        self.log: list[str] = []

    def __call__(self) -> str:
        self.calls += 1
        self.log.append("run")
        if self.errors:
            raise self.errors.pop(0)
        return "done"

    def reconnect(self) -> None:
        self.reconnects += 1
        self.log.append("reconnect")


def test_transient_errors_replay_the_whole_unit_after_reconnect() -> None:
    unit = Unit(LOST, pymysql.err.OperationalError(1213, "Deadlock"), pymysql.err.InterfaceError(0, ""))
    seen: list[RetryInfo] = []
    assert run_with_retry(unit, reconnect=unit.reconnect, backoff=FAST, on_retry=seen.append) == "done"
    assert unit.log == ["run", "reconnect", "run", "reconnect", "run", "reconnect", "run"]
    assert [i.attempt for i in seen] == [1, 2, 3]
    assert type(seen[0].error) is pymysql.err.OperationalError
    assert all(0 <= i.wait <= FAST.maximum for i in seen)


@pytest.mark.parametrize(
    "error",
    [
        pymysql.err.IntegrityError(1062, "Duplicate entry"),
        pymysql.err.ProgrammingError(1146, "Table doesn't exist"),
        RuntimeError("bug"),
    ],
)
def test_permanent_errors_propagate_at_once(error: BaseException) -> None:
    unit = Unit(error)
    with pytest.raises(type(error)) as ei:
        run_with_retry(unit, reconnect=unit.reconnect, backoff=FAST)
    assert ei.value is error
    assert unit.calls == 1 and unit.reconnects == 0


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    errors = [pymysql.err.OperationalError(2006, f"gone {i}") for i in range(5)]
    unit = Unit(*errors)
    with pytest.raises(pymysql.err.OperationalError) as ei:
        run_with_retry(unit, reconnect=unit.reconnect, max_attempts=3, backoff=FAST)
    assert ei.value is errors[2]
    assert unit.calls == 3 and unit.reconnects == 2


def test_gives_up_after_max_time() -> None:
    unit = Unit(*[LOST] * 10_000)
    started = time.monotonic()
    with pytest.raises(pymysql.err.OperationalError):
        run_with_retry(
            unit,
            reconnect=unit.reconnect,
            max_attempts=None,
            max_time=0.3,
            backoff=Backoff(initial=0.05, maximum=0.05, jitter=0),
        )
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 1.5
    assert 3 <= unit.calls <= 10


def test_transient_failure_of_reconnect_counts_as_an_attempt() -> None:
    unit = Unit(LOST)
    outcomes = [pymysql.err.OperationalError(2003, "Can't connect"), None]

    def reconnect() -> None:
        unit.reconnects += 1
        error = outcomes.pop(0)
        if error is not None:
            raise error

    assert run_with_retry(unit, reconnect=reconnect, backoff=FAST) == "done"
    assert unit.calls == 2 and unit.reconnects == 2


def test_permanent_failure_of_reconnect_propagates() -> None:
    unit = Unit(LOST)
    denied = pymysql.err.OperationalError(1045, "Access denied")

    def reconnect() -> None:
        raise denied

    with pytest.raises(pymysql.err.OperationalError) as ei:
        run_with_retry(unit, reconnect=reconnect, backoff=FAST)
    assert ei.value is denied and unit.calls == 1


def test_backoff_grows_exponentially_and_is_capped() -> None:
    slept: list[float] = []
    unit = Unit(*[LOST] * 6)
    run_with_retry(
        unit,
        reconnect=unit.reconnect,
        backoff=Backoff(initial=1.0, maximum=8.0, multiplier=2.0, jitter=0),
        sleep=slept.append,
    )
    assert slept == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_jitter_stays_within_bounds() -> None:
    b = Backoff(initial=1.0, maximum=100.0, jitter=0.25)
    waits = {b.wait(3) for _ in range(200)}
    assert all(3.0 <= w <= 5.0 for w in waits)
    assert len(waits) > 1


def test_invalid_settings() -> None:
    with pytest.raises(ValueError):
        Backoff(multiplier=0.5)
    with pytest.raises(ValueError):
        run_with_retry(lambda: 1, reconnect=lambda: None, max_attempts=0)


class Lines:
    """A logger that keeps (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str, dict]] = []

    def log(self, level: int, event: str, **kw: object) -> None:
        self.lines.append((level, event, kw))

    def warning(self, event: str, **kw: object) -> None:
        self.log(30, event, **kw)

    def info(self, event: str, **kw: object) -> None:
        self.log(20, event, **kw)


def test_retry_log_says_each_class_once_then_sums_up_and_says_when_it_is_over() -> None:
    now = [0.0]
    lines = Lines()
    rlog = RetryLog(lines, report_seconds=60, summary_seconds=30, clock=lambda: now[0])
    lock_wait = pymysql.err.OperationalError(1205, "Lock wait timeout exceeded")
    for attempt in range(1, 200):  # a lock held for 100 s: an attempt every half second
        rlog.failed(RetryInfo(attempt, lock_wait, 0.5, now[0]))
        if attempt == 3:
            rlog.failed(RetryInfo(attempt, LOST, 0.5, now[0]))
        now[0] += 0.5
    events = [(level, event) for level, event, _ in lines.lines]
    assert events == [
        (30, "transient downstream error, replaying the transaction"),
        (30, "transient downstream error, replaying the transaction"),
        (30, "downstream still failing, replaying the transaction"),
        (40, "downstream still failing, replaying the transaction; reported as not ready"),
        (30, "downstream still failing, replaying the transaction"),
    ]  # at 0 s, 1 s (another class), 31 s, 60 s (retry_report_seconds), 90 s
    first = lines.lines[0][2]
    assert first["error_class"] == "lock_wait" and first["code"] == 1205
    assert lines.lines[1][2]["error_class"] == "connection"
    assert lines.lines[3][2]["failing_s"] == 60.0
    assert lines.lines[-1][2]["errors"] == "connection=1, lock_wait=181"  # at 90 s
    assert rlog.failing_since == 0.0
    rlog.succeeded()
    level, event, fields = lines.lines[-1]
    assert level == 20
    assert event == "downstream recovered: the transaction committed after transient errors"
    assert fields == {"failed_s": 99.5, "errors": "connection=1, lock_wait=199"}
    rlog.succeeded()  # nothing to say without trouble
    assert len(lines.lines) == 6 and rlog.failing_since is None


def test_start_up_steps_wait_for_a_server_that_is_read_only_full_or_not_there_but_not_a_refusal() -> None:
    """applier.apply.startup.run_startup_step: the schema and the claim write; a server that is
    read-only or full for now, or that does not answer yet, is waited out (and said so to
    ``on_waiting``); a refused login stops the start at once."""
    from applier.apply.startup import run_startup_step
    from applier.downstream.errors import DownstreamRefused, DownstreamUnreachable

    read_only = pymysql.err.OperationalError(
        1290, "The MariaDB server is running with the --read-only option"
    )
    full = pymysql.err.OperationalError(1114, "The table 'changefeed' is full")
    lines = Lines()
    seen: list[BaseException] = []
    unit = Unit(read_only, read_only, full)
    log = RetryLog(lines, report_seconds=60, action="retrying the start-up", recovered="it goes on")
    assert (
        run_startup_step(unit, retry_log=log, on_retry=seen.append, sleep=lambda s: None, backoff=FAST)
        == "done"
    )
    assert unit.calls == 4 and seen == [read_only, read_only, full]
    assert [event for _, event, _ in lines.lines] == [
        "transient downstream error, retrying the start-up",
        "transient downstream error, retrying the start-up",  # another class: disk_full
        "downstream recovered: it goes on",
    ]
    unreachable = Unit(*[DownstreamUnreachable("cannot reach the downstream database", errno=2003)] * 3)
    waiting: list[str | None] = []
    assert (
        run_startup_step(
            unreachable, retry_log=log, on_waiting=waiting.append, sleep=lambda s: None, backoff=FAST
        )
        == "done"
    )
    assert unreachable.calls == 4
    assert waiting == [
        *["waiting for the downstream database: (2003) cannot reach the downstream database"] * 3,
        None,
    ]
    refused = Unit(DownstreamRefused("refused the login", errno=1045))
    with pytest.raises(DownstreamRefused):
        run_startup_step(refused, retry_log=log, sleep=lambda s: None, backoff=FAST)
    assert refused.calls == 1 and DownstreamRefused.exit_code == 2

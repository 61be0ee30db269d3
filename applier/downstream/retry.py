"""Replay a unit of downstream work after transient failures.

The unit (``fn``) is a whole transaction body that the caller can run again from memory: after a
lost connection nobody knows which of its statements reached the server, and after a deadlock the
server has rolled back the whole transaction. So the only safe retry is: get a clean session
(``reconnect``), then run the *entire* unit again. Retrying single statements would commit half a
batch or a checkpoint without its rows.

An ambiguous COMMIT (the connection died while committing) may have succeeded; the replay then
writes the same rows and the same checkpoint once more. That is only harmless because the units
are idempotent (REPLACE-style row writes, checkpoint values that never move backwards); callers
must keep it that way.

Errors that are not transient (see ``errors.is_transient``) propagate on the first occurrence;
when the attempts or the time budget are used up the last transient error propagates unchanged.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any, TypeVar

import tenacity

from applier.downstream.errors import describe, error_code, is_transient, retry_class

T = TypeVar("T")

__all__ = ["Backoff", "RetryInfo", "RetryLog", "run_with_retry"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: the n-th wait is ``min(maximum, initial * multiplier**(n-1))``
    scaled by a random factor in ``[1 - jitter, 1 + jitter]`` and capped at ``maximum``.

    Jitter keeps two appliers (or the applier and another client) that hit the same deadlock from
    retrying in lockstep. Tests pass tiny values.
    """

    initial: float = 0.2
    maximum: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0 or self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff {self}")

    def wait(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.maximum, self.initial * self.multiplier ** (attempt - 1))
        factor = random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return max(0.0, min(self.maximum, base * factor))


@dataclass(frozen=True, slots=True)
class RetryInfo:
    """What the ``on_retry`` hook is told before each wait (for logging)."""

    attempt: int  # number of the attempt that just failed, 1-based
    error: BaseException
    wait: float  # seconds until the next attempt
    elapsed: float  # seconds since the first attempt started


class _Stop:
    def __init__(self, max_attempts: int | None, max_time: float | None) -> None:
        self.max_attempts = max_attempts
        self.max_time = max_time

    def __call__(self, state: tenacity.RetryCallState) -> bool:
        if self.max_attempts is not None and state.attempt_number >= self.max_attempts:
            return True
        return self.max_time is not None and (state.seconds_since_start or 0.0) >= self.max_time


class _Wait:
    def __init__(self, backoff: Backoff, max_time: float | None) -> None:
        self.backoff = backoff
        self.max_time = max_time

    def __call__(self, state: tenacity.RetryCallState) -> float:
        wait = self.backoff.wait(state.attempt_number)
        if self.max_time is not None:
            # Never sleep past the budget: the last attempt starts at max_time at the latest.
            wait = min(wait, max(0.0, self.max_time - (state.seconds_since_start or 0.0)))
        return wait


def run_with_retry(
    fn: Callable[[], T],
    *,
    reconnect: Callable[[], object],
    max_attempts: int | None = 10,
    max_time: float | None = 120.0,
    backoff: Backoff | None = None,
    on_retry: Callable[[RetryInfo], None] | None = None,
    retryable: Callable[[BaseException], bool] = is_transient,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn()``; on a transient error call ``reconnect()`` and run ``fn()`` again, whole.

    ``reconnect`` must leave the caller's session usable with no transaction open (the simplest
    correct implementation closes the old connection and opens a new one). It runs at the start
    of every attempt after the first, inside the attempt: if the server is still down, its own
    transient error counts as a failed attempt and the backoff continues; a permanent error from
    it (e.g. access denied) propagates.

    ``max_attempts`` counts calls of ``fn`` (None: unlimited); ``max_time`` is the time budget in
    seconds (None: unlimited); with both None it retries until success or a permanent error,
    which is what a daemon that should ride out a downstream restart wants.
    """
    if max_attempts is not None and max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is None or state.outcome is None:
            return
        error = state.outcome.exception()
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        on_retry(RetryInfo(state.attempt_number, error, float(wait), state.seconds_since_start or 0.0))

    retrying = tenacity.Retrying(
        stop=_Stop(max_attempts, max_time),
        wait=_Wait(backoff or Backoff(), max_time),
        retry=tenacity.retry_if_exception(retryable),
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
    result: T
    for attempt in retrying:
        with attempt:
            if attempt.retry_state.attempt_number > 1:
                reconnect()
            result = fn()
    return result


@dataclass(eq=False)
class RetryLog:
    """Log transient errors by class, not by attempt, and say once when they are over.

    A lock held for minutes or a database restart makes a unit fail dozens of times; a line per
    attempt would bury everything else. So the first error of each class (``errors.retry_class``)
    is logged with its code and text; later ones are only counted and summed up in one line at
    most every ``summary_seconds``, plus one line when the trouble has lasted ``report_seconds``
    (from then on ``/readyz`` fails, see ``applier.ops.health``). The first success after trouble
    logs one line with the totals.

    ``failed`` and ``succeeded`` are called by the thread that runs the unit. ``action`` and
    ``recovered`` word the lines for units that are not a transaction (the start-up's steps);
    ``subject`` and ``classify`` for errors that are not the database's (the broker's at start-up).
    """

    log: Any
    _: KW_ONLY
    report_seconds: float
    summary_seconds: float = 30.0
    clock: Callable[[], float] = time.monotonic
    action: str = "replaying the transaction"
    recovered: str = "the transaction committed after transient errors"
    subject: str = "downstream"
    classify: Callable[[BaseException], str] = retry_class

    def __post_init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.failing_since: float | None = None
        self._counts: dict[str, int] = {}
        self._last_line = 0.0
        self._reported = False

    def _totals(self) -> str:
        return ", ".join(f"{cls}={n}" for cls, n in sorted(self._counts.items()))

    def failed(self, info: RetryInfo) -> None:
        now = self.clock()
        if self.failing_since is None:
            self.failing_since = now
        cls = self.classify(info.error)
        first = cls not in self._counts
        self._counts[cls] = self._counts.get(cls, 0) + 1
        failing = now - self.failing_since
        if first:
            self.log.warning(
                f"transient {self.subject} error, {self.action}",
                error_class=cls,
                code=error_code(info.error),
                error=describe(info.error),
                attempt=info.attempt,
                wait_s=round(info.wait, 2),
            )
            self._last_line = now
            return
        crossed = not self._reported and failing >= self.report_seconds
        if crossed or now - self._last_line >= self.summary_seconds:
            self.log.log(
                40 if crossed else 30,  # error once when it becomes a report, warnings otherwise
                f"{self.subject} still failing, {self.action}"
                + ("; reported as not ready" if crossed else ""),
                failing_s=round(failing, 1),
                errors=self._totals(),
                last_error=describe(info.error),
                attempt=info.attempt,
            )
            self._reported = self._reported or crossed
            self._last_line = now

    def succeeded(self) -> None:
        if self.failing_since is None:
            return
        self.log.info(
            f"{self.subject} recovered: {self.recovered}",
            failed_s=round(self.clock() - self.failing_since, 1),
            errors=self._totals(),
        )
        self._reset()

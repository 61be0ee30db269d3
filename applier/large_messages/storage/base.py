"""What every claim-check store does: plain names only, and reads retried by one policy.

A claim-check read sits in the middle of applying a window, and giving up at the first hiccup
would stop the daemon: transient failures are retried with backoff for the policy's budget.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import tenacity

from applier.large_messages.storage.errors import ObjectUnreadable, Transient
from applier.large_messages.storage.retry import RetryPolicy
from applier.ops.logs import get_logger

_log = get_logger(component="claim-check")


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain object name, else raise ValueError.

    A plain name has no directory part, so joined to the root it can only name an entry directly
    under it: no ``/`` or ``\\``, not ``.`` or ``..``, no NUL, not empty.
    """
    if not isinstance(name, str):
        raise ValueError(f"object name must be a string, not {type(name).__name__}")
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(f"not a plain object name: {name[:120]!r}")
    return name


class ObjectStore(ABC):
    """Reads objects by plain name under one root. Safe to share between threads."""

    def __init__(self, *, retry: RetryPolicy | None = None) -> None:
        self.retry = retry or RetryPolicy()

    @abstractmethod
    def describe(self) -> str:
        """The root for messages and logs: a URI-like text without any secret."""

    @abstractmethod
    def _read_once(self, name: str) -> bytes:
        """One attempt: the bytes, or ObjectMissing / ObjectUnreadable, or Transient."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"

    def read(self, name: str) -> bytes:
        """The whole content of object ``name`` (a plain name, see :func:`check_name`).

        Raises ValueError for a name that is not plain, :class:`ObjectMissing`, or
        :class:`ObjectUnreadable` (at once for permanent errors, after the retry budget for
        transient ones).
        """
        check_name(name)
        policy = self.retry
        where = self.describe()

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            # One warning per read; the further attempts at debug level (an outage would flood the log).
            log = _log.warning if state.attempt_number == 1 else _log.debug
            log(
                "object store read failed, retrying",
                object=name,
                store=where,
                reason=getattr(exc, "reason", str(exc)),
                attempt=state.attempt_number,
                wait=round(state.upcoming_sleep, 3),
            )

        retrying = tenacity.Retrying(
            stop=tenacity.stop_before_delay(policy.budget),
            wait=tenacity.wait_random_exponential(multiplier=policy.initial, max=policy.maximum),
            retry=tenacity.retry_if_exception_type(Transient),
            before_sleep=before_sleep,
            reraise=True,
        )
        attempts = 0
        start = time.monotonic()
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    return self._read_once(name)
        except Transient as exc:
            if attempts > 1:
                _log.error(
                    "object store read failed for the whole retry budget",
                    object=name,
                    store=where,
                    reason=exc.reason,
                    attempts=attempts,
                    seconds=round(time.monotonic() - start, 3),
                )
            raise ObjectUnreadable(name, where, exc.reason, retried=attempts > 1, attempts=attempts) from None
        raise AssertionError("unreachable")  # pragma: no cover - tenacity returns or raises

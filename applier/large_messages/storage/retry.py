"""How long a claim-check read retries transient failures."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long transient failures are retried before a read gives up with :class:`ObjectUnreadable`.

    ``budget`` bounds the time in which new attempts start (tenacity's ``stop_before_delay``); an
    attempt that starts late can still run for its timeouts and botocore's own ``sdk_attempts``, so a
    read gives up within about ``budget`` plus one attempt. Waits grow exponentially from
    ``initial`` to ``maximum`` seconds with full jitter, so several readers do not retry in step.
    A zero budget means a single attempt (tests).
    """

    budget: float = 30.0
    initial: float = 0.5
    maximum: float = 5.0
    sdk_attempts: int = 3  # botocore "standard" mode: total attempts of one request
    connect_timeout: float = 5.0
    read_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.budget < 0 or self.initial <= 0 or self.maximum < self.initial or self.sdk_attempts < 1:
            raise ValueError(f"invalid retry policy {self}")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError(f"invalid retry policy {self}")

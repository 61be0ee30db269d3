"""Fakes the operations observers are driven with: a settable clock, the barrier, listeners and reader
they read on every tick, and a window as the daemon hands it over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from applier.stream.window import Window

TS = (1_700_000_000_000 << 18) + 5  # physical time 1_700_000_000.000 s


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeListener:
    resolved: int
    last_offset: int | None
    cached_bytes: int


@dataclass
class FakeBarrier:
    applied_ts: int = 0
    listeners: dict[int, FakeListener] = field(default_factory=dict)

    def global_resolved(self) -> int:
        return min(lst.resolved for lst in self.listeners.values())


@dataclass
class FakeReader:
    at_end: bool = False
    paused: frozenset[int] = frozenset()
    unreachable_since: float | None = None
    last_kafka_error: str | None = None

    def all_at_end(self) -> bool:
        return self.at_end


def window(ts: int, ddl: object | None = None) -> Window:
    return Window(ts, [], ddl, {0: 10, 1: None}, {0: ts}, frozenset(), ts - 1)  # type: ignore[arg-type]

"""What the daemon tells the outside world while it runs: metrics, systemd, health.

The daemon calls these hooks at a few well-defined points and knows nothing about who listens;
metrics (Prometheus), the systemd notifier and the health endpoints each implement the subset
they need. Hooks run on the daemon's thread, so they must be cheap and must never raise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from applier.downstream.watch import StatementWait
    from applier.kafka.reader import PartitionReader
    from applier.stream.barrier import Barrier
    from applier.stream.window import Window
    from checkpoint import JournalEntry

Rows = Mapping[tuple[str, str, str], int]
"""Row operations of a window by (schema, table, op)."""


@dataclass(frozen=True, slots=True)
class WindowApplied:
    """What ``on_window`` is told about a committed window."""

    window: Window
    seconds: float
    """From the start of its transaction to the daemon noticing its commit."""
    rows: Rows
    """Its row operations."""
    commit_time: float | None = None
    """When it committed (Unix seconds), when known."""
    ready_at: float | None = None
    """When the daemon read the records that let it be released (Unix seconds), when known; see
    ``applier_ready_to_commit_seconds``."""


class Observer:
    """Base class with no-op hooks; subclasses override what they need."""

    def on_state(self, state: str) -> None:
        """``starting`` | ``standby`` | ``active`` | ``stopping`` | ``failed``."""

    def on_waiting(self, reason: str | None) -> None:
        """The start-up waits for something that is not there yet (``reason`` says what and why:
        the database, the broker, the topic); ``None`` once it is."""

    def on_ready(self) -> None:
        """Broker and database answer, the checkpoint is loaded, partitions are assigned."""

    def on_apply_start(self, window: Window) -> None:
        """A window is about to be applied: the loop now waits for the database (a DDL can take hours)."""

    def on_window(self, applied: WindowApplied) -> None:
        """A window was committed."""

    def on_back_pressure(self, paused: Set[int], cached_rows: int, behind_window_in_flight: bool) -> None:
        """Partitions ahead of the barrier were paused (``applier.daemon.pacing``) with this many
        rows cached; ``behind_window_in_flight`` when a window is in flight and none can follow it
        before the partitions holding the barrier back are read further."""

    def on_retry(self, error: BaseException) -> None:
        """A transient downstream error: the transaction will be replayed."""

    def on_statement_waits(self, waits: Sequence[StatementWait]) -> None:
        """The daemon's statements that wait on a lock now (``applier.downstream.watch``); called
        when that changes."""

    def on_online_ddls(self, running: Sequence[tuple[JournalEntry, float]]) -> None:
        """The index DDLs running beside the stream now (``applier.apply.online_ddl``), each with
        when it started (Unix seconds); called when that changes."""

    def on_error(self, kind: str) -> None:
        """A fatal error of this kind (e.g. ``ApplyError``, ``MalformedRecordError``) stops the daemon."""

    def on_tick(self, barrier: Barrier, reader: PartitionReader, progressed: bool) -> None:
        """Once per loop iteration; ``progressed`` when records were read or windows applied."""


class Observers(Observer):
    """Fan-out to several observers; one failing observer never disturbs the daemon."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self._observers = list(observers)

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def _call(self, name: str, *args: Any) -> None:
        for obs in self._observers:
            with contextlib.suppress(Exception):  # an observer must never take the daemon down
                getattr(obs, name)(*args)

    def on_state(self, state: str) -> None:
        self._call("on_state", state)

    def on_waiting(self, reason: str | None) -> None:
        self._call("on_waiting", reason)

    def on_ready(self) -> None:
        self._call("on_ready")

    def on_apply_start(self, window: Window) -> None:
        self._call("on_apply_start", window)

    def on_window(self, applied: WindowApplied) -> None:
        self._call("on_window", applied)

    def on_back_pressure(self, paused: Set[int], cached_rows: int, behind_window_in_flight: bool) -> None:
        self._call("on_back_pressure", paused, cached_rows, behind_window_in_flight)

    def on_retry(self, error: BaseException) -> None:
        self._call("on_retry", error)

    def on_statement_waits(self, waits: Sequence[StatementWait]) -> None:
        self._call("on_statement_waits", waits)

    def on_online_ddls(self, running: Sequence[tuple[JournalEntry, float]]) -> None:
        self._call("on_online_ddls", running)

    def on_error(self, kind: str) -> None:
        self._call("on_error", kind)

    def on_tick(self, barrier: Barrier, reader: PartitionReader, progressed: bool) -> None:
        self._call("on_tick", barrier, reader, progressed)

"""What has already been applied downstream: the state restored from a checkpoint and kept current.

The listeners and the barrier all need the same answers to "is this event already applied?",
so they share one ``SharedProgress`` object instead of each holding a copy that could drift.
Only the barrier writes to it (in ``Barrier.mark_applied``); listeners only read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from applier.codec.events import DDLEvent
from checkpoint import ddl_digest

TableKey = tuple[str, str]
"""(schema, table) of a row or DDL event."""

DDLKey = tuple[int, str]
"""(commit_ts, sha256 hex digest of the query text): how a DDL is recognised across broadcasts and
replays. Two different DDLs may share a commit ts (TiCDC splits some multi-table DDLs), so the ts
alone is not enough."""


def ddl_key(ddl: DDLEvent) -> DDLKey:
    return (ddl.commit_ts, ddl_digest(ddl.query))


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What a checkpoint tells a starting daemon.

    ``applied_ts``: every row with commit ts <= this value is applied (the global applied resolved
    ts, "G0"). ``table_ts``: a per-table floor above ``applied_ts`` when a table was loaded further
    by other means (e.g. a catch-up to a later snapshot); rows at or below it are skipped.
    ``applied_ddls``: DDLs already executed whose commit ts is above ``applied_ts`` (a DDL step
    leaves the applied ts at ``commit_ts - 1``, so the key is needed to not run it twice).
    ``offsets``: per-partition Kafka offset to resume from; a missing partition resumes wherever
    the daemon's start policy says (the listener then reports ``None`` until it has read something).
    """

    applied_ts: int = 0
    table_ts: Mapping[TableKey, int] = field(default_factory=dict)
    applied_ddls: frozenset[DDLKey] = frozenset()
    offsets: Mapping[int, int] = field(default_factory=dict)


class SharedProgress:
    """Mutable view of what is applied, shared by all listeners of one daemon and its barrier."""

    __slots__ = ("applied_ddls", "applied_ts", "table_ts")

    def __init__(self, state: CheckpointState) -> None:
        self.applied_ts: int = state.applied_ts
        self.table_ts: dict[TableKey, int] = {
            t: ts for t, ts in state.table_ts.items() if ts > state.applied_ts
        }
        self.applied_ddls: set[DDLKey] = {k for k in state.applied_ddls if k[0] > state.applied_ts}

    def is_ddl_applied(self, key: DDLKey) -> bool:
        return key[0] <= self.applied_ts or key in self.applied_ddls

    def prune(self) -> None:
        """Forget entries made redundant by the applied ts (keeps checkpoints small)."""
        g = self.applied_ts
        self.applied_ddls = {k for k in self.applied_ddls if k[0] > g}
        self.table_ts = {t: ts for t, ts in self.table_ts.items() if ts > g}

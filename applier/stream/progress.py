"""What has already been applied downstream: the state restored from a checkpoint and kept current.

The checkpoint itself is ``checkpoint.Checkpoint``, one type for what is loaded, what the stream
stages start from and what the barrier reports (``Barrier.checkpoint``).

The listeners and the barrier all need the same answers to "is this event already applied?",
so they share one ``SharedProgress`` object instead of each holding a copy that could drift.
Only the barrier writes to it (in ``Barrier.mark_applied``); listeners only read it.
"""

from __future__ import annotations

from applier.codec.events import DDLEvent
from checkpoint import Checkpoint, ddl_digest

TableKey = tuple[str, str]
"""(schema, table) of a row or DDL event."""

DDLKey = tuple[int, str]
"""(commit_ts, sha256 hex digest of the query text): how a DDL is recognised across broadcasts and
replays. Two different DDLs may share a commit ts (TiCDC splits some multi-table DDLs), so the ts
alone is not enough."""


def ddl_key(ddl: DDLEvent) -> DDLKey:
    return (ddl.commit_ts, ddl_digest(ddl.query))


class SharedProgress:
    """Mutable view of what is applied, shared by all listeners of one daemon and its barrier."""

    __slots__ = ("_front", "applied_ddls", "applied_ts", "table_ts")

    def __init__(self, checkpoint: Checkpoint) -> None:
        g = checkpoint.resolved_ts
        self.applied_ts: int = g
        """Every row at or below it is applied, of every table (the checkpoint's resolved ts)."""
        self._front = g
        self.table_ts: dict[TableKey, int] = {t: ts for t, ts in checkpoint.tables.items() if ts > g}
        self.applied_ddls: set[DDLKey] = {k for k in checkpoint.applied_ddls if k[0] > g}

    @property
    def front_ts(self) -> int:
        """Every row at or below it is applied, of every table but those whose rows wait for a DDL
        running beside the stream (``ddl_blocking = "tables"``, ``Barrier`` says more); the
        applied ts when none waits."""
        front = self._front
        return front if front > self.applied_ts else self.applied_ts

    @front_ts.setter
    def front_ts(self, ts: int) -> None:
        self._front = ts

    def is_ddl_applied(self, key: DDLKey) -> bool:
        return key[0] <= self.applied_ts or key in self.applied_ddls

    def prune(self) -> None:
        """Forget entries made redundant by the applied ts (keeps checkpoints small)."""
        g = self.applied_ts
        self.applied_ddls = {k for k in self.applied_ddls if k[0] > g}
        self.table_ts = {t: ts for t, ts in self.table_ts.items() if ts > g}

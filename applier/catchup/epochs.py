"""The catch-up's window and its DDL epochs: pure functions of the control events read.

- A partition's resolved ts is the highest resolved ts read from it, never below the checkpoint:
  the daemon's listener rule. A DDL implies none: in the new architecture rows of the tables it
  does not block may follow it with a smaller ts (docs/open-protocol.md §5.4).
- With several topics, a partition whose topic gets no resolved events counts as resolved at the
  highest one seen elsewhere once read to an end learned after it (``applier.catchup.offsets``).
- R, the end of the window, is the smallest of them over all partitions (capped by ``--until``):
  only up to R is the set of rows complete. Rows with ``lower < ts <= R`` are applied, where
  ``lower`` is max(--from-ts, the checkpoint's applied ts).
- A DDL with commit ts D, ``lower < D <= R`` and not yet recorded as applied, splits the window:
  rows ``<= D - 1`` first, then the DDL, then rows ``>= D``. With R >= D every first copy below D
  has been delivered, so it runs exactly when the daemon's barrier would run it. DDLs above R are left to
  the daemon (the resume offsets keep them ahead of it). Several DDLs may share a commit ts; they
  run in the order the lowest partition holding them received them, as the barrier does.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from applier.catchup.rows import Places, position
from applier.codec.events import DDLEvent
from applier.stream.progress import DDLKey, ddl_key


@dataclass(frozen=True, slots=True)
class Control:
    """A resolved (``ddl is None``) or DDL event read from ``partition`` at ``offset``/``index``."""

    partition: int
    offset: int
    index: int
    ts: int
    ddl: DDLEvent | None = None


@dataclass(frozen=True, slots=True)
class Epoch:
    """Rows with ``lower < commit ts <= upper``, then ``ddl`` (None for the last epoch)."""

    number: int
    lower: int
    upper: int
    ddl: DDLEvent | None

    @property
    def has_rows(self) -> bool:
        return self.upper > self.lower


def partition_resolved(
    controls: Iterable[Control],
    partitions: Iterable[int],
    floor: int,
    drained: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """Each partition's resolved ts (module docstring); ``floor`` for partitions that gave none.

    ``drained``: partitions read to an end learned after a resolved ts was seen elsewhere, which
    count as resolved at it (several topics: ``applier.catchup.offsets.ReadPlan.drained``).
    """
    out = dict.fromkeys(partitions, floor)
    for p, ts in (drained or {}).items():
        if p in out and ts > out[p]:
            out[p] = ts
    for c in controls:
        if c.ddl is None and c.ts > out.get(c.partition, floor):
            out[c.partition] = c.ts
    return out


def global_resolved(resolved: Mapping[int, int], until: int | None = None) -> int:
    """R: the smallest partition resolved ts, capped by ``until``."""
    if not resolved:
        raise ValueError("a topic has at least one partition")
    r = min(resolved.values())
    return r if until is None else min(r, until)


def ddls_to_run(
    controls: Iterable[Control], lower: int, upper: int, applied: Iterable[DDLKey] = ()
) -> list[DDLEvent]:
    """Distinct DDLs with ``lower < ts <= upper`` not in ``applied``, in execution order."""
    done = set(applied)
    first: dict[DDLKey, tuple[tuple[int, int, int, int], DDLEvent]] = {}
    for c in controls:
        if c.ddl is None or not lower < c.ts <= upper:
            continue
        key = ddl_key(c.ddl)
        if key in done:
            continue
        order = (c.ts, c.partition, c.offset, c.index)
        seen = first.get(key)
        if seen is None or order < seen[0]:
            first[key] = (order, c.ddl)
    return [ddl for _order, ddl in sorted(first.values(), key=lambda item: item[0])]


def plan_epochs(lower: int, upper: int, ddls: list[DDLEvent]) -> list[Epoch]:
    """Epochs covering ``(lower, upper]``, one before each DDL and the last one up to ``upper``."""
    epochs: list[Epoch] = []
    prev = lower
    for ddl in ddls:
        if not lower < ddl.commit_ts <= upper:
            raise ValueError(f"DDL at ts {ddl.commit_ts} is outside the window ({lower}, {upper}]")
        target = ddl.commit_ts - 1
        epochs.append(Epoch(len(epochs) + 1, prev, max(prev, target), ddl))
        prev = max(prev, target)
    epochs.append(Epoch(len(epochs) + 1, prev, max(prev, upper), None))
    return epochs


def plan_catchup(
    controls: Sequence[Control],
    partitions: Iterable[int],
    lower: int,
    *,
    drained: Mapping[int, int] | None = None,
    until: int | None = None,
    applied: Iterable[DDLKey] = (),
) -> tuple[int, list[Epoch]]:
    """R and the epochs of the window ``(lower, R]``: the module docstring's rules in their order.

    No epochs when R is below ``lower`` (the backlog does not reach the window's start yet).
    """
    r = global_resolved(partition_resolved(controls, partitions, lower, drained), until)
    if r < lower:
        return r, []
    return r, plan_epochs(lower, r, ddls_to_run(controls, lower, r, applied))


def epoch_of(epochs: list[Epoch], ts: int) -> Epoch | None:
    """The epoch whose rows include commit ts ``ts``; None when outside the window."""
    uppers = [e.upper for e in epochs]
    i = bisect_left(uppers, ts)
    while i < len(epochs) and not epochs[i].lower < ts <= epochs[i].upper:
        i += 1
    return epochs[i] if i < len(epochs) else None


def ddl_event(
    partition: int,
    offset: int,
    index: int,
    ts: int,
    schema: str,
    table: str,
    query: str,
    ddl_type: int,
    topic: str,
    places: Places | None = None,
) -> DDLEvent:
    """A DDLEvent rebuilt from the Arrow columns of a control row."""
    pos = position(topic, partition, offset, index, places)
    return DDLEvent(ts, schema or "", table or "", query, ddl_type, pos)

"""The hand-off checkpoint: where a job that writes a changefeed leaves ``applier run`` to go on.

Two jobs write one, with the same rows and the same rule:

- the catch-up (:mod:`applier.catchup.job`), once its backlog is applied up to R: global resolved
  ts R, every table it wrote at R, the DDLs it executed, and per partition the resume offset and
  the resolved ts there;
- ``applier run --from-ts X`` (:func:`start_at_ts`) on a changefeed without a checkpoint, whose
  downstream was restored from a backup taken at X: global resolved ts X and no offsets, the
  checkpoint the catch-up would hand over had its backlog been empty.

The daemon reads either like any checkpoint of its own: every row and every DDL at or below the
global resolved ts counts as applied (:mod:`applier.stream.progress`), and a partition without a
stored offset is read from its beginning (``applier.daemon.loop.start_offsets``). So after
``--from-ts X`` the changes at or below X that the topic still holds are read and skipped, and
everything above X is applied, exactly as after a catch-up's hand-off at X.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from applier.downstream.session import close_quietly, connect
from applier.downstream.url import DownstreamConfig
from applier.errors import ConfigurationError
from checkpoint import Checkpoint, CheckpointStore, ddl_fields
from sqlgen.quoting import quote_ident


class FromTsConflict(ConfigurationError):
    """``from_ts`` is above the changefeed's checkpoint: the downstream cannot be both."""


def write_handoff(
    cur: Any,
    store: CheckpointStore,
    *,
    resolved_ts: int,
    topic: str,
    owner: str,
    tables: Iterable[tuple[str, str]] = (),
    offsets: Mapping[Any, int] | None = None,
    partition_resolved: Mapping[Any, int] | None = None,
    ddls: Iterable[Any] = (),
) -> None:
    """Write the hand-off checkpoint in the caller's open transaction (the caller checks its lock
    and commits). ``offsets`` and ``partition_resolved`` are keyed by partition of ``topic``, or by
    (topic, partition) with several topics; a partition without an offset is read from its
    beginning by the daemon. ``ddls`` are the DDL events executed on the way (recorded as applied)."""
    offsets = dict(offsets or {})
    for ddl in ddls:
        store.record_ddl(cur, **ddl_fields(ddl))
    store.forget_partition_applied(cur)
    store.write(
        cur,
        topic=topic,
        resolved_ts=resolved_ts,
        tables=dict.fromkeys(tables, resolved_ts),
        offsets=offsets,
        partition_resolved={p: max(ts, 0) for p, ts in (partition_resolved or {}).items() if p in offsets},
        owner=owner,
    )


def has_checkpoint(ckpt: Checkpoint) -> bool:
    """Whether the changefeed has written anything (a claim alone writes an empty row)."""
    return ckpt.topic is not None or bool(ckpt.resolved_ts or ckpt.topic_offsets or ckpt.tables)


def start_at_ts(
    downstream: DownstreamConfig,
    store: CheckpointStore,
    ckpt: Checkpoint,
    *,
    from_ts: int | None,
    topic: str,
    owner: str,
    before_commit: Callable[[], None],
    log: Any,
) -> Checkpoint:
    """The checkpoint ``applier run`` starts from when ``from_ts`` is set (else ``ckpt`` as it is).

    - No checkpoint yet: the hand-off checkpoint at ``from_ts`` is written (so a restart, with or
      without the setting, starts from it too) and returned.
    - A checkpoint at or above ``from_ts``: the changefeed has run since the restore (or a
      catch-up handed over above it), and the checkpoint says what the downstream holds: the
      setting is ignored, with a log line. It may stay in the configuration after the first start,
      as ``start`` may; the catch-up and the daemon can share one file.
    - A checkpoint below ``from_ts``: the downstream was restored at a newer ts than the
      checkpoint describes, and going on from either would apply changes twice or skip some: a
      configuration error naming both and the way on (clear the checkpoint, or drop the setting).

    A checkpoint that was written for this changefeed before the restore and that lies above
    ``from_ts`` cannot be told from progress made since: clear it when restoring
    (docs/quickstart.md says so).
    """
    if from_ts is None:
        return ckpt
    if has_checkpoint(ckpt):
        if ckpt.resolved_ts < from_ts:
            group = store.changefeed.replace("'", "''")
            raise FromTsConflict(
                f"from_ts {from_ts} is above the checkpoint of changefeed {store.changefeed!r} "
                f"(resolved ts {ckpt.resolved_ts}): the downstream cannot be both; if it was "
                f"restored at {from_ts}, clear the checkpoint (DELETE FROM each table of "
                f"{quote_ident(store.schema)} WHERE changefeed = '{group}') or use another group_id; "
                "otherwise drop from_ts"
            )
        log.info(
            "from_ts ignored: the changefeed has a checkpoint at or above it",
            from_ts=from_ts,
            checkpoint_ts=ckpt.resolved_ts,
        )
        return ckpt
    conn = connect(downstream)
    try:
        with conn.cursor() as cur:
            write_handoff(cur, store, resolved_ts=from_ts, topic=topic, owner=owner)
            before_commit()
        conn.commit()
    finally:
        close_quietly(conn)
    log.info(
        "starting at from_ts: changes at or below it are skipped, partitions read from their beginning",
        from_ts=from_ts,
    )
    return dataclasses.replace(ckpt, resolved_ts=from_ts, topic=topic)

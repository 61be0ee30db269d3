"""Start-up of a job that writes a changefeed, the same for the daemon and the catch-up.

The steps, in this order (each one needs the one before):

1. ``prepare_downstream``: the checkpoint schema exists (created or upgraded) and the server's SQL
   dialect is known;
2. the caller takes the single-active lock (``applier.downstream.lock``): the daemon waits for it
   as a standby, the catch-up refuses to start while another instance holds it;
3. ``load_checkpoint``: the checkpoint is claimed for this lock's owner (an older owner is fenced
   out), a DDL a crash interrupted is settled (recorded or forgotten, ``applier.apply.ddl``), and
   the checkpoint is read. A checkpoint written for another topic stops the job: its offsets and
   resolved ts mean nothing for this one (a changed set of topics of the same changefeed goes on).

Steps 1 and 3 write (the schema, the claim), so a downstream that is read-only or full for now
fails them with a transient error, and a server that does not answer yet (a boot where the
database comes up after the applier) fails them too: :func:`run_startup_step` waits all of these
out the way the windows do, saying what it waits for. What a restart cannot fix ends the job at
once with its one line: a refused login or TLS handshake, a missing privilege (with the GRANT
that gives it), a checkpoint of another topic.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from applier.apply.ddl import DDLExecutor, detect_dialect
from applier.downstream.errors import describe, is_transient
from applier.downstream.retry import Backoff, RetryInfo, RetryLog, run_with_retry
from applier.downstream.session import close_quietly, connect, privileges_needed
from applier.downstream.url import DownstreamConfig
from applier.errors import FatalError
from checkpoint import Checkpoint, CheckpointStore
from checkpoint.schema import PRIVILEGES
from sqlgen import Dialect
from sqlgen.quoting import quote_ident

T = TypeVar("T")


class CheckpointTopicMismatch(FatalError):
    """The changefeed's checkpoint belongs to another topic."""


def prepare_downstream(downstream: DownstreamConfig, store: CheckpointStore) -> Dialect:
    """Create or check the checkpoint schema; return the server's SQL dialect."""
    conn = connect(downstream, multi_statements=True)  # the applier's own statements only
    try:
        with _checkpoint_privileges(conn, store):
            store.ensure_schema(conn)
        return detect_dialect(conn)
    finally:
        close_quietly(conn)


def load_checkpoint(
    downstream: DownstreamConfig, store: CheckpointStore, ddl_executor: DDLExecutor, *, owner: str, topic: str
) -> Checkpoint:
    """Claim the checkpoint for ``owner``, settle an interrupted DDL, and read the checkpoint."""
    conn = connect(downstream, multi_statements=True)  # the applier's own statements only
    try:
        with _checkpoint_privileges(conn, store):
            store.claim(conn, owner)
        ddl_executor.settle(conn)  # a DDL a crash interrupted: recorded or forgotten
        ckpt = store.load(conn)
    finally:
        close_quietly(conn)
    if (
        ckpt.topic is not None
        and ckpt.topic != topic
        and ckpt.resolved_ts
        and not _same_changefeed(ckpt, topic)
    ):
        raise CheckpointTopicMismatch(
            f"changefeed {store.changefeed!r} has a checkpoint for topic {ckpt.topic!r}, not {topic!r}; "
            "use another --group-id or reset the checkpoint"
        )
    return ckpt


def _checkpoint_privileges(conn: Any, store: CheckpointStore) -> contextlib.AbstractContextManager[None]:
    return privileges_needed(
        conn,
        privileges=PRIVILEGES,
        on=f"{quote_ident(store.schema)}.*",
        purpose=f"on the checkpoint schema {store.schema!r}",
    )


def _same_changefeed(ckpt: Checkpoint, topic: str) -> bool:
    """A changed topic *set* still reads the same changefeed when a topic the checkpoint holds
    offsets of belongs to both the stored and the new set (a table topic added to or removed from
    the list, a list turned into a pattern). Its topics keep their offsets; a topic new to the set
    starts at its beginning, as any partition without a stored offset does."""
    from applier.kafka.topics import TopicSet

    try:
        stored = TopicSet.parse(ckpt.topic or "")
    except ValueError:
        return False
    new = TopicSet.parse(topic)
    if stored.single is not None and new.single is not None:
        return False
    return new.overlaps(stored, {t for t, _p in ckpt.topic_offsets})


def startup_retryable(exc: BaseException) -> bool:
    """What start-up waits out: every transient database error, a server that does not answer
    included (see the module doc)."""
    return is_transient(exc)


def run_startup_step(
    step: Callable[[], T],
    *,
    retry_log: RetryLog,
    on_retry: Callable[[BaseException], None] = lambda exc: None,
    on_waiting: Callable[[str | None], None] = lambda reason: None,
    waiting_for: str = "the downstream database",
    retryable: Callable[[BaseException], bool] = startup_retryable,
    sleep: Callable[[float], None] = time.sleep,
    backoff: Backoff | None = None,
) -> T:
    """Run a start-up step (it opens and closes what it uses) until it succeeds; errors that
    ``retryable`` accepts are retried without end, with capped backoff, logged by ``retry_log``,
    passed to ``on_retry`` (the metrics) and told to ``on_waiting`` as one line saying what the
    start waits for (health, systemd's STATUS=); ``on_waiting(None)`` once it got through.
    ``sleep`` may raise to give up (the daemon's stop)."""

    def failed(info: RetryInfo) -> None:
        on_retry(info.error)
        retry_log.failed(info)
        on_waiting(f"waiting for {waiting_for}: {describe(info.error)}")

    result = run_with_retry(
        step,
        reconnect=lambda: None,
        max_attempts=None,
        max_time=None,
        backoff=backoff,
        on_retry=failed,
        retryable=retryable,
        sleep=sleep,
    )
    retry_log.succeeded()
    on_waiting(None)
    return result

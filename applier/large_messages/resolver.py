"""Large-message events become ordinary row events before the listeners see them (docs/open-protocol.md §9).

The stage sits between the decoder and the listeners: a record holding a claim-check reference
or a handle-key-only event waits here while its rows are fetched, and so does every later record
of its partition (a listener takes a partition's records in offset order); other partitions go on.
The fetches run on a small thread pool, several at a time (one job per claim-check object, one per
table and commit ts for handle-key-only rows), so a slow object store costs latency, not
throughput. Memory is bounded: the records waiting here count against ``max_waiting_bytes`` and
the daemon stops reading the partitions that hold them while it is exceeded.

A fetch that cannot succeed (object missing or not a claim-check message, row not upstream at that
ts, storage or upstream unreachable for longer than the retry budget) is reported like a malformed
record: :class:`LargeMessageUnavailable` names topic, partition, offset and what was missing, the
record and everything after it on its partition are never fed, so the barrier stops before it and
the checkpoint never passes it; a restart after the object is restored reads it again.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

import tenacity

from applier.codec.decoder import DecoderOptions
from applier.codec.events import Event, LargeMessageEvent, Row, RowEvent, RowKind
from applier.large_messages.claim_check import BadClaimCheckObject, row_from_object
from applier.large_messages.errors import (
    LargeMessageError,
    LargeMessageNotConfigured,
    LargeMessageUnavailable,
    where,
)
from applier.large_messages.storage import ObjectStore, ObjectStoreError
from applier.large_messages.upstream import UpstreamReader, UpstreamRowMissing, UpstreamUnreachable
from applier.ops.logs import get_logger


@dataclass(slots=True)
class _Job:
    """Fetches for some events of one record: ``run()`` returns (index -> row event, bytes read)."""

    run: Callable[[], tuple[dict[int, RowEvent], int]]
    future: Future | None = None
    dropped: bool = False  # its record was dropped before the job started


def row_bytes(row: RowEvent) -> int:
    """Memory held by the string and bytes values of a resolved row (both images): what it adds
    to the row cache beyond its record's bytes. Counted as Python holds them (a text of accented
    or CJK characters takes 2 to 4 bytes a character), not as fetched (compressed)."""
    total = 0
    for img in (row.new, row.old):
        if img:
            for col in img.values():
                v = col["v"]
                if type(v) is str or type(v) is bytes:
                    total += sys.getsizeof(v)
    return total


def _ohk_key(ev: LargeMessageEvent) -> Row:
    assert ev.row is not None
    img = ev.row.new if ev.row.new is not None else ev.row.old
    assert img is not None
    return img


class LargeMessageResolver:
    """Turns the large-message events of a record into the row events they stand for.

    ``store``: where claim-check objects are read (None: claim-check events are refused);
    ``upstream``: where handle-key-only rows are read (None: refused). ``retry_seconds``: how long
    an unreachable upstream is asked again before the event is reported (object stores retry by
    themselves).
    """

    def __init__(
        self,
        *,
        options: DecoderOptions,
        store: ObjectStore | None = None,
        upstream: UpstreamReader | None = None,
        retry_seconds: float = 120.0,
    ) -> None:
        self.options = options
        self.store = store
        self.upstream = upstream
        self.retry_seconds = retry_seconds
        self._closed = threading.Event()  # set by close(): retry waits end at once
        self.log = get_logger(component="large-messages")

    def jobs(self, events: Sequence[Event]) -> list[_Job]:
        """The fetches a record needs (raises LargeMessageNotConfigured for an event without source)."""
        jobs: list[_Job] = []
        groups: dict[tuple[int, str, str], list[tuple[int, LargeMessageEvent]]] = {}
        deletes: dict[int, RowEvent] = {}
        for i, ev in enumerate(events):
            if type(ev) is not LargeMessageEvent:
                continue
            if ev.claim_check_location is not None:
                if self.store is None:
                    raise LargeMessageNotConfigured(ev)
                jobs.append(_Job(self._claim_check_job(i, ev)))
                continue
            if self.upstream is None:
                raise LargeMessageNotConfigured(ev)
            assert ev.row is not None, "the decoder refuses a handle-key-only event without columns"
            if ev.row.kind is RowKind.DELETE:
                deletes[i] = ev.row  # deleted by key: nothing to read
            else:
                groups.setdefault((ev.commit_ts, ev.schema, ev.table), []).append((i, ev))
        if deletes:
            jobs.append(_Job(lambda: (deletes, 0)))
        for (ts, schema, table), members in groups.items():
            jobs.append(_Job(self._upstream_job(ts, schema, table, members)))
        return jobs

    def _claim_check_job(
        self, index: int, ev: LargeMessageEvent
    ) -> Callable[[], tuple[dict[int, RowEvent], int]]:
        store, options = self.store, self.options
        assert store is not None

        def run() -> tuple[dict[int, RowEvent], int]:
            name = ev.claim_check_name
            assert name is not None
            try:
                data = store.read(name)
            except ObjectStoreError as exc:
                raise LargeMessageUnavailable(
                    f"{where(ev.pos)}: claim-check reference (ccl {ev.claim_check_location!r}): {exc}; "
                    "nothing from this record on is applied: restore the object (or correct "
                    "claim_check_storage_uri) and start again",
                    ev.pos,
                ) from None
            try:
                row = row_from_object(data, ev, options)
            except BadClaimCheckObject as exc:
                raise LargeMessageUnavailable(
                    f"{where(ev.pos)}: claim-check object {name!r} in {store.describe()} is not the row "
                    f"the reference announced: {exc.reason}",
                    ev.pos,
                ) from None
            return {index: row}, row_bytes(row)

        return run

    def _upstream_job(
        self, ts: int, schema: str, table: str, members: list[tuple[int, LargeMessageEvent]]
    ) -> Callable[[], tuple[dict[int, RowEvent], int]]:
        upstream = self.upstream
        assert upstream is not None

        def run() -> tuple[dict[int, RowEvent], int]:
            keys = [_ohk_key(ev) for _i, ev in members]
            pos = members[0][1].pos
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(UpstreamUnreachable),
                stop=tenacity.stop_after_delay(self.retry_seconds)
                | tenacity.stop_when_event_set(self._closed),
                wait=tenacity.wait_exponential(multiplier=0.5, max=10),
                sleep=self._closed.wait,  # a stop ends the wait at once
                before_sleep=lambda state: self.log.warning(
                    "upstream unreachable, retrying",
                    error=str(state.outcome.exception()) if state.outcome else None,
                    attempt=state.attempt_number,
                ),
                reraise=True,
            )
            try:
                full = retrying(upstream.rows_as_of, ts, schema, table, keys)
            except UpstreamRowMissing as exc:
                raise LargeMessageUnavailable(
                    f"{where(pos)}: handle-key-only row of `{schema}`.`{table}` at commit ts {ts} "
                    f"from upstream {upstream.describe()}: {exc}; nothing from this record on is applied",
                    pos,
                ) from None
            except UpstreamUnreachable as exc:
                raise LargeMessageUnavailable(
                    f"{where(pos)}: cannot read handle-key-only rows of `{schema}`.`{table}` from "
                    f"upstream (retried for {self.retry_seconds:.0f}s): {exc}",
                    pos,
                ) from None
            out: dict[int, RowEvent] = {}
            for (i, ev), new in zip(members, full, strict=True):
                ref = ev.row
                assert ref is not None
                old = ref.old
                if old is not None and old.keys() != new.keys():
                    old = {**{n: c for n, c in new.items() if n not in old}, **old}
                out[i] = RowEvent(ts, schema, table, ref.kind, new, old, ref.partition_id, ev.pos, ref.row_id)
            return out, sum(row_bytes(r) for r in out.values())

        return run

    def resolve(self, events: Sequence[Event]) -> tuple[list[Event], int]:
        """The record's events with every large-message event replaced, fetched here and now."""
        found: dict[int, RowEvent] = {}
        size = 0
        for job in self.jobs(events):
            rows, n = job.run()
            found.update(rows)
            size += n
        return [found.get(i, ev) for i, ev in enumerate(events)], size  # type: ignore[misc]

    def describe(self) -> str:
        """The configured sources, safe to log."""
        parts = []
        if self.store is not None:
            parts.append(f"claim-check objects from {self.store.describe()}")
        if self.upstream is not None:
            parts.append(f"handle-key-only rows from {self.upstream.describe()}")
        return "; ".join(parts) or "refused"

    def close(self) -> None:
        self._closed.set()
        if self.upstream is not None:
            self.upstream.close()


@dataclass(slots=True)
class _Waiting:
    item: Any
    events: Sequence[Event]
    size: int
    jobs: list[_Job] = field(default_factory=list)

    def done(self) -> bool:
        return all(j.future is not None and j.future.done() for j in self.jobs)


class LargeMessageQueue:
    """Records waiting for their large messages, per partition, in offset order (module docstring).

    ``add`` takes a record (``item`` is the caller's, returned as is) with its decoded events;
    ``ready`` hands back, per partition and in order, the records whose fetches are finished, their
    large-message events replaced. A failure is handed back instead, once, and the partition's
    waiting records are dropped.
    """

    def __init__(
        self, resolver: LargeMessageResolver, *, workers: int = 8, max_waiting_bytes: int = 256 << 20
    ) -> None:
        self.resolver = resolver
        self.workers = workers
        self.max_waiting_bytes = max_waiting_bytes
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="large-message")
        self._unstarted: deque[_Job] = deque()  # jobs not handed to the pool yet, in arrival order
        self._running = 0  # jobs handed to the pool and not finished
        self._waiting: dict[int, deque[_Waiting]] = {}
        self._bytes: dict[int, int] = {}  # record bytes waiting, per partition
        self._lock = threading.Lock()
        self._fetched_waiting = 0  # bytes fetched for records not handed back yet
        self.fetched_bytes = 0
        self.resolved_events = 0

    def holds_large(self, events: Sequence[Event]) -> bool:
        """Whether a record's events include a large-message event (then it must wait here)."""
        return any(type(ev) is LargeMessageEvent for ev in events)

    def holds(self, partition: int) -> bool:
        """Whether records of ``partition`` wait here (a later record must queue behind them)."""
        return partition in self._waiting

    def busy(self) -> bool:
        return bool(self._waiting)

    def add(self, partition: int, item: Any, events: Sequence[Event], size: int) -> None:
        """Queue a record; start its fetches. Raises LargeMessageNotConfigured (nothing queued)."""
        jobs = self.resolver.jobs(events)
        waiting = _Waiting(item, events, size, jobs)
        self._waiting.setdefault(partition, deque()).append(waiting)
        self._bytes[partition] = self._bytes.get(partition, 0) + size
        self._unstarted.extend(jobs)
        self._start_jobs()

    def _start_jobs(self) -> None:
        """Hand jobs to the pool in arrival order while fewer than ``workers`` run and what was
        fetched and not fed yet is under the bound, so memory stays within ``max_waiting_bytes``
        plus what the running jobs read. Never stuck: the jobs that started first belong to the
        oldest records, whose rows are fed (and uncounted) as soon as they are done."""
        while self._unstarted:
            with self._lock:
                if self._running >= self.workers or self._fetched_waiting >= self.max_waiting_bytes:
                    return
                self._running += 1
            job = self._unstarted.popleft()
            if job.dropped:
                with self._lock:
                    self._running -= 1
                continue
            job.future = self._pool.submit(job.run)
            job.future.add_done_callback(self._count_fetched)

    def _count_fetched(self, future: Future) -> None:
        """Bytes fetched and not fed yet count against the bound (a worker thread calls this)."""
        with self._lock:
            self._running -= 1
            if not future.cancelled() and future.exception() is None:
                self._fetched_waiting += future.result()[1]

    def ready(self) -> tuple[list[tuple[Any, list[Event], int]], list[LargeMessageError]]:
        """(records ready to feed: (item, events, bytes fetched)), failures) since the last call."""
        self._start_jobs()
        out: list[tuple[Any, list[Event], int]] = []
        failures: list[LargeMessageError] = []
        for partition in list(self._waiting):
            queue = self._waiting[partition]
            while queue and queue[0].done():
                head = queue.popleft()
                self._bytes[partition] -= head.size
                try:
                    found: dict[int, RowEvent] = {}
                    fetched = 0
                    for job in head.jobs:
                        assert job.future is not None
                        rows, n = job.future.result()
                        found.update(rows)
                        fetched += n
                except LargeMessageError as exc:
                    failures.append(exc)
                    self._forget(head)
                    self.drop(partition)
                    break
                self.fetched_bytes += fetched
                with self._lock:
                    self._fetched_waiting -= fetched
                self.resolved_events += len(found)
                events = [found.get(i, ev) for i, ev in enumerate(head.events)]
                out.append((head.item, events, fetched))  # type: ignore[arg-type]
            if not queue:
                self._waiting.pop(partition, None)
                self._bytes.pop(partition, None)
        self._start_jobs()
        return out, failures

    def wait(self, timeout: float) -> None:
        """Block until some partition's first waiting record is finished, or ``timeout``."""
        self._start_jobs()
        pending = [
            j.future
            for q in self._waiting.values()
            if q
            for j in q[0].jobs
            if j.future is not None and not j.future.done()
        ]
        if pending:
            wait_futures(pending, timeout=timeout, return_when=FIRST_COMPLETED)

    def over_limit(self) -> set[int]:
        """Partitions to stop reading: records are waiting on them and the total is over the bound."""
        if sum(self._bytes.values()) + self._fetched_waiting <= self.max_waiting_bytes:
            return set()
        return set(self._waiting)

    def drop(self, partition: int) -> None:
        """Forget the partition's waiting records (after a failure: none of them is fed)."""
        for waiting in self._waiting.pop(partition, ()):
            self._forget(waiting)
        self._bytes.pop(partition, None)

    def _forget(self, waiting: _Waiting) -> None:
        """Cancel what has not run of a record's fetches; uncount what was fetched."""
        fetched = 0
        for job in waiting.jobs:
            future = job.future
            if future is None:
                job.dropped = True
                continue
            if future.done():
                if not future.cancelled() and future.exception() is None:
                    fetched += future.result()[1]
            else:
                future.cancel()
        with self._lock:
            self._fetched_waiting -= fetched

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.resolver.close()

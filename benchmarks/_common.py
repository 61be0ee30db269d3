"""What the benchmarks share: the sysbench-shaped Open Protocol stream, producing it, the
database checks, and running the daemon as a child process with its peak RSS measured."""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import orjson
import pymysql

ROOT = Path(__file__).resolve().parent.parent
TABLE = "sbtest1"  # the first (with one table, the only) table of the stream
PAD_BYTES = 59  # sysbench's pad value: 5 groups of 11 digits; its column is CHAR(60)
BATCH_EVENTS = 16  # TiCDC's default max-batch-size
_U64 = struct.Struct(">Q")
_VERSION = _U64.pack(1)

# TiCDC flags: ints carry the binary-charset flag; id is handle + primary key; k is in an index.
_F_ID = 0x01 | 0x02 | 0x08
_F_K = 0x01 | 0x20
_TYPE_INT, _TYPE_VARCHAR, _TYPE_CHAR = 3, 15, 254


def table_names(tables: int) -> list[str]:
    """The names of a stream of ``tables`` tables, as sysbench names them: sbtest1..sbtestN."""
    return [f"sbtest{number}" for number in range(1, tables + 1)]


def table_ddl(schema: str, table: str = TABLE, pad_bytes: int = PAD_BYTES) -> str:
    """sysbench's table; ``pad`` is CHAR(60) at sysbench's width, else a VARCHAR just wide enough
    (CHAR stops at 255 characters)."""
    pad_column = "CHAR(60)" if pad_bytes == PAD_BYTES else f"VARCHAR({pad_bytes})"
    return (
        f"CREATE TABLE `{schema}`.`{table}` (`id` INT NOT NULL, `k` INT NOT NULL DEFAULT 0, "
        f"`c` CHAR(120) NOT NULL DEFAULT '', `pad` {pad_column} NOT NULL DEFAULT '', "
        "PRIMARY KEY (`id`), KEY `k_1` (`k`))"
    )


# -- the stream -------------------------------------------------------------------------------


def _filler(rng: random.Random, length: int) -> str:
    """sysbench's c/pad filler: groups of 11 digits joined by '-', cut to ``length`` characters
    (sysbench's own widths, 119 and 59, are whole groups: the same draws as ever)."""
    groups = (length + 12) // 12
    return "-".join(f"{rng.randrange(10**11):011d}" for _ in range(groups))[:length]


@dataclass
class Stream:
    """What the generator produced: the tables' state after the last transaction, and counts."""

    # every table's rows by id after the last transaction, sbtest1's first (one table: only it)
    finals: list[dict[int, tuple[int, str, str]]] = field(default_factory=lambda: [{}])
    events: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    transactions: int = 0
    records: int = 0
    resolved_broadcasts: int = 0
    value_bytes: int = 0

    produced: int = 0  # records produced: the row records, the DDL and resolved broadcasts
    produce_s: float = 0.0  # seconds generating and producing them took

    @property
    def final(self) -> dict[int, tuple[int, str, str]]:
        """sbtest1's rows by id (the benchmarks of one table read only these)."""
        return self.finals[0]

    @property
    def final_rows(self) -> int:
        """Rows over every table after the last transaction."""
        return sum(len(final) for final in self.finals)

    def summary(self, detail: str = "") -> str:
        """What every benchmark prints about its stream once produced (``detail`` after the count
        of records)."""
        return (
            f"{self.events:,} row events ({self.inserts:,} inserts, {self.updates:,} updates, "
            f"{self.deletes:,} deletes) in {self.transactions:,} transactions, {self.produced:,} records"
            f"{detail}; generated+produced in {self.produce_s:.1f} s"
        )


class Generator:
    """Builds the Open Protocol records of the benchmark stream, partition by partition.

    Row events of one partition are batched 16 per record in commit-ts order; before each resolved
    broadcast every partition's partial batch is flushed, so a resolved R follows every row <= R.

    ``tables``: the tables sbtest1..sbtestN (each its own CREATE TABLE, its own ids and final
    state); each row event goes to one of them, picked uniformly, so that a transaction may span
    several. ``pad_bytes``: the length of the ``pad`` values, the knob of the row width. At the
    defaults the stream is the one-table stream of sysbench's width, byte for byte the same for
    the same seed (the table pick draws nothing then), so results stay comparable.
    """

    def __init__(
        self,
        schema: str,
        partitions: int,
        seed: int,
        resolved_every: int,
        *,
        tables: int = 1,
        pad_bytes: int = PAD_BYTES,
    ) -> None:
        self.schema = schema
        self.partitions = partitions
        self.rng = random.Random(seed)
        self.resolved_every = resolved_every
        self.tables = tables
        self.table_names = table_names(tables)
        self.pad_bytes = pad_bytes
        self.pad_type = _TYPE_CHAR if pad_bytes == PAD_BYTES else _TYPE_VARCHAR  # as ``table_ddl``
        self.setup_resolved = False
        rng = random.Random(seed + 1)
        self.c_pool = [_filler(rng, 119) for _ in range(4096)]
        self.pad_pool = [_filler(rng, pad_bytes) for _ in range(4096)]
        self.key_prefix = b'{"ts":'
        self.key_suffixes = [
            f',"scm":"{schema}","tbl":"{name}","t":1}}'.encode() for name in self.table_names
        ]
        self.key_suffix = self.key_suffixes[0]
        self.pending: list[list[tuple[bytes, bytes]]] = [[] for _ in range(partitions)]
        self.stream = Stream()
        self.stream.finals.extend({} for _ in range(tables - 1))
        self.create_table_ts = 0  # the commit ts of the first CREATE TABLE, once ``records`` sent it
        self.batch_events = BATCH_EVENTS  # row events a record holds at most
        self._r = 0.0  # the draw of ``_inserts`` that ``_deletes`` decides by

    # Column order is by name (TiCDC marshals a Go map): c, id, k, pad.
    def _image(self, row_id: int, k: int, c: str, pad: str) -> str:
        return (
            f'{{"c":{{"t":{_TYPE_CHAR},"f":0,"v":"{c}"}},'
            f'"id":{{"t":{_TYPE_INT},"h":true,"f":{_F_ID},"v":{row_id}}},'
            f'"k":{{"t":{_TYPE_INT},"f":{_F_K},"v":{k}}},'
            f'"pad":{{"t":{self.pad_type},"f":0,"v":"{pad}"}}}}'
        )

    def partition_of(self, row_id: int, table_no: int = 0) -> int:
        """The partition of row ``row_id`` of the ``table_no``-th table (from 0): TiCDC's
        index-value dispatcher hashes the table's name with the key, so equal ids of two tables
        land apart; the first table's hash is the key's alone."""
        return ((row_id * 2654435761 + table_no * 0x9E3779B9) & 0xFFFFFFFF) % self.partitions

    def _frame(self, pairs: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
        kparts = [_VERSION]
        vparts = []
        pack = _U64.pack
        for k, v in pairs:
            kparts.append(pack(len(k)))
            kparts.append(k)
            vparts.append(pack(len(v)))
            vparts.append(v)
        return b"".join(kparts), b"".join(vparts)

    def _ddl(self, ts: int, table: str, ddl_type: int, query: str) -> Iterator[tuple[int, bytes, bytes]]:
        key = f'{{"ts":{ts},"scm":"{self.schema}","tbl":"{table}","t":2}}'.encode()
        value = orjson.dumps({"q": query, "t": ddl_type})
        k, v = self._frame([(key, value)])
        for p in range(self.partitions):
            yield p, k, v

    def _resolved(self, ts: int) -> Iterator[tuple[int, bytes, bytes]]:
        yield from self._flush_all()
        key, value = self._frame([(f'{{"ts":{ts},"t":3}}'.encode(), b"")])
        self.stream.resolved_broadcasts += 1
        for p in range(self.partitions):
            yield p, key, value

    def _flush(self, p: int) -> Iterator[tuple[int, bytes, bytes]]:
        batch = self.pending[p]
        if batch:
            self.pending[p] = []
            k, v = self._frame(batch)
            self.stream.records += 1
            self.stream.value_bytes += len(v)
            yield p, k, v

    # What the next row event is: the hooks a generator of another mix overrides (the loop of
    # ``records`` is the same for every mix).

    def _begin(self, events: int) -> None:
        """Called once the two CREATE DDLs are out, before the first row event."""

    def _after_schema(self, ts: int) -> Iterator[tuple[int, bytes, bytes]]:
        """Records after the CREATE DDLs (the last at ``ts``), before the first row event: none
        here, or a resolved broadcast when ``setup_resolved`` (``produce``'s ``prime``)."""
        if self.setup_resolved:
            yield from self._resolved(ts)

    def _inserts(self, next_id: int, live: int, touched: int) -> bool:
        """Whether the next row event inserts a new row (else it updates or deletes a live one);
        ``live`` rows exist, ``touched`` of them already changed in this transaction. Here about 70%
        inserts: always while there are too few untouched rows to pick from."""
        self._r = r = self.rng.random()
        return not (r >= 0.7 and live > touched + 16)

    def _deletes(self) -> bool:
        """Whether the live row just picked is deleted (else updated): 10% of all events here."""
        return self._r >= 0.9

    def _size(self, left: int) -> int:
        """Row events of the next transaction (``left`` to go): 1-7 here."""
        return min(self.rng.randint(1, 7), left)

    def _pick(self, live: list[int]) -> int:
        """The live row an update or delete changes: any, uniformly, here."""
        return live[self.rng.randrange(len(live))]

    # When things happen: the hooks a generator paced by the clock overrides.

    def _first_ts(self) -> int:
        """The commit ts of the CREATE DATABASE: an hour ago, so that lag figures stay sensible."""
        return (int(time.time() * 1000) - 3_600_000) << 18

    def _next_ts(self, ts: int, done: int) -> int:
        """The commit ts of the next DDL or transaction after ``ts`` (``done`` row events so far):
        a millisecond later here, whatever the clock says."""
        return ts + (1 << 18)

    def _resolved_due(self, transactions: int) -> bool:
        """Whether a resolved ts is broadcast after this many transactions."""
        return transactions % self.resolved_every == 0

    # What else the stream holds: the hook of a generator that writes other tables or DDLs too.

    def _after_transaction(self, ts: int, done: int) -> Iterator[tuple[int, bytes, bytes]]:
        """Records after the rows of the transaction at ``ts`` (``done`` row events so far): more
        rows of it (``_row``), or DDLs after it (``_flush_all`` first); returns the commit ts the
        stream stands at then. Nothing here."""
        yield from ()
        return ts

    def _row(self, p: int, key: bytes, value: bytes) -> Iterator[tuple[int, bytes, bytes]]:
        """Add a row event to partition ``p``'s batch, sending the batch once full."""
        batch = self.pending[p]
        batch.append((key, value))
        if len(batch) == self.batch_events:
            yield from self._flush(p)

    def _flush_all(self) -> Iterator[tuple[int, bytes, bytes]]:
        """Send every partition's partial batch (before a DDL: TiCDC writes it after the rows
        before it)."""
        for p in range(self.partitions):
            yield from self._flush(p)

    def records(self, events: int) -> Iterator[tuple[int, bytes, bytes]]:
        """(partition, key, value) of every record, in production order."""
        rng = self.rng
        st = self.stream
        tables = self.tables
        # per table (by its index): its rows now, the live ids (to pick from) and where each
        # stands in that list, the next id to insert
        finals = st.finals
        lives: list[list[int]] = [[] for _ in range(tables)]
        wheres: list[dict[int, int]] = [{} for _ in range(tables)]
        next_ids = [1] * tables
        c_pool, pad_pool = self.c_pool, self.pad_pool
        npool = len(c_pool)
        image = self._image
        part = self.partition_of
        pending = self.pending
        kpre, ksufs = self.key_prefix, self.key_suffixes
        inserts, deletes = self._inserts, self._deletes
        next_ts, resolved_due = self._next_ts, self._resolved_due
        batch_events = self.batch_events
        ts = self._first_ts()
        yield from self._ddl(ts, "", 1, f"CREATE DATABASE `{self.schema}`")
        for name in self.table_names:
            ts = next_ts(ts, 0)
            self.create_table_ts = self.create_table_ts or ts
            yield from self._ddl(ts, name, 3, table_ddl(self.schema, name, self.pad_bytes))
        yield from self._after_schema(ts)
        self._begin(events)
        done = 0
        txns = 0
        while done < events:
            ts = next_ts(ts, done)
            ts_bytes = str(ts).encode()
            keys = [kpre + ts_bytes + ksuf for ksuf in ksufs]
            # per table: the rows this transaction changed
            touched: list[set[int]] = [set() for _ in range(tables)]
            size = self._size(events - done)
            for _ in range(size):
                t = rng.randrange(tables) if tables > 1 else 0
                final, live, where, changed = finals[t], lives[t], wheres[t], touched[t]
                if inserts(next_ids[t], len(live), len(changed)):
                    row_id = next_ids[t]
                    next_ids[t] += 1
                    row = (
                        rng.randrange(1 << 31),
                        c_pool[rng.randrange(npool)],
                        pad_pool[rng.randrange(npool)],
                    )
                    final[row_id] = row
                    where[row_id] = len(live)
                    live.append(row_id)
                    value = f'{{"u":{image(row_id, *row)}}}'
                    st.inserts += 1
                else:
                    while True:
                        row_id = self._pick(live)
                        if row_id not in changed:
                            break
                    old = final[row_id]
                    old_img = image(row_id, *old)
                    if deletes():
                        del final[row_id]
                        i = where.pop(row_id)
                        last = live.pop()
                        if last != row_id:
                            live[i] = last
                            where[last] = i
                        value = f'{{"d":{old_img}}}'
                        st.deletes += 1
                    else:
                        row = (rng.randrange(1 << 31), c_pool[rng.randrange(npool)], old[2])
                        final[row_id] = row
                        value = f'{{"u":{image(row_id, *row)},"p":{old_img}}}'
                        st.updates += 1
                changed.add(row_id)
                p = part(row_id, t)
                batch = pending[p]
                batch.append((keys[t], value.encode()))
                if len(batch) == batch_events:
                    yield from self._flush(p)
            done += size
            txns += 1
            ts = yield from self._after_transaction(ts, done)
            if resolved_due(txns):
                yield from self._resolved(ts)
        st.events = done
        st.transactions = txns
        yield from self._resolved(next_ts(ts, done))


def new_producer(bootstrap: str, linger_ms: int = 20):
    """A producer as TiCDC's sink is set up (idempotent, acks=all, no compression), batching for
    ``linger_ms``."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "batch.size": 1 << 20,
            "queue.buffering.max.kbytes": 262144,
            "compression.type": "none",
        }
    )


def send(producer, topic: str, p: int, key: bytes, value: bytes, on_delivery) -> None:
    """Produce one record, waiting for room in the client's queue when it is full."""
    while True:
        try:
            producer.produce(topic, key=key, value=value, partition=p, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)


def finish_producing(producer, errors: list[str]) -> None:
    """Wait for every record's acknowledgement; fail loudly on any delivery error."""
    left = producer.flush(120)
    if left or errors:
        raise SystemExit(f"producing failed: {left} records unacknowledged, errors: {errors[:3]}")


def produce(
    bootstrap: str, topic: str, gen: Generator, events: int, prime: Callable[[], None] | None = None
) -> Stream:
    """Create ``topic`` (a partition per partition of ``gen``) and produce every record of the
    stream into it; returns the stream's figures (with the records produced and the seconds it
    took). Fails loudly on any delivery error.

    ``prime``: called once the stream's set-up (its CREATE DDLs and the first resolved broadcast,
    no row yet) is in the topic, before the rows are produced: a daemon run there leaves a
    checkpoint with an offset for every partition, as a daemon that has been running has."""
    from applier.kafka.embedded_broker import create_topic

    create_topic(bootstrap, topic, gen.partitions)
    t0 = time.perf_counter()
    producer = new_producer(bootstrap)
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    sent = 0
    resolved = 0
    for p, key, value in gen.records(events):
        send(producer, topic, p, key, value, on_delivery)
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
        if prime is not None and key.endswith(RESOLVED_KEY_END):
            resolved += 1
            if resolved == gen.partitions:  # the first broadcast is complete
                finish_producing(producer, errors)
                prime()
                producer = new_producer(bootstrap)
    finish_producing(producer, errors)
    gen.stream.produced = sent
    gen.stream.produce_s = time.perf_counter() - t0
    return gen.stream


# -- a stream paced by the clock ----------------------------------------------------------------


def paced_stream_arguments(ap, *, rate: float, seed: int, linger_ms: int = 5) -> None:
    """The options of a paced stream (``PacedGenerator``, ``produce_paced``) on argument parser ``ap``."""
    ap.add_argument("--rate", type=float, default=rate, help=f"row events per second (default {rate:,.0f})")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--resolved-interval", type=float, default=1.0, help="seconds between resolved ts")
    ap.add_argument(
        "--linger-ms", type=int, default=linger_ms, help=f"the producer's linger.ms ({linger_ms})"
    )
    ap.add_argument("--seed", type=int, default=seed)


RESOLVED_KEY_END = b',"t":3}'  # how the key of a resolved event ends (rows: 1, DDLs: 2)


def clock_tso(after: int) -> int:
    """A TSO from the wall clock now, above ``after`` (the logical part counts within a millisecond)."""
    return max(after + 1, int(time.time() * 1000) << 18)


class PacedGenerator(Generator):
    """The benchmark stream, its commit ts from the clock and paced to ``rate`` row events per
    second, a resolved ts every ``interval`` seconds; ``wait(seconds)`` is called while ahead of
    the schedule (it serves the producer's delivery callbacks meanwhile).

    With ``start`` (an epoch second in the future) nothing waits: every transaction's commit ts
    is the moment the schedule gives it (``start + events before it / rate``), and ``due`` is that
    moment for the record being built. ``pregenerate`` builds the whole stream so, before a run, and
    ``produce_scheduled`` hands each record over when the clock reaches its ``due``: the
    generator's CPU (a Python loop per row event, as much as the daemon's at 30K rows/s) then
    stays out of the measured minute, where a real producer would not be on the machine at all.
    The CREATE DDLs are then set-up, not part of the schedule: they and a resolved ts that covers
    them are due ``SETUP_LEAD_S`` before ``start`` (set-up records), so that the daemon has
    created the table before the first row is due, as it has long done for a table it replicates.
    """

    MIN_WAIT = 0.002
    SETUP_LEAD_S = 2.0

    def __init__(
        self,
        schema: str,
        partitions: int,
        seed: int,
        rate: float,
        interval: float,
        wait: Callable[[float], object],
        start: float | None = None,
    ) -> None:
        super().__init__(schema, partitions, seed, resolved_every=1)
        self.rate, self.interval, self.wait = rate, interval, wait
        self.start = start
        self.t0 = 0.0
        self.due = 0.0  # scheduled: when the record being built is due
        # per _next_ts call: the commit ts, and the row events before it (arrays: a soak makes millions)
        self.stamp_ts = array("Q")
        self.stamp_done = array("Q")
        self.resolved: list[int] = []  # the ts of each resolved broadcast, in order
        self.max_slip = 0.0  # how far behind its schedule the producer ever was, seconds
        self._next_resolved = 0.0

    def _first_ts(self) -> int:
        self.t0 = self.due = time.time() if self.start is None else self.start
        self._next_resolved = self.t0 + self.interval
        if self.start is None:
            return clock_tso(0)
        self.due = self.start - self.SETUP_LEAD_S
        return int(self.due * 1000) << 18

    def _after_schema(self, ts: int) -> Iterator[tuple[int, bytes, bytes]]:
        if self.start is not None:  # set-up: not one of the measured broadcasts (``resolved``)
            yield from Generator._resolved(self, ts)

    def _next_ts(self, ts: int, done: int) -> int:
        due = self.t0 + done / self.rate
        if self.start is not None and len(self.stamp_ts) < self.tables:  # a CREATE TABLE: set-up
            due = self.start - self.SETUP_LEAD_S
        if self.start is None:
            while (now := time.time()) < due:
                # At least 2 ms: the client counts whole milliseconds, and a shorter wait would spin
                # a core that the daemon, the broker and the database share (a burst follows: harmless).
                self.wait(max(due - now, self.MIN_WAIT))
            self.max_slip = max(self.max_slip, now - due)
            ts = clock_tso(ts)
        else:
            self.due = due
            ts = max(ts + 1, int(due * 1000) << 18)
        self.stamp_ts.append(ts)
        self.stamp_done.append(done)
        return ts

    def _resolved_due(self, transactions: int) -> bool:
        now = time.time() if self.start is None else self.due
        if now < self._next_resolved:
            return False
        while self._next_resolved <= now:
            self._next_resolved += self.interval
        return True

    def _resolved(self, ts: int) -> Iterator[tuple[int, bytes, bytes]]:
        self.resolved.append(ts)
        yield from super()._resolved(ts)

    def transactions(self) -> Iterator[tuple[int, int]]:
        """(commit ts, row events) of every transaction (a DDL: none): the stamps between the
        CREATE TABLEs' and the final resolved ts's."""
        ts, done = self.stamp_ts, self.stamp_done
        for i in range(self.tables, len(ts) - 1):
            yield ts[i], done[i + 1] - done[i]


@dataclass
class Produced:
    handed: list[float]  # per resolved broadcast: when produce() of its last record returned
    acked: list[float]  # per resolved broadcast: its last delivery callback
    records: int
    end: float  # when the last record was acknowledged


class _PacedSender:
    """The producer of a paced stream, and when each resolved broadcast was handed over (its last
    record's ``produce()`` returned) and acknowledged (its last delivery callback)."""

    def __init__(self, bootstrap: str, topic: str, linger_ms: int) -> None:
        self.producer = new_producer(bootstrap, linger_ms)
        self.topic = topic
        self.errors: list[str] = []
        self.handed: list[float] = []
        self.acked: list[float] = []
        self.sent = 0

    def _on_delivery(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(str(err))

    def _on_resolved(self, i: int, err, msg) -> None:
        self.acked[i] = max(self.acked[i], time.time())
        self._on_delivery(err, msg)

    def send(self, p: int, key: bytes, value: bytes, broadcast: int | None) -> None:
        """Produce one record; ``broadcast``: the number of the resolved broadcast it belongs to."""
        if broadcast is None:
            send(self.producer, self.topic, p, key, value, self._on_delivery)
        else:
            if broadcast == len(self.handed):
                self.handed.append(0.0)
                self.acked.append(0.0)
            send(self.producer, self.topic, p, key, value, functools.partial(self._on_resolved, broadcast))
            self.handed[broadcast] = time.time()
        self.sent += 1
        if self.sent % 16 == 0:
            self.producer.poll(0)

    def finish(self) -> Produced:
        finish_producing(self.producer, self.errors)
        return Produced(self.handed, self.acked, self.sent, time.time())


def produce_paced(bootstrap: str, topic: str, gen: PacedGenerator, events: int, linger_ms: int) -> Produced:
    """Produce the stream as the clock allows; the moments each resolved broadcast was handed over."""
    sender = _PacedSender(bootstrap, topic, linger_ms)
    gen.wait = sender.producer.poll  # returns as soon as a delivery callback was served
    for p, key, value in gen.records(events):
        sender.send(p, key, value, len(gen.resolved) - 1 if key.endswith(RESOLVED_KEY_END) else None)
    produced = sender.finish()
    gen.wait = time.sleep  # the producer is closed once this returns
    return produced


def pregenerate(gen: PacedGenerator, events: int) -> list[tuple[float, int, bytes, bytes]]:
    """(due, partition, key, value) of every record of a scheduled ``gen`` (built with ``start``),
    in production order: the stream built before the run, for ``produce_scheduled``."""
    assert gen.start is not None, "a generator paced by the clock builds its records as it goes"
    return [(gen.due, p, key, value) for p, key, value in gen.records(events)]


def produce_scheduled(
    bootstrap: str,
    topic: str,
    gen: PacedGenerator,
    records: list[tuple[float, int, bytes, bytes]],
    linger_ms: int,
) -> Produced:
    """Hand each pregenerated record to the producer once the clock reaches its due moment (the
    commit ts it carries); how far behind the schedule it ever was goes to ``gen.max_slip``. The
    moments each resolved broadcast was handed over and acknowledged, as ``produce_paced``."""
    sender = _PacedSender(bootstrap, topic, linger_ms)
    resolved_records = 0
    start = gen.start
    assert start is not None
    for due, p, key, value in records:
        while (now := time.time()) < due:
            sender.producer.poll(max(due - now, PacedGenerator.MIN_WAIT))
        broadcast = None
        if due < start:  # set-up: the CREATE DDLs and the resolved ts after them
            sender.send(p, key, value, None)
            continue
        gen.max_slip = max(gen.max_slip, now - due)
        if key.endswith(RESOLVED_KEY_END):
            broadcast = resolved_records // gen.partitions  # one record per partition
            resolved_records += 1
        sender.send(p, key, value, broadcast)
    return sender.finish()


# -- the database ------------------------------------------------------------------------------


def private_db_arguments(ap, buffer_pool: str = "1G") -> None:
    """``--private-db`` and ``--buffer-pool`` on argument parser ``ap`` (see ``start_private_db``)."""
    ap.add_argument(
        "--private-db",
        action="store_true",
        help="apply to a mariadbd started for this run (with --buffer-pool) instead of --downstream",
    )
    ap.add_argument(
        "--buffer-pool", default=buffer_pool, help=f"the private database's buffer pool ({buffer_pool})"
    )


def start_private_db(buffer_pool: str):
    """A ``mariadbd`` of this run only, in a temporary directory, with an InnoDB buffer pool of
    ``buffer_pool`` (``tests/integration/private_mariadb.py``; ``stop()`` removes it). The shared
    server keeps whatever its distribution set (128 MiB on Debian), which a benchmark's table of a
    million rows outgrows; a production server is sized to hold its working set."""
    sys.path.insert(0, str(ROOT))  # tests.integration is not installed
    from tests.integration.private_mariadb import start_plain_mariadb

    return start_plain_mariadb(
        Path(tempfile.mkdtemp(prefix="bench-db-")),
        f"--innodb-buffer-pool-size={buffer_pool}",
        "--max-connections=200",
    )


def start_services(args, cleanup: contextlib.ExitStack):
    """The database (a private one with ``--private-db``: ``args.downstream`` then names it) and
    an embedded broker, both stopped when ``cleanup`` closes; returns the database's connection
    parameters and the broker."""
    from applier.kafka.embedded_broker import start_broker

    if args.private_db:
        server = start_private_db(args.buffer_pool)
        cleanup.callback(server.stop)
        args.downstream = server.url
    broker = start_broker()
    cleanup.callback(broker.stop)
    return db_params(args.downstream), broker


def database_line(conn: pymysql.connections.Connection, url: str, private: bool) -> str:
    """``database   : <version> at <url>; InnoDB buffer pool N MiB``: what the figures depend on."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION(), @@innodb_buffer_pool_size")
        version, pool = cur.fetchone()
    where = " (private, started for this run)" if private else ""
    return f"database   : {version} at {url}{where}; InnoDB buffer pool {int(pool) / 2**20:,.0f} MiB"


def db_params(url: str) -> dict:
    u = urlparse(url)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": u.username or "root",
        "password": u.password or "",
        "charset": "utf8mb4",
        "autocommit": True,
    }


# The checksum of the benchmark tables: the rows of all of them, and the sum of each table's CRC32
# sum times its number (sbtest1 x1, sbtest2 x2, ...), so that a row applied to the wrong table
# shows. With one table it is that table's row count and CRC32 sum, as it has always been.


def checksum_sql(conn: pymysql.connections.Connection, schema: str, tables: int = 1) -> tuple[int, int]:
    """The checksum of tables sbtest1..sbtest``tables`` of ``schema`` as they are."""
    rows = total = 0
    with conn.cursor() as cur:
        for number, name in enumerate(table_names(tables), 1):
            cur.execute(
                "SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS('#', `id`, `k`, `c`, `pad`))), 0) "
                f"FROM `{schema}`.`{name}`"
            )
            n, s = cur.fetchone()
            rows += int(n)
            total += number * int(s)
    return rows, total


def checksum_expected(*finals: dict[int, tuple[int, str, str]]) -> tuple[int, int]:
    """The checksum the tables must have: ``finals`` are their rows by id, sbtest1's first
    (``Stream.finals``)."""
    crc = zlib.crc32
    rows = total = 0
    for number, final in enumerate(finals, 1):
        table_sum = 0
        for row_id, (k, c, pad) in final.items():
            table_sum += crc(f"{row_id}#{k}#{c}#{pad}".encode())
        rows += len(final)
        total += number * table_sum
    return rows, total


def settle_database(conn: pymysql.connections.Connection, timeout: float = 60.0) -> float:
    """Wait until InnoDB has written back most of its dirty pages (or ``timeout``); returns the
    seconds waited.

    Run before each phase so that neither pays for the other's background writes (the raw
    phase leaves ~100 MB of dirty pages that InnoDB would otherwise flush during the daemon's
    run). Stops below 2% of the pool, or once the count has not dropped for three seconds (InnoDB
    may keep a few pages dirty indefinitely, and other sessions may be writing).
    """
    start = time.monotonic()
    best, best_at = None, start
    with conn.cursor() as cur:
        while time.monotonic() - start < timeout:
            cur.execute(
                "SHOW GLOBAL STATUS WHERE Variable_name IN "
                "('Innodb_buffer_pool_pages_dirty', 'Innodb_buffer_pool_pages_total')"
            )
            status = {name: int(value) for name, value in cur.fetchall()}
            dirty = status.get("Innodb_buffer_pool_pages_dirty", 0)
            if dirty <= 0.02 * status.get("Innodb_buffer_pool_pages_total", 0):
                break
            now = time.monotonic()
            if best is None or dirty < best:
                best, best_at = dirty, now
            elif now - best_at > 3.0:
                break
            time.sleep(0.25)
    return time.monotonic() - start


# -- the daemon --------------------------------------------------------------------------------


@dataclass
class DaemonRun:
    returncode: int
    wall_s: float
    maxrss_kib: int
    vmhwm_kib: int
    started_at: float  # epoch seconds, just before the process was spawned
    log_path: str
    rss_timeline: list[tuple[float, int]]  # (seconds since start, VmRSS KiB) every 0.2 s
    cpu_s: float  # the daemon's user + system CPU time

    @property
    def peak_kib(self) -> int:
        """The daemon's own peak RSS: its ``VmHWM`` (the kernel's high-water mark of its memory),
        polled until it exits; ``ru_maxrss`` only when nothing was polled (a run under 0.2 s).

        Not ``ru_maxrss`` itself: Linux starts a child's ``ru_maxrss`` at the high-water mark of
        the memory it ran on before its exec, which for a child spawned with vfork (Python's
        subprocess) is this benchmark's own peak (the generator's million events): the daemon's
        figure could never be told below it."""
        return self.vmhwm_kib or self.maxrss_kib

    def peak_rss_line(self) -> str:
        """The benchmarks' ``peak RSS`` summary line."""
        return (
            f"peak RSS   : {self.peak_kib / 1024:,.0f} MiB (VmHWM polled; ru_maxrss "
            f"{self.maxrss_kib / 1024:,.0f} MiB, which counts this benchmark's own peak too)"
        )


def _poll_vmhwm(pid: int, stop: threading.Event, out: list[int], timeline: list[tuple[float, int]]) -> None:
    path = f"/proc/{pid}/status"
    t0 = time.perf_counter()
    while not stop.wait(0.2):
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        out[0] = max(out[0], int(line.split()[1]))
                    elif line.startswith("VmRSS:"):
                        timeline.append((time.perf_counter() - t0, int(line.split()[1])))
        except OSError:
            return


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mariadb_pid() -> int | None:
    """The local database server's pid, to report its CPU time (None when not found)."""
    for name in ("mariadbd", "mysqld"):
        out = subprocess.run(["pidof", name], capture_output=True, text=True).stdout.split()
        if out:
            return int(out[0])
    return None


def applier_env() -> dict[str, str]:
    """The environment of an ``applier`` child process: this checkout's code, and no configuration
    file (the command line says everything, whatever the caller's shell has set)."""
    env = dict(os.environ)
    env.pop("APPLIER_CONFIG", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def daemon_command(
    bootstrap: str, topic: str, group: str, downstream: str, ckpt_schema: str, *more: str, once: bool = True
) -> tuple[list[str], dict[str, str]]:
    """The ``applier run`` command line of a benchmark run (JSON log; with ``once``, it exits once
    caught up, else it runs until stopped) and its environment (``applier_env``)."""
    cmd = [
        sys.executable, "-m", "applier", "run",
        "--kafka-bootstrap", bootstrap, "--topic", topic, "--group-id", group,
        "--downstream", downstream, "--checkpoint-schema", ckpt_schema,
        *(["--exit-when-caught-up"] if once else []), "--log-format", "json", *more,
    ]  # fmt: skip
    return cmd, applier_env()


class DaemonProcess:
    """``applier run`` started as a child process, its memory polled until ``wait()`` collects it
    (a benchmark that works while the daemon runs holds this; ``run_daemon`` just waits)."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: str | None = None) -> None:
        """``log_path``: the file the output is appended to (default: a new temporary file)."""
        if log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="bench-applier-", suffix=".log")
        else:
            fd, self.log_path = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), log_path
        self.started_at = time.time()
        self._t0 = time.perf_counter()
        self.proc = subprocess.Popen(args, stdout=fd, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        os.close(fd)
        self._hwm = [0]
        self._timeline: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._poller = threading.Thread(
            target=_poll_vmhwm, args=(self.proc.pid, self._stop, self._hwm, self._timeline), daemon=True
        )
        self._poller.start()

    def running(self) -> bool:
        """Whether the process has not exited yet; it is left for :meth:`wait` to collect (which
        ``Popen.poll`` would not do)."""
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def wait(self) -> DaemonRun:
        """Wait for the process to exit; its figures."""
        proc = self.proc
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - self._t0
        self._stop.set()
        self._poller.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        return DaemonRun(
            proc.returncode, wall, usage.ru_maxrss, self._hwm[0], self.started_at, self.log_path,
            self._timeline, cpu,
        )  # fmt: skip


def run_daemon(args: list[str], env: dict[str, str]) -> DaemonRun:
    return DaemonProcess(args, env).wait()


def log_entries(log_path: str) -> Iterator[tuple[str, float, dict]]:
    """(event, Unix time, the whole entry) of every JSON line of a daemon's log (other lines, e.g.
    a traceback, are passed over)."""
    with open(log_path, errors="replace") as fh:
        for line in fh:
            if not line.startswith("{"):
                continue
            try:
                entry = orjson.loads(line)
                when = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError, AttributeError, TypeError):
                continue
            yield str(entry.get("event", "")), when, entry


def last_checkpoint_epoch(conn: pymysql.connections.Connection, ckpt_schema: str, group: str) -> float | None:
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT `updated_at` FROM `{ckpt_schema}`.`changefeed` WHERE `changefeed` = %s", (group,)
        )
        row = cur.fetchone()
    if row is None or row[0] is None:
        return None
    return row[0].replace(tzinfo=UTC).timestamp()  # UTC_TIMESTAMP(6)


def daemon_result(
    conn: pymysql.connections.Connection,
    run: DaemonRun,
    schema: str,
    ckpt_schema: str,
    group: str,
    tables: int = 1,
) -> tuple[float, tuple[int, int] | None]:
    """The figures of a one-shot daemon run: seconds from its start to its last checkpoint commit
    (to its exit when it failed or never committed: the rate is then a lower bound), and the
    checksum of the ``tables`` tables it wrote (None when it failed)."""
    if run.returncode != 0:
        return run.wall_s, None
    last = last_checkpoint_epoch(conn, ckpt_schema, group)
    seconds = (last - run.started_at) if last is not None else run.wall_s
    return seconds, checksum_sql(conn, schema, tables)


# -- what the daemon did ------------------------------------------------------------------------


@dataclass
class Windows:
    """The daemon's committed row windows, in commit order (from its ``window applied`` lines)."""

    target: list[int]  # the resolved ts each was applied up to
    at: list[float]  # its commit, Unix seconds
    rows: list[int]
    seconds: list[float]  # apply thread: start of the window to after its commit
    plan: list[float]  # building its SQL (before it started, often while the previous one applied)
    failed: list[str]  # fatal log lines
    ready: list[float | None] = field(default_factory=list)
    """From the daemon's read of what let it be released (its resolved ts on every partition) to
    its commit: the daemon's own share of the lag (None: an older daemon's line)."""

    def covering(self, ts: int) -> int | None:
        """The first window that holds commit ts ``ts`` (None: none committed it)."""
        j = bisect.bisect_left(self.target, ts)
        return j if j < len(self.target) else None


def read_windows(path: str) -> Windows:
    w = Windows([], [], [], [], [], [])
    for event, when, entry in log_entries(path):
        if event == "window applied":
            w.target.append(int(entry["resolved_ts"]))
            w.at.append(when)
            w.rows.append(int(entry["rows"]))
            w.seconds.append(float(entry["seconds"]))
            w.plan.append(float(entry.get("plan_s", 0)))
            w.ready.append(float(entry["ready_s"]) if entry.get("ready_s") is not None else None)
        elif event.startswith("fatal"):
            w.failed.append(event)
    return w


def pct(values: Sequence[float], q: float, weights: Sequence[int] | None = None) -> float:
    """The ``q`` quantile (nearest rank) of ``values``, each counted ``weights[i]`` times."""
    pairs = sorted(zip(values, weights or [1] * len(values), strict=True))
    total = sum(n for _v, n in pairs)
    need, seen = q * total, 0
    for v, n in pairs:
        seen += n
        if seen >= need:
            return v
    return pairs[-1][0]


def spread(values: Sequence[float], weights: Sequence[int] | None = None) -> str:
    """``p50 ... ms, p95 ... ms, p99 ... ms, max ... ms`` of seconds."""
    if not values:
        return "no values"
    parts = [f"p{round(q * 100)} {pct(values, q, weights) * 1000:,.0f} ms" for q in (0.5, 0.95, 0.99)]
    return ", ".join([*parts, f"max {max(values) * 1000:,.0f} ms"])


def http_text(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except OSError as exc:
        return getattr(exc, "code", 0) or 0, ""


def wait_for(check: Callable[[], bool], timeout: float, daemon: DaemonProcess, interval: float = 0.2) -> bool:
    """Poll ``check`` until true (True), the timeout or the daemon's exit (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon.running():
        if check():
            return True
        time.sleep(interval)
    return False


def committed_ts(conn: pymysql.connections.Connection, ckpt_schema: str, group: str) -> int:
    """What every partition is applied up to, as ``applier status`` says (both modes)."""
    from checkpoint.schema import applied_ts_query

    with conn.cursor() as cur:
        try:
            cur.execute(applied_ts_query(f"`{ckpt_schema}`"), (group,))
        except pymysql.err.ProgrammingError:  # not created yet
            return 0
        row = cur.fetchone()
    return int(row[0]) if row else 0


# -- a network in between ---------------------------------------------------------------------


class DelayLine:
    """Forwards ``127.0.0.1:port`` to ``target`` with ``delay`` seconds added to every chunk, each
    direction: a reader thread stamps what it reads, a writer thread sends it when due."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [client, server]
            for src, dst in ((client, server), (server, client)):
                self._pipe(src, dst)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        ready = threading.Condition()

        def read() -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(1 << 16):
                    with ready:
                        chunks.append((time.monotonic() + self.delay, data))
                        ready.notify()
            with ready:
                chunks.append((0.0, b""))
                ready.notify()

        def write() -> None:
            while True:
                with ready:
                    while not chunks:
                        ready.wait()
                    due, data = chunks.popleft()
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

"""The daemon's own loop in this process: a fake Kafka consumer serving a simulated stream, the
real start-up, barrier, window applier and MariaDB.

Read -> feed -> apply -> checkpoint end to end, with back-pressure (a ``Tuning`` that caches only
a few hundred rows, the partitions it pauses really held back) and stop (a stop request finishes
the window in flight and exits 0; a restart resumes from the checkpoint and converges). The
subprocess tests (``test_daemon_failures.py`` and the others) cover signals and kills; these show
what each stage did, from the inside, in seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Set

import pymysql
import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, TopicPartition

from applier.daemon.loop import Daemon
from applier.daemon.tuning import Tuning
from applier.errors import EXIT_OK
from applier.kafka.reader import PartitionReader
from applier.ops.observer import Observer, WindowApplied
from applier.settings.schema import resolve
from applier.simulator import PRODUCER_MODES, Simulation, StreamConfig, compare_downstream, simulate
from tests.unit.kafka_fakes import FakeMetadata, FakeOracle, FakeTopicMetadata, Msg

pytestmark = pytest.mark.integration

TOPIC = "orders"
EOF_CODE = KafkaError._PARTITION_EOF
TIGHT = dataclasses.replace(Tuning(), read_ahead_rows=120, merge_max_rows=40, ahead_rows=60, poll_records=8)


class SimulatedTopic:
    """A consumer over a simulation's records: each partition read from its assigned offset, paused
    partitions skipped, an end-of-partition event once a partition is read to its end."""

    def __init__(self, sim: Simulation, *, batch: int = 50) -> None:
        self.records: dict[int, list[Msg]] = {p: [] for p in range(sim.config.partitions)}
        for rec in sim.records:
            part = self.records[rec.partition]
            part.append(Msg(rec.partition, len(part), k=rec.key, val=rec.value, top=TOPIC))
        self.batch = batch
        self.next: dict[int, int] = {}
        self.paused: set[int] = set()
        self.eof_said: set[int] = set()
        self.committed: dict[int, int] = {}
        self.paused_ever: set[int] = set()

    # -- what PartitionReader calls -----------------------------------------------------------------
    def list_topics(self, topic: str, timeout: float) -> FakeMetadata:
        return FakeMetadata({topic: FakeTopicMetadata(dict.fromkeys(self.records))})

    def assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            end = len(self.records[tp.partition])
            offset = {OFFSET_BEGINNING: 0, OFFSET_END: end}.get(tp.offset, tp.offset)
            self.next[tp.partition] = offset
            self.eof_said.discard(tp.partition)

    incremental_assign = assign

    def consume(self, max_records: int, _timeout: float) -> list[Msg]:
        out: list[Msg] = []
        for p, offset in sorted(self.next.items()):
            if p in self.paused:
                continue
            records = self.records[p]
            take = records[offset : offset + min(self.batch, max_records - len(out))]
            out.extend(take)
            self.next[p] = offset + len(take)
            if self.next[p] >= len(records) and p not in self.eof_said:
                self.eof_said.add(p)
                out.append(Msg(p, self.next[p], KafkaError(EOF_CODE, "end"), top=TOPIC))
            if len(out) >= max_records:
                break
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, tp.partition, self.next.get(tp.partition, 0)) for tp in tps]

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = 0, cached: bool = False
    ) -> tuple[int, int]:
        return 0, len(self.records[tp.partition])

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}
        self.paused_ever |= {tp.partition for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        self.committed.update({tp.partition: tp.offset for tp in offsets})

    def close(self) -> None:
        pass

    def oracle(self) -> FakeOracle:
        return FakeOracle(dict.fromkeys(self.records, 0), {p: len(r) for p, r in self.records.items()})


class Seen(Observer):
    """What the loop told its observers."""

    def __init__(self, stop_after_windows: int | None = None, daemon: list[Daemon] | None = None) -> None:
        self.windows: list[WindowApplied] = []
        self.pauses: list[tuple[Set[int], int, bool]] = []
        self.states: list[str] = []
        self._stop_after = stop_after_windows
        self._daemon = daemon

    def on_window(self, applied: WindowApplied) -> None:
        self.windows.append(applied)
        if self._stop_after is not None and len(self.windows) == self._stop_after and self._daemon:
            self._daemon[0].request_stop()

    def on_back_pressure(self, paused: Set[int], cached_rows: int, behind_window_in_flight: bool) -> None:
        self.pauses.append((paused, cached_rows, behind_window_in_flight))

    def on_state(self, state: str) -> None:
        self.states.append(state)


@pytest.fixture
def schemas(mariadb_params: dict) -> Iterator[tuple[str, str]]:
    """An upstream schema name (the daemon creates it from the stream's DDLs) and a checkpoint schema."""
    tag = uuid.uuid4().hex[:10]
    yield f"up_{tag}", f"ckpt_{tag}"
    with contextlib.closing(pymysql.connect(**mariadb_params, autocommit=True)) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `up_{tag}`")
        cur.execute(f"DROP DATABASE IF EXISTS `ckpt_{tag}`")


def _daemon(
    topic: SimulatedTopic,
    downstream_url: str,
    checkpoint_schema: str,
    observer: Observer,
    *,
    tuning: Tuning | None = None,
    exit_when_caught_up: bool = True,
    extra: dict | None = None,
) -> Daemon:
    cfg = resolve(
        "run",
        {
            "topic": TOPIC,
            "kafka_bootstrap": "in-process:9092",
            "group_id": "cf_in_process",
            "downstream": downstream_url,
            "checkpoint_schema": checkpoint_schema,
            "exit_when_caught_up": exit_when_caught_up,
            "early_rows": 1,
            **(extra or {}),
        },
        {},
    )
    reader = functools.partial(PartitionReader, consumer=topic, oracle=topic.oracle())
    return Daemon(cfg, (observer,), tuning=tuning, new_reader=reader)


def _compare(mariadb_params: dict, sim: Simulation) -> list[str]:
    conn = pymysql.connect(**mariadb_params)
    try:
        # Keyless rows only where the stream lets a consumer rebuild them exactly (rid present):
        # without rid a replayed keyless row cannot be told from a second identical one.
        return compare_downstream(conn, sim, sim.final_resolved_ts, keyless_rows=sim.exact_keyless)
    finally:
        conn.close()


def _checkpoint_ts(mariadb_params: dict, checkpoint_schema: str) -> int:
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT MAX(resolved_ts) FROM `{checkpoint_schema}`.changefeed")
            return int(cur.fetchone()[0] or 0)
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["classic", "all-new"])
def test_the_loop_reads_feeds_applies_and_checkpoints_a_simulated_stream(
    mode: str, schemas: tuple[str, str], downstream_url: str, mariadb_params: dict
) -> None:
    upstream, checkpoint_schema = schemas
    sim = simulate(StreamConfig(schema=upstream, transactions=150, **PRODUCER_MODES[mode]))
    topic = SimulatedTopic(sim)
    seen = Seen()
    assert _daemon(topic, downstream_url, checkpoint_schema, seen).run() == EXIT_OK
    assert _compare(mariadb_params, sim) == []
    assert _checkpoint_ts(mariadb_params, checkpoint_schema) == sim.final_resolved_ts
    assert seen.states[:2] == ["starting", "active"]
    targets = [w.window.target_ts for w in seen.windows]
    assert targets == sorted(targets) and targets[-1] == sim.final_resolved_ts  # committed in order
    assert sum(sum(w.rows.values()) for w in seen.windows) > 0
    # the group offsets committed for monitoring: every partition read to its end
    assert topic.committed == {p: len(r) for p, r in topic.records.items()}


def test_back_pressure_pauses_the_partitions_ahead_and_the_stream_still_converges(
    schemas: tuple[str, str], downstream_url: str, mariadb_params: dict
) -> None:
    upstream, checkpoint_schema = schemas
    sim = simulate(StreamConfig(schema=upstream, transactions=300, partitions=4, seed=3))
    topic = SimulatedTopic(sim, batch=4)
    seen = Seen()
    assert _daemon(topic, downstream_url, checkpoint_schema, seen, tuning=TIGHT).run() == EXIT_OK
    assert _compare(mariadb_params, sim) == []
    assert seen.pauses, "no partition was ever paused"
    assert topic.paused_ever and all(paused for paused, _rows, _behind in seen.pauses)
    # Windows merged up to the tuning's bound, not the production one. A window holds whole upstream
    # transactions: beyond the bound only by transactions that alone are larger (an early piece
    # and the release each take at least one), and this stream has some of over a hundred rows.
    rows = Counter(ev.commit_ts for evs in sim.first_copies().values() for ev in evs if ev.kind == "row")
    largest = max(rows.values())
    biggest = max(w.window.row_count for w in seen.windows if w.window.ddl is None)
    assert biggest <= TIGHT.merge_max_rows + 2 * largest, (biggest, largest)


def test_a_stop_finishes_the_window_in_flight_and_a_restart_resumes_from_the_checkpoint(
    schemas: tuple[str, str], downstream_url: str, mariadb_params: dict
) -> None:
    upstream, checkpoint_schema = schemas
    sim = simulate(StreamConfig(schema=upstream, transactions=200, seed=5))
    topic = SimulatedTopic(sim, batch=4)
    holder: list[Daemon] = []
    first = Seen(stop_after_windows=3, daemon=holder)
    holder.append(
        _daemon(topic, downstream_url, checkpoint_schema, first, tuning=TIGHT, exit_when_caught_up=False)
    )
    done = threading.Event()
    code: list[int] = []
    runner = threading.Thread(target=lambda: (code.append(holder[0].run()), done.set()), daemon=True)
    runner.start()
    assert done.wait(60), "the daemon did not stop"
    assert code == [EXIT_OK] and first.states[-1] == "stopping"
    stopped_at = _checkpoint_ts(mariadb_params, checkpoint_schema)
    assert (
        stopped_at == first.windows[-1].window.target_ts < sim.final_resolved_ts
    )  # nothing after the last commit
    second = Seen()
    again = SimulatedTopic(sim)
    assert _daemon(again, downstream_url, checkpoint_schema, second).run() == EXIT_OK
    assert second.windows[0].window.base_ts == stopped_at  # resumed where the checkpoint said
    assert _compare(mariadb_params, sim) == []

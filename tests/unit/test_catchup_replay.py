"""The driver's skeleton pass against the daemon itself: same R, same keyless rows, same resume offsets.

The daemon's Barrier is fed every decoded record of a simulated stream (replays, duplicated records,
the keyless table, a DDL) and applies every window it releases; the catch-up's path turns the same
records into Arrow skeleton rows (BatchBuilder) and replays them (replay_skeleton). The resume
offsets the catch-up hands over must be the ones the daemon would have stored at R, and the keyless
rows it applies the ones the daemon applied.
"""

from __future__ import annotations

import copy
from collections import Counter

import pyarrow as pa
import pytest

from applier.catchup._batch_builder import BatchBuilder
from applier.catchup.epochs import ddls_to_run, global_resolved, partition_resolved
from applier.catchup.replay import Skeleton, replay_skeleton
from applier.catchup.rows import ARROW_SCHEMA, unbundle
from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import ResolvedEvent
from applier.simulator import StreamConfig, simulate
from applier.stream.barrier import Barrier
from applier.stream.progress import ddl_key
from applier.stream.window import is_keyless
from checkpoint import Checkpoint

TOPIC = "t"


def _content(ev) -> tuple:
    def img(row):
        return None if row is None else tuple((n, c["v"]) for n, c in row.items())

    return (ev.commit_ts, ev.schema, ev.table, int(ev.kind), img(ev.new), img(ev.old))


def _decoded(sim, records):
    opts = DecoderOptions(compression=sim.config.compression)
    offsets: dict[int, int] = {}
    out = []
    for rec in records:
        off = offsets.get(rec.partition, 0)
        offsets[rec.partition] = off + 1
        events = decode_record(
            rec.key, rec.value, topic=TOPIC, partition=rec.partition, offset=off, options=opts
        )
        out.append((rec.partition, off, events, (rec.key, rec.value)))
    return out


def _daemon(decoded, partitions, lower, drained=None):
    """The daemon's barrier fed every record; ``drained`` (partition -> (end, ts)): then told by a
    drain probe that those partitions hold nothing more at or below ts (several topics)."""
    barrier = Barrier(
        range(partitions), Checkpoint(resolved_ts=lower, offsets=dict.fromkeys(range(partitions), 0))
    )
    keyless = []
    for part, off, events, raw in decoded:
        # a copy: the listener owns what it caches (it trims and compacts the images), and the
        # catch-up's path reads the same decoded records after this
        barrier.feed(part, off, copy.deepcopy(events), 0, raw)
    for p, (end, ts) in (drained or {}).items():
        barrier.listeners[p].observe_drained(end, ts)
    while (w := barrier.next_window()) is not None:
        keyless.extend(_content(r) for r in w.rows if is_keyless(r))
        barrier.mark_applied(w)
    return barrier, keyless


def _skeleton(decoded, lower):
    builder = BatchBuilder(lower)
    for part, off, events, raw in decoded:
        builder.add_record(part, off, events, raw)
    builder.add_stats(0)
    table = unbundle(pa.Table.from_batches([builder.flush(final=True)], schema=ARROW_SCHEMA))
    return Skeleton.from_arrow(table.filter(table["skel"]), TOPIC)


def _catchup(decoded, partitions, lower, drained=None):
    """The catch-up's path; ``drained`` as for ``_daemon`` (``ReadPlan.drained`` and the ends)."""
    drained = drained or {}
    sk = _skeleton(decoded, lower)
    counted = {p: ts for p, (_end, ts) in drained.items()}
    r = global_resolved(partition_resolved(sk.controls, range(partitions), lower, counted))
    ddls = ddls_to_run(sk.controls, lower, r)
    result = replay_skeleton(
        sk,
        topic=TOPIC,
        starts=dict.fromkeys(range(partitions), 0),
        lower=lower,
        upper=r,
        table_floor={},
        applied_ddls=(),
        executed_ddls=[ddl_key(d) for d in ddls],
        drained=drained,
    )
    return r, ddls, result


@pytest.mark.parametrize(
    ("seed", "partitions", "dispatcher", "fraction"),
    [
        (1, 3, "index-value", 1.0),
        (2, 4, "index-value", 0.63),
        (3, 2, "table", 0.81),
        (4, 5, "index-value", 0.5),
    ],
)
def test_skeleton_pass_matches_the_daemon(
    seed: int, partitions: int, dispatcher: str, fraction: float
) -> None:
    sim = simulate(StreamConfig(seed=seed, partitions=partitions, transactions=220, dispatcher=dispatcher))
    records = sim.records[: int(len(sim.records) * fraction)]
    lower = sim.resolved_points[2]
    decoded = _decoded(sim, records)
    barrier, daemon_keyless = _daemon(decoded, partitions, lower)
    r, ddls, result = _catchup(decoded, partitions, lower)
    assert r == barrier.applied_ts
    assert result.resume_offsets == barrier.resume_offsets()
    assert Counter(repr(_content(e)) for e in result.keyless_rows) == Counter(map(repr, daemon_keyless))
    assert daemon_keyless, "the stream must exercise the keyless table"
    assert all(lower < d.commit_ts <= r for d in ddls)


def test_resume_offset_is_the_first_record_above_r_as_the_daemon_computes_it() -> None:
    """Two partitions, hand-made: R = 16; partition 0 still holds a row at 18 (offset 3)."""
    from applier.codec.events import Position, ResolvedEvent, RowEvent, RowKind

    def row(ts, part, off, table="a"):
        img = {"id": {"t": 3, "f": 0x0A, "v": ts}}
        return RowEvent(ts, "s", table, RowKind.INSERT, img, None, None, Position(TOPIC, part, off, 0))

    def res(ts, part, off):
        return ResolvedEvent(ts, Position(TOPIC, part, off, 0))

    stream = {
        0: [[res(10, 0, 0)], [row(12, 0, 1)], [res(15, 0, 2)], [row(18, 0, 3)], [res(20, 0, 4)]],
        1: [[res(10, 1, 0)], [row(11, 1, 1)], [res(16, 1, 2)]],
    }
    decoded = [
        (p, off, evs, (b"k%d%d" % (p, off), b"v"))
        for p, recs in stream.items()
        for off, evs in enumerate(recs)
    ]
    barrier, _ = _daemon(decoded, 2, 5)
    r, _ddls, result = _catchup(decoded, 2, 5)
    assert r == 16 == barrier.applied_ts
    assert result.resume_offsets == barrier.resume_offsets() == {0: 3, 1: 3}
    assert result.partition_resolved == {0: 20, 1: 16}


@pytest.mark.parametrize(("seed", "fraction"), [(7, 0.55), (8, 0.8), (9, 1.0)])
def test_quiet_topics_drained_at_the_highest_resolved_ts_match_the_daemons_drain_probes(
    seed: int, fraction: float
) -> None:
    """A topic dispatcher's changefeed (partitions are slots over every topic): the partitions
    whose last resolved ts is below the highest one read anywhere count as resolved at it at their
    end, in the catch-up as in the daemon (whose drain probe tells the listener the same). Same R,
    same keyless rows, same resume offsets; and R is not held at a quiet topic's last resolved ts."""
    sim = simulate(
        StreamConfig(
            seed=seed, partitions=2, transactions=220, resolved_every=1, topic_dispatcher=True, replays=True
        )
    )
    records = sim.records[: int(len(sim.records) * fraction)]
    lower = sim.resolved_points[2]
    decoded = _decoded(sim, records)
    slots = sim.slot_count
    ends = dict.fromkeys(range(slots), 0)
    last: dict[int, int] = {}
    for part, off, events, _raw in decoded:
        ends[part] = off + 1
        for ev in events:
            if isinstance(ev, ResolvedEvent):
                last[part] = max(last.get(part, 0), ev.ts)
    top = max(last.values())
    drained = {p: (ends[p], top) for p in range(slots) if last.get(p, 0) < top}
    assert drained, "the stream must have quiet partitions"
    barrier, daemon_keyless = _daemon(decoded, slots, lower, drained)
    r, _ddls, result = _catchup(decoded, slots, lower, drained)
    assert r == barrier.applied_ts == top
    assert result.resume_offsets == barrier.resume_offsets()
    assert Counter(repr(_content(e)) for e in result.keyless_rows) == Counter(map(repr, daemon_keyless))
    assert all(result.partition_resolved[p] >= top for p in range(slots))
    without = global_resolved(partition_resolved(_skeleton(decoded, lower).controls, range(slots), lower))
    assert without < top, "without the drained partitions R stays at a quiet partition's last resolved ts"

"""The listeners and the barrier against every producer order the simulator sends, in process.

For each producer mode (docs/open-protocol.md §5.1-§5.4: physical partitions flushed on their own,
late first copies, the new architecture's DDL order, replays mixing them) and several seeds, every
decoded record is fed to a Barrier, partitions interleaved at random as the Kafka client delivers
them, windows applied at random moments. Checked against the stream itself, not the daemon's
account: every row version is applied, in one window only; keyless versions with rid exactly once;
DDLs once each, in commit-ts order, after every row below them and before every row above; no
window goes beyond the watermark. The end-to-end daemon tests check the database side.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from applier.codec.decoder import DecoderOptions, decode_record
from applier.codec.events import DDLEvent, RowEvent, RowKind, handle_key_names, key_only
from applier.simulator import PRODUCER_MODES, StreamConfig, simulate
from applier.stream.barrier import Barrier
from applier.stream.window import is_keyless
from checkpoint import Checkpoint
from sqlgen.collapse import update_keeps_key


def _image(row) -> tuple | None:
    return None if row is None else tuple((n, repr(c["v"])) for n, c in row.items())


def _version(ev: RowEvent) -> tuple:
    """A row version as planning reads it: the listener drops the old image of an update that
    keeps its key (``update_keeps_key``) and all but the key columns of a keyed delete's, so a
    copy read before or after that is the same version."""
    rid = ev.row_id if is_keyless(ev) else None
    old = None if update_keeps_key(ev) else ev.old
    if old is not None and ev.kind is RowKind.DELETE and handle_key_names(old):
        old = key_only(old, handle_key_names(old))
    return (ev.commit_ts, ev.table, int(ev.kind), _image(ev.new), _image(old), rid)


def _decode(sim):
    opts = DecoderOptions(compression=sim.config.compression)
    per_partition: dict[int, list] = {p: [] for p in range(sim.config.partitions)}
    for rec in sim.records:
        off = len(per_partition[rec.partition])
        events = decode_record(
            rec.key, rec.value, topic="t", partition=rec.partition, offset=off, options=opts
        )
        per_partition[rec.partition].append((off, events, (rec.key, rec.value)))
    return per_partition


def _run(per_partition, rnd: random.Random):
    barrier = Barrier(per_partition, Checkpoint(offsets=dict.fromkeys(per_partition, 0)))
    cursor = dict.fromkeys(per_partition, 0)
    windows = []

    def apply_some() -> None:
        while (w := barrier.next_window(max_rows=rnd.choice([None, 7, 50]))) is not None:
            assert w.target_ts <= barrier.global_resolved()
            barrier.mark_applied(w)
            windows.append(w)
            if rnd.random() < 0.3:
                return

    while left := [p for p in per_partition if cursor[p] < len(per_partition[p])]:
        p = rnd.choice(left)
        off, events, raw = per_partition[p][cursor[p]]
        barrier.feed(p, off, events, 0, raw)
        cursor[p] += 1
        if rnd.random() < 0.05:
            apply_some()
    while (w := barrier.next_window()) is not None:
        barrier.mark_applied(w)
        windows.append(w)
    return barrier, windows


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("mode", sorted(PRODUCER_MODES))
def test_every_version_applied_once_in_order_with_ddls_between(mode: str, seed: int) -> None:
    sim = simulate(StreamConfig(seed=seed, partitions=3, transactions=160, **PRODUCER_MODES[mode]))
    per_partition = _decode(sim)
    barrier, windows = _run(per_partition, random.Random(seed))
    assert barrier.applied_ts == sim.final_resolved_ts

    stream_rows = [
        ev
        for recs in per_partition.values()
        for _o, evs, _r in recs
        for ev in evs
        if isinstance(ev, RowEvent)
    ]
    truth = {_version(ev) for ev in stream_rows}
    applied: Counter = Counter()
    seen_in: dict[tuple, int] = {}
    base = 0
    ddls = []
    for i, w in enumerate(windows):
        assert w.base_ts == base
        base = w.target_ts
        if w.ddl is not None:
            ddls.append((w.ddl.commit_ts, w.ddl.query))
            assert w.target_ts == w.ddl.commit_ts - 1 and not w.rows
        for r in w.rows:
            v = _version(r)
            assert w.base_ts < r.commit_ts <= w.target_ts
            assert seen_in.setdefault(v, i) == i, f"version {v[:3]} applied in two windows"
            applied[v] += 1
    assert set(applied) == truth, "a row version was lost or invented"
    exact = [v for v in truth if v[5] is not None]  # keyless with rid
    assert all(applied[v] == 1 for v in exact)
    expected_ddls = [(ev.commit_ts, ev.ddl_query) for ev in sorted(sim.ddl_events, key=lambda e: e.commit_ts)]
    assert ddls == expected_ddls
    assert all(
        isinstance(d, DDLEvent) for lst in barrier.listeners.values() for d in lst.pending_ddls()
    ) and not any(lst.pending_ddls() for lst in barrier.listeners.values())


@pytest.mark.parametrize("seed", range(10, 20))
@pytest.mark.parametrize("mode", ["classic-partitioned", "new-partitioned"])
def test_a_partitioned_table_loses_no_row_in_any_interleaving(mode: str, seed: int) -> None:
    """Four physical partitions flushed on their own, consumed in random interleavings."""
    sim = simulate(StreamConfig(seed=seed, partitions=3, transactions=120, **PRODUCER_MODES[mode]))
    per_partition = _decode(sim)
    _barrier, windows = _run(per_partition, random.Random(seed))
    stream = {
        _version(ev)
        for recs in per_partition.values()
        for _o, evs, _r in recs
        for ev in evs
        if isinstance(ev, RowEvent) and ev.table == "ptbl"
    }
    assert (
        len(
            {
                ev.partition_id
                for recs in per_partition.values()
                for _o, evs, _r in recs
                for ev in evs
                if isinstance(ev, RowEvent) and ev.table == "ptbl"
            }
        )
        == 4
    )
    applied = {_version(r) for w in windows for r in w.rows if r.table == "ptbl"}
    assert applied == stream

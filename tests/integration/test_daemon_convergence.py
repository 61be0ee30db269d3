"""End to end: simulated TiCDC streams through the real broker into MariaDB with the real daemon.

Every test compares the downstream with the simulator's upstream model; none of them trusts the
daemon's own account of what it did.
"""

from __future__ import annotations

import pytest

from applier.simulator import PRODUCER_MODES, StreamConfig, produce_simulation, simulate
from applier.simulator.producer import produce_records
from tests.integration.harness import Changefeed
from tests.integration.lock_holder import holding_tables

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "options",
    [
        dict(seed=1, partitions=3, dispatcher="index-value", **PRODUCER_MODES["all-classic"]),
        dict(
            seed=2,
            partitions=8,
            dispatcher="index-value",
            only_updated_columns=True,
            **PRODUCER_MODES["all-new"],
        ),
        dict(seed=3, partitions=4, dispatcher="table", compression="snappy", **PRODUCER_MODES["all-classic"]),
        dict(seed=4, partitions=5, dispatcher="index-value", old_value=False, **PRODUCER_MODES["all-new"]),
        dict(
            seed=5,
            partitions=3,
            dispatcher="index-value",
            compression="lz4",
            delete_only_handle_key=True,
            **PRODUCER_MODES["all-classic"],
        ),
    ],
    ids=["3p-index-value", "8p-only-updated", "4p-table-snappy", "5p-no-old-value", "3p-lz4-handle-deletes"],
)
def test_stream_converges_to_the_model(feed: Changefeed, options: dict) -> None:
    """Each encoding option with every producer order of one architecture on (§5.1-§5.4)."""
    cfg = StreamConfig(transactions=250, schema=feed.new_schema(), **options)
    sim = simulate(cfg)
    produce_simulation(feed.bootstrap, feed.topic, sim)
    if cfg.compression:
        feed.extra_args += ["--compression", cfg.compression]
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    resolved, _ = feed.checkpoint()
    assert resolved == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == []


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_mid_stream_the_downstream_is_the_snapshot_at_the_global_resolved_ts(
    feed: Changefeed, mode: str
) -> None:
    """At a quiet point the downstream equals the upstream at the global resolved ts: no row beyond it."""
    cfg = StreamConfig(
        seed=5, partitions=4, transactions=300, schema=feed.new_schema(), **PRODUCER_MODES[mode]
    )
    sim = simulate(cfg)
    cut = len(sim.records) // 2
    first, rest = sim.records[:cut], sim.records[cut:]
    # The global resolved ts of the prefix: the minimum over partitions of their last resolved ts.
    last: dict[int, int] = {}
    for rec in first:
        for ev in rec.events:
            if ev.kind == "resolved":  # only resolved events: a DDL implies nothing (§5)
                last[rec.partition] = max(last.get(rec.partition, 0), ev.commit_ts)
    expected_ts = min(last.get(p, 0) for p in range(4))
    assert 0 < expected_ts < sim.final_resolved_ts

    from applier.simulator.producer import ensure_topic

    ensure_topic(feed.bootstrap, feed.topic, 4)
    produce_records(feed.bootstrap, feed.topic, first)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    resolved, _ = feed.checkpoint()
    assert resolved == expected_ts
    # When the cut falls right after a DDL broadcast, the DDL has run: see Changefeed.snapshot_ts.
    assert feed.compare(sim, feed.snapshot_ts(expected_ts)) == []
    # Rows committed after expected_ts but already in the topic were not written.
    later = [ts for ts in sim.commit_ts if expected_ts < ts]
    assert later, "the cut should leave transactions above the global resolved ts"

    produce_records(feed.bootstrap, feed.topic, rest)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_stream_converges_with_ddls_holding_only_their_tables_while_they_last(
    feed: Changefeed, mode: str
) -> None:
    """ddl_blocking = "tables" with DDLs made to last (another session keeps holding a metadata
    lock on one table at a time): the rows of the other tables are applied past a DDL while it
    waits, and the stream still converges, with every producer order of the architecture on."""
    cfg = StreamConfig(
        seed=6, partitions=4, transactions=1500, schema=feed.new_schema(), **PRODUCER_MODES[mode]
    )
    sim = simulate(cfg)
    produce_simulation(feed.bootstrap, feed.topic, sim)
    feed.extra_args += ["--ddl-blocking", "tables"]
    with holding_tables(feed.mariadb_params, cfg.schema, seed=6) as held:
        done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert held, "the lock holder never held a table"
    assert "held_tables=" in done.stdout + done.stderr, "no window went on past a DDL still running"
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == []

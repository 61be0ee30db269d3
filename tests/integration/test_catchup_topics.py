"""``applier catchup`` over a changefeed written into several topics by TiCDC's topic dispatcher.

The simulator writes each table's rows and DDLs to a topic of its own and resolved events only to
the default topic and the topics of tables that changed since the last one (docs/open-protocol.md
§5.10), so most table topics are quiet at any moment. The topics hold part of the stream (table
topics not written yet do not exist: TiCDC creates them on first use); the catch-up reads the set
given by a pattern, must reach the highest resolved ts written (quiet partitions count as resolved
at it) and hand over per topic and partition; the daemon then reads the same set, topics created
meanwhile included, to the end. Every check compares the downstream with the model.
"""

from __future__ import annotations

import pytest

from applier.simulator import PRODUCER_MODES, simulate
from applier.simulator.producer import ensure_topic, produce_records, simulation_topics
from tests.integration.catchup_support import restore_backup, run_catchup_here
from tests.integration.harness import Changefeed
from tests.integration.test_daemon_topics import dispatched

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _stored(cf: Changefeed) -> tuple[str, dict[tuple[str, int], int]]:
    """The checkpoint's topic and its offsets by (topic, partition)."""
    ((topic,),) = cf.checkpoint_rows("SELECT `topic` FROM {schema}.`changefeed` WHERE `changefeed` = %s")
    rows = cf.checkpoint_rows(
        "SELECT `topic`, `partition_id`, `next_offset` FROM {schema}.`partition_offset` "
        "WHERE `changefeed` = %s"
    )
    return topic, {(t, int(p)): int(o) for t, p, o in rows}


CASES = {
    # Replays and duplicates; the window holds an ALTER (written to its table's topic); the set
    # is given by a pattern.
    "classic-pattern": {**PRODUCER_MODES["all-classic"], "replays": True},
    # The new architecture creates a table (a topic of its own) after the backlog ends; the set is
    # given as a list naming that topic before it exists. No replays: keyless rows stay exact.
    "new-list": {**PRODUCER_MODES["all-new"], "replays": False, "late_first_copies": False},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_topic_dispatched_backlog_is_caught_up_and_handed_over_to_the_daemon(
    feed: Changefeed, case: str
) -> None:
    cfg = dispatched(feed, seed=951, transactions=300, **CASES[case])
    sim = simulate(cfg)
    assert sim.exact_keyless  # keyless rows applied twice or lost at the hand-off would show
    topics = simulation_topics(sim, feed.topic)
    place = lambda slot: sim.topic_of(slot, feed.topic)  # noqa: E731
    alter = next(ev for ev in sim.ddl_events if ev.ddl_type == 5)
    if case == "new-list":
        # The backlog ends before the late table's topic gets its first record.
        late = f"{feed.topic}_{sim.schema}_late_tbl"
        cut = next(i for i, rec in enumerate(sim.records) if place(rec.partition)[0] == late)
        x = sim.resolved_points[4]
        form = ["--topic", ",".join(topics[1:])]  # with the default topic the harness names
    else:
        cut = (len(sim.records) * 3) // 5
        x = max(ts for ts in sim.resolved_points if ts < alter.commit_ts - 1 and ts < sim.resolved_points[8])
        form = ["--topic", f"/{feed.topic}_.*/"]
    restore_backup(feed, sim, x)
    first, rest = sim.records[:cut], sim.records[cut:]
    written = sorted({place(rec.partition)[0] for rec in first})
    for name in written:
        ensure_topic(feed.bootstrap, name, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, first, place=place)
    top = max(ev.commit_ts for rec in first for ev in rec.events if ev.kind == "resolved")
    assert x < top and len(written) >= 4
    later = [t for t in topics if t not in written]
    assert bool(later) == (case == "new-list"), later
    window_ddls = {(d.commit_ts, d.ddl_query) for d in sim.ddl_events if x < d.commit_ts <= top}
    assert (alter.commit_ts, alter.ddl_query) in window_ddls or case == "new-list", window_ddls

    summary = run_catchup_here(feed, x, *form)
    # Quiet partitions count as resolved at the highest resolved ts written: R is that one, not
    # the last one a quiet table topic got.
    assert summary.resolved_ts == top
    assert summary.ddls == len(window_ddls) and summary.events > 0
    assert feed.compare(sim, top) == []
    topic, offsets = _stored(feed)
    assert topic == (",".join(sorted(topics)) if case == "new-list" else f"{feed.topic},/{feed.topic}_.*/")
    assert set(offsets) == {(t, p) for t in written for p in range(cfg.partitions)}
    assert set(summary.resume_offsets) == set(offsets)

    again = run_catchup_here(feed, x, *form)  # from the stored offsets: nothing left to do
    assert again.rows_written == 0 and again.ddls == 0
    assert _stored(feed)[1] == offsets

    # TiCDC goes on (into a new table topic too, in one case); the daemon reads the same set.
    for name in later:
        ensure_topic(feed.bootstrap, name, cfg.partitions)
    produce_records(feed.bootstrap, feed.topic, rest, place=place)
    done = feed.run_to_end(*form)
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.checkpoint()[0] == sim.final_resolved_ts
    assert feed.compare(sim, sim.final_resolved_ts) == []

"""Table filters end to end: a simulated stream over several tables, applied with rules that exclude
some of them, through the real broker into MariaDB (docs/operations.md, "Table filters").

The replicated tables converge exactly to the upstream model; the filtered ones never appear
downstream, their DDL included; the daemon's offsets still reach the end of every partition.
"""

from __future__ import annotations

import pytest

from applier.kafka.embedded_broker import create_topic
from applier.simulator import PRODUCER_MODES, StreamConfig, produce_simulation, simulate
from tests.integration.catchup_support import table_checksums
from tests.integration.harness import Changefeed
from tests.integration.test_daemon_inputs import Rec, frame, send

pytestmark = pytest.mark.integration


def filter_args(schema: str) -> list[str]:
    """Every table of the schema, minus those starting with c or k (a class and a ``!`` rule),
    then ``keyless`` again (a later rule wins): ``composite`` alone is filtered out, and it is
    the table the simulator's mid-stream ALTER TABLE changes."""
    rules = [f"{schema}.*", f"!{schema}.[ck]*", f"{schema.upper()}.KEYLESS"]
    return [arg for rule in rules for arg in ("--filter", rule)]


@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_filtered_stream_converges_on_the_replicated_tables_only(feed: Changefeed, mode: str) -> None:
    cfg = StreamConfig(
        seed=11, partitions=3, transactions=200, schema=feed.new_schema(), **PRODUCER_MODES[mode]
    )
    sim = simulate(cfg)
    assert any(ev.ddl_type == 5 and ev.table == "composite" for ev in sim.ddl_events)  # a filtered DDL
    produce_simulation(feed.bootstrap, feed.topic, sim)

    feed.extra_args += filter_args(cfg.schema)
    done = feed.run_to_end()
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # Everything but composite equals the upstream; composite, its rows and its ALTER never ran.
    assert feed.compare(sim, sim.final_resolved_ts) == [f"{cfg.schema}.composite: table missing downstream"]
    assert out.count(f"table {cfg.schema}.composite filtered out: rows and DDLs skipped") == 1, out
    resolved, offsets = feed.checkpoint()
    assert resolved == sim.final_resolved_ts
    ends = {p: len(recs) for p, recs in sim.records_by_partition().items()}
    assert offsets == ends  # records holding only filtered events were passed, not re-read

    # A second run has nothing left to read or apply.
    again = feed.run_to_end()
    assert again.returncode == 0, again.stdout + again.stderr
    assert feed.checkpoint() == (resolved, offsets)


TS = 450000000000000000


def test_rename_from_a_filtered_to_a_replicated_name_stops_after_applying_what_came_before(
    feed: Changefeed,
) -> None:
    """As TiCDC: the downstream has no source table for that RENAME. The daemon applies the rows
    before it, exits 1 naming the record and the way out, and a restart stops at the same record."""
    schema = feed.new_schema("filt")

    def ddl(ts: int, table: str, query: str, ddl_type: int) -> Rec:
        return Rec(
            0, *frame([{"ts": ts, "scm": schema, "tbl": table, "t": 2}], [{"q": query, "t": ddl_type}])
        )

    def row(ts: int, table: str, a: int) -> Rec:
        return Rec(
            0,
            *frame(
                [{"ts": ts, "scm": schema, "tbl": table, "t": 1}], [{"u": {"a": {"t": 3, "f": 11, "v": a}}}]
            ),
        )

    def resolved(ts: int) -> Rec:
        return Rec(0, *frame([{"ts": ts, "t": 3}], [None]))

    records = [
        Rec(0, *frame([{"ts": TS, "scm": schema, "t": 2}], [{"q": f"CREATE DATABASE `{schema}`", "t": 1}])),
        ddl(TS + 1, "t", "CREATE TABLE t (a INT PRIMARY KEY)", 3),
        ddl(TS + 2, "tmp_t", "CREATE TABLE tmp_t (a INT PRIMARY KEY)", 3),
        row(TS + 10, "t", 1),
        row(TS + 10, "tmp_t", 2),
        resolved(TS + 11),
        ddl(TS + 20, "t2", f"RENAME TABLE `{schema}`.`tmp_t` TO `{schema}`.`t2`", 14),
        row(TS + 30, "t2", 3),
        resolved(TS + 31),
    ]
    create_topic(feed.bootstrap, feed.topic, 1)
    send(feed, records)
    feed.extra_args += ["--filter", "*.*", "--filter", f"!{schema}.tmp_*"]

    for _ in range(2):
        done = feed.run_to_end(timeout=120)
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert f"topic '{feed.topic}' partition 0 offset 6" in out and f"'!`{schema}`.`t2`'" in out, out
        applied, _offsets = feed.checkpoint()
        assert applied == TS + 11
    tables = table_checksums(feed, schema)  # t with its row; tmp_t and t2 never created
    assert list(tables) == ["t"] and tables["t"][0] == 1

"""The daemon on a topic that no longer holds its checkpoint's offsets (recreated topic).

The embedded broker answers a fetch beyond a partition's end with an empty response and no error
(real Kafka answers OFFSET_OUT_OF_RANGE), so this exercises the reader's other detection: the
offset compared with the high watermark of the fetch responses.
"""

from __future__ import annotations

import re

import pytest
from confluent_kafka.admin import AdminClient

from applier.kafka.embedded_broker import create_topic
from applier.simulator import StreamConfig, produce_simulation, simulate
from applier.simulator.producer import produce_records
from tests.integration.harness import Changefeed

pytestmark = pytest.mark.integration


def _checkpoint_rows(cf: Changefeed) -> dict[str, list[tuple]]:
    """Everything the checkpoint holds for the changefeed, but its owner and write times."""
    columns = {
        "changefeed": "topic, resolved_ts",
        "table_checkpoint": "schema_name, table_name, checkpoint_ts",
        "partition_offset": "topic, partition_id, next_offset, resolved_ts",
        "applied_ddl": "commit_ts, query_digest",
    }
    conn = cf.connect()
    try:
        with conn.cursor() as cur:
            out = {}
            for table, cols in columns.items():
                cur.execute(
                    f"SELECT {cols} FROM `{cf.checkpoint_schema}`.`{table}` "
                    "WHERE changefeed=%s ORDER BY 1, 2",
                    (cf.group_id,),
                )
                out[table] = list(cur.fetchall())
            return out
    finally:
        conn.close()


def _recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics([topic]).values():
        fut.result(timeout=15)
    create_topic(bootstrap, topic, partitions)


def test_offset_beyond_the_end_of_a_recreated_topic_stops_with_one_line(feed: Changefeed) -> None:
    sim = simulate(StreamConfig(seed=41, partitions=2, transactions=60, schema=feed.new_schema()))
    produce_simulation(feed.bootstrap, feed.topic, sim)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    before = _checkpoint_rows(feed)
    _resolved, offsets = feed.checkpoint()
    assert sorted(offsets) == [0, 1] and min(offsets.values()) > 1

    # The topic is deleted and recreated (as when the changefeed is recreated): each partition
    # holds one record now, far below the offsets the checkpoint resumes at.
    _recreate_topic(feed.bootstrap, feed.topic, 2)
    firsts = [next(r for r in sim.records if r.partition == p) for p in (0, 1)]
    produce_records(feed.bootstrap, feed.topic, firsts)

    done = feed.run_to_end(timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    fatal = [line for line in out.splitlines() if "fatal" in line]
    assert len(fatal) == 1, out
    line = fatal[0]
    found = re.search(
        rf"topic '{feed.topic}' partition (\d): offset (\d+) is not in Kafka any more "
        r"\(earliest available offset 0, end offset 1\)",
        line,
    )
    assert found, line
    assert int(found[2]) == offsets[int(found[1])]
    assert "OffsetOutOfRange" in line
    # What the operator can do, naming this changefeed's checkpoint.
    table = f"`{feed.checkpoint_schema}`.`partition_offset`"
    assert f"DELETE FROM {table} WHERE changefeed = '{feed.group_id}'" in line
    assert "applier catchup --from-ts" in line
    assert _checkpoint_rows(feed) == before
    print(line)  # shown with -s: the exact text an operator gets

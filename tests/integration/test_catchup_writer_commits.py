"""A catch-up writer task commits on a thread of its own while it plans the next group of buckets:
its transactions keep their order, and none runs after one the database refused."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pymysql
import pytest

from applier.catchup import writer
from applier.catchup._batch_builder import BatchBuilder
from applier.catchup.rows import ROWS, WRITER_ROW
from applier.catchup.writer import WriteError, WriteSpec, write_keyed
from applier.codec.events import RowKind
from applier.downstream.url import DownstreamConfig
from sqlgen.dialect import MARIADB
from tests.builders import id_val_image, row_event

_KEY_VALUES = WRITER_ROW.index("key_values")


RUN = 1024
"""Integer keys go to writer buckets by runs of this many values (_batch_builder._bucket): the
tests' keys are this far apart, so that they spread over the buckets."""


def _writer_input(schema: str, values: dict[int, str]) -> pa.Table:
    """The ROWS rows a reader writes for inserts of ``values`` (id -> val), sorted by bucket as the
    job hands them to a writer."""
    builder = BatchBuilder(lower_ts=0, buckets=4)
    for ts, (key, value) in enumerate(sorted(values.items()), start=10):
        builder.add_record(
            0, ts, [row_event(RowKind.INSERT, ts, id_val_image(key, value), schema=schema)], (b"", b"")
        )
    batch = builder.flush(final=True)
    rows = pa.Table.from_batches([batch]).filter(pc.equal(batch["kind"], ROWS))
    return rows.sort_by("idx")


def _keys_by_bucket(table: pa.Table) -> dict[int, list[int]]:
    """The ids of the writer rows of each bucket, buckets in the order the writer reads them."""
    out: dict[int, list[int]] = {}
    for bucket, blob in zip(table["idx"].to_pylist(), table["img"].to_pylist(), strict=True):
        out.setdefault(bucket, []).extend(
            row[WRITER_ROW.index("key_values")][0] for row in pickle.loads(blob)
        )
    return out


def test_transactions_run_in_order_and_none_after_a_refused_one(
    fresh_db: str, downstream_url: str, mariadb_params: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_db}`.`t` (id INT PRIMARY KEY, val VARCHAR(3))")
        cur.execute(
            f"CREATE TRIGGER `{fresh_db}`.`refuse` BEFORE INSERT ON `{fresh_db}`.`t` FOR EACH ROW "
            "IF NEW.val = 'bad' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; END IF"
        )
    # A group per bucket: about 25 rows each (the buckets depend on the database's random name;
    # fewer than 5 rows in one is a chance of about one in a thousand per bucket).
    monkeypatch.setattr(writer, "GROUP_ROWS", 5)
    values = {key * RUN: "ok" for key in range(1, 101)}
    buckets = list(_keys_by_bucket(_writer_input(fresh_db, values)).values())
    assert len(buckets) == 4 and all(len(keys) >= 5 for keys in buckets)
    bad = buckets[1][0]
    values[bad] = "bad"  # refused by the trigger: the second transaction fails
    started: list[set[int]] = []
    real_commit = writer._commit

    def commit(session, chunk, spec) -> None:
        started.append({key for st in chunk for key in st.params[::2]})  # REPLACE (id, val), ...
        real_commit(session, chunk, spec)

    monkeypatch.setattr(writer, "_commit", commit)
    spec = WriteSpec(
        DownstreamConfig.from_url(downstream_url), MARIADB, "topic", 1, 0, 1 << 62, commit_rows=5
    )
    with pytest.raises(WriteError, match=r"downstream refused REPLACE on .*\.t .*MySQL error 1644: refused"):
        write_keyed(iter(_writer_input(fresh_db, values).to_batches()), spec)
    assert started == [set(buckets[0]), set(buckets[1])]  # in order; the third and fourth never ran
    with admin.cursor() as cur:
        cur.execute(f"SELECT id FROM `{fresh_db}`.`t`")
        assert {row[0] for row in cur.fetchall()} == set(buckets[0])
    admin.close()


def test_a_writer_writes_every_group(
    fresh_db: str, downstream_url: str, mariadb_params: dict, monkeypatch
) -> None:
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE `{fresh_db}`.`t` (id INT PRIMARY KEY, val VARCHAR(3))")
    monkeypatch.setattr(writer, "GROUP_ROWS", 10)
    values = {key * RUN: str(key) for key in range(1, 201)}
    spec = WriteSpec(
        DownstreamConfig.from_url(downstream_url), MARIADB, "topic", 1, 0, 1 << 62, commit_rows=7
    )
    stats = write_keyed(iter(_writer_input(fresh_db, values).to_batches(max_chunksize=3)), spec)
    assert stats.replaces == 200 and stats.events == 200
    with admin.cursor() as cur:
        cur.execute(f"SELECT id, val FROM `{fresh_db}`.`t`")
        assert dict(cur.fetchall()) == values
    admin.close()

"""Which DDLs run beside the stream, and which later DDLs wait for them (applier.apply.online_ddl)."""

from __future__ import annotations

import pytest

from applier.apply.catalogue import Scope
from applier.apply.online_ddl import _overlaps, _reads_other_tables, runs_online
from tests.builders import ddl_event


@pytest.mark.parametrize(
    ("ddl_type", "query", "online"),
    [
        (7, "ALTER TABLE t ADD INDEX i (a)", True),
        (7, "CREATE INDEX i ON t (a, b)", True),
        (7, "ALTER TABLE t ADD FULLTEXT INDEX f (c)", True),
        (7, "ALTER TABLE t ADD UNIQUE INDEX u (a)", False),  # a transient duplicate fails an online build
        (7, "CREATE UNIQUE INDEX u ON t (a)", False),
        (8, "DROP INDEX i ON t", True),
        (8, "ALTER TABLE t DROP INDEX i", True),
        (18, "ALTER TABLE t RENAME INDEX i TO j", True),
        (41, "ALTER TABLE t ALTER INDEX i INVISIBLE", True),
        (32, "ALTER TABLE t ADD PRIMARY KEY (a)", False),  # changes what identifies a row
        (5, "ALTER TABLE t ADD COLUMN c INT", False),
        (61, "ALTER TABLE t ADD INDEX i (a), ADD COLUMN c INT", False),  # a multi-schema change
    ],
)
def test_only_index_ddls_other_than_unique_ones_run_beside_the_stream(ddl_type, query, online) -> None:
    assert runs_online(ddl_event(1, query, "t", schema="db", ddl_type=ddl_type)) is online


def test_a_later_ddl_waits_only_for_what_shares_an_object_with_it() -> None:
    building = Scope({"db": frozenset({"t"})})
    assert _overlaps(building, Scope({"db": frozenset({"t", "u"})}), whole=False)  # RENAME t TO u
    assert not _overlaps(building, Scope({"db": frozenset({"u"})}), whole=False)  # another table
    assert not _overlaps(building, Scope({"other": frozenset({"t"})}), whole=False)  # another schema
    assert _overlaps(building, Scope({"db": None}), whole=False)  # a text the guard cannot read
    assert _overlaps(building, Scope({"db": frozenset()}), whole=True)  # DROP DATABASE db
    assert not _overlaps(building, Scope({"x": frozenset()}), whole=True)


def test_a_ddl_that_copies_another_table_waits_as_if_it_touched_the_whole_schema() -> None:
    assert _reads_other_tables(ddl_event(1, "CREATE TABLE u LIKE t", "u", schema="db", ddl_type=3))
    assert _reads_other_tables(
        ddl_event(1, "CREATE TABLE u AS SELECT * FROM t", "u", schema="db", ddl_type=3)
    )
    assert not _reads_other_tables(ddl_event(1, "CREATE TABLE u (a INT)", "u", schema="db", ddl_type=3))

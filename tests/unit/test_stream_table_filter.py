"""applier.stream.table_filter: TiDB's table-filter rules, and the stage that drops filtered events."""

from __future__ import annotations

import pickle

import pytest

from applier.codec.events import LargeMessageEvent
from applier.errors import InputError
from applier.stream.table_filter import EventFilter, FilteredSourceError, TableFilter, table_event_filter
from tests.builders import ddl_event, keyed_row, position, resolved_event

# (rules, schema, table, replicated?)
MATCHES = [
    # no rules: everything
    ((), "any", "thing", True),
    (("# only a comment", ""), "any", "thing", True),
    # plain names; a table no rule matches is filtered out
    (("db1.tbl1",), "db1", "tbl1", True),
    (("db1.tbl1",), "db1", "tbl2", False),
    (("db1.tbl1",), "db2", "tbl1", False),
    # wildcards
    (("db.*",), "db", "anything", True),
    (("*.*",), "x", "y", True),
    (("db?.t",), "db1", "t", True),
    (("db?.t",), "db12", "t", False),
    (("db?.t",), "db", "t", False),
    (("*.backup_*",), "s", "backup_2024", True),
    (("*.backup_*",), "s", "old_backup", False),
    # character classes, negated classes, ranges
    (("db[0-9].tbl[0-9][0-9]",), "db3", "tbl42", True),
    (("db[0-9].tbl[0-9][0-9]",), "dbx", "tbl42", False),
    (("db[!0-9].t",), "dbx", "t", True),
    (("db[!0-9].t",), "db1", "t", False),
    (("db[^x].t",), "db^", "t", True),  # '^' is no negation in a glob class
    (("db[^x].t",), "dbx", "t", True),
    (("db[^x].t",), "dby", "t", False),
    # escapes and quoted names
    (("db\\.x.t",), "db.x", "t", True),
    (('"my.db".t',), "my.db", "t", True),
    (("`my``db`.t",), "my`db", "t", True),
    (("db.\\*",), "db", "*", True),
    (("db.\\*",), "db", "x", False),
    # regular expressions match a part of the name
    (("/^db\\d{2,}$/./t/",), "db01", "xtx", True),
    (("/^db\\d{2,}$/./t/",), "db1", "t", False),
    # ! excludes; the last matching rule wins
    (("*.*", "!*.Password"), "hr", "password", False),
    (("*.*", "!*.Password"), "hr", "people", True),
    (("employees.*", "!*.dep*", "*.departments"), "irrelevant", "table", False),
    (("employees.*", "!*.dep*", "*.departments"), "employees", "employees", True),
    (("employees.*", "!*.dep*", "*.departments"), "employees", "dept_emp", False),
    (("employees.*", "!*.dep*", "*.departments"), "employees", "departments", True),
    (("employees.*", "!*.dep*", "*.departments"), "else", "departments", True),
    (("!*.dep*", "employees.*"), "employees", "dept_emp", True),
    # case-insensitive, as TiCDC's filter by default
    (("Sales.Orders",), "SALES", "orders", True),
    (("sales.[a-c]*",), "sales", "Blue", True),
    (("*.*", "!SECRET.*"), "secret", "t", False),
    # blanks around a rule are trimmed
    (("  db.t \t",), "db", "t", True),
]


@pytest.mark.parametrize(("rules", "schema", "table", "expected"), MATCHES)
def test_a_table_is_decided_by_the_last_rule_matching_it(rules, schema, table, expected) -> None:
    assert TableFilter(rules).matches_table(schema, table) is expected


@pytest.mark.parametrize(
    ("rules", "schema", "expected"),
    [
        (("db.t",), "db", True),  # a positive rule whose schema part matches
        (("db.t",), "other", False),
        (("*.*", "!db.t"), "db", True),  # excluding one table leaves the schema
        (("*.*", "!db.*"), "db", False),  # excluding every table excludes the schema
        (("*.*", "!db.*", "db.keep"), "db", True),
        (("DB.*",), "db", True),
        ((), "db", True),
    ],
)
def test_a_schema_is_replicated_when_a_rule_could_match_a_table_of_it(rules, schema, expected) -> None:
    assert TableFilter(rules).matches_schema(schema) is expected


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("db", "expected '.'"),
        ("db.", "missing table pattern"),
        (".t", "missing schema pattern"),
        ("db.t.x", "unexpected '.x'"),
        ("db.[a", "character class"),
        ("db.[]", "character class"),
        ("db.[z-a]", "bad table pattern"),
        ("db-x.t", "unexpected special character '-'"),
        ("db.t\\", "at the end"),
        ("db.\\n", "cannot be escaped"),
        ('"db.t', "no closing"),
        ("/db.t", "no closing '/'"),
        ("/(/.t", "bad schema pattern"),
        ("@rules.txt", "not supported"),
    ],
)
def test_an_invalid_rule_is_refused_by_name(rule: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        TableFilter(["*.*", rule])
    assert repr(rule) in str(info.value)


def test_rules_that_all_exclude_are_refused() -> None:
    with pytest.raises(ValueError, match=r"put '\*\.\*' first"):
        TableFilter(["!db.secret", "!db.other"])


def test_the_filter_travels_to_spark_tasks_as_its_rules() -> None:
    tf = TableFilter(["*.*", "!db.[a-c]*"])
    copy = pickle.loads(pickle.dumps(tf))
    assert copy.rules == tf.rules and not copy.matches_table("db", "apple") and copy.matches_table("db", "x")


def test_describe_lists_the_rules_in_force() -> None:
    assert TableFilter(["db.*", "# why", "!db.x"]).describe() == ["db.*", "!db.x"]
    assert TableFilter().describe() == ["*.* (no filter: every table)"]


# -- the stage ---------------------------------------------------------------------------------


def _stage(*rules: str) -> tuple[EventFilter, list[tuple[str, str]]]:
    said: list[tuple[str, str]] = []
    return EventFilter(TableFilter(rules), lambda s, t: said.append((s, t))), said


def test_rows_of_filtered_tables_are_dropped_and_said_once_resolved_events_never() -> None:
    stage, said = _stage("*.*", "!db.skip")
    events = [keyed_row(10, 1, table="k"), keyed_row(10, 2, table="skip"), resolved_event(11)]
    assert stage.keep(events) == [events[0], events[2]]
    assert stage.keep([keyed_row(12, 3, table="skip")]) == []  # the record still counts, empty
    assert said == [("db", "skip")]


def test_a_record_of_replicated_tables_is_returned_as_it_is() -> None:
    stage, said = _stage("db.*")
    events = [keyed_row(10, 1), resolved_event(11)]
    assert stage.keep(events) is events and said == []


def test_large_messages_of_filtered_tables_are_dropped_before_any_fetch() -> None:
    stage, _ = _stage("db.k")
    large = LargeMessageEvent(10, "db", "big", True, None, None, position())
    assert stage.keep([large]) == []


def test_ddl_of_a_filtered_table_is_dropped() -> None:
    stage, said = _stage("*.*", "!db.skip")
    assert stage.keep([ddl_event(10, "ALTER TABLE skip ADD COLUMN c INT", "skip")]) == []
    kept = ddl_event(11, "ALTER TABLE k ADD COLUMN c INT", "k")
    assert stage.keep([kept]) == [kept]
    assert said == [("db", "skip")]


@pytest.mark.parametrize(
    ("rules", "kept"),
    [(("db.t",), True), (("*.*", "!db.t"), True), (("*.*", "!db.*"), False), (("other.*",), False)],
)
def test_schema_ddl_runs_when_the_schema_could_hold_a_replicated_table(rules, kept: bool) -> None:
    stage, said = _stage(*rules)
    ev = ddl_event(10, "CREATE DATABASE db", "", ddl_type=1)
    assert stage.keep([ev]) == ([ev] if kept else [])
    assert said == ([] if kept else [("db", "")])


def _rename(old: str, new: str) -> object:
    return ddl_event(10, f"RENAME TABLE `db`.`{old}` TO `db`.`{new}`", new, ddl_type=14)


def test_rename_of_a_replicated_table_to_a_filtered_name_runs() -> None:
    """As TiCDC: the table leaves the replicated set downstream too."""
    stage, _ = _stage("*.*", "!db.archived_*")
    ev = _rename("orders", "archived_orders")
    assert stage.keep([ev]) == [ev]
    ev = ddl_event(10, "ALTER TABLE orders RENAME TO archived_orders", "archived_orders", ddl_type=14)
    assert stage.keep([ev]) == [ev]


def test_rename_between_filtered_names_is_dropped() -> None:
    stage, _ = _stage("*.*", "!db.tmp_*")
    assert stage.keep([_rename("tmp_a", "tmp_b")]) == []


def test_rename_from_a_filtered_to_a_replicated_name_stops_with_what_to_do() -> None:
    stage, _ = _stage("*.*", "!db.tmp_*")
    with pytest.raises(FilteredSourceError) as info:
        stage.keep([_rename("tmp_orders", "orders")])
    assert isinstance(info.value, InputError)
    message = str(info.value)
    assert "partition 0 offset 0" in message and "`db`.`tmp_orders`" in message
    assert "'!`db`.`orders`'" in message  # the rule that would filter the new name out too


def test_exchange_partition_between_a_filtered_and_a_replicated_table_stops() -> None:
    query = "ALTER TABLE `db`.`pt` EXCHANGE PARTITION `p0` WITH TABLE `db`.`nt`"
    for key in ("pt", "nt"):  # classic and new architecture keys (docs/open-protocol.md §8.1)
        for rules in (("*.*", "!db.nt"), ("*.*", "!db.pt")):
            stage, _ = _stage(*rules)
            with pytest.raises(FilteredSourceError):
                stage.keep([ddl_event(10, query, key, ddl_type=42)])
        stage, _ = _stage("*.*", "!db.[np]t")
        assert stage.keep([ddl_event(10, query, key, ddl_type=42)]) == []


def test_create_table_like_a_filtered_table_stops_unless_the_new_one_is_filtered_too() -> None:
    stage, _ = _stage("*.*", "!db.src")
    with pytest.raises(FilteredSourceError):
        stage.keep([ddl_event(10, "CREATE TABLE copy LIKE src", "copy", ddl_type=3)])
    stage, _ = _stage("*.*", "!db.src", "!db.copy")
    assert stage.keep([ddl_event(10, "CREATE TABLE copy LIKE src", "copy", ddl_type=3)]) == []
    stage, _ = _stage("*.*", "!db.copy")  # from a replicated table into a filtered one: nothing to do
    assert stage.keep([ddl_event(10, "CREATE TABLE copy LIKE src", "copy", ddl_type=3)]) == []


def test_a_rename_of_several_tables_with_some_filtered_on_both_sides_stops() -> None:
    stage, _ = _stage("*.*", "!db.tmp_*")
    ev = ddl_event(10, "RENAME TABLE a TO b, tmp_x TO tmp_y", "b", ddl_type=47)
    with pytest.raises(FilteredSourceError, match=r"also renames `db`\.`tmp_x`"):
        stage.keep([ev])


def test_the_job_stage_says_the_rules_and_each_filtered_table_once() -> None:
    lines: list[tuple[str, dict]] = []

    class Log:
        def info(self, event: str, **kw: object) -> None:
            lines.append((event, kw))

    assert table_event_filter(TableFilter(), Log()) is None
    stage = table_event_filter(TableFilter(["*.*", "!db.skip", "!other.*"]), Log())
    assert stage is not None
    stage.keep([keyed_row(10, 1, table="skip"), keyed_row(11, 1, table="skip")])
    stage.keep([ddl_event(12, "CREATE DATABASE other", "", schema="other", ddl_type=1)])
    assert [e for e, _ in lines] == [
        "table filter in force",
        "table db.skip filtered out: rows and DDLs skipped",
        "schema other filtered out: its schema DDLs skipped",
    ]

"""Routing (sqlgen.route, sqlgen.ddl_route): the rule parser and matcher, DML written to routed names,
and the DDL rewriting table of tests/fixtures/sqlgen/ddl_route.sql."""

from __future__ import annotations

import pickle

import pytest

from applier.codec.events import RowKind
from sqlgen import MARIADB, RouteError, Router, RouteRuleError, plan_window, route_ddl, statements
from sqlgen.ddl_route import _apply, route_ddl_query, sqlglot_edits, token_edits
from sqlgen.route import parse_route_rule, rule_texts
from tests.builders import ddl_event, keyed_image, row_event, sql_fixture_cases

FIXTURE_RULES = ["src.special=elsewhere.renamed", "src.*=dst.{table}", "arch_*.*={schema}_bak.{table}"]
CASES = sql_fixture_cases("sqlgen/ddl_route.sql")


@pytest.fixture(scope="module")
def fixture_router() -> Router:
    return Router.from_rules(FIXTURE_RULES)


# -- rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "upstream", "expected"),
    [
        (["src_db.*=dst_db.*"], ("src_db", "orders"), ("dst_db", "orders")),
        (["db.tbl=db2.tbl2"], ("db", "tbl"), ("db2", "tbl2")),
        (["db.tbl=db2.tbl2"], ("db", "other"), ("db", "other")),
        (["prod.*=replica.{table}"], ("prod", "Orders"), ("replica", "Orders")),
        (["*.*={schema}_bak.{table}"], ("Shop", "t"), ("Shop_bak", "t")),
        (["*.*=merged.{schema}_{table}"], ("a", "t"), ("merged", "a_t")),
        (["PROD.ORD*=r.{table}"], ("prod", "orders"), ("r", "orders")),  # case-insensitive match
        (["p?.t=x.t"], ("p1", "t"), ("x", "t")),
        (["p?.t=x.t"], ("p10", "t"), ("p10", "t")),
        (["s[0-9].*=d.*"], ("s7", "t"), ("d", "t")),
        (["s[!0-9].*=d.*"], ("s7", "t"), ("s7", "t")),
        (["`my.db`.t=d.t"], ("my.db", "t"), ("d", "t")),
        (['"a*".t=d.t'], ("ab", "t"), ("ab", "t")),  # quoted: a literal name, no wildcard
        (['"a*".t=d.t'], ("a*", "t"), ("d", "t")),
        (["a\\*.t=d.t"], ("a*", "t"), ("d", "t")),
        (["src.* -> dst.*"], ("src", "t"), ("dst", "t")),
        (["s.*=`x.y`.t"], ("s", "q"), ("x.y", "t")),
        (["src.*->dst.*"], ("src", "t"), ("dst", "t")),
        (["my\\-db.t=d.t"], ("my-db", "t"), ("d", "t")),  # a special character escaped...
        (["`my-db`.t=d.t"], ("my-db", "t"), ("d", "t")),  # ...or quoted (unescaped: refused, below)
    ],
)
def test_a_rule_maps_names(rules, upstream, expected) -> None:
    assert Router.from_rules(rules).table(*upstream) == expected


# FROM is read by the table filter's parser (sqlgen.table_pattern, TiDB's grammar): these cases
# were read differently by routing's own parser before, and now follow the filter's rules.
@pytest.mark.parametrize(
    ("rules", "upstream", "expected"),
    [
        # /regex/ parts (new): a substring match, as in a filter rule
        (["/^shard_[0-9]+$/.*=merged.{table}"], ("Shard_12", "t"), ("merged", "t")),
        (["/^shard_[0-9]+$/.*=merged.{table}"], ("shard_x", "t"), ("shard_x", "t")),
        (["db./log/=logs.{table}"], ("db", "access_log_1"), ("logs", "access_log_1")),
        (["/a=b/./x->y/=d.t"], ("a=b", "x->y"), ("d", "t")),  # '=' and '->' inside a regex
        # a quoted FROM name may hold '=' (the rule used to be cut at its first '=')
        (['"a=b".t=d.t'], ("a=b", "t"), ("d", "t")),
        # a class escapes with '\\' (the backslash used to be a member of the class)
        (["s[\\]x].t=d.t"], ("s]", "t"), ("d", "t")),
        (["s[\\]x].t=d.t"], ("s\\", "t"), ("s\\", "t")),
    ],
)
def test_from_follows_the_table_filter_grammar(rules, upstream, expected) -> None:
    assert Router.from_rules(rules).table(*upstream) == expected


def test_a_table_part_of_stars_routes_the_whole_schema() -> None:
    """``**`` matches every table as ``*`` does, so the filter's parser counts it as ``*``: it now
    routes schema-level DDL too (it did not before)."""
    assert Router.from_rules(["src.**=dst.*"]).schema("src") == "dst"


def test_the_first_matching_rule_wins() -> None:
    router = Router.from_rules(["prod.special=x.s", "prod.*=replica.{table}", "*.*={schema}_bak.{table}"])
    assert router.table("prod", "special") == ("x", "s")
    assert router.table("prod", "orders") == ("replica", "orders")
    assert router.table("dev", "orders") == ("dev_bak", "orders")


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("prod.*", "expected FROM=TO"),
        # the table-filter grammar reads FROM and says what it expected after the schema part
        ("prod=replica.t", "expected '.' between the schema and the table pattern"),
        ("prod.*=replica", "expected schema.table"),
        ("a.b.c=d.e", "expected schema.table"),
        ("prod.*=replica.{tbl}", r"unknown placeholder \{tbl\}"),
        ("prod.*={table}.x", r"\{table\} may only appear in the target table"),
        ("prod.*=replica.t*", "may hold only text"),
        ("prod.*=replica.{table", "unbalanced brace"),
        ("pr[od.*=replica.t", "unclosed or empty character class"),  # the filter's wording
        ("=replica.t", "expected FROM=TO"),
        ("prod.*=replica.", "empty target name"),
        ("`prod.*=r.t", "the quoted schema name has no closing `"),  # the filter's wording
        ("prod.*=r.t`", "unterminated ` quote"),  # in TO
        ("db.[]=x.t", "unclosed or empty character class"),  # the filter's wording
        # the filter's rules, new for FROM (each of these used to be accepted, the first ones
        # matching the text literally): special characters escaped or quoted, no escaped letter or
        # digit, no empty quoted name, no blank inside the pattern, a /regex/ that compiles
        ("db-x.t=d.t", "expected '.' between the schema and the table pattern, found '-'"),
        ("db.my-t=d.t", r"unexpected '-' after the FROM pattern 'db\.my'"),
        ("d\\b.t=x.t", "cannot be escaped"),
        ('"".t=x.t', "empty quoted schema name"),
        ("db .t=x.t", "expected '.' between the schema and the table pattern, found ' '"),
        ("/(/.t=x.t", "bad schema pattern"),
    ],
)
def test_an_invalid_rule_is_refused_by_name(rule, message) -> None:
    with pytest.raises(RouteRuleError, match=message) as err:
        parse_route_rule(rule)
    assert repr(rule.strip()) in str(err.value)


def test_rule_texts_accept_every_setting_shape() -> None:
    assert rule_texts("a.*=b.*, c.t=d.t\ne.*=f.*") == ["a.*=b.*", "c.t=d.t", "e.*=f.*"]
    assert rule_texts("s[a,b].*=d.*") == ["s[a,b].*=d.*"]  # no split inside a class
    # a FROM is read with the pattern grammar: a comma in its /regex/ stays (new with /regex/ parts)
    assert rule_texts("/^s[0-9]{1,2}$/.*=d.*, `a,b`.t=`c,d`.t") == [
        "/^s[0-9]{1,2}$/.*=d.*",
        "`a,b`.t=`c,d`.t",
    ]
    assert rule_texts("a.*, b.*=c.*") == ["a.*", "b.*=c.*"]  # the first is then refused by name
    assert rule_texts(["a.*=b.*", "c.t=d.t"]) == ["a.*=b.*", "c.t=d.t"]
    assert rule_texts({"a.*": "b.*", "c.t": "d.t"}) == ["a.*=b.*", "c.t=d.t"]
    assert rule_texts([{"from": "a.*", "to": "b.*"}]) == ["a.*=b.*"]
    with pytest.raises(RouteRuleError, match="'from' and 'to'"):
        rule_texts([{"from": "a.*"}])


def test_the_checkpoint_schema_is_never_a_target() -> None:
    with pytest.raises(RouteRuleError, match="checkpoint schema"):
        Router.from_rules(["*.*=TICDC_applier.{table}"], reserved_schemas=["ticdc_applier"])
    router = Router.from_rules(["*.*={schema}.{table}"], reserved_schemas=["ticdc_applier"])
    assert router.table("src", "t") == ("src", "t")
    router = Router.from_rules(["*.*=ticdc_{schema}.{table}"], reserved_schemas=["ticdc_applier"])
    with pytest.raises(RouteError, match="checkpoint schema"):
        router.table("applier", "t")
    with pytest.raises(RouteError, match="checkpoint schema"):
        router.schema("applier")


def test_a_router_pickles_for_spark_tasks() -> None:
    router = Router.from_rules(["src.*=dst.{table}"])
    assert pickle.loads(pickle.dumps(router)).table("src", "t") == ("dst", "t")


def test_schema_level_routing_follows_the_first_whole_schema_rule() -> None:
    router = Router.from_rules(["src.t=x.t", "src.*=dst.*", "a_*.*=merged.{table}", "b_*.*={schema}_copy.*"])
    assert router.schema("src") == "dst"  # the table rule does not route the schema
    assert router.schema("other") == "other"
    assert router.schema("b_1") == "b_1_copy"
    assert router.ddl_skip_reason("a_1", drop_schema=True).startswith("DROP DATABASE a_1 is routed")
    assert router.ddl_skip_reason("a_1", drop_schema=False) == ""
    assert router.ddl_skip_reason("src", drop_schema=True) == ""  # a literal schema pattern
    assert router.ddl_skip_reason("b_1", drop_schema=True) == ""  # one target per schema


# -- DML ------------------------------------------------------------------------------------------


def test_rows_are_written_to_the_routed_table_and_counted_under_the_upstream_one() -> None:
    evs = [
        row_event(RowKind.INSERT, 10, keyed_image(1, "a"), schema="src"),
        row_event(RowKind.DELETE, 10, None, keyed_image(2, "b"), schema="src"),
    ]
    plan = plan_window(evs)
    router = Router.from_rules(["src.*=dst.{table}_v2"])
    sts = list(statements(plan, MARIADB, router))
    assert {(s.schema, s.table) for s in sts} == {("dst", "t_v2")}
    assert all("`dst`.`t_v2`" in s.sql and "`src`" not in s.sql for s in sts)
    assert list(plan.row_counts()) == [("src", "t")]
    unrouted = list(statements(plan, MARIADB))
    assert all("`src`.`t`" in s.sql for s in unrouted)


# -- DDL ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_ddl_names_are_routed(given: str, expected: str, fixture_router: Router) -> None:
    assert route_ddl_query(given, "src", fixture_router) == expected


def _parsed_by_sqlglot(case) -> bool:
    given = case.values[0]
    router = Router.from_rules(FIXTURE_RULES)
    return sqlglot_edits(given, "src", router) is not None and " VIEW " not in f" {given.upper()} "


@pytest.mark.parametrize(("given", "expected"), [c for c in CASES if _parsed_by_sqlglot(c)])
def test_the_token_fallback_agrees_with_sqlglot(given: str, expected: str, fixture_router: Router) -> None:
    """Where sqlglot parses, the fallback reads the same names (a view's body aside: the fallback
    never touches it)."""
    assert _apply(given, token_edits(given, "src", fixture_router)) == expected


def test_the_fallback_leaves_a_view_body_alone(fixture_router: Router) -> None:
    query = "CREATE VIEW v AS SELECT special.a FROM special WHERE a LIKE b"
    assert _apply(query, token_edits(query, "src", fixture_router)) == (
        "CREATE VIEW `dst`.`v` AS SELECT special.a FROM special WHERE a LIKE b"
    )


def test_a_routed_ddl_event_keeps_its_ts_and_position() -> None:
    router = Router.from_rules(FIXTURE_RULES)
    ddl = ddl_event(5, "ALTER TABLE special ADD COLUMN c INT", "special", schema="src")
    routed = route_ddl(ddl, router)
    assert (routed.schema, routed.table) == ("elsewhere", "renamed")
    assert routed.query == "ALTER TABLE `elsewhere`.`renamed` ADD COLUMN c INT"
    assert (routed.commit_ts, routed.ddl_type, routed.pos) == (5, 5, ddl.pos)
    schema_ddl = ddl_event(6, "CREATE DATABASE src", "", schema="src", ddl_type=1)
    assert route_ddl(schema_ddl, router).schema == "dst"
    assert route_ddl(ddl, Router()) is ddl

"""sqlgen.table_pattern: the one parser of TiDB's table-filter patterns. What each grammar rule
matches is checked through its two users (tests/unit/test_stream_table_filter.py for the filter,
tests/unit/test_sqlgen_route.py for routing's FROM); here, what the parser tells them."""

from __future__ import annotations

import pickle

import pytest

from sqlgen.table_pattern import parse_table_pattern, quote_end


@pytest.mark.parametrize(
    ("text", "literal", "matches_all", "search"),
    [
        ("shop", True, False, False),
        ("sh\\-op", True, False, False),  # an escape keeps a name literal
        ("`a*b`", True, False, False),  # so does quoting
        ('"a""b"', True, False, False),
        ("a_*", False, False, False),
        ("a?", False, False, False),
        ("a[0-9]", False, False, False),
        ("*", False, True, False),
        ("**", False, True, False),
        ("\\*", True, False, False),
        ("/^a/", False, False, True),
    ],
)
def test_each_part_says_whether_it_is_one_name_every_name_or_a_search(
    text, literal, matches_all, search
) -> None:
    pattern, rest = parse_table_pattern(f"{text}.{text}")
    assert rest == ""
    for part in (pattern.schema, pattern.table):
        assert (part.literal, part.matches_all, part.search) == (literal, matches_all, search)


def test_the_text_after_the_pattern_is_returned_for_the_rule_around_it() -> None:
    assert parse_table_pattern("db.t")[1] == ""
    assert parse_table_pattern('db."t".x')[1] == ".x"
    assert parse_table_pattern("db./t/ rest")[1] == " rest"
    assert parse_table_pattern("db.t* -> x.y", until="=- ")[1] == " -> x.y"
    assert parse_table_pattern("db.t=x.y", until="=")[1] == "=x.y"
    with pytest.raises(ValueError, match="unexpected special character '='"):
        parse_table_pattern("db.t=x.y")  # without ``until`` a special character is an error


def test_a_regex_part_searches_and_other_parts_match_whole_names_case_insensitively() -> None:
    pattern, _ = parse_table_pattern("/^db[0-9]/.Orders")
    assert pattern.matches("DB1x", "orders") and not pattern.matches("xdb1", "orders")
    assert not pattern.matches("db1", "orders_old")


def test_a_pattern_pickles() -> None:
    pattern, _ = parse_table_pattern("a_*.[!x]")
    copy = pickle.loads(pickle.dumps(pattern))
    assert copy == pattern and copy.matches("a_1", "y")


def test_quote_end_reads_a_doubled_quote_as_one() -> None:
    assert quote_end("`a``b`.c", 0) == 6
    assert quote_end('"ab', 0) == -1

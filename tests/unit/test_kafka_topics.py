"""Topic sets (names and /regex/ items) and the stream's partition ids for them."""

from __future__ import annotations

import pytest

from applier.kafka.topics import TopicSet, TopicSlots, split_topic_items


def test_items_split_on_commas_except_inside_a_pattern() -> None:
    assert split_topic_items("a, b,/x{1,3}/ ,c") == ["a", "b", "/x{1,3}/", "c"]
    assert split_topic_items("/a/b/") == ["/a/b/"]


def test_a_set_is_described_sorted_and_parsed_back() -> None:
    topics = TopicSet.parse(["cdc", "/cdc_.*/", "b,a", "a"])
    assert topics.describe() == "a,b,cdc,/cdc_.*/"
    assert TopicSet.parse(topics.describe()) == topics
    assert topics.single is None and topics.patterns


def test_one_plain_topic_is_single_and_described_as_itself() -> None:
    topics = TopicSet.parse("orders")
    assert topics.single == "orders" and topics.describe() == "orders" and not topics.patterns


def test_patterns_match_whole_names() -> None:
    topics = TopicSet.parse("/cdc_.*/")
    assert topics.matches("cdc_db_t") and not topics.matches("xcdc_db_t") and not topics.matches("cdc")


@pytest.mark.parametrize("bad", ["", ",", "/unclosed", "/[a-/"])
def test_bad_sets_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        TopicSet.parse(bad)


def test_overlap_is_judged_on_the_topics_with_offsets() -> None:
    old, new = TopicSet.parse("d,d_t1,d_t2"), TopicSet.parse("d,/d_.*/")
    assert new.overlaps(old, {"d_t1"}) and not new.overlaps(old, {"other"})


def test_slots_are_partitions_for_one_topic_and_dense_for_several() -> None:
    one = TopicSlots(TopicSet.parse("orders"))
    assert one.slot("orders", 7) == 7 and one.key(7) == ("orders", 7) and one.label(7) == "7"
    with pytest.raises(KeyError):
        one.slot("other", 0)
    many = TopicSlots(TopicSet.parse("a,b"))
    assert [many.slot("b", 0), many.slot("a", 3), many.slot("b", 0)] == [0, 1, 0]
    assert many.key(1) == ("a", 3) and many.label(1) == "a/3"

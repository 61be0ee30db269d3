"""--from-ts / --until parsing: TSO integers and ISO-8601 times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from applier.catchup.tso import parse_ts, parse_until, time_to_tso, tso_to_time


def test_an_integer_is_a_tso_as_is() -> None:
    assert parse_ts("446956416766312457") == 446956416766312457
    assert parse_ts(" 42 ") == 42
    assert parse_ts(7) == 7


def test_an_iso_time_is_its_first_tso() -> None:
    ms = int(datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC).timestamp() * 1000)
    assert parse_ts("2024-05-01T10:00:00Z") == ms << 18
    assert parse_ts("2024-05-01T10:00:00+00:00") == ms << 18
    assert parse_ts("2024-05-01T12:00:00+02:00") == ms << 18
    assert parse_ts("2024-05-01 10:00:00") == ms << 18  # no zone: UTC, never the host's zone
    assert parse_ts("2024-05-01T10:00:00.250Z") == (ms + 250) << 18


def test_round_trip_through_time() -> None:
    ts = parse_ts("2023-11-14T22:13:20.123Z")
    assert ts & ((1 << 18) - 1) == 0
    assert tso_to_time(ts) == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert time_to_tso(tso_to_time(ts)) == ts


@pytest.mark.parametrize("bad", ["yesterday", "", "-5", "2024-13-01T00:00:00Z", str(1 << 63), "1.5"])
def test_bad_values_are_refused_with_the_accepted_forms(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ts(bad)


def test_times_before_1970_have_no_tso() -> None:
    with pytest.raises(ValueError, match="1970"):
        parse_ts("1969-12-31T23:59:59Z")


def test_until_latest_or_a_ts() -> None:
    assert parse_until("latest") is None
    assert parse_until(" LATEST ") is None
    assert parse_until("99") == 99

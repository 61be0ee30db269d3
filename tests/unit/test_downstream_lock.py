"""Lock naming rules of the single-active lock (the lock itself is tested against MariaDB)."""

from __future__ import annotations

import pytest

from applier.downstream.lock import MAX_LOCK_NAME, ActiveLock, lock_name
from applier.downstream.url import DownstreamConfig


def test_plain_names_are_readable() -> None:
    assert lock_name("ticdc_applier", "cdc-group.1") == "ticdc_applier:ticdc_applier:cdc-group.1"


@pytest.mark.parametrize(
    ("schema", "changefeed"),
    [
        ("ticdc_applier", "x" * 60),  # too long
        ("ticdc_applier", "Group"),  # MySQL folds case in lock names, MariaDB does not
        ("ticdc_applier", "grüppe"),
        ("ticdc_applier", "a\x00b"),  # MariaDB truncates lock names at NUL
    ],
)
def test_other_names_are_hashed_to_64_chars(schema: str, changefeed: str) -> None:
    name = lock_name(schema, changefeed)
    assert len(name) == MAX_LOCK_NAME
    assert name.startswith("ticdc_applier:sha256:")
    assert name == name.lower() and name.isascii()
    assert name == lock_name(schema, changefeed)  # deterministic


def test_hashing_keeps_names_apart() -> None:
    names = {
        lock_name("s", "x" * 70),
        lock_name("s", "x" * 71),
        lock_name("s", "Group"),
        lock_name("s", "GROUP"),
    }
    assert len(names) == 4
    # The separator is part of the hash: ("a:b", "c") and ("a", "b:c") differ.
    assert lock_name("A:b", "c") != lock_name("A", "b:c")


def test_rejects_settings_that_would_let_the_lock_idle_out() -> None:
    with pytest.raises(ValueError):
        ActiveLock(DownstreamConfig(), changefeed="cf", heartbeat=5, idle_timeout=8)

"""Fixtures of the daemon's end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.integration.harness import Changefeed


@pytest.fixture
def feed(broker, downstream_url, mariadb_params) -> Iterator[Changefeed]:
    """A fresh changefeed (topic name, group id, checkpoint schema); its schemas are dropped after."""
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", downstream_url, mariadb_params)
    yield cf
    cf.drop()

"""Shared fixtures: a real embedded Kafka-protocol broker and throwaway MariaDB databases.

Nothing here skips when a service is missing: a test that claims end-to-end behaviour fails
loudly instead, so a green run always means the real components were exercised.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from applier.kafka.embedded_broker import EmbeddedBroker, create_topic, start_broker

MARIADB_URL = os.environ.get("APPLIER_TEST_DOWNSTREAM", "mysql://root@127.0.0.1:3306/")


def _mariadb_params() -> dict:
    from urllib.parse import unquote, urlsplit

    u = urlsplit(MARIADB_URL)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
    }


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """One real tansu broker for the whole session."""
    b = start_broker()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def topic(broker: EmbeddedBroker, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh topic name (created by the test with the partition count it needs, or via make_topic)."""
    yield f"t_{request.node.name[:40]}_{uuid.uuid4().hex[:8]}".replace("[", "_").replace("]", "_")


@pytest.fixture
def make_topic(broker: EmbeddedBroker):
    def _make(partitions: int, name: str | None = None) -> str:
        name = name or f"topic_{uuid.uuid4().hex[:10]}"
        create_topic(broker.bootstrap, name, partitions)
        return name

    return _make


@pytest.fixture(scope="session")
def mariadb_params() -> dict:
    """Connection parameters of the test MariaDB; fails (never skips) when it is unreachable."""
    params = _mariadb_params()
    try:
        pymysql.connect(**params, connect_timeout=5).close()
    except pymysql.err.OperationalError as exc:
        pytest.fail(f"MariaDB at {MARIADB_URL} is not reachable ({exc}); set APPLIER_TEST_DOWNSTREAM")
    return params


@pytest.fixture
def downstream_url(mariadb_params: dict) -> str:
    """mysql:// URL of the test server, for code that takes a URL."""
    p = mariadb_params
    auth = p["user"] + (f":{p['password']}" if p["password"] else "")
    return f"mysql://{auth}@{p['host']}:{p['port']}/"


@pytest.fixture
def fresh_db(mariadb_params: dict) -> Iterator[str]:
    """Name of a new empty database, dropped after the test."""
    name = f"applier_test_{uuid.uuid4().hex[:12]}"
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        yield name
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()

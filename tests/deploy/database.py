"""The deployment tests' side of the shared MariaDB: root sessions and the objects a test owns."""

from __future__ import annotations

import time
from collections.abc import Iterable

import pymysql


def admin(params: dict, timeout: float = 60) -> pymysql.connections.Connection:
    """A root session of its own: the server is shared, and other tests on this machine may restart
    it, so none is held across a test and a restart in progress is waited out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pymysql.connect(**params, autocommit=True, charset="utf8mb4", connect_timeout=5)
        except pymysql.err.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def drop_objects(params: dict, schemas: Iterable[str], user: str) -> None:
    """Drop a test's schemas and its database user (also what a killed earlier run left)."""
    conn = admin(params)
    try:
        with conn.cursor() as cur:
            for schema in schemas:
                cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
            cur.execute("DROP USER IF EXISTS %s@'%%'", (user,))
    finally:
        conn.close()

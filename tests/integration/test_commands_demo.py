"""``applier demo`` against the real MariaDB: it drops the schema it writes, so it says which database
it writes to (and where that came from) before writing, and refuses a schema holding anything the
simulator does not create, in one line with exit status 2, leaving it untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from applier.commands.demo import foreign_objects

pytestmark = pytest.mark.integration


@pytest.fixture
def schema(mariadb_params: dict) -> Iterator[str]:
    name = f"demo_test_{uuid.uuid4().hex[:10]}"
    yield name
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def _sql(params: dict, *statements: str) -> list[tuple]:
    conn = pymysql.connect(**params, autocommit=True)
    try:
        with conn.cursor() as cur:
            for st in statements:
                cur.execute(st)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def _demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("APPLIER_")}
    return subprocess.run(
        [sys.executable, "-m", "applier", "demo", "--transactions", "40", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**environ, **env},
    )


def test_a_schema_holding_a_table_the_demo_did_not_create_is_refused_and_left_alone(
    schema: str, downstream_url: str, mariadb_params: dict
) -> None:
    _sql(
        mariadb_params,
        f"CREATE DATABASE `{schema}`",
        f"CREATE TABLE `{schema}`.orders (id INT PRIMARY KEY)",
        f"INSERT INTO `{schema}`.orders VALUES (1)",
    )
    # The URL comes from the environment only: the demo must say so before it does anything.
    proc = _demo("--schema", schema, env={"APPLIER_DOWNSTREAM": downstream_url})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"downstream: {downstream_url} (from APPLIER_DOWNSTREAM)"), proc.stdout
    assert f"schema {schema!r} is dropped" in first
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"applier demo drops --schema {schema!r}" in proc.stderr and "table orders" in proc.stderr
    assert "== 1." not in proc.stdout  # refused before the broker started
    assert _sql(mariadb_params, f"SELECT id FROM `{schema}`.orders") == [(1,)]


@pytest.mark.parametrize("name", ["mysql", "ticdc_applier"])
def test_system_and_checkpoint_schemas_are_refused(name: str, downstream_url: str) -> None:
    proc = _demo("--schema", name, "--downstream", downstream_url, env={})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"downstream: {downstream_url} (from --downstream)")
    assert "system or checkpoint schema" in proc.stderr and proc.stderr.count("\n") == 1


def test_only_the_simulators_own_base_tables_are_the_demos(schema: str, mariadb_params: dict) -> None:
    conn = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        assert foreign_objects(conn, schema) == []  # no such schema: nothing to lose
        _sql(
            mariadb_params,
            f"CREATE DATABASE `{schema}`",
            f"CREATE TABLE `{schema}`.composite (a INT)",
            f"CREATE TABLE `{schema}`.keyless (k INT)",
        )
        assert foreign_objects(conn, schema) == []
        _sql(
            mariadb_params,
            f"CREATE VIEW `{schema}`.wide AS SELECT 1 AS one",
            f"CREATE PROCEDURE `{schema}`.p() SELECT 1",
        )
        assert foreign_objects(conn, schema) == ["view wide", "procedure p"]
    finally:
        conn.close()


def test_the_demo_runs_twice_on_its_own_schema(schema: str, downstream_url: str) -> None:
    for _ in range(2):  # the second run finds the first one's tables: its own, dropped and rewritten
        proc = _demo("--schema", schema, "--downstream", downstream_url, env={})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0].startswith(f"downstream: {downstream_url} (from --downstream)")
        assert lines[-1].startswith("OK: ")

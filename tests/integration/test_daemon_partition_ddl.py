"""The daemon applies TiCDC's partition-table DDLs with the rows before and after them.

The statements are those of TiCDC's ``partition_table`` integration test (see
``test_ddl_partition_table.py``), run once directly on MariaDB as the "upstream": every DML
statement's effect is read back (table contents before and after, by primary key) and becomes
the row events TiCDC would send, each DDL becomes its event with TiCDC's type code and key. The
same stream is then applied by the daemon to a clean downstream, which must end in exactly the
upstream's state: tables, partitions, columns, indexes and rows.
"""

from __future__ import annotations

import uuid

import pymysql
import pytest

from applier.downstream.session import DEFAULT_SQL_MODE
from applier.kafka.embedded_broker import create_topic
from sqlgen import MARIADB, plan_ddl
from tests.integration.ddl_script import Script, snapshot
from tests.integration.harness import Changefeed
from tests.integration.test_ddl_partition_table import _script

pytestmark = pytest.mark.integration


def _contents(
    cur: pymysql.cursors.Cursor, schemas: tuple[str, ...]
) -> dict[tuple[str, str], dict[int, dict]]:
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for schema in schemas:
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (schema,))
        for (table,) in cur.fetchall():
            cur.execute(f"SELECT * FROM `{schema}`.`{table}`")
            names = [d[0] for d in cur.description]
            rows = {}
            for r in cur.fetchall():
                row = {n: (None if v is None else int(v)) for n, v in zip(names, r, strict=True)}
                rows[row["a"]] = row
            out[(schema, table)] = rows
    return out


def _upstream(admin: pymysql.connections.Connection, s1: str, s2: str, script: Script) -> None:
    """Run the statements; record each DDL and each DML statement's row changes in ``script``."""
    with admin.cursor() as cur:
        cur.execute("SET SESSION sql_mode = %s", (DEFAULT_SQL_MODE,))
        for step in _script(s1, s2):
            if isinstance(step, tuple):
                ddl_type, schema, table, query = step
                for sql in plan_ddl(query, ddl_type, schema, MARIADB).statements():
                    cur.execute(sql)
                script.ddl(schema, table, ddl_type, query)
                continue
            before = _contents(cur, (s1, s2))
            cur.execute(f"USE `{s1}`")
            cur.execute(step)
            after = _contents(cur, (s1, s2))
            for (schema, table), new in after.items():
                old = before.get((schema, table), {})
                deletes = [old[k] for k in old if k not in new]
                inserts = [new[k] for k in new if k not in old]
                updates = [(old[k], new[k]) for k in new if k in old and old[k] != new[k]]
                if deletes or inserts or updates:
                    script.rows(schema, table, insert=inserts, update=updates, delete=deletes)


def test_daemon_applies_ticdc_partition_table_ddls(broker, ddl_downstream_url, mariadb_params) -> None:
    tag = uuid.uuid4().hex[:8]
    s1, s2 = f"partition_table_{tag}", f"partition_table2_{tag}"
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    script = Script(partitions=3)

    def drop() -> None:
        with admin.cursor() as cur:
            for s in (s1, s2):
                cur.execute(f"DROP DATABASE IF EXISTS `{s}`")

    topic = f"cdc_{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 3)
    cf = Changefeed(broker.bootstrap, topic, ddl_downstream_url, mariadb_params)
    try:
        _upstream(admin, s1, s2, script)
        expected = snapshot(admin, [s1, s2])
        assert expected[s1] and expected[s2]
        drop()
        script.produce(cf.bootstrap, cf.topic)
        done = cf.run_to_end(timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert snapshot(admin, [s1, s2]) == expected
    finally:
        cf.drop()
        drop()
        admin.close()

"""Shared pieces of the catch-up tests: one SparkSession per test process, and a restored backup.

Starting Spark costs seconds of JVM start-up on this machine, so every in-process catch-up of
the test session shares one local[2] session (CI budget). Tests that must kill a catch-up run it
as a subprocess, which starts its own.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from typing import Any

import pymysql

from applier.settings.schema import resolve
from applier.simulator import Simulation, StreamConfig, produce_simulation, simulate
from applier.simulator.tables import DDL_CREATE_SCHEMA, quote_ident
from tests.integration.harness import Changefeed, new_log


@functools.cache
def spark_session() -> Any:
    """The test process's SparkSession (local[2]); created on first use, stopped at exit."""
    import atexit

    from applier.catchup.session import build_session
    from applier.catchup.spark_home import spark_home_links

    # Forked workers (the daemon): this session runs hundreds of tiny jobs, where starting an
    # interpreter per task (the command's local default) would double the tests' time. The
    # subprocess runs (run_catchup_process) keep the command's defaults.
    conf = {
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.use.daemon": "true",
    }
    # Launched as a catch-up launches it: from the Spark home links (their directory, removed at
    # exit, is made before the stop is registered, so it is removed after the JVM stopped).
    spark = build_session("local[2]", conf, spark_home=spark_home_links(class_archive_directory()))
    atexit.register(spark.stop)
    return spark


def load_state(conn: pymysql.connections.Connection, sim: Simulation, ts: int, db: str) -> None:
    """Create the tables from the DDL events with commit ts <= ts and insert the expected rows."""
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"USE {quote_ident(db)}")
        for ev in sim.ddl_events:
            if ev.commit_ts <= ts and ev.ddl_type != DDL_CREATE_SCHEMA:
                cur.execute(ev.ddl_query)
        for (_, table), rows in sim.expected_snapshot(ts).items():
            spec = sim.table_spec(table, ts)
            assert spec is not None
            cols = [c for c in spec.columns if not c.is_generated]
            sql = (
                f"INSERT INTO {quote_ident(table)} ({', '.join(quote_ident(c.name) for c in cols)}) "
                f"VALUES ({', '.join(['%s'] * len(cols))})"
            )
            if rows:
                cur.executemany(sql, [[row[c.name] for c in cols] for row in rows])
    conn.commit()


def restore_backup(cf: Changefeed, sim: Simulation, ts: int) -> None:
    """Load the model's snapshot at ``ts`` into the downstream, as a restored BR/Dumpling backup would:
    the schema and tables as of ``ts`` (DDLs at or below it), every row as of ``ts``, no checkpoint."""
    conn = pymysql.connect(**cf.mariadb_params, charset="utf8mb4", autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {quote_ident(sim.schema)}")
        load_state(conn, sim, ts, sim.schema)
    finally:
        conn.close()


def catchup_flags(cf: Changefeed, from_ts: int, *more: str, master: str = "local[2]") -> list[str]:
    return [
        "--kafka-bootstrap",
        cf.bootstrap,
        "--topic",
        cf.topic,
        "--group-id",
        cf.group_id,
        "--downstream",
        cf.downstream,
        "--checkpoint-schema",
        cf.checkpoint_schema,
        "--from-ts",
        str(from_ts),
        "--spark-master",
        master,
        "--catchup-split-records",
        "150",
        *more,
    ]


def run_catchup_process(cf: Changefeed, from_ts: int, *more: str, master: str, timeout: float = 300):
    """A catch-up as its own process (on ``master``), to its end; its Summary read from its output."""
    from applier.catchup.report import Summary

    proc = start_catchup_process(cf, from_ts, *more, master=master)
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(proc.log_path) as fh:  # type: ignore[attr-defined]
        text = fh.read()
    assert proc.returncode == 0, text[-4000:]
    summary = Summary.parse(text)
    assert summary is not None, f"no summary in the catch-up's output: {text[-4000:]}"
    return summary


def run_catchup_here(cf: Changefeed, from_ts: int, *more: str):
    """Run a catch-up in this process on the shared SparkSession; returns its Summary."""
    from applier.catchup.job import CatchupJob
    from applier.cli import _build_parser

    args = _build_parser().parse_args(["catchup", *catchup_flags(cf, from_ts, *more)])
    cfg = resolve("catchup", vars(args), environ={})
    return CatchupJob(cfg, spark=spark_session(), progress_interval=2.0).run()


@functools.cache
def class_archive_directory() -> str:
    """The JVM class archive directory of this test process's catch-up processes: the first one
    writes the archive, the others read it, and nothing is left in the user's cache."""
    import atexit
    import shutil

    path = tempfile.mkdtemp(prefix="applier-class-archive-")
    atexit.register(shutil.rmtree, path, True)
    return path


def start_catchup_process(
    cf: Changefeed, from_ts: int, *more: str, start_new_session: bool = False, master: str = "local[2]"
) -> subprocess.Popen:
    """``python -m applier catchup ...`` in the background, output to a log file (``proc.log_path``).

    ``start_new_session``: the process (and the Spark JVM it starts) get their own process group,
    so a test can kill both with one ``os.killpg``. ``master``: a ``spark://`` URL runs the job on
    that cluster (the driver then binds to 127.0.0.1, where the test cluster's executors are).
    The JVM class archive is :func:`class_archive_directory`'s unless ``more`` names another."""
    if "--catchup-class-archive" not in more:
        more = (*more, "--catchup-class-archive", class_archive_directory())
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIER_")}
    if master.startswith("spark://"):
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
    log_path = new_log("catchup-")
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "applier",
                "catchup",
                *catchup_flags(cf, from_ts, *more, master=master),
                "--spark-conf",
                "spark.driver.memory=1g",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=start_new_session,
        )
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def table_checksums(cf: Changefeed, schema: str) -> dict[str, tuple[int, int]]:
    """(row count, CHECKSUM TABLE) of every table of ``schema``: equal values mean nothing changed."""
    conn = cf.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
                (schema,),
            )
            names = [r[0] for r in cur.fetchall()]
            out = {}
            for name in names:
                cur.execute(f"SELECT COUNT(*) FROM {quote_ident(schema)}.{quote_ident(name)}")
                (n,) = cur.fetchone()
                cur.execute(f"CHECKSUM TABLE {quote_ident(schema)}.{quote_ident(name)}")
                out[name] = (int(n), int(cur.fetchone()[1]))
        return out
    finally:
        conn.close()


def global_resolved_of(records) -> int:
    """The global resolved ts of a prefix of a simulated stream (the daemon's and catch-up's R)."""
    last: dict[int, int] = {}
    parts = set()
    for rec in records:
        parts.add(rec.partition)
        for ev in rec.events:
            if ev.kind == "resolved":  # a DDL implies no resolved ts (docs/open-protocol.md §5.4)
                last[rec.partition] = max(last.get(rec.partition, 0), ev.commit_ts)
    return min(last.values())


def backlog_after_a_backup(cf: Changefeed, seed: int, transactions: int) -> tuple[Simulation, int, int]:
    """A simulated stream (2 partitions) in the topic, the downstream restored as of its second
    resolved point X: returns the simulation, X and the stream's global resolved ts R."""
    sim = simulate(StreamConfig(seed=seed, partitions=2, transactions=transactions, schema=cf.new_schema()))
    x = sim.resolved_points[1]
    restore_backup(cf, sim, x)
    produce_simulation(cf.bootstrap, cf.topic, sim)
    return sim, x, global_resolved_of(sim.records)

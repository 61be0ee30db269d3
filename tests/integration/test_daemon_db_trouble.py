"""Database trouble mid-stream: connections killed with KILL, a row lock held by another session.

Both must be ridden out by the retry rules (reconnect, replay the whole transaction from memory)
and the stream must still converge to the model.

A private server (``start_plain_mariadb``): the test kills every client session but its own and
lowers the global lock wait timeout, which would hit the tests running beside it on the shared one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import pymysql
import pytest

from applier.downstream.lock import lock_name
from applier.simulator import PRODUCER_MODES, StreamConfig, produce_simulation, simulate
from tests.integration import eager_workers
from tests.integration.harness import Changefeed, read_log, stop, wait_for_output
from tests.integration.lock_holder import holding_tables
from tests.integration.private_mariadb import PrivateMariaDB, start_plain_mariadb

# One worker runs the module: the server is started once.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("db_trouble")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    srv = start_plain_mariadb(Path(tmp_path_factory.mktemp("mariadb-db-trouble")))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def feed(server: PrivateMariaDB, broker) -> Iterator[Changefeed]:
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", server.url, server.params)
    yield cf
    cf.drop()


def _apply_connections(admin: pymysql.connections.Connection, feed: Changefeed) -> list[int]:
    """Ids of the daemon's apply connections: every client session but ours and the lock holder's."""
    with admin.cursor() as cur:
        cur.execute("SELECT IS_USED_LOCK(%s)", (lock_name(feed.checkpoint_schema, feed.group_id),))
        holder = cur.fetchone()[0]
        cur.execute(
            "SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID() "
            "AND command <> 'Daemon' AND user NOT IN ('system user', 'event_scheduler')"
        )
        return [int(r[0]) for r in cur.fetchall() if r[0] != holder]


@pytest.mark.parametrize(
    ("workers", "blocking", "consistency"),
    [(0, "all", "transaction"), (2, "all", "transaction"), (0, "tables", "transaction"), (0, "all", "row")],
)
@pytest.mark.parametrize("mode", ["all-classic", "all-new"])
def test_killed_connections_and_a_held_lock_are_ridden_out(
    feed: Changefeed, mode: str, workers: int, blocking: str, consistency: str
) -> None:
    """Every producer order of the architecture at once (docs/open-protocol.md §5.1-§5.4); with
    ``workers``, two worker sessions write the keyed rows of every window (``eager_workers``):
    their connections are killed too, and they wait on the held lock, fail and leave the window
    to its own session, which waits in turn and replays. With ``blocking = "tables"`` the DDLs
    are made to last (``lock_holder``) and run beside the stream, on sessions that are killed too.
    In row mode (its joint release after start-up kept short) the partitions' sessions are killed
    too, and the one whose rows meet the lock waits and replays."""
    schema = feed.new_schema()
    sim = simulate(
        StreamConfig(seed=41, partitions=4, transactions=1500, schema=schema, **PRODUCER_MODES[mode])
    )
    # The last third is produced while the row lock is held, so that rows of the locked table are
    # still to be written then, however fast the daemon went through the rest.
    cut = len(sim.records) * 2 // 3
    produce_simulation(feed.bootstrap, feed.topic, dataclasses.replace(sim, records=sim.records[:cut]))

    def produce_the_rest() -> None:
        rest = dataclasses.replace(sim, records=sim.records[cut:])
        produce_simulation(feed.bootstrap, feed.topic, rest, create=False)

    feed.extra_args += ["--max-txn-rows", "10", "--ddl-blocking", blocking]
    if workers:
        feed.module = eager_workers.__name__
        feed.extra_args += ["--apply-workers", str(workers)]
    if consistency == "row":
        feed.extra_args += ["--consistency", "row", "--row-settle-seconds", "0.5"]
    lasting = holding_tables(feed.mariadb_params, schema, seed=41) if blocking == "tables" else nullcontext()
    # With "tables", composite's rows wait while its ADD COLUMN waits for the lock holder, and may
    # never meet a row lock: one on a table without DDLs is met.
    locked = "uniq_only" if blocking == "tables" else "composite"
    with lasting:
        _ride_out(feed, schema, locked, workers, produce_the_rest)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    assert feed.compare(sim, sim.final_resolved_ts) == []


def _ride_out(
    feed: Changefeed, schema: str, locked: str, workers: int, while_locked: Callable[[], None]
) -> None:
    """Kill the daemon's sessions, then hold row locks past its lock wait timeout (calling
    ``while_locked`` once they are taken): the daemon must live through both."""
    admin = feed.connect()
    with admin.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.innodb_lock_wait_timeout")
        old_timeout = cur.fetchone()[0]
        # New sessions (the daemon's) give up waiting for a row lock after 1 s: error 1205.
        cur.execute("SET GLOBAL innodb_lock_wait_timeout = 1")
    proc = feed.start()
    try:
        wait_for_output(proc, "window applied", timeout=60)
        # 1. KILL the apply connection a few times while it works.
        killed = 0
        for _ in range(4):
            for conn_id in _apply_connections(admin, feed):
                with admin.cursor() as cur:
                    try:
                        cur.execute(f"KILL {conn_id}")
                        killed += 1
                    except pymysql.err.OperationalError:
                        pass  # already gone
            time.sleep(0.4)
        assert killed >= 1
        # 2. Hold row locks on ``locked``, which the stream writes, longer than the lock wait timeout.
        holder = feed.connect()
        holder.autocommit(False)
        with holder.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.execute("BEGIN")
            cur.execute(f"SELECT * FROM `{schema}`.`{locked}` FOR UPDATE")
        while_locked()
        release = threading.Timer(4.0, holder.rollback)
        release.start()
        release.join()
        holder.close()
        wait_for_output(proc, "transient downstream error", timeout=5)
        assert proc.poll() is None, "the daemon died instead of riding the trouble out:\n" + read_log(proc)
    finally:
        with admin.cursor() as cur:
            cur.execute(f"SET GLOBAL innodb_lock_wait_timeout = {int(old_timeout)}")
        admin.close()
        stop(proc)
    log = read_log(proc)
    assert "code=1205" in log, "the held lock was never hit: " + log[-3000:]
    assert "fatal" not in log
    if workers:
        assert "workers=2" in log, "no window was written by the workers"

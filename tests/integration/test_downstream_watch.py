"""The statement watch against the real MariaDB: lock waits, their blockers, PROCESS or not, KILL."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from applier.downstream.url import parse_downstream_url
from applier.downstream.watch import NO_PROCESS, StatementWait, StatementWatch

pytestmark = pytest.mark.integration


@pytest.fixture
def no_process_user(mariadb_params: dict, fresh_db: str) -> Iterator[tuple[str, str]]:
    """A user with every privilege on ``fresh_db`` and none on the server (no PROCESS)."""
    user, password = f"np_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    with admin.cursor() as cur:
        cur.execute("CREATE USER %s@'127.0.0.1' IDENTIFIED BY %s", (user, password))
        cur.execute(f"GRANT ALL PRIVILEGES ON `{fresh_db}`.* TO `{user}`@'127.0.0.1'")
    try:
        yield user, password
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP USER IF EXISTS %s@'127.0.0.1'", (user,))
        admin.close()


def _waits(watch: StatementWatch, timeout: float = 10.0) -> tuple[StatementWait, ...]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watch.check()
        if watch.waits():
            return watch.waits()
        time.sleep(0.1)
    raise AssertionError("no lock wait seen")


def test_a_metadata_lock_wait_names_the_open_transaction_or_says_why_it_cannot(
    mariadb_params: dict, fresh_db: str, no_process_user: tuple[str, str]
) -> None:
    user, password = no_process_user
    port = mariadb_params["port"]
    root = parse_downstream_url(f"mysql://{mariadb_params['user']}@127.0.0.1:{port}/", env={})
    limited = parse_downstream_url(f"mysql://{user}:{password}@127.0.0.1:{port}/", env={})
    holder = pymysql.connect(**mariadb_params, autocommit=False)
    ddl = pymysql.connect(host="127.0.0.1", port=port, user=user, password=password, autocommit=True)
    outcome: list[BaseException | None] = []
    watches = [StatementWatch(root, after=0.2), StatementWatch(limited, after=0.2)]
    try:
        with holder.cursor() as cur:
            cur.execute(f"CREATE TABLE `{fresh_db}`.t (id INT PRIMARY KEY)")
            cur.execute("SELECT CONNECTION_ID()")
            holder_id = int(cur.fetchone()[0])
            cur.execute("BEGIN")
            cur.execute(f"SELECT * FROM `{fresh_db}`.t")  # keeps a metadata lock until it ends
        with ddl.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID()")
            ddl_id = int(cur.fetchone()[0])
            cur.execute("SET SESSION lock_wait_timeout = 30")

        def alter() -> None:
            try:
                with ddl.cursor() as cur:
                    cur.execute(f"ALTER TABLE `{fresh_db}`.t ADD COLUMN c INT")
                outcome.append(None)
            except pymysql.err.MySQLError as exc:
                outcome.append(exc)

        runner = threading.Thread(target=alter)
        description = f"ALTER TABLE {fresh_db}.t ADD COLUMN c INT"
        with (
            watches[0].statement(ddl_id, description, [(fresh_db, "t")]),
            watches[1].statement(ddl_id, description, [(fresh_db, "t")]),
        ):
            runner.start()
            (seen,) = _waits(watches[0])
            assert (seen.kind, seen.state) == ("metadata", "Waiting for table metadata lock")
            # No metadata-lock table on the test server: the sessions with an open transaction
            # (other clients of the server among them) are the candidates.
            assert seen.likely and holder_id in [b.id for b in seen.blockers]
            assert seen.blocked_by().startswith("likely blocked by one of: session ")
            assert f"session {holder_id} (" in seen.blocked_by()
            (blind,) = _waits(watches[1])
            assert blind.kind == "metadata" and blind.blockers == () and blind.blocked_by() == NO_PROCESS
            # On stop: the waiting statement is killed (same user: no privilege needed).
            assert watches[1].interrupt() == [ddl_id]
            runner.join(timeout=10)
        assert watches[0].waits() == () and watches[1].waits() == ()
        (error,) = outcome
        assert isinstance(error, pymysql.err.OperationalError) and error.args[0] == 1317
    finally:
        for watch in watches:
            watch.close()
        holder.rollback()
        holder.close()
        ddl.close()

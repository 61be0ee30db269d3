"""Fixtures of the daemon's end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pymysql
import pytest

from applier.kafka.embedded_broker import free_port, start_broker
from tests.integration.harness import Changefeed, DatabaseUser, keep_logs_in
from tests.integration.tcp_proxy import TcpProxy


@pytest.fixture(scope="session", autouse=True)
def daemon_logs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The daemons' logs in the session's temporary directory, not one file each in /tmp for good."""
    keep_logs_in(tmp_path_factory.mktemp("logs"))


@pytest.fixture
def feed(broker, downstream_url, mariadb_params) -> Iterator[Changefeed]:
    """A fresh changefeed (topic name, group id, checkpoint schema); its schemas are dropped after."""
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", downstream_url, mariadb_params)
    yield cf
    cf.drop()


@pytest.fixture
def own_user(mariadb_params: dict) -> Iterator[DatabaseUser]:
    """A database user of the test's own (every privilege, from 127.0.0.1), for tests that look for or
    kill the daemon's sessions: the suite runs tests side by side, so other tests' sessions (root's
    included) are on the server too and must be left alone."""
    user = DatabaseUser(f"own_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex)
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute("CREATE USER %s@'127.0.0.1' IDENTIFIED BY %s", (user.name, user.password))
            cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO `{user.name}`@'127.0.0.1'")
        yield user
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP USER IF EXISTS %s@'127.0.0.1'", (user.name,))
        admin.close()


@pytest.fixture
def own_user_feed(broker, mariadb_params: dict, own_user: DatabaseUser) -> Iterator[Changefeed]:
    """A changefeed applied by :func:`own_user`."""
    url = f"mysql://{own_user.name}:{own_user.password}@127.0.0.1:{mariadb_params['port']}/"
    cf = Changefeed(broker.bootstrap, f"cdc_{uuid.uuid4().hex[:10]}", url, mariadb_params)
    yield cf
    cf.drop()


@pytest.fixture
def proxied_broker() -> Iterator[TcpProxy]:
    """A broker of its own behind a forwarder (tests/integration/tcp_proxy.py) that the tests can
    cut, slow down or stall; the broker advertises the forwarder, whose port is the bootstrap."""
    port = free_port()
    broker = start_broker(advertised_port=port)
    proxy = TcpProxy(broker.port, port)
    try:
        yield proxy
    finally:
        proxy.close()
        broker.stop()


LEAST_PRIVILEGE_SCHEMAS = ("ddlc\\_%", "ddlc2\\_%", "fence\\_%", "hostile\\_%", "partition\\_table%")
"""Schema patterns of the DDL tests that run as the least-privilege user (docs/operations.md,
"The database user")."""


@pytest.fixture(scope="session")
def least_privilege_url(mariadb_params: dict) -> Iterator[str]:
    """mysql:// URL of a user holding exactly the grants docs/operations.md lists: no SUPER, no
    GRANT OPTION, nothing on other schemas. Test checkpoint schemas all start with ``ckpt_``."""
    user, password = f"applier_lp_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = pymysql.connect(**mariadb_params, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
            cur.execute("GRANT PROCESS ON *.* TO %s@'%%'", (user,))
            cur.execute("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `ckpt\\_%%`.* TO %s@'%%'", (user,))
            for pattern in LEAST_PRIVILEGE_SCHEMAS:
                cur.execute(
                    "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, REFERENCES, "
                    f"CREATE VIEW, SHOW VIEW ON `{pattern.replace('%', '%%')}`.* TO %s@'%%'",
                    (user,),
                )
        p = mariadb_params
        yield f"mysql://{user}:{password}@{p['host']}:{p['port']}/"
    finally:
        with admin.cursor() as cur:
            cur.execute("DROP USER IF EXISTS %s@'%%'", (user,))
        admin.close()


@pytest.fixture(params=["root", "least-privilege"])
def ddl_downstream_url(request: pytest.FixtureRequest, downstream_url: str) -> str:
    """The DDL tests run twice: as root and as the least-privilege user."""
    if request.param == "root":
        return downstream_url
    return request.getfixturevalue("least_privilege_url")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a real S3-compatible server (moto, in this process) on 127.0.0.1, for the whole session.
    Helpers to fill and use it: tests/integration/s3_server.py."""
    from tests.integration.s3_server import start_s3_server

    server = start_s3_server()
    try:
        yield server.endpoint
    finally:
        server.stop()

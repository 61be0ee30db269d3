"""TLS to the database, against a private MariaDB that refuses every unencrypted TCP session.

The server's certificate is signed by a CA the test makes and names only IP 127.0.0.1, so:
verify_identity to 127.0.0.1 passes, the same to ``localhost`` fails on the name, and another CA
fails on the chain. The daemon applies a real stream through the flat TLS settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from applier.downstream.errors import DownstreamConnectError
from applier.downstream.session import close_quietly, connect
from applier.settings.downstream import downstream_config
from applier.settings.schema import resolve
from applier.simulator import StreamConfig, produce_simulation, simulate
from tests.integration.harness import Changefeed
from tests.integration.private_mariadb import PrivateMariaDB, start_private_mariadb

pytestmark = pytest.mark.integration

PASSWORD = "tls-test-pass"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    srv = start_private_mariadb(Path(tmp_path_factory.mktemp("mariadb-tls")))
    try:
        conn = srv.root()
        with conn.cursor() as cur:
            cur.execute("CREATE USER 'applier'@'%%' IDENTIFIED BY %s REQUIRE SSL", (PASSWORD,))
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'applier'@'%'")
            cur.execute("CREATE USER 'certuser'@'%' REQUIRE X509")
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'certuser'@'%'")
        conn.close()
        yield srv
    finally:
        srv.stop()


def _flags(server: PrivateMariaDB, user: str = "applier", host: str = "127.0.0.1", **more: object) -> dict:
    return {"group_id": "g", "downstream": f"mysql://{user}@{host}:{server.port}/", **more}


def _session_cipher(cfg_flags: dict, password: str | None = PASSWORD) -> tuple[str, str]:
    """Connect with the settings as `status`/`run` resolve them; return (Ssl_version, Ssl_cipher)."""
    env = {"APPLIER_DOWNSTREAM_PASSWORD": password} if password else {}
    ds = downstream_config(resolve("status", cfg_flags, environ=env), env=env)
    conn = connect(ds, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW SESSION STATUS WHERE Variable_name IN ('Ssl_version', 'Ssl_cipher')")
            got = dict(cur.fetchall())
    finally:
        close_quietly(conn)
    return got["Ssl_version"], got["Ssl_cipher"]


def test_verify_identity_passes_and_the_session_is_encrypted(server: PrivateMariaDB) -> None:
    ca = str(server.certs / "ca.pem")
    version, cipher = _session_cipher(
        _flags(server, downstream_ssl_ca=ca, downstream_ssl_verify_identity=True)
    )
    assert version.startswith("TLS") and cipher


def test_a_wrong_ca_is_refused_with_a_clear_message(server: PrivateMariaDB) -> None:
    with pytest.raises(DownstreamConnectError) as err:
        _session_cipher(_flags(server, downstream_ssl_ca=str(server.certs / "other-ca.pem")))
    msg = str(err.value)
    assert msg.startswith("TLS: the certificate of the downstream database at mysql://applier")
    assert "certificate verify failed" in msg or "self-signed certificate in certificate chain" in msg
    assert "check downstream_ssl_ca" in msg and "ssl_mode=verify_ca" in msg


def test_a_certificate_for_another_name_fails_verify_identity_only(server: PrivateMariaDB) -> None:
    ca = str(server.certs / "ca.pem")
    with pytest.raises(DownstreamConnectError) as err:
        _session_cipher(
            _flags(server, host="localhost", downstream_ssl_ca=ca, downstream_ssl_mode="verify_identity")
        )
    assert "Hostname mismatch" in str(err.value) and "names the host" in str(err.value)
    # verify_ca checks the chain, not the name: the same connection is accepted.
    assert _session_cipher(_flags(server, host="localhost", downstream_ssl_ca=ca))[1]


def test_client_certificate_and_key(server: PrivateMariaDB) -> None:
    certs = server.certs
    with_cert = _flags(
        server,
        user="certuser",
        downstream_ssl_ca=str(certs / "ca.pem"),
        downstream_ssl_cert=str(certs / "client.pem"),
        downstream_ssl_key=str(certs / "client.key"),
    )
    assert _session_cipher(with_cert, password=None)[1]
    without = _flags(server, user="certuser", downstream_ssl_ca=str(certs / "ca.pem"))
    with pytest.raises(DownstreamConnectError, match="refused the login"):
        _session_cipher(without, password=None)


def test_the_daemon_applies_a_stream_over_tls_and_status_reads_it(
    server: PrivateMariaDB, broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPLIER_DOWNSTREAM_PASSWORD", PASSWORD)
    topic = f"cdc_{uuid.uuid4().hex[:10]}"
    url = f"mysql://applier@127.0.0.1:{server.port}/"
    cf = Changefeed(broker.bootstrap, topic, url, {"unix_socket": server.socket, "user": "root"})
    ca = str(server.certs / "ca.pem")
    tls = ["--downstream-ssl-ca", ca, "--downstream-ssl-verify-identity"]
    cf.extra_args += ["--http-listen", "off", *tls]
    sim = simulate(StreamConfig(seed=51, partitions=2, transactions=50, schema=cf.new_schema()))
    produce_simulation(broker.bootstrap, topic, sim)
    done = cf.run_to_end()
    assert done.returncode == 0, done.stderr
    assert cf.checkpoint()[0] == sim.final_resolved_ts
    assert cf.compare(sim, sim.final_resolved_ts) == []

    status = [sys.executable, "-m", "applier", "status", "--downstream", url, "--group-id", cf.group_id]
    status += ["--checkpoint-schema", cf.checkpoint_schema, "--json"]
    out = subprocess.run([*status, *tls], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["resolved_ts"] == sim.final_resolved_ts

    # The daemon and status refuse a wrong CA with the same clear message, exit non-zero, no traceback.
    wrong = ["--downstream-ssl-ca", str(server.certs / "other-ca.pem")]
    out = subprocess.run([*status, *wrong], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "TLS: the certificate of the downstream database" in out.stderr
    cf.extra_args = ["--http-listen", "off", *wrong]
    done = cf.run_to_end(timeout=60)
    assert done.returncode == 2  # a configuration error: restarting cannot fix it
    assert "TLS: the certificate of the downstream database" in done.stderr
    assert "Traceback" not in done.stderr
    # Without TLS the server refuses the session outright (require_secure_transport).
    cf.extra_args = ["--http-listen", "off", "--downstream-ssl-mode", "disabled"]
    done = cf.run_to_end(timeout=60)
    assert done.returncode == 2 and "refused" in done.stderr.lower(), done.stderr
    cf.drop()

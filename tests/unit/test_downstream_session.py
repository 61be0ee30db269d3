"""TLS settings of the session module (no database: the test server offers no TLS)."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pymysql
import pytest

from applier.downstream.errors import DownstreamConnectError
from applier.downstream.session import tls_kwargs
from applier.downstream.url import DownstreamConfig, Secret


@pytest.fixture(scope="module")
def cert_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A throwaway self-signed certificate and key, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=db.test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_disabled_and_preferred() -> None:
    assert tls_kwargs(DownstreamConfig(ssl_mode="disabled")) == {"ssl_disabled": True}
    assert tls_kwargs(DownstreamConfig(ssl_mode="preferred")) == {}


@pytest.mark.parametrize(
    ("mode", "verify", "hostname"),
    [
        ("required", ssl.CERT_NONE, False),
        ("verify_ca", ssl.CERT_REQUIRED, False),
        ("verify_identity", ssl.CERT_REQUIRED, True),
    ],
)
def test_modes_build_the_intended_context(
    cert_files, mode: str, verify: ssl.VerifyMode, hostname: bool
) -> None:
    cert, key = cert_files
    cfg = DownstreamConfig(ssl_mode=mode, ssl_ca=str(cert), ssl_cert=str(cert), ssl_key=str(key))
    ctx = tls_kwargs(cfg)["ssl"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == verify and ctx.check_hostname is hostname
    if mode != "required":
        assert len(ctx.get_ca_certs()) == 1  # verifies against the given CA
    # PyMySQL takes the context as is and makes TLS mandatory (defer_connect: no network I/O).
    conn = pymysql.connect(host="127.0.0.1", defer_connect=True, **tls_kwargs(cfg))
    assert conn.ssl and conn._ssl_required and conn.ctx.check_hostname is hostname


def test_verify_identity_without_ca_uses_system_store_and_checks_host() -> None:
    ctx = tls_kwargs(DownstreamConfig(ssl_mode="verify_identity"))["ssl"]
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED


def test_unloadable_files_are_a_clear_permanent_error(tmp_path) -> None:
    cfg = DownstreamConfig(
        ssl_mode="verify_ca", ssl_ca=str(tmp_path / "missing.pem"), password=Secret("pw-XYZ")
    )
    with pytest.raises(DownstreamConnectError, match="cannot load the TLS files") as ei:
        tls_kwargs(cfg)
    assert "missing.pem" in str(ei.value) and "pw-XYZ" not in str(ei.value)

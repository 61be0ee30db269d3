"""applier.settings.downstream: the TLS and password settings as they map onto the downstream
configuration, and the contradictions that are refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.downstream.url import DownstreamConfigError
from applier.settings.downstream import downstream_config, password_source
from applier.settings.schema import resolve


def _ds(tmp_path: Path, env: dict | None = None, **flags: object):
    cfg = resolve("status", {"group_id": "g", "downstream": "mysql://app@db:3306/", **flags}, environ={})
    return downstream_config(cfg, env=env or {})


def _pem(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(path)


def test_tls_settings_map_to_the_downstream_config(tmp_path: Path) -> None:
    ca = _pem(tmp_path, "ca.pem")
    assert _ds(tmp_path).ssl_mode == "preferred"
    ds = _ds(tmp_path, downstream_ssl_ca=ca)
    assert (ds.ssl_mode, ds.ssl_ca) == ("verify_ca", ca)  # a CA means "verify", as in the MySQL client
    assert (
        _ds(tmp_path, downstream_ssl_ca=ca, downstream_ssl_verify_identity=True).ssl_mode == "verify_identity"
    )
    assert _ds(tmp_path, downstream_ssl_mode="required").ssl_mode == "required"
    ds = _ds(
        tmp_path,
        downstream_ssl_ca=ca,
        downstream_ssl_cert=_pem(tmp_path, "c.pem"),
        downstream_ssl_key=_pem(tmp_path, "k.pem"),
    )
    assert ds.ssl_cert and ds.ssl_key and ds.ssl_mode == "verify_ca"
    assert "ssl_cert=" in ds.redacted()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"downstream_ssl_mode": "required", "downstream_ssl_verify_identity": True}, "contradicts"),
        ({"downstream_ssl_mode": "verify_ca"}, "verify_ca needs ssl_ca"),
        ({"downstream_ssl_key": "KEY"}, "downstream_ssl_key is set without downstream_ssl_cert"),
    ],
)
def test_contradicting_tls_settings_are_refused(tmp_path: Path, flags: dict, message: str) -> None:
    flags = {k: (_pem(tmp_path, "k.pem") if v == "KEY" else v) for k, v in flags.items()}
    with pytest.raises(DownstreamConfigError, match=message):
        _ds(tmp_path, **flags)


def test_password_from_a_file_or_the_environment(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    ds = _ds(tmp_path, downstream_password_file=str(secret))
    assert ds.password.reveal() == "from-file" and "from-file" not in repr(ds) + str(ds)
    ds = _ds(tmp_path, env={"APPLIER_DOWNSTREAM_PASSWORD": "from-env"})
    assert ds.password.reveal() == "from-env"
    cfg = resolve("status", {"group_id": "g", "downstream": "mysql://app@db/"}, environ={})
    assert password_source(cfg, ds, env={"APPLIER_DOWNSTREAM_PASSWORD": "x"}) == (
        "*** (variable APPLIER_DOWNSTREAM_PASSWORD)"
    )
    with pytest.raises(DownstreamConfigError, match="password in the URL and downstream_password_file"):
        cfg = resolve(
            "status",
            {"group_id": "g", "downstream": "mysql://app:pw@db/", "downstream_password_file": str(secret)},
            environ={},
        )
        downstream_config(cfg, env={})
    with pytest.raises(DownstreamConfigError, match="cannot read password file"):
        _ds(tmp_path, downstream_password_file=str(tmp_path / "missing"))

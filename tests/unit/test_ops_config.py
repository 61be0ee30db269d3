"""Configuration: unknown keys and bad values are refused by name; TLS and password settings map correctly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier import cli
from applier.downstream.url import DownstreamConfigError
from applier.settings.downstream import downstream_config, password_source
from applier.settings.schema import ConfigError, resolve

BASE = {"kafka_bootstrap": "k:9092", "topic": "t", "group_id": "g", "downstream": "mysql://app@db:3306/"}


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "applier.toml"
    path.write_text(text)
    return str(path)


def test_unknown_key_in_the_file_is_named_with_the_accepted_keys(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'topic = "t"\nhttp_listn = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError) as err:
        resolve("run", {"config": path}, environ={})
    msg = str(err.value)
    assert "unknown key 'http_listn'" in msg and "http_listen" in msg and "stall_seconds" in msg


def test_unknown_table_in_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[database]\nhost = 'x'\n")
    with pytest.raises(ConfigError, match=r"unknown table \[database\] \(only \[kafka\] is accepted\)"):
        resolve("run", {"config": path}, environ={})


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("http_listen", "localhost", "http_listen .*expected HOST:PORT \\(port 0-65535\\) or off"),
        ("http_listen", "::1:9400", "http_listen .*IPv6 host must be in brackets"),
        ("http_listen", "127.0.0.1:70000", "http_listen .*expected HOST:PORT"),
        ("stall_seconds", "-5", "stall_seconds .*must be a positive integer"),
        ("stall_seconds", "soon", "stall_seconds .*expected a positive integer"),
        (
            "downstream_ssl_mode",
            "sometimes",
            "downstream_ssl_mode .*not one of disabled, preferred, required",
        ),
        ("downstream_ssl_ca", "/nonexistent/ca.pem", "downstream_ssl_ca .*cannot read /nonexistent/ca.pem"),
        (
            "downstream_ssl_verify_identity",
            "maybe",
            "downstream_ssl_verify_identity .*expected true or false",
        ),
        ("compression", "zstd", "compression .*not one of none, snappy, lz4"),
        ("max_cached_bytes", "lots", "max_cached_bytes .*optionally with K, M or G"),
        ("start", "middle", "start .*not one of earliest, latest"),
        ("log_level", "loud", "log_level .*not one of debug, info, warning, error"),
    ],
)
def test_bad_values_name_the_key_and_what_is_accepted(
    key: str, raw: str, expected: str, tmp_path: Path
) -> None:
    # As a flag...
    with pytest.raises(ConfigError, match=expected):
        resolve("run", {**BASE, key: raw}, environ={})
    # ...as a variable (the message names the variable)...
    with pytest.raises(ConfigError, match=expected) as err:
        resolve("run", BASE, environ={"APPLIER_" + key.upper(): raw})
    assert f"variable APPLIER_{key.upper()}" in str(err.value)
    # ...and in the file.
    path = _toml(tmp_path, f"{key} = {json.dumps(raw)}\n")
    with pytest.raises(ConfigError, match=expected):
        resolve("run", {**BASE, "config": path}, environ={})


def test_good_values_are_normalised(tmp_path: Path) -> None:
    assert resolve("run", {**BASE, "http_listen": "OFF"}, environ={}).http_listen == "off"
    assert resolve("run", {**BASE, "http_listen": "[::1]:9400"}, environ={}).http_listen == "[::1]:9400"
    assert resolve("run", {**BASE, "http_listen": ":9400"}, environ={}).http_listen == ":9400"
    path = _toml(tmp_path, "stall_seconds = 42\ndownstream_ssl_verify_identity = true\n")
    cfg = resolve("run", {**BASE, "config": path}, environ={})
    assert cfg.stall_seconds == 42 and cfg.downstream_ssl_verify_identity is True
    assert cfg.sources["stall_seconds"] == "file"
    defaults = resolve("run", BASE, environ={})
    assert defaults.http_listen == "127.0.0.1:9400" and defaults.stall_seconds == 300


def test_kafka_pass_through_merges_file_and_variable_key_by_key(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.username" = "u"\n')
    cfg = resolve(
        "run", {**BASE, "config": path}, environ={"APPLIER_KAFKA_CONFIG": "sasl.password=pw,sasl.username=v"}
    )
    assert cfg.kafka_config == {"security.protocol": "SASL_SSL", "sasl.username": "v", "sasl.password": "pw"}
    assert cfg.masked()["kafka_config"]["sasl.password"] == "***"


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


def test_config_check_prints_the_effective_config_with_secrets_masked(tmp_path: Path, capsys) -> None:
    code = cli.main(
        [
            "config",
            "check",
            "--kafka-bootstrap",
            "k:9092",
            "--topic",
            "t",
            "--group-id",
            "g",
            "--downstream",
            "mysql://app:Top-Secret-1@db:3306/",
            "--kafka-config",
            "sasl.password=Top-Secret-2",
            "--http-listen",
            "off",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert "Top-Secret" not in out.out + out.err
    assert doc["effective"]["downstream"] == "mysql://app:***@db:3306/"
    assert doc["effective"]["http_listen"] == "off" and doc["sources"]["http_listen"] == "flag"
    assert doc["downstream_password"].startswith("*** (in the downstream URL")


def test_config_check_and_run_refuse_bad_settings_with_exit_2(tmp_path: Path, capsys) -> None:
    path = _toml(tmp_path, 'kafka_bootstrap = "k:1"\ntopic = "t"\ngroup_id = "g"\nbogus = 1\n')
    for command in (["config", "check"], ["run"]):
        code = cli.main([*command, "--config", path, "--downstream", "mysql://a@b/"])
        err = capsys.readouterr().err
        assert code == 2
        assert err.startswith("applier: configuration error:") and "unknown key 'bogus'" in err

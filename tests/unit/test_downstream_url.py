"""Downstream URL parsing, password sources and redaction (no database needed)."""

from __future__ import annotations

import pickle

import pytest

from applier.downstream.url import (
    DEFAULT_TIME_ZONE,
    ENV_PASSWORD,
    ENV_PASSWORD_FILE,
    DownstreamConfig,
    DownstreamConfigError,
    Secret,
    parse_downstream_url,
    redact_url_text,
)

PW = "hunter2-Sup3rSecret"


def test_defaults() -> None:
    cfg = parse_downstream_url("mysql://db.internal/", env={})
    assert (cfg.host, cfg.port, cfg.user, cfg.password.reveal()) == ("db.internal", 3306, "root", "")
    assert cfg.time_zone == DEFAULT_TIME_ZONE == "+00:00"
    assert cfg.ssl_mode == "preferred"
    assert cfg.read_timeout == 300.0 and cfg.write_timeout == 60.0 and cfg.connect_timeout == 10.0


def test_percent_decoding_and_options() -> None:
    cfg = parse_downstream_url(
        "mysql://us%40er:p%40ss%3Aw%2Fd%20x@db.example:3307/?time_zone=+08:00&ssl_ca=/etc/ca%20dir/ca.pem",
        env={},
    )
    assert cfg.user == "us@er"
    assert cfg.password.reveal() == "p@ss:w/d x"
    assert cfg.port == 3307
    assert cfg.time_zone == "+08:00"  # '+' is literal, not a space
    assert cfg.ssl_ca == "/etc/ca dir/ca.pem"
    assert cfg.ssl_mode == "verify_ca"  # ssl_ca alone means: verify against it


def test_raw_at_sign_in_password_belongs_to_the_password() -> None:
    cfg = parse_downstream_url("mysql://u:p@ss@h:1/", env={})
    assert (cfg.user, cfg.password.reveal(), cfg.host, cfg.port) == ("u", "p@ss", "h", 1)


def test_empty_url_password_is_an_explicit_empty_password() -> None:
    cfg = parse_downstream_url("mysql://u:@h/", env={ENV_PASSWORD: "from-env"})
    assert cfg.password.reveal() == ""


def test_password_from_env_when_url_has_none() -> None:
    cfg = parse_downstream_url("mysql://u@h/", env={ENV_PASSWORD: PW})
    assert cfg.password.reveal() == PW
    assert parse_downstream_url("mysql://u:inurl@h/", env={ENV_PASSWORD: PW}).password.reveal() == "inurl"


def test_password_file_option_strips_one_newline_only(tmp_path) -> None:
    f = tmp_path / "pw"
    f.write_text(f" {PW} \n\n")
    cfg = parse_downstream_url(f"mysql://u@h/?password_file={f}", env={ENV_PASSWORD: "ignored"})
    assert cfg.password.reveal() == f" {PW} \n"
    assert cfg.password_file == str(f)
    f.write_bytes(PW.encode() + b"\r\n")
    assert parse_downstream_url(f"mysql://u@h/?password_file={f}", env={}).password.reveal() == PW


def test_password_file_from_env(tmp_path) -> None:
    f = tmp_path / "pw"
    f.write_text(PW)
    cfg = parse_downstream_url("mysql://u@h/", env={ENV_PASSWORD_FILE: str(f)})
    assert cfg.password.reveal() == PW
    # The env password is preferred over the env password file.
    assert (
        parse_downstream_url(
            "mysql://u@h/", env={ENV_PASSWORD_FILE: str(f), ENV_PASSWORD: "x"}
        ).password.reveal()
        == "x"
    )


def test_url_password_and_password_file_is_ambiguous(tmp_path) -> None:
    f = tmp_path / "pw"
    f.write_text("other")
    with pytest.raises(DownstreamConfigError, match="both a password and password_file") as ei:
        parse_downstream_url(f"mysql://u:{PW}@h/?password_file={f}", env={})
    assert PW not in str(ei.value)


def test_unreadable_password_file_names_the_file(tmp_path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(DownstreamConfigError, match="cannot read password file") as ei:
        parse_downstream_url(f"mysql://u@h/?password_file={missing}", env={})
    assert str(missing) in str(ei.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"mysql://u:{PW}@h/somedb", "names a database"),
        (f"mysql://u:{PW}@h:99999/", "port"),
        (f"mysql://u:{PW}@h:abc/", "invalid port"),
        (f"postgres://u:{PW}@h/", "must start with mysql://"),
        (f"mysql://u:{PW}@h/?bogus=1", "unknown option 'bogus'"),
        (f"mysql://u:{PW}@h/?time_zone=+01:00&time_zone=+02:00", "given twice"),
        (f"mysql://u:{PW}@h/?ssl_mode=sometimes", "ssl_mode must be one of"),
        (f"mysql://u:{PW}@h/?ssl_mode=verify_ca", "needs ssl_ca"),
        (f"mysql://u:{PW}@h/?connect_timeout=soon", "connect_timeout"),
        (f"mysql://u:{PW}@h/?ssl_verify_identity=maybe", "true or false"),
        (f"mysql://u:{PW}@/", "no host"),
        (f"mysql://u:{PW}/x@h/", "malformed URL|invalid port|names a database|no host"),
    ],
)
def test_errors_never_contain_the_password(url: str, message: str) -> None:
    with pytest.raises(DownstreamConfigError, match=message) as ei:
        parse_downstream_url(url, env={})
    assert PW not in str(ei.value)


def test_timeouts() -> None:
    cfg = parse_downstream_url("mysql://h/?connect_timeout=2.5&read_timeout=30&write_timeout=none", env={})
    assert (cfg.connect_timeout, cfg.read_timeout, cfg.write_timeout) == (2.5, 30.0, None)
    assert parse_downstream_url("mysql://h/?read_timeout=0", env={}).read_timeout is None


def test_tls_modes() -> None:
    assert parse_downstream_url("mysql://h/?ssl_verify_identity=true", env={}).ssl_mode == "verify_identity"
    assert parse_downstream_url("mysql://h/?ssl_verify_identity=true", env={}).ssl_verify_identity
    assert parse_downstream_url("mysql://h/?ssl_mode=REQUIRED", env={}).ssl_mode == "required"
    assert parse_downstream_url("mysql://h/?ssl_mode=disabled", env={}).ssl_mode == "disabled"
    with pytest.raises(DownstreamConfigError, match="contradicts"):
        parse_downstream_url("mysql://h/?ssl_mode=required&ssl_verify_identity=1", env={})


def test_redacted_url() -> None:
    cfg = parse_downstream_url(f"mysql://app%3Auser:{PW}@db:3307/?time_zone=-05:00&ssl_mode=required", env={})
    red = cfg.redacted()
    assert PW not in red
    assert red == "mysql://app%3Auser:***@db:3307/?time_zone=-05:00&ssl_mode=required"
    assert str(cfg) == red
    assert parse_downstream_url("mysql://h/", env={}).redacted() == "mysql://root@h:3306/"
    v6 = parse_downstream_url("mysql://u@[::1]:3306/", env={})
    assert v6.host == "::1" and v6.redacted() == "mysql://u@[::1]:3306/"
    # A password that came from the environment is also shown masked.
    assert parse_downstream_url("mysql://h/", env={ENV_PASSWORD: PW}).redacted() == "mysql://root:***@h:3306/"


def test_secret_never_prints() -> None:
    s = Secret(PW)
    assert repr(s) == str(s) == f"{s}" == f"{s!r}" == format(s) == "***"
    assert s.reveal() == PW and s == Secret(PW) and s != Secret("x") and bool(s) and not Secret("")
    cfg = DownstreamConfig(host="h", password=s)
    for text in (repr(cfg), str(cfg), f"{cfg}", repr([cfg]), repr({"c": cfg})):
        assert PW not in text
    copy = pickle.loads(pickle.dumps(cfg))  # workers may need the config
    assert copy == cfg and copy.password.reveal() == PW and PW not in repr(copy)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("mysql://u:pw@h:1/", "mysql://u:***@h:1/"),
        ("mysql://u:p@w/x?#@h:1/", "mysql://u:***@h:1/"),
        ("mysql://u@h:1/", "mysql://u@h:1/"),
        ("mysql://h:1/", "mysql://h:1/"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url_text(raw: str, expected: str) -> None:
    assert redact_url_text(raw) == expected

"""applier.settings.schema: where each setting comes from (flag, variable, file, default), and refusals of
unknown keys and bad values that name the key and what is accepted, whichever the source.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from applier.settings.schema import ConfigError, resolve
from tests.unit.settings_files import BASE, BASE_WITH_SECRET, toml_file


def test_precedence_flag_over_env_over_file_over_default(tmp_path) -> None:
    cfg_file = tmp_path / "a.toml"
    cfg_file.write_text('topic = "from-file"\nmax_txn_rows = 7\nstart = "latest"\n[kafka]\n"a.b" = "1"\n')
    flags = {**BASE_WITH_SECRET, "topic": None, "config": str(cfg_file), "start": "earliest"}
    env = {"APPLIER_TOPIC": "from-env", "APPLIER_MAX_TXN_ROWS": "9"}
    cfg = resolve("run", flags, env)
    assert cfg.topic == "from-env" and cfg.sources["topic"] == "environment"
    assert cfg.max_txn_rows == 9
    assert cfg.start == "earliest" and cfg.sources["start"] == "flag"
    assert cfg.kafka_config == {"a.b": "1"}
    assert cfg.time_zone == "+00:00" and cfg.sources["time_zone"] == "default"


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({**BASE_WITH_SECRET, "start": "middle"}, {}, "start"),
        ({**BASE_WITH_SECRET, "max_txn_rows": "-1"}, {}, "max_txn_rows"),
        ({**BASE_WITH_SECRET}, {"APPLIER_MAX_CACHED_BYTES": "lots"}, "APPLIER_MAX_CACHED_BYTES"),
        ({**BASE_WITH_SECRET, "topic": None}, {}, "topic is required"),
        ({**BASE_WITH_SECRET, "compression": "zstd"}, {}, "none, snappy, lz4"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(flags, env, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve("run", flags, env)


def test_unknown_file_keys_are_rejected(tmp_path) -> None:
    cfg_file = tmp_path / "a.toml"
    cfg_file.write_text('topicc = "x"\n')
    with pytest.raises(ConfigError, match="unknown key 'topicc'"):
        resolve("run", {**BASE_WITH_SECRET, "config": str(cfg_file)}, {})


def test_unknown_key_in_the_file_is_named_with_the_accepted_keys(tmp_path: Path) -> None:
    path = toml_file(tmp_path, 'topic = "t"\nhttp_listn = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError) as err:
        resolve("run", {"config": path}, environ={})
    msg = str(err.value)
    assert "unknown key 'http_listn'" in msg and "http_listen" in msg and "stall_seconds" in msg


def test_unknown_table_in_the_file(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "[database]\nhost = 'x'\n")
    with pytest.raises(
        ConfigError, match=r"unknown table \[database\] \(only \[kafka\] and \[route\] are accepted\)"
    ):
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
    path = toml_file(tmp_path, f"{key} = {json.dumps(raw)}\n")
    with pytest.raises(ConfigError, match=expected):
        resolve("run", {**BASE, "config": path}, environ={})


def test_good_values_are_normalised(tmp_path: Path) -> None:
    assert resolve("run", {**BASE, "http_listen": "OFF"}, environ={}).http_listen == "off"
    assert resolve("run", {**BASE, "http_listen": "[::1]:9400"}, environ={}).http_listen == "[::1]:9400"
    assert resolve("run", {**BASE, "http_listen": ":9400"}, environ={}).http_listen == ":9400"
    path = toml_file(tmp_path, "stall_seconds = 42\ndownstream_ssl_verify_identity = true\n")
    cfg = resolve("run", {**BASE, "config": path}, environ={})
    assert cfg.stall_seconds == 42 and cfg.downstream_ssl_verify_identity is True
    assert cfg.sources["stall_seconds"] == "file"
    defaults = resolve("run", BASE, environ={})
    assert defaults.http_listen == "127.0.0.1:9400" and defaults.stall_seconds == 300


def test_kafka_pass_through_merges_file_and_variable_key_by_key(tmp_path: Path) -> None:
    path = toml_file(tmp_path, '[kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.username" = "u"\n')
    cfg = resolve(
        "run", {**BASE, "config": path}, environ={"APPLIER_KAFKA_CONFIG": "sasl.password=pw,sasl.username=v"}
    )
    assert cfg.kafka_config == {"security.protocol": "SASL_SSL", "sasl.username": "v", "sasl.password": "pw"}
    assert cfg.masked()["kafka_config"]["sasl.password"] == "***"


def test_filter_rules_from_the_file_the_flag_or_the_variable(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "filter = ['shop.*', '!shop.audit_*']\n")
    cfg = resolve("catchup", {**BASE, "from_ts": "1", "config": path}, environ={})
    assert cfg.filter == ("shop.*", "!shop.audit_*") and cfg.sources["filter"] == "file"
    assert not cfg.table_filter().matches_table("shop", "AUDIT_log")
    # a repeated flag wins over the variable and the file
    flags = {**BASE, "config": path, "filter": ["a.*", "!a.b"]}
    cfg = resolve("run", flags, environ={"APPLIER_FILTER": "x.*"})
    assert cfg.filter == ("a.*", "!a.b") and cfg.sources["filter"] == "flag"
    # the variable: comma-separated, or one rule per line when it holds a newline
    cfg = resolve("run", {**BASE, "config": path}, environ={"APPLIER_FILTER": " a.* , !a.b "})
    assert cfg.filter == ("a.*", "!a.b") and cfg.sources["filter"] == "environment"
    cfg = resolve("run", BASE, environ={"APPLIER_FILTER": "/^db\\d{1,2}$/.*\n!db1.x\n"})
    assert cfg.filter == ("/^db\\d{1,2}$/.*", "!db1.x")
    # default: every table
    cfg = resolve("run", BASE, environ={})
    assert cfg.filter == () and not cfg.table_filter().active


def test_an_invalid_filter_rule_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"filter \(flag --filter\).*rule 'db\.\[a-'"):
        resolve("run", {**BASE, "filter": ["*.*", "db.[a-"]}, environ={})
    with pytest.raises(ConfigError, match=r"variable APPLIER_FILTER.*rule 'db-1\.t'"):
        resolve("run", BASE, environ={"APPLIER_FILTER": "*.*,db-1.t"})
    path = toml_file(tmp_path, "filter = [1, 2]\n")
    with pytest.raises(ConfigError, match="list of rules"):
        resolve("run", {**BASE, "config": path}, environ={})


# -- route rules (sqlgen.route) ----------------------------------------------------------------------

ROUTES = ["prod.*=replica.{table}", "db.tbl=db2.tbl2"]


@pytest.mark.parametrize(
    "text",
    [
        'route = ["prod.*=replica.{table}", "db.tbl=db2.tbl2"]\n',
        '[route]\n"prod.*" = "replica.{table}"\n"db.tbl" = "db2.tbl2"\n',
        '[[route]]\nfrom = "prod.*"\nto = "replica.{table}"\n[[route]]\nfrom = "db.tbl"\nto = "db2.tbl2"\n',
    ],
    ids=["list", "table", "array-of-tables"],
)
def test_routes_from_the_file_keep_their_order(tmp_path: Path, text: str) -> None:
    cfg = resolve("run", {**BASE, "config": toml_file(tmp_path, text)}, {})
    assert cfg.route == ROUTES and cfg.sources["route"] == "file"
    assert cfg.router().table("prod", "t") == ("replica", "t")


def test_routes_from_the_flag_and_the_variable() -> None:
    cfg = resolve("catchup", {**BASE, "from_ts": "1", "route": ROUTES}, {})
    assert cfg.route == ROUTES and cfg.sources["route"] == "flag"
    env = {"APPLIER_ROUTE": "prod.*=replica.{table}, db.tbl=db2.tbl2"}
    cfg = resolve("run", dict(BASE), env)
    assert cfg.route == ROUTES and cfg.sources["route"] == "environment"
    assert resolve("run", dict(BASE), {}).router().describe() == []


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        ({**BASE, "route": ["prod.*=replica.{tbl}"]}, {}),
        (dict(BASE), {"APPLIER_ROUTE": "prod.*=replica.{tbl}"}),
    ],
)
def test_an_invalid_route_is_a_configuration_error_naming_it(flags, env) -> None:
    with pytest.raises(ConfigError, match=r"route .*'prod\.\*=replica\.\{tbl\}'.*unknown placeholder"):
        resolve("run", flags, env)


def test_from_ts_is_optional_for_run_and_required_for_catchup(tmp_path: Path) -> None:
    cfg = resolve("run", {**BASE_WITH_SECRET}, {})
    assert cfg.from_ts is None and cfg.sources["from_ts"] == "default"
    with pytest.raises(ConfigError, match="from_ts is required"):
        resolve("catchup", {**BASE_WITH_SECRET}, {})
    # One file for both commands: the catch-up's from_ts reaches the daemon too (applier.apply.handoff).
    shared = toml_file(tmp_path, 'from_ts = "2024-05-01T10:00:00Z"\n')
    flags = {**BASE_WITH_SECRET, "config": str(shared)}
    assert resolve("run", flags, {}).from_ts == resolve("catchup", flags, {}).from_ts == 1714557600000 << 18
    env = resolve("run", {**BASE_WITH_SECRET}, {"APPLIER_FROM_TS": "449999999999999999"})
    assert env.from_ts == 449999999999999999 and env.sources["from_ts"] == "environment"
    with pytest.raises(ConfigError, match=re.escape("from_ts (flag --from-ts): bad value 'yesterday'")):
        resolve("run", {**BASE_WITH_SECRET, "from_ts": "yesterday"}, {})


def test_from_ts_with_start_latest_is_refused() -> None:
    with pytest.raises(ConfigError, match="from_ts and start = latest contradict each other"):
        resolve("run", {**BASE_WITH_SECRET, "from_ts": "449999999999999999", "start": "latest"}, {})
    assert resolve("run", {**BASE_WITH_SECRET, "from_ts": "449999999999999999", "start": "earliest"}, {})


def test_row_mode_refuses_what_it_cannot_combine_with() -> None:
    assert resolve("run", {**BASE_WITH_SECRET}, {"APPLIER_CONSISTENCY": "row"}).consistency == "row"
    assert resolve("run", {**BASE_WITH_SECRET}, {}).consistency == "transaction"
    with pytest.raises(ConfigError, match="consistency = row and ddl_blocking = tables cannot be combined"):
        resolve("run", {**BASE_WITH_SECRET, "consistency": "row", "ddl_blocking": "tables"}, {})
    with pytest.raises(ConfigError, match="apply_workers adds sessions to the transaction mode only"):
        resolve("run", {**BASE_WITH_SECRET, "consistency": "row", "apply_workers": "2"}, {})
    with pytest.raises(ConfigError, match="'rows' is not one of transaction, row"):
        resolve("run", {**BASE_WITH_SECRET, "consistency": "rows"}, {})


def test_config_has_one_typed_attribute_per_setting() -> None:
    from applier.settings.config import _Value
    from applier.settings.schema import SETTINGS, Config

    attributes = {name for name, value in vars(Config).items() if isinstance(value, _Value)}
    assert attributes == {s.name for s in SETTINGS}
    cfg = Config({"apply_workers": 3})
    assert cfg.apply_workers == 3
    with pytest.raises(AttributeError):
        cfg.until  # noqa: B018 - a setting the command does not have

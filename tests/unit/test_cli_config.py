"""The command line and the configuration schema: precedence, validation, secrets, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from applier.cli import main
from applier.settings.schema import ConfigError, resolve

BASE = {"kafka_bootstrap": "k:9092", "topic": "t", "group_id": "g", "downstream": "mysql://u:s3cret@db:3306/"}


def test_import_applier_never_imports_pyspark() -> None:
    code = "import applier, applier.cli, applier.daemon.loop, sys; assert 'pyspark' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_precedence_flag_over_env_over_file_over_default(tmp_path) -> None:
    cfg_file = tmp_path / "a.toml"
    cfg_file.write_text('topic = "from-file"\nmax_txn_rows = 7\nstart = "latest"\n[kafka]\n"a.b" = "1"\n')
    flags = {**BASE, "topic": None, "config": str(cfg_file), "start": "earliest"}
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
        ({**BASE, "start": "middle"}, {}, "start"),
        ({**BASE, "max_txn_rows": "-1"}, {}, "max_txn_rows"),
        ({**BASE}, {"APPLIER_MAX_CACHED_BYTES": "lots"}, "APPLIER_MAX_CACHED_BYTES"),
        ({**BASE, "topic": None}, {}, "topic is required"),
        ({**BASE, "compression": "zstd"}, {}, "none, snappy, lz4"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(flags, env, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve("run", flags, env)


def test_unknown_file_keys_are_rejected(tmp_path) -> None:
    cfg_file = tmp_path / "a.toml"
    cfg_file.write_text('topicc = "x"\n')
    with pytest.raises(ConfigError, match="unknown key 'topicc'"):
        resolve("run", {**BASE, "config": str(cfg_file)}, {})


def test_config_check_masks_secrets(capsys) -> None:
    code = main(
        [
            "config",
            "check",
            "--kafka-bootstrap",
            "k:1",
            "--topic",
            "t",
            "--group-id",
            "g",
            "--downstream",
            "mysql://u:s3cret@db:3306/",
            "--kafka-config",
            "sasl.password=hunter2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "s3cret" not in out and "hunter2" not in out
    assert "mysql://u:***@db:3306/" in out


def test_version_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "applier", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("applier ")
    out = subprocess.run(
        [sys.executable, "-m", "applier", "--help"], capture_output=True, text=True, check=True
    )
    assert "run" in out.stdout and "demo" in out.stdout


def test_demo_without_a_database_says_so_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "applier", "demo", "--downstream", "mysql://root:pw@127.0.0.1:1/"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "mysql://root:***@127.0.0.1:1/" in proc.stderr
    assert "APPLIER_DOWNSTREAM" in proc.stderr
    assert ":pw@" not in proc.stderr + proc.stdout


def test_simulate_options_reach_the_stream_config() -> None:
    from applier.cli import _build_parser
    from applier.commands.demo import _stream_config

    args = _build_parser().parse_args(
        [
            "simulate",
            "--architecture",
            "new",
            "--partitioned",
            "--late-first-copies",
            "--ddl-lag",
            "--no-replays",
        ]
    )
    cfg = _stream_config(args)
    assert (
        cfg.architecture,
        cfg.row_ids,
        cfg.partitioned,
        cfg.late_first_copies,
        cfg.ddl_lag,
        cfg.replays,
    ) == (
        "new",
        None,
        True,
        True,
        True,
        False,
    )
    assert not cfg.sends_row_ids
    classic = _stream_config(_build_parser().parse_args(["simulate", "--row-ids", "off"]))
    assert classic.architecture == "classic" and classic.row_ids is False
    assert not (classic.partitioned or classic.late_first_copies or classic.ddl_lag)


def test_simulate_rejects_rid_with_the_new_architecture_in_one_line(capsys) -> None:
    assert main(["simulate", "--architecture", "new", "--row-ids", "on", "--kafka-bootstrap", "k:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("applier: configuration error:") and "rid" in err and "Traceback" not in err

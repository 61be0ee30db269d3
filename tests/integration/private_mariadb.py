"""Throwaway MariaDB servers, for tests that need server settings the shared test server lacks.

The shared server cannot be reconfigured per test, so these tests start their own: the
``mariadb-install-db`` and ``mariadbd`` of the machine's MariaDB package, a temporary datadir and a
free loopback port (about two seconds to start; stop them with :meth:`PrivateMariaDB.stop`).

- :func:`start_private_mariadb`: TLS with ``require_secure_transport``, so that any TCP session
  without TLS is refused: a session that works is a session that was encrypted. Certificates are
  made with the ``openssl`` command: a CA, a server certificate for IP 127.0.0.1 only, a client
  certificate, and a second, unrelated CA that must be refused.
- :func:`start_plain_mariadb`: no TLS, any extra server options (``--max-allowed-packet=1M``),
  ``root`` without password over TCP too, so ``PrivateMariaDB.url`` works as a downstream URL.
  Options that shape the datadir (``innodb_data_file_path``, undo tablespaces) go to the install
  as well (``install=``).

:meth:`PrivateMariaDB.restart` stops a server (a crash or a clean shutdown) and starts it again on
the same datadir and port: what ``benchmarks/soak.py`` does to its downstream every ten minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pymysql

from applier.kafka.embedded_broker import free_port, stop_process


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name, cwd=cwd)


def _ca(prefix: str, cn: str, cwd: Path) -> None:
    _key(f"{prefix}.key", cwd)
    _openssl(
        "req", "-x509", "-new", "-key", f"{prefix}.key", "-out", f"{prefix}.pem", "-days", "2",
        "-subj", f"/CN={cn}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )  # fmt: skip


def _leaf(name: str, cn: str, ext: str, cwd: Path) -> None:
    _key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=cwd)
    (cwd / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


def make_certificates(directory: Path) -> None:
    """ca.pem, server.pem/.key (IP:127.0.0.1 only), client.pem/.key, and other-ca.pem."""
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", "applier test CA", directory)
    _ca("other-ca", "some other CA", directory)
    _leaf(
        "server",
        "127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        directory,
    )
    _leaf(
        "client",
        "applier-client",
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        directory,
    )


@dataclass
class PrivateMariaDB:
    """A running server; ``root()`` connects over its unix socket (allowed without TLS)."""

    base: Path
    port: int
    process: subprocess.Popen
    command: list[str]  # the server's command line, for restarts

    @property
    def socket(self) -> str:
        return str(self.base / "mysqld.sock")

    @property
    def certs(self) -> Path:
        return self.base / "certs"

    @property
    def params(self) -> dict:
        """pymysql connection parameters of ``root`` over the unix socket (no TLS needed there)."""
        return {"unix_socket": self.socket, "user": "root"}

    @property
    def url(self) -> str:
        """Downstream URL of ``root`` over TCP (only servers of :func:`start_plain_mariadb` accept it)."""
        return f"mysql://root@127.0.0.1:{self.port}/"

    def root(self) -> pymysql.connections.Connection:
        return pymysql.connect(**self.params, autocommit=True)

    def log(self) -> str:
        path = self.base / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        stop_process(self.process, timeout=30)
        shutil.rmtree(self.base, ignore_errors=True)

    def restart(self, *, crash: bool, down_seconds: float = 0.0) -> None:
        """Stop the server, SIGKILLed with ``crash`` (InnoDB recovers when it starts again) or shut
        down cleanly; after ``down_seconds``, start it on the same datadir and port and wait until
        it answers. Sessions open at the stop are gone, as after any server restart."""
        if crash:
            self.process.kill()
            self.process.wait(timeout=30)
        else:
            stop_process(self.process, timeout=60)
        time.sleep(down_seconds)
        self.process = _spawn(self.command)
        _wait_ready(self)


def _binary(name: str, *fallbacks: str) -> str:
    for candidate in (name, *fallbacks):
        found = shutil.which(candidate) or (candidate if os.path.exists(candidate) else None)
        if found:
            return found
    raise AssertionError(f"{name} not found: install the mariadb-server package (make services does)")


def start_private_mariadb(base: Path) -> PrivateMariaDB:
    """Install a datadir and start ``mariadbd`` with TLS on a free loopback port (fails, never skips)."""
    base.mkdir(parents=True, exist_ok=True)
    make_certificates(base / "certs")
    certs = base / "certs"
    return _start(
        base,
        [
            f"--ssl-ca={certs / 'ca.pem'}", f"--ssl-cert={certs / 'server.pem'}",
            f"--ssl-key={certs / 'server.key'}", "--require-secure-transport=ON",
        ],
    )  # fmt: skip


def start_plain_mariadb(base: Path, *options: str, install: tuple[str, ...] = ()) -> PrivateMariaDB:
    """Start ``mariadbd`` without TLS, with ``options`` added to its command line (fails, never skips).

    ``install``: options the datadir is created with too (InnoDB's data files, undo tablespaces).
    ``root`` gets a password-less account for 127.0.0.1 as well, for the daemon's TCP sessions.
    """
    # utf8mb4 as the distribution's configuration (skipped by --no-defaults) sets it on the shared server
    server = _start(base, ["--skip-ssl", "--character-set-server=utf8mb4", *options], install)
    try:
        conn = server.root()
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
                cur.execute("GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        finally:
            conn.close()
    except BaseException:
        server.stop()
        raise
    return server


def _start(base: Path, server_options: list[str], install_options: tuple[str, ...] = ()) -> PrivateMariaDB:
    """Install a datadir under ``base`` and start ``mariadbd`` on a free loopback port, ready."""
    base.mkdir(parents=True, exist_ok=True)
    datadir = base / "data"
    install = _binary("mariadb-install-db", "/usr/bin/mariadb-install-db", "mysql_install_db")
    mariadbd = _binary("mariadbd", "/usr/sbin/mariadbd", "/usr/sbin/mysqld")
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    # a tmpdir of its own: servers bootstrapped side by side (pytest-xdist workers) in the shared
    # /tmp collide on their internal temporary tables' names and the install fails
    tmpdir = base / "tmp"
    tmpdir.mkdir(exist_ok=True)
    installed = subprocess.run(
        [install, "--no-defaults", f"--datadir={datadir}", f"--tmpdir={tmpdir}", *as_root,
         "--auth-root-authentication-method=normal", "--skip-test-db", *install_options],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if installed.returncode != 0:
        output = installed.stdout + installed.stderr
        raise AssertionError(f"{install} failed (exit {installed.returncode}):\n{output}")
    port = free_port()
    command = [
        mariadbd, "--no-defaults", f"--datadir={datadir}", *as_root,
        f"--port={port}", "--bind-address=127.0.0.1", f"--socket={base / 'mysqld.sock'}",
        f"--pid-file={base / 'mysqld.pid'}", f"--log-error={base / 'error.log'}", f"--tmpdir={tmpdir}",
        "--innodb-buffer-pool-size=32M", "--skip-name-resolve", "--max-connections=50",
        *server_options,  # last: the caller's options win over the defaults above
    ]  # fmt: skip
    server = PrivateMariaDB(base, port, _spawn(command), command)
    try:
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server


def _spawn(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ready(server: PrivateMariaDB, timeout: float = 120) -> None:
    """Wait until the server answers (InnoDB's crash recovery included); fail when it exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.root().close()
            return
        except pymysql.err.OperationalError:
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"private MariaDB did not start:\n{server.log()[-3000:]}") from None
            time.sleep(0.2)

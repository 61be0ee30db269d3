"""A booted Debian under systemd-nspawn, for the test of the systemd unit (tests/deploy/test_systemd.py).

The root file system is made once by ``mmdebstrap`` from Debian's packages and kept in the cache
directory (a second run on the same machine boots in seconds); every test boots an overlay of it
(the kernel's overlayfs, the writes going to the test's scratch directory), so nothing a test
installs survives it, and no copy of 250 MB is made. The container shares the host's network (MariaDB and the
broker the test starts are at 127.0.0.1) and is run without machined (``--register=no
--keep-unit``: the host need not run systemd), so commands are run inside with ``nsenter`` into
the namespaces of its init: ``systemctl`` and ``journalctl`` then talk to the container's systemd.

``systemd-nspawn`` and ``mmdebstrap`` come from Debian's packages (systemd-container, mmdebstrap);
``make test-systemd`` installs them when missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

CACHE = Path(os.environ.get("APPLIER_SYSTEMD_TEST_CACHE", "/var/cache/ticdc-applier-tests/systemd"))

SUITE = "bookworm"
PACKAGES = ("systemd", "dbus", "python3", "python3-venv")
"""What the documented install needs on the server: systemd itself (and dbus, which systemctl
and systemd-run talk to), Python with venv. No compiler: the server installs a wheel."""

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _need(*programs: str) -> None:
    missing = [p for p in programs if shutil.which(p) is None]
    assert not missing, f"{' and '.join(missing)} missing: run `make test-systemd` (it installs them)"


def rootfs() -> Path:
    """The cached root file system (made when missing: about a minute and a half, 250 MB)."""
    _need("mmdebstrap")
    key = hashlib.sha256(f"{SUITE} minbase {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    path = CACHE / f"rootfs-{SUITE}-{key}"
    if (path / "usr/lib/systemd/systemd").exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = CACHE / f".rootfs-{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--quiet",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(tmp),
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            timeout=900,
        )
        tmp.rename(path)  # another run may have made it meanwhile: keep theirs
        for other in CACHE.glob("rootfs-*"):
            if other != path:  # made for another package list
                shutil.rmtree(other, ignore_errors=True)
    except OSError:
        if not (path / "usr/lib/systemd/systemd").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


class Container:
    """A booted copy of :func:`rootfs` in ``scratch``; :meth:`poweroff` stops it and removes the copy.

    ``binds`` maps host paths to paths inside (read-write, ``--bind``)."""

    def __init__(self, scratch: Path, binds: Mapping[str, str] | None = None) -> None:
        self.scratch = scratch
        self.root = scratch / "root"
        self.name = f"dep-sysd-{uuid.uuid4().hex[:8]}"
        self.binds = dict(binds or {})
        self.log_path = scratch / "console.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.leader = 0

    def prepare(self) -> Path:
        """Mount the overlay of the cached root file system; returns its root, where files may be
        added before boot."""
        _need("systemd-nspawn", "nsenter")
        lower = rootfs()
        for part in ("upper", "work", "root"):
            (self.scratch / part).mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={lower},upperdir={self.scratch / 'upper'},workdir={self.scratch / 'work'}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(self.root)], check=True)
        return self.root

    def boot(self, timeout: float = 60.0) -> None:
        """Boot and wait until systemd says the system is running."""
        args = ["systemd-nspawn", "--quiet", "-D", str(self.root), f"--machine={self.name}", "--boot"]
        args += ["--register=no", "--keep-unit", "--console=read-only"]
        args += [f"--bind={host}:{inside}" for host, inside in self.binds.items()]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_halt_with_parent
            )
        deadline = time.monotonic() + timeout
        while not self.leader:
            assert self.process.poll() is None, f"systemd-nspawn exited: {self.console()}"
            assert time.monotonic() < deadline, f"no init in the container: {self.console()}"
            self.leader = _container_init(self.process.pid)
            time.sleep(0.05)
        while True:
            done = self.run("systemctl is-system-running --wait", check=False, timeout=timeout)
            if done.stdout.strip() in ("running", "degraded"):
                return
            assert time.monotonic() < deadline, (
                f"the container's system is {done.stdout.strip()!r} {done.stderr}: {self.console()}"
            )
            time.sleep(0.2)

    def run(
        self,
        command: str,
        *,
        check: bool = True,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        cwd: str = "/",
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command inside (as root, in the container's namespaces, a clean environment)."""
        done = subprocess.run(
            self._nsenter(command, env, cwd),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"in the container: {command!r} exited {done.returncode}\n{done.stdout}{done.stderr}"
            )
        return done

    def spawn(self, command: str, log: Path, cwd: str = "/") -> subprocess.Popen[bytes]:
        """Start a shell command inside without waiting for it; its output goes to ``log``."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                self._nsenter(command, None, cwd), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )

    def _nsenter(self, command: str, env: Mapping[str, str] | None, cwd: str) -> list[str]:
        assert self.leader, "the container is not booted"
        clean = {
            "PATH": PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "SYSTEMD_PAGER": "",
            "SYSTEMD_COLORS": "0",
            **(env or {}),
        }
        return [
            "nsenter",
            f"--target={self.leader}",
            "--all",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in clean.items()),
            "bash",
            "-euo",
            "pipefail",
            "-c",
            f"cd {shlex.quote(cwd)}\n{command}",
        ]

    def console(self) -> str:
        """The last lines of the boot console."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        return ""

    def poweroff(self, timeout: float = 30.0) -> None:
        """Halt the container (SIGTERM to systemd-nspawn makes its systemd shut down), kill what is
        left after ``timeout``, and remove the copy of the root file system."""
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    if self.leader:  # the init of a PID namespace: its end kills every process in it
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(self.leader, signal.SIGKILL)
                    self.process.kill()
                    self.process.wait(timeout=timeout)
        finally:
            remove_scratch(self.scratch)


def remove_scratch(scratch: Path) -> None:
    """Unmount the overlay and remove the scratch directory (never through a mounted root)."""
    root = scratch / "root"
    if os.path.ismount(root):
        subprocess.run(["umount", str(root)], check=False)
        if os.path.ismount(root):  # still busy: detach it, it goes once the last user is gone
            subprocess.run(["umount", "--lazy", str(root)], check=True)
    shutil.rmtree(scratch, ignore_errors=True)


def remove_stale_scratch(parent: Path, prefix: str, older_than: float = 3600.0) -> None:
    """What a killed run left in ``parent`` (an overlay still mounted, its upper layer)."""
    for old in parent.glob(f"{prefix}*"):
        if old.is_dir() and time.time() - old.stat().st_mtime > older_than:
            remove_scratch(old)


def _halt_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test's process dies (killed, it runs no cleanup),
    which makes systemd-nspawn halt the container rather than leave it running."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _container_init(nspawn: int) -> int:
    """The host pid of the container's init: the descendant of systemd-nspawn that is pid 1 of its own
    PID namespace (nspawn forks helpers first, which exit), or 0 while there is none yet."""
    todo = [nspawn]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if pid != nspawn and nspid[-1:] == ["1"]:
                return pid
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return 0


@contextlib.contextmanager
def booted(scratch: Path, binds: Mapping[str, str] | None = None) -> Iterator[Container]:
    """A container to prepare (:meth:`Container.prepare` is done), boot and use; always powered off."""
    box = Container(scratch, binds)
    try:
        box.prepare()
        yield box
    finally:
        box.poweroff()

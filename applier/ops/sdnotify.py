"""systemd service notifications (``Type=notify``) over the documented datagram protocol.

The protocol (sd_notify(3)): send newline-separated ``KEY=VALUE`` assignments in one datagram to
the AF_UNIX socket named by ``$NOTIFY_SOCKET``; a name starting with ``@`` is in the abstract
namespace (a NUL byte replaces the ``@``). No ``NOTIFY_SOCKET``: not under systemd, do nothing.
``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, which must then be our pid) says the watchdog is on and
how often it must be fed. Twenty lines of socket code do not justify a dependency.

What the daemon sends and when:

* ``READY=1`` once the broker and the database answer and the checkpoint is loaded (``on_ready``);
  a standby sends it when it starts waiting, since its start-up is complete too (otherwise
  systemd would time its start out);
* ``STATUS=...`` with the state and the current lag, at most every few seconds; while the start-up
  waits for the database, a broker or the topic, what it waits for, with ``EXTEND_TIMEOUT_USEC=``
  at every attempt so that systemd's start timeout measures a start that hangs, not one that waits;
* ``WATCHDOG=1`` from the main loop's tick while it makes progress or waits healthily (see
  :mod:`applier.ops.health`), plus, from a helper thread, while the loop is legitimately elsewhere:
  waiting as a standby, taking over, or waiting for the database to finish a window;
* ``STOPPING=1`` as soon as SIGTERM/SIGINT arrives (and at the latest when the state is ``stopping``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from applier.codec.events import tso_physical_ms
from applier.ops.observer import Observer, WindowApplied

if TYPE_CHECKING:
    from applier.kafka.reader import PartitionReader
    from applier.ops.health import Health
    from applier.stream.barrier import Barrier


def _address(name: str) -> str | bytes:
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


class Notifier:
    """Sends notifications to ``$NOTIFY_SOCKET``; every method is a no-op when it is unset."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        name = env.get("NOTIFY_SOCKET", "")
        self._address = _address(name) if name else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_seconds: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_seconds = int(usec) / 1_000_000

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; False when disabled or the socket is gone."""
        if self._address is None:
            return False
        payload = "\n".join(assignments).encode("utf-8", "replace")
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(payload, self._address)
            except OSError:
                return False  # systemd went away or the socket is not ours to write: never fatal
        return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class SystemdObserver(Observer):
    """Translates the daemon's hooks into READY/STATUS/WATCHDOG/STOPPING notifications."""

    STATUS_EVERY = 5.0
    WAIT_EXTEND_SECONDS = 60
    """Each start-up attempt moves systemd's start timeout this far ahead: more than the longest
    pause between two attempts (the backoff's cap) plus one attempt (a connect timeout)."""

    def __init__(
        self,
        notifier: Notifier,
        health: Health,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.notifier = notifier
        self.health = health
        self._clock = clock
        self._wall = wall
        wd = notifier.watchdog_seconds
        # Feed at a third of the timeout: two pings may be lost or late before systemd acts.
        self.ping_every = None if wd is None else max(0.05, wd / 3)
        self._next_ping = 0.0
        self._next_status = 0.0
        self._ready_sent = False
        self._stopping_sent = False
        self._applied_ts = 0
        self._said_applied = False  # a STATUS with an applied ts went out (the first one goes at once)
        self._rows = 0
        self._keepalive: threading.Thread | None = None
        self._closed = threading.Event()

    # -- sending -------------------------------------------------------------------------------
    def _status_text(self) -> str:
        state = self.health.state
        if state == "standby":
            return "standby: another instance is active; waiting to take over"
        if self._applied_ts <= 0:
            return f"{state}: nothing applied yet"
        lag = self._wall() - tso_physical_ms(self._applied_ts) / 1000.0
        return f"{state}: applied up to ts {self._applied_ts}, lag {lag:.1f}s, {self._rows} rows applied"

    def _maybe_status(self, force: bool = False) -> None:
        now = self._clock()
        first_progress = self._applied_ts > 0 and not self._said_applied
        if force or first_progress or now >= self._next_status:
            self._next_status = now + self.STATUS_EVERY
            self._said_applied = self._applied_ts > 0
            self.notifier.send("STATUS=" + self._status_text())

    def _ping(self) -> None:
        # systemd arms the watchdog only once start-up is complete, i.e. after READY=1.
        if self.ping_every is None or not self._ready_sent:
            return
        now = self._clock()
        if now >= self._next_ping:
            self._next_ping = now + self.ping_every
            self.notifier.send("WATCHDOG=1")

    def _send_ready(self) -> None:
        if not self._ready_sent:
            self._ready_sent = True
            self.notifier.send("READY=1", "STATUS=" + self._status_text())

    def stopping(self) -> None:
        """Say STOPPING=1 once; safe to call from a signal handler."""
        if not self._stopping_sent:
            self._stopping_sent = True
            self.notifier.send("STOPPING=1", "STATUS=stopping: finishing the window in flight")

    # -- keepalive thread ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the helper thread that feeds the watchdog while the loop is legitimately elsewhere."""
        if self.ping_every is None or not self.notifier.enabled or self._keepalive is not None:
            return
        self._keepalive = threading.Thread(target=self._keepalive_loop, name="sd-watchdog", daemon=True)
        self._keepalive.start()

    def _keepalive_loop(self) -> None:
        assert self.ping_every is not None
        while not self._closed.wait(self.ping_every / 2):
            h = self.health
            elsewhere = h.state == "standby" or (h.state == "active" and not h.loop_started)
            if elsewhere or (h.applying_since is not None and h.alive().ok):
                self._ping()

    def close(self) -> None:
        self._closed.set()
        if self._keepalive is not None:
            self._keepalive.join(timeout=2)
        self.notifier.close()

    # -- hooks -----------------------------------------------------------------------------------
    def on_state(self, state: str) -> None:
        if state == "standby":
            self._send_ready()
            self._maybe_status(force=True)
        elif state == "stopping":
            self.stopping()
        elif state == "failed":
            self.notifier.send(f"STATUS=failed: {self.health.last_error or 'fatal error'}")
        elif state == "active" and self._ready_sent:
            self.notifier.send("STATUS=active: took over; loading the checkpoint")

    def on_waiting(self, reason: str | None) -> None:
        if reason is None:
            return
        self.notifier.send(
            f"STATUS={self.health.state}: {reason}"[:1024],
            f"EXTEND_TIMEOUT_USEC={self.WAIT_EXTEND_SECONDS * 1_000_000}",
        )

    def on_ready(self) -> None:
        self._send_ready()
        self._ping()

    def on_window(self, applied: WindowApplied) -> None:
        self._applied_ts = max(self._applied_ts, applied.window.resolved_ts)
        self._rows += sum(applied.rows.values())

    def on_tick(self, barrier: Barrier, reader: PartitionReader, progressed: bool) -> None:
        if not self.notifier.enabled:
            return  # not under systemd: keep the loop's per-iteration cost at nothing
        if self._applied_ts < barrier.applied_ts:
            self._applied_ts = barrier.applied_ts
        if progressed or self.health.waiting_healthily():
            self._ping()
        self._maybe_status()

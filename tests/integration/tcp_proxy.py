"""A TCP forwarder that tests can disturb: a server that goes away, a slow path, a stalled one.

The embedded broker keeps its data in memory, so stopping it loses every topic. Instead the broker
advertises the proxy's port (``start_broker(advertised_port=...)``): every client connection goes
through the proxy, and :meth:`TcpProxy.cut` makes the broker unreachable exactly as a stopped one
is (connections reset, new ones refused) while it keeps its topics; :meth:`TcpProxy.restore`
listens again on the same port. The same works in front of a database (a downstream URL naming
the proxy's port).

Two more faults of real networks:

* ``latency``: every chunk waits this long before it is forwarded (each direction);
* :meth:`TcpProxy.stall`: the connections open now stop forwarding in both directions but stay
  open, as behind a firewall or NAT that dropped the flow, or a peer that froze: nothing is ever
  answered and nothing is closed. New connections are forwarded normally.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target_port`` until cut."""

    def __init__(self, target_port: int, port: int = 0, *, latency: float = 0.0) -> None:
        self.target_port = target_port
        self.latency = latency
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stalled: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = port
        self.restore()

    def restore(self) -> None:
        """Listen (again) on ``port`` and forward every accepted connection."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and reset the open ones (stalled ones too)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
            self._stalled = set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    close = cut

    def stall(self) -> int:
        """Stop forwarding on every connection open now, without closing any; how many pairs."""
        with self._lock:
            self._stalled |= self._conns
            return len(self._conns) // 2

    @property
    def connections(self) -> int:
        """Connection pairs open now (stalled ones included)."""
        with self._lock:
            return len(self._conns) // 2

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._conns |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.latency:
                    time.sleep(self.latency)
                while src in self._stalled:  # hold it: never answer, never close (until cut)
                    time.sleep(0.1)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                # A stalled path carries no close either: the other side keeps its connection
                # (a server keeps the session, its transaction and its locks) until cut().
                stalled = src in self._stalled
                ends = (src,) if stalled else (src, dst)
                self._conns -= set(ends)
                self._stalled -= set(ends)
            for end in ends:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

"""A socket standing in for systemd's notify socket, for the unit and the integration tests of sd_notify."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid


def bind_notify_socket(abstract: bool = False) -> tuple[socket.socket, str]:
    """A bound AF_UNIX datagram socket and the NOTIFY_SOCKET value naming it.

    ``abstract``: in the abstract namespace (``@name``, as systemd may hand it over), else a path in a
    fresh temporary directory.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"applier-test-{uuid.uuid4().hex}"
        sock.bind("\0" + name)
        return sock, "@" + name
    path = os.path.join(tempfile.mkdtemp(prefix="notify-"), "notify.sock")
    sock.bind(path)
    return sock, path

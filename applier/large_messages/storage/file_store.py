"""Claim-check objects as the regular files directly under a directory (``file://`` roots)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Final, NoReturn

from applier.large_messages.storage.base import ObjectStore
from applier.large_messages.storage.errors import (
    ObjectMissing,
    ObjectStoreConfigError,
    ObjectUnreadable,
    Transient,
)
from applier.large_messages.storage.retry import RetryPolicy

# Errors of a local or network file system that may pass: I/O errors, stale NFS handles, a FUSE
# mount whose daemon is restarting, a full file table.
_TRANSIENT_ERRNOS: Final = frozenset(
    getattr(errno, n)
    for n in (
        "EIO",
        "EAGAIN",
        "EBUSY",
        "EINTR",
        "ETIMEDOUT",
        "ESTALE",
        "ENOTCONN",
        "ECONNRESET",
        "ECONNABORTED",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENETDOWN",
        "ENETUNREACH",
        "ENFILE",
        "EMFILE",
        "ENOLCK",
        "ENOMEM",
    )
    if hasattr(errno, n)
)


@dataclass(frozen=True, slots=True)
class FileLocation:
    """A parsed ``file://`` root: an absolute, normalised directory path."""

    root: str


class FileStore(ObjectStore):
    """Objects are the regular files directly under ``root``.

    The name is never a path (see :func:`check_name`), a symbolic link in place of an object is
    refused (``O_NOFOLLOW``: whoever can write into the storage directory must not make the daemon
    read other files), and so is anything but a regular file (a FIFO would block the reader: it is
    opened non-blocking and checked before reading). ``root`` itself may be a symbolic link.
    """

    def __init__(self, root: str, *, retry: RetryPolicy | None = None) -> None:
        super().__init__(retry=retry)
        if not os.path.isabs(root) or "\0" in root:
            raise ObjectStoreConfigError("a file claim-check root must be an absolute path")
        self.root = os.path.normpath(root)

    def describe(self) -> str:
        return f"file://{self.root}"

    def _fail(self, name: str, exc: OSError) -> NoReturn:
        reason = f"{exc.strerror or type(exc).__name__} (errno {exc.errno})"
        if exc.errno in _TRANSIENT_ERRNOS:
            raise Transient(reason)
        raise ObjectUnreadable(name, self.describe(), reason)

    def _read_once(self, name: str) -> bytes:
        path = os.path.join(self.root, name)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not os.path.isdir(self.root):
                raise ObjectUnreadable(
                    name, self.describe(), "the root directory does not exist (storage not mounted?)"
                ) from None
            raise ObjectMissing(name, self.describe()) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ObjectUnreadable(
                    name, self.describe(), "it is a symbolic link, and links are never followed"
                ) from None
            self._fail(name, exc)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ObjectUnreadable(name, self.describe(), "not a regular file")
            os.set_blocking(fd, True)
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
        except OSError as exc:
            self._fail(name, exc)
        finally:
            os.close(fd)
        if len(data) < st.st_size:
            raise Transient(f"short read: {len(data)} of {st.st_size} bytes")
        return data

"""The project's error root: every error the applier raises on purpose derives from ``ApplierError``.

Handlers catch these base classes, never a list of concrete types:

- ``FatalError``: the process cannot go on; the commands log ``str(exc)`` as one line (it never
  holds a secret: messages are written that way and pass through ``applier.ops.redact`` on the way
  out) and exit with ``exit_code`` (1). systemd restarts the daemon; the same input stops it at
  the same place again, with nothing after it applied.
- ``InputError``: a fatal error about a record of the topic (malformed bytes, a row the producer
  could not have sent, an unplannable event). It names topic, partition, offset and commit ts.
- ``ConfigurationError``: a setting is wrong; exit code 2, before anything is read or written.

Anything else that escapes is a bug: it is logged with its traceback and the process exits 1.

This module is a leaf (it imports nothing of the project), so ``sqlgen`` and ``checkpoint`` can
root their errors here without depending on the daemon side, as they do with
``applier.codec.events``.

Spark tasks run in other processes: a ``FatalError`` raised there reaches the catch-up's driver
as text only. ``task_error_line`` marks it on the way out (``fatal_in_task``) so the driver can
report the one line instead of a Java stack trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2

TASK_MARK = "applier-fatal: "
"""Prefix of the one line a Spark task's ``FatalError`` is re-raised with (``fatal_in_task``)."""


class ApplierError(Exception):
    """Root of every error the project raises on purpose."""


class FatalError(ApplierError):
    """Stops the process with one clear line (``str(exc)``) and ``exit_code``."""

    exit_code = EXIT_FATAL


class InputError(FatalError):
    """A record of the topic cannot be applied; the message names where it was read."""


class ConfigurationError(FatalError):
    """A setting is missing or wrong; reported before anything is read or written."""

    exit_code = EXIT_USAGE


@contextlib.contextmanager
def fatal_in_task() -> Iterator[None]:
    """Inside a Spark task: re-raise a ``FatalError`` as one marked line the driver can find."""
    try:
        yield
    except FatalError as exc:
        message = " ".join(str(exc).split())
        raise RuntimeError(f"{TASK_MARK}{type(exc).__name__}: {message}") from None


def task_error_line(text: str) -> str | None:
    """The marked line of a failed Spark job's text (``fatal_in_task``), without the mark."""
    for line in reversed(text.splitlines()):
        at = line.find(TASK_MARK)
        if at >= 0:
            return line[at + len(TASK_MARK) :].strip()
    return None


def compiled_module_missing(what: str, source: str, exc: ImportError) -> ImportError:
    """The one-line error for a compiled module that cannot be imported: ``what`` (``source``)
    was not built, or was built before it existed, by the install of this checkout."""
    return ImportError(
        f"{what} ({source}) cannot be imported ({exc}): rebuild it with `pip install -e .` in the "
        "checkout, or in place only with Cython installed: `python setup.py build_ext --inplace` "
        "(either needs a C compiler and the Python headers)"
    )

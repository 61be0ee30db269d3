"""The errors of reading claim-check objects; no message of them contains a secret.

The public ones are defined with the other large-message errors (``applier.large_messages.errors``)
and named here too, for the store's modules; ``Transient`` is the stores' own signal to retry.
"""

from __future__ import annotations

from applier.large_messages.errors import (
    ObjectMissing,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectUnreadable,
)

__all__ = ["ObjectMissing", "ObjectStoreConfigError", "ObjectStoreError", "ObjectUnreadable", "Transient"]


class Transient(Exception):
    """One attempt failed in a way that may pass; ``reason`` is already safe to show."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

"""The errors of reading claim-check objects; no message of them contains a secret."""

from __future__ import annotations

from applier.errors import ApplierError, ConfigurationError


class ObjectStoreError(ApplierError):
    """Base of every error of this module; its message never contains a secret."""


class ObjectStoreConfigError(ObjectStoreError, ConfigurationError, ValueError):
    """The storage root (URI or options) is unusable. A ValueError too, like the other config errors."""


class ObjectMissing(ObjectStoreError):
    """The object does not exist under the root: permanent (TiCDC writes it before sending its record,
    so it was removed since, e.g. by a lifecycle rule, or the root names another place)."""

    def __init__(self, name: str, where: str) -> None:
        self.name = name
        self.where = where
        super().__init__(f"object {name!r} does not exist in {where}")


class ObjectUnreadable(ObjectStoreError):
    """The object could not be read and trying again now will not help.

    ``reason`` says why (no secrets). ``retried`` is true when the failures were transient but lasted
    longer than the retry budget; ``attempts`` counts the reads made (each may include botocore's
    own retries).
    """

    def __init__(
        self, name: str, where: str, reason: str, *, retried: bool = False, attempts: int = 1
    ) -> None:
        self.name = name
        self.where = where
        self.reason = reason
        self.retried = retried
        self.attempts = attempts
        tail = f" (still failing after {attempts} attempts, retried for the whole budget)" if retried else ""
        super().__init__(f"cannot read object {name!r} from {where}: {reason}{tail}")


class Transient(Exception):
    """One attempt failed in a way that may pass; ``reason`` is already safe to show."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

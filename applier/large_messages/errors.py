"""Why a large-message event cannot be applied (docs/open-protocol.md §9): each error names where it
was read."""

from __future__ import annotations

from applier.codec.events import LargeMessageEvent, Position
from applier.errors import ApplierError, ConfigurationError, InputError


def where(pos: Position) -> str:
    return f"topic {pos.topic!r} partition {pos.partition} offset {pos.offset} event #{pos.index}"


class LargeMessageError(InputError):
    """A large-message event that cannot be applied; ``position`` is where it was read."""

    def __init__(self, message: str, position: Position) -> None:
        super().__init__(message)
        self.position = position


class LargeMessageNotConfigured(LargeMessageError):
    """The stream holds a kind of large message the configuration gives no source for."""

    def __init__(self, event: LargeMessageEvent) -> None:
        table = f"`{event.schema}`.`{event.table}`"
        if event.claim_check_location is not None:
            what = (
                f"a claim-check reference (ccl) for {table} at commit ts {event.commit_ts}: set "
                "claim_check_storage_uri (--claim-check-storage-uri) to where the changefeed's "
                "claim-check-storage-uri stores its objects"
            )
        else:
            what = (
                f"a handle-key-only (ohk) event for {table} at commit ts {event.commit_ts}: set upstream "
                "(--upstream, the upstream TiDB's mysql:// URL; password in APPLIER_UPSTREAM_PASSWORD "
                "or upstream_password_file) so the full row can be read as of its commit ts"
            )
        super().__init__(f'{where(event.pos)}: {what} (docs/operations.md, "Large messages")', event.pos)


class LargeMessageUnavailable(LargeMessageError):
    """The full row of a large-message event could not be had (see the module docstring)."""


# -- the object stores of claim-check roots (applier.large_messages.storage) -----------------------


class ObjectStoreError(ApplierError):
    """Base of every error of this module; its message never contains a secret."""


class ObjectStoreConfigError(ObjectStoreError, ConfigurationError):
    """The storage root (URI or options) is unusable."""


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

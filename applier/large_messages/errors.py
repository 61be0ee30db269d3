"""Why a large-message event cannot be applied (docs/open-protocol.md §9): each error names where it
was read."""

from __future__ import annotations

from applier.codec.events import LargeMessageEvent, Position
from applier.errors import InputError


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

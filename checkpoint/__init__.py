"""The applier's checkpoint, kept in the downstream database next to the data it describes.

Rows and the checkpoint that covers them commit in one transaction, which is what turns the
at-least-once Kafka stream into exactly-once effect: after any crash the stored checkpoint says
precisely what the downstream contains.
"""

from checkpoint.schema import (
    DEFAULT_SCHEMA,
    SCHEMA_VERSION,
    CheckpointSchemaError,
    ensure_schema,
)
from checkpoint.status import lag_seconds, status_report
from checkpoint.store import (
    ROW_HOLD_OPEN,
    Checkpoint,
    CheckpointStore,
    FencedOut,
    JournalEntry,
    Progress,
    ProgressWrite,
    ddl_digest,
    ddl_fields,
)

__all__ = [
    "DEFAULT_SCHEMA",
    "ROW_HOLD_OPEN",
    "SCHEMA_VERSION",
    "Checkpoint",
    "CheckpointSchemaError",
    "CheckpointStore",
    "FencedOut",
    "JournalEntry",
    "Progress",
    "ProgressWrite",
    "ddl_digest",
    "ddl_fields",
    "ensure_schema",
    "lag_seconds",
    "status_report",
]

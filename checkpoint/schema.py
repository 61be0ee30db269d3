"""The checkpoint tables in the downstream database, and creating/upgrading them.

The checkpoint lives in the downstream, next to the data, so that a batch of rows and the
checkpoint that says "applied up to here" commit in one transaction: after a crash the two can
never disagree. All tables are keyed by changefeed (the Kafka consumer group id), so several
changefeeds can share one schema.

Names (changefeed, topic, schema, table) are VARCHAR(255) utf8mb4 with a binary collation so
non-ASCII and hostile names round-trip exactly and compare byte-wise. A *NO PAD* binary collation
is preferred when the server has one (MariaDB ``utf8mb4_nopad_bin``, MySQL 8 ``utf8mb4_0900_bin``):
with the classic PAD SPACE ``utf8mb4_bin``, ``'a'`` and ``'a '`` are the same key. The widest key,
(changefeed, schema_name, table_name), is 3 x (255 x 4 + 2) = 3066 bytes, under InnoDB's 3072.

Times (``updated_at``, ``applied_at``) are DATETIME(6) written as ``UTC_TIMESTAMP(6)``: UTC
regardless of the session's ``time_zone``, and free of TIMESTAMP's 2038 limit.

``schema_version`` holds a single row (id = 1) with the layout version. :func:`ensure_schema`
creates what is missing, refuses a newer layout than it knows, and runs ``MIGRATIONS`` for older
ones, so a future release can change the layout without a manual step.
"""

from __future__ import annotations

from typing import Final

import pymysql

from applier.errors import FatalError
from sqlgen.quoting import quote_ident

SCHEMA_VERSION: Final = 4
DEFAULT_SCHEMA: Final = "ticdc_applier"

NAME_MAX_CHARS: Final = 255

# Most preferred first; utf8mb4_bin exists everywhere (TiDB included).
_COLLATION_PREFERENCE: Final = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")

_TABLE_OPTIONS: Final = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={c} ROW_FORMAT=DYNAMIC"

# {s}: quoted schema, {c}: collation. Only identifiers we control are formatted in; values are bound.
_NAME: Final = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {c}"
_CHANGEFEED: Final = f"  `changefeed` {_NAME} NOT NULL,\n"
_UPDATED_AT: Final = "  `updated_at` DATETIME(6) NOT NULL COMMENT 'UTC',\n"

# The columns that describe one DDL event, shared by `applied_ddl` and `ddl_journal`.
_DDL_COLUMNS: Final = (
    _CHANGEFEED + "  `commit_ts` BIGINT UNSIGNED NOT NULL,\n"
    "  `query_digest` CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'sha256 of query',\n"
    f"  `schema_name` {_NAME} NOT NULL,\n"
    f"  `table_name` {_NAME} NOT NULL,\n"
    "  `ddl_type` INT NOT NULL,\n"
    "  `query` LONGTEXT CHARACTER SET utf8mb4 COLLATE {c} NOT NULL,\n"
)


def _create_table(name: str, columns: str, key: str) -> str:
    """The statement creating the checkpoint table ``name``: ``columns`` (a definition a line),
    the primary key ``key``, and the options every checkpoint table has."""
    return (
        f"\nCREATE TABLE IF NOT EXISTS {{s}}.`{name}` (\n{columns}  PRIMARY KEY ({key})\n) " + _TABLE_OPTIONS
    )


# A journaled DDL: its columns, the fingerprint of what it touches before it ran, and when.
_JOURNAL_COLUMNS: Final = (
    _DDL_COLUMNS
    + "  `catalogue` LONGTEXT CHARACTER SET utf8mb4 COLLATE {c} NOT NULL COMMENT 'JSON: catalogue before',\n"
    "  `started_at` DATETIME(6) NOT NULL COMMENT 'UTC',\n"
)
_DDL_JOURNAL: Final = _create_table("ddl_journal", _JOURNAL_COLUMNS, "`changefeed`")
_DDL_ONLINE: Final = _create_table(
    "ddl_online", _JOURNAL_COLUMNS, "`changefeed`, `commit_ts`, `query_digest`"
)

# Row mode (``consistency = "row"``): what each partition is applied up to, written by the
# partition's own session; a table of its own so that those sessions never write a shared row.
_PARTITION_APPLIED: Final = _create_table(
    "partition_applied",
    _CHANGEFEED + f"  `topic` {_NAME} NOT NULL,\n"
    "  `partition_id` INT NOT NULL,\n"
    "  `applied_ts` BIGINT UNSIGNED NOT NULL COMMENT 'every row of the partition <= this is applied',\n"
    + _UPDATED_AT,
    "`changefeed`, `topic`, `partition_id`",
)
# Row mode: the partitions release together until this ts (``applier.stream.row_release``), kept
# across a restart; NULL: until a ts not known yet. No row: each partition on its own.
_ROW_HOLD: Final = _create_table(
    "row_hold",
    _CHANGEFEED + "  `until_ts` BIGINT UNSIGNED NULL COMMENT 'NULL: not known yet',\n" + _UPDATED_AT,
    "`changefeed`",
)
TABLES: Final[dict[str, str]] = {
    "schema_version": _create_table(
        "schema_version",
        "  `id` TINYINT UNSIGNED NOT NULL,\n"
        "  `version` INT UNSIGNED NOT NULL,\n"
        "  `updated_at` DATETIME(6) NOT NULL,\n",
        "`id`",
    ),
    "changefeed": _create_table(
        "changefeed",
        _CHANGEFEED + f"  `topic` {_NAME} NULL,\n"
        "  `resolved_ts` BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'global resolved ts applied',\n"
        f"  `owner` {_NAME} NULL COMMENT 'active instance fence token',\n" + _UPDATED_AT,
        "`changefeed`",
    ),
    "table_checkpoint": _create_table(
        "table_checkpoint",
        _CHANGEFEED + f"  `schema_name` {_NAME} NOT NULL,\n"
        f"  `table_name` {_NAME} NOT NULL,\n"
        "  `checkpoint_ts` BIGINT UNSIGNED NOT NULL,\n" + _UPDATED_AT,
        "`changefeed`, `schema_name`, `table_name`",
    ),
    "partition_offset": _create_table(
        "partition_offset",
        _CHANGEFEED + f"  `topic` {_NAME} NOT NULL,\n"
        "  `partition_id` INT NOT NULL,\n"
        "  `next_offset` BIGINT NOT NULL COMMENT 'Kafka offset to resume at',\n"
        "  `resolved_ts` BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'partition resolved ts when written',\n"
        + _UPDATED_AT,
        "`changefeed`, `topic`, `partition_id`",
    ),
    "applied_ddl": _create_table(
        "applied_ddl",
        _DDL_COLUMNS + "  `applied_at` DATETIME(6) NOT NULL COMMENT 'UTC',\n",
        "`changefeed`, `commit_ts`, `query_digest`",
    ),
    # The DDL being executed (at most one per changefeed): written and committed before the DDL
    # runs, deleted in the transaction that records it (applier/apply/ddl.py says why).
    "ddl_journal": _DDL_JOURNAL,
    # DDLs recorded as applied that run beside the stream (index builds, applier/apply/online_ddl.py):
    # a row from the transaction that records one until it has taken effect.
    "ddl_online": _DDL_ONLINE,
    "partition_applied": _PARTITION_APPLIED,
    "row_hold": _ROW_HOLD,
}

# version N -> statements that upgrade a version-N layout to N + 1 ({s}/{c} formatted as above).
# Each statement must be idempotent: two instances starting together may both run it.
MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (_DDL_JOURNAL,),  # version 2: the DDL journal
    2: (_DDL_ONLINE,),  # version 3: DDLs that run beside the stream
    3: (_PARTITION_APPLIED, _ROW_HOLD),  # version 4: row mode's per-partition applied ts and hold
}


def applied_ts_query(q: str) -> str:
    """The statement reading what every partition of a changefeed is applied up to (one ``%s``:
    the changefeed; ``q``: the quoted schema): the changefeed row's resolved ts, or, in row mode,
    the lowest partition's applied ts when every partition is past it (the changefeed row is
    written about every second there, the partitions' rows with each of their transactions)."""
    return (
        "SELECT GREATEST(c.`resolved_ts`, "
        "COALESCE(MIN(GREATEST(c.`resolved_ts`, COALESCE(a.`applied_ts`, 0))), 0)) "
        f"FROM {q}.`changefeed` c LEFT JOIN {q}.`partition_offset` o "
        "ON o.`changefeed` = c.`changefeed` AND o.`topic` = c.`topic` "
        f"LEFT JOIN {q}.`partition_applied` a ON a.`changefeed` = o.`changefeed` AND a.`topic` = o.`topic` "
        "AND a.`partition_id` = o.`partition_id` WHERE c.`changefeed` = %s GROUP BY c.`resolved_ts`"
    )


class CheckpointSchemaError(FatalError):
    """The checkpoint schema cannot be used by this applier (e.g. written by a newer release)."""


PRIVILEGES: Final = "SELECT, INSERT, UPDATE, DELETE, CREATE"
"""What a job that writes a changefeed needs on the checkpoint schema (CREATE only until the
tables exist); docs/operations.md, "The database user", says the same."""


def validate_schema_name(schema: str) -> str:
    """MySQL rules for a database name we are about to create; returns it unchanged."""
    if not isinstance(schema, str) or not schema or len(schema) > 64:
        raise ValueError(f"checkpoint schema name must be 1-64 characters, got {schema!r}")
    if "\x00" in schema or schema.endswith(" "):
        raise ValueError(f"checkpoint schema name {schema!r} cannot contain NUL or end with a space")
    return schema


def pick_collation(conn: pymysql.connections.Connection) -> str:
    """The most exact binary utf8mb4 collation this server offers (see module doc)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN (%s, %s, %s)",
            _COLLATION_PREFERENCE,
        )
        available = {row[0] for row in cur.fetchall()}
    for name in _COLLATION_PREFERENCE:
        if name in available:
            return name
    return "utf8mb4_bin"


def ensure_schema(conn: pymysql.connections.Connection, schema: str = DEFAULT_SCHEMA) -> int:
    """Create the schema and tables if missing and bring them to SCHEMA_VERSION; returns it.

    Idempotent and safe to run concurrently from two instances (everything is IF NOT EXISTS and
    the version row is inserted only if absent). Objects that exist are not touched, so an
    operator may pre-create them and grant the applier no CREATE privilege. DDL commits
    implicitly: call this with no transaction open. Ends with a commit.
    """
    validate_schema_name(schema)
    q = quote_ident(schema)
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (schema,))
        if cur.fetchone()[0] == 0:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {q} CHARACTER SET utf8mb4")
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s", (schema,))
        existing = {row[0] for row in cur.fetchall()}
        missing = [name for name in TABLES if name not in existing]
        collation = pick_collation(conn) if missing else "utf8mb4_bin"
        for name in missing:
            cur.execute(TABLES[name].format(s=q, c=collation))
        cur.execute(
            f"INSERT INTO {q}.`schema_version` (`id`, `version`, `updated_at`) "
            "VALUES (1, %s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE `id` = `id`",
            (SCHEMA_VERSION,),
        )
        conn.commit()
        cur.execute(f"SELECT `version` FROM {q}.`schema_version` WHERE `id` = 1")
        version = int(cur.fetchone()[0])
        conn.commit()
        if version > SCHEMA_VERSION:
            raise CheckpointSchemaError(
                f"checkpoint schema {schema!r} has layout version {version}, newer than this applier "
                f"supports ({SCHEMA_VERSION}); upgrade the applier"
            )
        while version < SCHEMA_VERSION:
            # Migrations contain DDL (implicit commits), so two instances may both run one:
            # every migration statement must be idempotent (IF [NOT] EXISTS).
            for stmt in MIGRATIONS[version]:
                cur.execute(stmt.format(s=q, c=pick_collation(conn)))
            version += 1
            cur.execute(
                f"UPDATE {q}.`schema_version` SET `version` = GREATEST(`version`, %s), "
                "`updated_at` = UTC_TIMESTAMP(6) WHERE `id` = 1",
                (version,),
            )
            conn.commit()
    return version

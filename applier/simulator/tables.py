"""Table definitions of the simulated upstream, and the column metadata TiCDC derives from them.

Each table is described once (columns, indexes) and everything else follows from that the way
TiDB and TiCDC derive it: the handle key (primary key, else the smallest NOT NULL unique key), the
column flags sent on the wire (docs/open-protocol.md §3.3), the MySQL type codes (§4)
and the ``CREATE TABLE`` text the DDL events carry. Keeping the derivation in one place is what
lets the stream, the snapshots and the verifier agree on the same truth.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

# Column flags (docs/open-protocol.md §3.3): plain numbers of the specification, with one home in
# the events module (a leaf module). The simulator's logic stays its own: only the numbers are
# shared. Importable from here too, beside the rest of the column metadata.
from applier.codec.events import (
    FLAG_BINARY,
    FLAG_GENERATED,
    FLAG_HANDLE_KEY,
    FLAG_MULTIPLE_KEY,
    FLAG_NULLABLE,
    FLAG_PRIMARY_KEY,
    FLAG_UNIQUE_KEY,
    FLAG_UNSIGNED,
)
from sqlgen.quoting import quote_ident

# MySQL column type codes (docs/open-protocol.md §4).
TYPE_TINY = 1
TYPE_SHORT = 2
TYPE_LONG = 3
TYPE_FLOAT = 4
TYPE_DOUBLE = 5
TYPE_TIMESTAMP = 7
TYPE_LONGLONG = 8
TYPE_INT24 = 9
TYPE_DATE = 10
TYPE_TIME = 11
TYPE_DATETIME = 12
TYPE_YEAR = 13
TYPE_VARCHAR = 15
TYPE_BIT = 16
TYPE_JSON = 245
TYPE_NEWDECIMAL = 246
TYPE_ENUM = 247
TYPE_SET = 248
TYPE_TINY_BLOB = 249
TYPE_MEDIUM_BLOB = 250
TYPE_LONG_BLOB = 251
TYPE_BLOB = 252
TYPE_STRING = 254

STRING_TYPES = frozenset({TYPE_VARCHAR, 253, TYPE_STRING})
BLOB_TYPES = frozenset({TYPE_TINY_BLOB, TYPE_MEDIUM_BLOB, TYPE_LONG_BLOB, TYPE_BLOB})

# DDL type codes (docs/open-protocol.md §8) the simulator emits.
DDL_CREATE_SCHEMA = 1
DDL_CREATE_TABLE = 3
DDL_ADD_COLUMN = 5
DDL_ADD_INDEX = 7
DDL_DROP_INDEX = 8


class Kind(enum.Enum):
    """How a column's value is represented in the model (and normalised by the verifier)."""

    INT = "int"  # int (also BIGINT UNSIGNED up to 2**64-1)
    FLOAT32 = "float32"  # float exactly representable in single precision
    FLOAT64 = "float64"  # float
    DECIMAL = "decimal"  # str with full scale, e.g. "-12.500000"
    DATE = "date"  # "YYYY-MM-DD"
    DATETIME = "datetime"  # "YYYY-MM-DD HH:MM:SS[.ffffff]" with exactly fsp fraction digits
    TIMESTAMP = "timestamp"  # like DATETIME, in UTC
    TIME = "time"  # "[-]HH:MM:SS", hours may exceed 24
    YEAR = "year"  # int
    TEXT = "text"  # str (CHAR/VARCHAR with a text charset)
    BYTES = "bytes"  # bytes (BINARY/VARBINARY)
    BLOB = "blob"  # bytes (TINYBLOB..LONGBLOB)
    TEXT_BLOB = "text_blob"  # str (TINYTEXT..LONGTEXT, sent as base64 of the UTF-8 bytes)
    BIT = "bit"  # int
    ENUM = "enum"  # int, 1-based member index
    SET = "set"  # int, bitmask of members
    JSON = "json"  # str holding JSON text


@dataclass(frozen=True)
class ColumnSpec:
    """One column: its SQL definition, its wire type code and how its values are modelled."""

    name: str
    sql_type: str  # the type as written in CREATE TABLE, e.g. "BIGINT UNSIGNED", "DATETIME(6)"
    type_code: int
    kind: Kind
    nullable: bool = True
    binary_charset: bool = False  # TiDB gives non-string types and BLOB/BINARY the "binary" charset
    unsigned: bool = False
    generated: str | None = None  # SQL expression of a STORED generated column
    members: tuple[str, ...] = ()  # ENUM / SET members
    int_range: tuple[int, int] | None = None  # inclusive value range of integer-like columns
    scale: int = 0  # DECIMAL scale
    fsp: int = 0  # fractional seconds digits of DATETIME / TIMESTAMP
    max_len: int = 0  # CHAR/VARCHAR characters, BINARY/VARBINARY/BLOB/TEXT bytes
    default_sql: str | None = None  # DEFAULT clause value, SQL literal
    default: Any = None  # the model value older rows get when the column is added

    @property
    def is_generated(self) -> bool:
        return self.generated is not None

    def definition_sql(self) -> str:
        """The column definition as written in CREATE TABLE / ADD COLUMN."""
        parts = [quote_ident(self.name), self.sql_type]
        if self.generated is not None:
            parts.append(f"GENERATED ALWAYS AS ({self.generated}) STORED")
            return " ".join(parts)
        parts.append("NULL" if self.nullable else "NOT NULL")
        if self.default_sql is not None:
            parts.append(f"DEFAULT {self.default_sql}")
        elif self.nullable and self.kind is Kind.TIMESTAMP:
            # Without an explicit default MySQL/MariaDB may give the first TIMESTAMP column
            # DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, which would rewrite it.
            parts.append("DEFAULT NULL")
        return " ".join(parts)


@dataclass(frozen=True)
class IndexSpec:
    """A PRIMARY KEY, UNIQUE KEY or plain KEY, in declaration order (TiDB index ids follow it)."""

    name: str
    columns: tuple[str, ...]
    primary: bool = False
    unique: bool = False


@dataclass(frozen=True)
class TableSpec:
    """A table at one schema version, with everything TiCDC derives from its definition."""

    name: str
    columns: tuple[ColumnSpec, ...]
    indexes: tuple[IndexSpec, ...] = ()
    # A HASH-partitioned table: the partitioning column and the physical table id of each
    # partition, in partition order (TiDB gives every partition its own table id).
    partition_column: str | None = None
    partition_ids: tuple[int, ...] = ()
    flags: dict[str, int] = field(init=False, compare=False, repr=False)
    handle_key: tuple[str, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        handle = _choose_handle_index(self)
        object.__setattr__(self, "handle_key", handle.columns if handle else ())
        object.__setattr__(self, "flags", _column_flags(self, handle))

    def column(self, name: str) -> ColumnSpec:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(f"{self.name} has no column {name!r}")

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def primary_key(self) -> tuple[str, ...]:
        for idx in self.indexes:
            if idx.primary:
                return idx.columns
        return ()

    @property
    def clustered(self) -> bool:
        """Rows are keyed by the primary key in TiKV (TiDB's default clustered index).

        Otherwise rows are keyed by a hidden ``_tidb_rowid`` that survives key changes, which
        decides whether a key change reaches TiCDC as one update or as a delete plus an insert.
        """
        return bool(self.primary_key)

    @property
    def split_key_columns(self) -> frozenset[str]:
        """Columns of the primary key and of NOT NULL unique keys.

        TiCDC sends an UPDATE that changes any of them as a DELETE plus an INSERT.
        """
        cols: set[str] = set()
        for idx in self.indexes:
            if idx.primary or (idx.unique and all(not self.column(c).nullable for c in idx.columns)):
                cols.update(idx.columns)
        return frozenset(cols)

    @property
    def unique_indexes(self) -> list[IndexSpec]:
        return [idx for idx in self.indexes if idx.primary or idx.unique]

    @property
    def partitioned(self) -> bool:
        return bool(self.partition_ids)

    def physical_id(self, row: dict[str, Any]) -> int | None:
        """The physical table id of the partition holding ``row`` (None if not partitioned).

        ``PARTITION BY HASH(col)`` puts a row in partition ``MOD(col, n)``; the workload keeps
        the partitioning column positive, where TiDB, MySQL and MariaDB agree.
        """
        if not self.partition_ids:
            return None
        assert self.partition_column is not None
        return self.partition_ids[int(row[self.partition_column]) % len(self.partition_ids)]

    def with_column(self, col: ColumnSpec) -> TableSpec:
        """The table after ``ALTER TABLE ... ADD COLUMN`` (appended last, as MySQL does)."""
        return replace(self, columns=(*self.columns, col))

    def create_table_sql(self) -> str:
        """The CREATE TABLE text the DDL event carries: an unqualified name, as users write it."""
        parts = [c.definition_sql() for c in self.columns]
        for idx in self.indexes:
            cols = ", ".join(quote_ident(c) for c in idx.columns)
            if idx.primary:
                parts.append(f"PRIMARY KEY ({cols})")
            elif idx.unique:
                parts.append(f"UNIQUE KEY {quote_ident(idx.name)} ({cols})")
            else:
                parts.append(f"KEY {quote_ident(idx.name)} ({cols})")
        body = ", ".join(parts)
        sql = (
            f"CREATE TABLE {quote_ident(self.name)} ({body}) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        if self.partition_ids:
            assert self.partition_column is not None
            column = quote_ident(self.partition_column)
            sql += f" PARTITION BY HASH ({column}) PARTITIONS {len(self.partition_ids)}"
        return sql


def _choose_handle_index(table: TableSpec) -> IndexSpec | None:
    """TiCDC's choice: the primary key, else the NOT NULL unique index with the fewest columns
    (ties: the one declared first)."""
    best: IndexSpec | None = None
    for idx in table.indexes:
        if idx.primary:
            return idx
        if not idx.unique or any(table.column(c).nullable for c in idx.columns):
            continue
        if best is None or len(idx.columns) < len(best.columns):
            best = idx
    return best


def _column_flags(table: TableSpec, handle: IndexSpec | None) -> dict[str, int]:
    """Flags as TiCDC computes them from TiDB's column and index metadata.

    TiDB itself marks only the first column of an index (unique key flag for single-column
    unique indexes, multiple key flag otherwise); TiCDC then marks every column of every index:
    primary key or unique key, multiple key when the index has several columns, handle key for
    the handle index.
    """
    flags: dict[str, int] = {}
    for col in table.columns:
        f = 0
        if col.binary_charset:
            f |= FLAG_BINARY
        if col.is_generated:
            f |= FLAG_GENERATED
        if col.nullable:
            f |= FLAG_NULLABLE
        if col.unsigned:
            f |= FLAG_UNSIGNED
        flags[col.name] = f
    for idx in table.indexes:
        first = idx.columns[0]
        if idx.primary:
            pass
        elif idx.unique and len(idx.columns) == 1:
            flags[first] |= FLAG_UNIQUE_KEY
        else:
            flags[first] |= FLAG_MULTIPLE_KEY
        for name in idx.columns:
            if idx.primary:
                flags[name] |= FLAG_PRIMARY_KEY
            elif idx.unique:
                flags[name] |= FLAG_UNIQUE_KEY
            if len(idx.columns) > 1:
                flags[name] |= FLAG_MULTIPLE_KEY
            if handle is not None and idx is handle:
                flags[name] |= FLAG_HANDLE_KEY
    return flags


# ---------------------------------------------------------------------------------------------
# The workload's tables.

_INT_RANGES = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "MEDIUMINT": (-(2**23), 2**23 - 1),
    "INT": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
    "INT UNSIGNED": (0, 2**32 - 1),
    "BIGINT UNSIGNED": (0, 2**64 - 1),
}
_INT_CODES = {"TINYINT": TYPE_TINY, "SMALLINT": TYPE_SHORT, "MEDIUMINT": TYPE_INT24, "INT": TYPE_LONG}

ENUM_MEMBERS = ("small", "medium", "large", "x-large")
SET_MEMBERS = ("red", "green", "blue", "alpha")


def int_column(
    name: str,
    sql_type: str,
    *,
    nullable: bool = True,
    default_sql: str | None = None,
    default: Any = None,
    int_range: tuple[int, int] | None = None,
) -> ColumnSpec:
    """An integer column; ``sql_type`` is one of TINYINT, SMALLINT, MEDIUMINT, INT, BIGINT
    with an optional `` UNSIGNED``."""
    base = sql_type.replace(" UNSIGNED", "")
    return ColumnSpec(
        name=name,
        sql_type=sql_type,
        type_code=_INT_CODES.get(base, TYPE_LONGLONG),
        kind=Kind.INT,
        nullable=nullable,
        binary_charset=True,
        unsigned=sql_type.endswith("UNSIGNED"),
        int_range=int_range or _INT_RANGES[sql_type],
        default_sql=default_sql,
        default=default,
    )


def _members_column(name: str, kind: Kind, members: tuple[str, ...]) -> ColumnSpec:
    """An ENUM or SET column (``kind``): its SQL type lists ``members`` in order, which is what
    gives each its index (ENUM) or bit (SET) on the wire."""
    keyword, type_code = ("ENUM", TYPE_ENUM) if kind is Kind.ENUM else ("SET", TYPE_SET)
    sql_type = keyword + "(" + ",".join(f"'{m}'" for m in members) + ")"
    return ColumnSpec(name, sql_type, type_code, kind, members=members)


def _all_types() -> TableSpec:
    b = True  # binary charset, for readability below
    cols = (
        int_column("id", "BIGINT", nullable=False, int_range=(1, 2**40)),
        int_column("c_tinyint", "TINYINT"),
        int_column("c_smallint", "SMALLINT"),
        int_column("c_mediumint", "MEDIUMINT"),
        int_column("c_int", "INT", nullable=False, default_sql="0"),
        int_column("c_int_u", "INT UNSIGNED"),
        int_column("c_bigint", "BIGINT"),
        int_column("c_bigint_u", "BIGINT UNSIGNED"),
        ColumnSpec("c_float", "FLOAT", TYPE_FLOAT, Kind.FLOAT32, binary_charset=b),
        ColumnSpec("c_double", "DOUBLE", TYPE_DOUBLE, Kind.FLOAT64, binary_charset=b),
        ColumnSpec("c_decimal", "DECIMAL(20,6)", TYPE_NEWDECIMAL, Kind.DECIMAL, binary_charset=b, scale=6),
        ColumnSpec("c_date", "DATE", TYPE_DATE, Kind.DATE, binary_charset=b),
        ColumnSpec("c_datetime", "DATETIME(6)", TYPE_DATETIME, Kind.DATETIME, binary_charset=b, fsp=6),
        ColumnSpec("c_timestamp", "TIMESTAMP", TYPE_TIMESTAMP, Kind.TIMESTAMP, binary_charset=b),
        ColumnSpec("c_time", "TIME", TYPE_TIME, Kind.TIME, binary_charset=b),
        ColumnSpec("c_year", "YEAR", TYPE_YEAR, Kind.YEAR, binary_charset=b, int_range=(1901, 2155)),
        ColumnSpec("c_char", "CHAR(16)", TYPE_STRING, Kind.TEXT, max_len=16),
        ColumnSpec("c_varchar", "VARCHAR(255)", TYPE_VARCHAR, Kind.TEXT, max_len=255),
        ColumnSpec("c_binary", "BINARY(8)", TYPE_STRING, Kind.BYTES, binary_charset=b, max_len=8),
        ColumnSpec("c_varbinary", "VARBINARY(255)", TYPE_VARCHAR, Kind.BYTES, binary_charset=b, max_len=255),
        ColumnSpec("c_tinyblob", "TINYBLOB", TYPE_TINY_BLOB, Kind.BLOB, binary_charset=b, max_len=255),
        ColumnSpec("c_blob", "BLOB", TYPE_BLOB, Kind.BLOB, binary_charset=b, max_len=65535),
        ColumnSpec(
            "c_mediumblob", "MEDIUMBLOB", TYPE_MEDIUM_BLOB, Kind.BLOB, binary_charset=b, max_len=2**24 - 1
        ),
        ColumnSpec("c_longblob", "LONGBLOB", TYPE_LONG_BLOB, Kind.BLOB, binary_charset=b, max_len=2**32 - 1),
        ColumnSpec("c_tinytext", "TINYTEXT", TYPE_TINY_BLOB, Kind.TEXT_BLOB, max_len=255),
        ColumnSpec("c_text", "TEXT", TYPE_BLOB, Kind.TEXT_BLOB, max_len=65535),
        ColumnSpec("c_mediumtext", "MEDIUMTEXT", TYPE_MEDIUM_BLOB, Kind.TEXT_BLOB, max_len=2**24 - 1),
        ColumnSpec("c_longtext", "LONGTEXT", TYPE_LONG_BLOB, Kind.TEXT_BLOB, max_len=2**32 - 1),
        ColumnSpec("c_bit", "BIT(64)", TYPE_BIT, Kind.BIT, binary_charset=b, int_range=(0, 2**64 - 1)),
        _members_column("c_enum", Kind.ENUM, ENUM_MEMBERS),
        _members_column("c_set", Kind.SET, SET_MEMBERS),
        ColumnSpec("c_json", "JSON", TYPE_JSON, Kind.JSON, binary_charset=b),
        ColumnSpec(
            "c_gen",
            "BIGINT",
            TYPE_LONGLONG,
            Kind.INT,
            binary_charset=b,
            generated="`id` * 2",
            int_range=_INT_RANGES["BIGINT"],
        ),
    )
    indexes = (
        IndexSpec("PRIMARY", ("id",), primary=True),
        IndexSpec("idx_int_small", ("c_int", "c_smallint")),
    )
    return TableSpec("all_types", cols, indexes)


def _composite() -> TableSpec:
    cols = (
        int_column("a", "INT", nullable=False, int_range=(1, 40)),
        ColumnSpec("b", "VARCHAR(32)", TYPE_VARCHAR, Kind.TEXT, nullable=False, max_len=32),
        int_column("u", "INT", nullable=False, int_range=(1, 10**6)),
        ColumnSpec("val", "VARCHAR(64)", TYPE_VARCHAR, Kind.TEXT, max_len=64),
    )
    indexes = (IndexSpec("PRIMARY", ("a", "b"), primary=True), IndexSpec("uk_u", ("u",), unique=True))
    return TableSpec("composite", cols, indexes)


def _uniq_only() -> TableSpec:
    cols = (
        int_column("u", "BIGINT", nullable=False),
        ColumnSpec("alt", "VARCHAR(32)", TYPE_VARCHAR, Kind.TEXT, max_len=32),
        int_column("v1", "INT"),
        ColumnSpec("v2", "VARCHAR(64)", TYPE_VARCHAR, Kind.TEXT, max_len=64),
    )
    indexes = (IndexSpec("uk_u", ("u",), unique=True), IndexSpec("uk_alt", ("alt",), unique=True))
    return TableSpec("uniq_only", cols, indexes)


def _keyless() -> TableSpec:
    cols = (
        int_column("k", "INT"),
        ColumnSpec("v", "VARCHAR(32)", TYPE_VARCHAR, Kind.TEXT, max_len=32),
        ColumnSpec("n", "DOUBLE", TYPE_DOUBLE, Kind.FLOAT64, binary_charset=True),
    )
    return TableSpec("keyless", cols, ())


# Physical table ids of ``ptbl``'s four partitions: TiDB allocates partition ids from the same
# sequence as table ids, right after the logical table's own id (here 120).
PARTITIONED_TABLE = "ptbl"
PARTITION_IDS = (121, 122, 123, 124)


def _ptbl() -> TableSpec:
    cols = (
        int_column("id", "INT", nullable=False, int_range=(1, 2**31 - 1)),
        ColumnSpec("name", "VARCHAR(32)", TYPE_VARCHAR, Kind.TEXT, max_len=32),
        int_column("qty", "INT"),
        ColumnSpec("note", "VARCHAR(64)", TYPE_VARCHAR, Kind.TEXT, max_len=64),
    )
    indexes = (IndexSpec("PRIMARY", ("id",), primary=True),)
    return TableSpec(PARTITIONED_TABLE, cols, indexes, partition_column="id", partition_ids=PARTITION_IDS)


LATE_TABLE = "late_tbl"


def late_table() -> TableSpec:
    """The table the new architecture's mid-stream ``CREATE TABLE`` adds (after the ALTER's ts)."""
    cols = (
        int_column("id", "INT", nullable=False, int_range=(1, 2**31 - 1)),
        ColumnSpec("label", "VARCHAR(32)", TYPE_VARCHAR, Kind.TEXT, max_len=32),
    )
    return TableSpec(LATE_TABLE, cols, (IndexSpec("PRIMARY", ("id",), primary=True),))


BULK_TABLE = "bulk"


def bulk_table() -> TableSpec:
    """The table of the huge transactions (``StreamConfig.huge_transaction``): a primary key, a
    NOT NULL unique key (changing it splits an update) and a nullable one (a plain update)."""
    cols = (
        int_column("id", "INT", nullable=False, int_range=(1, 2**31 - 1)),
        int_column("u", "INT", nullable=False, int_range=(1, 2**31 - 1)),
        int_column("w", "INT", int_range=(1, 2**31 - 1)),
        ColumnSpec("label", "VARCHAR(32)", TYPE_VARCHAR, Kind.TEXT, max_len=32),
    )
    indexes = (
        IndexSpec("PRIMARY", ("id",), primary=True),
        IndexSpec("uk_u", ("u",), unique=True),
        IndexSpec("uk_w", ("w",), unique=True),
    )
    return TableSpec(BULK_TABLE, cols, indexes)


WIDE_TABLE = "wide"


def _wide() -> TableSpec:
    """Rows of several hundred kilobytes to a few megabytes: events larger than max-message-bytes,
    which TiCDC sends as claim-check references or with their handle-key columns only."""
    b = True
    cols = (
        int_column("id", "BIGINT", nullable=False, int_range=(1, 2**40)),
        ColumnSpec("title", "VARCHAR(64)", TYPE_VARCHAR, Kind.TEXT, max_len=64),
        ColumnSpec("body", "LONGTEXT", TYPE_LONG_BLOB, Kind.TEXT_BLOB, max_len=2**32 - 1),
        ColumnSpec("data", "LONGBLOB", TYPE_LONG_BLOB, Kind.BLOB, binary_charset=b, max_len=2**32 - 1),
        ColumnSpec("note", "MEDIUMTEXT", TYPE_MEDIUM_BLOB, Kind.TEXT_BLOB, max_len=2**24 - 1),
    )
    return TableSpec(WIDE_TABLE, cols, (IndexSpec("PRIMARY", ("id",), primary=True),))


def workload_tables(
    include_keyless: bool = True, partitioned: bool = False, wide: bool = False
) -> list[TableSpec]:
    """The simulated tables at their initial version, in creation order.

    ``keyless`` is left out when the changefeed settings make keyless tables impossible to
    replicate (TiCDC requires the old value for them and cannot send a handle-key-only delete).
    ``ptbl`` (``PARTITION BY HASH``, four physical partitions) is added when ``partitioned``,
    ``wide`` (multi-megabyte TEXT and BLOB values) when ``wide``.
    """
    tables = [_all_types(), _composite(), _uniq_only()]
    if include_keyless:
        tables.append(_keyless())
    if partitioned:
        tables.append(_ptbl())
    if wide:
        tables.append(_wide())
    return tables


def simulated_table_names() -> frozenset[str]:
    """Every table name the simulator may create, whatever its options: how ``applier demo``
    recognises a schema it made (it drops that schema at every run, and no other)."""
    every = workload_tables(include_keyless=True, partitioned=True, wide=True)
    return frozenset({t.name for t in every} | {LATE_TABLE, BULK_TABLE})


ADDED_COLUMN_TABLE = "composite"
ADDED_COLUMN = int_column("extra", "INT", nullable=False, default_sql="7", default=7, int_range=(-1000, 1000))


def add_column_sql(table: str, col: ColumnSpec) -> str:
    """The ALTER TABLE text of the mid-stream DDL event."""
    return f"ALTER TABLE {quote_ident(table)} ADD COLUMN {col.definition_sql()}"

"""SQL generation for ticdc-applier: pure functions from decoded events to SQL text + params.

Nothing here opens a connection or keeps global state, so the daemon (per window) and the Spark
catch-up job (per DDL epoch, on executors) share it; every result is plain picklable data.

- :mod:`sqlgen.quoting` — identifier quoting.
- :mod:`sqlgen.dialect` — per-server behaviour as data (MYSQL, MARIADB, TIDB).
- :mod:`sqlgen.collapse` — a window of row events -> final row states per table.
- :mod:`sqlgen.dml` — plan -> parameterised DELETE / REPLACE / INSERT statements.
- :mod:`sqlgen.ddl` — which DDL to run and how; TiDB-only clause removal.
- :mod:`sqlgen.route` — routing rules: upstream schema/table -> downstream names.
- :mod:`sqlgen.ddl_route` — DDL text with its names routed.
- :mod:`sqlgen.errors` — MySQL error code classification.
"""

from sqlgen.collapse import (
    DeleteGroup,
    KeylessOp,
    PlanError,
    TablePlan,
    UpsertGroup,
    WindowPlan,
    plan_table,
    plan_window,
    split_phases,
    update_keeps_key,
    upsert_group,
)
from sqlgen.ddl import SCHEMA_DDL_TYPES, SKIP_DDL_TYPES, DDLPlan, plan_ddl, translate_ddl
from sqlgen.ddl_route import route_ddl
from sqlgen.dialect import MARIADB, MYSQL, TIDB, Dialect, dialect_by_name
from sqlgen.dml import Statement, statement_too_large, statements, table_statements
from sqlgen.errors import (
    ALREADY_APPLIED_DDL_ERRORS,
    BINLOG_CACHE_FULL,
    NEVER_RETRY_DDL_ERRORS,
    TRANSIENT_CLASSES,
    TRANSIENT_ERRORS,
    ErrorClass,
    classify_ddl_error,
    transient_class,
)
from sqlgen.quoting import quote_ident, quote_ident_fmt, quote_table, quote_table_fmt
from sqlgen.route import RouteError, Router, RouteRuleError

__all__ = [
    "ALREADY_APPLIED_DDL_ERRORS",
    "BINLOG_CACHE_FULL",
    "MARIADB",
    "MYSQL",
    "NEVER_RETRY_DDL_ERRORS",
    "SCHEMA_DDL_TYPES",
    "SKIP_DDL_TYPES",
    "TIDB",
    "TRANSIENT_CLASSES",
    "TRANSIENT_ERRORS",
    "DDLPlan",
    "DeleteGroup",
    "Dialect",
    "ErrorClass",
    "KeylessOp",
    "PlanError",
    "RouteError",
    "RouteRuleError",
    "Router",
    "Statement",
    "TablePlan",
    "UpsertGroup",
    "WindowPlan",
    "classify_ddl_error",
    "dialect_by_name",
    "plan_ddl",
    "plan_table",
    "plan_window",
    "quote_ident",
    "quote_ident_fmt",
    "quote_table",
    "quote_table_fmt",
    "route_ddl",
    "split_phases",
    "statement_too_large",
    "statements",
    "table_statements",
    "transient_class",
    "translate_ddl",
    "update_keeps_key",
    "upsert_group",
]

"""A MariaDB stand-in for the upstream TiDB of handle-key-only events: history you can read as of a ts.

TiDB answers ``SET @@tidb_snapshot = TS`` with the data as of that TSO; MariaDB has no such
variable, but its system-versioned tables keep every version of a row with the time it was
written, and that time can be set per statement (``SET timestamp``). So the simulated upstream's
history is written with each commit ts mapped to a time (:func:`ts_seconds`), and the applier's
one historical read (``applier.large_messages.upstream.select_as_of``) is replaced, in the
process this module starts, by :func:`select_as_of_system_time`, which reads ``FOR SYSTEM_TIME AS
OF`` that time. Everything else (batching, key matching, text values, errors) is the product's.

Run as ``python -m tests.integration.versioned_upstream run ...`` (what ``Changefeed.module``
selects): the same command line as ``python -m applier``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from applier.simulator import Simulation
from sqlgen.quoting import quote_ident, quote_table

UPSTREAM_SUFFIX = "_upstream"
"""The upstream copy of schema S is S_upstream: upstream and downstream share one test server."""


def ts_seconds(ts: int) -> str:
    """The time a commit ts is written at: its physical milliseconds plus its logical part as
    microseconds (the simulator's logical parts stay below 1000), so commit order is time order
    and ``ts - 1`` maps before ``ts``."""
    physical, logical = ts >> 18, min(ts & 0x3FFFF, 999)
    micros = physical * 1000 + logical
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


def select_as_of_system_time(
    cur: Any, ts: int, schema: str, table: str, where: str, params: Sequence[Any]
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """``select_as_of`` for a MariaDB upstream of system-versioned tables (module docstring)."""
    from applier.large_messages.upstream import table_columns

    up = schema + UPSTREAM_SUFFIX
    names = table_columns(cur, up, table)
    if not names:
        return [], []
    cur.execute(
        f"SELECT {', '.join(map(quote_ident, names))} FROM {quote_table(up, table)} "
        f"FOR SYSTEM_TIME AS OF TIMESTAMP FROM_UNIXTIME({ts_seconds(ts)}) WHERE {where}",
        tuple(params),
    )
    return names, list(cur.fetchall())


def load_history(conn: Any, sim: Simulation, tables: Iterable[str]) -> str:
    """Write the history of ``tables`` into system-versioned tables of ``<schema>_upstream``.

    Each change is written at its commit ts's time, so a read as of a ts sees the table as the
    simulated upstream had it then. Returns the upstream schema name.
    """
    wanted = set(tables)
    up = sim.schema + UPSTREAM_SUFFIX
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {quote_ident(up)}")
        cur.execute(f"CREATE DATABASE {quote_ident(up)}")
        cur.execute("SET SESSION system_versioning_alter_history = KEEP")
        keys: dict[str, tuple[str, ...]] = {}
        try:
            for step in sim.steps:
                cur.execute(f"SET timestamp = {ts_seconds(step.ts)}")
                if step.kind in ("create", "add_column") and step.table in wanted and step.spec is not None:
                    spec = step.spec
                    if step.kind == "create":
                        cur.execute(f"USE {quote_ident(up)}")
                        cur.execute(spec.create_table_sql() + " WITH SYSTEM VERSIONING")
                    else:
                        col = spec.columns[-1]
                        cur.execute(
                            f"ALTER TABLE {quote_table(up, step.table)} ADD COLUMN {col.definition_sql()}"
                        )
                    primary = next(i for i in spec.indexes if i.primary)
                    keys[step.table] = tuple(primary.columns)
                    continue
                for change in step.changes:
                    if change.table not in wanted:
                        continue
                    _write(cur, quote_table(up, change.table), keys[change.table], change)
        finally:
            cur.execute("SET timestamp = DEFAULT")
    return up


def _write(cur: Any, table: str, key: tuple[str, ...], change: Any) -> None:
    if change.old is not None and change.kind != "insert":
        where = " AND ".join(f"{quote_ident(k)} = %s" for k in key)
        cur.execute(f"DELETE FROM {table} WHERE {where}", tuple(change.old[k] for k in key))
    if change.new is not None:
        names = list(change.new)
        cols, marks = ", ".join(map(quote_ident, names)), ", ".join(["%s"] * len(names))
        cur.execute(
            f"INSERT INTO {table} ({cols}) VALUES ({marks})",
            tuple(change.new[n] for n in names),
        )


def main(argv: list[str] | None = None) -> int:
    import applier.large_messages.upstream as upstream
    from applier.cli import main as applier_main

    upstream.select_as_of = select_as_of_system_time  # type: ignore[assignment]
    return applier_main(argv)


if __name__ == "__main__":
    sys.exit(main())

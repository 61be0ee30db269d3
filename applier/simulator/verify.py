"""Compare a downstream database with the simulated upstream as of a resolved ts.

After an applier has consumed a simulated stream up to some resolved ts, the workload tables
downstream must equal :meth:`Simulation.expected_snapshot` at that ts: same rows (as multisets
for the keyless table, which may hold identical rows), same values, generated columns included
(the database computes those). Without ``rid`` a consumer cannot tell a re-sent keyless row from
a second identical one (see :attr:`Simulation.exact_keyless`): a replayed insert adds a row, a
replayed delete or update removes a second identical one (docs/open-protocol.md §5.6), so no
comparison of their rows holds; ``keyless_rows=False`` then checks only their columns.

The driver returns values in its own types - ``Decimal``, ``datetime``, ``timedelta``, BIT as
bytes, ENUM and SET as member names - so every value is first normalised to the model's
representation (see ``tables.Kind``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from applier.simulator.model import Simulation
from applier.simulator.tables import ColumnSpec, Kind, TableSpec, quote_ident
from applier.simulator.values import format_time

__all__ = ["compare_downstream", "normalize_db_value"]


def normalize_db_value(col: ColumnSpec, value: Any) -> Any:
    """A value as pymysql returns it, converted to the model's representation of ``col``."""
    if value is None:
        return None
    kind = col.kind
    if kind in (Kind.INT, Kind.YEAR):
        return int(value)
    if kind is Kind.BIT:
        return int.from_bytes(value, "big") if isinstance(value, bytes | bytearray) else int(value)
    if kind in (Kind.FLOAT32, Kind.FLOAT64):
        return float(value)
    if kind is Kind.DECIMAL:
        dec = value if isinstance(value, Decimal) else Decimal(str(value))
        return format(dec.quantize(Decimal(1).scaleb(-col.scale)), "f") if col.scale else format(dec, "f")
    if kind is Kind.DATE:
        return value.isoformat() if isinstance(value, dt.date) else str(value)
    if kind in (Kind.DATETIME, Kind.TIMESTAMP):
        if isinstance(value, dt.datetime):
            text = value.strftime("%Y-%m-%d %H:%M:%S")
            if col.fsp:
                text += "." + f"{value.microsecond:06d}"[: col.fsp]
            return text
        return str(value)
    if kind is Kind.TIME:
        if isinstance(value, dt.timedelta):
            return format_time(int(value.total_seconds()))
        return str(value)
    if kind in (Kind.TEXT, Kind.TEXT_BLOB, Kind.JSON):
        text = value.decode("utf-8") if isinstance(value, bytes | bytearray) else str(value)
        return _canonical_json(text) if kind is Kind.JSON else text
    if kind in (Kind.BYTES, Kind.BLOB):
        return bytes(value) if not isinstance(value, str) else value.encode("utf-8")
    if kind is Kind.ENUM:
        if isinstance(value, int):
            return value
        return col.members.index(value) + 1 if value in col.members else 0
    if kind is Kind.SET:
        if isinstance(value, int):
            return value
        names = value if isinstance(value, set | frozenset) else [m for m in str(value).split(",") if m]
        return sum(1 << col.members.index(m) for m in names)
    raise AssertionError(kind)  # pragma: no cover


def _canonical_json(text: str) -> str:
    """JSON compared by meaning: MySQL reformats JSON documents, MariaDB stores the text."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return text


def _expected_value(col: ColumnSpec, value: Any) -> Any:
    if value is not None and col.kind is Kind.JSON:
        return _canonical_json(value)
    return value


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_text(names: tuple[str, ...], values: tuple) -> str:
    return "(" + ", ".join(f"{n}={_show(v, 40)}" for n, v in zip(names, values, strict=True)) + ")"


def compare_downstream(
    conn: Any,
    sim: Simulation,
    ts: int,
    schema_map: Mapping[str, str] | None = None,
    *,
    time_zone: str = "+00:00",
    max_differences: int = 50,
    keyless_rows: bool = True,
) -> list[str]:
    """Differences between the downstream workload tables and the upstream state as of ``ts``.

    ``conn`` is a pymysql connection (a dedicated one: an open transaction is committed so that
    the comparison sees the latest data, and the session time zone is set to ``time_zone`` -
    the producer's zone, UTC for the simulator - while reading, then restored). ``schema_map``
    maps the upstream schema name to the downstream one. With ``keyless_rows=False``, the rows
    of tables without a handle key are not compared (their columns still are). Returns
    human-readable lines; an empty list means the downstream equals the upstream.
    """
    schema_map = schema_map or {}
    down_schema = schema_map.get(sim.schema, sim.schema)
    expected = sim.expected_snapshot(ts)
    specs_at = sim.tables_at(ts)
    all_tables = sim.tables_at(sim.final_resolved_ts)
    diffs: list[str] = []
    if not conn.get_autocommit():
        conn.commit()
    with conn.cursor() as cur:
        cur.execute("SELECT @@session.time_zone")
        saved_zone = cur.fetchone()[0]
        cur.execute("SET time_zone = %s", (time_zone,))
        try:
            for name in all_tables:
                spec = specs_at.get(name)
                label = f"{down_schema}.{name}"
                actual_cols = _downstream_columns(cur, down_schema, name)
                if spec is None:
                    if actual_cols:
                        diffs.append(
                            f"{label}: exists downstream but was created upstream only after ts {ts}"
                        )
                    continue
                if not actual_cols:
                    diffs.append(f"{label}: table missing downstream")
                    continue
                rows = expected[(sim.schema, name)]
                diffs.extend(
                    _compare_table(
                        cur, label, down_schema, spec, actual_cols, rows, max_differences, keyless_rows
                    )
                )
        finally:
            cur.execute("SET time_zone = %s", (saved_zone,))
    return diffs


def _downstream_columns(cur: Any, schema: str, table: str) -> list[str]:
    cur.execute(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "ORDER BY ORDINAL_POSITION",
        (schema, table),
    )
    return [r[0] for r in cur.fetchall()]


def _compare_table(
    cur: Any,
    label: str,
    schema: str,
    spec: TableSpec,
    actual_cols: list[str],
    expected_rows: list[dict[str, Any]],
    max_differences: int,
    keyless_rows: bool,
) -> list[str]:
    diffs: list[str] = []
    expected_cols = spec.column_names
    missing = [c for c in expected_cols if c not in actual_cols]
    extra = [c for c in actual_cols if c not in expected_cols]
    if missing:
        diffs.append(f"{label}: columns missing downstream: {', '.join(missing)}")
    if extra:
        diffs.append(f"{label}: unexpected columns downstream: {', '.join(extra)}")
    cols = [spec.column(c) for c in expected_cols if c in actual_cols]
    col_list = ", ".join(quote_ident(c.name) for c in cols)
    cur.execute(f"SELECT {col_list} FROM {quote_ident(schema)}.{quote_ident(spec.name)}")
    actual = [
        tuple(normalize_db_value(c, v) for c, v in zip(cols, row, strict=True)) for row in cur.fetchall()
    ]
    wanted = [tuple(_expected_value(c, row[c.name]) for c in cols) for row in expected_rows]

    row_diffs: list[str] = []
    names = tuple(c.name for c in cols)
    key_idx = [names.index(k) for k in spec.handle_key if k in names]
    if spec.handle_key and len(key_idx) == len(spec.handle_key):
        row_diffs = _compare_keyed(label, names, key_idx, wanted, actual)
    elif keyless_rows:
        row_diffs = _compare_multiset(label, names, wanted, actual)
    if len(row_diffs) > max_differences:
        row_diffs = [
            *row_diffs[:max_differences],
            f"{label}: ... and {len(row_diffs) - max_differences} more",
        ]
    return diffs + row_diffs


def _compare_keyed(
    label: str, names: tuple[str, ...], key_idx: list[int], wanted: list[tuple], actual: list[tuple]
) -> list[str]:
    key_names = tuple(names[i] for i in key_idx)
    out: list[str] = []
    want_by_key = {tuple(r[i] for i in key_idx): r for r in wanted}
    have_by_key: dict[tuple, tuple] = {}
    for row in actual:
        key = tuple(row[i] for i in key_idx)
        if key in have_by_key:
            out.append(f"{label}: duplicate rows downstream for key {_key_text(key_names, key)}")
        have_by_key[key] = row
    for key, want in want_by_key.items():
        have = have_by_key.get(key)
        if have is None:
            out.append(f"{label}: row {_key_text(key_names, key)} missing downstream")
            continue
        for name, w, h in zip(names, want, have, strict=True):
            if w != h or type(w) is not type(h):
                out.append(
                    f"{label} {_key_text(key_names, key)}: column {name}: expected {_show(w)}, got {_show(h)}"
                )
    for key in have_by_key.keys() - want_by_key.keys():
        out.append(f"{label}: unexpected row {_key_text(key_names, key)} downstream")
    return out


def _compare_multiset(
    label: str, names: tuple[str, ...], wanted: list[tuple], actual: list[tuple]
) -> list[str]:
    want, have = Counter(wanted), Counter(actual)
    out: list[str] = []
    for row, n in (want - have).items():
        out.append(f"{label}: {n} x row {_key_text(names, row)} missing downstream")
    for row, n in (have - want).items():
        out.append(f"{label}: {n} x unexpected row {_key_text(names, row)} downstream")
    return out

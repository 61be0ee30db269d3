"""Hand-written change streams around DDLs, and the downstream state they must leave.

A :class:`Script` is written the way TiCDC's MQ sink sends a changefeed: a DDL event is broadcast
to every partition, row events go to the partition of their table, and after each step every
partition gets a resolved event. Columns are integers only (``t`` 3 or 8), which keeps the
values exact and the encoding independent of the decoder under test.

:func:`snapshot` reads what the tests compare: for every schema, whether it exists, each table's
``SHOW CREATE TABLE`` (columns in order, indexes, partitions; the AUTO_INCREMENT counter aside)
and its rows in a stable order.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from dataclasses import dataclass, field

import pymysql

from applier.simulator.producer import produce_records


@dataclass
class Rec:
    partition: int
    key: bytes
    value: bytes


def _frame(key: dict, value: dict | None) -> tuple[bytes, bytes]:
    kb = json.dumps(key).encode()
    vb = b"" if value is None else json.dumps(value).encode()
    return (
        (1).to_bytes(8, "big") + len(kb).to_bytes(8, "big") + kb,
        len(vb).to_bytes(8, "big") + vb,
    )


def _image(cols: dict[str, int | None], keys: tuple[str, ...]) -> dict:
    out = {}
    for name, v in cols.items():
        col: dict = {"t": 8, "v": v}
        if name in keys:
            col["h"] = True
        out[name] = col
    return out


@dataclass
class Script:
    """A stream under construction; ``steps`` are lists of records produced together."""

    partitions: int = 2
    ts: int = field(default_factory=lambda: (int(time.time() * 1000) - 3_600_000) << 18)
    steps: list[list[Rec]] = field(default_factory=list)

    def _next(self) -> int:
        self.ts += 1 << 18  # one physical millisecond per step
        return self.ts

    def _resolved(self, ts: int) -> list[Rec]:
        k, v = _frame({"ts": ts, "t": 3}, None)
        return [Rec(p, k, v) for p in range(self.partitions)]

    def ddl(self, schema: str, table: str, ddl_type: int, query: str) -> int:
        """One DDL event on every partition, then a resolved event; returns its commit ts."""
        ts = self._next()
        k, v = _frame({"ts": ts, "scm": schema, "tbl": table, "t": 2}, {"q": query, "t": ddl_type})
        self.steps.append([Rec(p, k, v) for p in range(self.partitions)] + self._resolved(ts))
        return ts

    def rows(
        self,
        schema: str,
        table: str,
        *,
        insert: list[dict[str, int | None]] = (),  # type: ignore[assignment]
        update: list[tuple[dict, dict]] = (),  # type: ignore[assignment]
        delete: list[dict[str, int | None]] = (),  # type: ignore[assignment]
        keys: tuple[str, ...] = ("a",),
    ) -> int:
        """One upstream transaction on ``schema.table``, then a resolved event; returns its ts."""
        ts = self._next()
        p = zlib.crc32(f"{schema}.{table}".encode()) % self.partitions
        key = {"ts": ts, "scm": schema, "tbl": table, "t": 1}
        recs = []
        for cols in insert:
            recs.append(Rec(p, *_frame(key, {"u": _image(cols, keys)})))
        for old, new in update:
            recs.append(Rec(p, *_frame(key, {"u": _image(new, keys), "p": _image(old, keys)})))
        for cols in delete:
            recs.append(Rec(p, *_frame(key, {"d": _image(cols, keys)})))
        self.steps.append(recs + self._resolved(ts))
        return ts

    def produce(self, bootstrap: str, topic: str, start: int = 0, stop: int | None = None) -> None:
        """Send steps ``start:stop`` (in order)."""
        records = [r for step in self.steps[start:stop] for r in step]
        produce_records(bootstrap, topic, records)  # type: ignore[arg-type]


_AUTO_INCREMENT = re.compile(r" AUTO_INCREMENT=\d+")


def snapshot(conn: pymysql.connections.Connection, schemas: list[str]) -> dict:
    """Schema -> None (absent) or {table: (SHOW CREATE TABLE, rows)}."""
    out: dict = {}
    with conn.cursor() as cur:
        for schema in schemas:
            cur.execute("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (schema,))
            if not cur.fetchone()[0]:
                out[schema] = None
                continue
            cur.execute(
                "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY 1",
                (schema,),
            )
            tables = {}
            for (name,) in cur.fetchall():
                q = f"`{schema}`.`{name}`"
                cur.execute(f"SHOW CREATE TABLE {q}")
                create = _AUTO_INCREMENT.sub("", cur.fetchone()[1])
                cur.execute(f"SELECT * FROM {q}")
                rows = sorted(tuple(-1 if v is None else v for v in r) for r in cur.fetchall())
                tables[name] = (create, rows)
            out[schema] = tables
    conn.commit()
    return out

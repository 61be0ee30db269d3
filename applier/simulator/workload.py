"""The simulated upstream database: tables in memory and random transactions against them.

The model plays TiDB's part. Each transaction runs a few statements (inserts, updates, deletes,
primary-key changes, unique values moving between rows, the same row touched several times) on a
copy of the touched tables; at commit the model computes what TiKV would hand to TiCDC: one net
change per row, keyed the way TiKV keys rows. That key matters:

* tables with a primary key are clustered (TiDB's default), so the row key *is* the primary key:
  changing it deletes one key and writes another;
* tables without one are keyed by a hidden ``_tidb_rowid`` that survives any value change, so a
  unique-key change arrives as an update of the same row.

TiCDC then splits every update that changes the primary key or a NOT NULL unique key into a
DELETE of the old row and an INSERT of the new one (same commit ts), and orders the deletes of a
transaction first. :func:`Upstream.commit` returns changes in that final form.

The partitioned table ``ptbl`` (when asked for) is written several rows at a time, so that a
transaction touches several physical partitions; changing its primary key moves a row to another
partition: a DELETE in one physical partition and an INSERT in another. ``late_tbl`` is created
mid-stream (:meth:`Upstream.add_table`) and written from then on. ``wide`` (when asked for) holds
a handful of rows of several hundred kilobytes to a few megabytes, inserted, updated, deleted and
moved to another key by about one transaction in ten: events too large for one Kafka message.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from applier.simulator.tables import (
    ADDED_COLUMN,
    ADDED_COLUMN_TABLE,
    BULK_TABLE,
    LATE_TABLE,
    PARTITIONED_TABLE,
    WIDE_TABLE,
    ColumnSpec,
    Kind,
    TableSpec,
    workload_tables,
)
from applier.simulator.values import ValueGenerator

Row = dict[str, Any]
"""A row in the model: column name -> model value, in column order."""

INSERT = "insert"
UPDATE = "update"
DELETE = "delete"

_MAX_ROWS = 40  # per table: keeps tables (and snapshots) small so streams stay fast to check
_WIDE_KEYS = 5  # ids of wide rows: few, so that the same keys are updated, deleted and reused
_WIDE_CHANCE = 0.1  # per random transaction: it also writes one wide row
_COMPOSITE_B = ("k0", "k1", "k2", "k3", "x y", "ключ", "漢字", "a-b", "Z", "z")


@dataclass(slots=True)
class RowChange:
    """The net change of one row in one transaction, as TiCDC sends it (after any split).

    ``row_id`` is TiKV's row key for the ``rid`` key field: the integer handle of clustered
    integer-keyed tables or the hidden ``_tidb_rowid``; ``None`` for other clustered keys.
    """

    table: str
    kind: str  # INSERT | UPDATE | DELETE
    old: Row | None
    new: Row | None
    row_id: int | None = None
    key: Any = None  # the model's row key (primary-key tuple or rowid), to replay changes


@dataclass(slots=True)
class ColumnAdded:
    """Effect of the mid-stream ``ALTER TABLE ... ADD COLUMN``: older rows get the default."""

    table: str
    column: ColumnSpec


class Upstream:
    """In-memory upstream tables plus a seeded generator of transactions against them."""

    def __init__(
        self,
        rng: random.Random,
        *,
        include_keyless: bool = True,
        partitioned: bool = False,
        wide: bool = False,
    ) -> None:
        self.rng = rng
        self.values = ValueGenerator(rng)
        self.specs: dict[str, TableSpec] = {
            t.name: t for t in workload_tables(include_keyless, partitioned, wide)
        }
        # row key -> row; the row key is the primary-key tuple (clustered) or the hidden rowid.
        self.rows: dict[str, dict[Any, Row]] = {name: {} for name in self.specs}
        self._next_rowid = 1
        self._next_id = 1
        # ptbl and late_tbl number their rows apart from all_types, so that adding them leaves
        # the other tables' values unchanged for a given seed.
        self._next_small_id = {PARTITIONED_TABLE: 1, LATE_TABLE: 1}
        self._work: dict[str, dict[Any, Row]] = {}

    # -- schema changes -----------------------------------------------------------------------

    def add_column(self, table: str = ADDED_COLUMN_TABLE, column: ColumnSpec = ADDED_COLUMN) -> ColumnAdded:
        """Apply ``ALTER TABLE table ADD COLUMN column``: existing rows get the column default."""
        self.specs[table] = self.specs[table].with_column(column)
        self.rows[table] = {
            key: {**row, column.name: column.default} for key, row in self.rows[table].items()
        }
        return ColumnAdded(table, column)

    def add_table(self, spec: TableSpec) -> TableSpec:
        """Apply ``CREATE TABLE``: later transactions may write to the (empty) table."""
        self.specs[spec.name] = spec
        self.rows[spec.name] = {}
        return spec

    # -- transactions -------------------------------------------------------------------------

    def random_transaction(self) -> list[RowChange]:
        """Run 1-6 random statements in one transaction and return its net changes.

        May return an empty list (for example an insert and a delete of the same row).
        """
        self._work = {}
        # The statements one table's rows can take, and how often; deletes and swaps of a unique
        # value are the same for every table (helpers taking the table's name).
        delete, swap = self._delete_random, self._swap
        weighted: list[tuple[Callable[[], None], int]] = [
            (self._op_all_types_insert, 5), (self._op_all_types_update, 6), (partial(delete, "all_types"), 2),
            (self._op_all_types_pk_change, 1), (self._op_all_types_touch_twice, 1),
            (self._op_all_types_reinsert, 1),
            (self._op_composite_insert, 4), (self._op_composite_update, 4), (self._op_composite_move_u, 1),
            (partial(swap, "composite", "u"), 1), (self._op_composite_pk_change, 1),
            (partial(delete, "composite"), 2),
            (self._op_uniq_insert, 4), (self._op_uniq_update, 4), (partial(swap, "uniq_only", "u"), 1),
            (self._op_uniq_swap_alt, 1), (partial(delete, "uniq_only"), 2),
        ]  # fmt: skip
        if "keyless" in self.specs:
            weighted += [
                (self._op_keyless_insert, 4),
                (self._op_keyless_update, 3),
                (partial(delete, "keyless"), 2),
            ]
        if PARTITIONED_TABLE in self.specs:
            weighted += [
                (self._op_ptbl_insert, 4),
                (self._op_ptbl_update, 4),
                (self._op_ptbl_pk_change, 2),
                (partial(delete, PARTITIONED_TABLE), 2),
            ]
        if LATE_TABLE in self.specs:
            weighted += [
                (self._op_late_insert, 3),
                (self._op_late_update, 2),
                (partial(delete, LATE_TABLE), 1),
            ]
        if self.rng.random() < 0.04:
            weighted = [(self._op_bulk_update, 1)]  # one statement touching a whole table
        ops, weights = zip(*weighted, strict=True)
        for op in self.rng.choices(ops, weights, k=self.rng.randint(1, 6)):
            op()
        if WIDE_TABLE in self.specs and self.rng.random() < _WIDE_CHANCE:
            self._op_wide()
        return self.commit()

    def bulk_transaction(self, rows: int) -> list[RowChange]:
        """One transaction of about ``rows`` row changes on ``bulk`` (TiCDC sends such a
        transaction whole when ``transaction-atomicity`` keeps it together), plus a few statements
        of the usual mix on the other tables.

        The first fills the table. Later ones go over its rows in pairs: delete one and update
        the other, move a row to a fresh primary key, give a row the primary key of a row deleted
        in the same transaction (a DELETE and an INSERT of one key at one ts), swap the NOT NULL
        unique values (split updates) or the nullable ones (plain updates), or change a label.
        """
        self._work = {}
        spec = self.specs[BULK_TABLE]
        table = self._table(BULK_TABLE)
        label = spec.column("label")
        if not table:
            for i in range(1, rows + 1):
                table[(i,)] = {"id": i, "u": i, "w": i, "label": self.values.value(label)}
        else:
            keys = sorted(table)[: rows // 2 * 2]
            fresh = max(k[0] for k in table) + 1
            for j in range(0, len(keys) - 1, 2):
                a, b = keys[j], keys[j + 1]
                ra, rb = table[a], table[b]
                step = (j // 2) % 6
                if step == 0:
                    del table[a]
                    table[b] = dict(rb, label=self.values.value(label))
                elif step == 1:
                    del table[a]
                    table[(fresh,)] = dict(ra, id=fresh)
                    fresh += 1
                elif step == 2:
                    del table[a]
                    table[b] = dict(ra, id=rb["id"])  # b's key now holds a's values (u too)
                elif step == 3:
                    table[a], table[b] = dict(ra, u=rb["u"]), dict(rb, u=ra["u"])
                elif step == 4:
                    table[a], table[b] = dict(ra, w=rb["w"]), dict(rb, w=ra["w"])
                else:
                    table[a] = dict(ra, label=self.values.value(label))
        self._swap("composite", "u")
        self._op_composite_pk_change()
        self._swap("uniq_only", "u")
        if "keyless" in self.specs:
            self._op_keyless_insert()
            self._delete_random("keyless")
        return self.commit()

    def commit(self) -> list[RowChange]:
        """Make the working copies current and return the net changes, deletes first."""
        changes: list[RowChange] = []
        for table, after in self._work.items():
            spec = self.specs[table]
            before = self.rows[table]
            for key in list(dict.fromkeys([*before, *after])):
                old, new = before.get(key), after.get(key)
                if old == new:
                    continue
                rid = self._row_id(spec, key, old or new)
                if old is None:
                    changes.append(RowChange(table, INSERT, None, new, rid, key))
                elif new is None:
                    changes.append(RowChange(table, DELETE, old, None, rid, key))
                elif any(old[c] != new[c] for c in spec.split_key_columns):
                    changes.append(RowChange(table, DELETE, old, None, rid, key))
                    changes.append(RowChange(table, INSERT, None, new, rid, key))
                else:
                    changes.append(RowChange(table, UPDATE, old, new, rid, key))
            self.rows[table] = after
        self._work = {}
        changes.sort(key=lambda c: c.kind != DELETE)  # stable: deletes first, then the rest in order
        return changes

    @staticmethod
    def _row_id(spec: TableSpec, key: Any, row: Row) -> int | None:
        if not spec.clustered:
            return int(key)
        pk = spec.primary_key
        if len(pk) == 1 and spec.column(pk[0]).kind is Kind.INT:
            return int(row[pk[0]])
        return None

    # -- helpers ------------------------------------------------------------------------------

    def _table(self, name: str) -> dict[Any, Row]:
        """The transaction's working copy of a table (rows are replaced, never mutated)."""
        if name not in self._work:
            self._work[name] = dict(self.rows[name])
        return self._work[name]

    def _pick(self, name: str) -> tuple[Any, Row] | None:
        rows = self._table(name)
        if not rows:
            return None
        key = self.rng.choice(list(rows))
        return key, rows[key]

    def _key_of(self, spec: TableSpec, row: Row) -> Any:
        return tuple(row[c] for c in spec.primary_key)

    def _new_rowid(self) -> int:
        self._next_rowid += 1
        return self._next_rowid

    def _random_row(self, spec: TableSpec) -> Row:
        return {c.name: (None if c.is_generated else self.values.value(c)) for c in spec.columns}

    def _changed(self, spec: TableSpec, row: Row, names: list[str]) -> Row:
        out = dict(row)
        for name in names:
            out[name] = self.values.value(spec.column(name))
        return out

    def _no_room(self, name: str) -> bool:
        """Whether ``name`` is full: then a random row of it is deleted instead of the insert
        asked for, which keeps every table bounded."""
        if len(self._table(name)) < _MAX_ROWS:
            return False
        self._delete_random(name)
        return True

    def _insert_random(self, name: str, complete: Callable[[Row], Any]) -> bool:
        """``INSERT`` of a random row into ``name``, unless it is full (see ``_no_room``; False
        then). ``complete`` sets the columns the table constrains (its key first) and returns the
        row's key."""
        if self._no_room(name):
            return False
        row = self._random_row(self.specs[name])
        self._table(name)[complete(row)] = row
        return True

    def _update_random(
        self, name: str, insert: Callable[[], None], change: Callable[[TableSpec, Row], Row]
    ) -> None:
        """``UPDATE`` of a random row of ``name`` to ``change(spec, row)``; on an empty table
        ``insert`` runs instead."""
        picked = self._pick(name)
        if picked is None:
            insert()
            return
        key, row = picked
        self._table(name)[key] = change(self.specs[name], row)

    def _delete_random(self, name: str) -> None:
        """``DELETE`` of a random row of ``name`` (nothing on an empty table)."""
        picked = self._pick(name)
        if picked is not None:
            del self._table(name)[picked[0]]

    def _swap(self, name: str, column: str, keys: list[Any] | None = None) -> None:
        """Swap the ``column`` values of two random rows of ``name`` (of ``keys``, default all) in
        one transaction: for a unique column, two updates that only converge when both apply."""
        table = self._table(name)
        if keys is None:
            keys = list(table)
        if len(keys) < 2:
            return
        k1, k2 = self.rng.sample(keys, 2)
        row1, row2 = table[k1], table[k2]
        table[k1], table[k2] = dict(row1, **{column: row2[column]}), dict(row2, **{column: row1[column]})

    def _op_bulk_update(self) -> None:
        """``UPDATE t SET col = ...`` without WHERE: one event per row in a single transaction."""
        column = {
            "all_types": "c_int",
            "composite": "val",
            "uniq_only": "v1",
            "keyless": "n",
            PARTITIONED_TABLE: "qty",
            LATE_TABLE: "label",
        }
        name = self.rng.choice([t for t in column if t in self.specs])
        spec = self.specs[name]
        table = self._table(name)
        for key, row in list(table.items()):
            table[key] = self._changed(spec, row, [column[name]])

    # -- all_types ----------------------------------------------------------------------------

    @staticmethod
    def _with_generated(row: Row) -> Row:
        row["c_gen"] = row["id"] * 2
        return row

    def _all_types_key(self, row: Row) -> tuple[int]:
        row["id"] = self._next_id
        self._next_id += 1
        return (self._with_generated(row)["id"],)

    def _op_all_types_insert(self) -> None:
        self._insert_random("all_types", self._all_types_key)

    def _updatable(self, spec: TableSpec) -> list[str]:
        return [c.name for c in spec.columns if not c.is_generated and c.name not in spec.split_key_columns]

    def _op_all_types_update(self) -> None:
        def change(spec: TableSpec, row: Row) -> Row:
            return self._changed(spec, row, self.rng.sample(self._updatable(spec), self.rng.randint(1, 4)))

        self._update_random("all_types", self._op_all_types_insert, change)

    def _op_all_types_pk_change(self) -> None:
        """``UPDATE all_types SET id = <new id>``: TiCDC sees a delete and an insert."""
        picked = self._pick("all_types")
        if picked is None:
            return
        key, row = picked
        table = self._table("all_types")
        del table[key]
        new = dict(row, id=self._next_id)
        self._next_id += 1
        table[(new["id"],)] = self._with_generated(new)

    def _op_all_types_touch_twice(self) -> None:
        """Several statements on one row in one transaction: TiCDC sends one merged event."""
        spec = self.specs["all_types"]
        table = self._table("all_types")
        roll = self.rng.random()
        if roll < 0.4 and table:
            key, row = self._pick("all_types")  # type: ignore[misc]
            row = self._changed(spec, row, ["c_varchar"])
            table[key] = self._changed(spec, row, ["c_varchar", "c_int"])
        elif roll < 0.7:
            self._op_all_types_insert()
            if table:
                newest = max(table)
                table[newest] = self._changed(spec, table[newest], ["c_text"])
        else:  # insert then delete: nothing reaches TiCDC
            row = self._with_generated(self._random_row(spec) | {"id": self._next_id})
            self._next_id += 1
            table[(row["id"],)] = row
            del table[(row["id"],)]

    def _op_all_types_reinsert(self) -> None:
        """DELETE a row and INSERT the same primary key again: one update for TiCDC."""
        picked = self._pick("all_types")
        if picked is None:
            return
        key, row = picked
        spec = self.specs["all_types"]
        table = self._table("all_types")
        del table[key]
        fresh = self._random_row(spec)
        fresh["id"] = row["id"]
        table[key] = self._with_generated(fresh)

    # -- composite (PRIMARY KEY (a, b), NOT NULL UNIQUE KEY u) ---------------------------------

    def _unused_u(self, name: str) -> int:
        used = {row["u"] for row in self._table(name).values()}
        spec = self.specs[name]
        low, high = spec.column("u").int_range or (1, 10**6)
        while True:
            u = self.rng.randint(low, high)
            if u not in used:
                return u

    def _unused_pk(self) -> tuple[int, str] | None:
        table = self._table("composite")
        for _ in range(50):
            pk = (self.rng.randint(1, 40), self.rng.choice(_COMPOSITE_B))
            if pk not in table:
                return pk
        return None

    def _op_composite_insert(self) -> None:
        if self._no_room("composite"):
            return
        pk = self._unused_pk()
        if pk is None:
            return
        spec = self.specs["composite"]
        row = self._random_row(spec)
        row["a"], row["b"] = pk
        row["u"] = self._unused_u("composite")
        self._table("composite")[pk] = row

    def _op_composite_update(self) -> None:
        self._update_random(
            "composite",
            self._op_composite_insert,
            lambda spec, row: self._changed(spec, row, self._updatable(spec)),
        )

    def _op_composite_move_u(self) -> None:
        """Give one row's unique value to another row (the first gets a fresh one)."""
        table = self._table("composite")
        if len(table) < 2:
            return
        k1, k2 = self.rng.sample(list(table), 2)
        fresh = self._unused_u("composite")
        table[k1], table[k2] = dict(table[k1], u=fresh), dict(table[k2], u=table[k1]["u"])

    def _op_composite_pk_change(self) -> None:
        picked = self._pick("composite")
        pk = self._unused_pk()
        if picked is None or pk is None:
            return
        key, row = picked
        table = self._table("composite")
        del table[key]
        table[pk] = dict(row, a=pk[0], b=pk[1])

    # -- uniq_only (no PK; NOT NULL UNIQUE u is the handle; nullable UNIQUE alt) --------------

    def _unused_uniq(self) -> int:
        used = {row["u"] for row in self._table("uniq_only").values()}
        while True:
            u = self.rng.choice([self.rng.randint(-(2**63), 2**63 - 1), self.rng.randint(1, 10**6)])
            if u not in used:
                return u

    def _unused_alt(self) -> str | None:
        used = {row["alt"] for row in self._table("uniq_only").values()}
        for _ in range(20):
            alt = f"alt-{self.rng.randint(0, 199)}"
            if alt not in used:
                return alt
        return None

    def _uniq_key(self, row: Row) -> int:
        row["u"] = self._unused_uniq()
        row["alt"] = self._unused_alt() if self.rng.random() < 0.7 else None
        return self._new_rowid()

    def _op_uniq_insert(self) -> None:
        self._insert_random("uniq_only", self._uniq_key)

    def _op_uniq_update(self) -> None:
        def change(spec: TableSpec, row: Row) -> Row:
            new = self._changed(spec, row, ["v1", "v2"])
            roll = self.rng.random()
            if roll < 0.2:
                new["u"] = self._unused_uniq()  # handle change: split into delete + insert
            elif roll < 0.4:
                new["alt"] = (
                    self._unused_alt() if self.rng.random() < 0.8 else None
                )  # nullable UK: plain update
            return new

        self._update_random("uniq_only", self._op_uniq_insert, change)

    def _op_uniq_swap_alt(self) -> None:
        """Swap a nullable unique value between two rows: two plain updates that only converge
        when both are applied."""
        table = self._table("uniq_only")
        self._swap("uniq_only", "alt", [k for k, r in table.items() if r["alt"] is not None])

    # -- keyless (no key at all; identical rows allowed) --------------------------------------

    def _keyless_row(self) -> Row:
        rng = self.rng
        return {
            "k": rng.choice([1, 2, 3, None]),
            "v": rng.choice(["a", "b", "é", None]),
            "n": rng.choice([0.5, 1.25, -3.0, None]),
        }

    def _op_keyless_insert(self) -> None:
        if self._no_room("keyless"):
            return
        table = self._table("keyless")
        if table and self.rng.random() < 0.4:
            row = dict(table[self.rng.choice(list(table))])  # an exact duplicate of an existing row
        else:
            row = self._keyless_row()
        table[self._new_rowid()] = row

    def _op_keyless_update(self) -> None:
        def change(_spec: TableSpec, row: Row) -> Row:
            new = self._keyless_row()
            return {name: self.rng.choice([row[name], new[name]]) for name in row}

        self._update_random("keyless", self._op_keyless_insert, change)

    # -- ptbl (PARTITION BY HASH(id) PARTITIONS 4; clustered int primary key) -----------------

    def _small_id(self, name: str) -> int:
        new_id = self._next_small_id[name]
        self._next_small_id[name] = new_id + 1
        return new_id

    def _small_id_key(self, name: str, row: Row) -> tuple[int]:
        row["id"] = self._small_id(name)
        return (row["id"],)

    def _op_ptbl_insert(self) -> None:
        """Insert one to three rows: consecutive ids land in different physical partitions."""
        for _ in range(self.rng.randint(1, 3)):
            if not self._insert_random(PARTITIONED_TABLE, partial(self._small_id_key, PARTITIONED_TABLE)):
                return

    def _op_ptbl_update(self) -> None:
        """Update one to three rows, usually in several physical partitions."""
        table = self._table(PARTITIONED_TABLE)
        if not table:
            self._op_ptbl_insert()
            return
        spec = self.specs[PARTITIONED_TABLE]
        for key in self.rng.sample(list(table), min(len(table), self.rng.randint(1, 3))):
            table[key] = self._changed(spec, table[key], self.rng.sample(self._updatable(spec), 2))

    def _op_ptbl_pk_change(self) -> None:
        """``UPDATE ptbl SET id = <new id>``: a DELETE in the old row's partition and an INSERT
        in the new one's (most often another physical partition)."""
        picked = self._pick(PARTITIONED_TABLE)
        if picked is None:
            return
        key, row = picked
        table = self._table(PARTITIONED_TABLE)
        del table[key]
        new = dict(row, id=self._small_id(PARTITIONED_TABLE))
        table[(new["id"],)] = new

    # -- late_tbl (created mid-stream by the new architecture's out-of-order CREATE TABLE) ----

    def _op_late_insert(self) -> None:
        self._insert_random(LATE_TABLE, partial(self._small_id_key, LATE_TABLE))

    def _op_late_update(self) -> None:
        self._update_random(
            LATE_TABLE, self._op_late_insert, lambda spec, row: self._changed(spec, row, ["label"])
        )

    # -- wide (BIGINT primary key; LONGTEXT, LONGBLOB and MEDIUMTEXT of up to megabytes) -------

    def _wide_row(self, row_id: int) -> Row:
        """A row whose large columns hold 300 KB to 2 MB each (or NULL, or a short value)."""
        spec = self.specs[WIDE_TABLE]
        row = {c.name: None for c in spec.columns}
        row["id"] = row_id
        row["title"] = self.values.value(spec.column("title"))
        row["body"] = self._wide_value("body", null=0.05, short=0.05)
        row["data"] = self._wide_value("data", null=0.3, short=0.3)
        row["note"] = self._wide_value("note", null=0.4, short=0.4)
        return row

    def _wide_value(self, name: str, *, null: float, short: float) -> Any:
        """NULL, a short value, or a large one: mostly below 700 KB, sometimes up to 2 MB (which
        keeps a 200-transaction stream's claim-check objects around 100 MB)."""
        rng = self.rng
        roll = rng.random()
        if roll < null:
            return None
        if roll < null + short:
            size = rng.randint(0, 200)
        elif rng.random() < 0.75:
            size = rng.randint(300_000, 700_000)
        else:
            size = rng.randint(700_000, 2_000_000)
        if name == "data":
            return rng.randbytes(size)
        return self.values.wide_text(size)

    def _op_wide(self) -> None:
        """One statement on a wide row: insert a free key, or update (some large columns), delete,
        delete and insert again (one update for TiCDC), or move a row to a free key (a delete and
        an insert, both large)."""
        rng = self.rng
        table = self._table(WIDE_TABLE)
        key = (rng.randint(1, _WIDE_KEYS),)
        row = table.get(key)
        if row is None:
            table[key] = self._wide_row(key[0])
            return
        roll = rng.random()
        if roll < 0.55:
            new = dict(row)
            for name in rng.sample(["title", "body", "data", "note"], rng.randint(1, 2)):
                if name == "title":
                    new[name] = self.values.value(self.specs[WIDE_TABLE].column(name))
                else:
                    new[name] = self._wide_value(name, null=0.1, short=0.2)
            table[key] = new
        elif roll < 0.8:
            del table[key]
        elif roll < 0.9:
            table[key] = self._wide_row(key[0])
        else:
            free = [k for k in range(1, _WIDE_KEYS + 1) if (k,) not in table]
            if free:
                del table[key]
                moved = rng.choice(free)
                table[(moved,)] = dict(row, id=moved)

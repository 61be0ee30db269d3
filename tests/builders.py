"""Builders of the test data every part of the suite needs: positions, Column dicts, row images, the
decoded events (RowEvent, DDLEvent, ResolvedEvent) and Open Protocol key/value records.

They live here, once, so that a test module states only what is particular to its case. The record
encoders are written from the protocol description (docs/open-protocol.md §1-§3), independently of
the decoder and of the simulator's encoder, so that a test decoding them checks the decoder.

Also here: ``load_sql_fixture_pairs``, which reads the input/expected SQL pairs of tests/fixtures, and
``isolate_from_aws_settings`` for the tests of the S3 store, and ``DOC_EXAMPLE_LOG``, the documentation's
example stream.
"""

from __future__ import annotations

import itertools
import os
import random
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cramjam
import orjson
import pytest

from applier.codec.events import (
    FLAG_HANDLE_KEY,
    FLAG_NULLABLE,
    FLAG_PRIMARY_KEY,
    FLAG_UNIQUE_KEY,
    DDLEvent,
    Position,
    ResolvedEvent,
    Row,
    RowEvent,
    RowKind,
)

# -- positions and columns -------------------------------------------------------------------------

INT, VARCHAR = 3, 15
"""Open Protocol type codes of the columns the builders make (MySQL INT and VARCHAR)."""

PK = FLAG_HANDLE_KEY | FLAG_PRIMARY_KEY
"""The flags of a primary-key column that is also TiCDC's handle key."""


def position(partition: int = 0, offset: int = 0, index: int = 0, topic: str = "topic") -> Position:
    """Where an event was read: event ``index`` of the record at ``offset`` of ``partition``."""
    return Position(topic, partition, offset, index)


def column(t: int, v: Any, f: int = 0) -> dict[str, Any]:
    """A Column dict (also the JSON of a column on the wire): type code ``t``, value ``v``, flags ``f``."""
    return {"t": t, "f": f, "v": v}


# -- events of the stream stage: tables db.k (keyed) and db.n (keyless) --------------------------------


def _image_event(ts: int, table: str, kind: RowKind, image: Row, rid: int | None) -> RowEvent:
    if kind is RowKind.DELETE:
        return RowEvent(ts, "db", table, kind, None, image, None, position(), rid)
    return RowEvent(ts, "db", table, kind, image, None, None, position(), rid)


def keyed_row(
    ts: int,
    key: int,
    value: str = "v",
    table: str = "k",
    kind: RowKind = RowKind.INSERT,
    rid: int | None = None,
) -> RowEvent:
    """A row of ``db.<table>`` (id INT handle key, val VARCHAR); a DELETE carries the image as ``old``."""
    image = {"id": column(INT, key, PK), "val": column(VARCHAR, value, FLAG_NULLABLE)}
    return _image_event(ts, table, kind, image, rid)


def keyless_row(
    ts: int, a: int, b: str = "x", table: str = "n", kind: RowKind = RowKind.INSERT, rid: int | None = None
) -> RowEvent:
    """A row of ``db.<table>`` without any key (a INT, b VARCHAR); ``rid`` is its row id if sent."""
    image = {"a": column(INT, a, FLAG_NULLABLE), "b": column(VARCHAR, b, FLAG_NULLABLE)}
    return _image_event(ts, table, kind, image, rid)


def resolved_event(ts: int, partition: int = 0) -> ResolvedEvent:
    """A resolved ts read from ``partition``."""
    return ResolvedEvent(ts, position(partition))


def ddl_event(
    ts: int,
    query: str = "ALTER TABLE k ADD COLUMN c INT",
    table: str = "k",
    *,
    schema: str = "db",
    ddl_type: int = 5,
    partition: int = 0,
) -> DDLEvent:
    """A DDL event (``ddl_type`` 5: ADD COLUMN) on ``schema.table`` read from ``partition``."""
    return DDLEvent(ts, schema, table, query, ddl_type, position(partition))


# -- row images and events of the SQL stage: table s.t ---------------------------------------------------


def keyed_image(id_: Any, u: Any = None, v: Any = None) -> Row:
    """An image of table (id INT PK, u VARCHAR UNIQUE, v VARCHAR)."""
    return {
        "id": column(INT, id_, PK),
        "u": column(VARCHAR, u, FLAG_UNIQUE_KEY),
        "v": column(VARCHAR, v),
    }


def keyless_image(a: Any, b: Any = None) -> Row:
    """An image of table (a INT, b VARCHAR) without any key."""
    return {"a": column(INT, a), "b": column(VARCHAR, b)}


_offsets = itertools.count()


def row_event(
    kind: RowKind,
    ts: int,
    new: Row | None = None,
    old: Row | None = None,
    table: str = "t",
    partition: int = 0,
    schema: str = "s",
    pos: Position | None = None,
) -> RowEvent:
    """A row event of ``schema.table`` read at ``pos``; without one, every call takes the next offset of
    ``partition``, so that events arrive in call order."""
    return RowEvent(ts, schema, table, kind, new, old, None, pos or position(partition, next(_offsets)))


def id_val_image(key: Any, value: Any = "v", key_flags: int = PK) -> Row:
    """An image of table (id INT PK, val VARCHAR); ``key_flags``: the flags of ``id``."""
    return {"id": column(INT, key, key_flags), "val": column(VARCHAR, value)}


def insert_row(ts: int, key: Any, value: Any = "v") -> RowEvent:
    """An INSERT of (id, val) into s.t."""
    return row_event(RowKind.INSERT, ts, id_val_image(key, value))


def delete_row(ts: int, key: Any) -> RowEvent:
    """A DELETE of the row of s.t with id ``key``."""
    return row_event(RowKind.DELETE, ts, None, id_val_image(key))


def update_row(ts: int, old_key: Any, new_key: Any, value: Any = "u") -> RowEvent:
    """An UPDATE of s.t moving the row ``old_key`` to id ``new_key`` with val ``value``."""
    return row_event(RowKind.UPDATE, ts, id_val_image(new_key, value), id_val_image(old_key))


# -- Open Protocol records --------------------------------------------------------------------------------

_U64 = struct.Struct(">Q")


def frame_key(docs: list[bytes], version: int = 1) -> bytes:
    """A record key: the protocol version, then each key JSON with its 8-byte big-endian length."""
    return _U64.pack(version) + b"".join(_U64.pack(len(d)) + d for d in docs)


def frame_value(docs: list[bytes]) -> bytes:
    """A record value: each value document with its 8-byte big-endian length (empty for none)."""
    return b"".join(_U64.pack(len(d)) + d for d in docs)


def frame_docs(key_docs: list[bytes], value_docs: list[bytes]) -> tuple[bytes, bytes]:
    """The (key, value) of one record carrying these key JSONs and value documents, in order."""
    return frame_key(key_docs), frame_value(value_docs)


def compress_value(doc: bytes, compression: str | None) -> bytes:
    """A value document as a producer with ``compression`` (None, "snappy" or "lz4") sends it."""
    if doc and compression == "snappy":
        return bytes(cramjam.snappy.compress_raw(doc))
    if doc and compression == "lz4":
        return bytes(cramjam.lz4.compress(doc))
    return doc


def split_record(key: bytes, value: bytes) -> list[tuple[bytes, bytes]]:
    """(key JSON, value document as framed) of every event of a version-1 record: the inverse of
    ``frame_docs``, for the tests that read back what the simulator encoded without the decoder."""
    (version,) = _U64.unpack_from(key, 0)
    assert version == 1
    return list(zip(_unframe(key[8:]), _unframe(value), strict=True))


def _unframe(data: bytes) -> list[bytes]:
    docs, at = [], 0
    while at < len(data):
        (n,) = _U64.unpack_from(data, at)
        docs.append(data[at + 8 : at + 8 + n])
        at += 8 + n
    assert at == len(data)  # no partial document at the end
    return docs


def decompress_value(doc: bytes, compression: str | None) -> bytes:
    """A value document as sent by a producer with ``compression``, uncompressed: the inverse of
    ``compress_value``."""
    if not doc or compression is None:
        return doc
    if compression == "snappy":
        return bytes(cramjam.snappy.decompress_raw(doc))
    assert compression == "lz4" and doc[:4] == b"\x04\x22\x4d\x18"  # an LZ4 frame
    return bytes(cramjam.lz4.decompress(doc))


def record(
    *pairs: tuple[Any, Any],
    compression: str | None = None,
    dumps: Callable[[Any], bytes] = orjson.dumps,
) -> tuple[bytes, bytes]:
    """One record of (key object, value object or None for an empty value) pairs, as JSON by ``dumps``."""
    keys = [dumps(k) for k, _ in pairs]
    values = [b"" if v is None else compress_value(dumps(v), compression) for _, v in pairs]
    return frame_docs(keys, values)


def resolved_record(ts: int) -> tuple[bytes, bytes]:
    """A record holding a resolved event for ``ts`` alone."""
    return record(({"ts": ts, "t": 3}, None))


# -- the documentation's example stream (seed 000, logs 1-14, the old form) ----------------------------

_DDL_KEY = r'{"ts":415508856908021766,"scm":"test","tbl":"t1","t":2}'
_CREATE_T1 = r'{"q":"CREATE TABLE test.t1(id int primary key, val varchar(16))","t":3}'
_RESOLVED_AFTER_DDL = r'{"ts":415508856908021766,"t":3}'
_INSERTS_KEY = r'{"ts":415508878783938562,"scm":"test","tbl":"t1","t":1}'
_CHANGES_KEY = r'{"ts":415508881418485761,"scm":"test","tbl":"t1","t":1}'
_RESOLVED_AT_END = r'{"ts":415508881038376963,"t":3}'

DOC_EXAMPLE_LOG: list[tuple[int, int, str, str]] = [
    (1, 0, _DDL_KEY, _CREATE_T1),
    (2, 0, _RESOLVED_AFTER_DDL, ""),
    (3, 1, _DDL_KEY, _CREATE_T1),
    (4, 1, _RESOLVED_AFTER_DDL, ""),
    (5, 0, _INSERTS_KEY, r'{"u":{"id":{"t":3,"h":true,"v":1},"val":{"t":15,"v":"YWE="}}}'),
    (6, 1, _INSERTS_KEY, r'{"u":{"id":{"t":3,"h":true,"v":2},"val":{"t":15,"v":"YmI="}}}'),
    (7, 0, _INSERTS_KEY, r'{"u":{"id":{"t":3,"h":true,"v":3},"val":{"t":15,"v":"Y2M="}}}'),
    (8, 0, _INSERTS_KEY, r'{"u":{"id":{"t":3,"h":true,"v":3},"val":{"t":15,"v":"Y2M="}}}'),
    (9, 0, _CHANGES_KEY, r'{"d":{"id":{"t":3,"h":true,"v":1}}}'),
    (10, 1, _CHANGES_KEY, r'{"d":{"id":{"t":3,"h":true,"v":2}}}'),
    (11, 0, _CHANGES_KEY, r'{"u":{"id":{"t":3,"h":true,"v":3},"val":{"t":15,"v":"ZGQ="}}}'),
    (12, 0, _CHANGES_KEY, r'{"u":{"id":{"t":3,"h":true,"v":4},"val":{"t":15,"v":"ZWU="}}}'),
    (13, 0, _RESOLVED_AT_END, ""),
    (14, 1, _RESOLVED_AT_END, ""),
]
"""The example stream of the documentation: (log number, partition, key JSON, value JSON or "" for an
empty value), each JSON exactly as the log prints it; records that share a key name it once. The
decoder's unit test and the daemon's end-to-end test both replay it."""


# -- the environment ----------------------------------------------------------------------------------


def isolate_from_aws_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS_* variable, config or credentials file of the machine, and no instance-metadata probing:
    a test of the S3 store sees only the settings it gives, whatever machine it runs on. The config
    and credentials files become ``tmp_path``/aws-config and aws-credentials, absent until a test
    writes them."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# -- SQL fixture files ------------------------------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures"


def _fixture_text(line: str) -> str:
    return "" if line == "<empty>" else line.replace("\\n", "\n")


def load_sql_fixture_pairs(path: str | Path) -> list[tuple[str, str, int]]:
    """The (input, expected, line) pairs of a fixture file below tests/fixtures.

    The file holds blocks separated by blank lines; each block is an input statement on one line and
    the expected statement on the next. Lines starting with ``--`` are comments. In a statement the two
    characters ``\\n`` stand for a line break, and a line ``<empty>`` for the empty string. ``line``
    is the line number of the input, for the test's id.
    """
    pairs: list[tuple[str, str, int]] = []
    block: list[tuple[int, str]] = []
    lines = (FIXTURES / path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate([*lines, ""], start=1):
        if line.startswith("--"):
            continue
        if line.strip():
            block.append((number, line))
            continue
        if block:
            if len(block) != 2:
                raise ValueError(f"{path}:{block[0][0]}: a block holds an input and an expected line")
            (number_in, text_in), (_, text_out) = block
            pairs.append((_fixture_text(text_in), _fixture_text(text_out), number_in))
            block = []
    return pairs


def sql_fixture_cases(path: str) -> list[Any]:
    """The pairs of ``load_sql_fixture_pairs(path)`` as pytest parameters named ``<file>:<line>``."""
    name = Path(path).name
    return [
        pytest.param(given, expected, id=f"{name}:{line}")
        for given, expected, line in load_sql_fixture_pairs(path)
    ]


# -- random upstream statements on a table (id PK, u UNIQUE, v) ----------------------------------------

ID, U = 0, 1
"""Where a row (id, u, v) holds its primary key and its unique key."""


@dataclass
class KeyedRows:
    """An upstream table (id PK, u UNIQUE, v) that random statements change, its rows kept as
    {hidden row id: (id, u, v)}. Besides inserts and deletes, the statements are those an applier
    finds hard: two rows swapping their unique keys or their primary keys in one statement, a row
    taking another primary key."""

    ids: Sequence[Any]  # the primary keys a row may take
    us: Sequence[Any]  # the unique keys a row may take
    rows: dict[int, tuple] = field(default_factory=dict)
    rids: Iterator[int] = field(default_factory=itertools.count)  # hidden ids for the inserted rows

    def statement(self, rnd: random.Random, x: float, cuts: tuple[float, ...], ts: int) -> bool:
        """Run the statement that the draw ``x`` picks: the first of insert, delete, swap of unique
        keys, swap of primary keys and change of a row whose cut (in that order in ``cuts``) lies
        above ``x`` and that the rows allow (a free key, one row, two rows). False when none is
        picked: the share above the last cut is the caller's."""
        live = list(self.rows)
        free_ids = [i for i in self.ids if i not in {r[ID] for r in self.rows.values()}]
        free_us = [u for u in self.us if u not in {r[U] for r in self.rows.values()}]
        insert, delete, swap_us, swap_ids, change = cuts
        if x < insert and free_ids and free_us:
            self.rows[next(self.rids)] = (rnd.choice(free_ids), rnd.choice(free_us), f"v{ts}")
        elif x < delete and live:
            del self.rows[rnd.choice(live)]
        elif x < swap_us and len(live) >= 2:
            self._swap(rnd, live, U)
        elif x < swap_ids and len(live) >= 2:
            self._swap(rnd, live, ID)
        elif x < change and live:
            a = rnd.choice(live)
            id_, u, _v = self.rows[a]
            self.rows[a] = (rnd.choice(free_ids) if free_ids and rnd.random() < 0.5 else id_, u, f"v{ts}")
        else:
            return False
        return True

    def changes(self, before: dict[int, tuple]) -> Iterator[tuple[Any, Any]]:
        """(old row or None, new row or None) of every row inserted, deleted or changed since the
        rows were ``before``: what TiCDC sends of a transaction, one net change per row."""
        for rid in set(before) | set(self.rows):
            old, new = before.get(rid), self.rows.get(rid)
            if old != new:
                yield old, new

    def _swap(self, rnd: random.Random, live: list[int], key: int) -> None:
        a, b = rnd.sample(live, 2)
        ra, rb = list(self.rows[a]), list(self.rows[b])
        ra[key], rb[key] = rb[key], ra[key]
        self.rows[a], self.rows[b] = tuple(ra), tuple(rb)


def apply_keyed_plan(tp, downstream: dict) -> None:
    """What a keyed table plan does to a model of the downstream, ``{id: (u, v)}`` with a primary
    key ``id`` and a unique key ``u``: DELETE by key, then REPLACE, which removes every row
    conflicting on either key before inserting (the convergence argument of sqlgen.collapse)."""
    for key in tp.delete_keys:
        downstream.pop(key[0], None)
    for g in tp.upserts:
        for row in g.rows:
            d = dict(zip(g.columns, row, strict=True))
            for other in [k for k, (u, _v) in downstream.items() if k == d["id"] or u == d["u"]]:
                del downstream[other]
            downstream[d["id"]] = (d["u"], d["v"])

"""The daemon on hand-made input: the documentation's example stream, hostile names and values,
and a malformed record in mid-stream.

The records here are framed by a few lines written in this file from the protocol description,
independent of both the decoder and the simulator.
"""

from __future__ import annotations

import base64
import json
import re
import uuid

import pytest

from applier.kafka.embedded_broker import create_topic
from applier.simulator import StreamConfig, simulate
from applier.simulator.producer import produce_records
from tests.builders import DOC_EXAMPLE_LOG
from tests.integration.harness import Changefeed

pytestmark = pytest.mark.integration


def frame(keys: list[dict], values: list[dict | None]) -> tuple[bytes, bytes]:
    """Open Protocol framing: version 1, then length-prefixed key JSONs / value JSONs."""
    key = (1).to_bytes(8, "big")
    value = b""
    for k, v in zip(keys, values, strict=True):
        kb = json.dumps(k, ensure_ascii=False).encode()
        vb = b"" if v is None else json.dumps(v, ensure_ascii=False).encode()
        key += len(kb).to_bytes(8, "big") + kb
        value += len(vb).to_bytes(8, "big") + vb
    return key, value


class Rec:
    def __init__(self, partition: int, key: bytes, value: bytes) -> None:
        self.partition, self.key, self.value = partition, key, value


def send(cf: Changefeed, records: list[Rec]) -> None:
    produce_records(cf.bootstrap, cf.topic, records)  # type: ignore[arg-type]


def _doc_records(schema: str) -> list[Rec]:
    out = []
    # The CREATE DATABASE the example assumes, broadcast first as a DDL event.
    create_db = (
        {"ts": 415508856000000000, "scm": schema, "t": 2},
        {"q": f"CREATE DATABASE `{schema}`", "t": 1},
    )
    for p in (0, 1):
        out.append(Rec(p, *frame([create_db[0]], [create_db[1]])))
    for _log, p, k, v in DOC_EXAMPLE_LOG:
        # The example's schema is `test`; a private name keeps the test away from the server's own.
        k = k.replace('"scm":"test"', f'"scm":"{schema}"')
        v = v.replace("test.t1", f"{schema}.t1") if v else v
        out.append(Rec(p, *frame([json.loads(k)], [json.loads(v) if v else None])))
    return out


def _rows(cf: Changefeed, sql: str) -> list[tuple]:
    conn = cf.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_documentation_example_stream(feed: Changefeed) -> None:
    schema = feed.new_schema("doc")
    create_topic(feed.bootstrap, feed.topic, 2)
    send(feed, _doc_records(schema))
    done = feed.run_to_end("--legacy-base64-strings")
    assert done.returncode == 0, done.stdout + done.stderr
    # The last resolved ts (…963) is older than the second transaction (…761): only the first applies.
    assert _rows(feed, f"SELECT id, val FROM `{schema}`.t1 ORDER BY id") == [(1, "aa"), (2, "bb"), (3, "cc")]
    later = {"ts": 415508881418485761 + 1, "t": 3}
    send(feed, [Rec(p, *frame([later], [None])) for p in (0, 1)])
    done = feed.run_to_end("--legacy-base64-strings")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _rows(feed, f"SELECT id, val FROM `{schema}`.t1 ORDER BY id") == [(3, "dd"), (4, "ee")]


# -- hostile names and values ------------------------------------------------------------------


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _go_quote_bytes(data: bytes) -> str:
    """Go strconv.Quote style for arbitrary bytes (without the outer quotes)."""
    out = []
    for b in data:
        c = chr(b)
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def test_hostile_names_and_values_are_stored_exactly(feed: Changefeed) -> None:
    schema = f"we`ird sch'ema ü {uuid.uuid4().hex[:6]}"
    table = 'ta`ble "x" 表'
    feed.schemas.append(schema)
    cols = {
        "i`d": "BIGINT UNSIGNED NOT NULL PRIMARY KEY",
        "va l'ue": "VARCHAR(64)",
        'bin"ary': "VARBINARY(16)",
        "t": "TIME",
        "d": "DATE",
        "dt": "DATETIME",
        "txt": "TEXT",
    }
    ddl = f"CREATE TABLE {_ident(table)} (" + ", ".join(f"{_ident(c)} {t}" for c, t in cols.items()) + ")"
    ts = 440000000000000000
    recs = [
        Rec(
            0,
            *frame([{"ts": ts, "scm": schema, "t": 2}], [{"q": f"CREATE DATABASE {_ident(schema)}", "t": 1}]),
        ),
        Rec(0, *frame([{"ts": ts + 1, "scm": schema, "tbl": table, "t": 2}], [{"q": ddl, "t": 3}])),
    ]
    values = [
        (
            2**64 - 1,
            "NUL\x00 quote' dq\" back\\slash 😀",
            b"\x00\xff'\"\\",
            "-838:59:59",
            "0000-00-00",
            "0000-00-00 00:00:00",
            "4-byte 𝄞 and \\ and '",
        ),
        (1, "", b"", "100:00:01", "2024-02-29", "2024-02-29 23:59:59", ""),
        (0, None, None, None, None, None, None),
    ]
    keys, vals = [], []
    for row in values:
        i, v, b, t, d, dt, txt = row
        u = {
            "i`d": {"t": 8, "f": 2 | 8 | 0x80, "v": i},
            "va l'ue": {"t": 15, "f": 0x40, "v": v},
            'bin"ary': {"t": 15, "f": 0x41, "v": None if b is None else _go_quote_bytes(b)},
            "t": {"t": 11, "f": 0x40, "v": t},
            "d": {"t": 10, "f": 0x40, "v": d},
            "dt": {"t": 12, "f": 0x40, "v": dt},
            "txt": {
                "t": 252,
                "f": 0x40,
                "v": None if txt is None else base64.b64encode(txt.encode()).decode(),
            },
        }
        keys.append({"ts": ts + 10, "scm": schema, "tbl": table, "t": 1})
        vals.append({"u": u})
    recs.append(Rec(0, *frame(keys, vals)))
    recs.append(Rec(0, *frame([{"ts": ts + 20, "t": 3}], [None])))
    create_topic(feed.bootstrap, feed.topic, 1)
    send(feed, recs)
    done = feed.run_to_end()
    assert done.returncode == 0, done.stdout + done.stderr
    got = _rows(
        feed,
        f"SELECT `i``d`, `va l'ue`, `bin\"ary`, CAST(t AS CHAR), CAST(d AS CHAR), CAST(dt AS CHAR), txt "
        f"FROM {_ident(schema)}.{_ident(table)} ORDER BY `i``d` DESC".replace("%", "%%"),
    )
    expected = [
        (
            2**64 - 1,
            values[0][1],
            values[0][2],
            "-838:59:59",
            "0000-00-00",
            "0000-00-00 00:00:00",
            values[0][6],
        ),
        (1, "", b"", "100:00:01", "2024-02-29", "2024-02-29 23:59:59", ""),
        (0, None, None, None, None, None, None),
    ]
    assert got == expected


# -- malformed input ---------------------------------------------------------------------------


def test_malformed_record_stops_at_its_position_after_applying_everything_before(feed: Changefeed) -> None:
    schema = feed.new_schema()
    sim = simulate(StreamConfig(seed=31, partitions=3, transactions=200, schema=schema))
    create_topic(feed.bootstrap, feed.topic, 3)
    cut = len(sim.records) // 2
    before, after = sim.records[:cut], sim.records[cut:]
    bad_partition = 1
    offset = sum(1 for r in before if r.partition == bad_partition)  # offset the bad record gets
    # The partition's resolved ts when the bad record arrives (a DDL implies none,
    # docs/open-protocol.md §5.4).
    resolved = 0
    for rec in before:
        if rec.partition == bad_partition:
            for ev in rec.events:
                if ev.kind == "resolved":
                    resolved = max(resolved, ev.commit_ts)
    produce_records(feed.bootstrap, feed.topic, before)
    bad_key = (1).to_bytes(8, "big") + (5).to_bytes(8, "big") + b'{"ts"'  # truncated key JSON
    produce_records(feed.bootstrap, feed.topic, [Rec(bad_partition, bad_key, b"")])  # type: ignore[list-item]
    produce_records(feed.bootstrap, feed.topic, after)

    for _attempt in range(2):  # a restart stops at the same record
        done = feed.run_to_end(timeout=240)
        assert done.returncode == 1, done.stdout + done.stderr
        out = done.stdout + done.stderr
        assert re.search(rf"partition {bad_partition}\b.*offset {offset}\b", out), out
        applied, offsets = feed.checkpoint()
        assert applied == resolved  # everything the barrier could release before it, nothing after
        assert offsets[bad_partition] <= offset
        assert feed.compare(sim, feed.snapshot_ts(applied)) == []

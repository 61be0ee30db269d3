"""Large messages in the simulated stream: claim-check references and handle-key-only events.

TiCDC sends a row event whose size (key JSON + value as framed + 60 bytes of framing and Kafka
record overhead) exceeds max-message-bytes either as a claim-check reference (the full event
stored as an object, the key naming it in "ccl") or with its handle-key columns only ("ohk").
The records and objects are read back here with a parser written from docs/open-protocol.md
(§1, §2, §9; the framing is tests/builders.py's split_record), independent of the project's
decoder, and compared with the events the simulator says it sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections import defaultdict
from typing import Any

import pytest

from applier import simulator
from applier.simulator.encoder import EncoderOptions, handle_key_value_json, key_json
from tests.builders import decompress_value, split_record

OVERHEAD = 36 + 16 + 8  # Kafka's worst-case record overhead, two length prefixes, the version head
NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.json")
BLOB_CODES = {249, 250, 251, 252}


# -- a minimal reader ---------------------------------------------------------------------------


def key_pairs(raw: bytes) -> list[tuple[str, Any]]:
    """The key's fields in order, repeated names kept."""
    return json.loads(raw, object_pairs_hook=list)


def canonical_b64(text: str) -> bytes:
    raw = base64.b64decode(text, validate=True)
    assert base64.b64encode(raw).decode() == text  # standard alphabet, padded: Go's []byte
    return raw


def read_object(data: bytes) -> tuple[bytes, bytes]:
    """(key JSON, value as framed) of the one event a claim-check object holds."""
    doc = json.loads(data, object_pairs_hook=list)
    assert [name for name, _ in doc] == ["key", "value"]
    key, value = canonical_b64(doc[0][1]), canonical_b64(doc[1][1])
    assert data == b'{"key":"' + doc[0][1].encode() + b'","value":"' + doc[1][1].encode() + b'"}'
    ((k, v),) = split_record(key, value)
    return k, v


def image(cols: dict) -> dict[str, tuple[int, int, Any]]:
    """A value image as the simulator models it (enough for the wide table and handle keys)."""
    out = {}
    for name, col in cols.items():
        assert list(col) == [f for f in ("t", "h", "f", "v") if f in col]
        assert col.get("h", False) == bool(col["f"] & 0x02)
        t, f, v = col["t"], col["f"], col["v"]
        if v is not None and t in BLOB_CODES:
            v = base64.b64decode(v, validate=True)
            if not f & 0x01:
                v = v.decode("utf-8")
        out[name] = (t, f, v)
    return out


def handle_key(img: dict | None) -> dict | None:
    return None if img is None else {n: c for n, c in img.items() if c[1] & 0x02}


def large_events(
    sim: simulator.Simulation,
) -> list[tuple[simulator.SimRecord, int, simulator.SimEvent, simulator.LargeMessage]]:
    out = []
    for rec in sim.records:
        if rec.large is None:
            continue
        assert len(rec.large) == len(rec.events) and any(rec.large)
        for i, (ev, form) in enumerate(zip(rec.events, rec.large, strict=True)):
            if form is not None:
                out.append((rec, i, ev, form))
    return out


def where(sim: simulator.Simulation, rec: simulator.SimRecord, i: int) -> tuple[int, int]:
    """(position of the record in the stream, of the event in the record)."""
    return next(n for n, r in enumerate(sim.records) if r is rec), i


def wide(seed: int = 3, transactions: int = 120, **kw: Any) -> simulator.Simulation:
    return simulator.simulate(
        simulator.StreamConfig(seed=seed, transactions=transactions, wide_rows=True, **kw)
    )


# -- default streams ----------------------------------------------------------------------------


def digest(sim: simulator.Simulation) -> str:
    h = hashlib.sha256()
    for r in sim.records:
        h.update(r.partition.to_bytes(4, "big"))
        h.update(r.key)
        h.update(b"|")
        h.update(r.value)
        h.update(bytes([r.replay, r.duplicate]))
    return h.hexdigest()


# Digests of streams without large events (recomputed whenever the simulated stream itself changes,
# e.g. when the index DDLs were added: what large-message options do to it is what they pin).
BEFORE = [
    ({"seed": 1, "transactions": 200}, "cce686151c4f66cc628c273838ffbcae335554c5e06337a26013a8f9ce0cda48"),
    ({"seed": 7, "transactions": 200}, "19dbdfc721bb1d0d5f691c71b062f1769ccfd52d2ec7284bee6f3cc853383951"),
    (
        {"seed": 3, "transactions": 150, **simulator.PRODUCER_MODES["all-new"]},
        "6469f61f74f88fb145181da67d2ef46ff0129f5cf7f6678567735175b6db4b61",
    ),
]


@pytest.mark.parametrize(("settings", "expected"), BEFORE, ids=["seed1", "seed7", "all-new"])
def test_streams_without_large_events_are_unchanged(settings: dict, expected: str) -> None:
    # The options change nothing while no event is over max_message_bytes.
    for option in (None, "claim-check", "handle-key-only"):
        sim = simulator.simulate(simulator.StreamConfig(**settings, large_message=option))
        assert digest(sim) == expected, option
        assert sim.claim_check_objects == {} and all(r.large is None for r in sim.records)


# -- which events are large ---------------------------------------------------------------------


def test_an_event_is_large_exactly_when_ticdc_s_size_exceeds_max_message_bytes() -> None:
    # One row per record and no failed produces: the events do not depend on max_message_bytes.
    settings = {"seed": 5, "transactions": 80, "max_batch_size": 1, "replays": False}
    sim = wide(large_message="claim-check", **settings)
    _, _, ev, form = large_events(sim)[0]
    full_key, full_value = read_object(sim.claim_check_objects[form.object_name or ""])
    size = len(full_key) + len(full_value) + OVERHEAD

    def find(sim: simulator.Simulation) -> tuple[simulator.SimRecord, int]:
        for rec in sim.records:
            for i, other in enumerate(rec.events):
                same = (other.kind, other.commit_ts, other.table, other.row_kind, other.new, other.old)
                if same == (ev.kind, ev.commit_ts, ev.table, ev.row_kind, ev.new, ev.old):
                    return rec, i
        raise AssertionError("event not found")

    rec, i = find(wide(large_message="claim-check", max_message_bytes=size, **settings))
    assert rec.large is None or rec.large[i] is None
    k, v = split_record(rec.key, rec.value)[i]
    assert (k, v) == (full_key, full_value) and len(k) + len(v) + OVERHEAD == size
    rec, i = find(wide(large_message="claim-check", max_message_bytes=size - 1, **settings))
    assert rec.large is not None and rec.large[i] is not None


ARCH_COMPRESSION = [(a, c) for a in ("classic", "new") for c in (None, "snappy", "lz4")]


@pytest.mark.parametrize(("architecture", "compression"), ARCH_COMPRESSION)
def test_claim_check_references_and_their_objects(architecture: str, compression: str | None) -> None:
    uri = {None: "file:///var/lib/ticdc/cc", "snappy": "s3://bucket/some/prefix/", "lz4": "file:////srv/cc"}
    cfg_uri = uri[compression]
    sim = wide(
        large_message="claim-check",
        architecture=architecture,
        compression=compression,
        claim_check_uri=cfg_uri,
    )
    limit = sim.config.max_message_bytes
    large = large_events(sim)
    assert large
    spots = {(id(rec), i) for rec, i, _, _ in large}
    for rec in sim.records:
        for i, (k, v) in enumerate(split_record(rec.key, rec.value)):
            assert len(k) + len(v) + OVERHEAD <= limit  # references and whole events alike
            if (id(rec), i) not in spots and rec.events[i].kind == "row":
                assert b'"ohk"' not in k and b'"ccl"' not in k
    for rec, i, ev, form in large:
        ref_key, ref_value = split_record(rec.key, rec.value)[i]
        assert form.option == "claim-check"
        assert NAME.fullmatch(form.object_name or "")
        assert form.location == cfg_uri.rstrip("/") + "/" + form.object_name
        pairs = key_pairs(ref_key)
        names = [n for n, _ in pairs]
        if architecture == "classic":
            assert names == ["ts", "scm", "tbl", "rid", "t", "ccl"]
            assert b'"ohk"' not in ref_key
        else:
            assert names == ["ts", "scm", "tbl", "t", "ohk", "ohk", "ccl"]
            assert b',"t":1,"ohk":true,"ohk":false,"ccl":"' in ref_key
        assert dict(pairs)["ccl"] == form.location
        assert (dict(pairs)["ts"], dict(pairs)["tbl"]) == (ev.commit_ts, ev.table)

        # The object: the full event, its key without the large-message fields.
        full_key, full_value = read_object(sim.claim_check_objects[form.object_name])
        assert len(full_key) + len(full_value) + OVERHEAD > limit
        assert key_pairs(full_key) == [p for p in pairs if p[0] not in ("ohk", "ccl")]
        full = json.loads(decompress_value(full_value, compression))
        if ev.row_kind == "delete":
            assert list(full) == ["d"] and image(full["d"]) == ev.old
        else:
            assert image(full["u"]) == ev.new and (image(full["p"]) if "p" in full else None) == ev.old

        # The reference's value: the handle-key columns of the same images, compressed alike.
        reduced = json.loads(decompress_value(ref_value, compression))
        assert list(reduced) == list(full)
        for name, cols in reduced.items():
            assert image(cols) == handle_key(image(full[name]))
            assert set(cols) == {"id"}


CASES = {
    "old-value": {},
    "only-updated": {"only_updated_columns": True},
    "no-old-value": {"old_value": False},
    "delete-handle-key": {"delete_only_handle_key": True},
}


@pytest.mark.parametrize("architecture", ["classic", "new"])
@pytest.mark.parametrize("case", list(CASES))
def test_large_values_hold_the_handle_key_columns_of_each_image(architecture: str, case: str) -> None:
    settings = {"seed": 12, "transactions": 150, "architecture": architecture, **CASES[case]}
    refs = wide(large_message="claim-check", **settings)
    hko = wide(large_message="handle-key-only", **settings)
    # The object names come from a generator of their own: both options make the same records,
    # with the same events large and the same values for them.
    assert [r.events for r in refs.records] == [r.events for r in hko.records]
    large, other = large_events(refs), large_events(hko)
    assert [where(refs, r, i) for r, i, _, _ in large] == [where(hko, r, i) for r, i, _, _ in other]
    kinds = set()
    for (rec, i, ev, _), (hrec, hi, _, _) in zip(large, other, strict=True):
        value = split_record(rec.key, rec.value)[i][1]
        assert split_record(hrec.key, hrec.value)[hi][1] == value
        doc = json.loads(value)
        kinds.add(ev.row_kind)
        hk = handle_key(ev.old if ev.row_kind == "delete" else ev.new)
        assert hk and set(hk) == {"id"}
        if ev.row_kind == "delete":
            assert list(doc) == ["d"]
        elif ev.row_kind == "insert" or not refs.config.sends_old_value:
            assert list(doc) == ["u"]
        elif case == "only-updated":
            # The handle key never changes in an update: classic omits the empty "p", new writes it.
            assert doc == ({"u": doc["u"]} if architecture == "classic" else {"u": doc["u"], "p": {}})
            assert (b'"p":{}' in value) == (architecture == "new")
        else:
            assert list(doc) == ["u", "p"]
        for name, cols in doc.items():
            if name != "p" or cols:
                assert image(cols) == hk, (case, ev.row_kind, name)
    assert "update" in kinds
    if case in ("delete-handle-key", "no-old-value"):
        assert "delete" not in kinds  # its "d" holds the handle key only: never large
    else:
        assert "delete" in kinds


@pytest.mark.parametrize("architecture", ["classic", "new"])
def test_handle_key_only_events(architecture: str) -> None:
    sim = wide(large_message="handle-key-only", architecture=architecture, compression="snappy")
    assert sim.claim_check_objects == {}
    large = large_events(sim)
    assert large
    for rec, i, ev, form in large:
        assert form == simulator.LargeMessage("handle-key-only")
        key, value = split_record(rec.key, rec.value)[i]
        expected = ["ts", "scm", "tbl", "t", "ohk"]
        if architecture == "classic":
            expected.insert(3, "rid")
        assert [n for n, _ in key_pairs(key)] == expected and dict(key_pairs(key))["ohk"] is True
        assert key.endswith(b',"t":1,"ohk":true}')
        doc = json.loads(decompress_value(value, "snappy"))
        for cols in doc.values():
            assert set(cols) <= {"id"}
        main = doc.get("d", doc.get("u"))
        assert image(main) == handle_key(ev.old if ev.row_kind == "delete" else ev.new)
    summary = sim.summary()
    assert summary["handle_key_only_events"] == len(large) and summary["claim_check_references"] == 0
    assert f"{len(large)} handle-key-only" in simulator.format_summary(sim)


def test_partitioned_rows_write_ptn_after_the_large_message_fields() -> None:
    ev = simulator.SimEvent(
        "row", 42, "s", "t", "insert", new={"id": (3, 0x0B, 7)}, row_id=7, partition_id=121
    )
    classic, new = EncoderOptions(row_ids=True), EncoderOptions(architecture="new")
    assert key_json(ev, classic, claim_check="s3://b/x.json") == (
        b'{"ts":42,"scm":"s","tbl":"t","rid":7,"ptn":121,"t":1,"ccl":"s3://b/x.json"}'
    )
    assert key_json(ev, classic, handle_key_only=True) == (
        b'{"ts":42,"scm":"s","tbl":"t","rid":7,"ptn":121,"t":1,"ohk":true}'
    )
    assert key_json(ev, new, claim_check="s3://b/x.json") == (
        b'{"ts":42,"scm":"s","tbl":"t","t":1,"ohk":true,"ohk":false,"ccl":"s3://b/x.json","ptn":121}'
    )
    assert (
        key_json(ev, new, handle_key_only=True) == b'{"ts":42,"scm":"s","tbl":"t","t":1,"ohk":true,"ptn":121}'
    )


def test_a_large_event_of_a_table_without_handle_key_fails_like_ticdc() -> None:
    ev = simulator.SimEvent(
        "row", 42, "s", "keyless", "insert", new={"k": (3, 0x40, 1), "v": (15, 0x40, "x")}
    )
    with pytest.raises(ValueError, match="no handle-key columns"):
        handle_key_value_json(ev, EncoderOptions())


def test_without_an_option_a_large_event_fails_the_stream() -> None:
    with pytest.raises(ValueError, match="max_message_bytes"):
        wide(transactions=60)
    sim = wide(transactions=60, max_message_bytes=32 << 20)  # everything fits: sent whole
    assert all(r.large is None for r in sim.records) and not sim.claim_check_objects
    assert any(ev.table == "wide" for r in sim.records for ev in r.events)


@pytest.mark.parametrize(
    "bad",
    [
        {"large_message": "none"},
        {"large_message": "claim-check", "claim_check_uri": ""},
        {"large_message": "handle-key-only", "legacy_strings": True},
        {"max_message_bytes": 0},
    ],
)
def test_impossible_large_message_settings_are_rejected(bad: dict) -> None:
    with pytest.raises(ValueError):
        simulator.StreamConfig(**bad).validate()


# -- copies -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "seed"), [("all-classic", 2), ("all-new", 2), ("replays", 6)])
def test_duplicates_keep_a_reference_and_restarts_store_the_event_again(mode: str, seed: int) -> None:
    settings = simulator.PRODUCER_MODES.get(mode, {"replays": True})
    sim = wide(seed=seed, transactions=200, large_message="claim-check", **settings)
    names: dict[int, list[str]] = defaultdict(list)
    originals: dict[tuple[bytes, bytes], simulator.SimRecord] = {}
    duplicated = 0
    for rec, _, ev, form in large_events(sim):
        assert form.object_name in sim.claim_check_objects
        if rec.duplicate:
            duplicated += 1
            orig = originals[(rec.key, rec.value)]  # the same bytes, so the same reference
            assert orig.large == rec.large
            continue
        originals[(rec.key, rec.value)] = rec
        names[id(ev)].append(form.object_name or "")
    every = [n for ns in names.values() for n in ns]
    assert len(every) == len(set(every))  # each encoding draws a new name
    resent = [ns for ns in names.values() if len(ns) > 1]
    assert resent and duplicated
    for ns in resent:  # the restarted encoder stored the same event again
        assert len({sim.claim_check_objects[n] for n in ns}) == 1
    orphans = set(sim.claim_check_objects) - set(every)
    if not sim.config.late_first_copies:
        assert not orphans  # only a lost record, or a batch dropped by a restart, leaves one behind
    summary = sim.summary()
    assert summary["claim_check_references"] == len(large_events(sim))
    assert summary["claim_check_objects"] == len(sim.claim_check_objects)
    assert summary["claim_check_bytes"] == sum(map(len, sim.claim_check_objects.values()))
    assert f"{len(sim.claim_check_objects)} objects" in simulator.format_summary(sim)


def test_a_seed_reproduces_records_and_objects() -> None:
    one, two = (wide(seed=9, transactions=100, large_message="claim-check") for _ in range(2))
    assert [(r.partition, r.key, r.value, r.large) for r in one.records] == [
        (r.partition, r.key, r.value, r.large) for r in two.records
    ]
    assert one.claim_check_objects == two.claim_check_objects and one.claim_check_objects
    other = wide(seed=10, transactions=100, large_message="claim-check")
    assert not set(other.claim_check_objects) & set(one.claim_check_objects)


def test_write_claim_check_objects(tmp_path) -> None:
    sim = wide(seed=9, transactions=100, large_message="claim-check")
    assert simulator.write_claim_check_objects(sim, tmp_path / "cc") == len(sim.claim_check_objects) > 0
    written = {p.name: p.read_bytes() for p in (tmp_path / "cc").iterdir()}
    assert written == sim.claim_check_objects
    for _, _, _, form in large_events(sim):  # a reference's base name is the file's name
        assert (form.location or "").rsplit("/", 1)[1] in written


# -- the wide table -----------------------------------------------------------------------------


def test_wide_rows_carry_large_text_and_bytes() -> None:
    sim = wide(seed=4, transactions=200, large_message="claim-check")
    spec = sim.table_spec("wide")
    assert spec is not None and spec.handle_key == ("id",)
    assert [c.sql_type for c in spec.columns] == [
        "BIGINT",
        "VARCHAR(64)",
        "LONGTEXT",
        "LONGBLOB",
        "MEDIUMTEXT",
    ]
    sizes: dict[str, list[int]] = defaultdict(list)
    kinds, keys = set(), set()
    multibyte = False
    for rec in sim.records:
        for ev in rec.events:
            if ev.kind != "row" or ev.table != "wide":
                continue
            kinds.add(ev.row_kind)
            for img in (ev.new, ev.old):
                for name, (_, _, v) in (img or {}).items():
                    keys.add(img["id"][2])
                    if isinstance(v, str | bytes) and name != "title":
                        size = len(v.encode() if isinstance(v, str) else v)
                        assert size <= 200 or 300_000 <= size <= 2_000_000, (name, size)
                        sizes[name].append(size)
                        if isinstance(v, str) and len(v) < size:
                            multibyte = True
                        if name == "data":
                            assert isinstance(v, bytes)
    assert kinds == {"insert", "update", "delete"} and multibyte
    assert keys <= set(range(1, 6))
    assert all(max(sizes[n]) > 300_000 for n in ("body", "data", "note"))
    assert 20_000_000 < sum(map(len, sim.claim_check_objects.values())) < 150_000_000


@pytest.mark.parametrize("mode", sorted(simulator.PRODUCER_MODES))
def test_wide_rows_in_every_producer_mode(mode: str) -> None:
    sim = wide(seed=6, transactions=100, large_message="claim-check", **simulator.PRODUCER_MODES[mode])
    assert large_events(sim)
    rows = {id(ev) for evs in sim.first_copies().values() for ev in evs if ev.kind == "row"}
    assert len(rows) == sum(len(step.changes) for step in sim.steps)
    # The full events' first copies, applied in commit order, give the expected wide table at
    # every resolved ts, value for value.
    events = sorted(
        (ev for evs in sim.first_copies().values() for ev in evs if ev.kind == "row" and ev.table == "wide"),
        key=lambda ev: (ev.commit_ts, ev.row_kind != "delete"),
    )
    state: dict[int, dict[str, Any]] = {}
    at = 0
    for ts in sim.resolved_points:
        while at < len(events) and events[at].commit_ts <= ts:
            ev = events[at]
            at += 1
            if ev.row_kind == "delete":
                assert ev.old is not None
                del state[ev.old["id"][2]]
            else:
                assert ev.new is not None
                state[ev.new["id"][2]] = {n: v for n, (_, _, v) in ev.new.items()}
        expected = sim.expected_snapshot(ts).get((sim.schema, "wide"))
        if expected is None:
            assert not state
            continue
        assert sorted(state) == [row["id"] for row in expected]
        for row in expected:
            got = state[row["id"]]
            assert all(got[n] == v and type(got[n]) is type(v) for n, v in row.items())
    assert at == len(events)


def test_simulate_command_writes_the_objects_before_producing(tmp_path, monkeypatch, capsys) -> None:
    import applier.simulator
    from applier.cli import main

    produced = []

    def produce(bootstrap: str, topic: str, sim: simulator.Simulation) -> int:
        produced.append((bootstrap, topic, {p.name for p in tmp_path.iterdir()}, sim))
        return len(sim.records)

    monkeypatch.setattr(applier.simulator, "produce_simulation", produce)
    argv = ["simulate", "--kafka-bootstrap", "k:1", "--topic", "t", "--transactions", "60", "--wide-rows"]
    argv += ["--large-message", "claim-check", "--claim-check-uri", "s3://b/p/", "--claim-check-dir"]
    assert main([*argv, str(tmp_path)]) == 0
    ((bootstrap, topic, files, sim),) = produced
    assert (bootstrap, topic) == ("k:1", "t")
    assert files == set(sim.claim_check_objects) and files
    cfg = sim.config
    assert (cfg.wide_rows, cfg.large_message, cfg.claim_check_uri) == (True, "claim-check", "s3://b/p/")
    assert all(f.location.startswith("s3://b/p/") for _, _, _, f in large_events(sim) if f.location)
    assert f"wrote {len(files)} claim-check objects" in capsys.readouterr().out


class _Cursor:
    """Just enough of a pymysql cursor for compare_downstream over given tables."""

    def __init__(self, tables: dict[str, tuple[list[str], list[tuple]]]) -> None:
        self.tables = tables
        self.result: list[tuple] = []

    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, sql: str, params: tuple = ()) -> None:
        if sql.startswith("SELECT @@session.time_zone"):
            self.result = [("+00:00",)]
        elif "information_schema.COLUMNS" in sql:
            self.result = [(c,) for c in self.tables.get(params[1], ([], []))[0]]
        elif sql.startswith("SELECT "):
            table = sql.rsplit(".", 1)[1].strip("`")
            self.result = list(self.tables[table][1])
        else:
            self.result = []

    def fetchone(self) -> tuple:
        return self.result[0]

    def fetchall(self) -> list[tuple]:
        return self.result


class _Connection:
    def __init__(self, tables: dict[str, tuple[list[str], list[tuple]]]) -> None:
        self.tables = tables

    def get_autocommit(self) -> bool:
        return True

    def cursor(self) -> _Cursor:
        return _Cursor(self.tables)


def test_the_downstream_check_compares_wide_rows_byte_for_byte() -> None:
    from applier.simulator import compare_downstream

    sim = wide(seed=4, transactions=80, large_message="claim-check")
    ts = sim.final_resolved_ts
    tables = {
        table: (
            list(rows[0]) if rows else sim.tables_at(ts)[table].column_names,
            [tuple(r.values()) for r in rows],
        )
        for (_, table), rows in sim.expected_snapshot(ts).items()
    }
    columns, rows = tables["wide"]
    assert rows and compare_downstream(_Connection(tables), sim, ts) == []
    data, body = columns.index("data"), columns.index("body")
    at = next(i for i, r in enumerate(rows) if isinstance(r[data], bytes) and len(r[data]) > 300_000)
    assert isinstance(rows[at][body], str)
    # One byte in the middle of a LONGBLOB, one character in the middle of a LONGTEXT.
    for index, other in ((data, b"\x00\x01"), (body, "\x00\x01")):
        value = rows[at][index]
        middle = len(value) // 2
        replacement = other[1:] if value[middle : middle + 1] == other[:1] else other[:1]
        changed = list(rows[at])
        changed[index] = value[:middle] + replacement + value[middle + 1 :]
        bad = {**tables, "wide": (columns, [*rows[:at], tuple(changed), *rows[at + 1 :]])}
        diffs = compare_downstream(_Connection(bad), sim, ts)
        assert len(diffs) == 1 and f".wide (id={rows[at][0]}): column {columns[index]}:" in diffs[0]

"""The compiled planning loops give what their Python definitions give.

``sqlgen/_plan.pyx`` (``plan_keyed``) is the daemon's collapse of a keyed table's events and
``sqlgen/_bind.pyx``'s ``batch_ends`` the cut of a statement's rows; the Python
``sqlgen.collapse._plan_keyed`` and the loop written out below are their definitions. Generated
windows mix what the daemon's row cache holds (compact new images, trimmed old images) with
whole dict images, composite keys, keys that move, NULL keys that do not sort, generated and
missing columns, replayed duplicates and unplannable events.
"""

from __future__ import annotations

import random
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier.codec.events import FLAG_GENERATED, CompactImage, RowEvent, RowKind
from applier.stream.listener import _compact_keyed
from sqlgen import PlanError, collapse, dml
from sqlgen._bind import batch_ends
from sqlgen._plan import plan_keyed
from sqlgen.dialect import MARIADB
from tests.builders import PK, column, row_event

INT, VARCHAR = 3, 15
INS, UPD, DEL = RowKind.INSERT, RowKind.UPDATE, RowKind.DELETE


def _image(rnd: random.Random, key: tuple[Any, ...], composite: bool, gen: bool, extra: bool) -> dict:
    img = {"id": column(INT, key[0], PK)}
    if composite:
        img["id2"] = column(VARCHAR, key[1], PK)
    img["v"] = column(VARCHAR, f"v{rnd.randrange(1000)}")
    if gen:
        img["g"] = column(INT, rnd.randrange(9), FLAG_GENERATED)
    if extra:
        img["w"] = column(INT, rnd.randrange(9))
    return img


def _window(seed: int, n: int) -> list[RowEvent]:
    """A random window of one keyed table: the daemon's shapes and the unusual ones."""
    rnd = random.Random(seed)
    composite = rnd.random() < 0.3
    shapes: dict = {}
    events: list[RowEvent] = []

    def key() -> tuple[Any, ...]:
        first = None if rnd.random() < 0.05 else rnd.randint(1, 6)
        return (first, rnd.choice("ab")) if composite else (first,)

    for _ in range(n):
        ts = rnd.randint(1, 5)  # few distinct ts: many ties between deletes and upserts
        gen, extra = rnd.random() < 0.2, rnd.random() < 0.2
        r = rnd.random()
        if r < 0.35:
            ev = row_event(INS, ts, _image(rnd, key(), composite, gen, extra))
        elif r < 0.6:
            k = key()
            new = _image(rnd, k if rnd.random() < 0.7 else key(), composite, gen, extra)
            old = _image(rnd, k, composite, gen, extra) if rnd.random() < 0.8 else None
            ev = row_event(UPD, ts, new, old)
        else:
            ev = row_event(DEL, ts, None, _image(rnd, key(), composite, gen, extra))
        if rnd.random() < 0.7:
            _compact_keyed(ev, shapes)  # as the daemon's row cache holds it
        events.append(ev)
        if rnd.random() < 0.1:
            events.append(ev)  # a replayed duplicate
    return events


def _same(compiled: collapse.TablePlan, reference: collapse.TablePlan) -> None:
    assert compiled == reference
    for a, b in zip(compiled.upserts, reference.upserts, strict=True):
        assert a.keys == b.keys and a.rows == b.rows  # in the same order, not only equal sets


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 50))
def test_compiled_collapse_plans_as_the_python_definition(seed: int, n: int) -> None:
    events = _window(seed, n)
    _same(plan_keyed(events), collapse._plan_keyed(events))


def test_the_daemon_plans_with_the_compiled_collapse() -> None:
    assert collapse.plan_keyed is plan_keyed
    ev = row_event(INS, 1, {"id": column(INT, 1, PK)})
    assert collapse.plan_table("s", "t", [ev]).upserts[0].keys == [(1,)]


def test_a_subclass_of_row_event_is_read_by_its_attributes() -> None:
    class Odd(RowEvent):
        __slots__ = ()

    plain = row_event(INS, 3, {"id": column(INT, 7, PK), "v": column(VARCHAR, "x")})
    odd = Odd(plain.commit_ts, plain.schema, plain.table, plain.kind, plain.new, None, None, plain.pos)
    _same(plan_keyed([odd]), collapse._plan_keyed([odd]))


@pytest.mark.parametrize(
    "event",
    [
        row_event(DEL, 1, None, None),
        row_event(INS, 1, None, None),
        row_event(UPD, 1, None, {"id": column(INT, 1, PK)}),
        row_event(INS, 1, {"v": column(VARCHAR, "no key")}),
        row_event(DEL, 1, None, {"v": column(VARCHAR, "no key")}),
    ],
)
def test_unplannable_events_fail_as_in_the_python_definition(event: RowEvent) -> None:
    with pytest.raises(PlanError) as reference:
        collapse._plan_keyed([event])
    with pytest.raises(PlanError) as compiled:
        plan_keyed([event])
    assert str(compiled.value) == str(reference.value)


def test_a_compact_image_without_key_fails_as_in_the_python_definition() -> None:
    ev = row_event(INS, 1, {"v": column(VARCHAR, "x"), "w": column(INT, 1)})
    _compact_keyed(ev, {})
    assert type(ev.new) is CompactImage and not ev.new.shape.key_names
    with pytest.raises(PlanError) as reference:
        collapse._plan_keyed([ev])
    with pytest.raises(PlanError) as compiled:
        plan_keyed([ev])
    assert str(compiled.value) == str(reference.value)


# --- batch_ends: the cut of a statement's rows ---------------------------------------------------


def _ends_by_definition(
    rows: list[tuple[Any, ...]], var_idx: list[int], per: int, budget: int, fixed: int
) -> list[int]:
    """The loop ``sqlgen.dml._batches`` ran in Python before it was compiled."""
    ends: list[int] = []
    start = size = 0
    for i, row in enumerate(rows):
        rsize = fixed + sum(dml.literal_bytes(row[j]) if row[j] is not None else 4 for j in var_idx)
        if i > start and (i - start >= per or size + rsize > budget):
            ends.append(i)
            start, size = i, 0
        size += rsize
    if start < len(rows):
        ends.append(len(rows))
    return ends


_VALUES = st.one_of(
    st.none(),
    st.text(max_size=20),
    st.text(alphabet="ab'\\", min_size=250, max_size=270),  # around the exact-measure length
    st.text(min_size=250, max_size=270),
    st.binary(max_size=30),
    st.integers(),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(Decimal),
)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(_VALUES, _VALUES, st.integers()), max_size=40),
    per=st.integers(1, 8),
    budget=st.integers(0, 3000),
    fixed=st.integers(0, 40),
)
def test_compiled_batch_ends_cut_as_the_python_loop(rows: list, per: int, budget: int, fixed: int) -> None:
    var_idx = [0, 1]
    expected = _ends_by_definition(rows, var_idx, per, budget, fixed)
    got = batch_ends(
        rows, var_idx, per, budget, fixed, dml._EXACT_FROM, dml._BYTES_LITERAL_EXTRA, dml.literal_bytes
    )
    assert got == expected


def test_statements_cut_by_the_compiled_loop_fit_the_budget() -> None:
    """End to end: REPLACEs of wide rows are cut where the byte budget says, never past it."""
    dialect = MARIADB.__class__(name="mariadb", max_statement_bytes=10_000)
    group = collapse.UpsertGroup(("id", "v"), (INT, VARCHAR))
    for i in range(200):
        group.rows.append((i, "é" * (i % 300)))
        group.keys.append((i,))
    sts = list(dml.replace_statements("s", "t", group, dialect))
    assert sum(st.rows for st in sts) == 200
    assert all(len(st.bound(lambda v: "'" + str(v) + "'").encode()) <= 10_000 for st in sts if st.rows > 1)
    assert len(sts) > 1


@pytest.mark.parametrize(
    ("module", "compiled", "source"),
    [
        ("sqlgen.collapse", "sqlgen._plan", "sqlgen/_plan.pyx"),
        ("sqlgen.dml", "sqlgen._bind", "sqlgen/_bind.pyx"),
        ("applier.codec.decoder", "applier.codec._fastpath", "applier/codec/_fastpath.pyx"),
    ],
)
def test_an_install_without_a_compiled_module_says_how_to_build_it(
    module: str, compiled: str, source: str
) -> None:
    """One line naming the source and the command, not a bare ImportError (or a slow fallback)."""
    probe = (
        "import sys\n"
        f"sys.modules[{compiled!r}] = None  # as if it had never been built\n"
        "try:\n"
        f"    __import__({module!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert source in out and "pip install -e ." in out and len(out.strip().splitlines()) == 1

"""Rows of huge upstream transactions kept on local disk, and windows applied from there in pieces.

Why: the rows of one commit ts can only be applied once every partition's resolved ts passed it
(docs/open-protocol.md §5.5), and TiCDC sends a transaction whole when ``transaction-atomicity``
keeps it together: a million rows all at one commit ts, spread over the partitions. Held as
decoded Python objects (about 2 KB a row) such a transaction alone would need gigabytes, and
pausing the partitions ahead of the barrier does not help: the partitions still reading it are
the ones holding the barrier back. So once the row cache is over ``max_cached_bytes`` the barrier
moves the in-memory rows of the biggest commit ts that cannot be applied yet to files here
(``Barrier.spill_over``), and a window holding such rows is applied as a stream of pieces inside
its one transaction (:class:`StreamedRows`, ``WindowApplier``).

Files: ``<spill dir>/<changefeed>/p<partition>-<commit ts>-{d,u}.spill``, one pair per partition
and commit ts, appended to while the transaction arrives, removed once its window is applied,
and all of them at start-up: they are never trusted after a restart, the topic is re-read from
the checkpoint's offsets (which a spill never moves). Each file is a sequence of ``marshal``
batches of compact row tuples (for sysbench-shaped rows 0.8x the record bytes; with the
daemon's GC settings writing costs about 5 us a row and reading back 20 us, most of it building
the row objects again; pickle was no faster and is less compact, and re-reading the records would
mean decoding and filtering them again). marshal builds nothing but plain values, so a file can
never make the process run code.

Why two files: the pieces of one commit ts must be applied in the order :func:`sqlgen.plan_window`
gives its ops, every delete before every upsert ("deletes before inserts at equal ts"): a
primary-key change A 1->2 with B 2->3 deletes key 2 and writes key 2 at the same ts, and the
delete must not come last. ``sqlgen.split_phases`` puts each row's delete part in the ``d`` file
and its upsert part in the ``u`` file.

Why the pieces converge to what applying the whole window at once gives (see
``sqlgen/collapse.py`` for the whole-window argument):

- Commit ts groups small enough are never cut: a piece holds whole commit ts groups, so it starts
  from the upstream snapshot at its lower bound and the whole-window argument applies to it.
- A commit ts group T larger than a piece is applied alone, starting from the snapshot before T:
  first its delete phase in pieces (DELETE by handle key, keyless DELETE ... LIMIT 1: neither
  depends on the order of the others), then its upsert phase in pieces. Every upsert of T is a
  row as it is at the end of T (TiCDC sends one net change per row and transaction, §5.9; a
  replay repeats the same image), so the upserts of T never conflict with one another nor with
  a row T leaves untouched; a REPLACE that removes a conflicting row removes a row T changes,
  whose own final state (deleted, or an upsert of T) is already written or comes in a later
  piece. So after the last piece the table is the snapshot at T whatever the cut. Keyless ops
  run in exactly the whole window's order (deletes of T in arrival order, then inserts).
- Applying a piece whose commit ts span several groups of which one is cut would not be safe
  (a piece ending inside T would REPLACE an older image of a key whose newer one comes later,
  and could remove a row written earlier in it), hence the rule above.

All pieces and the checkpoint are one database transaction: a crash anywhere rolls all of it back.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from applier.codec.events import ROW_KINDS, Position, RowEvent
from applier.errors import ConfigurationError
from sqlgen import split_phases

CHUNK_ROWS = 10_000
"""Rows per piece of a streamed window: big enough for multi-row statements to pay off, small
enough that a piece (rows, plan and SQL text, about 30 MB) is a small constant next to the cache."""

BATCH_ROWS = 1_000
"""Rows per marshal batch in a spill file (one read or write call each)."""


class SpillDirUnusable(ConfigurationError):
    """The spill directory cannot be made: a read-only file system (a read-only container without
    a volume there), no permission, no temp directory at all. Only the deployment can fix it."""


_WHAT_TO_DO = (
    "set spill_dir (APPLIER_SPILL_DIR) to a directory the daemon's user can write: under systemd the "
    "unit's StateDirectory, in a read-only container a volume or a tmpfs (docs/operations.md, "
    '"Disk for huge transactions")'
)


def default_spill_root() -> Path:
    """Where spill files go when ``spill_dir`` is not set: systemd's ``StateDirectory`` when the
    unit has one (``$STATE_DIRECTORY``, first entry), else the system temp directory."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "spill"
    try:
        return Path(tempfile.gettempdir()) / "ticdc-applier-spill"
    except FileNotFoundError:  # no writable TMPDIR, /tmp, /var/tmp, /usr/tmp or working directory
        raise SpillDirUnusable(
            f"no writable temporary directory for the spill files; {_WHAT_TO_DO}"
        ) from None


def _pack_image(image: dict | None) -> tuple | None:
    if image is None:
        return None
    out: list = []
    for name, col in image.items():
        out += (name, col["t"], col["f"], col["v"])
    return tuple(out)


def _unpack_image(packed: tuple | None) -> dict | None:
    if packed is None:
        return None
    it = iter(packed)
    return {name: {"t": t, "f": f, "v": v} for name, t, f, v in zip(it, it, it, it, strict=True)}


def pack_row(ev: RowEvent) -> tuple:
    """A row as a tuple of plain values (what ``marshal`` can write)."""
    p = ev.pos
    return (
        ev.commit_ts,
        ev.schema,
        ev.table,
        int(ev.kind),
        _pack_image(ev.new),
        _pack_image(ev.old),
        ev.partition_id,
        ev.row_id,
        p.topic,
        p.partition,
        p.offset,
        p.index,
    )


def unpack_row(t: tuple) -> RowEvent:
    ts, schema, table, kind, new, old, ptn, rid, topic, partition, offset, index = t
    return RowEvent(
        ts,
        schema,
        table,
        ROW_KINDS[kind],
        _unpack_image(new),
        _unpack_image(old),
        ptn,
        Position(topic, partition, offset, index),
        rid,
    )


@dataclass(slots=True)
class SpillFiles:
    """The two files of one partition's rows of one commit ts: delete parts and upsert parts."""

    delete_path: Path
    upsert_path: Path
    rows: int = 0  # rows appended (before splitting into parts)
    bytes_written: int = 0

    def append(self, rows: Iterable[RowEvent]) -> None:
        """Append rows (in arrival order): their delete parts to one file, upsert parts to the other."""
        deletes: list[tuple] = []
        upserts: list[tuple] = []
        n = 0
        for ev in rows:
            d, u = split_phases(ev)
            if d is not None:
                deletes.append(pack_row(d))
            if u is not None:
                upserts.append(pack_row(u))
            n += 1
        for path, packed in ((self.delete_path, deletes), (self.upsert_path, upserts)):
            if packed:
                with open(path, "ab") as fh:
                    for i in range(0, len(packed), BATCH_ROWS):
                        blob = marshal.dumps(packed[i : i + BATCH_ROWS])
                        fh.write(blob)
                        self.bytes_written += len(blob)
        self.rows += n

    def read(self, phase: str) -> Iterator[list[RowEvent]]:
        """Batches of the ``"d"`` (delete) or ``"u"`` (upsert) parts, in the order appended."""
        path = self.delete_path if phase == "d" else self.upsert_path
        try:
            fh = open(path, "rb")  # noqa: SIM115 (closed below, also when the reader stops early)
        except FileNotFoundError:
            return  # no part of this phase was ever written
        with fh:
            while True:
                try:
                    batch = marshal.load(fh)
                except EOFError:
                    return
                yield [unpack_row(t) for t in batch]

    def remove(self) -> None:
        for path in (self.delete_path, self.upsert_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class SpillDir:
    """The spill directory of one changefeed: ``<root>/<changefeed>``, emptied when opened.

    Open it only once the single-active lock is held: a standby on the same host must not empty
    the directory of the active instance.
    """

    def __init__(self, root: str | os.PathLike[str], changefeed: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", changefeed)[:64]
        digest = hashlib.sha256(changefeed.encode()).hexdigest()[:8]
        self.path = Path(root) / f"{safe}-{digest}"

    def open(self) -> SpillDir:
        """Remove whatever an earlier run left (never trusted), create the directory (mode 0700)."""
        try:
            if self.path.exists():
                shutil.rmtree(self.path)
            self.path.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            raise SpillDirUnusable(
                f"cannot make the spill directory {self.path}: {exc.strerror or exc}; {_WHAT_TO_DO}"
            ) from None
        return self

    def remove(self) -> None:
        """Remove the directory and whatever is in it (at exit; a crash leaves it to the next start)."""
        shutil.rmtree(self.path, ignore_errors=True)

    def files(self, partition: int, commit_ts: int) -> SpillFiles:
        stem = f"p{partition}-{commit_ts}"
        return SpillFiles(self.path / f"{stem}-d.spill", self.path / f"{stem}-u.spill")


@dataclass(frozen=True, slots=True)
class GroupPart:
    """One partition's rows of one commit ts in a window: ``spilled`` first (on disk, if any),
    then ``rows`` (in memory), which is their arrival order."""

    commit_ts: int
    partition: int
    spilled: SpillFiles | None
    rows: list[RowEvent]

    @property
    def count(self) -> int:
        return len(self.rows) + (self.spilled.rows if self.spilled is not None else 0)

    def phase(self, phase: str) -> Iterator[list[RowEvent]]:
        """Batches of the delete (``"d"``) or upsert (``"u"``) parts of the rows, in arrival order."""
        if self.spilled is not None:
            yield from self.spilled.read(phase)
        i = 0 if phase == "d" else 1
        parts = [p for ev in self.rows if (p := split_phases(ev)[i]) is not None]
        if parts:
            yield parts


@dataclass(frozen=True, slots=True)
class StreamedRows:
    """The rows of a window some of which are on disk, in (commit ts, partition) order."""

    parts: tuple[GroupPart, ...]
    count: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", sum(p.count for p in self.parts))

    def chunks(self, chunk_rows: int = CHUNK_ROWS) -> Iterator[list[RowEvent]]:
        """The pieces to plan and apply one after the other in one transaction (module docstring):
        whole commit ts groups together up to about ``chunk_rows`` rows; a larger group alone, its
        delete parts first, then its upsert parts, ``chunk_rows`` at a time."""
        chunk: list[RowEvent] = []
        parts = self.parts
        i = 0
        while i < len(parts):
            j = i
            while j < len(parts) and parts[j].commit_ts == parts[i].commit_ts:
                j += 1
            group = parts[i:j]
            size = sum(p.count for p in group)
            if size > chunk_rows:
                if chunk:
                    yield chunk
                    chunk = []
                for phase in ("d", "u"):
                    for p in group:
                        for batch in p.phase(phase):
                            chunk.extend(batch)
                            if len(chunk) >= chunk_rows:
                                yield chunk
                                chunk = []
                    if chunk:
                        yield chunk
                        chunk = []
            else:
                if chunk and len(chunk) + size > chunk_rows:
                    yield chunk
                    chunk = []
                for p in group:  # plan_window orders the parts of one ts itself
                    if p.spilled is not None:
                        for phase in ("d", "u"):
                            for batch in p.spilled.read(phase):
                                chunk.extend(batch)
                    chunk.extend(p.rows)
            i = j
        if chunk:
            yield chunk

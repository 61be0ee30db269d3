# cython: language_level=3, boundscheck=False, wraparound=False
"""The readers' hot loop, compiled: decoded events in, Arrow batches of ``rows.SPARK_SCHEMA`` out.

Every event of the backlog passes through :meth:`BatchBuilder.add_record` once, so its cost per
event bounds the scan (at ten million events, most of a catch-up's time). What the rows mean,
the skeleton, the replay rule and the collapse are explained in :mod:`applier.catchup.rows`;
this module only does it with C locals, typed containers and few Python-level calls per event.
Commit ts are held as 64-bit integers: the decoder's ts fit, and one that does not fails the record.
The skeleton rows leave in bundles (``rows.bundle_row``) and the rows for the writers in one
pickled list per writer bucket (``rows`` module docstring, kind ROWS): the JVM then caches and
shuffles a few large rows instead of one small row per event.
"""

import pickle
from zlib import crc32

from applier.codec._slots cimport get_slot, slot_offsets

from applier.catchup.rows import (
    DDL,
    RESOLVED,
    ROW,
    ROWS,
    STATS,
    bundle_row,
    dump_images,
    old_handle_key,
    record_digest,
    rows_batch,
)
from applier.codec._fastpath import compact_image
from applier.codec.events import (
    CompactImage,
    DDLEvent,
    ImageShape,
    LargeMessageEvent,
    ResolvedEvent,
    RowEvent,
    RowKind,
    handle_key_names,
    key_only,
)
from applier.large_messages.errors import LargeMessageNotConfigured

cdef object _INSERT = RowKind.INSERT
cdef object _UPDATE = RowKind.UPDATE
cdef object _DELETE = RowKind.DELETE
cdef long long _MAX_TS = (1 << 63) - 1
cdef int _PICKLE = pickle.HIGHEST_PROTOCOL
cdef object _dumps = pickle.dumps
cdef tuple _NO_NAMES = ()
cdef int _RUN_BITS = 10  # integer keys go to writer buckets in runs of 1,024 values (_bucket)
cdef Py_ssize_t _MAX_RUNS = 1 << 16  # runs whose bucket a builder remembers (_bucket)

# Slots read by their offset (applier/codec/_slots.pxd), each after a check of the exact type.
cdef enum:
    _EV_TS, _EV_SCHEMA, _EV_TABLE, _EV_KIND, _EV_NEW, _EV_OLD, _EV_NEW_VALUES
cdef enum:
    _CI_SHAPE, _CI_VALUES
cdef enum:
    _SH_KEY_NAMES, _SH_KEY_INDEX, _SH_INDEX
cdef Py_ssize_t _EV[7]
cdef Py_ssize_t _CI[2]
cdef Py_ssize_t _SH[3]
slot_offsets(RowEvent, ("commit_ts", "schema", "table", "kind", "new", "old", "new_values"), _EV)
slot_offsets(CompactImage, ("shape", "column_values"), _CI)
slot_offsets(ImageShape, ("key_names", "key_index", "index"), _SH)


cdef inline object _shape_of(object image):
    """The ImageShape of a CompactImage (both checked: their slots are read by offset)."""
    if type(image) is not CompactImage:
        raise TypeError(f"not a CompactImage: {type(image).__name__}")
    cdef object shape = get_slot(image, _CI[_CI_SHAPE])
    if type(shape) is not ImageShape:
        raise TypeError(f"not an ImageShape: {type(shape).__name__}")
    return shape


cdef class BatchBuilder:
    """Accumulates events as Arrow columns; ``flush()`` returns a RecordBatch and starts anew.

    ``lower_ts``: keyed rows at or below it are not applied by this catch-up, so they are only
    emitted as skeleton rows, without images or key. ``collapse_upto``: ops at or below it are
    collapsed to the last op per handle key (``rows`` module docstring); ``max_keys`` bounds the
    winners held before they are written out. ``buckets``: how many writer buckets the rows for
    the writers are spread over by handle key (each flush sends one ROWS row per bucket).
    """

    cdef readonly object lower_ts
    cdef readonly object collapse_upto
    cdef readonly Py_ssize_t max_keys
    cdef readonly Py_ssize_t records
    cdef readonly Py_ssize_t row_events
    cdef readonly Py_ssize_t data_rows  # rows written out for the writers (ops and collapse winners)
    cdef readonly Py_ssize_t buckets
    cdef long long _lower
    cdef long long _upto  # -1: no collapsing
    cdef list _out  # per writer bucket: the rows the writers read (rows.WRITER_ROW tuples)
    cdef Py_ssize_t _out_rows
    cdef dict _shapes  # image column names -> ImageShape (compact_image's layouts)
    cdef list _skel  # skeleton rows: bundled at each flush (rows module docstring)
    # collapse: (segment, schema, table) -> key -> [ts, prio, part, off, idx, op, new, old, lo]
    cdef dict _best
    cdef Py_ssize_t _best_keys
    cdef Py_ssize_t _segment
    cdef dict _obs  # per partition: highest resolved ts read so far
    # (schema, table) -> image column names -> handle-key column names (see _names)
    cdef dict _key_names
    # the last group _op looked up (rows of a record are mostly of one table): group, table, dict
    cdef object _last_group
    cdef tuple _last_table
    cdef dict _last_best
    # add_record's last (schema, table) tuple: rows of a record are mostly of one table, and one
    # tuple for all of them makes the comparisons with it pointer comparisons
    cdef tuple _table
    # writer bucket of a run of integer keys (_bucket): (schema, table, key names, run) -> bucket
    cdef dict _runs

    def __init__(self, lower_ts, *, collapse_upto=None, Py_ssize_t max_keys=200_000, Py_ssize_t buckets=1):
        if buckets < 1:
            raise ValueError(f"buckets must be at least 1, not {buckets}")
        self.lower_ts = lower_ts
        self.collapse_upto = collapse_upto
        self.max_keys = max_keys
        self.buckets = buckets
        # Below 0 nothing is at or below it; above the ts range everything is.
        self._lower = -1 if lower_ts < 0 else min(lower_ts, _MAX_TS)
        self._upto = -1 if collapse_upto is None or collapse_upto < 0 else min(collapse_upto, _MAX_TS)
        self._out = [[] for _ in range(buckets)]
        self._out_rows = 0
        self._shapes = {}
        self._skel = []
        self._best = {}
        self._best_keys = 0
        self._segment = 0
        self._obs = {}
        self._key_names = {}
        self._last_group = None
        self._table = ("", "")
        self._runs = {}
        self.records = 0
        self.row_events = 0
        self.data_rows = 0

    def __len__(self):
        """Rows ready to flush (collapse winners join them when written out)."""
        return self._out_rows + len(self._skel)

    cdef tuple _names(self, tuple table, object row):
        """The handle-key column names of an image of ``table``, cached per table and column
        list: within one segment (between two DDL records) a table's column list always has the
        same flags. Two tables may share a column list with other keys, and a DDL may move the
        key without changing the columns (``ADD PRIMARY KEY``): hence the table in the cache's
        key, and a new cache at each DDL record. No image, or an empty one: no names."""
        if type(row) is CompactImage:  # the decoder's keyed images know their key
            return <tuple>get_slot(_shape_of(row), _SH[_SH_KEY_NAMES])
        if row is None or not row:  # (a compact image is never empty: its len() is Python code)
            return _NO_NAMES
        cdef dict by_cols = self._key_names.get(table)
        if by_cols is None:
            by_cols = self._key_names[table] = {}
        cdef tuple cols = tuple(row)
        cdef object names = by_cols.get(cols)
        if names is None:
            names = by_cols[cols] = tuple(handle_key_names(row))
        return <tuple>names

    def add_record(self, partition, offset, events, raw):
        """Append the events of one decoded record (raises LargeMessageNotConfigured like the daemon).

        One pass writes each row's ops (or keeps them as collapse winners); the skeleton rows of
        the record follow, once the whole record tells which rows they are."""
        cdef list rows = []  # (index, event, keyed) of the row events
        cdef list skeleton = self._skel
        cdef object obs = self._obs.get(partition)
        cdef long long c_obs = -1 if obs is None else obs
        cdef bint keyless = False
        # While every keyed row of the record is of one table (the usual record), whether their
        # commit ts never decrease: the skeleton marks are then known without _skeleton_marks.
        cdef bint one_table = True, ordered = True
        cdef tuple first_table = None
        cdef long long last_ts = -1
        cdef Py_ssize_t i = 0
        cdef long long ts
        cdef tuple nn, on, table, key, okey, ovals
        cdef object new, old, kind, scm, tbl
        self.records += 1
        for ev in events:
            if type(ev) is RowEvent:
                try:
                    ts = get_slot(ev, _EV[_EV_TS])
                except OverflowError:
                    raise ValueError(f"commit ts {ev.commit_ts} at partition {partition} offset {offset}") from None
                new = get_slot(ev, _EV[_EV_NEW])
                old = get_slot(ev, _EV[_EV_OLD])
                scm = get_slot(ev, _EV[_EV_SCHEMA])
                tbl = get_slot(ev, _EV[_EV_TABLE])
                table = self._table
                if table[0] is not scm or table[1] is not tbl:
                    table = self._table = (scm, tbl)
                nn = self._names(table, new)
                on = self._names(table, old)
                if not nn and not on:
                    keyless = True
                    rows.append((i, ev, False))
                    i += 1
                    continue
                rows.append((i, ev, True))
                if first_table is None:
                    first_table = table
                elif table is not first_table:
                    one_table = False
                if ts < last_ts:
                    ordered = False
                last_ts = ts
                # Not applied: already downstream, or a replayed copy of a row read before (the
                # daemon's rule 2). Its skeleton stub (below) is all that remains of it.
                if ts <= self._lower or (c_obs >= 0 and ts <= c_obs):
                    i += 1
                    continue
                kind = get_slot(ev, _EV[_EV_KIND])
                if kind is _DELETE:
                    assert old is not None, "the decoder always gives a delete its old image"
                    key = (on, _values(old, on))
                    self._op(partition, offset, i, table, ts, _DELETE, key, None, key_only(old, on), None)
                    i += 1
                    continue
                assert new is not None, "the decoder always gives an insert/update its new image"
                key = (nn, _values(new, nn))
                if kind is _UPDATE and old is not None:
                    if on is nn or on == nn:  # the same key columns: compare their values only
                        ovals = _values(old, on)
                        okey = key if ovals == key[1] else (on, ovals)
                    elif not nn:
                        okey = (on, _values(old, on))
                    else:
                        okey = old_handle_key(old, new, key)
                    if okey is not key and okey != key:
                        # The same two ops plan_table makes of a key change, now one per key.
                        self._op(partition, offset, i, table, ts, _DELETE, okey, None, key_only(old, okey[0]), None)
                        self._op(partition, offset, i, table, ts, _INSERT, key, new, None, get_slot(ev, _EV[_EV_NEW_VALUES]))
                        i += 1
                        continue
                self._op(partition, offset, i, table, ts, kind, key, new, None, get_slot(ev, _EV[_EV_NEW_VALUES]))
            elif isinstance(ev, ResolvedEvent):
                if obs is None or ev.ts > obs:
                    obs = ev.ts
                    c_obs = min(obs, _MAX_TS)
                skeleton.append((RESOLVED, partition, offset, i, min(ev.ts, _MAX_TS), None, None, None,
                                 None, True, None, None, None, None, min(ev.ts, _MAX_TS)))
            elif isinstance(ev, DDLEvent):
                # No resolved ts implied: rows of tables the DDL does not block may still follow
                # with a smaller ts (docs/open-protocol.md §5.4).
                self._segment += 1  # never collapse across a DDL record (see the rows module)
                self._key_names = {}
                self._last_group = None
                skeleton.append((DDL, partition, offset, i, ev.commit_ts, ev.schema, ev.table, None,
                                 None, True, None, ev.query, ev.ddl_type, None, ev.commit_ts))
            elif isinstance(ev, LargeMessageEvent):
                raise LargeMessageNotConfigured(ev)
            else:  # the decoder returns nothing else
                raise TypeError(f"not a decoded event: {type(ev).__name__}")
            i += 1
        if obs is not None:
            self._obs[partition] = obs
        if not rows:
            return
        self.row_events += len(rows)
        cdef list marks
        if keyless or not one_table:
            marks = _skeleton_marks(rows)
        elif ordered:  # the first and the last row (_skeleton_marks' rule for one table)
            marks = [False] * len(rows)
            marks[0] = True
            marks[len(rows) - 1] = True
        else:
            marks = [True] * len(rows)
        cdef object digest = record_digest(*raw) if keyless else None
        cdef Py_ssize_t j
        cdef tuple row
        for j in range(len(rows)):
            if not marks[j]:
                continue
            row = <tuple>rows[j]
            ev = row[1]
            ts = ev.commit_ts
            if row[2]:  # a stub: the skeleton needs no image
                skeleton.append((ROW, partition, offset, row[0], ts, ev.schema, ev.table, int(ev.kind), True,
                                 True, None, None, None, None, ts))
            else:  # a keyless row travels whole: the driver applies it (rows module docstring)
                img = dump_images(ev.new, ev.old, ev.row_id) if ts > self._lower else None
                skeleton.append((ROW, partition, offset, row[0], ts, ev.schema, ev.table, int(ev.kind), False,
                                 True, img, None, None, digest, ts))

    cdef _op(self, part, off, Py_ssize_t i, tuple table, long long ts, kind, tuple key, new, old, values):
        """One op on one key: written out as a row, or (collapse) kept if it wins over the key's last.

        The winner of a key is its op with the greatest (commit ts, delete 0 / upsert 1), a later
        arrival winning ties: the op ``plan_table``'s stable sort puts last. Keeping only winners of
        a part of the stream and letting the writers pick among them gives the same final state.
        """
        cdef int prio = 0 if kind is _DELETE else 1
        if self._upto < 0 or ts > self._upto:
            self._emit(ts, prio, part, off, i, table[0], table[1], kind, key, self._compact(new, values), old, ts)
            return
        cdef dict best
        if self._last_group is not None and (self._last_table is table or self._last_table == table):
            best = self._last_best
        else:
            group = (self._segment, table[0], table[1])
            best = self._best.get(group)
            if best is None:
                best = self._best[group] = {}
            self._last_group = group
            self._last_table = table
            self._last_best = best
        cdef list cur = best.get(key)
        cdef long long lo, cur_ts
        if cur is None:
            best[key] = [ts, prio, part, off, i, kind, self._compact(new, values), old, ts]
            self._best_keys += 1
            if self._best_keys >= self.max_keys:
                self._flush_best()
            return
        cur_ts = cur[0]
        if ts > cur_ts or (ts == cur_ts and prio >= <int>cur[1]):
            lo = cur[8]
            cur[0] = ts
            cur[1] = prio
            cur[2] = part
            cur[3] = off
            cur[4] = i
            cur[5] = kind
            cur[6] = self._compact(new, values)
            cur[7] = old
            if ts < lo:
                cur[8] = ts
        elif ts < <long long>cur[8]:
            cur[8] = ts

    cdef _emit(self, long long ts, int prio, part, off, Py_ssize_t i, scm, tbl, kind, tuple key, new, old,
               long long lo):
        """One row for the writers, into its handle key's bucket (``rows.WRITER_ROW``); ``new`` is
        a ``CompactImage`` (or None), whose layout is then pickled once per bucket."""
        cdef object shape = None
        cdef tuple values = None
        if new is not None:  # a CompactImage (_compact)
            shape = _shape_of(new)
            values = get_slot(new, _CI[_CI_VALUES])
        cdef Py_ssize_t bucket = 0
        if self.buckets > 1:
            bucket = _bucket(scm, tbl, key, self.buckets, self._runs)
        (<list>self._out[bucket]).append(
            (ts, prio, part, off, i, scm, tbl, int(kind), key[0], key[1], shape, values, old, lo)
        )
        self._out_rows += 1
        self.data_rows += 1

    cdef object _compact(self, new, values):
        """An upsert's new image as a ``CompactImage`` (None for a delete): a kept winner holds a
        tuple of values and a shared layout instead of a dict of column dicts, a fraction of
        the memory, and the writers' pickles hold each layout once."""
        if new is None:
            return None
        if type(new) is CompactImage:  # compacted by the decoder
            return new
        if values is None:
            values = tuple([col["v"] for col in (<dict>new).values()])
        return compact_image(new, values, self._shapes)

    cdef _flush_best(self):
        for (_seg, scm, tbl), best in self._best.items():
            for key, (ts, prio, part, off, i, kind, new, old, lo) in best.items():
                self._emit(ts, prio, part, off, i, scm, tbl, kind, key, new, old, lo)
        self._best = {}
        self._best_keys = 0
        # Forget the last group's dict too: it would keep its winners alive (all of them, for a
        # range of one table) after they were written out, until the builder itself goes.
        self._last_group = None
        self._last_best = None

    def add_stats(self, partition, filtered=()):
        """The range's counters row (kind STATS): ``off`` = records read, ``ts`` = row events,
        ``idx`` = rows for the writers (collapse winners written out first); and a STATS row with
        zero counts naming each table (``tbl`` empty: schema) ``filtered`` out."""
        if self._best:
            self._flush_best()
        self._skel.append((STATS, partition, self.records, self.data_rows, self.row_events, None, None, None, None,
                           True, None, None, None, None, self.row_events))
        for schema, table in sorted(filtered):
            self._skel.append((STATS, partition, 0, 0, 0, schema, table, None, None, True, None,
                               None, None, None, 0))

    def flush(self, final=False):
        """The rows so far as one batch; ``final`` also writes out the collapse winners."""
        if final and self._best:
            self._flush_best()
        cdef list rows = []
        cdef Py_ssize_t b
        cdef list out
        if self._out_rows:
            for b in range(self.buckets):
                out = <list>self._out[b]
                if out:
                    rows.append(_bucket_row(b, out))
                    self._out[b] = []
            self._out_rows = 0
        if self._skel:
            rows.append(bundle_row(self._skel[0][1], self._skel))
            self._skel = []
        return rows_batch(rows)


cdef Py_ssize_t _bucket(scm, tbl, tuple key, Py_ssize_t buckets, dict runs):
    """The writer bucket of a handle key (``rows`` module docstring): a CRC of the pickled table
    and key, the same in every reader. A key of one integer column is counted by its run of
    ``1 << _RUN_BITS`` consecutive values instead, so that a bucket's rows are runs of neighbouring
    keys: a writer then writes each group of buckets into a few stretches of the table's primary
    key, rather than one row every few dozen keys over all of it. Spread key by key, every group
    of a writer touches nearly every page of the primary key, and once the table outgrows the
    buffer pool each of them waits for those pages.
    ``runs`` remembers the bucket of each run seen: a pickle and its CRC cost as much as ten
    dict lookups, per row written out."""
    cdef tuple values = key[1]
    cdef tuple run
    cdef object found
    if len(values) == 1 and type(values[0]) is int:
        run = (scm, tbl, key[0], (<object>values[0]) >> _RUN_BITS)
        found = runs.get(run)
        if found is None:
            if len(runs) >= _MAX_RUNS:
                runs.clear()
            found = runs[run] = crc32(_dumps(run, _PICKLE)) % buckets
        return found
    return crc32(_dumps((scm, tbl, key), _PICKLE)) % buckets


cdef tuple _bucket_row(Py_ssize_t bucket, list out):
    """One ROWS row: a bucket's writer rows, pickled together (``ts``/``lo``: their highest and
    lowest commit ts, so that an epoch's writers skip the rows of other epochs unread)."""
    cdef long long top = -1, low = _MAX_TS, ts
    cdef tuple row
    for row in out:
        ts = row[0]
        if ts > top:
            top = ts
        ts = row[13]
        if ts < low:
            low = ts
    return (ROWS, (<tuple>out[0])[2], len(out), bucket, top, None, None, None, True, False,
            _dumps(out, _PICKLE), None, None, None, low)


cdef inline tuple _values(object row, tuple names):
    """The values of the columns ``names`` of an image (a handle key's values)."""
    cdef object shape
    cdef tuple values
    cdef tuple known
    cdef dict index
    if type(row) is CompactImage:
        shape = _shape_of(row)
        values = <tuple>get_slot(row, _CI[_CI_VALUES])
        known = <tuple>get_slot(shape, _SH[_SH_KEY_NAMES])
        if len(names) == 1 and (known is names or known == names):
            return (values[<Py_ssize_t>(<tuple>get_slot(shape, _SH[_SH_KEY_INDEX]))[0]],)
        index = <dict>get_slot(shape, _SH[_SH_INDEX])
        return tuple([values[<Py_ssize_t>index[n]] for n in names])
    if len(names) == 1:
        return (row[names[0]]["v"],)
    return tuple([row[n]["v"] for n in names])


cdef list _skeleton_marks(list rows):
    """Which rows of one record go into the skeleton (``rows`` module docstring): keyless rows
    always; per table the first and last keyed row when their commit ts never decrease, else all.

    ``rows`` are ``add_record``'s (index, event, keyed)."""
    cdef Py_ssize_t n = len(rows), j, k
    cdef list marks = [False] * n
    cdef dict by_table = {}
    cdef list positions
    cdef tuple row
    cdef bint ordered
    for j in range(n):
        row = <tuple>rows[j]
        if not row[2]:
            marks[j] = True
            continue
        ev = row[1]
        by_table.setdefault((ev.schema, ev.table), []).append(j)
    for positions in by_table.values():
        ordered = True
        for k in range(len(positions) - 1):
            if rows[positions[k]][1].commit_ts > rows[positions[k + 1]][1].commit_ts:
                ordered = False
                break
        if ordered:
            marks[positions[0]] = True
            marks[positions[len(positions) - 1]] = True
        else:
            for j in positions:
                marks[j] = True
    return marks

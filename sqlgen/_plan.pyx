# cython: language_level=3, boundscheck=False, wraparound=False
"""The collapse of a keyed table's events, compiled: :func:`sqlgen.collapse._plan_keyed`'s loops.

Why it exists: the daemon plans every row event it applies once, on the thread that also reads
and decodes, and planning in Python is a large share of that thread's time
(docs/performance.md), most of it the Python-level loop of one dict lookup, a few attribute reads
and a tuple per event. The rules, and why they converge, are in :mod:`sqlgen.collapse`;
this module applies them exactly as ``_plan_keyed`` there does
(``tests/unit/test_sqlgen_plan_compiled.py`` compares the two on generated windows), with the slots
of the codec's classes read by offset (``applier/codec/_slots.pxd``) and a one-entry cache of the
last image layout.
"""

cimport cython
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

from applier.codec._slots cimport get_slot, slot_offsets

from operator import itemgetter

from applier.codec.events import CompactImage, ImageShape, RowEvent, RowKind

cdef object _DELETE = RowKind.DELETE
cdef object _UPDATE = RowKind.UPDATE
cdef object _first = itemgetter(0)

cdef enum:
    _EV_TS, _EV_KIND, _EV_NEW, _EV_OLD, _EV_NEW_VALUES
cdef enum:
    _CI_SHAPE, _CI_VALUES
cdef enum:
    _SH_NAMES, _SH_KEY_NAMES, _SH_KEY_INDEX
cdef Py_ssize_t _EV[5]
cdef Py_ssize_t _CI[2]
cdef Py_ssize_t _SH[3]
slot_offsets(RowEvent, ("commit_ts", "kind", "new", "old", "new_values"), _EV)
slot_offsets(CompactImage, ("shape", "column_values"), _CI)
slot_offsets(ImageShape, ("names", "key_names", "key_index"), _SH)

# sqlgen.collapse's classes and helpers, bound at the first call: that module imports this one.
cdef object _TablePlan = None
cdef object _DeleteGroup = None
cdef object _PlanError = None
cdef object _upsert_group = None
cdef object _KeyReader = None
cdef object _image_key = None


cdef int _bind_collapse() except -1:
    global _TablePlan, _DeleteGroup, _PlanError, _upsert_group, _KeyReader, _image_key
    from sqlgen import collapse

    _TablePlan, _DeleteGroup, _PlanError = collapse.TablePlan, collapse.DeleteGroup, collapse.PlanError
    _upsert_group, _KeyReader, _image_key = collapse.upsert_group, collapse._KeyReader, collapse._image_key
    return 0


@cython.boundscheck(True)
cdef inline tuple _values_at(tuple values, tuple index):
    """``tuple(values[i] for i in index)`` (the key of a compact image: its values at the shape's
    key positions)."""
    cdef Py_ssize_t n = PyTuple_GET_SIZE(index), j
    if n == 1:
        return (values[<Py_ssize_t>index[0]],)
    return tuple([values[<Py_ssize_t>index[j]] for j in range(n)])


cdef inline bint _later(object ts, int prio, tuple cur) except -1:
    """Whether an op at ``(ts, prio)`` replaces ``cur``: later ts, or the same ts and a priority
    at least as high (the later op wins ties, as the last op of a stable sort)."""
    cdef object cts = <object>PyTuple_GET_ITEM(cur, 0)
    if ts > cts:
        return True
    return ts == cts and prio >= <int>(<object>PyTuple_GET_ITEM(cur, 1))


def plan_keyed(list events):
    """:func:`sqlgen.collapse._plan_keyed`, compiled: the TablePlan of a keyed table's events."""
    if _TablePlan is None:
        _bind_collapse()
    cdef dict finals = {}
    cdef dict knames_of = {}
    cdef object keys = _KeyReader(knames_of)
    cdef object last_kn = None
    cdef dict fin = None
    cdef dict ofin
    cdef object ev, kind, ts, img, new, old, shape, names, kn, kv, okn, okv, vals
    cdef object last_shape = None
    cdef object last_names = None, last_kn_of_shape = None
    cdef tuple last_ki = None
    cdef object cur
    cdef int prio
    cdef bint exact
    for ev in events:
        exact = type(ev) is RowEvent
        if exact:
            kind = get_slot(ev, _EV[_EV_KIND])
            ts = get_slot(ev, _EV[_EV_TS])
        else:
            kind = ev.kind
            ts = ev.commit_ts
        if kind is _DELETE:
            img = get_slot(ev, _EV[_EV_OLD]) if exact else ev.old
            if img is None:
                raise _PlanError("delete event without old image", ev)
            new = None
            prio = 0
        else:
            img = new = get_slot(ev, _EV[_EV_NEW]) if exact else ev.new
            if new is None:
                raise _PlanError(f"{kind.name.lower()} event without new image", ev)
            prio = 1
        if type(img) is CompactImage:  # the daemon's cached new images: layout shared, values a tuple
            shape = get_slot(img, _CI[_CI_SHAPE])
            if shape is not last_shape:
                if type(shape) is not ImageShape:
                    raise TypeError(f"not an ImageShape: {type(shape).__name__}")
                last_names = get_slot(shape, _SH[_SH_NAMES])
                last_kn_of_shape = get_slot(shape, _SH[_SH_KEY_NAMES])
                last_ki = <tuple?>get_slot(shape, _SH[_SH_KEY_INDEX])
                last_shape = shape
            names = last_names
            kn = last_kn_of_shape
            if not kn:
                raise _PlanError("row image of a keyed table carries no handle-key column", ev)
            kv = _values_at(<tuple?>get_slot(img, _CI[_CI_VALUES]), last_ki)
        else:  # a delete's image, or one the careful decoder gave
            names, kn, kv = _image_key(img, knames_of, ev, new is None)
        if kn is not last_kn:
            fin = finals.setdefault(kn, {})
            last_kn = kn
        if kind is _UPDATE:
            old = get_slot(ev, _EV[_EV_OLD]) if exact else ev.old
            if old is not None:
                okn, okv = keys.old_key(old, new, (kn, kv))
                if okv != kv or okn != kn:
                    ofin = finals.setdefault(okn, {})
                    cur = ofin.get(okv)
                    if cur is None or _later(ts, 0, <tuple>cur):
                        ofin[okv] = (ts, 0, None, old, None, None)
        cur = fin.get(kv)
        if cur is None or _later(ts, prio, <tuple>cur):
            vals = get_slot(ev, _EV[_EV_NEW_VALUES]) if exact else ev.new_values
            fin[kv] = (ts, prio, new, img, names, vals)
    return _finish(finals)


cdef object _finish(dict finals):
    """The TablePlan of the final states: deletes and upsert groups, each in key order."""
    cdef object tp = _TablePlan(schema="", table="", keyed=True)
    cdef dict shapes = {}  # image column names -> (group, indexes of written columns or None)
    cdef dict by_columns = {}
    cdef list upserts = tp.upserts
    cdef list deletes = tp.deletes
    cdef object knames, dg, new, src, names, vals, kvals, ug, keep, last_names = None
    cdef list items, ug_rows = None, ug_keys = None, dg_keys = None
    cdef tuple state, entry
    cdef object found
    for knames, fin in finals.items():
        dg = None
        items = list((<dict>fin).items())
        try:
            items.sort(key=_first)
        except TypeError:  # e.g. a NULL in a key of an odd schema: any order will do
            pass
        for kvals, state in items:
            new = <object>PyTuple_GET_ITEM(state, 2)
            if new is None:
                if dg is None:
                    src = <object>PyTuple_GET_ITEM(state, 3)
                    dg = _DeleteGroup(knames, tuple([src[n]["t"] for n in knames]))
                    deletes.append(dg)
                    dg_keys = dg.keys
                dg_keys.append(kvals)
                continue
            names = <object>PyTuple_GET_ITEM(state, 4)
            if names is not last_names:
                found = shapes.get(names)
                if found is None:
                    entry = _upsert_group(new, by_columns, upserts)
                    shapes[names] = entry
                else:
                    entry = <tuple>found
                ug, keep = entry
                ug_rows = ug.rows
                ug_keys = ug.keys
                last_names = names
            vals = <object>PyTuple_GET_ITEM(state, 5)
            if vals is None:
                vals = tuple([c["v"] for c in new.values()])
            ug_rows.append(vals if keep is None else tuple([vals[i] for i in keep]))
            ug_keys.append(kvals)
    return tp


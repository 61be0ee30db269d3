# cython: language_level=3
"""Reading the slots of the codec's slotted classes by their offset, for the compiled hot loops.

Why: reading an attribute of a slotted instance through Python (a type lookup, the member
descriptor, its getter) is a large share of the catch-up builder's time per event
(docs/performance.md); a slot read by its offset is one pointer load. Only for an object whose exact
type was checked, and only for slots that are always set (``__init__`` or the decoder's fast path
set them all); :func:`slot_offset` refuses anything but an object slot.
"""

from cpython.object cimport PyObject


cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    int T_OBJECT_EX


cdef inline Py_ssize_t slot_offset(object cls, str name) except -1:
    """Where the object slot ``name`` of instances of ``cls`` lies; RuntimeError if it is none."""
    cdef object descr = cls.__dict__.get(name)
    cdef PyMemberDef* member
    if descr is not None and type(descr).__name__ == "member_descriptor":
        member = (<PyMemberDescrObject*>descr).d_member
        if member.type == T_OBJECT_EX:
            return member.offset
    raise RuntimeError(f"{cls.__name__}.{name} is not an object slot: update the compiled code reading it")


cdef inline int slot_offsets(object cls, tuple names, Py_ssize_t* offsets) except -1:
    """:func:`slot_offset` of each of ``names``, in order, into ``offsets``."""
    for i, name in enumerate(names):
        offsets[i] = slot_offset(cls, name)
    return 0


cdef inline object get_slot(object obj, Py_ssize_t offset):
    """The value in a slot of ``obj`` (AttributeError when it was never set, as Python says)."""
    cdef PyObject* value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
    if value == NULL:
        raise AttributeError(f"a slot of {type(obj).__name__} is not set")
    return <object>value

# cython: language_level=3, boundscheck=False, wraparound=False
"""Statement.bound's loop, compiled: a statement's values as SQL literals, put into its text.

Why it exists: binding turns every value of a window into text (four per sysbench row, a million
rows a minute), and the Python loop that picked each value's literal cost more than all the
formatting around it. The rules are those of :meth:`sqlgen.dml.Statement.bound`, which says why
they give exactly pymysql's text: an int is ``str(v)``; a str holding none of the characters
pymysql escapes is itself between single quotes, in either escaping mode of the session; every
other value goes through the session's ``escape``.

The statement's other per-value loop is here too: :func:`batch_ends`, where ``sqlgen.dml`` cuts a
group's rows into statements by the bound size of their values.
"""

cimport cython
from cpython.object cimport PyObject_Str
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.string cimport memcpy, strcspn


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    Py_ssize_t PyUnicode_GET_LENGTH(object s)
    int PyUnicode_KIND(object s)
    void* PyUnicode_DATA(object s)
    Py_UCS4 PyUnicode_MAX_CHAR_VALUE(object s)
    void PyUnicode_WRITE(int kind, void* data, Py_ssize_t index, Py_UCS4 value)
    Py_UCS4 PyUnicode_READ(int kind, const void* data, Py_ssize_t index)


# The characters pymysql escapes in a string literal (sqlgen.dml._ESCAPED): \ ' " LF CR NUL ^Z.
cdef unsigned char ESCAPED[128]


cdef int _init() except -1:
    cdef int i
    for i in range(128):
        ESCAPED[i] = 0
    for c in b"\\'\"\n\r\x00\x1a":
        ESCAPED[c] = 1
    return 0


_init()


cdef bint _clean(str v):
    """True when ``v`` holds none of the characters pymysql escapes (all of them ASCII)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(v), i
    cdef int kind = PyUnicode_KIND(v)
    cdef const void* data = PyUnicode_DATA(v)
    cdef Py_UCS4 c
    if kind == 1:
        # One-byte text is stored NUL-terminated: strcspn stops at the first character to escape,
        # or at a NUL (the terminator, or one inside, which is to be escaped too).
        return <Py_ssize_t>strcspn(<const char*>data, "\\'\"\n\r\x1a") == n
    for i in range(n):
        c = PyUnicode_READ(kind, data, i)
        if c < 128 and ESCAPED[c]:
            return False
    return True


cdef object _quoted(str v):
    """``"'" + v + "'"`` in one allocation."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(v)
    cdef object out = PyUnicode_New(n + 2, PyUnicode_MAX_CHAR_VALUE(v))
    cdef int kind = PyUnicode_KIND(out)
    cdef char* data = <char*>PyUnicode_DATA(out)
    PyUnicode_WRITE(kind, data, 0, 0x27)
    memcpy(data + kind, PyUnicode_DATA(v), n * kind)
    PyUnicode_WRITE(kind, data, n + 1, 0x27)
    return out


def bind(str sql, tuple params, escape):
    """``sql % literals``: the text ``cursor.mogrify(sql, params)`` gives, ``escape`` being the
    session's ``Connection.escape``."""
    cdef Py_ssize_t n = PyTuple_GET_SIZE(params), i
    cdef tuple literals = PyTuple_New(n)
    cdef object v, lit
    for i in range(n):
        v = <object>PyTuple_GET_ITEM(params, i)
        if type(v) is int:
            lit = PyObject_Str(v)
        elif type(v) is str and _clean(<str>v):
            lit = _quoted(<str>v)
        else:
            lit = escape(v)
        Py_INCREF(lit)
        PyTuple_SET_ITEM(literals, i, lit)
    return sql % literals


@cython.boundscheck(True)
def batch_ends(
    list rows,
    list var_idx,
    Py_ssize_t per,
    Py_ssize_t budget,
    Py_ssize_t fixed,
    Py_ssize_t exact_from,
    Py_ssize_t bytes_extra,
    measure,
):
    """Where ``sqlgen.dml._batches`` cuts ``rows``: the end index of each batch, in order.

    A batch ends before the row that would make it hold more than ``per`` rows or more than
    ``budget`` bytes, a single row always making a batch of its own. A row's size is ``fixed``
    plus the bound of each value at ``var_idx``: a str of fewer than ``exact_from`` characters is
    2 bytes a character (4 when it is not ASCII) and its quotes, bytes are twice their length and
    ``bytes_extra``, None is 4; anything else (longer text included) is what ``measure``
    (``sqlgen.dml.literal_bytes``) says. The loop is compiled for the same reason as :func:`bind`:
    it reads every value of the variable-width columns of every row a window writes.
    """
    cdef Py_ssize_t n = len(rows), i, start = 0, size = 0, rsize, m, j
    cdef Py_ssize_t nvar = len(var_idx)
    cdef tuple row
    cdef object v
    cdef list ends = []
    for i in range(n):
        row = rows[i]
        rsize = fixed
        for j in range(nvar):
            v = row[<Py_ssize_t>var_idx[j]]
            if type(v) is str:
                m = PyUnicode_GET_LENGTH(v)
                if m >= exact_from:
                    rsize += <Py_ssize_t>measure(v)
                elif PyUnicode_MAX_CHAR_VALUE(v) < 128:
                    rsize += 2 * m + 2
                else:
                    rsize += 4 * m + 2
            elif type(v) is bytes:
                rsize += 2 * len(<bytes>v) + bytes_extra
            elif v is None:
                rsize += 4
            else:
                rsize += <Py_ssize_t>measure(v)
        if i > start and (i - start >= per or size + rsize > budget):
            ends.append(i)
            start = i
            size = 0
        size += rsize
    if start < n:
        ends.append(n)
    return ends

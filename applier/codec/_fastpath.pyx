# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""decode_record's fast path, compiled: one Kafka record's bytes -> its row and resolved events.

Why it exists: parsing each JSON document with orjson and then normalising every column in Python
cost about 2.5 times the parse alone; most of that went to building dicts the applier throws away
(the key object, the value object), strings it replaces at once (base64 and Go-quoted values), and
to the Python bytecode of the column loop. This module reads the framed record in place and builds
only what the events keep: the event, its Position, each value already in its final type
(docs/open-protocol.md §1-§4), and the images: the new image of a keyed row as a CompactImage (a
tuple of the values and a layout shared by the rows of its column names, types and flags), the
others as one dict per image and one ``{t, f, v}`` dict per column; a keyed update's old image
reduced to its handle-key columns where the caller asks for it (``_old_key_image``).

It accepts a deliberately small subset of JSON, what current producers write: compact documents
(no whitespace), keys without escapes, rows of ``{t, f, v}`` columns (``h`` allowed), scalar values.
At the first byte it does not expect it gives up on the event, by raising anything at all, and
:func:`decode_record_fast` hands the event to the careful path of decoder.py (given as
``careful``), which decodes it again from its bytes with orjson and either copes or explains the
problem. So this code never produces an error message; it must only never accept what the careful
path rejects, nor produce anything else than it (tests/unit/test_codec_fastpath.py feeds both the
same records). Each rule below names the careful-path behaviour it mirrors.

Events are built without calling ``__init__``, by writing their slots at the offsets Python itself
uses for them: for a plain slotted dataclass that is the same object, and importing this module
checks that the event classes still are.

The module also holds :func:`compact_image`, the daemon listener's conversion of a decoded image to
its compact form for the row cache: it is built the same way, and it runs once per cached row.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport (
    PyDict_Contains,
    PyDict_Copy,
    PyDict_GetItem,
    PyDict_New,
    PyDict_Next,
    PyDict_SetItem,
    PyDict_Size,
)
from cpython.float cimport PyFloat_FromDouble
from cpython.long cimport PyLong_FromLongLong, PyLong_FromSsize_t, PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport (
    PyUnicode_AsUTF8AndSize,
    PyUnicode_DATA,
    PyUnicode_DecodeUTF8,
    PyUnicode_New,
)
from libc.math cimport isinf
from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memcpy, memset

from applier.codec._slots cimport slot_offsets

import dataclasses

from applier.codec.events import (
    FLAG_BINARY,
    FLAG_HANDLE_KEY,
    CompactImage,
    ImageShape,
    Position,
    ResolvedEvent,
    RowEvent,
    RowKind,
)
from applier.codec.values import (
    BLOB_CODES,
    DECIMAL,
    FLOAT_CODES,
    INT_CODES,
    NULL as NULL_CODE,
    STRING_CODES,
    TEXTUAL_CODES,
    fill_old,
)


cdef extern from "Python.h":
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow) except? -1.0
    ctypedef object (*allocfunc)(PyTypeObject*, Py_ssize_t)
    ctypedef struct TypeAlloc "PyTypeObject":
        allocfunc tp_alloc


class _Slow(Exception):
    """This event is not for the fast path (it goes to the careful path)."""


cdef object SLOW = _Slow()
cdef dict COLUMN = {"t": None, "f": None, "v": None}

# --- what a column's type code asks of its value (values.py's code lists) ------------------------

cdef enum:
    G_UNKNOWN = 0  # not a code the fast path knows: careful path
    G_INT         # int, exactly
    G_FLOAT       # float; an integer becomes a float (Go writes 2.0 as 2)
    G_TEXT        # str as sent (dates, times, JSON...)
    G_STRING      # CHAR/VARCHAR: str, or with the binary flag Go strconv.Quote text -> bytes
    G_BLOB        # base64 -> bytes, or without the binary flag str when valid UTF-8
    G_DECIMAL     # str checked to be a decimal literal
    G_NULL        # only null

cdef unsigned char GROUP[256]


cdef int _set_groups(codes, unsigned char group) except -1:
    for code in codes:
        GROUP[<unsigned char>code] = group
    return 0


_set_groups(INT_CODES, G_INT)
_set_groups(FLOAT_CODES, G_FLOAT)
_set_groups(TEXTUAL_CODES, G_TEXT)
_set_groups(STRING_CODES, G_STRING)
_set_groups(BLOB_CODES, G_BLOB)
_set_groups((DECIMAL,), G_DECIMAL)
_set_groups((NULL_CODE,), G_NULL)

cdef uint64_t BINARY = FLAG_BINARY
cdef uint64_t HANDLE_KEY = FLAG_HANDLE_KEY

# Bytes inside a JSON string: 0 plain, 1 the closing quote, 2 a backslash, 3 a control character
# (invalid JSON), 4 part of a multi-byte UTF-8 character.
cdef unsigned char STRCLASS[256]
# The standard base64 alphabet (binascii's table); 0xFF: not in it.
cdef unsigned char B64[256]
cdef signed char HEX[256]
# Single-letter escapes -> the byte they stand for (0: not one): JSON's, and the ones of Go's
# strconv.Quote that values.go_unquote decodes (\a \b \f \n \r \t \v \\ \" \').
cdef unsigned char JSON_ESCAPE[256]
cdef unsigned char GO_ESCAPE[256]


cdef int _init_tables() except -1:
    cdef int i
    cdef const unsigned char* alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    cdef const unsigned char* digits = b"0123456789abcdefABCDEF"
    for i in range(256):
        STRCLASS[i] = 3 if i < 0x20 else 4 if i >= 0x80 else 0
        B64[i] = 0xFF
        HEX[i] = -1
        JSON_ESCAPE[i] = 0
        GO_ESCAPE[i] = 0
    STRCLASS[0x22] = 1
    STRCLASS[0x5C] = 2
    for i in range(64):
        B64[alphabet[i]] = i
    for i in range(22):
        HEX[digits[i]] = i if i < 16 else i - 6
    for letter, byte in zip(b'"\\/bfnrt', b'"\\/\b\f\n\r\t'):
        JSON_ESCAPE[letter] = byte
    for letter, byte in zip(b'abfnrtv\\"\'', b'\a\b\f\n\r\t\v\\"\''):
        GO_ESCAPE[letter] = byte
    return 0


_init_tables()

# --- the events, built slot by slot ----------------------------------------------------------------

# The offset of each field's slot, in field order (the order of the names below).
cdef Py_ssize_t POS_SLOT[4]
cdef Py_ssize_t EV_SLOT[10]
cdef enum:
    P_TOPIC, P_PARTITION, P_OFFSET, P_INDEX
cdef enum:
    E_TS, E_SCHEMA, E_TABLE, E_KIND, E_NEW, E_OLD, E_PTN, E_POS, E_RID, E_NEW_VALUES


cdef int _slots(cls, tuple names, Py_ssize_t* offsets) except -1:
    """Building an object slot by slot is the same as calling its class only while the class is a
    slotted dataclass of exactly these fields whose __init__ does nothing else: should events.py
    change that, importing the decoder fails instead of building incomplete events."""
    if (
        tuple(field.name for field in dataclasses.fields(cls)) != names
        or getattr(cls, "__slots__", None) != names
        or hasattr(cls, "__post_init__")
    ):
        raise RuntimeError(f"{cls.__name__} changed: update the decoder's fast path, applier/codec/_fastpath.pyx")
    return slot_offsets(cls, names, offsets)


_slots(Position, ("topic", "partition", "offset", "index"), POS_SLOT)
_slots(
    RowEvent,
    ("commit_ts", "schema", "table", "kind", "new", "old", "partition_id", "pos", "row_id", "new_values"),
    EV_SLOT,
)

cdef Py_ssize_t CI_SLOT[2]
cdef enum:
    CI_SHAPE, CI_VALUES
_slots(CompactImage, ("shape", "column_values"), CI_SLOT)

cdef object INSERT = RowKind.INSERT
cdef object UPDATE = RowKind.UPDATE
cdef object DELETE = RowKind.DELETE
cdef object POSITION = Position
cdef object ROW_EVENT = RowEvent
cdef object RESOLVED_EVENT = ResolvedEvent


cdef inline void _put(PyObject* obj, Py_ssize_t offset, object value):
    """Store ``value`` in a slot of a fresh object (whose slots are all still NULL)."""
    Py_INCREF(value)
    (<PyObject**>((<char*>obj) + offset))[0] = <PyObject*>value


cdef inline object _alloc(object cls):
    """A new instance, all slots NULL, without __init__: what object.__new__ does for these classes."""
    return (<TypeAlloc*><PyObject*>cls).tp_alloc(<PyTypeObject*>cls, 0)


cdef inline object _position(object topic, object partition, object offset, Py_ssize_t index):
    cdef object pos = _alloc(POSITION)
    _put(<PyObject*>pos, POS_SLOT[P_TOPIC], topic)
    _put(<PyObject*>pos, POS_SLOT[P_PARTITION], partition)
    _put(<PyObject*>pos, POS_SLOT[P_OFFSET], offset)
    _put(<PyObject*>pos, POS_SLOT[P_INDEX], PyLong_FromSsize_t(index))
    return pos


# --- the string cache: column, schema and table names ----------------------------------------------
#
# The same few names come in every event, so the string of each is made once and kept in a small
# direct-mapped table (as orjson does for object keys). A name is looked up by its bytes.

cdef enum:
    CACHE_SIZE = 2048  # a power of two
    CACHE_MAX_LEN = 64

cdef list _cache = [None] * CACHE_SIZE  # owns the strings
cdef const char* CACHE_UTF8[CACHE_SIZE]  # their UTF-8 bytes (alive as long as the string)
cdef Py_ssize_t CACHE_SIZE_OF[CACHE_SIZE]


cdef inline uint64_t _hash(const unsigned char* s, Py_ssize_t n):
    cdef uint64_t h = 14695981039346656037ULL
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ s[i]) * 1099511628211ULL
    return h


cdef object _name(const unsigned char* s, Py_ssize_t n, bint ascii):
    """The str of a JSON string without escapes, cached when short."""
    if n > CACHE_MAX_LEN:
        return _str(s, n, ascii)
    cdef Py_ssize_t slot = <Py_ssize_t>(_hash(s, n) & (CACHE_SIZE - 1))
    if CACHE_UTF8[slot] != NULL and CACHE_SIZE_OF[slot] == n and memcmp(CACHE_UTF8[slot], s, n) == 0:
        return _cache[slot]
    cdef object made = _str(s, n, ascii)
    hash(made)  # computed once: every dict insert of this name reuses it
    CACHE_UTF8[slot] = NULL
    _cache[slot] = made
    CACHE_UTF8[slot] = PyUnicode_AsUTF8AndSize(made, &CACHE_SIZE_OF[slot])
    return made


# --- JSON scalars ---------------------------------------------------------------------------------

cdef inline object _str(const unsigned char* s, Py_ssize_t n, bint ascii):
    """str of valid UTF-8 bytes; invalid UTF-8 raises (orjson rejects it: careful path)."""
    cdef object out
    if ascii:
        out = PyUnicode_New(n, 127)
        memcpy(PyUnicode_DATA(out), s, n)
        return out
    return PyUnicode_DecodeUTF8(<const char*>s, n, NULL)


cdef struct Span:
    const unsigned char* start  # the string's bytes, between the quotes
    Py_ssize_t size
    bint escaped  # holds a backslash escape
    bint ascii


cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* How many plain string bytes (no quote, backslash, control character or non-ASCII byte)
       the 8 bytes at p start with: 8 when all are. One test for 8 bytes: a byte below 0x20
       borrows into its high bit, a quote or backslash becomes zero after the xor, and the
       lowest byte flagged is always a real one (borrows only run upwards). */
    static inline int applier_plain_prefix(const unsigned char *p) {
        uint64_t w, quote, backslash, special;
        memcpy(&w, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);  /* the first byte in the lowest bits, as below */
    #endif
        quote = w ^ 0x2222222222222222ULL;
        backslash = w ^ 0x5C5C5C5C5C5C5C5CULL;
        special = (((quote - 0x0101010101010101ULL) & ~quote)
                   | ((backslash - 0x0101010101010101ULL) & ~backslash)
                   | (w - 0x2020202020202020ULL) | w) & 0x8080808080808080ULL;
        return special ? __builtin_ctzll(special) >> 3 : 8;
    }
    """
    int _plain_prefix "applier_plain_prefix"(const unsigned char* p) nogil


cdef inline const unsigned char* _scan_string(const unsigned char* p, const unsigned char* end, Span* span) except NULL:
    """``p`` just after an opening quote: find the closing one, return the byte after it."""
    cdef unsigned char k
    cdef bint escaped = False, ascii = True
    cdef int plain
    span.start = p
    while p < end:
        if end - p >= 8:  # 8 bytes at a time up to the next byte that needs a look
            plain = _plain_prefix(p)
            p += plain
            if plain == 8:
                continue
        k = STRCLASS[p[0]]
        if k == 0:
            p += 1
        elif k == 1:
            span.size = p - span.start
            span.escaped = escaped
            span.ascii = ascii
            return p + 1
        elif k == 2:
            escaped = True
            p += 2  # the escaped byte cannot close the string; _unescape checks it
        elif k == 4:
            ascii = False
            p += 1
        else:
            raise SLOW  # a raw control character: not JSON
    raise SLOW


cdef inline int _hex4(const unsigned char* p) except -1:
    cdef int a = HEX[p[0]], b = HEX[p[1]], c = HEX[p[2]], d = HEX[p[3]]
    if a < 0 or b < 0 or c < 0 or d < 0:
        raise SLOW
    return (a << 12) | (b << 8) | (c << 4) | d


cdef inline Py_ssize_t _utf8(unsigned int cp, unsigned char* out):
    if cp < 0x80:
        out[0] = cp
        return 1
    if cp < 0x800:
        out[0] = 0xC0 | (cp >> 6)
        out[1] = 0x80 | (cp & 0x3F)
        return 2
    if cp < 0x10000:
        out[0] = 0xE0 | (cp >> 12)
        out[1] = 0x80 | ((cp >> 6) & 0x3F)
        out[2] = 0x80 | (cp & 0x3F)
        return 3
    out[0] = 0xF0 | (cp >> 18)
    out[1] = 0x80 | ((cp >> 12) & 0x3F)
    out[2] = 0x80 | ((cp >> 6) & 0x3F)
    out[3] = 0x80 | (cp & 0x3F)
    return 4


cdef Py_ssize_t _unescape(const Span* span, unsigned char* out, bint* ascii) except -1:
    """The bytes a JSON string with escapes stands for, as UTF-8, into ``out`` (never longer than
    the escaped text). A lone surrogate escape is given up on: orjson rejects it."""
    cdef const unsigned char* p = span.start
    cdef const unsigned char* end = p + span.size
    cdef Py_ssize_t n = 0
    cdef unsigned char c
    cdef unsigned int cp, low
    cdef bint only_ascii = span.ascii
    while p < end:
        c = p[0]
        if c != 0x5C:  # backslash
            out[n] = c
            n += 1
            p += 1
            continue
        if end - p < 2:
            raise SLOW
        c = p[1]
        p += 2
        if JSON_ESCAPE[c]:
            out[n] = JSON_ESCAPE[c]
        elif c == 0x75:  # \uXXXX
            if end - p < 4:
                raise SLOW
            cp = _hex4(p)
            p += 4
            if 0xD800 <= cp <= 0xDBFF:
                if end - p < 6 or p[0] != 0x5C or p[1] != 0x75:
                    raise SLOW
                low = _hex4(p + 2)
                if not 0xDC00 <= low <= 0xDFFF:
                    raise SLOW
                p += 6
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
            elif 0xDC00 <= cp <= 0xDFFF:
                raise SLOW
            if cp >= 0x80:
                only_ascii = False
            n += _utf8(cp, out + n)
            continue
        else:
            raise SLOW
        n += 1
    ascii[0] = only_ascii
    return n


# Unescaped strings are written to a buffer on the caller's stack (no Python code runs while one
# is in use); longer strings get a block of their own.
cdef enum:
    BUF_SIZE = 4096


cdef inline unsigned char* _buffer(Py_ssize_t size, unsigned char* local) except NULL:
    if size <= BUF_SIZE:
        return local
    cdef unsigned char* block = <unsigned char*>PyMem_Malloc(size)
    if block == NULL:
        raise MemoryError
    return block


cdef inline void _release(unsigned char* buf, unsigned char* local):
    if buf != local:
        PyMem_Free(buf)


cdef object _string(const Span* span):
    """The str of a JSON string (values.py: text needs no work)."""
    if not span.escaped:
        return _str(span.start, span.size, span.ascii)
    cdef unsigned char local[BUF_SIZE]
    cdef unsigned char* out = _buffer(span.size, local)
    cdef bint ascii
    cdef Py_ssize_t n
    try:
        n = _unescape(span, out, &ascii)
        return _str(out, n, ascii)
    finally:
        _release(out, local)


cdef object _go_unquote(const Span* span):
    """values.go_unquote: the bytes of Go strconv.Quote text (without the quotes). Printable
    characters stand for their UTF-8 bytes; the escapes are the ones the careful path decodes, and
    anything else is given up on (the careful path then says what is wrong)."""
    if not span.escaped:  # no JSON escape, so no backslash in the text: its UTF-8 bytes
        if not span.ascii:
            PyUnicode_DecodeUTF8(<const char*>span.start, span.size, NULL)  # raises unless valid UTF-8
        return PyBytes_FromStringAndSize(<const char*>span.start, span.size)
    cdef unsigned char local[BUF_SIZE]
    cdef unsigned char* buf = _buffer(span.size, local)
    cdef bint ascii
    cdef Py_ssize_t n, i = 0, o = 0
    cdef unsigned char c
    cdef unsigned int cp
    cdef int d
    try:
        n = _unescape(span, buf, &ascii)
        if not ascii:
            PyUnicode_DecodeUTF8(<const char*>buf, n, NULL)  # raises unless valid UTF-8
        # Decoded in place: no escape is shorter than what it stands for.
        while i < n:
            c = buf[i]
            if c != 0x5C:
                buf[o] = c
                o += 1
                i += 1
                continue
            if n - i < 2:
                raise SLOW  # a trailing backslash
            c = buf[i + 1]
            i += 2
            if GO_ESCAPE[c]:
                buf[o] = GO_ESCAPE[c]
            elif c == 0x78:  # \xNN: one byte
                if n - i < 2 or HEX[buf[i]] < 0 or HEX[buf[i + 1]] < 0:
                    raise SLOW
                buf[o] = (HEX[buf[i]] << 4) | HEX[buf[i + 1]]
                i += 2
            elif 0x30 <= c <= 0x37:  # \NNN octal: one byte, at most \377
                if n - i < 2 or not (0x30 <= buf[i] <= 0x37 and 0x30 <= buf[i + 1] <= 0x37):
                    raise SLOW
                d = ((c - 0x30) << 6) | ((buf[i] - 0x30) << 3) | (buf[i + 1] - 0x30)
                if d > 0xFF:
                    raise SLOW
                buf[o] = d
                i += 2
            elif c == 0x75 or c == 0x55:  # \uXXXX, \UXXXXXXXX: a code point, as UTF-8
                if c == 0x75:
                    if n - i < 4:
                        raise SLOW
                    cp = _hex4(buf + i)
                    i += 4
                else:
                    if n - i < 8:
                        raise SLOW
                    cp = (<unsigned int>_hex4(buf + i) << 16) | _hex4(buf + i + 4)
                    i += 8
                if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                    raise SLOW
                o += _utf8(cp, buf + o)
                continue
            else:
                raise SLOW
            o += 1
        return PyBytes_FromStringAndSize(<const char*>buf, o)
    finally:
        _release(buf, local)


cdef object _base64(const unsigned char* s, Py_ssize_t n):
    """binascii.a2b_base64(strict_mode=True): standard alphabet, padded, nothing else (bits left
    over in the last character are ignored, as binascii and Go's StdEncoding do)."""
    if n & 3:
        raise SLOW
    if n == 0:
        return b""
    cdef Py_ssize_t pads = 0
    if s[n - 1] == 0x3D:
        pads = 2 if s[n - 2] == 0x3D else 1
    cdef object out = PyBytes_FromStringAndSize(NULL, n // 4 * 3 - pads)
    cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
    cdef const unsigned char* last = s + n - 4
    cdef unsigned int a, b, c, d
    while s < last:
        a = B64[s[0]]
        b = B64[s[1]]
        c = B64[s[2]]
        d = B64[s[3]]
        if (a | b | c | d) & 0x80:
            raise SLOW
        o[0] = (a << 2) | (b >> 4)
        o[1] = ((b & 0x0F) << 4) | (c >> 2)
        o[2] = ((c & 0x03) << 6) | d
        o += 3
        s += 4
    a = B64[s[0]]
    b = B64[s[1]]
    c = B64[s[2]] if pads < 2 else 0
    d = B64[s[3]] if pads < 1 else 0
    if (a | b | c | d) & 0x80:
        raise SLOW
    o[0] = (a << 2) | (b >> 4)
    if pads < 2:
        o[1] = ((b & 0x0F) << 4) | (c >> 2)
    if pads < 1:
        o[2] = ((c & 0x03) << 6) | d
    return out


cdef object _blob(const Span* span, bint binary):
    """values.conv_blob: base64 -> bytes; a TEXT column's bytes -> str when valid UTF-8."""
    cdef object raw
    cdef unsigned char local[BUF_SIZE]
    cdef unsigned char* buf
    cdef bint ascii
    cdef Py_ssize_t n
    if not span.ascii:
        raise SLOW  # binascii refuses non-ASCII text
    if not span.escaped:
        raw = _base64(span.start, span.size)
    else:
        buf = _buffer(span.size, local)
        try:
            n = _unescape(span, buf, &ascii)
            if not ascii:
                raise SLOW
            raw = _base64(buf, n)
        finally:
            _release(buf, local)
    if binary:
        return raw
    try:
        return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), NULL)
    except UnicodeDecodeError:
        return raw


cdef object _decimal(const Span* span):
    """values.conv_decimal: the str, if it is [+-]?(?:[0-9]+(?:\\.[0-9]*)?|\\.[0-9]+)."""
    if span.escaped or not span.ascii:
        raise SLOW  # no decimal literal needs either
    cdef const unsigned char* s = span.start
    cdef Py_ssize_t n = span.size, i = 0, before, after = 0
    if n and (s[0] == 0x2B or s[0] == 0x2D):
        i = 1
    before = i
    while i < n and 0x30 <= s[i] <= 0x39:
        i += 1
    before = i - before
    if i < n and s[i] == 0x2E:
        i += 1
        after = i
        while i < n and 0x30 <= s[i] <= 0x39:
            i += 1
        after = i - after
        if before == 0 and after == 0:
            raise SLOW
    elif before == 0:
        raise SLOW
    if i != n:
        raise SLOW
    return _str(s, n, True)


cdef struct Number:
    bint is_float
    bint negative
    uint64_t magnitude  # of an integer
    const unsigned char* start
    Py_ssize_t size


cdef inline const unsigned char* _scan_number(const unsigned char* p, const unsigned char* end, Number* num) except NULL:
    """A JSON number. Integers must fit orjson's int range, [-2^63, 2^64-1]; beyond it orjson
    makes a float, which this path leaves to the careful one. ``-0`` is left to it too."""
    cdef uint64_t m = 0, digit
    num.start = p
    num.is_float = False
    num.negative = False
    if p < end and p[0] == 0x2D:
        num.negative = True
        p += 1
    if p >= end:
        raise SLOW
    if p[0] == 0x30:
        p += 1
    elif 0x31 <= p[0] <= 0x39:
        while p < end and 0x30 <= p[0] <= 0x39:
            digit = p[0] - 0x30
            if m > (18446744073709551615ULL - digit) // 10:
                raise SLOW
            m = m * 10 + digit
            p += 1
    else:
        raise SLOW
    if p < end and p[0] == 0x2E:
        num.is_float = True
        p += 1
        if p >= end or not 0x30 <= p[0] <= 0x39:
            raise SLOW
        while p < end and 0x30 <= p[0] <= 0x39:
            p += 1
    if p < end and (p[0] == 0x65 or p[0] == 0x45):
        num.is_float = True
        p += 1
        if p < end and (p[0] == 0x2B or p[0] == 0x2D):
            p += 1
        if p >= end or not 0x30 <= p[0] <= 0x39:
            raise SLOW
        while p < end and 0x30 <= p[0] <= 0x39:
            p += 1
    num.size = p - num.start
    if not num.is_float:
        if num.negative and (m == 0 or m > 9223372036854775808ULL):
            raise SLOW
        num.magnitude = m
    return p


cdef inline object _int(const Number* num):
    if num.negative:
        return PyLong_FromLongLong(-<long long>(num.magnitude - 1) - 1)
    return PyLong_FromUnsignedLongLong(num.magnitude)


cdef object _float(const Number* num):
    """orjson's float of a JSON number: correctly rounded, like Python's own parser; infinity
    (a number beyond the double range) is an error to orjson."""
    cdef char text[64]
    cdef char* stop
    cdef double x
    if num.size >= 64:
        raise SLOW
    memcpy(text, num.start, num.size)
    text[num.size] = 0
    x = PyOS_string_to_double(text, &stop, NULL)
    if stop != text + num.size or isinf(x):
        raise SLOW
    return PyFloat_FromDouble(x)


# --- documents ------------------------------------------------------------------------------------

cdef enum:
    V_NULL = 1
    V_NUMBER
    V_STRING


cdef struct Cursor:
    const unsigned char* p
    const unsigned char* end


cdef inline int _expect(Cursor* c, unsigned char byte) except -1:
    if c.p >= c.end or c.p[0] != byte:
        raise SLOW
    c.p += 1
    return 0


cdef inline bint _next_member(Cursor* c) except -1:
    """After a member: True if another follows (a comma), False at the object's end."""
    if c.p < c.end:
        if c.p[0] == 0x2C:
            c.p += 1
            return True
        if c.p[0] == 0x7D:
            c.p += 1
            return False
    raise SLOW


cdef inline int _short_key(Cursor* c) except -1:
    """A one-letter object key ``"x":``: the letter."""
    cdef const unsigned char* p = c.p
    if c.end - p < 4 or p[0] != 0x22 or p[2] != 0x22 or p[3] != 0x3A:
        raise SLOW
    c.p = p + 4
    return p[1]


cdef struct ColumnInfo:
    long long t  # type code
    long long f  # flags, the handle-key bit of ``h`` folded in
    int order[3]  # the keys as sent ('t', 'f', 'v')


cdef object _column_value(Cursor* c, ColumnInfo* info, bint keep):
    """One ``{t, f, v}`` column (``h`` allowed), normalised as values._normalize_column does:
    ``h`` folded into ``f``, ``v`` converted by the type code: the value is returned, the type
    code, flags and key order go to ``info``. A column without ``f`` (old producers), with other
    keys or twice the same key, or with a value the careful path would reject, is given up on.
    Without ``keep`` the value is checked as always but None is returned where building it is
    not needed to check it (integers; ASCII strings without escapes, which the scan checked)."""
    cdef int key, seen = 0, count = 0
    cdef int* order = info.order
    cdef long long t = -1
    cdef Number code, f, num
    cdef Span span
    cdef int vkind = 0
    cdef bint handle = False
    cdef unsigned char group
    cdef object value
    memset(&f, 0, sizeof(Number))
    memset(&num, 0, sizeof(Number))
    memset(&span, 0, sizeof(Span))
    _expect(c, 0x7B)
    while True:
        key = _short_key(c)
        if key == 0x74:  # t
            if seen & 1:
                raise SLOW
            seen |= 1
            c.p = _scan_number(c.p, c.end, &code)
            if code.is_float or code.negative or code.magnitude > 255:
                raise SLOW  # a code the fast path does not know (or 3.0, true...)
            t = <long long>code.magnitude
        elif key == 0x66:  # f
            if seen & 2:
                raise SLOW
            seen |= 2
            c.p = _scan_number(c.p, c.end, &f)
            if f.is_float or f.negative or f.magnitude >> 62:
                raise SLOW
        elif key == 0x76:  # v
            if seen & 4:
                raise SLOW
            seen |= 4
            if c.p >= c.end:
                raise SLOW
            if c.p[0] == 0x22:
                c.p = _scan_string(c.p + 1, c.end, &span)
                vkind = V_STRING
            elif c.p[0] == 0x6E:
                if c.end - c.p < 4 or memcmp(c.p, b"null", 4) != 0:
                    raise SLOW
                c.p += 4
                vkind = V_NULL
            else:
                c.p = _scan_number(c.p, c.end, &num)  # true, false, objects, arrays: careful path
                vkind = V_NUMBER
        elif key == 0x68:  # h: current TiCDC marks handle-key columns with "h": true
            if seen & 8 or c.end - c.p < 4 or memcmp(c.p, b"true", 4) != 0:
                raise SLOW
            seen |= 8
            c.p += 4
            handle = True
            if not _next_member(c):
                break
            continue
        else:
            raise SLOW
        order[count] = key
        count += 1
        if not _next_member(c):
            break
    if seen & 7 != 7:
        raise SLOW
    group = GROUP[t]
    if vkind == V_NULL:
        # values._normalize_column: a null stays None whatever the code (only known codes here)
        if group == G_UNKNOWN:
            raise SLOW
        value = None
    elif group == G_INT:
        if vkind != V_NUMBER or num.is_float:
            raise SLOW
        value = _int(&num) if keep else None
    elif group == G_FLOAT:
        if vkind != V_NUMBER:
            raise SLOW
        value = _float(&num) if num.is_float else float(_int(&num))  # values.coerce_plain
    elif vkind != V_STRING:
        raise SLOW
    elif group == G_TEXT:
        value = _string(&span) if keep or span.escaped or not span.ascii else None
    elif group == G_STRING:
        if f.magnitude & BINARY:
            value = _go_unquote(&span)
        else:
            value = _string(&span) if keep or span.escaped or not span.ascii else None
    elif group == G_BLOB:
        value = _blob(&span, f.magnitude & BINARY)
    elif group == G_DECIMAL:
        value = _decimal(&span)
    else:
        raise SLOW  # the NULL type with a value, unknown codes
    info.t = t
    info.f = <long long>(f.magnitude | HANDLE_KEY if handle else f.magnitude)
    return value


cdef object _column_dict(const ColumnInfo* info, object value):
    """The ``{t, f, v}`` dict of a parsed column, its keys in the order they were sent."""
    cdef object col
    cdef int i, key
    if info.order[0] == 0x74 and info.order[1] == 0x66:  # t, f, v: the order producers write
        # A copy of a dict with these keys, then three stores in place: cheaper than three inserts.
        col = PyDict_Copy(COLUMN)
        PyDict_SetItem(col, "t", PyLong_FromLongLong(info.t))
        PyDict_SetItem(col, "f", PyLong_FromLongLong(info.f))
        PyDict_SetItem(col, "v", value)
        return col
    col = PyDict_New()
    for i in range(3):
        key = info.order[i]
        if key == 0x74:
            PyDict_SetItem(col, "t", PyLong_FromLongLong(info.t))
        elif key == 0x66:
            PyDict_SetItem(col, "f", PyLong_FromLongLong(info.f))
        else:
            PyDict_SetItem(col, "v", value)
    return col


cdef bint _same_names(dict old, object new) except -1:
    """``old.keys() == new.keys()`` (as sets), ``new`` a dict or a compact image."""
    cdef dict names = <dict>new if type(new) is dict else (<object>new).shape.index
    if len(old) != len(names):
        return False
    for name in names:
        if not PyDict_Contains(old, name):
            return False
    return True


# --- row images: new images of keyed rows compact from the start --------------------------------------
#
# A keyed row's new image is built as a CompactImage (its layout, shared, and a tuple of values)
# rather than a dict of {t, f, v} dicts: the daemon's listener and the catch-up's readers keep
# nothing else of it, so the dicts were built only to be converted and freed (5 of the 10 dicts
# of a four-column update). Keyless rows and old images stay dicts: the listener reads their
# columns, and keyless planning compares them column by column; only the old image of a keyed
# update, of which the daemon and the catch-up's readers read nothing but the key, is reduced to
# that (``old_keys_only``).

cdef object COMPACT_IMAGE = CompactImage
cdef object IMAGE_SHAPE = ImageShape

cdef enum:
    LOCAL_COLUMNS = 64  # columns parsed into the stack; wider images get a block of their own
    MAX_SHAPES = 4096  # layouts kept; past that the caches start anew (a stream of odd images)

# Column names (a tuple) -> (ImageShape, its (type code, flags) pairs packed as long longs), and
# table name -> the entry its last image used: checking that one is a few pointer comparisons,
# where finding the entry by names needs a tuple of them.
cdef dict _SHAPES = {}
cdef dict _LAST_SHAPE = {}
cdef dict _LAST_OLD_KEY_SHAPE = {}  # the same for the old images reduced to their key (_old_key_image)


cdef bint _same_pairs(bytes packed, const ColumnInfo* infos, Py_ssize_t n) except -1:
    """Whether the columns parsed have the packed (type code, flags) pairs of a layout."""
    if PyBytes_GET_SIZE(packed) != n * 2 * <Py_ssize_t>sizeof(long long):
        return False
    cdef const long long* pairs = <const long long*>PyBytes_AS_STRING(packed)
    cdef Py_ssize_t i
    for i in range(n):
        if pairs[2 * i] != infos[i].t or pairs[2 * i + 1] != infos[i].f:
            return False
    return True


cdef bint _same_columns(tuple entry, list names, const ColumnInfo* infos, Py_ssize_t n) except -1:
    """Whether the columns parsed (``names`` and ``infos``) are those of a cached layout."""
    cdef tuple known = (<object>entry[0]).names
    cdef Py_ssize_t i
    if len(known) != n:
        return False
    for i in range(n):
        a = names[i]
        b = known[i]
        if a is not b and a != b:
            return False
    return _same_pairs(<bytes>entry[1], infos, n)


cdef object _shape(list names, const ColumnInfo* infos, Py_ssize_t n, object table, dict last):
    """The ImageShape of the columns parsed: the table's last one, a cached one of these names
    and pairs, or a new one (a name sent twice is given up on: the careful path decides)."""
    cdef PyObject* found = PyDict_GetItem(last, table)
    if found != NULL and _same_columns(<tuple>found, names, infos, n):
        return (<tuple>found)[0]
    cdef tuple key = tuple(names)
    cdef tuple entry
    cdef list layout
    cdef object shape, packed
    cdef long long* pairs
    cdef Py_ssize_t i
    found = PyDict_GetItem(_SHAPES, key)
    if found != NULL and _same_pairs(<bytes>(<tuple>found)[1], infos, n):
        entry = <tuple>found
    else:
        layout = []
        for i in range(n):
            layout.append((infos[i].t, infos[i].f))
        shape = IMAGE_SHAPE(key, tuple(layout))
        if len(shape.index) != n:
            raise SLOW
        packed = PyBytes_FromStringAndSize(NULL, n * 2 * <Py_ssize_t>sizeof(long long))
        pairs = <long long*>PyBytes_AS_STRING(packed)
        for i in range(n):
            pairs[2 * i] = infos[i].t
            pairs[2 * i + 1] = infos[i].f
        entry = (shape, packed)
        if len(_SHAPES) >= MAX_SHAPES or len(last) >= MAX_SHAPES:
            _SHAPES.clear()
            _LAST_SHAPE.clear()
            _LAST_OLD_KEY_SHAPE.clear()
        _SHAPES[key] = entry
    last[table] = entry
    return entry[0]


cdef inline object _member_name(Cursor* c):
    """A member's name and its colon: a column name of an image."""
    cdef Span span
    _expect(c, 0x22)
    c.p = _scan_string(c.p, c.end, &span)
    name = _string(&span) if span.escaped else _name(span.start, span.size, span.ascii)
    _expect(c, 0x3A)
    return name


cdef object _row(Cursor* c, list values, object table):
    """One row image, in the producer's column order: with ``table`` (a new image), a
    CompactImage when a column is flagged handle key, else column name -> ``{t, f, v}`` dict.
    Each column's value is appended to ``values``. A name sent twice is given up on (orjson keeps
    the last value at the first place; the careful path decides)."""
    cdef ColumnInfo local[LOCAL_COLUMNS]
    cdef ColumnInfo* infos = local
    cdef ColumnInfo* grown
    cdef Py_ssize_t n = 0, cap = LOCAL_COLUMNS, i
    cdef list names = []
    cdef bint keyed = False
    cdef object row, out
    _expect(c, 0x7B)
    if c.p < c.end and c.p[0] == 0x7D:
        c.p += 1
        return PyDict_New()
    try:
        while True:
            name = _member_name(c)
            if n == cap:
                grown = <ColumnInfo*>PyMem_Malloc(2 * cap * sizeof(ColumnInfo))
                if grown == NULL:
                    raise MemoryError
                memcpy(grown, infos, n * sizeof(ColumnInfo))
                if infos != local:
                    PyMem_Free(infos)
                infos = grown
                cap *= 2
            value = _column_value(c, &infos[n], True)
            if infos[n].f & HANDLE_KEY:
                keyed = True
            names.append(name)
            values.append(value)
            n += 1
            if not _next_member(c):
                break
        if keyed and table is not None:
            out = _alloc(COMPACT_IMAGE)
            _put(<PyObject*>out, CI_SLOT[CI_SHAPE], _shape(names, infos, n, table, _LAST_SHAPE))
            _put(<PyObject*>out, CI_SLOT[CI_VALUES], tuple(values))
            return out
        row = PyDict_New()
        for i in range(n):
            PyDict_SetItem(row, names[i], _column_dict(&infos[i], values[i]))
            if PyDict_Size(row) != i + 1:
                raise SLOW  # a name sent twice
        return row
    finally:
        if infos != local:
            PyMem_Free(infos)


cdef object _old_key_image(Cursor* c, object new, object table):
    """An update's old image reduced to its handle-key columns, as a CompactImage (decode_record's
    ``old_keys_only``): only when it has the columns of the keyed new image ``new``, in its order,
    with the same columns flagged handle key, so that its key is read as from the whole image
    (``rows.old_handle_key`` then never needs a column that is left out). Every column is still
    parsed and checked as :func:`_row` does; the values of the others are not built."""
    cdef object shape = (<object>new).shape
    cdef tuple names = shape.names
    cdef tuple flags = shape.flags
    cdef Py_ssize_t n = 0, total = len(names), k = 0
    cdef ColumnInfo info
    cdef ColumnInfo keys[LOCAL_COLUMNS]
    cdef list key_names = []
    cdef list values = []
    cdef bint keyed
    _expect(c, 0x7B)
    if total > LOCAL_COLUMNS or (c.p < c.end and c.p[0] == 0x7D):
        raise SLOW
    while True:
        name = _member_name(c)
        if n == total:
            raise SLOW  # more columns than the new image
        known = names[n]
        if name is not known and name != known:
            raise SLOW
        keyed = (<long long>flags[n] & HANDLE_KEY) != 0
        value = _column_value(c, &info, keyed)
        if ((info.f & HANDLE_KEY) != 0) != keyed:
            raise SLOW  # the key moved: old_handle_key needs the whole image
        if keyed:
            keys[k] = info
            k += 1
            key_names.append(name)
            values.append(value)
        n += 1
        if not _next_member(c):
            break
    if n != total:
        raise SLOW
    out = _alloc(COMPACT_IMAGE)
    _put(<PyObject*>out, CI_SLOT[CI_SHAPE], _shape(key_names, keys, k, table, _LAST_OLD_KEY_SHAPE))
    _put(<PyObject*>out, CI_SLOT[CI_VALUES], tuple(values))
    return out


cdef object _row_event(const unsigned char* kp, Py_ssize_t kn, const unsigned char* vp, Py_ssize_t vn,
                       object decompress, object topic, object partition, object offset, Py_ssize_t index,
                       bint old_keys_only):
    """The event of one key and value document, or None for a kind the fast path leaves to the
    careful one (DDL). Raises for anything else it does not take (decoder._careful_event's rules)."""
    cdef Cursor c
    cdef Number num
    cdef Span span
    cdef int seen = 0, bit
    cdef int kind = 0
    cdef uint64_t ts = 0
    cdef object scm = "", tbl = "", ptn = None, rid = None, value, item
    cdef Py_buffer view
    cdef bint viewing = False
    cdef object u = None, p = None, d = None, new, old, row_kind, pos
    cdef list new_values = []
    cdef object event
    # The key: {"ts": uint64, "scm": str, "tbl": str, "t": 1 or 3, "ptn": int, "rid": int}. Other
    # members (ohk, ccl: large messages; unknown ones) go to the careful path.
    c.p = kp
    c.end = kp + kn
    _expect(&c, 0x7B)
    while True:
        _expect(&c, 0x22)
        c.p = _scan_string(c.p, c.end, &span)
        _expect(&c, 0x3A)
        if span.escaped:
            raise SLOW
        if span.size == 1 and span.start[0] == 0x74:  # t
            bit = 1
            c.p = _scan_number(c.p, c.end, &num)
            if num.is_float or num.negative or not 1 <= num.magnitude <= 3:
                raise SLOW
            kind = <int>num.magnitude
        elif span.size == 2 and memcmp(span.start, b"ts", 2) == 0:
            bit = 2
            c.p = _scan_number(c.p, c.end, &num)
            if num.is_float or num.negative:
                raise SLOW
            ts = num.magnitude
        elif span.size == 3 and (memcmp(span.start, b"scm", 3) == 0 or memcmp(span.start, b"tbl", 3) == 0):
            bit = 4 if span.start[0] == 0x73 else 8
            _expect(&c, 0x22)
            c.p = _scan_string(c.p, c.end, &span)
            if span.escaped:
                item = _string(&span)
            else:
                item = _name(span.start, span.size, span.ascii)
            if bit == 4:
                scm = item
            else:
                tbl = item
        elif span.size == 3 and (memcmp(span.start, b"ptn", 3) == 0 or memcmp(span.start, b"rid", 3) == 0):
            bit = 16 if span.start[0] == 0x70 else 32
            if c.end - c.p >= 4 and memcmp(c.p, b"null", 4) == 0:
                c.p += 4
                item = None
            else:
                c.p = _scan_number(c.p, c.end, &num)
                if num.is_float:
                    raise SLOW
                item = _int(&num)
            if bit == 16:
                ptn = item
            else:
                rid = item
        else:
            raise SLOW
        if seen & bit:
            raise SLOW
        seen |= bit
        if not _next_member(&c):
            break
    if c.p != c.end or seen & 3 != 3:
        raise SLOW
    if kind == 2:
        return None  # DDL events are rare, and checked by sqlgen.ddl_guard: the careful path
    if kind == 3:  # resolved: the careful path reads nothing else, not even the value
        return RESOLVED_EVENT(PyLong_FromUnsignedLongLong(ts), _position(topic, partition, offset, index))
    # The value: {"u": row, "p": row} or {"d": row}.
    if vn == 0:
        raise SLOW
    if decompress is not None:
        value = decompress(PyBytes_FromStringAndSize(<const char*>vp, vn))
        PyObject_GetBuffer(value, &view, PyBUF_SIMPLE)
        viewing = True
        vp = <const unsigned char*>view.buf
        vn = view.len
    try:
        c.p = vp
        c.end = vp + vn
        _expect(&c, 0x7B)
        while True:
            bit = _short_key(&c)
            if bit == 0x75 and u is None:
                u = _row(&c, new_values, tbl)
            elif bit == 0x70 and p is None:
                if old_keys_only and type(u) is COMPACT_IMAGE:
                    p = _old_key_image(&c, u, tbl)
                else:
                    p = _row(&c, [], None)
            elif bit == 0x64 and d is None:
                d = _row(&c, [], None)
            else:
                raise SLOW
            if not _next_member(&c):
                break
        if c.p != c.end:
            raise SLOW
    finally:
        if viewing:
            PyBuffer_Release(&view)
    if d is not None:
        if u is not None or p is not None:
            raise SLOW
        row_kind, new, old = DELETE, None, d
    elif u is None:
        raise SLOW
    elif p is None:
        row_kind, new, old = INSERT, u, None
    else:
        row_kind, new, old = UPDATE, u, p
        if type(old) is not COMPACT_IMAGE and not _same_names(old, new):  # (reduced: same names)
            old = fill_old(old, new)
    pos = _position(topic, partition, offset, index)
    event = _alloc(ROW_EVENT)
    _put(<PyObject*>event, EV_SLOT[E_TS], PyLong_FromUnsignedLongLong(ts))
    _put(<PyObject*>event, EV_SLOT[E_SCHEMA], scm)
    _put(<PyObject*>event, EV_SLOT[E_TABLE], tbl)
    _put(<PyObject*>event, EV_SLOT[E_KIND], row_kind)
    _put(<PyObject*>event, EV_SLOT[E_NEW], new)
    _put(<PyObject*>event, EV_SLOT[E_OLD], old)
    _put(<PyObject*>event, EV_SLOT[E_PTN], ptn)
    _put(<PyObject*>event, EV_SLOT[E_POS], pos)
    _put(<PyObject*>event, EV_SLOT[E_RID], rid)
    # The new image's values, taken while they are in the CPU cache: planning reads them a window
    # later, where walking the image again cost several times more (events.RowEvent.new_values).
    _put(<PyObject*>event, EV_SLOT[E_NEW_VALUES], None if new is None else (
        (<object>new).column_values if type(new) is COMPACT_IMAGE else tuple(new_values)))
    return event


cdef inline uint64_t _u64(const unsigned char* p):
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) | (<uint64_t>p[3] << 32)
            | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) | (<uint64_t>p[6] << 8) | <uint64_t>p[7])


cdef Py_ssize_t _count(const unsigned char* buf, Py_ssize_t start, Py_ssize_t end):
    """How many length-prefixed documents ``buf[start:end]`` holds exactly; -1 if it does not
    frame exactly (framing.split_record then says why)."""
    cdef Py_ssize_t n = 0
    cdef uint64_t length
    while start < end:
        if end - start < 8:
            return -1
        length = _u64(buf + start)
        start += 8
        if length > <uint64_t>(end - start):
            return -1
        start += <Py_ssize_t>length
        n += 1
    return n


def decode_record_fast(key, value, topic, partition, offset, plan, decompress, options, careful,
                       bint old_keys_only=False):
    """Every event of one record, or None when the record is not framed exactly (or its key or
    value is not ``bytes``): decoder.decode_record then splits it itself, which raises the framing
    error. An event this path does not take is decoded by
    ``careful(key_doc, value_doc, plan, decompress, options, topic, partition, offset, index)``;
    ``old_keys_only``: see decode_record."""
    if type(key) is not bytes or (value is not None and type(value) is not bytes):
        return None
    cdef const unsigned char* kb = <const unsigned char*>PyBytes_AS_STRING(key)
    cdef Py_ssize_t kn = PyBytes_GET_SIZE(key)
    cdef const unsigned char* vb = NULL
    cdef Py_ssize_t vn = 0
    if kn < 8 or _u64(kb) != 1:
        return None
    cdef Py_ssize_t count = _count(kb, 8, kn)
    if count <= 0:
        return None
    if value is not None and PyBytes_GET_SIZE(value):
        vb = <const unsigned char*>PyBytes_AS_STRING(value)
        vn = PyBytes_GET_SIZE(value)
        if _count(vb, 0, vn) != count:
            return None
    cdef list events = []
    cdef Py_ssize_t index, kpos = 8, vpos = 0, klen, vlen = 0
    cdef const unsigned char* kdoc
    cdef const unsigned char* vdoc = NULL
    for index in range(count):
        klen = <Py_ssize_t>_u64(kb + kpos)
        kdoc = kb + kpos + 8
        kpos += 8 + klen
        if vb != NULL:
            vlen = <Py_ssize_t>_u64(vb + vpos)
            vdoc = vb + vpos + 8
            vpos += 8 + vlen
        try:
            event = _row_event(kdoc, klen, vdoc, vlen, decompress, topic, partition, offset, index, old_keys_only)
        except Exception:
            event = None
        if event is None:
            event = careful(
                PyBytes_FromStringAndSize(<const char*>kdoc, klen),
                PyBytes_FromStringAndSize(<const char*>vdoc, vlen) if vb != NULL else b"",
                plan, decompress, options, topic, partition, offset, index,
            )
        events.append(event)
    return events


# --- compact images, for the daemon's row cache --------------------------------------------------------


def compact_image(dict image, tuple values, dict shapes):
    """``image`` (a decoded row image whose values, in column order, are ``values``) as a
    :class:`~applier.codec.events.CompactImage`, with the layout ``shapes`` holds for its column
    names when its types and flags are that layout's, else with a new one (kept in ``shapes``).

    Why compiled: the listener compacts every keyed row it caches, and checking the layout in
    Python cost more than decoding the row.
    """
    cdef tuple names = tuple(image)
    cdef object shape
    cdef PyObject* found = PyDict_GetItem(shapes, names)
    if found == NULL or not _same_layout(image, (<object>found).layout):
        shape = IMAGE_SHAPE.of(image)
        shapes[names] = shape
    else:
        shape = <object>found
    cdef object out = _alloc(COMPACT_IMAGE)
    _put(<PyObject*>out, CI_SLOT[CI_SHAPE], shape)
    _put(<PyObject*>out, CI_SLOT[CI_VALUES], values)
    return out


cdef bint _same_layout(dict image, tuple layout) except -1:
    """Whether the columns of ``image`` have, in order, the (type code, flags) pairs of ``layout``
    (as ``ImageShape.of`` would read them: equal values)."""
    cdef Py_ssize_t pos = 0, i = 0
    cdef PyObject* name
    cdef PyObject* col
    cdef PyObject* t
    cdef PyObject* f
    cdef tuple pair
    if PyDict_Size(image) != len(layout):
        return False
    while PyDict_Next(image, &pos, &name, &col):
        if type(<object>col) is not dict:
            return False
        t = PyDict_GetItem(<object>col, "t")
        f = PyDict_GetItem(<object>col, "f")
        pair = <tuple>layout[i]
        if t == NULL or f == NULL or not (<object>t == pair[0] and <object>f == pair[1]):
            return False
        i += 1
    return True

/* Compiled core of the exporters' output: hwtrace.export.textcols' Lines,
 * Perfetto slice packets, Chrome events and folded stacks.
 *
 * The Python twin of each function is named with it below.  The boundary
 * is narrow and stateless:
 *
 *   rows(n, ops) -> bytes        lengths(n, ops) -> bytearray (int64)
 *
 * The twin of a whole Lines (Lines.render, Lines.lengths): each row's
 * columns formatted straight from their values, no byte matrices.  ``ops``
 * is a list of columns, each a tuple (code, cond, ...) -- ``cond`` None or
 * a bool buffer of n (the column is empty where false):
 *   (0, cond, b)                        the bytes b
 *   (1, cond, table, ids, width, right) table[ids[i]] padded with spaces
 *                                       to width (right: right-aligned)
 *   (2, cond, v, signed, width, commas) decimal, right-aligned in width
 *                                       (v int64 when signed, else uint64;
 *                                       at most 19 digits, the twin's)
 *   (3, cond, v)                        lower-case hex of uint64, no pad
 *   (4, cond, v, bits)                  the low ``bits`` decimal digits of
 *                                       uint64 v, trailing zeros dropped
 *                                       (one kept)
 *   (5, cond, v)                        protobuf varint of uint64
 *   (6, cond, count)                    max(count, 0) spaces (int64)
 *   (7, cond, v, width)                 the low ``width`` decimal digits
 *                                       of uint64 v, zero-padded
 * ``lengths`` gives each row's byte count.
 *
 *   slice_packets(ts, end, track, iid, insns, flag, tracks, flags, parts)
 *       -> (bytes, bytearray of int64 packet lengths)
 *
 * The twin of PerfettoTraceWriter._encode's Lines: one TracePacket per
 * row, a slice begin (``end`` 0: the name's interned id ``iid``) or end
 * (its instruction count ``insns`` as a debug annotation), on the track
 * field ``tracks[track[i]]``, with the flags annotation ``flags[flag[i]]``
 * (b"" none).  ``ts`` uint64, ``end`` uint8, the rest int64.  ``parts``:
 * the encoded constant pieces (type begin, type end, name-iid tag,
 * annotation tag, the "insns" name and int tag, timestamp tag, sequence
 * field, track-event tag, sequence flags, packet tag).  With ``write``,
 * ``at`` (int64, ascending, 0..n) and ``specials`` (a list of bytes) the
 * packets go to ``write`` a megabyte or so at a time (as folded's, below),
 * specials[j] just before plain packet at[j] (at n: after the last), and
 * the call returns None; there a row whose ``end`` is 2 makes no packet
 * (the place of a special: ``at`` may count it, the specials then go
 * where their rows are, with no gathers of the plain rows' columns).
 *
 *   chrome_slices(name, ts, dur, pid, tid, flag, names, flags, parts) -> bytes
 *
 * The twin of ChromeTraceWriter._write_slices's Lines (without args):
 * per row parts[0] names[name[i]] parts[1] ts parts[2] dur parts[3] pid
 * parts[4] tid flags[flag[i]] parts[5], where ts and dur are int64
 * multiples of 2**-10 written as exact decimals (Lines.frac) and pid, tid
 * int64 decimals (Lines.int).  With ``write`` and ``drop`` the text goes
 * to ``write`` a megabyte or so at a time (as folded's, below), less its
 * last ``drop`` bytes, and the call returns None.
 *
 *   folded(order, lo, hi, name, weight, names, isroot, head, lo0, hi0, write)
 *
 * The twin of FoldedWriter's lines (folded.py, _lines and close): the
 * call-path tree of m nodes walked depth first, a line "head;a;b;c W\n"
 * per node whose weight rounds (half to even) to W > 0.  Node k's children
 * are order[lo[k]:hi[k]] (the root's: order[lo0:hi0]); ``name`` (int64)
 * indexes ``names`` (bytes, ';' already replaced) and ``isroot`` (uint8,
 * the --function frame: a stack starts at its first such frame; all ones
 * where there is none); ``weight`` is float64; ``head`` (bytes, may be
 * empty) is the first frame.  The order of lines is the twin's: a node's
 * children's lines when the node is taken off the stack, its children
 * pushed in order (so taken off last first).  The text goes to
 * ``write`` (called with a memoryview over the core's own buffer, released
 * after the call) a megabyte or so at a time.
 *
 * rows and lengths are here; slice_packets and chrome_slices in
 * core/events.c, folded in core/folded.c, what they share in core/out.c
 * (declared in core/textcols.h).
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdio.h>

#include "core/textcols.h"

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 5

/* -- rows(n, ops): a Lines formatted a row at a time ------------------------------- */

enum { OP_LIT, OP_STRS, OP_INT, OP_HEX, OP_FRAC, OP_VARINT, OP_SPACES, OP_ZEROS };

typedef struct {
    int code;
    Py_buffer cond, v;
    int has_cond, has_v;
    PyObject *lit;               /* OP_LIT: bytes (borrowed from the tuple) */
    const char **sp;             /* OP_STRS: the table */
    Py_ssize_t *sl, ntab;
    Py_ssize_t width;
    int right, sign, commas, bits;
} Op;

static const uint64_t POW10[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
    100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL,
    1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
    1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
    1000000000000000000ULL, 10000000000000000000ULL
};

static void ops_free(Op *ops, Py_ssize_t nc)
{
    if (!ops)
        return;
    for (Py_ssize_t c = 0; c < nc; c++) {
        if (ops[c].has_cond)
            PyBuffer_Release(&ops[c].cond);
        if (ops[c].has_v)
            PyBuffer_Release(&ops[c].v);
        PyMem_Free(ops[c].sp);
        PyMem_Free(ops[c].sl);
    }
    PyMem_Free(ops);
}

static Py_ssize_t tuple_ssize(PyObject *t, Py_ssize_t k)
{
    return PyLong_AsSsize_t(PyTuple_GET_ITEM(t, k));
}

/* the ops of a list, checked against n; NULL (an exception set) if bad */
static Op *ops_parse(Py_ssize_t n, PyObject *seq, Py_ssize_t *ncp)
{
    Py_ssize_t nc = PySequence_Fast_GET_SIZE(seq);
    Op *ops = PyMem_Calloc(nc ? nc : 1, sizeof(Op));
    *ncp = nc;
    if (!ops) {
        PyErr_NoMemory();
        return NULL;
    }
    static const int nargs[] = {3, 6, 6, 3, 4, 3, 3, 4};
    for (Py_ssize_t c = 0; c < nc; c++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, c);
        Op *o = &ops[c];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 3) {
            PyErr_SetString(PyExc_TypeError, "rows: an op is (code, cond, ...)");
            goto bad;
        }
        o->code = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        if (o->code < 0 || o->code > OP_ZEROS || PyTuple_GET_SIZE(t) != nargs[o->code]) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "rows: bad op");
            goto bad;
        }
        PyObject *cond = PyTuple_GET_ITEM(t, 1);
        if (cond != Py_None && tc_get_buf(cond, &o->cond, &o->has_cond, n, 1, "cond") < 0)
            goto bad;
        PyObject *a = PyTuple_GET_ITEM(t, 2);
        switch (o->code) {
        case OP_LIT:
            if (!PyBytes_Check(a)) {
                PyErr_SetString(PyExc_TypeError, "rows: a literal is bytes");
                goto bad;
            }
            o->lit = a;
            break;
        case OP_STRS: {
            PyObject *tab = PySequence_Fast(a, "rows: a table is a sequence");
            if (!tab)
                goto bad;
            o->ntab = PySequence_Fast_GET_SIZE(tab);
            o->sp = PyMem_Malloc((o->ntab ? o->ntab : 1) * sizeof(char *));
            o->sl = PyMem_Malloc((o->ntab ? o->ntab : 1) * sizeof(Py_ssize_t));
            if (!o->sp || !o->sl) {
                Py_DECREF(tab);
                PyErr_NoMemory();
                goto bad;
            }
            for (Py_ssize_t j = 0; j < o->ntab; j++) {
                PyObject *s = PySequence_Fast_GET_ITEM(tab, j);
                if (!PyBytes_Check(s)) {
                    Py_DECREF(tab);
                    PyErr_SetString(PyExc_TypeError, "rows: table entries are bytes");
                    goto bad;
                }
                /* the bytes live as long as the table the caller holds */
                o->sp[j] = PyBytes_AS_STRING(s);
                o->sl[j] = PyBytes_GET_SIZE(s);
            }
            Py_DECREF(tab);
            if (tc_get_buf(PyTuple_GET_ITEM(t, 3), &o->v, &o->has_v, n, 8, "ids") < 0)
                goto bad;
            o->width = tuple_ssize(t, 4);
            o->right = PyObject_IsTrue(PyTuple_GET_ITEM(t, 5));
            const int64_t *ids = o->v.buf;
            for (Py_ssize_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= o->ntab) {
                    PyErr_SetString(PyExc_IndexError, "rows: a string id outside its table");
                    goto bad;
                }
            break;
        }
        case OP_INT:
            if (tc_get_buf(a, &o->v, &o->has_v, n, 8, "values") < 0)
                goto bad;
            o->sign = PyObject_IsTrue(PyTuple_GET_ITEM(t, 3));
            o->width = tuple_ssize(t, 4);
            o->commas = PyObject_IsTrue(PyTuple_GET_ITEM(t, 5));
            break;
        case OP_FRAC:
            o->bits = (int)tuple_ssize(t, 3);
            if (o->bits < 0 || o->bits > 20) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "rows: 0 <= bits <= 20");
                goto bad;
            }
            if (tc_get_buf(a, &o->v, &o->has_v, n, 8, "values") < 0)
                goto bad;
            break;
        case OP_ZEROS:
            o->width = tuple_ssize(t, 3);
            if (o->width < 0)
                o->width = 0;
            /* fall through */
        case OP_HEX:
        case OP_VARINT:
        case OP_SPACES:
            if (tc_get_buf(a, &o->v, &o->has_v, n, 8, "values") < 0)
                goto bad;
            break;
        }
        if (PyErr_Occurred())
            goto bad;
        if (o->width < 0)
            o->width = 0;
    }
    return ops;
bad:
    ops_free(ops, nc);
    return NULL;
}

/* op o's bytes of row i at p (p NULL: only how many) */
static Py_ssize_t op_row(const Op *o, Py_ssize_t i, char *p)
{
    if (o->has_cond && !((const uint8_t *)o->cond.buf)[i])
        return 0;
    switch (o->code) {
    case OP_LIT: {
        Py_ssize_t l = PyBytes_GET_SIZE(o->lit);
        if (p)
            put(p, PyBytes_AS_STRING(o->lit), l);
        return l;
    }
    case OP_STRS: {
        int64_t id = ((const int64_t *)o->v.buf)[i];
        Py_ssize_t l = o->sl[id], w = l > o->width ? l : o->width;
        if (p) {
            if (o->right) {
                memset(p, ' ', w - l);
                put(p + (w - l), o->sp[id], l);
            } else {
                put(p, o->sp[id], l);
                memset(p + l, ' ', w - l);
            }
        }
        return w;
    }
    case OP_INT: {
        uint64_t a;
        int neg = 0;
        if (o->sign) {
            int64_t x = ((const int64_t *)o->v.buf)[i];
            neg = x < 0;
            a = neg ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        } else {
            a = ((const uint64_t *)o->v.buf)[i];
        }
        int nd = 1;
        while (nd < 19 && a >= POW10[nd])
            nd++;
        if (nd == 19)
            a %= POW10[19];        /* the twin's: at most 19 digits, the low ones */
        Py_ssize_t ln = nd + (o->commas ? (nd - 1) / 3 : 0) + neg;
        Py_ssize_t w = ln > o->width ? ln : o->width;
        if (p) {
            char *q = p + w;
            int k = 0;
            do {
                if (o->commas && k && k % 3 == 0)
                    *--q = ',';
                *--q = (char)('0' + a % 10);
                a /= 10;
                k++;
            } while (k < nd);
            if (neg)
                *--q = '-';
            memset(p, ' ', q - p);
        }
        return w;
    }
    case OP_HEX: {
        uint64_t a = ((const uint64_t *)o->v.buf)[i];
        int nd = 1;
        while (nd < 16 && (a >> (4 * nd)))
            nd++;
        if (p)
            for (int k = nd - 1; k >= 0; k--, a >>= 4)
                p[k] = "0123456789abcdef"[a & 15];
        return nd;
    }
    case OP_FRAC: {
        if (!o->bits)
            return 0;
        uint64_t a = ((const uint64_t *)o->v.buf)[i];
        char d[20];
        for (int k = o->bits - 1; k >= 0; k--, a /= 10)
            d[k] = (char)('0' + a % 10);
        int l = o->bits;
        while (l > 1 && d[l - 1] == '0')
            l--;
        if (p)
            memcpy(p, d, l);
        return l;
    }
    case OP_VARINT: {
        uint64_t a = ((const uint64_t *)o->v.buf)[i];
        Py_ssize_t l = 0;
        do {
            uint8_t b = (uint8_t)(a & 0x7F);
            a >>= 7;
            if (a)
                b |= 0x80;
            if (p)
                p[l] = (char)b;
            l++;
        } while (a);
        return l;
    }
    case OP_ZEROS: {
        uint64_t a = ((const uint64_t *)o->v.buf)[i];
        if (p)
            for (Py_ssize_t k = o->width - 1; k >= 0; k--, a /= 10)
                p[k] = (char)('0' + a % 10);
        return o->width;
    }
    case OP_SPACES: {
        int64_t c = ((const int64_t *)o->v.buf)[i];
        if (c <= 0)
            return 0;
        if (p)
            memset(p, ' ', (size_t)c);
        return (Py_ssize_t)c;
    }
    }
    return 0;
}

/* the most bytes op o writes in any of the n rows */
static Py_ssize_t op_bound(const Op *o, Py_ssize_t n)
{
    Py_ssize_t b = 0;
    switch (o->code) {
    case OP_LIT:
        return PyBytes_GET_SIZE(o->lit);
    case OP_STRS:
        for (Py_ssize_t j = 0; j < o->ntab; j++)
            if (o->sl[j] > b)
                b = o->sl[j];
        return b > o->width ? b : o->width;
    case OP_INT:
        b = 19 + 6 + 1;
        return b > o->width ? b : o->width;
    case OP_HEX:
        return 16;
    case OP_FRAC:
        return o->bits;
    case OP_VARINT:
        return 10;
    case OP_ZEROS:
        return o->width;
    case OP_SPACES:
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t c = ((const int64_t *)o->v.buf)[i];
            if (c > b)
                b = (Py_ssize_t)c;
        }
        return b;
    }
    return 0;
}

static PyObject *rows_or_lengths(PyObject *const *args, Py_ssize_t nargs, int rows)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, rows ? "rows(n, ops)" : "lengths(n, ops)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "rows: n < 0");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "ops must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t nc = 0;
    PyObject *res = NULL;
    Op *ops = ops_parse(n, seq, &nc);
    if (!ops)
        goto done;
    if (!rows) {
        res = PyByteArray_FromStringAndSize(NULL, n * 8);
        if (!res)
            goto done;
        int64_t *out = (int64_t *)PyByteArray_AS_STRING(res);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t l = 0;
            for (Py_ssize_t c = 0; c < nc; c++)
                l += op_row(&ops[c], i, NULL);
            out[i] = l;
        }
        goto done;
    }
    /* one pass: room for the longest row is made before each row */
    Py_ssize_t bound = 0;
    for (Py_ssize_t c = 0; c < nc; c++)
        bound += op_bound(&ops[c], n);
    Py_ssize_t cap = n * (bound < 64 ? bound : 64) + bound + 1, used = 0;
    res = PyBytes_FromStringAndSize(NULL, cap);
    if (!res)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cap - used < bound) {
            Py_ssize_t want = cap * 2 > used + bound ? cap * 2 : used + bound;
            if (_PyBytes_Resize(&res, want) < 0)
                goto done;          /* res is NULL now */
            cap = want;
        }
        char *p = PyBytes_AS_STRING(res) + used;
        char *p0 = p;
        for (Py_ssize_t c = 0; c < nc; c++)
            p += op_row(&ops[c], i, p);
        used += p - p0;
    }
    if (_PyBytes_Resize(&res, used) < 0)
        goto done;
done:
    ops_free(ops, nc);
    Py_DECREF(seq);
    return res;
}

static PyObject *py_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return rows_or_lengths(args, nargs, 1);
}

static PyObject *py_lengths(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return rows_or_lengths(args, nargs, 0);
}

static PyMethodDef methods[] = {
    {"rows", (PyCFunction)(void (*)(void))py_rows, METH_FASTCALL,
     "rows(n, ops) -> bytes"},
    {"lengths", (PyCFunction)(void (*)(void))py_lengths, METH_FASTCALL,
     "lengths(n, ops) -> bytearray of int64"},
    {"slice_packets", (PyCFunction)(void (*)(void))tc_slice_packets, METH_FASTCALL,
     "slice_packets(ts, end, track, iid, insns, flag, tracks, flags, parts[, write, at, specials]) -> (bytes, lens) or None"},
    {"chrome_slices", (PyCFunction)(void (*)(void))tc_chrome_slices, METH_FASTCALL,
     "chrome_slices(name, ts, dur, pid, tid, flag, names, flags, parts[, write, drop]) -> bytes or None"},
    {"folded", (PyCFunction)(void (*)(void))tc_folded, METH_FASTCALL,
     "folded(order, lo, hi, name, weight, names, isroot, head, lo0, hi0, write)"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_c_textcols",
    "Compiled column assembly (twin: hwtrace.export.textcols.Lines).", -1,
    methods
};

PyMODINIT_FUNC PyInit__c_textcols(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", ABI) < 0
            || PyModule_AddStringConstant(m, "SOURCE_SHA256",
                                          HWTRACE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

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
 * the call returns None.
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
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdio.h>

#include "../_ext/textput.h"

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 4

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

static int get_buf(PyObject *o, Py_buffer *b, int *has, Py_ssize_t n, Py_ssize_t item,
                   const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    *has = 1;
    if (b->len != n * item) {
        PyErr_Format(PyExc_ValueError, "rows: %s has %zd bytes, not %zd", what,
                     b->len, n * item);
        return -1;
    }
    return 0;
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
        if (cond != Py_None && get_buf(cond, &o->cond, &o->has_cond, n, 1, "cond") < 0)
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
            if (get_buf(PyTuple_GET_ITEM(t, 3), &o->v, &o->has_v, n, 8, "ids") < 0)
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
            if (get_buf(a, &o->v, &o->has_v, n, 8, "values") < 0)
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
            if (get_buf(a, &o->v, &o->has_v, n, 8, "values") < 0)
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
            if (get_buf(a, &o->v, &o->has_v, n, 8, "values") < 0)
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

/* -- folded(...): flame-graph stacks of a call-path tree --------------------------- */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n)
            cap *= 2;
        char *q = PyMem_Realloc(b->p, cap);
        if (!q) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = q;
        b->cap = cap;
    }
    put(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* what b holds to write(), lent as a read-only memoryview over b's own
   memory (no bytes object: a BufferedWriter hands a chunk bigger than its
   buffer straight to the file) and released after the call, so a writer
   that kept it can not see b reused; 0, or -1 with an exception set */
static int folded_flush(Buf *b, PyObject *write)
{
    if (!b->len)
        return 0;
    PyObject *chunk = PyMemoryView_FromMemory(b->p, b->len, PyBUF_READ);
    if (!chunk)
        return -1;
    PyObject *r = PyObject_CallOneArg(write, chunk);
    PyObject *rel = PyObject_CallMethod(chunk, "release", NULL);
    Py_DECREF(chunk);
    if (!r) {
        Py_XDECREF(rel);
        return -1;
    }
    Py_DECREF(r);
    if (!rel)
        return -1;
    Py_DECREF(rel);
    b->len = 0;
    return 0;
}

/* bytes gathered before each write: at least a 1 MB file buffer, which a
   BufferedWriter then passes on without copying (4 MB chunks cost more
   system time here than they saved) */
#define FOLDED_CHUNK (1 << 20)

static PyObject *py_folded(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "folded(order, lo, hi, name, weight, names, "
                        "isroot, head, lo0, hi0, write)");
        return NULL;
    }
    Py_buffer bo, bl, bh, bn, bw, br;
    int ho = 0, hl = 0, hh = 0, hn = 0, hw = 0, hr = 0;
    PyObject *res = NULL, *tab = NULL;
    const char **sp = NULL;
    Py_ssize_t *sl = NULL, *chain_prev = NULL, *chain_name = NULL, *tmp = NULL;
    Py_ssize_t *sk = NULL, *sc = NULL;
    char *sr = NULL;
    Buf out = {NULL, 0, 0}, line = {NULL, 0, 0};
    Py_ssize_t *pc = NULL, *pend = NULL;
    if (PyObject_GetBuffer(args[0], &bo, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    ho = 1;
    Py_ssize_t m = bo.len / 8;
    if (get_buf(args[1], &bl, &hl, m, 8, "lo") < 0
            || get_buf(args[2], &bh, &hh, m, 8, "hi") < 0
            || get_buf(args[3], &bn, &hn, m, 8, "name") < 0
            || get_buf(args[4], &bw, &hw, m, 8, "weight") < 0)
        goto done;
    tab = PySequence_Fast(args[5], "folded: names is a sequence");
    if (!tab)
        goto done;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(tab);
    if (get_buf(args[6], &br, &hr, nt, 1, "isroot") < 0)
        goto done;
    if (!PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "folded: head is bytes");
        goto done;
    }
    Py_ssize_t lo0 = PyLong_AsSsize_t(args[8]), hi0 = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred())
        goto done;
    const int64_t *order = bo.buf, *lo = bl.buf, *hi = bh.buf, *name = bn.buf;
    const double *weight = bw.buf;
    const uint8_t *isroot = br.buf;
    sp = PyMem_Malloc((nt ? nt : 1) * sizeof(char *));
    sl = PyMem_Malloc((nt ? nt : 1) * sizeof(Py_ssize_t));
    chain_prev = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
    chain_name = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
    tmp = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
    sk = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    sc = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    sr = PyMem_Malloc(m + 1);
    pc = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    pend = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    if (!sp || !sl || !chain_prev || !chain_name || !tmp || !sk || !sc || !sr || !pc
            || !pend) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < nt; j++) {
        PyObject *s = PySequence_Fast_GET_ITEM(tab, j);
        if (!PyBytes_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "folded: names are bytes");
            goto done;
        }
        sp[j] = PyBytes_AS_STRING(s);
        sl[j] = PyBytes_GET_SIZE(s);
    }
    /* the tree must be one: every child index and name in range, each
       node pushed at most once (else the stacks would overflow) */
    if (lo0 < 0 || hi0 < lo0 || hi0 > m)
        goto bad_tree;
    for (Py_ssize_t k = 0; k < m; k++)
        if (lo[k] < 0 || hi[k] < lo[k] || hi[k] > m || order[k] < 0 || order[k] >= m
                || name[k] < 0 || name[k] >= nt)
            goto bad_tree;
    const char *head = PyBytes_AS_STRING(args[7]);
    Py_ssize_t headlen = PyBytes_GET_SIZE(args[7]);
    int has_head = headlen > 0;
    Py_ssize_t top = 0, nchain = 0, pushed = 0;
    /* the last line written (without its weight): its chain entries
       pc[0..pd) bottom first, where each frame's text ends in it */
    Py_ssize_t pd = 0, headpart = 0;
    if (has_head && (buf_put(&line, head, headlen) < 0 || buf_put(&line, ";", 1) < 0))
        goto done;
    headpart = line.len;
    sk[top] = -1;
    sc[top] = -1;
    sr[top] = 0;             /* the root: (rooted) as the caller says below */
    int root_rooted = 1;
    for (Py_ssize_t j = 0; j < nt; j++)
        if (!isroot[j]) {
            root_rooted = 0;
            break;
        }
    sr[top++] = (char)root_rooted;
    while (top) {
        top--;
        Py_ssize_t q = sk[top], cq = sc[top];
        int rq = sr[top];
        Py_ssize_t a = q < 0 ? lo0 : lo[q], z = q < 0 ? hi0 : hi[q];
        for (Py_ssize_t o = a; o < z; o++) {
            Py_ssize_t k = order[o];
            Py_ssize_t cn = name[k];
            int r = rq || isroot[cn];
            Py_ssize_t ck = -1;
            if (r) {
                if (nchain >= m)
                    goto bad_tree;
                ck = nchain++;
                chain_prev[ck] = rq ? cq : -1;
                chain_name[ck] = cn;
                double w = weight[k];
                double v = w ? nearbyint(w) : 0.0;
                if (v > 0) {
                    /* the line's frames, bottom first, are its chain;
                       the frames it shares with the line before (the
                       same chain entries: an entry is one node) are
                       that line's text up to there, copied at once */
                    Py_ssize_t d = 0;
                    for (Py_ssize_t c = ck; c >= 0; c = chain_prev[c])
                        tmp[d++] = c;
                    Py_ssize_t c = d < pd ? d : pd;
                    while (c > 0 && pc[c - 1] != tmp[d - c])
                        c--;
                    line.len = c ? pend[c - 1] : headpart;
                    for (Py_ssize_t j = c; j < d; j++) {
                        Py_ssize_t f = chain_name[tmp[d - 1 - j]];
                        if ((j && buf_put(&line, ";", 1) < 0)
                                || buf_put(&line, sp[f], sl[f]) < 0)
                            goto done;
                        pc[j] = tmp[d - 1 - j];
                        pend[j] = line.len;
                    }
                    pd = d;
                    if (buf_put(&out, line.p, line.len) < 0)
                        goto done;
                    char num[40];
                    int nn = snprintf(num, sizeof num, " %.0f\n", v);
                    if (buf_put(&out, num, nn) < 0)
                        goto done;
                    if (out.len >= FOLDED_CHUNK && folded_flush(&out, args[10]) < 0)
                        goto done;
                }
            }
            if (++pushed > m)
                goto bad_tree;
            sk[top] = k;
            sc[top] = ck;
            sr[top++] = (char)r;
        }
    }
    if (folded_flush(&out, args[10]) < 0)
        goto done;
    res = Py_NewRef(Py_None);
    goto done;
bad_tree:
    PyErr_SetString(PyExc_ValueError, "folded: not a tree");
done:
    if (ho) PyBuffer_Release(&bo);
    if (hl) PyBuffer_Release(&bl);
    if (hh) PyBuffer_Release(&bh);
    if (hn) PyBuffer_Release(&bn);
    if (hw) PyBuffer_Release(&bw);
    if (hr) PyBuffer_Release(&br);
    Py_XDECREF(tab);
    PyMem_Free(sp);
    PyMem_Free(sl);
    PyMem_Free(chain_prev);
    PyMem_Free(chain_name);
    PyMem_Free(tmp);
    PyMem_Free(sk);
    PyMem_Free(sc);
    PyMem_Free(sr);
    PyMem_Free(out.p);
    PyMem_Free(line.p);
    PyMem_Free(pc);
    PyMem_Free(pend);
    return res;
}

/* -- slice_packets(...): Perfetto slice begin/end packets -------------------------- */

static int vlen(uint64_t a)
{
    int l = 1;
    while (a >>= 7)
        l++;
    return l;
}

static char *vput(char *p, uint64_t a)
{
    while (a >= 0x80) {
        *p++ = (char)(a | 0x80);
        a >>= 7;
    }
    *p++ = (char)a;
    return p;
}

typedef struct {
    const char **sp;
    Py_ssize_t *sl, n;
} Tab;

static int tab_get(PyObject *o, Tab *t)
{
    PyObject *seq = PySequence_Fast(o, "slice_packets: a table is a sequence");
    if (!seq)
        return -1;
    t->n = PySequence_Fast_GET_SIZE(seq);
    t->sp = PyMem_Malloc((t->n ? t->n : 1) * sizeof(char *));
    t->sl = PyMem_Malloc((t->n ? t->n : 1) * sizeof(Py_ssize_t));
    if (!t->sp || !t->sl) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < t->n; j++) {
        PyObject *s = PySequence_Fast_GET_ITEM(seq, j);
        if (!PyBytes_Check(s)) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "slice_packets: table entries are bytes");
            return -1;
        }
        /* the bytes live as long as the caller's table */
        t->sp[j] = PyBytes_AS_STRING(s);
        t->sl[j] = PyBytes_GET_SIZE(s);
    }
    Py_DECREF(seq);
    return 0;
}

#define NPARTS 10
enum { TB, TE, IID, ANNOT, INSNS, TS, SEQ, TEV, NEEDS, PKT };

/* the columns and tables of slice_packets */
typedef struct {
    const uint64_t *ts;
    const uint8_t *end;
    const int64_t *tr, *iid, *ins, *fl;
    Tab tt, ft, pt;
} Pkts;

/* packet i's length, and the lengths inside it */
static inline Py_ssize_t pkt_len(const Pkts *k, Py_ssize_t i, Py_ssize_t *te_out,
                                 Py_ssize_t *alen_out, Py_ssize_t *body_out)
{
    const Py_ssize_t *L = k->pt.sl;
    Py_ssize_t te = k->tt.sl[k->tr[i]] + k->ft.sl[k->fl[i]], alen = 0;
    if (k->end[i]) {
        alen = L[INSNS] + vlen((uint64_t)k->ins[i]);
        te += L[TE] + L[ANNOT] + vlen((uint64_t)alen) + alen;
    } else {
        te += L[TB] + L[IID] + vlen((uint64_t)k->iid[i]);
    }
    Py_ssize_t body = L[TS] + vlen(k->ts[i]) + L[SEQ] + L[TEV] + vlen((uint64_t)te) + te
        + L[NEEDS];
    *te_out = te;
    *alen_out = alen;
    *body_out = body;
    return L[PKT] + vlen((uint64_t)body) + body;
}

static inline char *pkt_put(const Pkts *k, Py_ssize_t i, char *p)
{
    const Py_ssize_t *L = k->pt.sl;
    const char **P = k->pt.sp;
    Py_ssize_t te, alen, body;
    pkt_len(k, i, &te, &alen, &body);
    int64_t tr = k->tr[i], fl = k->fl[i];
#define PUT(j) (p = put(p, P[j], L[j]))
    PUT(PKT);
    p = vput(p, (uint64_t)body);
    PUT(TS);
    p = vput(p, k->ts[i]);
    PUT(SEQ);
    PUT(TEV);
    p = vput(p, (uint64_t)te);
    if (k->end[i]) {
        PUT(TE);
        p = put(p, k->tt.sp[tr], k->tt.sl[tr]);
        PUT(ANNOT);
        p = vput(p, (uint64_t)alen);
        PUT(INSNS);
        p = vput(p, (uint64_t)k->ins[i]);
    } else {
        PUT(TB);
        p = put(p, k->tt.sp[tr], k->tt.sl[tr]);
        PUT(IID);
        p = vput(p, (uint64_t)k->iid[i]);
    }
    p = put(p, k->ft.sp[fl], k->ft.sl[fl]);
    PUT(NEEDS);
#undef PUT
    return p;
}

/* text gathered before each write() (as folded's, for the same reason) */
#define STREAM_CHUNK (1 << 20)

/* slice_packets' write mode: the packets, and specials[j] before plain
   packet at[j], to write() a chunk at a time; 0 or -1 */
static int pkt_stream(const Pkts *k, Py_ssize_t n, PyObject *write, PyObject *at_o,
                      PyObject *specials)
{
    Py_buffer ba = {0};
    Buf out = {NULL, 0, 0};
    int rc = -1;
    if (!PyList_Check(specials)) {
        PyErr_SetString(PyExc_TypeError, "slice_packets: specials is a list");
        return -1;
    }
    Py_ssize_t m = PyList_GET_SIZE(specials);
    if (PyObject_GetBuffer(at_o, &ba, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (ba.len != m * 8) {
        PyErr_SetString(PyExc_ValueError, "slice_packets: one place per special");
        goto done;
    }
    const int64_t *at = ba.buf;
    for (Py_ssize_t j = 0; j < m; j++)
        if (at[j] < 0 || at[j] > n || (j && at[j] < at[j - 1])
            || !PyBytes_Check(PyList_GET_ITEM(specials, j))) {
            PyErr_SetString(PyExc_ValueError, "slice_packets: specials' places");
            goto done;
        }
    Py_ssize_t most = 0, te, alen, body;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t l = pkt_len(k, i, &te, &alen, &body);
        if (l > most)
            most = l;
    }
    out.cap = STREAM_CHUNK + most;
    out.p = PyMem_Malloc(out.cap);
    if (!out.p) {
        PyErr_NoMemory();
        goto done;
    }
    char *p = out.p;
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i <= n; i++) {
        for (; j < m && at[j] == i; j++) {
            PyObject *sb = PyList_GET_ITEM(specials, j);
            out.len = p - out.p;
            if (buf_put(&out, PyBytes_AS_STRING(sb), PyBytes_GET_SIZE(sb)) < 0)
                goto done;
            p = out.p + out.len;
        }
        if (i == n)
            break;
        if (out.cap - (p - out.p) < most) {     /* grown by a special */
            out.len = p - out.p;
            if (folded_flush(&out, write) < 0)
                goto done;
            p = out.p;
        }
        p = pkt_put(k, i, p);
        if (p - out.p >= STREAM_CHUNK) {
            out.len = p - out.p;
            if (folded_flush(&out, write) < 0)
                goto done;
            p = out.p;
        }
    }
    out.len = p - out.p;
    rc = folded_flush(&out, write);
done:
    PyBuffer_Release(&ba);
    PyMem_Free(out.p);
    return rc;
}

static PyObject *py_slice_packets(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 && nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "slice_packets(ts, end, track, iid, insns, flag, "
                        "tracks, flags, parts[, write, at, specials])");
        return NULL;
    }
    Py_buffer b[6];
    int has[6] = {0};
    static const Py_ssize_t isz[6] = {8, 1, 8, 8, 8, 8};
    static const char *what[6] = {"ts", "end", "track", "iid", "insns", "flag"};
    Pkts k = {.tt = {NULL, NULL, 0}, .ft = {NULL, NULL, 0}, .pt = {NULL, NULL, 0}};
    PyObject *data = NULL, *lens = NULL, *res = NULL;
    Py_ssize_t n = 0;
    if (PyObject_GetBuffer(args[0], &b[0], PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    has[0] = 1;
    n = b[0].len / 8;
    for (int j = 1; j < 6; j++)
        if (get_buf(args[j], &b[j], &has[j], n, isz[j], what[j]) < 0)
            goto done;
    if (tab_get(args[6], &k.tt) < 0 || tab_get(args[7], &k.ft) < 0
        || tab_get(args[8], &k.pt) < 0)
        goto done;
    if (k.pt.n != NPARTS) {
        PyErr_SetString(PyExc_ValueError, "slice_packets: parts has 10 pieces");
        goto done;
    }
    k.ts = b[0].buf;
    k.end = b[1].buf;
    k.tr = b[2].buf;
    k.iid = b[3].buf;
    k.ins = b[4].buf;
    k.fl = b[5].buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (k.tr[i] < 0 || k.tr[i] >= k.tt.n || k.fl[i] < 0 || k.fl[i] >= k.ft.n) {
            PyErr_SetString(PyExc_IndexError, "slice_packets: a track or flags id "
                            "outside its table");
            goto done;
        }
    if (nargs == 12) {
        if (pkt_stream(&k, n, args[9], args[10], args[11]) == 0)
            res = Py_NewRef(Py_None);
        goto done;
    }
    lens = PyByteArray_FromStringAndSize(NULL, n * 8);
    if (!lens)
        goto done;
    int64_t *ln = (int64_t *)PyByteArray_AS_STRING(lens);
    Py_ssize_t size = 0, te, alen, body;
    for (Py_ssize_t i = 0; i < n; i++) {
        ln[i] = pkt_len(&k, i, &te, &alen, &body);
        size += ln[i];
    }
    data = PyBytes_FromStringAndSize(NULL, size);
    if (!data)
        goto done;
    char *p = PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++)
        p = pkt_put(&k, i, p);
    res = PyTuple_Pack(2, data, lens);
done:
    for (int j = 0; j < 6; j++)
        if (has[j])
            PyBuffer_Release(&b[j]);
    PyMem_Free(k.tt.sp); PyMem_Free(k.tt.sl);
    PyMem_Free(k.ft.sp); PyMem_Free(k.ft.sl);
    PyMem_Free(k.pt.sp); PyMem_Free(k.pt.sl);
    Py_XDECREF(data);
    Py_XDECREF(lens);
    return res;
}

/* -- chrome_slices(...): Chrome "X" events ----------------------------------------- */

/* k / 1024 exactly: Lines.frac(k, 10) */
static char *put_frac10(char *p, int64_t k)
{
    uint64_t a = k < 0 ? (uint64_t)0 - (uint64_t)k : (uint64_t)k;
    if (k < 0)
        *p++ = '-';
    p = put_i64(p, (int64_t)(a >> 10));
    *p++ = '.';
    uint64_t f = (a & 1023) * 9765625ULL;       /* 5**10 */
    char d[10];
    for (int j = 8; j >= 0; j -= 2, f /= 100)
        memcpy(d + j, DIG2 + 2 * (f % 100), 2);
    int l = 10;
    while (l > 1 && d[l - 1] == '0')
        l--;
    return put(p, d, l);
}

static PyObject *py_chrome_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 && nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "chrome_slices(name, ts, dur, pid, tid, flag, "
                        "names, flags, parts[, write, drop])");
        return NULL;
    }
    PyObject *write = nargs == 11 ? args[9] : NULL;
    Py_ssize_t drop = 0;
    if (write) {
        drop = PyLong_AsSsize_t(args[10]);
        if (drop == -1 && PyErr_Occurred())
            return NULL;
    }
    Buf out = {NULL, 0, 0};
    Py_buffer b[6];
    int has[6] = {0};
    static const char *what[6] = {"name", "ts", "dur", "pid", "tid", "flag"};
    Tab nt = {NULL, NULL, 0}, ft = {NULL, NULL, 0}, pt = {NULL, NULL, 0};
    PyObject *res = NULL;
    Py_ssize_t n = 0;
    if (PyObject_GetBuffer(args[0], &b[0], PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    has[0] = 1;
    n = b[0].len / 8;
    for (int k = 1; k < 6; k++)
        if (get_buf(args[k], &b[k], &has[k], n, 8, what[k]) < 0)
            goto done;
    if (tab_get(args[6], &nt) < 0 || tab_get(args[7], &ft) < 0 || tab_get(args[8], &pt) < 0)
        goto done;
    if (pt.n != 6) {
        PyErr_SetString(PyExc_ValueError, "chrome_slices: parts has 6 pieces");
        goto done;
    }
    const int64_t *name = b[0].buf, *ts = b[1].buf, *dur = b[2].buf, *pid = b[3].buf,
        *tid = b[4].buf, *fl = b[5].buf;
    Py_ssize_t fixed = 0, size = 0, most = 0;
    for (int k = 0; k < 6; k++)
        fixed += pt.sl[k];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (name[i] < 0 || name[i] >= nt.n || fl[i] < 0 || fl[i] >= ft.n) {
            PyErr_SetString(PyExc_IndexError, "chrome_slices: a name or flags id "
                            "outside its table");
            goto done;
        }
        /* a bound: each number at most 1 + 19 + 1 + 10 bytes */
        Py_ssize_t row = fixed + nt.sl[name[i]] + ft.sl[fl[i]] + 4 * 32;
        size += row;
        if (row > most)
            most = row;
    }
    char *p, *end = NULL;
    if (write) {
        /* one chunk's room and a row's, reused: the text goes out from
           the cache it was made in */
        out.cap = STREAM_CHUNK + most;
        p = out.p = PyMem_Malloc(out.cap);
        if (!p) {
            PyErr_NoMemory();
            goto done;
        }
        end = p + STREAM_CHUNK;
    } else {
        res = PyBytes_FromStringAndSize(NULL, size);
        if (!res)
            goto done;
        p = PyBytes_AS_STRING(res);
    }
#define PART(k) (p = put(p, pt.sp[k], pt.sl[k]))
    for (Py_ssize_t i = 0; i < n; i++) {
        PART(0);
        p = put(p, nt.sp[name[i]], nt.sl[name[i]]);
        PART(1);
        p = put_frac10(p, ts[i]);
        PART(2);
        p = put_frac10(p, dur[i]);
        PART(3);
        p = put_i64(p, pid[i]);
        PART(4);
        p = put_i64(p, tid[i]);
        p = put(p, ft.sp[fl[i]], ft.sl[fl[i]]);
        PART(5);
        if (end && p >= end && i + 1 < n) {
            out.len = p - out.p;
            if (folded_flush(&out, write) < 0)
                goto done;
            p = out.p;
        }
    }
#undef PART
    if (write) {
        out.len = p - out.p;
        if (drop < 0 || drop > out.len) {
            PyErr_SetString(PyExc_ValueError, "chrome_slices: drop more than the last chunk");
            goto done;
        }
        out.len -= drop;
        if (folded_flush(&out, write) < 0)
            goto done;
        res = Py_NewRef(Py_None);
    } else if (_PyBytes_Resize(&res, p - PyBytes_AS_STRING(res)) < 0)
        res = NULL;
done:
    PyMem_Free(out.p);
    for (int k = 0; k < 6; k++)
        if (has[k])
            PyBuffer_Release(&b[k]);
    PyMem_Free(nt.sp); PyMem_Free(nt.sl);
    PyMem_Free(ft.sp); PyMem_Free(ft.sl);
    PyMem_Free(pt.sp); PyMem_Free(pt.sl);
    return res;
}

static PyMethodDef methods[] = {
    {"rows", (PyCFunction)(void (*)(void))py_rows, METH_FASTCALL,
     "rows(n, ops) -> bytes"},
    {"lengths", (PyCFunction)(void (*)(void))py_lengths, METH_FASTCALL,
     "lengths(n, ops) -> bytearray of int64"},
    {"slice_packets", (PyCFunction)(void (*)(void))py_slice_packets, METH_FASTCALL,
     "slice_packets(ts, end, track, iid, insns, flag, tracks, flags, parts[, write, at, specials]) -> (bytes, lens) or None"},
    {"chrome_slices", (PyCFunction)(void (*)(void))py_chrome_slices, METH_FASTCALL,
     "chrome_slices(name, ts, dur, pid, tid, flag, names, flags, parts[, write, drop]) -> bytes or None"},
    {"folded", (PyCFunction)(void (*)(void))py_folded, METH_FASTCALL,
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

/* Compiled core of hwtrace.branches.format: branch records as JSON lines.
 *
 * The Python twin is _jsonl_fast in hwtrace/branches/format.py (Python's
 * %-formatting over the columns); this writes exactly the same bytes,
 * about 30x faster (the branches view formats millions of lines).  The
 * boundary is narrow:
 *
 *   idx = SymIndex()         addresses -> symbol text, kept across chunks
 *   idx.missing(frm, to)     -> bytes: the distinct non-zero u64 addresses
 *                            of the two columns not in idx yet (in order
 *                            of first appearance; pending until add)
 *   idx.add(addrs, texts)    each address's text: bytes, or None (none)
 *   idx.jsonl(pid, tid, kind, frm, to, time, depth, kinds) -> bytes
 *   calls_counts(...)        the calls view's lines with instruction counts
 *                            (twin: CallsWriter._format_counts; see below)
 *   transfers(...)           a run of a batch's records as branch records
 *                            (twin: decoded._Consumer._vector)
 *   trips(...)               runs and the system-call round trips between
 *                            them (twin: decoded._Consumer.feed_batch's
 *                            loop); both in core/trips.c
 *
 * Columns of one chunk of records, each a C-contiguous buffer: pid, tid,
 * time int64; kind uint8; frm, to uint64; depth int32; every non-zero
 * address of frm/to must be in idx (KeyError otherwise).  An address of 0
 * (an end in untraced code) is null and has no symbol.  kinds is a
 * sequence of bytes: the JSON string of each kind.  Unknown pid/tid/time
 * are negative, an unknown depth INT32_MIN.
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_ext/textput.h"
#include "core/trips.h"

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 6


#define PUT_LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) += sizeof(s) - 1)

/* -- SymIndex: address -> symbol text, kept across chunks ------------------ */

typedef struct {
    PyObject_HEAD
    uint64_t *keys;         /* 0: empty slot */
    int64_t *vals;          /* entry index, -1 while pending */
    size_t cap, used;       /* cap a power of 2 */
    int64_t *off;           /* per entry: text at blob[off[e]], len[e] bytes */
    int64_t *len;
    uint8_t *has;
    char (*dec)[24];        /* per entry: the address in decimal, its length last */
    size_t nent, entcap;
    char *blob;
    size_t blen, bcap;
} SymIndex;

static inline size_t h64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}

static int64_t *si_find(SymIndex *s, uint64_t k, int *fresh)
{
    size_t m = s->cap - 1, i = h64(k) & m;
    while (s->keys[i]) {
        if (s->keys[i] == k) {
            *fresh = 0;
            return &s->vals[i];
        }
        i = (i + 1) & m;
    }
    *fresh = 1;
    s->keys[i] = k;
    s->vals[i] = -1;
    s->used++;
    return &s->vals[i];
}

static int si_grow(SymIndex *s)
{
    size_t ncap = s->cap ? s->cap * 2 : 1 << 12;
    uint64_t *ok = s->keys;
    int64_t *ov = s->vals;
    size_t ocap = s->cap;
    s->keys = PyMem_Calloc(ncap, sizeof(uint64_t));
    s->vals = PyMem_Malloc(ncap * sizeof(int64_t));
    if (!s->keys || !s->vals) {
        PyMem_Free(s->keys);
        PyMem_Free(s->vals);
        s->keys = ok;
        s->vals = ov;
        PyErr_NoMemory();
        return -1;
    }
    s->cap = ncap;
    s->used = 0;
    for (size_t i = 0; i < ocap; i++) {
        if (ok[i]) {
            int fresh;
            *si_find(s, ok[i], &fresh) = ov[i];
        }
    }
    PyMem_Free(ok);
    PyMem_Free(ov);
    return 0;
}

static int si_reserve(SymIndex *s, size_t more)
{
    while ((s->used + more) * 2 > s->cap)
        if (si_grow(s) < 0)
            return -1;
    return 0;
}

static void si_dealloc(SymIndex *s)
{
    PyMem_Free(s->keys);
    PyMem_Free(s->vals);
    PyMem_Free(s->off);
    PyMem_Free(s->len);
    PyMem_Free(s->has);
    PyMem_Free(s->dec);
    PyMem_Free(s->blob);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* item i of a column at ``base`` whose items are ``st`` bytes apart */
#define LD(T, base, st, i) ld_##T((base) + (i) * (st))
#define LD_FN(T) static inline T ld_##T(const char *p) { T v; memcpy(&v, p, sizeof v); return v; }
LD_FN(uint64_t)
LD_FN(int64_t)
LD_FN(int32_t)
LD_FN(uint8_t)

/* a buffer per column, each of n items of isz[c] bytes; where ``st`` (not
   NULL) takes each column's stride, a column may be a field of an array
   of records (one dimension, any step), else it is C-contiguous */
static int get_strided(PyObject *const *args, int ncol, const Py_ssize_t *isz,
                       Py_buffer *b, Py_ssize_t *n, Py_ssize_t *st)
{
    int got = 0;
    for (; got < ncol; got++)
        if (PyObject_GetBuffer(args[got], &b[got],
                               st ? PyBUF_STRIDES | PyBUF_FORMAT : PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
    *n = b[0].len / isz[0];
    for (int c = 0; c < ncol; c++) {
        if (b[c].len != *n * isz[c]
                || (st && (b[c].ndim != 1 || b[c].itemsize != isz[c]))) {
            PyErr_SetString(PyExc_ValueError, "columns of unequal length or wrong type");
            goto fail;
        }
        if (st)
            st[c] = b[c].strides ? b[c].strides[0] : isz[c];
    }
    return 0;
fail:
    for (int c = 0; c < got; c++)
        PyBuffer_Release(&b[c]);
    return -1;
}

static int get_cols(PyObject *const *args, int ncol, const Py_ssize_t *isz,
                    Py_buffer *b, Py_ssize_t *n)
{
    return get_strided(args, ncol, isz, b, n, NULL);
}

/* missing(frm, to) -> bytes: the distinct non-zero addresses (u64, in order
 * of first appearance) not in the index yet; they are pending until add(). */
static PyObject *si_missing(SymIndex *s, PyObject *const *args, Py_ssize_t nargs)
{
    static const Py_ssize_t isz[2] = {8, 8};
    Py_buffer b[2];
    Py_ssize_t n, st[2];
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "missing(frm, to)");
        return NULL;
    }
    if (get_strided(args, 2, isz, b, &n, st) < 0)
        return NULL;
    PyObject *res = NULL;
    uint64_t *out = NULL;
    size_t nout = 0;
    if (si_reserve(s, 2 * (size_t)n) < 0)
        goto done;
    out = PyMem_Malloc((2 * (size_t)n + 1) * sizeof(uint64_t));
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    for (int c = 0; c < 2; c++) {
        const char *a = b[c].buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t v = LD(uint64_t, a, st[c], i);
            if (v) {
                int fresh;
                si_find(s, v, &fresh);
                if (fresh)
                    out[nout++] = v;
            }
        }
    }
    res = PyBytes_FromStringAndSize((const char *)out, nout * sizeof(uint64_t));
done:
    PyMem_Free(out);
    PyBuffer_Release(&b[0]);
    PyBuffer_Release(&b[1]);
    return res;
}

/* add(addrs, texts): each address's symbol text (bytes, or None: none). */
static PyObject *si_add(SymIndex *s, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(addrs, texts)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &b, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[1], "texts must be a sequence");
    PyObject *res = NULL;
    if (!seq)
        goto done;
    Py_ssize_t n = b.len / 8;
    if (b.len % 8 || PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_SetString(PyExc_ValueError, "add: one text per address");
        goto done;
    }
    if (si_reserve(s, (size_t)n) < 0)
        goto done;
    if (s->nent + n > s->entcap) {
        size_t nc = s->entcap ? s->entcap : 1024;
        while (nc < s->nent + n)
            nc *= 2;
        int64_t *o = PyMem_Realloc(s->off, nc * sizeof(int64_t));
        if (o)
            s->off = o;
        int64_t *l = PyMem_Realloc(s->len, nc * sizeof(int64_t));
        if (l)
            s->len = l;
        uint8_t *h = PyMem_Realloc(s->has, nc);
        if (h)
            s->has = h;
        char (*d)[24] = PyMem_Realloc(s->dec, nc * sizeof *d);
        if (d)
            s->dec = d;
        if (!o || !l || !h || !d) {
            PyErr_NoMemory();
            goto done;
        }
        s->entcap = nc;
    }
    const uint64_t *a = b.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        char *txt = NULL;
        Py_ssize_t tl = 0;
        if (t != Py_None && PyBytes_AsStringAndSize(t, &txt, &tl) < 0)
            goto done;
        if (!a[i]) {
            PyErr_SetString(PyExc_ValueError, "add: address 0");
            goto done;
        }
        if (s->blen + tl > s->bcap) {
            size_t nc = s->bcap ? s->bcap : 1 << 16;
            while (nc < s->blen + tl)
                nc *= 2;
            char *nb = PyMem_Realloc(s->blob, nc);
            if (!nb) {
                PyErr_NoMemory();
                goto done;
            }
            s->blob = nb;
            s->bcap = nc;
        }
        if (tl)
            memcpy(s->blob + s->blen, txt, tl);
        size_t e = s->nent++;
        s->off[e] = (int64_t)s->blen;
        s->len[e] = tl;
        s->has[e] = t != Py_None;
        s->dec[e][23] = (char)(put_u64(s->dec[e], a[i]) - s->dec[e]);
        s->blen += tl;
        int fresh;
        *si_find(s, a[i], &fresh) = (int64_t)e;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&b);
    return res;
}

static inline int64_t si_get(SymIndex *s, uint64_t k)
{
    size_t m = s->cap - 1, i = h64(k) & m;
    if (!s->cap)
        return -1;
    while (s->keys[i]) {
        if (s->keys[i] == k)
            return s->vals[i];
        i = (i + 1) & m;
    }
    return -1;
}


/* jsonl(pid, tid, kind, frm, to, time, depth, kinds) -> bytes */
/* the digits of v in decimal (put_u64's) */
static inline Py_ssize_t n_dig(uint64_t v)
{
    Py_ssize_t d = 1;
    while (v >= 100) {
        v /= 100;
        d += 2;
    }
    return d + (v >= 10);
}

static PyObject *si_jsonl(SymIndex *s, PyObject *const *args, Py_ssize_t nargs)
{
    static const Py_ssize_t isz[7] = {8, 8, 1, 8, 8, 8, 4};
    Py_buffer b[7];
    Py_ssize_t n, st[7];
    PyObject *kinds = NULL, *res = NULL;
    const char *kstr[256];
    Py_ssize_t klen[256];
    Py_ssize_t nk = 0;
    int64_t *fe = NULL, *te = NULL;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "jsonl() takes 8 arguments");
        return NULL;
    }
    if (get_strided(args, 7, isz, b, &n, st) < 0)
        return NULL;
    kinds = PySequence_Fast(args[7], "kinds must be a sequence");
    if (!kinds)
        goto done;
    nk = PySequence_Fast_GET_SIZE(kinds);
    if (nk > 256)
        nk = 256;
    for (Py_ssize_t k = 0; k < nk; k++) {
        char *str;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(kinds, k), &str,
                                    &klen[k]) < 0)
            goto done;
        kstr[k] = str;
    }
    /* the columns (each may be a field of an array of records) */
    const char *cpid = b[0].buf, *ctid = b[1].buf, *ckind = b[2].buf, *cfrm = b[3].buf,
               *cto = b[4].buf, *ctm = b[5].buf, *cdp = b[6].buf;
#define pid_(i) LD(int64_t, cpid, st[0], i)
#define tid_(i) LD(int64_t, ctid, st[1], i)
#define kind_(i) LD(uint8_t, ckind, st[2], i)
#define frm_(i) LD(uint64_t, cfrm, st[3], i)
#define to_(i) LD(uint64_t, cto, st[4], i)
#define tm_(i) LD(int64_t, ctm, st[5], i)
#define dp_(i) LD(int32_t, cdp, st[6], i)
    fe = PyMem_Malloc((n + 1) * sizeof(int64_t));
    te = PyMem_Malloc((n + 1) * sizeof(int64_t));
    if (!fe || !te) {
        PyErr_NoMemory();
        goto done;
    }
    /* the exact size: a bound (~2.5x the text) would be an allocation
       large enough to be mapped afresh for each chunk and trimmed after,
       its pages faulted in every time (a third of the view's CPU time on
       a recording of 17 M records, 2.7 GB of text) */
    Py_ssize_t bound = 0, hl = 0, tl = 0;
    int64_t bpid = 0, btid = 0, btm = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!hl || pid_(i) != bpid || tid_(i) != btid) {
            hl = (Py_ssize_t)sizeof("{\"pid\":,\"tid\":,\"kind\":") - 1
                + (pid_(i) >= 0 ? n_dig(pid_(i)) : 4) + (tid_(i) >= 0 ? n_dig(tid_(i)) : 4);
            bpid = pid_(i);
            btid = tid_(i);
        }
        Py_ssize_t l = hl + (Py_ssize_t)sizeof(",\"from\":,\"to\":}\n") - 1;
        if (tm_(i) >= 0) {
            if (tm_(i) != btm) {
                tl = (Py_ssize_t)sizeof(",\"time\":") - 1 + n_dig((uint64_t)tm_(i));
                btm = tm_(i);
            }
            l += tl;
        }
        if (dp_(i) != INT32_MIN)
            l += (Py_ssize_t)sizeof(",\"depth\":") - 1 + (dp_(i) < 0)
                + n_dig(dp_(i) < 0 ? (uint64_t)0 - (uint64_t)(int64_t)dp_(i) : (uint64_t)dp_(i));
        if (kind_(i) >= nk) {
            PyErr_SetString(PyExc_IndexError, "jsonl: kind out of range");
            goto done;
        }
        l += klen[kind_(i)];
        fe[i] = te[i] = -1;
        if (frm_(i)) {
            fe[i] = si_get(s, frm_(i));
            if (fe[i] < 0) {
                PyErr_SetString(PyExc_KeyError, "jsonl: an address not in the index");
                goto done;
            }
            l += s->dec[fe[i]][23];
            if (s->has[fe[i]])
                l += (Py_ssize_t)sizeof(",\"from_sym\":\"\"") - 1 + s->len[fe[i]];
        } else
            l += 4;
        if (to_(i)) {
            te[i] = si_get(s, to_(i));
            if (te[i] < 0) {
                PyErr_SetString(PyExc_KeyError, "jsonl: an address not in the index");
                goto done;
            }
            l += s->dec[te[i]][23];
            if (s->has[te[i]])
                l += (Py_ssize_t)sizeof(",\"to_sym\":\"\"") - 1 + s->len[te[i]];
        } else
            l += 4;
        bound += l;
    }
    res = PyBytes_FromStringAndSize(NULL, bound);
    if (!res)
        goto done;
    char *p = PyBytes_AS_STRING(res);
    /* what repeats from row to row is made once: the head up to the kind
       while pid and tid stay, the time's digits while it stays, and each
       address's digits (the index holds them) */
    char head[80], tdig[48];   /* (tdig: 20 digits at most; gcc can not bound tlen) */
    Py_ssize_t hlen = 0, tlen = 0;
    int64_t hpid = 0, htid = 0, ltm = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!hlen || pid_(i) != hpid || tid_(i) != htid) {
            char *h = head;
            PUT_LIT(h, "{\"pid\":");
            if (pid_(i) >= 0)
                h = put_u64(h, (uint64_t)pid_(i));
            else
                PUT_LIT(h, "null");
            PUT_LIT(h, ",\"tid\":");
            if (tid_(i) >= 0)
                h = put_u64(h, (uint64_t)tid_(i));
            else
                PUT_LIT(h, "null");
            PUT_LIT(h, ",\"kind\":");
            hlen = h - head;
            hpid = pid_(i);
            htid = tid_(i);
        }
        p = put(p, head, hlen);
        p = put(p, kstr[kind_(i)], klen[kind_(i)]);
        PUT_LIT(p, ",\"from\":");
        if (frm_(i))
            p = put(p, s->dec[fe[i]], s->dec[fe[i]][23]);
        else
            PUT_LIT(p, "null");
        PUT_LIT(p, ",\"to\":");
        if (to_(i))
            p = put(p, s->dec[te[i]], s->dec[te[i]][23]);
        else
            PUT_LIT(p, "null");
        if (tm_(i) >= 0) {
            PUT_LIT(p, ",\"time\":");
            if (tm_(i) != ltm) {
                tlen = put_u64(tdig, (uint64_t)tm_(i)) - tdig;
                ltm = tm_(i);
            }
            p = put(p, tdig, tlen);
        }
        if (dp_(i) != INT32_MIN) {
            PUT_LIT(p, ",\"depth\":");
            p = put_i64(p, dp_(i));
        }
        if (fe[i] >= 0 && s->has[fe[i]]) {
            PUT_LIT(p, ",\"from_sym\":\"");
            p = put(p, s->blob + s->off[fe[i]], s->len[fe[i]]);
            *p++ = '"';
        }
        if (te[i] >= 0 && s->has[te[i]]) {
            PUT_LIT(p, ",\"to_sym\":\"");
            p = put(p, s->blob + s->off[te[i]], s->len[te[i]]);
            *p++ = '"';
        }
        PUT_LIT(p, "}\n");
    }
#undef pid_
#undef tid_
#undef kind_
#undef frm_
#undef to_
#undef tm_
#undef dp_
    if (p - PyBytes_AS_STRING(res) != bound) {
        /* (a size rule above disagrees with the writing below) */
        PyErr_SetString(PyExc_SystemError, "jsonl: the text's size was wrong");
        Py_CLEAR(res);
    }
done:
    PyMem_Free(fe);
    PyMem_Free(te);
    for (int c = 0; c < 7; c++)
        PyBuffer_Release(&b[c]);
    Py_XDECREF(kinds);
    return res;
}

static PyObject *si_len(SymIndex *s, PyObject *unused)
{
    return PyLong_FromSize_t(s->nent);
}

static PyMethodDef si_methods[] = {
    {"missing", (PyCFunction)(void (*)(void))si_missing, METH_FASTCALL,
     "missing(frm, to) -> bytes (u64 addresses not in the index yet)"},
    {"add", (PyCFunction)(void (*)(void))si_add, METH_FASTCALL,
     "add(addrs, texts): texts are bytes or None"},
    {"jsonl", (PyCFunction)(void (*)(void))si_jsonl, METH_FASTCALL,
     "jsonl(pid, tid, kind, frm, to, time, depth, kinds) -> bytes"},
    {"entries", (PyCFunction)si_len, METH_NOARGS, "entries() -> int"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject SymIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hwtrace.branches._c_format.SymIndex",
    .tp_basicsize = sizeof(SymIndex),
    .tp_dealloc = (destructor)si_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Addresses' symbol texts, and JSON lines of branch records.",
    .tp_methods = si_methods,
    .tp_new = PyType_GenericNew,
};

/* -- calls: lines with instruction counts ---------------------------------- */

static int table_of(PyObject *blob_o, PyObject *offs_o, Py_buffer *blob,
                    Py_buffer *offs, Py_ssize_t *n)
{
    if (PyObject_GetBuffer(blob_o, blob, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (PyObject_GetBuffer(offs_o, offs, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(blob);
        return -1;
    }
    *n = offs->len / 8 - 1;
    const int64_t *o = offs->buf;
    if (offs->len % 8 || *n < 0)
        goto bad;
    for (Py_ssize_t i = 0; i < *n; i++)
        if (o[i] < 0 || o[i] > o[i + 1] || o[i + 1] > blob->len)
            goto bad;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "bad string table");
    PyBuffer_Release(blob);
    PyBuffer_Release(offs);
    return -1;
}

/* "%10s" of f"{v:,}" */
static char *put_count(char *p, int64_t v)
{
    char tmp[40];
    char *e = tmp + sizeof(tmp), *q = e;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int k = 0;
    do {
        if (k && k % 3 == 0)
            *--q = ',';
        *--q = (char)('0' + u % 10);
        u /= 10;
        k++;
    } while (u);
    if (v < 0)
        *--q = '-';
    for (Py_ssize_t pad = 10 - (e - q); pad > 0; pad--)
        *p++ = ' ';
    memcpy(p, q, e - q);
    return p + (e - q);
}

/* calls_counts(head, hblob, hoffs, insns, ok, note, nblob, noffs, tid,
 *              threads, last_tid, opened) -> (bytes, last_tid)
 * Row i: heads[head[i]] then f"{insns:>10,} insns" (ok[i]) or opened, then
 * "  [note]" where notes[note[i]] -- with ", tid T" or "tid T" where
 * threads and the row's tid (>= 0) differs from the row before's -- is not
 * empty; "\n".  head, note, insns, tid int64; ok uint8. */
static PyObject *py_calls_counts(PyObject *self, PyObject *const *args,
                                 Py_ssize_t nargs)
{
    Py_buffer hb, ho, nb, no, col[5];
    int gotc = 0, goth = 0, gotn = 0;
    Py_ssize_t nh = 0, nn = 0, n = 0;
    PyObject *res = NULL, *out = NULL;
    int64_t *last_out = NULL;
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "calls_counts() takes 12 arguments");
        return NULL;
    }
    int threads = PyObject_IsTrue(args[9]);
    if (threads < 0)
        return NULL;
    int64_t last = PyLong_AsLongLong(args[10]);
    if (last == -1 && PyErr_Occurred())
        return NULL;
    char *op;
    Py_ssize_t opl;
    if (PyBytes_AsStringAndSize(args[11], &op, &opl) < 0)
        return NULL;
    PyObject *cargs[5] = {args[0], args[3], args[4], args[5], args[8]};
    static const Py_ssize_t csz[5] = {8, 8, 1, 8, 8};
    if (get_cols(cargs, 5, csz, col, &n) < 0)
        return NULL;
    gotc = 1;
    if (table_of(args[1], args[2], &hb, &ho, &nh) < 0)
        goto done;
    goth = 1;
    if (table_of(args[6], args[7], &nb, &no, &nn) < 0)
        goto done;
    gotn = 1;
    const int64_t *head = col[0].buf, *insns = col[1].buf, *note = col[3].buf,
                  *tid = col[4].buf;
    const uint8_t *ok = col[2].buf;
    const int64_t *hoff = ho.buf, *noff = no.buf;
    const char *hs = hb.buf, *ns = nb.buf;
    Py_ssize_t bound = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (head[i] < 0 || head[i] >= nh || note[i] < 0 || note[i] >= nn) {
            PyErr_SetString(PyExc_IndexError, "calls_counts: index out of range");
            goto done;
        }
        bound += (hoff[head[i] + 1] - hoff[head[i]]) + (noff[note[i] + 1] - noff[note[i]])
                 + opl + 120;
    }
    out = PyBytes_FromStringAndSize(NULL, bound);
    if (!out)
        goto done;
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t l = hoff[head[i] + 1] - hoff[head[i]];
        p = put(p, hs + hoff[head[i]], l);
        if (ok[i]) {
            p = put_count(p, insns[i]);
            PUT_LIT(p, " insns");
        } else {
            p = put(p, op, opl);
        }
        Py_ssize_t nl = noff[note[i] + 1] - noff[note[i]];
        int show_tid = threads && tid[i] >= 0 && tid[i] != last;
        last = tid[i];
        if (nl || show_tid) {
            PUT_LIT(p, "  [");
            p = put(p, ns + noff[note[i]], nl);
            if (show_tid) {
                if (nl)
                    PUT_LIT(p, ", ");
                PUT_LIT(p, "tid ");
                p = put_i64(p, tid[i]);
            }
            *p++ = ']';
        }
        *p++ = '\n';
    }
    if (_PyBytes_Resize(&out, p - PyBytes_AS_STRING(out)) < 0) {
        out = NULL;
        goto done;
    }
    res = Py_BuildValue("(OL)", out, (long long)last);
done:
    Py_XDECREF(out);
    (void)last_out;
    if (gotc)
        for (int c = 0; c < 5; c++)
            PyBuffer_Release(&col[c]);
    if (goth) {
        PyBuffer_Release(&hb);
        PyBuffer_Release(&ho);
    }
    if (gotn) {
        PyBuffer_Release(&nb);
        PyBuffer_Release(&no);
    }
    return res;
}

static PyMethodDef methods[] = {
    {"transfers", (PyCFunction)(void (*)(void))bt_transfers, METH_FASTCALL,
     "transfers(...) -> (records, kept, depth, closed, branches)"},
    {"trips", (PyCFunction)(void (*)(void))bt_trips, METH_FASTCALL,
     "trips(...) -> None or (k, kr, r, depth, time, clock, records, exit_at, pend_pc, pend_time)"},
    {"calls_counts", (PyCFunction)(void (*)(void))py_calls_counts, METH_FASTCALL,
     "calls_counts(head, hblob, hoffs, insns, ok, note, nblob, noffs, tid, "
     "threads, last_tid, opened) -> (bytes, last_tid)"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_c_format",
    "Compiled branch-record formatter (twin: hwtrace.branches.format).", -1,
    methods
};

PyMODINIT_FUNC PyInit__c_format(void)
{
    if (PyType_Ready(&SymIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&SymIndexType);
    if (PyModule_AddObject(m, "SymIndex", (PyObject *)&SymIndexType) < 0
            || PyModule_AddIntConstant(m, "ABI", ABI) < 0
            || PyModule_AddStringConstant(m, "SOURCE_SHA256",
                                          HWTRACE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

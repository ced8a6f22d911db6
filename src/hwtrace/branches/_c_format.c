/* Compiled core of hwtrace.branches.format: branch records as JSON lines.
 *
 * The Python twin is _jsonl_fast in hwtrace/branches/format.py (Python's
 * %-formatting over the columns); this writes exactly the same bytes,
 * about 30x faster (the branches view formats millions of lines).  The
 * boundary is narrow and stateless:
 *
 *   jsonl(pid, tid, kind, frm, to, time, depth, fi, ti, blob, offs, has,
 *         kinds) -> bytes
 *
 * Columns of one chunk of records, each a C-contiguous buffer: pid, tid,
 * time int64; kind uint8; frm, to uint64; depth int32.  The symbol text of
 * each address is looked up in a table of the chunk's distinct addresses:
 * fi/ti (int64) index it, row i's text is blob[offs[i]:offs[i+1]] (offs
 * int64, one longer than the table) where has[i] (uint8) is non-zero,
 * none otherwise; an address of 0 (an end in untraced code) is null and
 * has no symbol.  kinds is a sequence of bytes: the JSON string of each
 * kind.  Unknown pid/tid/time are negative, an unknown depth INT32_MIN.
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 1

#define NCOLS 13

static char *put_u64(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static char *put_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return put_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(p, (uint64_t)v);
}

#define PUT_LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) += sizeof(s) - 1)

static PyObject *py_jsonl(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Py_ssize_t isz[NCOLS - 1] = {8, 8, 1, 8, 8, 8, 4, 8, 8, 1, 8, 1};
    Py_buffer b[NCOLS - 1];
    int got = 0;
    PyObject *kinds = NULL, *res = NULL;
    const char *kstr[256];
    Py_ssize_t klen[256];
    Py_ssize_t nk = 0;

    if (nargs != NCOLS) {
        PyErr_Format(PyExc_TypeError, "jsonl() takes %d arguments", NCOLS);
        return NULL;
    }
    for (; got < NCOLS - 1; got++) {
        if (PyObject_GetBuffer(args[got], &b[got], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    }
    kinds = PySequence_Fast(args[NCOLS - 1], "kinds must be a sequence");
    if (!kinds)
        goto done;
    nk = PySequence_Fast_GET_SIZE(kinds);
    if (nk > 256)
        nk = 256;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *o = PySequence_Fast_GET_ITEM(kinds, k);
        char *s;
        if (PyBytes_AsStringAndSize(o, &s, &klen[k]) < 0)
            goto done;
        kstr[k] = s;
    }
    /* 0..6 columns (n rows), 7..8 indices (n), 9 blob, 10 offs, 11 has */
    Py_ssize_t n = b[0].len / 8;
    for (int c = 0; c < 9; c++) {
        if (b[c].len != n * isz[c]) {
            PyErr_SetString(PyExc_ValueError, "jsonl: columns of unequal length");
            goto done;
        }
    }
    Py_ssize_t nt = b[11].len;
    if (b[10].len != (nt + 1) * 8) {
        PyErr_SetString(PyExc_ValueError, "jsonl: offs must be one longer than has");
        goto done;
    }
    const int64_t *pid = b[0].buf, *tid = b[1].buf, *tm = b[5].buf;
    const uint8_t *kind = b[2].buf;
    const uint64_t *frm = b[3].buf, *to = b[4].buf;
    const int32_t *dp = b[6].buf;
    const int64_t *fi = b[7].buf, *ti = b[8].buf, *offs = b[10].buf;
    const char *blob = b[9].buf;
    const uint8_t *has = b[11].buf;
    Py_ssize_t blen = b[9].len;
    for (Py_ssize_t t = 0; t < nt; t++) {
        if (offs[t] < 0 || offs[t] > offs[t + 1] || offs[t + 1] > blen) {
            PyErr_SetString(PyExc_ValueError, "jsonl: bad offs");
            goto done;
        }
    }
    Py_ssize_t kmax = 0;
    for (Py_ssize_t k = 0; k < nk; k++)
        if (klen[k] > kmax)
            kmax = klen[k];
    /* bound: fixed text + 7 numbers of <= 20 digits + kind + symbols */
    Py_ssize_t bound = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t l = 320 + kmax;
        if (kind[i] >= nk) {
            PyErr_SetString(PyExc_IndexError, "jsonl: kind out of range");
            goto done;
        }
        if (frm[i]) {
            if (fi[i] < 0 || fi[i] >= nt) {
                PyErr_SetString(PyExc_IndexError, "jsonl: fi out of range");
                goto done;
            }
            l += offs[fi[i] + 1] - offs[fi[i]];
        }
        if (to[i]) {
            if (ti[i] < 0 || ti[i] >= nt) {
                PyErr_SetString(PyExc_IndexError, "jsonl: ti out of range");
                goto done;
            }
            l += offs[ti[i] + 1] - offs[ti[i]];
        }
        bound += l;
    }
    res = PyBytes_FromStringAndSize(NULL, bound);
    if (!res)
        goto done;
    char *p = PyBytes_AS_STRING(res);
    for (Py_ssize_t i = 0; i < n; i++) {
        PUT_LIT(p, "{\"pid\":");
        if (pid[i] >= 0)
            p = put_u64(p, (uint64_t)pid[i]);
        else
            PUT_LIT(p, "null");
        PUT_LIT(p, ",\"tid\":");
        if (tid[i] >= 0)
            p = put_u64(p, (uint64_t)tid[i]);
        else
            PUT_LIT(p, "null");
        PUT_LIT(p, ",\"kind\":");
        memcpy(p, kstr[kind[i]], klen[kind[i]]);
        p += klen[kind[i]];
        PUT_LIT(p, ",\"from\":");
        if (frm[i])
            p = put_u64(p, frm[i]);
        else
            PUT_LIT(p, "null");
        PUT_LIT(p, ",\"to\":");
        if (to[i])
            p = put_u64(p, to[i]);
        else
            PUT_LIT(p, "null");
        if (tm[i] >= 0) {
            PUT_LIT(p, ",\"time\":");
            p = put_u64(p, (uint64_t)tm[i]);
        }
        if (dp[i] != INT32_MIN) {
            PUT_LIT(p, ",\"depth\":");
            p = put_i64(p, dp[i]);
        }
        if (frm[i] && has[fi[i]]) {
            Py_ssize_t a = offs[fi[i]], l = offs[fi[i] + 1] - a;
            PUT_LIT(p, ",\"from_sym\":\"");
            memcpy(p, blob + a, l);
            p += l;
            *p++ = '"';
        }
        if (to[i] && has[ti[i]]) {
            Py_ssize_t a = offs[ti[i]], l = offs[ti[i] + 1] - a;
            PUT_LIT(p, ",\"to_sym\":\"");
            memcpy(p, blob + a, l);
            p += l;
            *p++ = '"';
        }
        PUT_LIT(p, "}\n");
    }
    if (_PyBytes_Resize(&res, p - PyBytes_AS_STRING(res)) < 0)
        res = NULL;
done:
    for (int c = 0; c < got; c++)
        PyBuffer_Release(&b[c]);
    Py_XDECREF(kinds);
    return res;
}

static PyMethodDef methods[] = {
    {"jsonl", (PyCFunction)(void (*)(void))py_jsonl, METH_FASTCALL,
     "jsonl(pid, tid, kind, frm, to, time, depth, fi, ti, blob, offs, has, "
     "kinds) -> bytes"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_c_format",
    "Compiled branch-record formatter (twin: hwtrace.branches.format).", -1,
    methods
};

PyMODINIT_FUNC PyInit__c_format(void)
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

/* The timeline exporters' events, compiled (the export core's methods;
 * see _c_textcols.c for the interface): Perfetto slice begin/end packets
 * (slice_packets, twin perfetto.PerfettoTraceWriter._encode) and Chrome
 * "X" events (chrome_slices, twin chrome.ChromeTraceWriter._lines). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "textcols.h"

/* -- slice_packets(...): Perfetto slice begin/end packets -------------------------- */

/* bytes of a's varint: 7 bits a byte (no loop: three per packet) */
static inline int vlen(uint64_t a)
{
    return (70 - __builtin_clzll(a | 1)) / 7;
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

/* at least any packet's length (varints at their longest, the longest
   entries of the tables): room to leave for one more packet, found
   without a pass over the rows */
static Py_ssize_t pkt_most(const Pkts *k)
{
    const Py_ssize_t *L = k->pt.sl;
    Py_ssize_t tt = 0, ft = 0;
    for (Py_ssize_t j = 0; j < k->tt.n; j++)
        if (k->tt.sl[j] > tt)
            tt = k->tt.sl[j];
    for (Py_ssize_t j = 0; j < k->ft.n; j++)
        if (k->ft.sl[j] > ft)
            ft = k->ft.sl[j];
    Py_ssize_t e = L[TE] + L[ANNOT] + 10 + L[INSNS] + 10, b = L[TB] + L[IID] + 10;
    Py_ssize_t te = tt + ft + (e > b ? e : b);
    Py_ssize_t body = L[TS] + 10 + L[SEQ] + L[TEV] + 10 + te + L[NEEDS];
    return L[PKT] + 10 + body;
}

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
    Py_ssize_t most = pkt_most(k);
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
        if (k->end[i] > 1)                      /* no packet: a special's row */
            continue;
        if (out.cap - (p - out.p) < most) {     /* grown by a special */
            out.len = p - out.p;
            if (tc_lend(&out, write) < 0)
                goto done;
            p = out.p;
        }
        p = pkt_put(k, i, p);
        if (p - out.p >= STREAM_CHUNK) {
            out.len = p - out.p;
            if (tc_lend(&out, write) < 0)
                goto done;
            p = out.p;
        }
    }
    out.len = p - out.p;
    rc = tc_lend(&out, write);
done:
    PyBuffer_Release(&ba);
    PyMem_Free(out.p);
    return rc;
}

PyObject *tc_slice_packets(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
        if (tc_get_buf(args[j], &b[j], &has[j], n, isz[j], what[j]) < 0)
            goto done;
    if (tc_tab_get(args[6], &k.tt) < 0 || tc_tab_get(args[7], &k.ft) < 0
        || tc_tab_get(args[8], &k.pt) < 0)
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
    for (Py_ssize_t i = 0; i < n; i++) {
        if (k.tr[i] < 0 || k.tr[i] >= k.tt.n || k.fl[i] < 0 || k.fl[i] >= k.ft.n) {
            PyErr_SetString(PyExc_IndexError, "slice_packets: a track or flags id "
                            "outside its table");
            goto done;
        }
        if (k.end[i] > (nargs == 12 ? 2 : 1)) {
            PyErr_SetString(PyExc_ValueError, "slice_packets: end is 0 or 1 (or 2 "
                            "where written: no packet)");
            goto done;
        }
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

PyObject *tc_chrome_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
        if (tc_get_buf(args[k], &b[k], &has[k], n, 8, what[k]) < 0)
            goto done;
    if (tc_tab_get(args[6], &nt) < 0 || tc_tab_get(args[7], &ft) < 0 || tc_tab_get(args[8], &pt) < 0)
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
            if (tc_lend(&out, write) < 0)
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
        if (tc_lend(&out, write) < 0)
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

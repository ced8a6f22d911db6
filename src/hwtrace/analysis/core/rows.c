/* The rows after the call-stack matching, compiled: the per-row work
 * of the builder and the views that numpy did in dozens of passes, one
 * pass each here (methods of hwtrace.analysis._c_runs, declared in
 * rows.h).  Each gives its Python twin's answer bit for bit (the same
 * operations in the same order; -std=c11 keeps multiply-adds unfused):
 *
 *   times(a_seq, a_idx, a_t, seq, idx, out)      clock.TimeBase._times
 *   begins(e_id, e_begin, x_id, x_begin, found, ended)   rows.Pending._begins
 *   children(id, parent, begin_idx, end_idx, begin, end, ci, ct,
 *            c_key, c_insns, c_time, c_used) -> (parent, insns, time)
 *                                                rows.Pending._children_twin
 *   outermost(key, xend, xrow, x_xseq, out)      profile.Profile._outermost_twin
 *   records(blocks, itemsize, offsets..., code_of, base, ip, end, code,
 *           fall, tsc, start)                    blockcols.columns (numpy)
 *   commit(...)                                  runs.commit (numpy)
 *   dense_rows(dense, hi, lo, out) -> misses     branches.calls._StrTable._index
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "rows.h"

/* times(a_seq, a_idx, a_t, seq, idx, out): TimeBase.times into ``out``
 * (float64, one per row): the row's time interpolated between the last
 * anchor before it (in sequence order) and the first one after. */
PyObject *hw_rows_times(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "times(a_seq, a_idx, a_t, seq, idx, out)");
        return NULL;
    }
    Py_buffer as = {0}, ai = {0}, at = {0}, bs = {0}, bi = {0}, bo = {0};
    PyObject *res = NULL;
    if (get_buf(args[0], &as, 8, -1, "a_seq") < 0)
        return NULL;
    Py_ssize_t na = as.len / 8;
    if (get_buf(args[1], &ai, 8, na, "a_idx") < 0 || get_buf(args[2], &at, 8, na, "a_t") < 0
        || get_buf(args[3], &bs, 8, -1, "seq") < 0)
        goto done;
    Py_ssize_t n = bs.len / 8;
    if (get_buf(args[4], &bi, 8, n, "idx") < 0)
        goto done;
    if (PyObject_GetBuffer(args[5], &bo, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        bo.obj = NULL;
        goto done;
    }
    if (bo.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "times: out has the wrong size");
        goto done;
    }
    const int64_t *a_seq = as.buf, *a_idx = ai.buf, *seq = bs.buf, *idx = bi.buf;
    const double *a_t = at.buf;
    double *out = bo.buf;
    Py_ssize_t k = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        /* searchsorted(a_seq, seq[r], side="left"); rows come in sequence
           order (mostly): from the last answer on, galloping */
        Py_ssize_t lo = 0, hi = na;
        if (r && seq[r] >= seq[r - 1]) {
            Py_ssize_t step = 1;
            lo = hi = k;
            while (hi < na && a_seq[hi] < seq[r]) {
                lo = hi + 1;
                hi = lo + step < na ? lo + step : na;
                step <<= 1;
            }
        }
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (a_seq[mid] < seq[r])
                lo = mid + 1;
            else
                hi = mid;
        }
        k = lo;
        if (k >= na) {
            PyErr_SetString(PyExc_IndexError, "times: a row no anchor follows");
            goto done;
        }
        if (k == 0) {
            out[r] = a_t[0];
            continue;
        }
        int64_t i0 = a_idx[k - 1], span = a_idx[k] - i0, d = idx[r] - i0;
        double t0 = a_t[k - 1];
        double slope = span > 0 ? (a_t[k] - t0) / (double)span : 0.0;
        out[r] = d > 0 ? t0 + (double)d * slope : t0;
    }
    res = Py_NewRef(Py_None);
done:
    RELEASE_BUFS(&as, &ai, &at, &bs, &bi, &bo);
    return res;
}

/* begins(e_id, e_begin, x_id, x_begin, found, ended): the begin time of
 * every ending row whose begin row is among these (``e_id`` ascending):
 * x_begin[i] = e_begin[j] where e_id[j] == x_id[i] (found[i] = 1, ended[j]
 * = 1); other rows untouched (found[i] = 0).  ``found``/``ended`` uint8,
 * zeroed by the caller. */
PyObject *hw_rows_begins(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "begins(e_id, e_begin, x_id, x_begin, found, ended)");
        return NULL;
    }
    Py_buffer ei = {0}, eb = {0}, xi = {0}, xb = {0}, fo = {0}, en = {0};
    PyObject *res = NULL;
    if (get_buf(args[0], &ei, 8, -1, "e_id") < 0)
        return NULL;
    Py_ssize_t ne = ei.len / 8;
    if (get_buf(args[1], &eb, 8, ne, "e_begin") < 0 || get_buf(args[2], &xi, 8, -1, "x_id") < 0)
        goto done;
    Py_ssize_t nx = xi.len / 8;
    if (get_buf(args[3], &xb, 8, nx, "x_begin") < 0 || get_buf(args[4], &fo, 1, nx, "found") < 0
        || get_buf(args[5], &en, 1, ne, "ended") < 0)
        goto done;
    if (xb.readonly || fo.readonly || en.readonly) {
        PyErr_SetString(PyExc_ValueError, "begins: outputs must be writable");
        goto done;
    }
    const int64_t *e_id = ei.buf, *x_id = xi.buf;
    const double *e_begin = eb.buf;
    double *x_begin = xb.buf;
    uint8_t *found = fo.buf, *ended = en.buf;
    if (ne) {
        for (Py_ssize_t i = 0; i < nx; i++) {
            int64_t id = x_id[i];
            /* ids are handed out one after another: first where the
             * first id says, then a binary search */
            if (id >= e_id[0] && id - e_id[0] < ne && e_id[id - e_id[0]] == id) {
                Py_ssize_t j = (Py_ssize_t)(id - e_id[0]);
                x_begin[i] = e_begin[j];
                found[i] = 1;
                ended[j] = 1;
                continue;
            }
            Py_ssize_t lo = 0, hi = ne;
            while (lo < hi) {
                Py_ssize_t mid = lo + (hi - lo) / 2;
                if (e_id[mid] < id)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo < ne && e_id[lo] == id) {
                x_begin[i] = e_begin[lo];
                found[i] = 1;
                ended[lo] = 1;
            }
        }
    }
    res = Py_NewRef(Py_None);
done:
    RELEASE_BUFS(&ei, &eb, &xi, &xb, &fo, &en);
    return res;
}

/* a map of int64 ids (>= 0) to row numbers: an array indexed by id - lo
   where the ids lie within a few times their number of each other (a
   chunk's activations: numbered in order, so one access near the last),
   else open addressing */
typedef struct {
    int64_t *key;
    Py_ssize_t *val;
    size_t mask;
    int64_t lo, span;           /* dense: ids lo .. lo + span - 1 */
    Py_ssize_t *dense;
} IdMap;

static int idmap_init(IdMap *m, const int64_t *ids, Py_ssize_t n)
{
    int64_t lo = INT64_MAX, hi = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ids[i] < lo)
            lo = ids[i];
        if (ids[i] > hi)
            hi = ids[i];
    }
    if (n && lo >= 0 && (uint64_t)(hi - lo) < (uint64_t)n * 4 + 64) {
        m->lo = lo;
        m->span = hi - lo + 1;
        m->dense = PyMem_Malloc((size_t)m->span * sizeof *m->dense);
        if (!m->dense) {
            PyErr_NoMemory();
            return -1;
        }
        for (int64_t i = 0; i < m->span; i++)
            m->dense[i] = -1;
        return 0;
    }
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap <<= 1;
    m->key = PyMem_Malloc(cap * sizeof *m->key);
    m->val = PyMem_Malloc(cap * sizeof *m->val);
    if (!m->key || !m->val) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < cap; i++)
        m->key[i] = -1;
    m->mask = cap - 1;
    return 0;
}

static void idmap_free(IdMap *m)
{
    PyMem_Free(m->key);
    PyMem_Free(m->val);
    PyMem_Free(m->dense);
}

static size_t idmap_slot(const IdMap *m, int64_t id)
{
    size_t h = (size_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    while (m->key[h] != -1 && m->key[h] != id)
        h = (h + 1) & m->mask;
    return h;
}

/* id (>= 0, one of those the map was made for) -> row i (a later one
   of the same id replaces it) */
static void idmap_put(IdMap *m, int64_t id, Py_ssize_t i)
{
    if (m->dense) {
        m->dense[id - m->lo] = i;
        return;
    }
    size_t h = idmap_slot(m, id);
    m->key[h] = id;
    m->val[h] = i;
}

/* row of id, or -1 */
static inline Py_ssize_t idmap_get(const IdMap *m, int64_t id)
{
    if (id < 0)
        return -1;
    if (m->dense)
        return (uint64_t)(id - m->lo) < (uint64_t)m->span ? m->dense[id - m->lo] : -1;
    size_t h = idmap_slot(m, id);
    return m->key[h] == id ? m->val[h] : -1;
}

typedef struct {
    int64_t parent;
    Py_ssize_t row;
} AwayRow;

static int away_cmp(const void *a, const void *b)
{
    const AwayRow *x = a, *y = b;
    if (x->parent != y->parent)
        return (x->parent > y->parent) - (x->parent < y->parent);
    return (x->row > y->row) - (x->row < y->row);
}

/* children(id, parent, begin_idx, end_idx, begin, end, ci, ct, c_key, c_insns,
 *          c_time, c_used)
 *   -> (away_parent, away_insns, away_time) bytes (int64, int64, float64)
 *
 * Pending._children: ci/ct (int64/float64 out) of every ending row = the
 * instructions (end_idx - begin_idx) and time (end - begin) of its
 * callees ending among these rows (summed in row order), plus what
 * earlier chunks carried for it (c_key/c_insns/c_time, c_used[j] = 1
 * where row c_key[j] is here); the sums for parents not among these
 * rows come back by parent id, ascending (each summed in row order). */
PyObject *hw_rows_children(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "children(id, parent, begin_idx, end_idx, "
                        "begin, end, ci, ct, c_key, c_insns, c_time, c_used)");
        return NULL;
    }
    Py_buffer b[12];
    memset(b, 0, sizeof b);
    static const char *what[12] = {"id", "parent", "begin_idx", "end_idx", "begin", "end",
                                   "ci", "ct", "c_key", "c_insns", "c_time", "c_used"};
    PyObject *res = NULL, *ap = NULL, *ai = NULL, *at = NULL;
    IdMap map = {0};
    AwayRow *away = NULL;
    Py_ssize_t n = -1, nc = -1;
    for (int i = 0; i < 12; i++) {
        Py_ssize_t want = i < 8 ? n : nc;
        if (get_buf(args[i], &b[i], i == 11 ? 1 : 8, want, what[i]) < 0)
            goto done;
        if (i == 0)
            n = b[0].len / 8;
        if (i == 8)
            nc = b[8].len / 8;
    }
    if (b[6].readonly || b[7].readonly || b[11].readonly) {
        PyErr_SetString(PyExc_ValueError, "children: outputs must be writable");
        goto done;
    }
    const int64_t *id = b[0].buf, *par = b[1].buf, *bi = b[2].buf, *ei = b[3].buf;
    const double *bt = b[4].buf, *et = b[5].buf;
    int64_t *ci = b[6].buf;
    double *ct = b[7].buf;
    const int64_t *c_key = b[8].buf, *c_insns = b[9].buf;
    const double *c_time = b[10].buf;
    uint8_t *c_used = b[11].buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (id[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "children: a negative id");
            goto done;
        }
    if (idmap_init(&map, id, n) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        idmap_put(&map, id[i], i);
        ci[i] = 0;
        ct[i] = 0.0;
    }
    Py_ssize_t na = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (par[i] < 0)
            continue;
        Py_ssize_t p = idmap_get(&map, par[i]);
        if (p >= 0) {
            ci[p] += ei[i] - bi[i];
            ct[p] += et[i] - bt[i];
        } else {
            na++;
        }
    }
    for (Py_ssize_t j = 0; j < nc; j++) {
        Py_ssize_t p = idmap_get(&map, c_key[j]);
        if (p >= 0) {
            ci[p] += c_insns[j];
            ct[p] += c_time[j];
            c_used[j] = 1;
        }
    }
    /* the rows whose parent is not here, by (parent, row) */
    away = PyMem_Malloc((size_t)(na ? na : 1) * sizeof *away);
    if (!away) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (par[i] >= 0 && idmap_get(&map, par[i]) < 0) {
            away[k].parent = par[i];
            away[k].row = i;
            k++;
        }
    qsort(away, (size_t)na, sizeof *away, away_cmp);
    Py_ssize_t nu = 0;
    for (Py_ssize_t s = 0; s < na; s++)
        if (!s || away[s].parent != away[s - 1].parent)
            nu++;
    ap = PyBytes_FromStringAndSize(NULL, nu * 8);
    ai = PyBytes_FromStringAndSize(NULL, nu * 8);
    at = PyBytes_FromStringAndSize(NULL, nu * 8);
    if (!ap || !ai || !at)
        goto done;
    int64_t *o_par = (int64_t *)PyBytes_AS_STRING(ap), *o_ins = (int64_t *)PyBytes_AS_STRING(ai);
    double *o_t = (double *)PyBytes_AS_STRING(at);
    Py_ssize_t u = -1;
    for (Py_ssize_t s = 0; s < na; s++) {
        if (!s || away[s].parent != away[s - 1].parent) {
            u++;
            o_par[u] = away[s].parent;
            o_ins[u] = 0;
            o_t[u] = 0.0;
        }
        Py_ssize_t i = away[s].row;
        o_ins[u] += ei[i] - bi[i];
        o_t[u] += et[i] - bt[i];
    }
    res = PyTuple_Pack(3, ap, ai, at);
done:
    for (int i = 0; i < 12; i++)
        if (b[i].obj)
            PyBuffer_Release(&b[i]);
    Py_XDECREF(ap);
    Py_XDECREF(ai);
    Py_XDECREF(at);
    idmap_free(&map);
    PyMem_Free(away);
    return res;
}

/* outermost(key, xend, xrow, x_xseq, out): Profile._outermost.  The
 * open activations (``key`` their function's int64 hash, ``xend`` the
 * sequence number of their end or INT64_MAX, in begin order), ``xrow`` the
 * ending row of each (or -1); out[xrow[r]] = 0 (uint8, set to 1 by the
 * caller) where an activation of the same key begun before r ends after
 * that row's ``x_xseq`` (ends capped at 2**40 - 1, as the twin). */
PyObject *hw_rows_outermost(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "outermost(key, xend, xrow, x_xseq, out)");
        return NULL;
    }
    Py_buffer b[5];
    memset(b, 0, sizeof b);
    static const char *what[5] = {"key", "xend", "xrow", "x_xseq", "out"};
    PyObject *res = NULL;
    int64_t *mkey = NULL, *mval = NULL;
    Py_ssize_t n = -1, nx = -1;
    for (int i = 0; i < 5; i++) {
        if (get_buf(args[i], &b[i], i == 4 ? 1 : 8, i < 3 ? n : nx, what[i]) < 0)
            goto done;
        if (i == 0)
            n = b[0].len / 8;
        if (i == 3)
            nx = b[3].len / 8;
    }
    if (b[4].readonly) {
        PyErr_SetString(PyExc_ValueError, "outermost: out must be writable");
        goto done;
    }
    const int64_t *key = b[0].buf, *xend = b[1].buf, *xrow = b[2].buf, *xseq = b[3].buf;
    uint8_t *out = b[4].buf, *used = NULL;
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap <<= 1;
    mkey = PyMem_Malloc(cap * sizeof *mkey);
    mval = PyMem_Malloc(cap * sizeof *mval);
    used = PyMem_Calloc(cap, 1);
    if (!mkey || !mval || !used) {
        PyMem_Free(used);
        PyErr_NoMemory();
        goto done;
    }
    const int64_t cap40 = ((int64_t)1 << 40) - 1;
    for (Py_ssize_t r = 0; r < n; r++) {
        size_t h = (size_t)(((uint64_t)key[r] * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
        while (used[h] && mkey[h] != key[r])
            h = (h + 1) & (cap - 1);
        int64_t x = xend[r] < cap40 ? xend[r] : cap40;
        int64_t i = xrow[r];
        if (i >= 0) {
            if (i >= nx) {
                PyMem_Free(used);
                PyErr_SetString(PyExc_ValueError, "outermost: xrow out of range");
                goto done;
            }
            if (used[h] && mval[h] > xseq[i])
                out[i] = 0;
        }
        if (!used[h]) {
            used[h] = 1;
            mkey[h] = key[r];
            mval[h] = x;
        } else if (x > mval[h]) {
            mval[h] = x;
        }
    }
    PyMem_Free(used);
    res = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 5; i++)
        if (b[i].obj)
            PyBuffer_Release(&b[i]);
    PyMem_Free(mkey);
    PyMem_Free(mval);
    return res;
}

/* records(blocks, itemsize, o_ip, o_end, o_tsc, o_ninsn, o_iclass, o_size,
 *         code_of, base, ip, end, code, fall, tsc, start): blockcols.columns
 * in one pass over a batch's records (``blocks``: the raw rows of
 * ``itemsize`` bytes, fields at the given offsets): ip, end_ip, the
 * transfer code of the iclass (``code_of``: 256 int8), the fall-through
 * end_ip + size, tsc, and start[r] = base + the instructions before r
 * (m + 1 of them). */
PyObject *hw_rows_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "records(blocks, itemsize, o_ip, o_end, o_tsc, "
                        "o_ninsn, o_iclass, o_size, code_of, base, ip, end, code, fall, "
                        "tsc, start)");
        return NULL;
    }
    Py_ssize_t v[7];
    for (int i = 0; i < 7; i++) {
        v[i] = PyLong_AsSsize_t(args[1 + i]);
        if (v[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    long long base = PyLong_AsLongLong(args[9]);
    if (base == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t isz = v[0];
    if (isz <= 0 || v[4] + 4 > isz || v[5] >= isz || v[6] >= isz
        || v[1] + 8 > isz || v[2] + 8 > isz || v[3] + 8 > isz) {
        PyErr_SetString(PyExc_ValueError, "records: bad field offsets");
        return NULL;
    }
    Py_buffer bb = {0}, bc = {0}, o[6];
    memset(o, 0, sizeof o);
    PyObject *res = NULL;
    if (get_buf(args[0], &bb, isz, -1, "blocks") < 0)
        return NULL;
    Py_ssize_t m = bb.len / isz;
    if (get_buf(args[8], &bc, 1, 256, "code_of") < 0)
        goto done;
    static const char *what[6] = {"ip", "end", "code", "fall", "tsc", "start"};
    static const Py_ssize_t w[6] = {8, 8, 1, 8, 8, 8};
    for (int i = 0; i < 6; i++) {
        if (get_buf(args[10 + i], &o[i], w[i], m + (i == 5), what[i]) < 0)
            goto done;
        if (o[i].readonly) {
            PyErr_SetString(PyExc_ValueError, "records: outputs must be writable");
            goto done;
        }
    }
    const char *row = bb.buf;
    const int8_t *code_of = bc.buf;
    uint64_t *ip = o[0].buf, *end = o[1].buf, *fall = o[3].buf, *tsc = o[4].buf;
    int8_t *code = o[2].buf;
    int64_t *start = o[5].buf, at = (int64_t)base;
    for (Py_ssize_t r = 0; r < m; r++, row += isz) {
        uint64_t e;
        uint32_t n;
        memcpy(&ip[r], row + v[1], 8);
        memcpy(&e, row + v[2], 8);
        memcpy(&tsc[r], row + v[3], 8);
        memcpy(&n, row + v[4], 4);
        end[r] = e;
        code[r] = code_of[(uint8_t)row[v[5]]];
        fall[r] = e + (uint8_t)row[v[6]];
        start[r] = at;
        at += n;
    }
    start[m] = at;
    res = Py_NewRef(Py_None);
done:
    if (bb.obj)
        PyBuffer_Release(&bb);
    if (bc.obj)
        PyBuffer_Release(&bc);
    for (int i = 0; i < 6; i++)
        if (o[i].obj)
            PyBuffer_Release(&o[i]);
    return res;
}

/* commit(tgt, land, o_tr, o_lvl, o_pfr, o_flags, o_nid, o_ret, o_ret_ok,
 *        x_tr, x_lvl, x_fr, top_fr, s_id, s_parent, s_func, s_name, s_flags,
 *        s_pid, s_tid, s_begin_idx, s_eseq, s_path, seq0, next_id, pid, tid,
 *        paths, e_cols, x_cols, t_cols, path, ppath): runs.commit's rows of
 * a match, into the given arrays: ``e_cols``/``x_cols`` the 17 columns of
 * slices.SLICE (in its field order) of the enters and exits, ``t_cols``
 * the stack's new top (id, parent, func, name, flags, pid, tid, begin_idx,
 * eseq, path, ret, ret_ok), ``path``/``ppath`` each open's call path and
 * its parent's.  Indices follow numpy's (a negative one counts from the
 * end) so that the twin's answer is this one. */
enum { C_ID, C_PARENT, C_FUNC, C_NAME, C_DEPTH, C_FLAGS, C_PID, C_TID, C_BIDX, C_EIDX,
       C_ESEQ, C_XSEQ, C_PATH, C_BEGIN, C_END, C_CINS, C_CTIME, NCOLS };
static const Py_ssize_t col_w[NCOLS] = {8, 8, 8, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};

typedef struct {
    Py_buffer b[80];
    int n;
} Bufs;

static void *bufs_get(Bufs *bs, PyObject *o, Py_ssize_t w, Py_ssize_t n, int writable,
                      const char *what)
{
    if (bs->n >= (int)(sizeof bs->b / sizeof *bs->b)) {
        PyErr_SetString(PyExc_ValueError, "commit: too many buffers");
        return NULL;
    }
    Py_buffer *b = &bs->b[bs->n];
    if (get_buf(o, b, w, n, what) < 0)
        return NULL;
    bs->n++;
    if (writable && b->readonly) {
        PyErr_Format(PyExc_ValueError, "commit: %s must be writable", what);
        return NULL;
    }
    return b->buf ? b->buf : (void *)"";
}

static int fix_index(int64_t *i, Py_ssize_t n, const char *what)
{
    if (*i < 0)
        *i += n;
    if (*i < 0 || *i >= n) {
        PyErr_Format(PyExc_IndexError, "commit: %s out of range", what);
        return -1;
    }
    return 0;
}

static void fill_i64(int64_t *a, Py_ssize_t n, int64_t v)
{
    for (Py_ssize_t i = 0; i < n; i++)
        a[i] = v;
}

/* begin, end, child_insns and child_time: zeros (0.0 is all zero bits) */
static void zero_cols(char *const *A, Py_ssize_t n)
{
    for (int c = C_BEGIN; c <= C_CTIME; c++)
        memset(A[c], 0, (size_t)n * 8);
}

PyObject *hw_rows_commit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 33) {
        PyErr_SetString(PyExc_TypeError, "commit: 33 arguments (see the module source)");
        return NULL;
    }
    Bufs bs;
    bs.n = 0;
    PyObject *res = NULL;
    long long seq0 = PyLong_AsLongLong(args[23]), next_id = PyLong_AsLongLong(args[24]),
              pid = PyLong_AsLongLong(args[25]), tid = PyLong_AsLongLong(args[26]);
    int paths = PyObject_IsTrue(args[27]);
    if (PyErr_Occurred() || paths < 0)
        return NULL;
    if (!PyTuple_Check(args[28]) || PyTuple_GET_SIZE(args[28]) != NCOLS
        || !PyTuple_Check(args[29]) || PyTuple_GET_SIZE(args[29]) != NCOLS
        || !PyTuple_Check(args[30]) || PyTuple_GET_SIZE(args[30]) != 12) {
        PyErr_SetString(PyExc_TypeError, "commit: e_cols, x_cols (17) and t_cols (12) tuples");
        return NULL;
    }
    Py_ssize_t ntr = -1, no = -1, nx = -1, nt = -1, s0 = -1;
#define GET(T, var, i, w, n, wr) \
    T var = bufs_get(&bs, args[i], w, n, wr, #var); \
    if (!var) goto done;
    GET(const uint64_t *, tgt, 0, 8, -1, 0)
    ntr = bs.b[bs.n - 1].len / 8;
    GET(const int64_t *, land, 1, 8, ntr, 0)
    GET(const int64_t *, o_tr, 2, 8, -1, 0)
    no = bs.b[bs.n - 1].len / 8;
    GET(const int64_t *, o_lvl, 3, 8, no, 0)
    GET(const int64_t *, o_pfr, 4, 8, no, 0)
    GET(const uint32_t *, o_flags, 5, 4, no, 0)
    GET(const int32_t *, o_nid, 6, 4, no, 0)
    GET(const uint64_t *, o_ret, 7, 8, no, 0)
    GET(const uint8_t *, o_ret_ok, 8, 1, no, 0)
    GET(const int64_t *, x_tr, 9, 8, -1, 0)
    nx = bs.b[bs.n - 1].len / 8;
    GET(const int64_t *, x_lvl, 10, 8, nx, 0)
    GET(const int64_t *, x_fr, 11, 8, nx, 0)
    GET(const int64_t *, top_fr, 12, 8, -1, 0)
    nt = bs.b[bs.n - 1].len / 8;
    GET(const int64_t *, s_id, 13, 8, -1, 0)
    s0 = bs.b[bs.n - 1].len / 8;
    GET(const int64_t *, s_parent, 14, 8, s0, 0)
    GET(const uint64_t *, s_func, 15, 8, s0, 0)
    GET(const int32_t *, s_name, 16, 4, s0, 0)
    GET(const uint32_t *, s_flags, 17, 4, s0, 0)
    GET(const int64_t *, s_pid, 18, 8, s0, 0)
    GET(const int64_t *, s_tid, 19, 8, s0, 0)
    GET(const int64_t *, s_bidx, 20, 8, s0, 0)
    GET(const int64_t *, s_eseq, 21, 8, s0, 0)
    GET(const uint64_t *, s_path, 22, 8, s0, 0)
    GET(uint64_t *, path, 31, 8, no, 1)
    GET(uint64_t *, ppath, 32, 8, no, 1)
#undef GET
    char *E[NCOLS], *X[NCOLS], *T[12];
    static const Py_ssize_t t_w[12] = {8, 8, 8, 4, 4, 8, 8, 8, 8, 8, 8, 1};
    for (int c = 0; c < NCOLS; c++) {
        if (!(E[c] = bufs_get(&bs, PyTuple_GET_ITEM(args[28], c), col_w[c], no, 1, "e_cols"))
            || !(X[c] = bufs_get(&bs, PyTuple_GET_ITEM(args[29], c), col_w[c], nx, 1,
                                 "x_cols")))
            goto done;
    }
    for (int c = 0; c < 12; c++)
        if (!(T[c] = bufs_get(&bs, PyTuple_GET_ITEM(args[30], c), t_w[c], nt, 1, "t_cols")))
            goto done;
    if (s0 < 1) {
        PyErr_SetString(PyExc_ValueError, "commit: an empty stack");
        goto done;
    }
#define COL(A, c, T) ((T *)(A)[c])
    for (Py_ssize_t i = 0; i < no; i++) {
        int64_t t = o_tr[i], lvl = o_lvl[i], p_lvl = lvl - 1, pfr = o_pfr[i];
        if (fix_index(&t, ntr, "o_tr") < 0)
            goto done;
        int64_t pc = p_lvl < 0 ? 0 : (p_lvl > s0 - 1 ? s0 - 1 : p_lvl);
        int64_t parent = p_lvl < 0 ? -1 : (pfr >= 0 ? next_id + pfr : s_id[pc]);
        uint64_t base = p_lvl < 0 ? 0 : (pfr >= 0 ? 0 : s_path[pc]);
        uint64_t pp = 0, me = 0;
        if (paths) {
            if (pfr >= i) {
                PyErr_SetString(PyExc_ValueError, "commit: a parent after its child");
                goto done;
            }
            pp = pfr >= 0 ? path[pfr] : base;
            me = pp * PATH_MUL + (uint64_t)(int64_t)o_nid[i] + 1u;
        }
        path[i] = me;
        ppath[i] = pp;
        COL(E, C_ID, int64_t)[i] = next_id + i;
        COL(E, C_PARENT, int64_t)[i] = parent;
        COL(E, C_FUNC, uint64_t)[i] = tgt[t];
        COL(E, C_NAME, int32_t)[i] = o_nid[i];
        COL(E, C_DEPTH, int32_t)[i] = (int32_t)lvl;
        COL(E, C_FLAGS, uint32_t)[i] = o_flags[i];
        COL(E, C_BIDX, int64_t)[i] = land[t];
        COL(E, C_ESEQ, int64_t)[i] = seq0 + 4 * o_tr[i] + 2;
        COL(E, C_PATH, uint64_t)[i] = me;
    }
    /* the columns of one value, each in a loop of its own: the loop
       above writes fewer streams at a time (17 of them, 8 constant, were
       a quarter of summary's commit time on yes in cpu mode) */
    fill_i64(COL(E, C_PID, int64_t), no, pid);
    fill_i64(COL(E, C_TID, int64_t), no, tid);
    fill_i64(COL(E, C_EIDX, int64_t), no, -1);
    fill_i64(COL(E, C_XSEQ, int64_t), no, -1);
    zero_cols(E, no);
    /* the exits: checked, their own columns; then each carried column in
       a loop of its own (from the opened row, or the initial stack's) */
    for (Py_ssize_t j = 0; j < nx; j++) {
        int64_t t = x_tr[j], fr = x_fr[j], lvl = x_lvl[j];
        if (fix_index(&t, ntr, "x_tr") < 0)
            goto done;
        if (fr >= 0) {
            if (fix_index(&fr, no, "x_fr") < 0)
                goto done;
        } else {
            int64_t lv = lvl < s0 - 1 ? lvl : s0 - 1;
            if (fix_index(&lv, s0, "x_lvl") < 0)
                goto done;
        }
        COL(X, C_DEPTH, int32_t)[j] = (int32_t)lvl;
        COL(X, C_EIDX, int64_t)[j] = land[t];
        COL(X, C_XSEQ, int64_t)[j] = seq0 + 4 * x_tr[j] + 1;
    }
#define CARRY(c, T, s_col)                                                  \
    for (Py_ssize_t j = 0; j < nx; j++) {                                   \
        int64_t fr = x_fr[j], lv = x_lvl[j] < s0 - 1 ? x_lvl[j] : s0 - 1;   \
        COL(X, c, T)[j] = fr >= 0 ? COL(E, c, T)[fr]                        \
                                  : s_col[lv < 0 ? lv + s0 : lv];           \
    }
    CARRY(C_ID, int64_t, s_id)
    CARRY(C_PARENT, int64_t, s_parent)
    CARRY(C_FUNC, uint64_t, s_func)
    CARRY(C_NAME, int32_t, s_name)
    CARRY(C_FLAGS, uint32_t, s_flags)
    CARRY(C_BIDX, int64_t, s_bidx)
    CARRY(C_ESEQ, int64_t, s_eseq)
    CARRY(C_PATH, uint64_t, s_path)
    CARRY(C_PID, int64_t, s_pid)
    CARRY(C_TID, int64_t, s_tid)
#undef CARRY
    zero_cols(X, nx);
    for (Py_ssize_t l = 0; l < nt; l++) {
        int64_t fr = top_fr[l];
        if (fix_index(&fr, no, "top_fr") < 0)
            goto done;
        ((int64_t *)T[0])[l] = COL(E, C_ID, int64_t)[fr];
        ((int64_t *)T[1])[l] = COL(E, C_PARENT, int64_t)[fr];
        ((uint64_t *)T[2])[l] = COL(E, C_FUNC, uint64_t)[fr];
        ((int32_t *)T[3])[l] = COL(E, C_NAME, int32_t)[fr];
        ((uint32_t *)T[4])[l] = COL(E, C_FLAGS, uint32_t)[fr];
        ((int64_t *)T[5])[l] = COL(E, C_PID, int64_t)[fr];
        ((int64_t *)T[6])[l] = COL(E, C_TID, int64_t)[fr];
        ((int64_t *)T[7])[l] = COL(E, C_BIDX, int64_t)[fr];
        ((int64_t *)T[8])[l] = COL(E, C_ESEQ, int64_t)[fr];
        ((uint64_t *)T[9])[l] = COL(E, C_PATH, uint64_t)[fr];
        ((uint64_t *)T[10])[l] = o_ret[fr];
        ((uint8_t *)T[11])[l] = o_ret_ok[fr];
    }
#undef COL
    res = Py_NewRef(Py_None);
done:
    for (int i = 0; i < bs.n; i++)
        PyBuffer_Release(&bs.b[i]);
    return res;
}

/* dense_rows(dense, hi, lo, out) -> misses: out[i] = dense[hi[i], lo[i]]
 * (``dense`` a C-contiguous int32 table of shape (H, W), ``hi``/``lo``
 * int32, ``out`` int64); the number of rows it gives -1 for, or -1 (out
 * untouched past the first) where a key falls outside the table.  The
 * lookup of branches.calls' line heads by (depth, name id). */
PyObject *hw_rows_dense_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "dense_rows(dense, hi, lo, out)");
        return NULL;
    }
    Py_buffer bd = {0}, bh = {0}, bl = {0}, bo = {0};
    PyObject *res = NULL;
    if (PyObject_GetBuffer(args[0], &bd, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0)
        return NULL;
    if (bd.ndim != 2 || bd.itemsize != 4) {
        PyErr_SetString(PyExc_ValueError, "dense_rows: dense is a 2-D int32 table");
        goto done;
    }
    Py_ssize_t H = bd.shape[0], W = bd.shape[1];
    if (get_buf(args[1], &bh, 4, -1, "hi") < 0)
        goto done;
    Py_ssize_t n = bh.len / 4;
    if (get_buf(args[2], &bl, 4, n, "lo") < 0 || get_buf(args[3], &bo, 8, n, "out") < 0)
        goto done;
    if (bo.readonly) {
        PyErr_SetString(PyExc_ValueError, "dense_rows: out must be writable");
        goto done;
    }
    const int32_t *d = bd.buf, *hi = bh.buf, *lo = bl.buf;
    int64_t *out = bo.buf;
    Py_ssize_t miss = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t h = hi[i], l = lo[i];
        if (h < 0 || l < 0 || h >= H || l >= W) {
            miss = -1;
            break;
        }
        int32_t r = d[(Py_ssize_t)h * W + l];
        out[i] = r;
        miss += r < 0;
    }
    res = PyLong_FromSsize_t(miss);
done:
    RELEASE_BUFS(&bd, &bh, &bl, &bo);
    return res;
}

/* Compiled core of hwtrace.analysis.runs: the call stack over a run of
 * transfers, one walk instead of the twin's sorts and searches.
 *
 * The Python twin is runs.match (numpy over all transfers at once) and
 * runs._paths; both cores answer with the same runs.Match, from which
 * runs.commit makes the rows.  The boundary is narrow and stateless:
 *
 *   walk(code, fall, tgt, src, s_func, s_ret, s_ret_ok, s_far, max_depth,
 *        table, flags, spec_start, scanned)
 *     -> (k, keep, d_end, o_tr, o_lvl, o_ret, o_ret_ok, o_flags, o_pfr,
 *         x_tr, x_lvl, x_fr, top_fr, unknown, o_nid)
 *
 * ``code`` int8 transfer codes, ``fall``/``tgt``/``src`` uint64 per
 * transfer; ``s_*`` the frames the run starts on (uint64, uint64, uint8,
 * uint8); ``table`` None or (lo, hi, start, fstarts, nid, bits) buffers,
 * the
 * merged symbol table of symtable.AddrTable (tail calls and unwinding
 * jumps recognized here, as AddrTable.starts / same_function / resolve
 * would, and ``o_nid`` the int32 name id of each open: -1 where no symbol
 * names it, the ids from the table's int32 ``nid``; ``bits`` None or
 * symtable's bitmap of hashed function starts, packed little-endian);
 * else ``flags`` None (no symbols: no tail calls) or a uint8 per
 * transfer (bit 0 a tail call, bit 1 a jump that may unwind) with
 * ``spec_start`` the uint64 function start such a jump lands in;
 * ``scanned``: past the cut, transfers before it were searched for unknown
 * jump targets by an earlier call (their names are registered).  Returns
 * the Match fields, arrays as bytes (int64 / uint64 / bool / uint32).
 *
 *   paths(nid, pfr, base) -> bytes (uint64)
 *
 * path[i] = (pfr[i] >= 0 ? path[pfr[i]] : base[i]) * MUL + nid[i] + 1
 * (int32 nid, int64 pfr with pfr[i] < i, uint64 base).
 *
 *   commit(...)                                  runs.commit (rows of a Match)
 *
 * After the matching, the rows' per-row work (twins in clock.py and
 * rows.py, numpy):
 *
 *   times(a_seq, a_idx, a_t, seq, idx, out)      TimeBase.times
 *   begins(e_id, e_begin, x_id, x_begin, found, ended)   Pending._begins
 *   children(id, parent, begin_idx, end_idx, begin, end, ci, ct,
 *            c_key, c_insns, c_time, c_used) -> (parent, insns, time)
 *                                                Pending._children
 *   outermost(key, xend, xrow, x_xseq, out)      Profile._outermost
 *   records(blocks, itemsize, offsets..., code_of, base, ip, end, code,
 *           fall, tsc, start)                    batchfeed._Arrays
 *   dense_rows(dense, hi, lo, out) -> misses     branches.calls._StrTable
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 6

/* transfer codes (runs.py) */
enum { T_NONE, T_CALL, T_RET, T_JUMP, T_COND, T_FCALL, T_FRET, T_FJUMP };
#define PATH_MUL 0x100000001B3ull
#define HBITS 22                            /* symtable._HBITS */

static uint32_t flag_far, flag_tail;

/* -- growable output arrays ---------------------------------------------- */
typedef struct {
    char *p;
    Py_ssize_t n, cap, w;
} Vec;

static int vec_grow(Vec *v)
{
    Py_ssize_t cap = v->cap ? 2 * v->cap : 1024;
    char *p = PyMem_Realloc(v->p, (size_t)(cap * v->w));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    v->p = p;
    v->cap = cap;
    return 0;
}

#define PUSH(v, T, x) do { \
        if ((v)->n == (v)->cap && vec_grow(v) < 0) goto fail; \
        ((T *)(v)->p)[(v)->n++] = (x); \
    } while (0)

static PyObject *vec_bytes(Vec *v)
{
    return PyBytes_FromStringAndSize(v->p ? v->p : "", v->n * v->w);
}

/* -- the merged symbol table ---------------------------------------------- */
typedef struct {
    const uint64_t *lo, *hi, *start, *fs;
    const int32_t *nid;
    const uint8_t *bits;                    /* a hashed bitmap of fs, or NULL */
    Py_ssize_t nlo, nfs, last;
} Table;

/* searchsorted(lo, a, side="right") - 1 (lo[0] == 0: never < 0); the
 * segment of the last answer first (jumps come from nearby code) */
static Py_ssize_t seg_of(Table *t, uint64_t a)
{
    Py_ssize_t c = t->last;
    if (c >= 0 && t->lo[c] <= a && (c + 1 == t->nlo || t->lo[c + 1] > a))
        return c;
    Py_ssize_t l = 0, h = t->nlo;          /* first index with lo > a */
    while (l < h) {
        Py_ssize_t m = l + (h - l) / 2;
        if (t->lo[m] <= a)
            l = m + 1;
        else
            h = m;
    }
    t->last = l - 1;
    return l - 1;
}

static int is_start(const Table *t, uint64_t a)
{
    uint64_t hb = (a ^ (a >> HBITS)) & ((1u << HBITS) - 1);
    if (t->bits && !((t->bits[hb >> 3] >> (hb & 7)) & 1))
        return 0;                           /* most addresses start nothing */
    Py_ssize_t l = 0, h = t->nfs;
    while (l < h) {
        Py_ssize_t m = l + (h - l) / 2;
        if (t->fs[m] < a)
            l = m + 1;
        else
            h = m;
    }
    return l < t->nfs && t->fs[l] == a;
}

static int same_function(Table *t, uint64_t a, uint64_t b)
{
    if (!t->nlo)
        return 0;
    Py_ssize_t ja = seg_of(t, a), jb = seg_of(t, b);    /* b: often ja's */
    if (ja < 0 || jb < 0 || a >= t->hi[ja] || b >= t->hi[jb])
        return 0;
    return ja == jb || t->start[ja] == t->start[jb];
}

/* the known function start of a (*nid its name), or a with *known = 0 */
static uint64_t resolve(Table *t, uint64_t a, int *known, int32_t *nid)
{
    *known = 0;
    *nid = -1;
    if (!t->nlo)
        return a;
    Py_ssize_t j = seg_of(t, a);
    if (j < 0 || a >= t->hi[j])
        return a;
    *known = 1;
    *nid = t->nid[j];
    return t->start[j];
}

/* resolve() through a direct-mapped memo of the last answers (calls go
 * to the same functions again and again; a binary search each time
 * missed the cache) */
#define MEMO 2048
typedef struct {
    uint64_t addr[MEMO], start[MEMO];
    int32_t nid[MEMO];
    uint8_t known[MEMO], valid[MEMO];
} Memo;

static uint64_t resolve_memo(Table *t, Memo *m, uint64_t a, int *known, int32_t *nid)
{
    size_t h = (size_t)((a * 0x9E3779B97F4A7C15ull) >> 53) & (MEMO - 1);
    if (m->valid[h] && m->addr[h] == a) {
        *known = m->known[h];
        *nid = m->nid[h];
        return m->start[h];
    }
    uint64_t start = resolve(t, a, known, nid);
    m->valid[h] = 1;
    m->addr[h] = a;
    m->start[h] = start;
    m->known[h] = (uint8_t)*known;
    m->nid[h] = *nid;
    return start;
}

/* -- buffers in ------------------------------------------------------------- */
static int get_buf(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t n,
                   const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->len % itemsize || (n >= 0 && b->len / itemsize != n)) {
        PyErr_Format(PyExc_ValueError, "walk: %s has the wrong size", what);
        PyBuffer_Release(b);
        b->obj = NULL;
        return -1;
    }
    return 0;
}

/* one frame of the stack being walked */
typedef struct {
    int64_t fr;            /* its open, or -1: the old frame at this level */
    uint64_t func, ret;
    uint8_t ret_ok, far;
} Frame;

static PyObject *py_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "walk(code, fall, tgt, src, s_func, s_ret, "
                        "s_ret_ok, s_far, max_depth, table, flags, spec_start, scanned)");
        return NULL;
    }
    Py_buffer bc = {0}, bf = {0}, bt = {0}, bs = {0}, sf = {0}, sr = {0}, so = {0},
              sa = {0}, tl = {0}, th = {0}, ts = {0}, tf = {0}, tn = {0}, tb = {0}, bfl = {0},
              bss = {0};
    Vec o_tr = {0, 0, 0, 8}, o_lvl = {0, 0, 0, 8}, o_ret = {0, 0, 0, 8},
        o_ok = {0, 0, 0, 1}, o_fl = {0, 0, 0, 4}, o_pfr = {0, 0, 0, 8},
        x_tr = {0, 0, 0, 8}, x_lvl = {0, 0, 0, 8}, x_fr = {0, 0, 0, 8},
        top = {0, 0, 0, 8}, unk = {0, 0, 0, 8}, o_nid = {0, 0, 0, 4};
    Frame *st = NULL;
    Memo *memo = NULL;
    PyObject *res = NULL;
    Table T = {0};
    int have_table = 0;

    if (get_buf(args[0], &bc, 1, -1, "code") < 0)
        goto fail;
    Py_ssize_t n = bc.len;
    if (get_buf(args[1], &bf, 8, n, "fall") < 0 || get_buf(args[2], &bt, 8, n, "tgt") < 0
        || get_buf(args[3], &bs, 8, n, "src") < 0)
        goto fail;
    if (get_buf(args[4], &sf, 8, -1, "s_func") < 0)
        goto fail;
    Py_ssize_t s0 = sf.len / 8;
    if (get_buf(args[5], &sr, 8, s0, "s_ret") < 0 || get_buf(args[6], &so, 1, s0, "s_ret_ok") < 0
        || get_buf(args[7], &sa, 1, s0, "s_far") < 0)
        goto fail;
    if (s0 < 1) {
        PyErr_SetString(PyExc_ValueError, "walk: the stack needs a frame");
        goto fail;
    }
    long long max_depth = PyLong_AsLongLong(args[8]);
    if (max_depth == -1 && PyErr_Occurred())
        goto fail;
    PyObject *table = args[9], *flags = args[10], *spec = args[11];
    Py_ssize_t scanned = PyLong_AsSsize_t(args[12]);
    if (scanned == -1 && PyErr_Occurred())
        goto fail;
    if (table != Py_None) {
        if (!PyTuple_Check(table) || PyTuple_GET_SIZE(table) != 6) {
            PyErr_SetString(PyExc_TypeError,
                            "walk: table is (lo, hi, start, fstarts, nid, bits)");
            goto fail;
        }
        if (get_buf(PyTuple_GET_ITEM(table, 0), &tl, 8, -1, "lo") < 0)
            goto fail;
        T.nlo = tl.len / 8;
        if (get_buf(PyTuple_GET_ITEM(table, 1), &th, 8, T.nlo, "hi") < 0
            || get_buf(PyTuple_GET_ITEM(table, 2), &ts, 8, T.nlo, "start") < 0
            || get_buf(PyTuple_GET_ITEM(table, 3), &tf, 8, -1, "fstarts") < 0
            || get_buf(PyTuple_GET_ITEM(table, 4), &tn, 4, T.nlo, "nid") < 0)
            goto fail;
        T.nid = tn.buf;
        T.last = -1;
        if (PyTuple_GET_ITEM(table, 5) != Py_None) {
            if (get_buf(PyTuple_GET_ITEM(table, 5), &tb, 1, (Py_ssize_t)1 << (HBITS - 3),
                        "bits") < 0)
                goto fail;
            T.bits = tb.buf;
        }
        T.lo = tl.buf;
        T.hi = th.buf;
        T.start = ts.buf;
        T.fs = tf.buf;
        T.nfs = tf.len / 8;
        have_table = 1;
    } else if (flags != Py_None) {
        if (get_buf(flags, &bfl, 1, n, "flags") < 0 || get_buf(spec, &bss, 8, n, "spec_start") < 0)
            goto fail;
    }
    const int8_t *code = bc.buf;
    const uint64_t *fall = bf.buf, *tgt = bt.buf, *src = bs.buf;
    const uint8_t *jfl = bfl.obj ? bfl.buf : NULL;
    const uint64_t *sst = bss.obj ? bss.buf : NULL;

    if (have_table) {
        memo = PyMem_Malloc(sizeof *memo);
        if (!memo) {
            PyErr_NoMemory();
            goto fail;
        }
        memset(memo->valid, 0, sizeof memo->valid);
    }
    Py_ssize_t cap = s0 + 64;
    st = PyMem_Malloc(cap * sizeof(Frame));
    if (!st) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t l = 0; l < s0; l++) {
        st[l].fr = -1;
        st[l].func = ((const uint64_t *)sf.buf)[l];
        st[l].ret = ((const uint64_t *)sr.buf)[l];
        st[l].ret_ok = ((const uint8_t *)so.buf)[l] != 0;
        st[l].far = ((const uint8_t *)sa.buf)[l] != 0;
    }
    int64_t d = s0, keep = s0, no = 0;
    Py_ssize_t k = n;

    /* the cut at transfer j: past it the walk only looks for the unknown
     * targets of jumps that may unwind (the twin registers the names of
     * all of them before it matches), and only where no earlier call
     * looked (``scanned``) */
#define CUT(j) do { \
        k = (j); \
        if (!have_table) \
            goto walked; \
        if ((j) + 1 < scanned) \
            (j) = scanned - 1; \
    } while (0)
    for (Py_ssize_t j = 0; j < n; j++) {
        int c = code[j];
        uint64_t t = tgt[j];
        int open = 0, close = 0, tail = 0, sp = 0;
        uint64_t sp_start = 0;
        switch (c) {
        case T_CALL:
            open = t != fall[j];
            break;
        case T_FCALL:
            open = 1;
            break;
        case T_RET:
        case T_FRET:
            close = 1;
            break;
        case T_JUMP:
        case T_COND:
            if (t == fall[j] || (k < n && c == T_COND))
                break;
            if (have_table) {
                if (T.nfs && is_start(&T, t))
                    tail = 1;
                else if (c == T_JUMP && !same_function(&T, src[j], t)) {
                    int known;
                    int32_t nid;
                    sp_start = resolve(&T, t, &known, &nid);
                    if (known)
                        sp = 1;
                    else
                        PUSH(&unk, uint64_t, t);
                }
            } else if (jfl) {
                tail = jfl[j] & 1;
                sp = (jfl[j] >> 1) & 1;
                sp_start = sst[j];
            }
            break;
        default:
            break;
        }
        if (k < n || !(open | close | tail | sp))
            continue;           /* past the cut: only the unknown names */
        if (close || tail) {
            int64_t lvl = d - 1;
            if (lvl < 0) {
                CUT(j);
                continue;
            }
            Frame *f = &st[lvl];
            if (close) {
                if (!(f->ret_ok && f->ret == t)) {
                    CUT(j);
                    continue;
                }
            } else if (f->func == t || lvl >= max_depth) {
                CUT(j);
                continue;
            }
            PUSH(&x_tr, int64_t, (int64_t)j);
            PUSH(&x_lvl, int64_t, lvl);
            PUSH(&x_fr, int64_t, f->fr);
            if (f->fr < 0 && lvl < keep)
                keep = lvl;
            if (close) {
                d--;
                continue;
            }
            /* a tail call: the same level, the replaced frame's return */
            PUSH(&o_tr, int64_t, (int64_t)j);
            PUSH(&o_lvl, int64_t, lvl);
            PUSH(&o_ret, uint64_t, f->ret);
            PUSH(&o_ok, uint8_t, f->ret_ok);
            PUSH(&o_fl, uint32_t, flag_tail | (f->far ? flag_far : 0));
            PUSH(&o_pfr, int64_t, lvl > 0 ? st[lvl - 1].fr : -1);
            if (have_table) {
                int known;
                int32_t nid;
                resolve_memo(&T, memo, t, &known, &nid);
                PUSH(&o_nid, int32_t, nid);
            }
            f->fr = no++;
            f->func = t;
            continue;
        }
        if (sp) {
            if (d > 1 && st[d - 1].func != sp_start)
                CUT(j);
            continue;
        }
        /* a call */
        if (d >= max_depth) {
            CUT(j);
            continue;
        }
        if (d == cap) {
            Frame *p = PyMem_Realloc(st, 2 * cap * sizeof(Frame));
            if (!p) {
                PyErr_NoMemory();
                goto fail;
            }
            st = p;
            cap *= 2;
        }
        PUSH(&o_tr, int64_t, (int64_t)j);
        PUSH(&o_lvl, int64_t, d);
        PUSH(&o_ret, uint64_t, fall[j]);
        PUSH(&o_ok, uint8_t, 1);
        PUSH(&o_fl, uint32_t, c == T_FCALL ? flag_far : 0);
        PUSH(&o_pfr, int64_t, d > 0 ? st[d - 1].fr : -1);
        if (have_table) {
            int known;
            int32_t nid;
            resolve_memo(&T, memo, t, &known, &nid);
            PUSH(&o_nid, int32_t, nid);
        }
        st[d].fr = no++;
        st[d].func = t;
        st[d].ret = fall[j];
        st[d].ret_ok = 1;
        st[d].far = c == T_FCALL;
        d++;
    }
walked:
    if (d < keep)
        keep = d;
    for (int64_t l = keep; l < d; l++)
        PUSH(&top, int64_t, st[l].fr);
    PyObject *nids = have_table ? vec_bytes(&o_nid) : Py_NewRef(Py_None);
    res = Py_BuildValue("(nLLNNNNNNNNNNNN)", k, (long long)keep, (long long)d,
                        vec_bytes(&o_tr), vec_bytes(&o_lvl), vec_bytes(&o_ret),
                        vec_bytes(&o_ok), vec_bytes(&o_fl), vec_bytes(&o_pfr),
                        vec_bytes(&x_tr), vec_bytes(&x_lvl), vec_bytes(&x_fr),
                        vec_bytes(&top), vec_bytes(&unk), nids);
fail:
    {
        Py_buffer *bufs[] = {&bc, &bf, &bt, &bs, &sf, &sr, &so, &sa, &tl, &th, &ts,
                             &tf, &tn, &tb, &bfl, &bss};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]->obj)
                PyBuffer_Release(bufs[i]);
        Vec *vs[] = {&o_tr, &o_lvl, &o_ret, &o_ok, &o_fl, &o_pfr, &x_tr, &x_lvl,
                     &x_fr, &top, &unk, &o_nid};
        for (size_t i = 0; i < sizeof vs / sizeof *vs; i++)
            PyMem_Free(vs[i]->p);
        PyMem_Free(st);
        PyMem_Free(memo);
    }
    return res;
}

static PyObject *py_paths(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "paths(nid, pfr, base)");
        return NULL;
    }
    Py_buffer bn = {0}, bp = {0}, bb = {0};
    PyObject *res = NULL;
    if (get_buf(args[0], &bn, 4, -1, "nid") < 0)
        return NULL;
    Py_ssize_t n = bn.len / 4;
    if (get_buf(args[1], &bp, 8, n, "pfr") < 0 || get_buf(args[2], &bb, 8, n, "base") < 0)
        goto done;
    res = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!res)
        goto done;
    uint64_t *out = (uint64_t *)PyBytes_AS_STRING(res);
    const int32_t *nid = bn.buf;
    const int64_t *pfr = bp.buf;
    const uint64_t *base = bb.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = pfr[i];
        if (p >= i) {
            Py_CLEAR(res);
            PyErr_SetString(PyExc_ValueError, "paths: a parent after its child");
            goto done;
        }
        uint64_t pp = p >= 0 ? out[p] : base[i];
        out[i] = pp * PATH_MUL + (uint64_t)(int64_t)nid[i] + 1u;
    }
done:
    if (bn.obj)
        PyBuffer_Release(&bn);
    if (bp.obj)
        PyBuffer_Release(&bp);
    if (bb.obj)
        PyBuffer_Release(&bb);
    return res;
}

/* -- rows after the matching (rows.Pending.flush, clock.TimeBase.times) ----- */

/* times(a_seq, a_idx, a_t, seq, idx, out): TimeBase.times into ``out``
 * (float64, one per row): the row's time interpolated between the last
 * anchor before it (in sequence order) and the first one after. */
static PyObject *py_times(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
    for (Py_ssize_t r = 0; r < n; r++) {
        /* searchsorted(a_seq, seq[r], side="left") */
        Py_ssize_t lo = 0, hi = na;
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (a_seq[mid] < seq[r])
                lo = mid + 1;
            else
                hi = mid;
        }
        Py_ssize_t k = lo;
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
    {
        Py_buffer *bufs[] = {&as, &ai, &at, &bs, &bi, &bo};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]->obj)
                PyBuffer_Release(bufs[i]);
    }
    return res;
}

/* begins(e_id, e_begin, x_id, x_begin, found, ended): the begin time of
 * every ending row whose begin row is among these (``e_id`` ascending):
 * x_begin[i] = e_begin[j] where e_id[j] == x_id[i] (found[i] = 1, ended[j]
 * = 1); other rows untouched (found[i] = 0).  ``found``/``ended`` uint8,
 * zeroed by the caller. */
static PyObject *py_begins(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
    {
        Py_buffer *bufs[] = {&ei, &eb, &xi, &xb, &fo, &en};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]->obj)
                PyBuffer_Release(bufs[i]);
    }
    return res;
}

/* an open-addressing map of int64 ids (>= 0) to row numbers */
typedef struct {
    int64_t *key;
    Py_ssize_t *val;
    size_t mask;
} IdMap;

static int idmap_init(IdMap *m, Py_ssize_t n)
{
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
}

static size_t idmap_slot(const IdMap *m, int64_t id)
{
    size_t h = (size_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    while (m->key[h] != -1 && m->key[h] != id)
        h = (h + 1) & m->mask;
    return h;
}

/* row of id, or -1 */
static Py_ssize_t idmap_get(const IdMap *m, int64_t id)
{
    if (id < 0)
        return -1;
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
static PyObject *py_children(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
    if (idmap_init(&map, n) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (id[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "children: a negative id");
            goto done;
        }
        size_t h = idmap_slot(&map, id[i]);
        map.key[h] = id[i];
        map.val[h] = i;
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
static PyObject *py_outermost(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
 *         code_of, base, ip, end, code, fall, tsc, start): batchfeed._Arrays
 * in one pass over a batch's records (``blocks``: the raw rows of
 * ``itemsize`` bytes, fields at the given offsets): ip, end_ip, the
 * transfer code of the iclass (``code_of``: 256 int8), the fall-through
 * end_ip + size, tsc, and start[r] = base + the instructions before r
 * (m + 1 of them). */
static PyObject *py_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

static PyObject *py_commit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
        COL(E, C_PID, int64_t)[i] = pid;
        COL(E, C_TID, int64_t)[i] = tid;
        COL(E, C_BIDX, int64_t)[i] = land[t];
        COL(E, C_EIDX, int64_t)[i] = -1;
        COL(E, C_ESEQ, int64_t)[i] = seq0 + 4 * o_tr[i] + 2;
        COL(E, C_XSEQ, int64_t)[i] = -1;
        COL(E, C_PATH, uint64_t)[i] = me;
        COL(E, C_BEGIN, double)[i] = 0.0;
        COL(E, C_END, double)[i] = 0.0;
        COL(E, C_CINS, int64_t)[i] = 0;
        COL(E, C_CTIME, double)[i] = 0.0;
    }
    for (Py_ssize_t j = 0; j < nx; j++) {
        int64_t t = x_tr[j], fr = x_fr[j], lvl = x_lvl[j];
        if (fix_index(&t, ntr, "x_tr") < 0)
            goto done;
        if (fr >= 0) {
            if (fix_index(&fr, no, "x_fr") < 0)
                goto done;
            COL(X, C_ID, int64_t)[j] = COL(E, C_ID, int64_t)[fr];
            COL(X, C_PARENT, int64_t)[j] = COL(E, C_PARENT, int64_t)[fr];
            COL(X, C_FUNC, uint64_t)[j] = COL(E, C_FUNC, uint64_t)[fr];
            COL(X, C_NAME, int32_t)[j] = COL(E, C_NAME, int32_t)[fr];
            COL(X, C_FLAGS, uint32_t)[j] = COL(E, C_FLAGS, uint32_t)[fr];
            COL(X, C_BIDX, int64_t)[j] = COL(E, C_BIDX, int64_t)[fr];
            COL(X, C_ESEQ, int64_t)[j] = COL(E, C_ESEQ, int64_t)[fr];
            COL(X, C_PATH, uint64_t)[j] = COL(E, C_PATH, uint64_t)[fr];
            COL(X, C_PID, int64_t)[j] = COL(E, C_PID, int64_t)[fr];
            COL(X, C_TID, int64_t)[j] = COL(E, C_TID, int64_t)[fr];
        } else {
            int64_t lv = lvl < s0 - 1 ? lvl : s0 - 1;
            if (fix_index(&lv, s0, "x_lvl") < 0)
                goto done;
            COL(X, C_ID, int64_t)[j] = s_id[lv];
            COL(X, C_PARENT, int64_t)[j] = s_parent[lv];
            COL(X, C_FUNC, uint64_t)[j] = s_func[lv];
            COL(X, C_NAME, int32_t)[j] = s_name[lv];
            COL(X, C_FLAGS, uint32_t)[j] = s_flags[lv];
            COL(X, C_BIDX, int64_t)[j] = s_bidx[lv];
            COL(X, C_ESEQ, int64_t)[j] = s_eseq[lv];
            COL(X, C_PATH, uint64_t)[j] = s_path[lv];
            COL(X, C_PID, int64_t)[j] = s_pid[lv];
            COL(X, C_TID, int64_t)[j] = s_tid[lv];
        }
        COL(X, C_DEPTH, int32_t)[j] = (int32_t)lvl;
        COL(X, C_EIDX, int64_t)[j] = land[t];
        COL(X, C_XSEQ, int64_t)[j] = seq0 + 4 * x_tr[j] + 1;
        COL(X, C_BEGIN, double)[j] = 0.0;
        COL(X, C_END, double)[j] = 0.0;
        COL(X, C_CINS, int64_t)[j] = 0;
        COL(X, C_CTIME, double)[j] = 0.0;
    }
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
static PyObject *py_dense_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
    {
        Py_buffer *bufs[] = {&bd, &bh, &bl, &bo};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]->obj)
                PyBuffer_Release(bufs[i]);
    }
    return res;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))py_walk, METH_FASTCALL,
     "The call stack over a run of transfers (see the module source)."},
    {"paths", (PyCFunction)(void (*)(void))py_paths, METH_FASTCALL,
     "Call-path hashes, parents first."},
    {"times", (PyCFunction)(void (*)(void))py_times, METH_FASTCALL,
     "Times of rows between the clock's anchors (clock.TimeBase.times)."},
    {"begins", (PyCFunction)(void (*)(void))py_begins, METH_FASTCALL,
     "Begin times of ending rows from the begin rows (rows.Pending._begins)."},
    {"children", (PyCFunction)(void (*)(void))py_children, METH_FASTCALL,
     "Callee sums of ending rows (rows.Pending._children)."},
    {"commit", (PyCFunction)(void (*)(void))py_commit, METH_FASTCALL,
     "The rows of a match (runs.commit)."},
    {"dense_rows", (PyCFunction)(void (*)(void))py_dense_rows, METH_FASTCALL,
     "Rows of (hi, lo) keys in a dense int32 table (branches.calls' heads)."},
    {"records", (PyCFunction)(void (*)(void))py_records, METH_FASTCALL,
     "A batch's record columns as the builder reads them (batchfeed._Arrays)."},
    {"outermost", (PyCFunction)(void (*)(void))py_outermost, METH_FASTCALL,
     "Ending activations no same-function one encloses (profile.Profile._outermost)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_c_runs", "Compiled core of hwtrace.analysis.runs.", -1,
    methods,
};

static int flag_value(PyObject *flag_cls, const char *name, uint32_t *out)
{
    PyObject *v = PyObject_GetAttrString(flag_cls, name);
    if (!v)
        return -1;
    unsigned long x = PyLong_AsUnsignedLong(v);
    Py_DECREF(v);
    if (x == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint32_t)x;
    return 0;
}

PyMODINIT_FUNC PyInit__c_runs(void)
{
    /* the flag bits, from the twin's own enum */
    PyObject *rec = PyImport_ImportModule("hwtrace.analysis.records");
    if (!rec)
        return NULL;
    PyObject *flag = PyObject_GetAttrString(rec, "Flag");
    Py_DECREF(rec);
    if (!flag)
        return NULL;
    int bad = flag_value(flag, "FAR", &flag_far) < 0
        || flag_value(flag, "TAIL_CALL", &flag_tail) < 0;
    Py_DECREF(flag);
    if (bad)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", ABI) < 0
        || PyModule_AddStringConstant(m, "SOURCE_SHA256", HWTRACE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

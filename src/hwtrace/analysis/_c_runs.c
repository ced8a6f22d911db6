/* Compiled core of hwtrace.analysis.runs: the call stack over a run of
 * transfers, one walk instead of the twin's sorts and searches.
 *
 * The Python twin is runs.match (numpy over all transfers at once) and
 * runs._paths; both cores answer with the same runs.Match, from which
 * runs.commit makes the rows.  The boundary is narrow and stateless:
 *
 *   walk(code, fall, tgt, src, s_func, s_ret, s_ret_ok, s_far, max_depth,
 *        table, flags, spec_start, scanned, soft)
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
 * jump targets by an earlier call (their names are registered); ``soft``:
 * a jump that may unwind but finds no frame below the top in the function
 * it lands in (mempcpy jumping into memcpy's body: it changes nothing)
 * goes on in the run, else it ends it (where the run is cut decides the
 * order in which code met there is named: see batchfeed).  Returns
 * the Match fields, arrays as bytes (int64 / uint64 / bool / uint32).
 *
 *   paths(nid, pfr, base) -> bytes (uint64)
 *
 * path[i] = (pfr[i] >= 0 ? path[pfr[i]] : base[i]) * MUL + nid[i] + 1
 * (int32 nid, int64 pfr with pfr[i] < i, uint64 base).
 *
 *   spread(src, tr, ne, out)
 *
 * ``src`` with item tr[i] written ne[i] + 1 times (every other item once)
 * into ``out``: the twin's ``src.take(vmap)`` of roundtrips.Groups.virtual
 * (a batch's transfers with room for its groups' events), as runs of
 * memcpy (int64 ``tr`` strictly increasing, int64 ``ne`` >= 0; ``src`` and
 * ``out`` of one item size, ``out`` writable and exactly that long).
 *
 * After the matching, the rows' per-row work is in core/rows.c (times,
 * begins, children, outermost, records, commit, dense_rows: see there),
 * methods of this module too, and so is core/keys.c's table of call-path
 * keys (keys_index, keys_find).
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/rows.h"
#include "core/keys.h"

#define OWNBUF_NAME "hwtrace.analysis._c_runs.Column"
#include "../_ext/ownbuf.h"

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 9

/* transfer codes (runs.py) */
enum { T_NONE, T_CALL, T_RET, T_JUMP, T_COND, T_FCALL, T_FRET, T_FJUMP };
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

static void pymem_free(void *p)
{
    PyMem_Free(p);
}

/* the vector's memory itself, as a buffer object (_ext/ownbuf.h): v is
 * left empty (a copy into bytes was ~400 MB of memmove on yes in cpu
 * mode) */
static PyObject *vec_bytes(Vec *v)
{
    PyObject *o = ownbuf_new(v->p, v->n * v->w, pymem_free);
    if (o) {
        v->p = NULL;
        v->n = v->cap = 0;
    }
    return o;
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

/* one frame of the stack being walked */
typedef struct {
    int64_t fr;            /* its open, or -1: the old frame at this level */
    uint64_t func, ret;
    uint8_t ret_ok, far;
} Frame;

static PyObject *py_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "walk(code, fall, tgt, src, s_func, s_ret, "
                        "s_ret_ok, s_far, max_depth, table, flags, spec_start, scanned, "
                        "soft)");
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
    int soft = PyObject_IsTrue(args[13]);
    if (soft < 0)
        goto fail;
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
            } else if (f->func == t && c == T_COND && soft) {
                /* a conditional jump back to the start of the function it
                 * is in (a loop whose head is the entry): no tail call, the
                 * builder's _settle changes nothing there -- soft: where
                 * the run is cut cannot change a name (see batchfeed) */
                continue;
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
            /* unwinding only if a frame below the top is that function's
             * (the builder's _jump_into); else the jump changes nothing
             * (mempcpy jumping into memcpy's body) and the run goes on */
            if (d > 1 && st[d - 1].func != sp_start) {
                int64_t l = soft ? d - 2 : -1;
                while (l >= 0 && st[l].func != sp_start)
                    l--;
                if (!soft || l >= 0)
                    CUT(j);
            }
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
        RELEASE_BUFS(&bc, &bf, &bt, &bs, &sf, &sr, &so, &sa,
                     &tl, &th, &ts, &tf, &tn, &tb, &bfl, &bss);
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

static PyObject *py_spread(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "spread(src, tr, ne, out)");
        return NULL;
    }
    Py_buffer bs = {0}, bt = {0}, bn = {0}, bo = {0};
    PyObject *res = NULL;
    if (PyObject_GetBuffer(args[0], &bs, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &bo, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    Py_ssize_t w = bs.itemsize;
    if (w <= 0 || bo.itemsize != w || bs.len % w || bo.len % w) {
        PyErr_SetString(PyExc_ValueError, "spread: src and out differ in item size");
        goto done;
    }
    if (get_buf(args[1], &bt, 8, -1, "tr") < 0)
        goto done;
    Py_ssize_t m = bt.len / 8;
    if (get_buf(args[2], &bn, 8, m, "ne") < 0)
        goto done;
    Py_ssize_t n = bs.len / w, total = bo.len / w, o = 0, prev = 0;
    const char *src = bs.buf;
    char *out = bo.buf;
    const int64_t *tr = bt.buf, *ne = bn.buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t t = tr[i], k = ne[i];
        if (t < prev || t >= n || k < 0 || o + (t - prev + 1) + k > total) {
            PyErr_SetString(PyExc_ValueError, "spread: bad group or size");
            goto done;
        }
        memcpy(out + o * w, src + prev * w, (size_t)((t - prev + 1) * w));
        o += t - prev + 1;
        for (int64_t r = 0; r < k; r++, o++)
            memcpy(out + o * w, src + t * w, (size_t)w);
        prev = t + 1;
    }
    if (o + (n - prev) != total) {
        PyErr_SetString(PyExc_ValueError, "spread: out has the wrong size");
        goto done;
    }
    memcpy(out + o * w, src + prev * w, (size_t)((n - prev) * w));
    res = Py_NewRef(Py_None);
done:
    RELEASE_BUFS(&bs, &bt, &bn, &bo);
    return res;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))py_walk, METH_FASTCALL,
     "The call stack over a run of transfers (see the module source)."},
    {"paths", (PyCFunction)(void (*)(void))py_paths, METH_FASTCALL,
     "Call-path hashes, parents first."},
    {"spread", (PyCFunction)(void (*)(void))py_spread, METH_FASTCALL,
     "Items repeated where groups go (see the module source)."},
    ROWS_METHODS,
    KEYS_METHODS,
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
    if (ownbuf_ready() < 0)
        return NULL;
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

/* The branch source's compiled runs: a batch's records between events as
 * branch records (transfers), and the system-call round trips between such
 * runs (trips).  Twin: hwtrace.branches.decoded._Consumer (_vector, and
 * feed_batch's loop through _records, _event and the Tracker's leave and
 * resume); the records are the same bytes (tests/test_branches_trips.py).
 *
 * A system-call-heavy recording is mostly round trips: a run of records
 * ending in a syscall, tracing disabled (TIP.PGD) and enabled again at its
 * fall-through (TIP.PGE).  Done one event at a time in Python, each cost
 * ~15 us -- more than the decoding of the run.  trips does them here while
 * they are plain (the thread stays, no signal handler, no trigger address,
 * no status update or other event between) and hands the rest back.
 * The view decodes with plain_events: most of those events are rows of
 * Batch.plain, read here from their columns (an Event object each cost
 * the decoder more than this loop).
 */
#include "trips.h"

#include <stdint.h>
#include <string.h>

/* what both functions read: a batch's record columns, the kind tables, the
   mask and the thread's identity */
typedef struct {
    const uint64_t *ip, *fall, *end_ip, *tsc;
    const uint8_t *key;
    Py_ssize_t nrec;
    const int16_t *klut;
    const uint8_t *farlut, *allowed;
    const int64_t *delta;
    Py_ssize_t nk;
    const uint64_t *ranges;
    Py_ssize_t nranges;
    PyObject *far, *far_kind;
    int wanted;
    long long pid, tid;
    long ret;
    Py_ssize_t lay[8];
} Ctx;

/* the records made, and a scratch array of kinds */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
    int16_t *kind;
    Py_ssize_t kcap;
} Out;

static int out_reserve(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    char *p = PyMem_Realloc(o->p, cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    o->p = p;
    o->cap = cap;
    return 0;
}

static void out_free(Out *o)
{
    PyMem_Free(o->p);
    PyMem_Free(o->kind);
}

/* Mask.accepts for a wanted thread: the kind allowed, ``addr`` (from, or
   to where from is unknown) inside one of the ranges (none: any) */
static int accepts(const Ctx *c, int k, uint64_t addr)
{
    if (!c->wanted || !c->allowed[k])
        return 0;
    if (!c->nranges)
        return 1;
    for (Py_ssize_t q = 0; q < c->nranges; q++)
        if (addr >= c->ranges[2 * q] && addr < c->ranges[2 * q + 1])
            return 1;
    return 0;
}

/* one record (records.dtype(): pid, tid, kind, from, to, time, depth) */
static int put_rec(const Ctx *c, Out *o, int k, uint64_t frm, uint64_t to,
                   long long time, long long depth)
{
    if (out_reserve(o, c->lay[0]) < 0)
        return -1;
    char *p = o->p + o->len;
    const Py_ssize_t *lay = c->lay;
    int64_t v64;
    uint8_t v8 = (uint8_t)k;
    int32_t v32 = (int32_t)depth;
    memset(p, 0, lay[0]);
    v64 = c->pid;
    memcpy(p + lay[1], &v64, 8);
    v64 = c->tid;
    memcpy(p + lay[2], &v64, 8);
    memcpy(p + lay[3], &v8, 1);
    memcpy(p + lay[4], &frm, 8);
    memcpy(p + lay[5], &to, 8);
    v64 = time;
    memcpy(p + lay[6], &v64, 8);
    memcpy(p + lay[7], &v32, 4);
    o->len += lay[0];
    return 0;
}

/* the record kind the bytes at ``addr`` say (far[addr], else far_kind(addr),
   which fills far); -2: keep the class's */
static int far_of(const Ctx *c, uint64_t addr, long *f)
{
    PyObject *a = PyLong_FromUnsignedLongLong(addr);
    if (!a)
        return -1;
    PyObject *v = PyDict_GetItemWithError(c->far, a);
    if (v)
        Py_INCREF(v);
    else if (!PyErr_Occurred())
        v = PyObject_CallOneArg(c->far_kind, a);
    Py_DECREF(a);
    if (!v)
        return -1;
    *f = PyLong_AsLong(v);
    Py_DECREF(v);
    return (*f == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Transfers [t0, t1) (record r's branch to record r + 1): their records
   appended to o; *depth runs on; ``within``: the first return at depth 0
   is the last branch (its change not counted: *closed).  Each branch's
   time is the last non-zero tsc at or before its record (``last`` before
   any).  *nbr: how many branches there were; *kept: records made. */
static int run(const Ctx *c, Out *o, Py_ssize_t t0, Py_ssize_t t1, long long *depth,
               long long last, int within, int *closed, Py_ssize_t *nbr, Py_ssize_t *kept)
{
    const uint64_t *ip = c->ip, *fall = c->fall, *end_ip = c->end_ip, *tsc = c->tsc;
    Py_ssize_t m = t1 - t0;
    *closed = 0;
    *nbr = 0;
    *kept = 0;
    if (m > o->kcap) {
        int16_t *k = PyMem_Realloc(o->kind, m * sizeof(int16_t));
        if (!k) {
            PyErr_NoMemory();
            return -1;
        }
        o->kind = k;
        o->kcap = m;
    }
    int16_t *kind = o->kind;
    /* kinds: the class's, or the instruction bytes' (far transfers and
       indirect jumps, per address) */
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t r = t0 + j;
        unsigned kk = (unsigned)(c->key[r] | (ip[r + 1] != fall[r])) & 31;
        int16_t k = c->klut[kk];
        if (c->farlut[kk]) {
            long f;
            if (far_of(c, end_ip[r], &f) < 0)
                return -1;
            if (f != -2)
                k = (int16_t)f;
        }
        if (k >= c->nk) {
            PyErr_SetString(PyExc_ValueError, "transfers: a kind outside delta");
            return -1;
        }
        kind[j] = k;
        *nbr += k >= 0;
    }
    if (!*nbr)
        return 0;
    /* the last branch (within: the first return at depth 0) */
    long long d = *depth;
    Py_ssize_t stop = m;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (kind[j] < 0)
            continue;
        if (within && kind[j] == c->ret && d == 0) {
            *closed = 1;
            stop = j + 1;
            break;
        }
        d += c->delta[kind[j]];
    }
    if (out_reserve(o, stop * c->lay[0]) < 0)
        return -1;
    long long cur = last;
    d = *depth;
    for (Py_ssize_t j = 0; j < stop; j++) {
        Py_ssize_t r = t0 + j;
        if (tsc[r])
            cur = (long long)tsc[r];
        if (kind[j] < 0)
            continue;
        int k = kind[j];
        if (accepts(c, k, end_ip[r])) {
            if (put_rec(c, o, k, end_ip[r], ip[r + 1], cur, d) < 0)
                return -1;
            (*kept)++;
        }
        if (!(*closed && j == stop - 1))
            d += c->delta[k];
    }
    *depth = d;
    return 0;
}

/* -- the arguments both take ------------------------------------------------ */

enum { NB = 12 };
typedef struct {
    Py_buffer b[NB];
    int has[NB];
} Bufs;

static void bufs_release(Bufs *B)
{
    for (int k = 0; k < NB; k++)
        if (B->has[k])
            PyBuffer_Release(&B->b[k]);
}

static int get_buf(Bufs *B, int slot, PyObject *o)
{
    if (PyObject_GetBuffer(o, &B->b[slot], PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    B->has[slot] = 1;
    return 0;
}

/* slots: 0 ip, 1 fall, 2 end_ip, 3 key, 4 tsc, 5 klut, 6 farlut, 7 delta,
   8 allowed, 9 ranges, 10 start (trips) */
static int ctx_of(Ctx *c, Bufs *B, PyObject *wanted, PyObject *pid, PyObject *tid,
                  PyObject *layout, PyObject *far, PyObject *far_kind)
{
    c->ip = B->b[0].buf;
    c->fall = B->b[1].buf;
    c->end_ip = B->b[2].buf;
    c->key = B->b[3].buf;
    c->tsc = B->b[4].buf;
    c->klut = B->b[5].buf;
    c->farlut = B->b[6].buf;
    c->delta = B->b[7].buf;
    c->allowed = B->b[8].buf;
    c->ranges = B->b[9].buf;
    c->nrec = B->b[0].len / 8;
    c->nk = B->b[7].len / 8;
    c->nranges = B->b[9].len / 16;
    c->far = far;
    c->far_kind = far_kind;
    if (!PyDict_Check(far)) {
        PyErr_SetString(PyExc_TypeError, "transfers: far is a dict");
        return -1;
    }
    c->wanted = PyObject_IsTrue(wanted);
    c->pid = PyLong_AsLongLong(pid);
    c->tid = PyLong_AsLongLong(tid);
    if (PyErr_Occurred() || c->wanted < 0)
        return -1;
    Py_ssize_t n = c->nrec;
    if (B->b[1].len != n * 8 || B->b[2].len != n * 8 || B->b[3].len != n
            || B->b[4].len != n * 8 || B->b[5].len != 64 || B->b[6].len != 32
            || B->b[8].len != c->nk) {
        PyErr_SetString(PyExc_ValueError, "transfers: bad columns");
        return -1;
    }
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 8) {
        PyErr_SetString(PyExc_TypeError, "transfers: layout is 8 ints");
        return -1;
    }
    static const Py_ssize_t fsz[8] = {0, 8, 8, 1, 8, 8, 8, 4};
    for (int k = 0; k < 8; k++) {
        c->lay[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(layout, k));
        if (PyErr_Occurred())
            return -1;
    }
    for (int k = 1; k < 8; k++)
        if (c->lay[k] < 0 || c->lay[k] + fsz[k] > c->lay[0]) {
            PyErr_SetString(PyExc_ValueError, "transfers: bad layout");
            return -1;
        }
    return 0;
}

/* -- transfers (twin: decoded._Consumer._vector) ----------------------------
 *
 * transfers(ip, fall, end_ip, key, tsc, t0, t1, klut, farlut, delta, far, far_kind,
 *           depth, last, within, allowed, ranges, wanted, pid, tid, ret, layout)
 *   -> (records bytearray, kept, depth, closed, branches)
 *
 * Record r's branch goes to record r + 1's first instruction, for r in
 * [t0, t1): ip, fall, end_ip, tsc uint64 and key uint8 per record (key:
 * class << 2 | indirect << 1; taken is ip[r + 1] != fall[r]).  klut (int16)
 * and farlut (uint8) of 32 map key | taken to the record kind (-1 none)
 * and to "the kind comes from the instruction's bytes": far[addr] (a dict
 * of int) or, where the dict lacks it, far_kind(addr) (which fills it);
 * -2 keeps the class's kind.  delta (int64 per kind): depth change.  The
 * depth before each branch runs from ``depth``; ``within``: the first
 * return at depth 0 is the last branch (its change not counted: closed).
 * Each branch's time is the last non-zero tsc at or before its record
 * (``last`` before any).  Kept: ``wanted``, the kind allowed (uint8 per
 * kind), from inside one of ``ranges`` (uint64 lo, hi pairs; none: all).
 * ``layout``: (itemsize, offsets of pid, tid, kind, from, to, time, depth)
 * of records.dtype().  Returns the kept records, how many, the depth
 * after the run, whether it closed, and how many branches there were.
 */
PyObject *bt_transfers(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 22) {
        PyErr_SetString(PyExc_TypeError, "transfers takes 22 arguments");
        return NULL;
    }
    enum { A_IP, A_FALL, A_END, A_KEY, A_TSC, A_T0, A_T1, A_KLUT, A_FARLUT, A_DELTA,
           A_FAR, A_FARKIND, A_DEPTH, A_LAST, A_WITHIN, A_ALLOWED, A_RANGES,
           A_WANTED, A_PID, A_TID, A_RET, A_LAYOUT };
    static const int slot_arg[] = {A_IP, A_FALL, A_END, A_KEY, A_TSC, A_KLUT, A_FARLUT,
                                   A_DELTA, A_ALLOWED, A_RANGES};
    Bufs B = {.has = {0}};
    Out o = {0};
    Ctx c;
    PyObject *res = NULL, *out = NULL;
    for (int k = 0; k < 10; k++)
        if (get_buf(&B, k, args[slot_arg[k]]) < 0)
            goto done;
    if (ctx_of(&c, &B, args[A_WANTED], args[A_PID], args[A_TID], args[A_LAYOUT],
               args[A_FAR], args[A_FARKIND]) < 0)
        goto done;
    Py_ssize_t t0 = PyLong_AsSsize_t(args[A_T0]), t1 = PyLong_AsSsize_t(args[A_T1]);
    long long depth = PyLong_AsLongLong(args[A_DEPTH]);
    long long last = PyLong_AsLongLong(args[A_LAST]);
    int within = PyObject_IsTrue(args[A_WITHIN]);
    c.ret = PyLong_AsLong(args[A_RET]);
    if (PyErr_Occurred() || within < 0)
        goto done;
    if (t0 < 0 || t1 < t0 || t1 >= c.nrec + (t1 == t0)) {
        PyErr_SetString(PyExc_ValueError, "transfers: bad columns or run");
        goto done;
    }
    int closed;
    Py_ssize_t nbr, kept;
    if (run(&c, &o, t0, t1, &depth, last, within, &closed, &nbr, &kept) < 0)
        goto done;
    out = PyByteArray_FromStringAndSize(o.p ? o.p : "", o.len);
    if (!out)
        goto done;
    res = Py_BuildValue("(OnLNn)", out, kept, depth, PyBool_FromLong(closed), nbr);
done:
    bufs_release(&B);
    out_free(&o);
    Py_XDECREF(out);
    return res;
}

/* -- the switch timeline's clock (twin: analysis.switches.SwitchTimeline) --- */

typedef struct {
    int has_t, has_rate, on, counted, fixed, has_next;
    long long t, n, next;
    double rate;
} Clock;

/* times are compared as Python does (int with float: exactly) while they
   are exact as doubles */
#define EXACT (1LL << 53)

/* SwitchTimeline.time(n, tsc) */
static void clock_time(Clock *k, long long n, long long tsc)
{
    if (k->has_t && tsc == k->t)
        return;
    if (k->counted && k->has_t) {
        if (k->on)
            return;
        double est = (double)k->t + (double)(n - k->n) * k->rate;
        if ((double)tsc <= est)
            return;
    }
    if (k->has_t && n > k->n && tsc > k->t && k->on && !k->fixed) {
        k->rate = (double)(tsc - k->t) / (double)(n - k->n);
        k->has_rate = 1;
    }
    k->t = tsc;
    k->n = n;
    k->has_t = 1;
}

/* SwitchTimeline.resumes at instruction index n gives the running thread,
   applying no switch, when that thread stopped right where tracing resumes:
   no switch is due by the last known time or by the estimate of now */
static int clock_stays(const Clock *k, long long n)
{
    if (!k->has_next)
        return 1;
    if (k->has_t && k->next <= k->t)
        return 0;
    if (k->has_t && k->has_rate) {
        double est = (double)k->t + (double)(n - k->n) * k->rate;
        if ((double)k->next <= est)
            return 0;
    }
    return 1;
}

/* -- trips (twin: decoded._Consumer.feed_batch's loop) ----------------------
 *
 * trips(items, k, rows, kr, r, ip, fall, end_ip, key, tsc, start, klut, farlut,
 *       delta, far, far_kind, sys_size, pend_kind, allowed, ranges, wanted, pid,
 *       tid, codes, layout, plain, state)
 *   -> None (nothing done) or
 *      (k, kr, r, depth, time, clock, records bytearray, exit_at, pend_pc,
 *       pend_time)
 *
 * Called where the thread has just come back from untraced code (no
 * transfer pending, its exit consumed, tracing on, no trigger address):
 * items[k:] are the batch's items (index, offset, Event ...) still to go
 * and rows[kr:] its plain rows (hwtrace.flow.plain.PLAIN, a buffer; none:
 * empty) -- in one order, row j at place pos[j] of items and rows
 * together, so the next place k + kr is row kr where its pos says so,
 * else item k -- and records [r, ...) the ones still to go.  It goes through them as the
 * twin does -- the runs of records up to each item's index, each event --
 * while they are: a PSB+'s events (cbr, exec_mode, a status update of an
 * enable: they tell the time), a disable right after a system call
 * (sys_size(addr): the instruction's size, negative if it is none), the
 * enable at its fall-through with the same thread on (the clock says no
 * switch came before).  A run split by a PSB+ resolves its pending branch
 * by pend_kind(record, to) (the record kind, -1 none, -2 nothing pending).
 * It stops before anything else and returns the state after the last
 * enable it took (k, r: the next item and record).
 * Columns as for transfers, plus start (int64, one more: each record's
 * first instruction index).  codes: (return, syscall, sysret) kind codes.
 * plain: the rows' layout (itemsize, offsets of index, tsc, ip, pos, type,
 * flags), their type codes (enabled, disabled, cbr, exec_mode) and flag
 * bits (ip_suppressed, status_update, has_tsc).
 * state: (depth, time or None, clock or None); clock: (t or None, n,
 * rate or None, on, counted, fixed, next switch time or None).  Returns
 * the state where it stopped (clock: (t or None, n, rate or None, on) or
 * None), the records, and the thread's exit_at, pend_pc and pend_time
 * (its last syscall).
 */

static PyObject *S_type, *S_su, *S_ipsup, *S_has_tsc, *S_tsc, *S_ip;

static int names(void)
{
    if (S_type)
        return 0;
#define NAME(v, s) if (!(v = PyUnicode_InternFromString(s))) return -1
    NAME(S_su, "status_update");
    NAME(S_ipsup, "ip_suppressed");
    NAME(S_has_tsc, "has_tsc");
    NAME(S_tsc, "tsc");
    NAME(S_ip, "ip");
    NAME(S_type, "type");
#undef NAME
    return 0;
}

/* what the loop reads of an event: its type (E_*), flags, tsc and ip */
enum { E_NONE, E_DISABLED, E_ENABLED, E_TIME };
typedef struct {
    int type, su, ipsup, has_tsc;
    long long tsc;
    uint64_t ip;
} Ev;

static int attr_bool(PyObject *o, PyObject *name, int *v)
{
    PyObject *a = PyObject_GetAttr(o, name);
    if (!a)
        return -1;
    *v = PyObject_IsTrue(a);
    Py_DECREF(a);
    return *v < 0 ? -1 : 0;
}

/* item ``it`` ((index, offset, item)): e->type E_NONE where the loop leaves
   it to the twin (not an event, or one that does more than tell the time:
   an overflow, an async disable, a status update other than a PSB+'s);
   -1 on error */
static int read_ev(PyObject *it, Py_ssize_t *index, Ev *e)
{
    e->type = E_NONE;
    if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 3)
        return 0;
    PyObject *ev = PyTuple_GET_ITEM(it, 2);
    *index = PyLong_AsSsize_t(PyTuple_GET_ITEM(it, 0));
    if (*index == -1 && PyErr_Occurred())
        return -1;
    PyObject *t = PyObject_GetAttr(ev, S_type);
    if (!t) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int type = E_NONE;
    if (PyUnicode_Check(t)) {
        if (PyUnicode_CompareWithASCIIString(t, "disabled") == 0)
            type = E_DISABLED;
        else if (PyUnicode_CompareWithASCIIString(t, "enabled") == 0)
            type = E_ENABLED;
        else if (PyUnicode_CompareWithASCIIString(t, "cbr") == 0
                 || PyUnicode_CompareWithASCIIString(t, "exec_mode") == 0)
            type = E_TIME;
    }
    Py_DECREF(t);
    if (type == E_NONE || !PyObject_HasAttr(ev, S_su))
        return 0;
    if (attr_bool(ev, S_su, &e->su) < 0 || attr_bool(ev, S_ipsup, &e->ipsup) < 0
            || attr_bool(ev, S_has_tsc, &e->has_tsc) < 0)
        return -1;
    PyObject *v = PyObject_GetAttr(ev, S_tsc);
    if (!v)
        return -1;
    e->tsc = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (e->tsc == -1 && PyErr_Occurred())
        return -1;
    v = PyObject_GetAttr(ev, S_ip);
    if (!v)
        return -1;
    e->ip = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (e->ip == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    if (e->has_tsc && (e->tsc < 0 || e->tsc >= EXACT))
        return 0;
    e->type = type;
    return 0;
}

/* PLAIN rows: hwtrace.flow.plain's layout, type codes and flag bits */
typedef struct {
    const char *p;
    Py_ssize_t n, size, o_index, o_tsc, o_ip, o_pos, o_type, o_flags;
    long t_en, t_dis, t_cbr, t_mode, f_ipsup, f_su, f_tsc;
} Rows;

static int rows_of(Rows *w, const Py_buffer *b, PyObject *plain)
{
    if (!PyTuple_Check(plain) || PyTuple_GET_SIZE(plain) != 14) {
        PyErr_SetString(PyExc_TypeError, "trips: plain is 14 ints");
        return -1;
    }
    Py_ssize_t v[14];
    for (int k = 0; k < 14; k++) {
        v[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(plain, k));
        if (v[k] == -1 && PyErr_Occurred())
            return -1;
    }
    static const Py_ssize_t fsz[7] = {0, 8, 8, 8, 4, 1, 1};
    for (int k = 1; k < 7; k++)
        if (v[0] <= 0 || v[k] < 0 || v[k] + fsz[k] > v[0]) {
            PyErr_SetString(PyExc_ValueError, "trips: bad plain layout");
            return -1;
        }
    if (b->len % v[0]) {
        PyErr_SetString(PyExc_ValueError, "trips: bad rows");
        return -1;
    }
    w->p = b->buf;
    w->size = v[0];
    w->n = b->len / v[0];
    w->o_index = v[1];
    w->o_tsc = v[2];
    w->o_ip = v[3];
    w->o_pos = v[4];
    w->o_type = v[5];
    w->o_flags = v[6];
    w->t_en = v[7];
    w->t_dis = v[8];
    w->t_cbr = v[9];
    w->t_mode = v[10];
    w->f_ipsup = v[11];
    w->f_su = v[12];
    w->f_tsc = v[13];
    return 0;
}

static Py_ssize_t row_pos(const Rows *w, Py_ssize_t j)
{
    uint32_t v;
    memcpy(&v, w->p + j * w->size + w->o_pos, 4);
    return (Py_ssize_t)v;
}

/* row j as read_ev reads an item: every row is an Event's */
static void read_row(const Rows *w, Py_ssize_t j, Py_ssize_t *index, Ev *e)
{
    const char *p = w->p + j * w->size;
    int64_t i;
    uint64_t tsc;
    uint8_t t = (uint8_t)p[w->o_type], f = (uint8_t)p[w->o_flags];
    memcpy(&i, p + w->o_index, 8);
    memcpy(&tsc, p + w->o_tsc, 8);
    memcpy(&e->ip, p + w->o_ip, 8);
    *index = (Py_ssize_t)i;
    e->su = (f & w->f_su) != 0;
    e->ipsup = (f & w->f_ipsup) != 0;
    e->has_tsc = (f & w->f_tsc) != 0;
    e->tsc = (long long)tsc;
    e->type = t == w->t_dis ? E_DISABLED : t == w->t_en ? E_ENABLED
        : (t == w->t_cbr || t == w->t_mode) ? E_TIME : E_NONE;
    if (e->type != E_NONE && e->has_tsc && tsc >= EXACT)
        e->type = E_NONE;
}

/* the thread's state the loop carries (committed after each round trip) */
typedef struct {
    long long depth, time, pend_pc, pend_time;
    uint64_t exit_at;
    int has_time, has_pend_time, has_clock;
    Clock clk;
} State;

/* _Consumer._time(a, r): a record's non-zero tsc is the time now */
static int rec_time(const Ctx *c, const int64_t *start, State *s, Py_ssize_t r)
{
    uint64_t v = c->tsc[r];
    if (!v)
        return 0;
    if (v >= EXACT)
        return 1;
    s->time = (long long)v;
    s->has_time = 1;
    if (s->has_clock)
        clock_time(&s->clk, start[r], (long long)v);
    return 0;
}

static PyObject *opt_ll(int has, long long v)
{
    if (has)
        return PyLong_FromLongLong(v);
    Py_RETURN_NONE;
}

PyObject *bt_trips(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 27) {
        PyErr_SetString(PyExc_TypeError, "trips takes 27 arguments");
        return NULL;
    }
    enum { A_ITEMS, A_K, A_ROWS, A_KR, A_R, A_IP, A_FALL, A_END, A_KEY, A_TSC, A_START, A_KLUT,
           A_FARLUT, A_DELTA, A_FAR, A_FARKIND, A_SYSSIZE, A_PENDKIND, A_ALLOWED, A_RANGES,
           A_WANTED, A_PID, A_TID, A_CODES, A_LAYOUT, A_PLAIN, A_STATE };
    static const int slot_arg[] = {A_IP, A_FALL, A_END, A_KEY, A_TSC, A_KLUT, A_FARLUT,
                                   A_DELTA, A_ALLOWED, A_RANGES, A_START, A_ROWS};
    Bufs B = {.has = {0}};
    Out o = {0};
    Ctx c;
    PyObject *res = NULL, *out = NULL;
    if (names() < 0)
        return NULL;
    for (int k = 0; k < 12; k++)
        if (get_buf(&B, k, args[slot_arg[k]]) < 0)
            goto done;
    if (ctx_of(&c, &B, args[A_WANTED], args[A_PID], args[A_TID], args[A_LAYOUT],
               args[A_FAR], args[A_FARKIND]) < 0)
        goto done;
    const int64_t *start = B.b[10].buf;
    Rows rows;
    if (rows_of(&rows, &B.b[11], args[A_PLAIN]) < 0)
        goto done;
    PyObject *items = args[A_ITEMS], *sys_size = args[A_SYSSIZE],
             *pend_kind = args[A_PENDKIND];
    long code_sys, code_sysret;
    if (!PyList_Check(items) || !PyTuple_Check(args[A_CODES])
            || PyTuple_GET_SIZE(args[A_CODES]) != 3 || !PyTuple_Check(args[A_STATE])
            || PyTuple_GET_SIZE(args[A_STATE]) != 3 || B.b[10].len != (c.nrec + 1) * 8) {
        PyErr_SetString(PyExc_TypeError, "trips: bad items, codes, state or start");
        goto done;
    }
    c.ret = PyLong_AsLong(PyTuple_GET_ITEM(args[A_CODES], 0));
    code_sys = PyLong_AsLong(PyTuple_GET_ITEM(args[A_CODES], 1));
    code_sysret = PyLong_AsLong(PyTuple_GET_ITEM(args[A_CODES], 2));
    Py_ssize_t k = PyLong_AsSsize_t(args[A_K]), r = PyLong_AsSsize_t(args[A_R]);
    Py_ssize_t kr = PyLong_AsSsize_t(args[A_KR]);
    if (PyErr_Occurred())
        goto done;
    if (code_sys < 0 || code_sys >= c.nk || code_sysret < 0 || code_sysret >= c.nk
            || k < 0 || kr < 0 || kr > rows.n || r < 0 || r > c.nrec) {
        PyErr_SetString(PyExc_ValueError, "trips: bad codes or position");
        goto done;
    }
    /* the state given */
    State s = {0};
    PyObject *st = args[A_STATE], *v;
    s.depth = PyLong_AsLongLong(PyTuple_GET_ITEM(st, 0));
    v = PyTuple_GET_ITEM(st, 1);
    s.has_time = v != Py_None;
    s.time = s.has_time ? PyLong_AsLongLong(v) : 0;
    PyObject *ck = PyTuple_GET_ITEM(st, 2);
    s.has_clock = ck != Py_None;
    if (s.has_clock) {
        if (!PyTuple_Check(ck) || PyTuple_GET_SIZE(ck) != 7) {
            PyErr_SetString(PyExc_TypeError, "trips: clock is 7 values");
            goto done;
        }
        Clock *q = &s.clk;
        v = PyTuple_GET_ITEM(ck, 0);
        q->has_t = v != Py_None;
        q->t = q->has_t ? PyLong_AsLongLong(v) : 0;
        q->n = PyLong_AsLongLong(PyTuple_GET_ITEM(ck, 1));
        v = PyTuple_GET_ITEM(ck, 2);
        q->has_rate = v != Py_None;
        q->rate = q->has_rate ? PyFloat_AsDouble(v) : 0.0;
        q->on = PyObject_IsTrue(PyTuple_GET_ITEM(ck, 3));
        q->counted = PyObject_IsTrue(PyTuple_GET_ITEM(ck, 4));
        q->fixed = PyObject_IsTrue(PyTuple_GET_ITEM(ck, 5));
        v = PyTuple_GET_ITEM(ck, 6);
        q->has_next = v != Py_None;
        q->next = q->has_next ? PyLong_AsLongLong(v) : 0;
        if (PyErr_Occurred())
            goto done;
        /* beyond exact doubles, or a counted clock without its rate: the twin */
        if ((q->has_t && (q->t < 0 || q->t >= EXACT)) || (q->has_next && q->next >= EXACT)
                || (q->counted && !q->has_rate) || q->n < 0 || q->n >= EXACT)
            Py_RETURN_NONE;
    }
    if (PyErr_Occurred())
        goto done;

    Py_ssize_t nitems = PyList_GET_SIZE(items), done_k = k, done_kr = kr;
    /* system call sites' sizes (a program makes its calls from few; find
       from some dozens: 8 slots had ~100 k calls of sys_size on it) */
    enum { NSZ = 64 };
    uint64_t sz_addr[NSZ] = {0};
    long sz_val[NSZ];
    int sz_has[NSZ] = {0};
    /* the loop's own state since the last commit (after an enable): the
       record whose branch is pending (pr, its time), tracing off (a
       syscall's disable seen, its enable not yet) */
    State w = s;
    Py_ssize_t wr = r, pr = -1, mark = 0;
    int off = 0;
    long long pend_time = 0;
    int has_pend_time = 0;
    for (Py_ssize_t q = k, qr = kr, nq, nqr; ; q = nq, qr = nqr) {
        /* the next place: row qr, or item q */
        Ev e;
        Py_ssize_t i;
        if (qr < rows.n && row_pos(&rows, qr) < q + qr) {
            PyErr_SetString(PyExc_ValueError, "trips: rows out of place");
            goto done;
        }
        if (qr < rows.n && row_pos(&rows, qr) == q + qr) {
            read_row(&rows, qr, &i, &e);
            nq = q;
            nqr = qr + 1;
        } else if (q < nitems) {
            if (read_ev(PyList_GET_ITEM(items, q), &i, &e) < 0)
                goto done;
            nq = q + 1;
            nqr = qr;
        } else
            break;
        if (e.type == E_NONE || i < wr || i > c.nrec
                || (e.su && e.type != E_TIME && !(e.type == E_ENABLED && !off)))
            break;
        if (i > wr) {
            /* _records(a, wr, i): the pending transfer lands on its first
               record, the transfers between its records, its last
               record's branch pending */
            if (off)
                break;
            Py_ssize_t r0 = wr, r1 = i;
            if (rec_time(&c, start, &w, r0))
                break;
            if (pr >= 0) {
                PyObject *got = PyObject_CallFunction(pend_kind, "nK", pr,
                                                      (unsigned long long)c.ip[r0]);
                if (!got)
                    goto done;
                long kd = PyLong_AsLong(got);
                Py_DECREF(got);
                if (kd == -1 && PyErr_Occurred())
                    goto done;
                if (kd >= c.nk)
                    break;
                if (kd >= 0) {
                    if (accepts(&c, (int)kd, c.end_ip[pr])
                            && put_rec(&c, &o, (int)kd, c.end_ip[pr], c.ip[r0],
                                       has_pend_time ? pend_time : -1, w.depth) < 0)
                        goto done;
                    w.depth += c.delta[kd];
                }
            }
            if (r1 - r0 > 1) {
                int closed;
                Py_ssize_t nbr, kept;
                if (run(&c, &o, r0, r1 - 1, &w.depth, w.has_time ? w.time : -1, 0,
                        &closed, &nbr, &kept) < 0)
                    goto done;
                if (rec_time(&c, start, &w, r1 - 2) || rec_time(&c, start, &w, r1 - 1))
                    break;
            }
            pr = r1 - 1;
            pend_time = w.time;
            has_pend_time = w.has_time;
            wr = i;
        }
        long long n = start[i];
        if (e.has_tsc) {
            w.time = e.tsc;
            w.has_time = 1;
            if (w.has_clock)
                clock_time(&w.clk, n, e.tsc);
        }
        if (e.type == E_TIME || e.su)
            continue;           /* a PSB+'s: the time told, nothing else */
        if (e.type == E_DISABLED) {
            /* the pending syscall goes into the kernel */
            if (off || pr < 0 || !(c.key[pr] >> 2))
                break;
            uint64_t frm = c.end_ip[pr];
            int slot = (int)((frm ^ (frm >> 6) ^ (frm >> 12)) & (NSZ - 1));
            if (!sz_has[slot] || sz_addr[slot] != frm) {
                PyObject *a = PyLong_FromUnsignedLongLong(frm);
                if (!a)
                    goto done;
                PyObject *sz = PyObject_CallOneArg(sys_size, a);
                Py_DECREF(a);
                if (!sz)
                    goto done;
                sz_val[slot] = PyLong_AsLong(sz);
                Py_DECREF(sz);
                if (sz_val[slot] == -1 && PyErr_Occurred())
                    goto done;
                sz_addr[slot] = frm;
                sz_has[slot] = 1;
            }
            if (sz_val[slot] < 0)
                break;
            w.clk.on = 0;
            if (accepts(&c, (int)code_sys, frm)
                    && put_rec(&c, &o, (int)code_sys, frm, e.ipsup ? 0 : e.ip,
                               has_pend_time ? pend_time : -1, w.depth) < 0)
                goto done;
            w.exit_at = frm + (uint64_t)sz_val[slot];
            w.pend_pc = (long long)frm;
            w.pend_time = pend_time;
            w.has_pend_time = has_pend_time;
            pr = -1;
            off = 1;
            continue;
        }
        /* the enable at the fall-through: the same thread, back (sysret) */
        if (!off)
            break;
        w.clk.on = 1;
        if (e.ip != w.exit_at || (w.has_clock && !clock_stays(&w.clk, n)))
            break;
        if (accepts(&c, (int)code_sysret, e.ip)
                && put_rec(&c, &o, (int)code_sysret, 0, e.ip,
                           w.has_time ? w.time : -1, w.depth) < 0)
            goto done;
        off = 0;
        /* commit */
        s = w;
        k = nq;
        kr = nqr;
        r = wr;
        mark = o.len;
    }
    o.len = mark;
    if (k == done_k && kr == done_kr) {
        res = Py_None;
        Py_INCREF(res);
        goto done;
    }
    out = PyByteArray_FromStringAndSize(o.p ? o.p : "", o.len);
    if (!out)
        goto done;
    PyObject *clock;
    if (s.has_clock) {
        PyObject *rate = s.clk.has_rate ? PyFloat_FromDouble(s.clk.rate)
                                        : (Py_INCREF(Py_None), Py_None);
        clock = rate ? Py_BuildValue("(NLNN)", opt_ll(s.clk.has_t, s.clk.t), s.clk.n,
                                     rate, PyBool_FromLong(s.clk.on)) : NULL;
    } else {
        clock = Py_None;
        Py_INCREF(clock);
    }
    if (!clock)
        goto done;
    res = Py_BuildValue("(nnnLNNOKKN)", k, kr, r, s.depth, opt_ll(s.has_time, s.time), clock,
                        out, (unsigned long long)s.exit_at, (unsigned long long)s.pend_pc,
                        opt_ll(s.has_pend_time, s.pend_time));
done:
    bufs_release(&B);
    out_free(&o);
    Py_XDECREF(out);
    return res;
}

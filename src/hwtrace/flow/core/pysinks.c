/* Sinks that build Python results: see pysinks.h. */
#include "pysinks.h"

struct pyrefs PYREFS;

/* attribute names: the common ones, then the optional ones by EA_* */
enum { A_IP_SUPPRESSED, A_STATUS_UPDATE, A_HAS_TSC, A_TSC, A_LOST_MTC,
       A_LOST_CYC, A_IP, A_AT, A_FROM, A_TO, A_STAMPED, A_OPT };

static const char *const ATTR_NAMES[A_OPT + EA_COUNT] = {
    "ip_suppressed", "status_update", "has_tsc", "tsc", "lost_mtc",
    "lost_cyc", "ip", "at", "from_", "to", "stamped",
    /* EA_* order */
    "cr3", "non_root", "mode", "speculative", "aborted", "base", "hints",
    "ext", "state", "sub_state", "hw", "last", "deepest", "interrupt",
    "store", "autonomous", "size", "payload", "ratio", "resumed", "iflag",
    "vector", "has_cr2", "cr2", "has_vector", "vmxr", "has_vmxr", "vmxq",
    "has_vmxq", "trbv", "icnt", "icntv", "mult", "bind", "follows"};

/* hwtrace.pt.packets type names by PT_K_* */
static const char *const PACKET_NAMES[PT_K_COUNT] = {
    "pad", "psb", "psbend", "ovf", "stop", "tnt8", "tnt64", "tip",
    "tip.pge", "tip.pgd", "fup", "mode.exec", "mode.tsx", "pip", "tsc",
    "cbr", "tma", "mtc", "cyc", "vmcs", "mnt", "exstop", "mwait", "pwre",
    "pwrx", "ptw", "cfe", "evd", "trig", "invalid"};

static PyObject *intern(const char *s)
{
    return PyUnicode_InternFromString(s);
}

int pyrefs_init(void)
{
    static const char *const KINDS[3] = {"sync error", "error",
                                          "resync error"};
    static const char *const STATUSES[2] = {"end_of_trace", "resynced"};
    static const char *const MODES[3] = {"16bit", "32bit", "64bit"};
    static const char *const BINDS[3] = {"", "ip", "insn"};
    PyObject *m = PyImport_ImportModule("hwtrace.flow.events");
    if (!m)
        return -1;
    PYREFS.event_cls = PyObject_GetAttrString(m, "Event");
    Py_DECREF(m);
    if (!PYREFS.event_cls)
        return -1;
    for (int i = 0; i < EV_NTYPES; i++)
        if (!(PYREFS.ev_names[i] = intern(EV_NAMES[i])))
            return -1;
    for (int i = 1; i < E_NCODES; i++)
        if (!(PYREFS.codes[i] = intern(core_errstr(i))))
            return -1;
    for (int i = 0; i < 3; i++)
        if (!(PYREFS.kinds[i] = intern(KINDS[i])) ||
            !(PYREFS.modes[i] = intern(MODES[i])) ||
            !(PYREFS.binds[i] = intern(BINDS[i])))
            return -1;
    for (int i = 0; i < 2; i++)
        if (!(PYREFS.statuses[i] = intern(STATUSES[i])))
            return -1;
    for (int i = 0; i < PT_K_COUNT; i++)
        if (!(PYREFS.kinds_pt[i] = intern(PACKET_NAMES[i])))
            return -1;
    for (int i = 0; i < A_OPT + EA_COUNT; i++)
        if (!(PYREFS.attr[i] = intern(ATTR_NAMES[i])))
            return -1;
    return 0;
}

static int set(PyObject *o, int a, PyObject *v)
{
    if (!v)
        return -1;
    int r = PyObject_SetAttr(o, PYREFS.attr[a], v);
    Py_DECREF(v);
    return r;
}

static PyObject *u64(uint64_t v)
{
    return PyLong_FromUnsignedLongLong(v);
}

static PyObject *flag(int v)
{
    return PyBool_FromLong(v);
}

static PyObject *mode_obj(int mode)
{
    PyObject *o = mode >= 0 && mode < 3 ? PYREFS.modes[mode] : Py_None;
    Py_INCREF(o);
    return o;
}

static PyObject *opt_value(const struct event *ev, int ea)
{
    switch (ea) {
    case EA_CR3: return u64(ev->cr3);
    case EA_NON_ROOT: return flag(ev->non_root);
    case EA_MODE: return mode_obj(ev->mode);
    case EA_SPECULATIVE: return flag(ev->speculative);
    case EA_ABORTED: return flag(ev->aborted);
    case EA_BASE: return u64(ev->base);
    case EA_HINTS: return u64(ev->hints);
    case EA_EXT: return u64(ev->ext);
    case EA_STATE: return u64(ev->state);
    case EA_SUB_STATE: return u64(ev->sub_state);
    case EA_HW: return flag(ev->hw);
    case EA_LAST: return u64(ev->last);
    case EA_DEEPEST: return u64(ev->deepest);
    case EA_INTERRUPT: return flag(ev->interrupt);
    case EA_STORE: return flag(ev->store);
    case EA_AUTONOMOUS: return flag(ev->autonomous);
    case EA_SIZE: return u64(ev->size);
    case EA_PAYLOAD: return u64(ev->payload);
    case EA_RATIO: return u64(ev->ratio);
    case EA_RESUMED: return flag(ev->resumed);
    case EA_IFLAG: return flag(ev->iflag);
    case EA_VECTOR: return u64(ev->vector);
    case EA_HAS_CR2: return flag(ev->has_cr2);
    case EA_CR2: return u64(ev->cr2);
    case EA_HAS_VECTOR: return flag(ev->has_vector);
    case EA_VMXR: return u64(ev->vmxr);
    case EA_HAS_VMXR: return flag(ev->has_vmxr);
    case EA_VMXQ: return u64(ev->vmxq);
    case EA_HAS_VMXQ: return flag(ev->has_vmxq);
    case EA_TRBV: return u64(ev->trbv);
    case EA_ICNT: return u64(ev->icnt);
    case EA_ICNTV: return flag(ev->icntv);
    case EA_MULT: return flag(ev->mult);
    case EA_BIND: {
        PyObject *o = PYREFS.binds[ev->bind < 3 ? ev->bind : 0];
        Py_INCREF(o);
        return o;
    }
    case EA_FOLLOWS: {
        PyObject *o = ev->follows >= 0 && ev->follows < PT_K_COUNT ?
                      PYREFS.kinds_pt[ev->follows] : Py_None;
        Py_INCREF(o);
        return o;
    }
    }
    Py_RETURN_NONE;
}

PyObject *event_to_py(const struct event *ev)
{
    PyObject *o = PyObject_CallOneArg(PYREFS.event_cls,
                                      PYREFS.ev_names[ev->type]);
    if (!o)
        return NULL;
    if ((ev->ip_suppressed && set(o, A_IP_SUPPRESSED, flag(1)) < 0) ||
        (ev->status_update && set(o, A_STATUS_UPDATE, flag(1)) < 0) ||
        (ev->has_tsc && set(o, A_HAS_TSC, flag(1)) < 0) ||
        (ev->tsc && set(o, A_TSC, u64(ev->tsc)) < 0) ||
        (ev->lost_mtc && set(o, A_LOST_MTC, u64(ev->lost_mtc)) < 0) ||
        (ev->lost_cyc && set(o, A_LOST_CYC, u64(ev->lost_cyc)) < 0) ||
        (ev->ip && set(o, A_IP, u64(ev->ip)) < 0) ||
        (ev->at && set(o, A_AT, u64(ev->at)) < 0) ||
        (ev->from && set(o, A_FROM, u64(ev->from)) < 0) ||
        (ev->to && set(o, A_TO, u64(ev->to)) < 0) ||
        (ev->stamped && set(o, A_STAMPED, flag(1)) < 0))
        goto fail;
    for (int ea = 0; ea < EA_COUNT; ea++)
        if (((ev->set >> ea) & 1) && set(o, A_OPT + ea, opt_value(ev, ea)) < 0)
            goto fail;
    return o;
fail:
    Py_DECREF(o);
    return NULL;
}

/* -- batches -------------------------------------------------------------------- */

static int batch_record(void *ctx, const struct rec *r, const uint8_t *insns)
{
    struct batch_sink *b = ctx;
    TRY(bb_reserve(&b->blocks, BLOCK_REC));
    uint8_t *p = b->blocks.p + b->blocks.n;
    uint64_t offset = (uint64_t)r->offset;
    uint64_t tsc = r->have_tsc ? r->tsc : 0;
    uint32_t n = r->ninsn;
    memcpy(p, &r->ip, 8);
    memcpy(p + 8, &r->end_ip, 8);
    memcpy(p + 16, &offset, 8);
    memcpy(p + 24, &tsc, 8);
    memcpy(p + 32, &n, 4);
    p[36] = r->iclass;
    p[37] = r->size;
    p[38] = (uint8_t)(r->mode + 1);
    p[39] = (uint8_t)((r->spec ? RF_SPECULATIVE : 0) |
                      (r->trunc ? RF_TRUNCATED : 0) |
                      (r->indirect ? RF_INDIRECT : 0));
    b->blocks.n += BLOCK_REC;
    b->nrec++;
    if (b->want_insns && insns) {
        size_t sz = (size_t)n * INSN_REC;
        TRY(bb_reserve(&b->insns, sz));
        memcpy(b->insns.p + b->insns.n, insns, sz);
        b->insns.n += sz;
    }
    return 0;
}

int batch_add_item(struct batch_sink *b, ptrdiff_t offset, PyObject *item)
{
    if (!item)
        return -E_PYERR;
    PyObject *t = Py_BuildValue("(KnN)", (unsigned long long)b->nrec,
                                (Py_ssize_t)offset, item);
    if (!t)
        return -E_PYERR;
    int r = PyList_Append(b->items, t);
    Py_DECREF(t);
    b->nitems++;
    return r < 0 ? -E_PYERR : 0;
}

/* the optional attributes a row carries */
#define PLAIN_SET ((uint64_t)1 << EA_RESUMED | (uint64_t)1 << EA_FOLLOWS | \
                   (uint64_t)1 << EA_MODE | (uint64_t)1 << EA_RATIO)

/* whether ev's Event is told exactly by a row */
static int is_plain(const struct event *ev)
{
    return !(ev->set & ~PLAIN_SET) && !ev->lost_mtc && !ev->lost_cyc &&
           !ev->at && !ev->from && !ev->to;
}

static int plain_row(struct batch_sink *b, const struct event *ev,
                     ptrdiff_t offset)
{
    TRY(bb_reserve(&b->rows, PLAIN_REC));
    uint8_t *p = b->rows.p + b->rows.n;
    memset(p, 0, PLAIN_REC);
    int64_t off = (int64_t)offset;
    uint64_t ratio = EV_HAS(ev, RATIO) ? ev->ratio : 0;
    uint32_t pos = b->nitems++;
    memcpy(p, &b->nrec, 8);
    memcpy(p + 8, &off, 8);
    memcpy(p + 16, &ev->tsc, 8);
    memcpy(p + 24, &ev->ip, 8);
    memcpy(p + 32, &ratio, 8);
    memcpy(p + 40, &pos, 4);
    p[44] = ev->type;
    p[45] = (uint8_t)((ev->ip_suppressed ? PF_IP_SUPPRESSED : 0) |
                      (ev->status_update ? PF_STATUS_UPDATE : 0) |
                      (ev->has_tsc ? PF_HAS_TSC : 0) |
                      (ev->stamped ? PF_STAMPED : 0) |
                      (ev->resumed ? PF_RESUMED : 0));
    p[46] = (uint8_t)((EV_HAS(ev, RESUMED) ? PO_RESUMED : 0) |
                      (EV_HAS(ev, FOLLOWS) ? PO_FOLLOWS : 0) |
                      (EV_HAS(ev, MODE) ? PO_MODE : 0) |
                      (EV_HAS(ev, RATIO) ? PO_RATIO : 0));
    p[47] = (uint8_t)(EV_HAS(ev, MODE) ? ev->mode : -1);
    p[48] = (uint8_t)(EV_HAS(ev, FOLLOWS) ? ev->follows : -1);
    b->rows.n += PLAIN_REC;
    return 0;
}

static int batch_event(void *ctx, const struct event *ev, ptrdiff_t offset)
{
    struct batch_sink *b = ctx;
    if (b->plain && is_plain(ev)) {
        Py_CLEAR(b->next_event);        /* the row tells the same */
        return plain_row(b, ev, offset);
    }
    PyObject *o = b->next_event;
    b->next_event = NULL;
    if (!o)
        o = event_to_py(ev);
    return batch_add_item(b, offset, o);
}

static PyObject *code_obj(int code)
{
    PyObject *o = code > 0 && code < E_NCODES ? PYREFS.codes[code]
                                               : PYREFS.codes[E_INTERNAL];
    Py_INCREF(o);
    return o;
}

static PyObject *error_item(int kind, ptrdiff_t offset, uint64_t ip, int code)
{
    return PyObject_CallFunction(PYREFS.error_cls, "OnKN", PYREFS.kinds[kind],
                                 (Py_ssize_t)offset, (unsigned long long)ip,
                                 code_obj(code));
}

static int batch_error(void *ctx, int kind, ptrdiff_t offset, uint64_t ip,
                       int code)
{
    return batch_add_item(ctx, offset, error_item(kind, offset, ip, code));
}

static int batch_status(void *ctx, int name, ptrdiff_t offset, int supp)
{
    /* the session reports no ip_suppressed with "end_of_trace" */
    PyObject *o = PyObject_CallFunction(PYREFS.status_cls, "OnO",
                                        PYREFS.statuses[name],
                                        (Py_ssize_t)offset,
                                        name == S_END_OF_TRACE ? Py_None :
                                        supp ? Py_True : Py_False);
    return batch_add_item(ctx, offset, o);
}

static int batch_full(void *ctx)
{
    struct batch_sink *b = ctx;
    return b->nrec >= b->max_records;
}

const struct sink_ops BATCH_OPS = {batch_record, batch_event, batch_error,
                                   batch_status, batch_full};

/* -- counts and edges ------------------------------------------------------------ */

static int count_record(void *ctx, const struct rec *r, const uint8_t *insns)
{
    struct count_sink *c = ctx;
    (void)insns;
    c->w.insns += r->ninsn;
    c->w.blocks++;
    return 0;
}

static int count_event(void *ctx, const struct event *ev, ptrdiff_t offset)
{
    struct count_sink *c = ctx;
    (void)ev;
    (void)offset;
    c->events++;
    return 0;
}

static int count_error(void *ctx, int kind, ptrdiff_t offset, uint64_t ip,
                       int code)
{
    struct count_sink *c = ctx;
    PyObject *t = Py_BuildValue("(OnKN)", PYREFS.kinds[kind],
                                (Py_ssize_t)offset, (unsigned long long)ip,
                                code_obj(code));
    if (!t)
        return -E_PYERR;
    int r = PyList_Append(c->errors, t);
    Py_DECREF(t);
    c->w.have_from = 0;         /* no edge across an error */
    return r < 0 ? -E_PYERR : 0;
}

static int no_status(void *ctx, int name, ptrdiff_t offset, int supp)
{
    (void)ctx;
    (void)name;
    (void)offset;
    (void)supp;
    return 0;
}

static int never_full(void *ctx)
{
    (void)ctx;
    return 0;
}

const struct sink_ops COUNT_OPS = {count_record, count_event, count_error,
                                   no_status, never_full};

/* edges (fast.EdgeSink): (branch, next instruction) for each executed
 * branch, from the instruction decoder's records */
static int edge_record(void *ctx, const struct rec *r, const uint8_t *insns)
{
    struct count_sink *c = ctx;
    (void)insns;
    c->w.insns += r->ninsn;
    c->w.blocks++;
    if (c->w.have_from)
        TRY(edge_add(c->w.edges, c->w.from, r->ip, 1));
    c->w.have_from = r->iclass != C_OTHER && r->iclass != C_PTWRITE;
    c->w.from = r->end_ip;
    return 0;
}

const struct sink_ops EDGE_OPS = {edge_record, count_event, count_error,
                                  no_status, never_full};

PyObject *edges_dict(struct edge_table *e)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < e->cap; i++) {
        struct edge *x = &e->tab[i];
        if (!x->n)
            continue;
        PyObject *k = Py_BuildValue("(KK)", (unsigned long long)x->from,
                                    (unsigned long long)x->to);
        PyObject *v = PyLong_FromUnsignedLongLong(x->n);
        if (!k || !v || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

PyObject *edges_packed(struct edge_table *e)
{
    if (!e->n)
        return PyBytes_FromStringAndSize(NULL, 0);
    /* sorted in the bytes object's own buffer (16-byte aligned, as the
     * object is): no array of its own to fault in and copy */
    PyObject *b = PyBytes_FromStringAndSize(NULL,
                                            (Py_ssize_t)(e->n * sizeof(struct edge)));
    if (b)
        edge_sort_into(e, (struct edge *)(void *)PyBytes_AS_STRING(b));
    return b;
}

PyObject *py_edge_text(PyObject *mod, PyObject *args)
{
    (void)mod;
    Py_buffer buf;
    int lines;
    if (!PyArg_ParseTuple(args, "y*p", &buf, &lines))
        return NULL;
    if (buf.len % (Py_ssize_t)sizeof(struct edge)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "edge_text: not a packed edge table");
        return NULL;
    }
    size_t n = (size_t)buf.len / sizeof(struct edge);
    /* read in place where the buffer is aligned for it (a table of
     * edges_packed is), else from an aligned copy */
    struct edge *s = buf.buf, *copy = NULL;
    if ((uintptr_t)buf.buf % _Alignof(struct edge)) {
        s = copy = malloc(n ? n * sizeof *s : 1);
        if (!s) {
            PyBuffer_Release(&buf);
            return PyErr_NoMemory();
        }
        memcpy(s, buf.buf, n * sizeof *s);
    }
    unsigned __int128 taken = 0;     /* exact, as Python's sum */
    for (size_t k = 0; k < n; k++)
        taken += s[k].n;
    PyObject *text = NULL;
    if (lines) {
        text = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * EDGE_LINE_MAX));
        if (text) {
            size_t m = edge_lines(s, n, PyBytes_AS_STRING(text));
            if (_PyBytes_Resize(&text, (Py_ssize_t)m) < 0)
                text = NULL;
        }
    } else {
        Py_INCREF(Py_None);
        text = Py_None;
    }
    free(copy);
    PyBuffer_Release(&buf);
    if (!text)
        return NULL;
    PyObject *sum = PyLong_FromUnsignedLongLong((uint64_t)taken);
    if (sum && (uint64_t)(taken >> 64)) {
        PyObject *hi = PyLong_FromUnsignedLongLong((uint64_t)(taken >> 64));
        PyObject *sh = PyLong_FromLong(64);
        PyObject *t = hi && sh ? PyNumber_Lshift(hi, sh) : NULL;
        PyObject *all = t ? PyNumber_Or(t, sum) : NULL;
        Py_XDECREF(hi);
        Py_XDECREF(sh);
        Py_XDECREF(t);
        Py_SETREF(sum, all);
    }
    if (!sum) {
        Py_DECREF(text);
        return NULL;
    }
    return Py_BuildValue("(NN)", text, sum);
}

/* hwtrace.flow._c_flow: the compiled flow core's Python boundary.
 *
 * The core itself (the C files in core/, no Python) is a port of the Python flow
 * decoders layer by layer (see core/common.h); this file holds the
 * Decoder type that drives it over a buffer and an image:
 *
 *   Decoder(data, image, filler, config, flags[, release])
 *       data      anything with the buffer protocol (read in place)
 *       image     the image to start in (any object: the key of its
 *                 instruction cache)
 *       filler    filler(image) -> fill(ip, mode): the instructions at ip
 *                 (hwtrace.flow.fast.filler: it decodes with x86_fill,
 *                 the compiled x86 decoder, and the twin's InsnCache for
 *                 errors and section crossings); or (filler, mappings):
 *                 mappings(image) gives the image's mappings, so that
 *                 a miss is filled in C where it can be (core/pyfill.h)
 *       config    see hwtrace.flow.fast._config_tuple
 *       flags     BLOCK 1, RESYNC 2, WANT_INSNS 4, PLAIN_OFFSETS 8,
 *                 PLAIN_EVENTS 16
 *       release   a file mapping's release_before (memory only)
 *
 *   .batch(max_records) -> (blocks, insns, items, first_insn), or None
 *                          at the end: the next batch, cut after the
 *                          record that makes max_records; with
 *                          PLAIN_EVENTS (blocks, insns, items, first_insn,
 *                          rows): the events a row tells exactly are
 *                          rows (hwtrace.flow.plain.PLAIN), not items
 *   .counts() -> (insns, blocks, events, [(kind, offset, ip, code)])
 *   .edges()  -> ({(from, to): n}, insns, [(kind, offset, ip, code)])
 *   .edges(True) -> (table, insns, errors): the edges as a packed table
 *                   sorted by (from, to) (fast.PackedEdges)
 *
 *   .fills -> (in C, in Python): instruction-cache misses filled so far
 *
 * A decoder does one of these (batches until None, or one counts/edges).
 * An address-space switcher looks in through set_hooks(after_sync,
 * after_event[, event_types]) and the attributes ip, enabled, offset, pos,
 * decoded, time(), time_ahead(), and switches with set_image(image).
 *
 * The parallel paths' jobs (core/segment.h):
 *
 *   .segment(start, stop_at, tail, head)
 *       -> (insns, blocks, events, errors, checkpoints, underflows, stopped)
 *       counts from the PSB at ``start`` (-1: the trace start) recording
 *       checkpoints (psb, key, stack, (insns, blocks, events, errors)) at
 *       the first ``head`` PSBs and at PSBs at/after ``stop_at`` (-1:
 *       none), stopping after ``tail`` of those
 *   .segment_batches(start, stop_at, tail, head)
 *       -> (blocks, insns, items, checkpoints, underflows, stopped, ninsn)
 *       the same decode into one batch (all records and items), the
 *       checkpoints at (records, items, instructions, 0)
 *   .state_probe(start) -> [(field, flipping it changes the key)]
 *       a test hook: decodes to the first checkpoint after ``start``
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core/pyconfig.h"
#include "core/pyfill.h"
#include "core/ownbuf.h"
#include "core/pysinks.h"
#include "core/pyx86.h"
#include "core/segment.h"

#define ABI_VERSION 9

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif

enum { DF_BLOCK = 1, DF_RESYNC = 2, DF_WANT_INSNS = 4, DF_PLAIN_OFFSETS = 8,
       DF_PLAIN_EVENTS = 16 };

struct imgent {
    PyObject *image;
    struct pyfill *fill;        /* the miss handler of ic */
    struct icache *ic;
};

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int have_view;
    struct core_config cfg;
    struct session s;
    int have_session;
    struct imgent *imgs;
    int nimg, capimg;
    PyObject *filler, *mappings, *release;
    PyObject *after_sync, *after_event;
    uint64_t event_mask;        /* the event types after_event is called
                                   for (bit EV_*; all by default) */
    struct hooks hooks;
    struct batch_sink bs;
    uint64_t first_insn;
    int used;                   /* 1 batches, 2 counts/edges */
    int done;
    int in_batch;               /* batch() is running */
    int plain_events;           /* DF_PLAIN_EVENTS */
    PyObject *pending;          /* items added before the first batch */
} Decoder;

/* -- instruction caches ------------------------------------------------------ */

static struct icache *icache_for(Decoder *self, PyObject *image)
{
    for (int i = 0; i < self->nimg; i++)
        if (self->imgs[i].image == image)
            return self->imgs[i].ic;
    if (self->nimg == self->capimg) {
        int cap = self->capimg ? 2 * self->capimg : 4;
        struct imgent *n = PyMem_Realloc(self->imgs, cap * sizeof *n);
        if (!n) {
            PyErr_NoMemory();
            return NULL;
        }
        self->imgs = n;
        self->capimg = cap;
    }
    struct pyfill *f = pyfill_new(image, self->filler, self->mappings);
    if (!f)
        return NULL;
    struct icache *ic = ic_new(image, pyfill_fill, f);
    if (!ic) {
        pyfill_free(f);
        PyErr_NoMemory();
        return NULL;
    }
    struct imgent *e = &self->imgs[self->nimg++];
    Py_INCREF(image);
    e->image = image;
    e->fill = f;
    e->ic = ic;
    return ic;
}

static int py_release(void *ctx, ptrdiff_t pos, ptrdiff_t *next)
{
    PyObject *r = PyObject_CallFunction(ctx, "n", (Py_ssize_t)pos);
    if (!r)
        return -1;
    Py_ssize_t v = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *next = v;
    return 0;
}

/* -- hooks (an address-space switcher) ------------------------------------------ */

static int hook_after_sync(void *ctx, struct session *s)
{
    Decoder *self = ctx;
    (void)s;
    if (!self->after_sync)
        return 0;
    PyObject *r = PyObject_CallOneArg(self->after_sync, (PyObject *)self);
    if (!r)
        return -E_PYERR;
    Py_DECREF(r);
    return 0;
}

static int hook_after_event(void *ctx, struct session *s, const struct event *ev)
{
    Decoder *self = ctx;
    (void)s;
    if (!self->after_event || !(self->event_mask >> ev->type & 1))
        return 0;
    PyObject *o = event_to_py(ev);
    if (!o)
        return -E_PYERR;
    PyObject *r = PyObject_CallFunctionObjArgs(self->after_event,
                                               (PyObject *)self, o, NULL);
    if (!r) {
        Py_DECREF(o);
        return -E_PYERR;
    }
    Py_DECREF(r);
    /* the batch's item is the same object */
    Py_XSETREF(self->bs.next_event, o);
    return 0;
}

/* -- the type ----------------------------------------------------------------------- */

static int Decoder_init(Decoder *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"data", "image", "filler", "config", "flags",
                             "release", NULL};
    PyObject *data, *image, *filler, *config, *release = Py_None;
    unsigned flags;
    if (self->have_session) {
        PyErr_SetString(PyExc_RuntimeError, "Decoder initialized twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOI|O", kwlist, &data,
                                     &image, &filler, &config, &flags,
                                     &release))
        return -1;
    if (parse_config(config, &self->cfg) < 0)
        return -1;
    if (release != Py_None && !PyCallable_Check(release)) {
        PyErr_SetString(PyExc_TypeError, "release must be callable or None");
        return -1;
    }
    if (PyObject_GetBuffer(data, &self->view, PyBUF_SIMPLE) < 0)
        return -1;
    self->have_view = 1;
    if (PyTuple_Check(filler)) {
        if (!PyArg_ParseTuple(filler, "OO;filler", &self->filler,
                              &self->mappings))
            return -1;
        Py_INCREF(self->filler);
        if (self->mappings == Py_None)
            self->mappings = NULL;
        Py_XINCREF(self->mappings);
    } else {
        self->filler = Py_NewRef(filler);
    }
    struct icache *ic = icache_for(self, image);
    if (!ic)
        return -1;
    sess_init(&self->s, self->view.buf, self->view.len, &self->cfg, ic,
              flags & DF_BLOCK, (flags & DF_RESYNC) != 0);
    self->have_session = 1;
    self->s.want_insns = (flags & DF_WANT_INSNS) != 0;
    self->s.plain_offsets = (flags & DF_PLAIN_OFFSETS) != 0;
    self->plain_events = (flags & DF_PLAIN_EVENTS) != 0;
    self->hooks.ctx = self;
    self->hooks.after_sync = hook_after_sync;
    self->hooks.after_event = hook_after_event;
    if (release != Py_None) {
        Py_INCREF(release);
        self->release = release;
        self->s.d.q.release = py_release;
        self->s.d.q.release_ctx = release;
    }
    return 0;
}

static void release_buffers(Decoder *self)
{
    if (self->have_session) {
        sess_free(&self->s);
        self->have_session = 0;
    }
    free(self->bs.blocks.p);
    free(self->bs.insns.p);
    free(self->bs.rows.p);
    memset(&self->bs.blocks, 0, sizeof self->bs.blocks);
    memset(&self->bs.insns, 0, sizeof self->bs.insns);
    memset(&self->bs.rows, 0, sizeof self->bs.rows);
    Py_CLEAR(self->bs.items);
    Py_CLEAR(self->bs.next_event);
    if (self->have_view) {
        PyBuffer_Release(&self->view);
        self->have_view = 0;
    }
}

static int Decoder_traverse(Decoder *self, visitproc visit, void *arg)
{
    for (int i = 0; i < self->nimg; i++) {
        Py_VISIT(self->imgs[i].image);
        int r = pyfill_traverse(self->imgs[i].fill, visit, arg);
        if (r)
            return r;
    }
    Py_VISIT(self->filler);
    Py_VISIT(self->mappings);
    Py_VISIT(self->release);
    Py_VISIT(self->after_sync);
    Py_VISIT(self->after_event);
    Py_VISIT(self->bs.items);
    Py_VISIT(self->bs.next_event);
    Py_VISIT(self->pending);
    return 0;
}

static int Decoder_clear(Decoder *self)
{
    Py_CLEAR(self->after_sync);
    Py_CLEAR(self->after_event);
    Py_CLEAR(self->bs.next_event);
    Py_CLEAR(self->pending);
    return 0;
}

static void Decoder_dealloc(Decoder *self)
{
    PyObject_GC_UnTrack(self);
    Decoder_clear(self);
    release_buffers(self);
    for (int i = 0; i < self->nimg; i++) {
        ic_free(self->imgs[i].ic);
        Py_XDECREF(self->imgs[i].image);
        pyfill_free(self->imgs[i].fill);
    }
    PyMem_Free(self->imgs);
    Py_XDECREF(self->filler);
    Py_XDECREF(self->mappings);
    Py_XDECREF(self->release);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(Decoder *self, int use)
{
    if (!self->have_session) {
        PyErr_SetString(PyExc_ValueError, "decoder not initialized or "
                        "already finished");
        return -1;
    }
    if (self->used && self->used != use) {
        PyErr_SetString(PyExc_RuntimeError, "a decoder does one job");
        return -1;
    }
    self->used = use;
    return 0;
}

/* after sess_run: NULL with the exception for a fatal stop */
static int run(Decoder *self)
{
    int r = sess_run(&self->s);
    if (r != SESS_FATAL)
        return r;
    int code = self->s.fatal;
    if (code == E_NOMEM) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
    } else if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError, "compiled flow core: %s",
                     core_errstr(code));
    }
    return -1;
}

static PyObject *Decoder_batch(Decoder *self, PyObject *args)
{
    Py_ssize_t max_records;
    if (!PyArg_ParseTuple(args, "n", &max_records))
        return NULL;
    if (max_records < 1) {
        PyErr_SetString(PyExc_ValueError, "batch sizes must be positive");
        return NULL;
    }
    if (self->done)
        Py_RETURN_NONE;
    if (ready(self, 1) < 0)
        return NULL;
    struct batch_sink *b = &self->bs;
    b->blocks.n = b->insns.n = b->rows.n = 0;
    b->nrec = 0;
    b->nitems = 0;
    b->plain = self->plain_events;
    b->max_records = (size_t)max_records;
    b->want_insns = self->s.want_insns;
    Py_XSETREF(b->items, PyList_New(0));
    if (!b->items)
        return NULL;
    self->s.ops = &BATCH_OPS;
    self->s.ctx = b;
    self->s.hooks = &self->hooks;
    if (self->pending) {
        /* what was added before the first batch comes first */
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(self->pending); k++) {
            PyObject *t = PyList_GET_ITEM(self->pending, k);
            if (batch_add_item(b, PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 0)),
                               Py_NewRef(PyTuple_GET_ITEM(t, 1))) < 0)
                return NULL;
        }
        Py_CLEAR(self->pending);
    }
    uint64_t before = self->first_insn;
    self->in_batch = 1;
    int r = run(self);
    self->in_batch = 0;
    if (r < 0)
        return NULL;
    if (r == SESS_DONE)
        self->done = 1;
    if (r == SESS_DONE && !b->nrec && !b->nitems)
        Py_RETURN_NONE;
    /* the buffers themselves, not copies (core/ownbuf.h) */
    PyObject *blocks = bytebuf_take(&b->blocks);
    PyObject *insns = Py_None;
    Py_INCREF(insns);
    if (b->want_insns) {
        Py_DECREF(insns);
        insns = bytebuf_take(&b->insns);
    }
    PyObject *rows = NULL;
    if (b->plain)
        rows = bytebuf_take(&b->rows);
    self->first_insn = self->s.ninsn;
    PyObject *items = b->items;
    b->items = NULL;
    if (!blocks || !insns || (b->plain && !rows)) {
        Py_XDECREF(blocks);
        Py_XDECREF(insns);
        Py_XDECREF(rows);
        Py_DECREF(items);
        return NULL;
    }
    if (rows)
        return Py_BuildValue("(NNNKN)", blocks, insns, items,
                             (unsigned long long)before, rows);
    return Py_BuildValue("(NNNK)", blocks, insns, items,
                         (unsigned long long)before);
}

static PyObject *Decoder_counts(Decoder *self, PyObject *noargs)
{
    (void)noargs;
    if (ready(self, 2) < 0)
        return NULL;
    struct count_sink c;
    memset(&c, 0, sizeof c);
    c.errors = PyList_New(0);
    if (!c.errors)
        return NULL;
    self->s.ops = &COUNT_OPS;
    self->s.ctx = &c;
    self->s.hooks = &self->hooks;
    self->s.walk = &c.w;
    int r = run(self);
    self->s.walk = NULL;
    walk_done(&c.w);
    release_buffers(self);
    if (r < 0) {
        Py_DECREF(c.errors);
        return NULL;
    }
    return Py_BuildValue("(KKKN)", (unsigned long long)c.w.insns,
                         (unsigned long long)(self->s.block ? c.w.blocks : 0),
                         (unsigned long long)c.events, c.errors);
}

static PyObject *Decoder_edges(Decoder *self, PyObject *args)
{
    int packed = 0;
    if (!PyArg_ParseTuple(args, "|p", &packed))
        return NULL;
    if (ready(self, 2) < 0)
        return NULL;
    struct count_sink c;
    struct edge_table table;
    memset(&c, 0, sizeof c);
    memset(&table, 0, sizeof table);
    c.w.edges = &table;
    c.errors = PyList_New(0);
    if (!c.errors)
        return NULL;
    self->s.ops = &EDGE_OPS;
    self->s.ctx = &c;
    self->s.hooks = &self->hooks;
    self->s.walk = &c.w;
    int r = run(self);
    self->s.walk = NULL;
    for (int i = 0; r >= 0 && i < self->nimg; i++)
        if (ic_each_run(self->imgs[i].ic, walk_flush_run, &c.w) < 0) {
            PyErr_NoMemory();
            r = -1;
        }
    if (walk_done(&c.w) < 0 && r >= 0) {
        PyErr_NoMemory();
        r = -1;
    }
    release_buffers(self);
    PyObject *d = r < 0 ? NULL :
        packed ? edges_packed(&table) : edges_dict(&table);
    edge_free(&table);
    if (!d) {
        Py_DECREF(c.errors);
        return NULL;
    }
    return Py_BuildValue("(NKN)", d, (unsigned long long)c.w.insns,
                         c.errors);
}

/* -- segment jobs -------------------------------------------------------------- */

static void count_position(void *ctx, uint64_t out[4])
{
    struct count_sink *c = ctx;
    out[0] = c->w.insns;
    out[1] = c->w.blocks;
    out[2] = c->events;
    out[3] = (uint64_t)PyList_GET_SIZE(c->errors);
}

static PyObject *checkpoints_list(struct segment *g, int block)
{
    PyObject *l = PyList_New(g->ncps);
    for (int i = 0; l && i < g->ncps; i++) {
        struct checkpoint *cp = &g->cps[i];
        PyObject *st = PyTuple_New(cp->nstack);
        for (int k = 0; st && k < cp->nstack; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong(cp->stack[k]);
            if (!v) {
                Py_CLEAR(st);
                break;
            }
            PyTuple_SET_ITEM(st, k, v);
        }
        PyObject *t = st ? Py_BuildValue(
            "(ny#N(KKKK))", (Py_ssize_t)cp->psb, (const char *)cp->key,
            (Py_ssize_t)cp->keylen, st, (unsigned long long)cp->out[0],
            (unsigned long long)(block ? cp->out[1] : 0),
            (unsigned long long)cp->out[2],
            (unsigned long long)cp->out[3]) : NULL;
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, t);
    }
    return l;
}

static PyObject *Decoder_segment(Decoder *self, PyObject *args)
{
    Py_ssize_t start, stop_at;
    int tail, head;
    if (!PyArg_ParseTuple(args, "nnii", &start, &stop_at, &tail, &head))
        return NULL;
    if (ready(self, 2) < 0)
        return NULL;
    struct count_sink c;
    memset(&c, 0, sizeof c);
    c.errors = PyList_New(0);
    if (!c.errors)
        return NULL;
    struct segment g;
    seg_init(&g, stop_at, head, tail);
    g.position = count_position;
    g.ctx = &c;
    self->s.ops = &COUNT_OPS;
    self->s.ctx = &c;
    self->s.hooks = &self->hooks;
    self->s.obs = &g.obs;
    self->s.sync_at = start;
    int r = run(self);
    self->s.obs = NULL;
    PyObject *result = NULL;
    if (r >= 0) {
        PyObject *cps = checkpoints_list(&g, self->s.block);
        PyObject *under = PyList_New(g.nunder);
        for (int i = 0; under && i < g.nunder; i++)
            PyList_SET_ITEM(under, i, PyLong_FromLong(g.underflows[i]));
        if (cps && under)
            result = Py_BuildValue(
                "(KKKONNO)", (unsigned long long)c.w.insns,
                (unsigned long long)(self->s.block ? c.w.blocks : 0),
                (unsigned long long)c.events, c.errors, cps, under,
                g.stopped ? Py_True : Py_False);
        else {
            Py_XDECREF(cps);
            Py_XDECREF(under);
        }
    }
    Py_DECREF(c.errors);
    seg_free(&g);
    release_buffers(self);
    return result;
}

static void batch_position(void *ctx, uint64_t out[4])
{
    Decoder *self = ctx;
    out[0] = self->bs.nrec;
    out[1] = (uint64_t)PyList_GET_SIZE(self->bs.items);
    out[2] = self->s.ninsn;
    out[3] = 0;
}

/* segment_batches(start, stop_at, tail, head): the job's records and
 * items as one batch, with checkpoints at (records, items, insns, 0) */
static PyObject *Decoder_segment_batches(Decoder *self, PyObject *args)
{
    Py_ssize_t start, stop_at;
    int tail, head;
    if (!PyArg_ParseTuple(args, "nnii", &start, &stop_at, &tail, &head))
        return NULL;
    if (ready(self, 2) < 0)
        return NULL;
    struct batch_sink *b = &self->bs;
    b->blocks.n = b->insns.n = 0;
    b->nrec = 0;
    b->nitems = 0;
    b->plain = 0;               /* checkpoints count the items */
    b->max_records = (size_t)-1;
    b->want_insns = self->s.want_insns;
    Py_XSETREF(b->items, PyList_New(0));
    if (!b->items)
        return NULL;
    struct segment g;
    seg_init(&g, stop_at, head, tail);
    g.position = batch_position;
    g.ctx = self;
    self->s.ops = &BATCH_OPS;
    self->s.ctx = b;
    self->s.hooks = &self->hooks;
    self->s.obs = &g.obs;
    self->s.sync_at = start;
    int r = run(self);
    self->s.obs = NULL;
    PyObject *result = NULL;
    if (r >= 0) {
        PyObject *cps = checkpoints_list(&g, 1);
        PyObject *under = PyList_New(g.nunder);
        for (int i = 0; under && i < g.nunder; i++)
            PyList_SET_ITEM(under, i, PyLong_FromLong(g.underflows[i]));
        PyObject *blocks = PyBytes_FromStringAndSize(
            (char *)b->blocks.p, (Py_ssize_t)b->blocks.n);
        PyObject *insns = b->want_insns ? PyBytes_FromStringAndSize(
            (char *)b->insns.p, (Py_ssize_t)b->insns.n) : Py_NewRef(Py_None);
        if (cps && under && blocks && insns)
            result = Py_BuildValue("(NNONNOK)", blocks, insns, b->items, cps,
                                   under, g.stopped ? Py_True : Py_False,
                                   (unsigned long long)self->s.ninsn);
        else {
            Py_XDECREF(cps);
            Py_XDECREF(under);
            Py_XDECREF(blocks);
            Py_XDECREF(insns);
        }
    }
    seg_free(&g);
    release_buffers(self);
    return result;
}

static int probe_out(void *ctx, const char *name, int changed)
{
    PyObject *t = Py_BuildValue("(sO)", name, changed ? Py_True : Py_False);
    if (!t)
        return -1;
    int r = PyList_Append(ctx, t);
    Py_DECREF(t);
    return r;
}

static PyObject *Decoder_state_probe(Decoder *self, PyObject *arg)
{
    Py_ssize_t start = PyLong_AsSsize_t(arg);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    if (ready(self, 2) < 0)
        return NULL;
    struct count_sink c;
    memset(&c, 0, sizeof c);
    c.errors = PyList_New(0);
    if (!c.errors)
        return NULL;
    struct segment g;
    seg_init(&g, start, 1, 1);
    self->s.ops = &COUNT_OPS;
    self->s.ctx = &c;
    self->s.obs = &g.obs;
    self->s.sync_at = start;
    int r = run(self);
    self->s.obs = NULL;
    PyObject *result = NULL;
    if (r >= 0 && !g.stopped) {
        PyErr_SetString(PyExc_ValueError, "no checkpoint after start");
    } else if (r >= 0) {
        result = PyList_New(0);
        if (result && state_probe(&self->s, probe_out, result) < 0) {
            Py_CLEAR(result);
            if (!PyErr_Occurred())
                PyErr_NoMemory();
        }
    }
    Py_DECREF(c.errors);
    seg_free(&g);
    release_buffers(self);
    return result;
}

/* add_item(offset, item): an item of the batches at this point of the
 * decode (an address-space switch reported by the switcher the core calls
 * back): after the records so far, before what comes next */
static PyObject *Decoder_add_item(Decoder *self, PyObject *args)
{
    Py_ssize_t offset;
    PyObject *item;
    if (!PyArg_ParseTuple(args, "nO", &offset, &item))
        return NULL;
    if (self->in_batch) {
        if (sess_flush(&self->s) < 0 ||
            batch_add_item(&self->bs, offset, Py_NewRef(item)) < 0) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (self->used && self->used != 1) {
        PyErr_SetString(PyExc_RuntimeError, "items go with batches");
        return NULL;
    }
    if (!self->pending && !(self->pending = PyList_New(0)))
        return NULL;
    PyObject *t = Py_BuildValue("(nO)", offset, item);
    if (!t || PyList_Append(self->pending, t) < 0) {
        Py_XDECREF(t);
        return NULL;
    }
    Py_DECREF(t);
    Py_RETURN_NONE;
}

/* set_hooks(after_sync, after_event[, event_types]): event_types, the
 * names of the event types after_event wants (None: every event) -- a
 * switcher that acts on a few types is not called, and no Event is made,
 * for the many others (a PSB+'s status updates, CBR) */
_Static_assert(EV_NTYPES <= 64, "event_mask holds a bit per type");

static PyObject *Decoder_set_hooks(Decoder *self, PyObject *args)
{
    PyObject *s, *e, *types = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O", &s, &e, &types))
        return NULL;
    uint64_t mask = ~(uint64_t)0;
    if (types != Py_None) {
        PyObject *it = PyObject_GetIter(types);
        if (!it)
            return NULL;
        mask = 0;
        PyObject *name;
        while ((name = PyIter_Next(it))) {
            int found = -1;
            for (int i = 0; i < EV_NTYPES && found < 0; i++) {
                int eq = PyUnicode_Check(name) &&
                         PyUnicode_CompareWithASCIIString(name,
                                                          EV_NAMES[i]) == 0;
                if (eq)
                    found = i;
            }
            Py_DECREF(name);
            if (found < 0) {
                Py_DECREF(it);
                PyErr_SetString(PyExc_ValueError, "unknown event type");
                return NULL;
            }
            mask |= (uint64_t)1 << found;
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            return NULL;
    }
    Py_XSETREF(self->after_sync, s == Py_None ? NULL : Py_NewRef(s));
    Py_XSETREF(self->after_event, e == Py_None ? NULL : Py_NewRef(e));
    self->event_mask = mask;
    Py_RETURN_NONE;
}

static PyObject *Decoder_set_image(Decoder *self, PyObject *image)
{
    if (!self->have_session) {
        PyErr_SetString(PyExc_ValueError, "decoder finished");
        return NULL;
    }
    struct icache *ic = icache_for(self, image);
    if (!ic)
        return NULL;
    insn_set_image(&self->s.d, ic);
    Py_RETURN_NONE;
}

static PyObject *Decoder_time(Decoder *self, PyObject *noargs)
{
    (void)noargs;
    const struct flow_time *t = &self->s.d.q.time;
    return Py_BuildValue("(KKKO)", (unsigned long long)t->m_tsc,
                         (unsigned long long)t->m_lost_mtc,
                         (unsigned long long)t->m_lost_cyc,
                         t->m_have ? Py_True : Py_False);
}

/* SpaceSwitcher._time_ahead(limit, after): a time stamp at a timing
 * packet after the one an event with time ``after`` (None: unknown) came
 * with -- the least of the time at the last query and the query's time
 * now that is later than ``after`` (the query reads ahead past the timing
 * packets that follow what it returned; time stamps never go back, so a
 * later one comes from a packet after the event's), else the next timing
 * packet (TSC, MTC, CYC) within ``limit`` packets after the query's
 * position, decoded without errata as the switcher's own packet decoder
 * does -- a PSB+'s TSC too; None if there is none (an OVF first, an
 * error, no TSC) */
static PyObject *Decoder_time_ahead(Decoder *self, PyObject *args)
{
    Py_ssize_t limit;
    PyObject *after_o;
    if (!PyArg_ParseTuple(args, "nO", &limit, &after_o))
        return NULL;
    const struct query *q = &self->s.d.q;
    if (after_o != Py_None) {
        unsigned long long after = PyLong_AsUnsignedLongLong(after_o);
        if (after == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        int have = 0;
        uint64_t best = 0;
        if (q->time.m_have && q->time.m_tsc > after) {
            best = q->time.m_tsc;
            have = 1;
        }
        if (q->time.time.have_tsc && q->time.time.tsc > after &&
            (!have || q->time.time.tsc < best)) {
            best = q->time.time.tsc;
            have = 1;
        }
        if (have)
            return PyLong_FromUnsignedLongLong(best);
    }
    if (q->pos < 0)
        Py_RETURN_NONE;
    struct flow_time t = q->time;
    ptrdiff_t pos = q->pos;
    struct pt_pkt p;
    for (Py_ssize_t i = 0; i < limit; i++) {
        if (pos >= q->end)
            Py_RETURN_NONE;
        int r = pt_decode_at(q->buf, pos, q->end, 0, &p);
        if (r < 0)
            Py_RETURN_NONE;
        pos += r;
        int k = p.kind;
        if (k == PT_K_TSC || k == PT_K_MTC || k == PT_K_CYC ||
            k == PT_K_TMA || k == PT_K_CBR) {
            if (ft_update(&t, q->cfg, &p, 0) < 0)
                Py_RETURN_NONE;
            if (k != PT_K_TMA && k != PT_K_CBR) {
                if (!t.time.have_tsc)
                    Py_RETURN_NONE;
                return PyLong_FromUnsignedLongLong(t.time.tsc);
            }
        } else if (k == PT_K_OVF) {
            Py_RETURN_NONE;
        }
        /* a PSB+ goes on: its TSC bounds an event before it too */
    }
    Py_RETURN_NONE;
}

static PyObject *Decoder_get_ip(Decoder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(self->s.d.ip);
}

static PyObject *Decoder_get_enabled(Decoder *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->s.d.enabled);
}

static PyObject *Decoder_get_offset(Decoder *self, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(q_offset(&self->s.d.q));
}

static PyObject *Decoder_get_pos(Decoder *self, void *c)
{
    (void)c;
    if (self->s.d.q.pos < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(self->s.d.q.pos);
}

static PyObject *Decoder_get_event_start(Decoder *self, void *c)
{
    (void)c;
    if (self->s.d.delivered_start < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(self->s.d.delivered_start);
}

static PyObject *Decoder_get_insns(Decoder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(self->s.ninsn);
}

/* spaces.InsnClock's count: the open record's instructions too */
static PyObject *Decoder_get_decoded(Decoder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(self->s.ninsn + self->s.open.ninsn);
}

static PyMethodDef Decoder_methods[] = {
    {"batch", (PyCFunction)Decoder_batch, METH_VARARGS,
     "batch(max_records) -> (blocks, insns, items, first_insn) or None"},
    {"counts", (PyCFunction)Decoder_counts, METH_NOARGS,
     "counts() -> (insns, blocks, events, errors)"},
    {"edges", (PyCFunction)Decoder_edges, METH_VARARGS,
     "edges(packed=False) -> (edges, insns, errors)"},
    {"segment", (PyCFunction)Decoder_segment, METH_VARARGS,
     "segment(start, stop_at, tail, head) -> (insns, blocks, events, errors, "
     "checkpoints, underflows, stopped)"},
    {"segment_batches", (PyCFunction)Decoder_segment_batches, METH_VARARGS,
     "segment_batches(start, stop_at, tail, head) -> (blocks, insns, items, "
     "checkpoints, underflows, stopped, insns_total)"},
    {"state_probe", (PyCFunction)Decoder_state_probe, METH_O,
     "state_probe(start) -> [(field, changed)] (a test hook)"},
    {"add_item", (PyCFunction)Decoder_add_item, METH_VARARGS,
     "add_item(offset, item): an item of the batches here"},
    {"set_hooks", (PyCFunction)Decoder_set_hooks, METH_VARARGS,
     "set_hooks(after_sync(dec), after_event(dec, event))"},
    {"set_image", (PyCFunction)Decoder_set_image, METH_O,
     "set_image(image): decode in this image from now on"},
    {"time", (PyCFunction)Decoder_time, METH_NOARGS,
     "(tsc, lost_mtc, lost_cyc, have_tsc) at the last query"},
    {"time_ahead", (PyCFunction)Decoder_time_ahead, METH_VARARGS,
     "time_ahead(limit, after) -> the time at a timing packet after the event of time after, or None"},
    {NULL, NULL, 0, NULL}};

static PyObject *Decoder_get_fills(Decoder *self, void *closure)
{
    (void)closure;
    unsigned long long c = 0, py = 0;
    for (int i = 0; i < self->nimg; i++) {
        uint64_t a, b;
        pyfill_counts(self->imgs[i].fill, &a, &b);
        c += a;
        py += b;
    }
    return Py_BuildValue("(KK)", c, py);
}

static PyGetSetDef Decoder_getset[] = {
    {"ip", (getter)Decoder_get_ip, NULL, "the instruction decoder's IP", NULL},
    {"enabled", (getter)Decoder_get_enabled, NULL, "tracing enabled", NULL},
    {"offset", (getter)Decoder_get_offset, NULL, "the query offset", NULL},
    {"pos", (getter)Decoder_get_pos, NULL, "the query position or None", NULL},
    {"event_start", (getter)Decoder_get_event_start, NULL,
     "the offset of the packet that published the event delivered last, or None", NULL},
    {"insns", (getter)Decoder_get_insns, NULL, "instructions so far", NULL},
    {"decoded", (getter)Decoder_get_decoded, NULL,
     "instructions decoded so far (the open record's too)", NULL},
    {"fills", (getter)Decoder_get_fills, NULL,
     "(in C, in Python): the instruction-cache misses filled so far",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hwtrace.flow._c_flow.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The compiled flow decoder over one trace (see the module doc)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_traverse = (traverseproc)Decoder_traverse,
    .tp_clear = (inquiry)Decoder_clear,
    .tp_methods = Decoder_methods,
    .tp_getset = Decoder_getset,
};

/* -- module ------------------------------------------------------------------------ */

static PyObject *py_set_item_types(PyObject *m, PyObject *args)
{
    PyObject *err, *st;
    (void)m;
    if (!PyArg_ParseTuple(args, "OO", &err, &st))
        return NULL;
    Py_XSETREF(PYREFS.error_cls, Py_NewRef(err));
    Py_XSETREF(PYREFS.status_cls, Py_NewRef(st));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"x86_decode", py_x86_decode, METH_VARARGS,
     "x86_decode(code, mode): the compiled x86 decoder (core/x86.h)"},
    {"x86_fill", py_x86_fill, METH_VARARGS,
     "x86_fill(code, mode, max): fast.filler's records, compiled"},
    {"fill_probe", pyfill_probe, METH_VARARGS,
     "fill_probe(image, filler, mappings, ips, mode): core/pyfill.h"},
    {"edge_text", py_edge_text, METH_VARARGS,
     "edge_text(table, lines) -> (text or None, taken)"},
    {"set_item_types", py_set_item_types, METH_VARARGS,
     "set_item_types(ErrorItem, StatusItem): the item classes of batches"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c_flow",
                                    "hwtrace's compiled flow core", -1,
                                    methods};

PyMODINIT_FUNC PyInit__c_flow(void)
{
    if (pyrefs_init() < 0)
        return NULL;
    if (PyType_Ready(&DecoderType) < 0 || bytebuf_ready() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    PyObject *errs = PyTuple_New(E_NCODES);
    if (!errs) {
        Py_DECREF(m);
        return NULL;
    }
    for (int i = 0; i < E_NCODES; i++)
        PyTuple_SET_ITEM(errs, i, PyUnicode_FromString(i ? core_errstr(i)
                                                         : ""));
    /* the names a plain event's row has by number (hwtrace.flow.plain) */
    PyObject *evt = PyTuple_New(EV_NTYPES), *pk = PyTuple_New(PT_K_COUNT);
    for (int i = 0; evt && i < EV_NTYPES; i++)
        PyTuple_SET_ITEM(evt, i, Py_NewRef(PYREFS.ev_names[i]));
    for (int i = 0; pk && i < PT_K_COUNT; i++)
        PyTuple_SET_ITEM(pk, i, Py_NewRef(PYREFS.kinds_pt[i]));
    if (PyModule_AddObject(m, "EVENT_TYPES", evt) < 0 ||
        PyModule_AddObject(m, "PACKET_KINDS", pk) < 0) {
        Py_XDECREF(evt);
        Py_XDECREF(pk);
        Py_DECREF(errs);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DecoderType);
    if (PyModule_AddIntConstant(m, "ABI", ABI_VERSION) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_SHA256",
                                   HWTRACE_SOURCE_SHA256) < 0 ||
        PyModule_AddObject(m, "ERRORS", errs) < 0 ||
        PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0 ||
        PyModule_AddObjectRef(m, "decode_batches",
                              (PyObject *)&DecoderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

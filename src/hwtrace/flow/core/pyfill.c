/* The instruction caches' miss handler: see pyfill.h. */
#include "pyfill.h"

struct mapsrc {
    PyObject *load;             /* the mapping's load() */
    uint64_t offset;
    Py_buffer buf;              /* what it returned (have) */
    int have;
};

struct pyfill {
    PyObject *image, *filler, *mappings;
    PyObject *fill;             /* filler(image), on the first Python fill */
    PyObject *gen;              /* the image's generation map is of */
    int built;                  /* mappings(image) was asked */
    int usable;                 /* map holds the image's mappings (else
                                   every miss is the Python fill's) */
    struct imgmap map;
    struct mapsrc *src;
    uint64_t n_c, n_py;
};

static PyObject *str_generation;

/* -- the Python fill ------------------------------------------------------------ */

static int python_fill(PyObject *fill, struct icache *ic, uint64_t ip,
                       int mode)
{
    PyObject *r = PyObject_CallFunction(fill, "Ki", (unsigned long long)ip,
                                        mode);
    if (!r)
        return -E_PYERR;
    struct insn_info in;
    memset(&in, 0, sizeof in);
    in.ip = ip;
    in.mode = (int8_t)mode;
    int rc = 0;
    if (PyLong_Check(r)) {
        long code = PyLong_AsLong(r);
        if (code <= 0 || code >= E_NCODES) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "fill: bad error code");
            rc = -E_PYERR;
        } else {
            in.err = (int8_t)code;
            rc = ic_add(ic, &in);
        }
        Py_DECREF(r);
        return rc;
    }
    unsigned long long lo, last;
    const char *p;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(r, "KKy#;fill", &lo, &last, &p, &n) ||
        n <= 0 || n % 11) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "fill: bad result");
        Py_DECREF(r);
        return -E_PYERR;
    }
    in.lo = lo;
    in.last = last;
    for (Py_ssize_t k = 0; k < n && rc >= 0; k += 11) {
        in.size = (uint8_t)p[k];
        in.iclass = (uint8_t)p[k + 1];
        in.flags = (uint8_t)p[k + 2];
        uint64_t rel;
        memcpy(&rel, p + k + 3, 8);
        in.rel = (int64_t)rel;
        rc = ic_add(ic, &in);
        in.ip += in.size;
    }
    Py_DECREF(r);
    return rc;
}

/* -- the image's mappings ---------------------------------------------------------- */

static void drop_map(struct pyfill *f)
{
    for (uint32_t i = 0; i < f->map.n; i++) {
        if (f->src[i].have)
            PyBuffer_Release(&f->src[i].buf);
        Py_XDECREF(f->src[i].load);
    }
    PyMem_Free(f->src);
    PyMem_Free(f->map.e);
    f->src = NULL;
    f->map.e = NULL;
    f->map.n = 0;
    f->usable = 0;
    Py_CLEAR(f->gen);
}

/* map <- mappings(image); -1 with an exception.  usable stays 0 where
 * the image gives no mappings (None) or ones the core does not take (not
 * in address order, overlapping) */
static int build_map(struct pyfill *f)
{
    drop_map(f);
    f->built = 1;
    PyObject *r = PyObject_CallOneArg(f->mappings, f->image);
    if (!r)
        return -1;
    if (r == Py_None) {
        Py_DECREF(r);
        return 0;
    }
    PyObject *g, *maps;
    if (!PyArg_ParseTuple(r, "OO;mappings", &g, &maps)) {
        Py_DECREF(r);
        return -1;
    }
    PyObject *seq = PySequence_Fast(maps, "mappings: not a sequence");
    if (!seq) {
        Py_DECREF(r);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = 1, in_order = n < UINT32_MAX;
    if (in_order && n) {
        f->map.e = PyMem_Calloc((size_t)n, sizeof *f->map.e);
        f->src = PyMem_Calloc((size_t)n, sizeof *f->src);
        if (!f->map.e || !f->src) {
            PyErr_NoMemory();
            ok = 0;
        }
    }
    for (Py_ssize_t i = 0; ok && in_order && i < n; i++) {
        unsigned long long begin, end_1, offset;
        PyObject *load;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KKKO;mapping",
                              &begin, &end_1, &offset, &load)) {
            ok = 0;
            break;
        }
        if (end_1 < begin ||
            (f->map.n && begin <= f->map.e[f->map.n - 1].last)) {
            in_order = 0;
            break;
        }
        struct imgmap_ent *e = &f->map.e[f->map.n];
        e->begin = begin;
        e->last = end_1;
        f->src[f->map.n].load = Py_NewRef(load);
        f->src[f->map.n].offset = offset;
        f->map.n++;
    }
    if (ok && in_order) {
        f->gen = Py_NewRef(g);          /* the generation they are of */
        f->usable = 1;
    } else {
        drop_map(f);
    }
    Py_DECREF(seq);
    Py_DECREF(r);
    return ok ? 0 : -1;
}

static int load(struct pyfill *f, uint32_t k)
{
    struct mapsrc *s = &f->src[k];
    struct imgmap_ent *e = &f->map.e[k];
    PyObject *data = PyObject_CallNoArgs(s->load);
    if (!data)
        return -1;
    int r = PyObject_GetBuffer(data, &s->buf, PyBUF_SIMPLE);
    Py_DECREF(data);
    if (r < 0)
        return -1;
    s->have = 1;
    static const uint8_t none[1];
    uint64_t len = (uint64_t)s->buf.len;
    e->bytes = s->offset < len ? (const uint8_t *)s->buf.buf + s->offset
                               : none;
    e->nbytes = s->offset < len ? len - s->offset : 0;
    return 0;
}

/* whether map is of the image as it is now (its generation): 1, 0, or
 * -1 with an exception */
static int current(struct pyfill *f)
{
    PyObject *gen = PyObject_GetAttr(f->image, str_generation);
    if (!gen)
        return -1;
    int same = gen == f->gen ? 1 : PyObject_RichCompareBool(gen, f->gen,
                                                            Py_EQ);
    Py_DECREF(gen);
    return same;
}

/* 1: the entry at ip is added; 0: the Python fill's case; < 0 */
static int c_fill(struct pyfill *f, struct icache *ic, uint64_t ip, int mode)
{
    if (mode < 0 || mode > 2)
        return 0;
    if (!f->built) {
        if (build_map(f) < 0)
            return -E_PYERR;
    } else if (f->usable) {
        int same = current(f);
        if (same < 0 || (!same && build_map(f) < 0))
            return -E_PYERR;
    }
    if (!f->usable)
        return 0;
    int k = imgmap_find(&f->map, ip);
    if (k < 0)
        return 0;
    if (!f->map.e[k].bytes && load(f, (uint32_t)k) < 0)
        return -E_PYERR;
    return imgmap_fill(ic, &f->map.e[k], ip, mode);
}

/* -- the handler ------------------------------------------------------------------- */

int pyfill_fill(void *ctx, struct icache *ic, uint64_t ip, int mode)
{
    struct pyfill *f = ctx;
    if (f->mappings) {
        int r = c_fill(f, ic, ip, mode);
        if (r < 0)
            return r;
        if (r) {
            f->n_c++;
            return 0;
        }
    }
    f->n_py++;
    if (!f->fill && !(f->fill = PyObject_CallOneArg(f->filler, f->image)))
        return -E_PYERR;
    return python_fill(f->fill, ic, ip, mode);
}

struct pyfill *pyfill_new(PyObject *image, PyObject *filler,
                          PyObject *mappings)
{
    if (!str_generation) {
        str_generation = PyUnicode_InternFromString("generation");
        if (!str_generation)
            return NULL;
    }
    struct pyfill *f = PyMem_Calloc(1, sizeof *f);
    if (!f) {
        PyErr_NoMemory();
        return NULL;
    }
    f->image = Py_NewRef(image);
    f->filler = Py_NewRef(filler);
    f->mappings = Py_XNewRef(mappings);
    return f;
}

void pyfill_free(struct pyfill *f)
{
    if (!f)
        return;
    drop_map(f);
    Py_XDECREF(f->image);
    Py_XDECREF(f->filler);
    Py_XDECREF(f->fill);
    Py_XDECREF(f->mappings);
    PyMem_Free(f);
}

int pyfill_traverse(struct pyfill *f, visitproc visit, void *arg)
{
    Py_VISIT(f->image);
    Py_VISIT(f->filler);
    Py_VISIT(f->fill);
    Py_VISIT(f->mappings);
    for (uint32_t i = 0; i < f->map.n; i++)
        Py_VISIT(f->src[i].load);
    return 0;
}

void pyfill_counts(const struct pyfill *f, uint64_t *in_c,
                   uint64_t *in_python)
{
    *in_c = f->n_c;
    *in_python = f->n_py;
}

/* -- the tests' hook ------------------------------------------------------------------ */

static PyObject *entry_tuple(const struct insn_info *i)
{
    return Py_BuildValue("(KiiiiiLKK)", (unsigned long long)i->ip, i->mode,
                         i->err, i->size, i->iclass, i->flags,
                         (long long)i->rel, (unsigned long long)i->lo,
                         (unsigned long long)i->last);
}

PyObject *pyfill_probe(PyObject *m, PyObject *args)
{
    PyObject *image, *filler, *mappings, *ips;
    int mode;
    (void)m;
    if (!PyArg_ParseTuple(args, "OOOOi", &image, &filler, &mappings, &ips,
                          &mode))
        return NULL;
    PyObject *seq = PySequence_Fast(ips, "fill_probe: ips");
    if (!seq)
        return NULL;
    struct pyfill *f = pyfill_new(image, filler,
                                  mappings == Py_None ? NULL : mappings);
    struct icache *ic = f ? ic_new(image, pyfill_fill, f) : NULL;
    PyObject *looked = NULL, *all = NULL, *out = NULL;
    if (f && !ic)
        PyErr_NoMemory();
    if (!ic || !(looked = PyList_New(0)))
        goto done;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        unsigned long long ip = PyLong_AsUnsignedLongLong(
            PySequence_Fast_GET_ITEM(seq, k));
        if (PyErr_Occurred())
            goto done;
        int err = 0;
        const struct insn_info *i = ic_lookup(ic, ip, mode, &err);
        if (!i) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_RuntimeError, "fill_probe: %s",
                             core_errstr(-err));
            goto done;
        }
        PyObject *t = entry_tuple(i);
        if (!t || PyList_Append(looked, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    all = PyList_New(0);
    for (uint32_t k = 0; all && k < ic->n; k++) {
        PyObject *t = entry_tuple(ic_entry(ic, k));
        if (!t || PyList_Append(all, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    if (all)
        out = Py_BuildValue("(OO(KK))", looked, all,
                            (unsigned long long)f->n_c,
                            (unsigned long long)f->n_py);
done:
    Py_XDECREF(all);
    Py_XDECREF(looked);
    Py_DECREF(seq);
    ic_free(ic);
    pyfill_free(f);
    return out;
}

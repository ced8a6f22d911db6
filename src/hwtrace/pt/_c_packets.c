/* Compiled core of hwtrace.pt.decoder: Intel PT packet scanning.
 *
 * The Python twin is hwtrace/pt/decoder.py; this file decodes exactly the
 * same packets, errors, offsets and resynchronization points (the tests
 * compare both on the corpus, on mutations and at every byte offset).
 * The boundary is narrow and stateless:
 *
 *   decode(buf, pos, flags)          -> packet record or PtError at pos
 *   PacketIter(dec, buf, pos, sync, flags[, release])
 *                                    the packets() loop: records and
 *                                    PtErrors, resync at the next PSB;
 *                                    stores dec._pos/_sync like the twin;
 *                                    calls release(pos) -> next offset to
 *                                    call it at, once the position reaches
 *                                    that offset (the first call at pos 0)
 *   count(buf, pos, sync, flags[, limit])
 *                                    -> (packets, errors, pos, sync): the
 *                                    same loop without creating objects,
 *                                    stopping at the first packet boundary
 *                                    at or past ``limit`` (default: the end)
 *   find_psb_forward(buf, start)     -> offset or -1
 *
 * ``buf`` is any object with the buffer protocol (bytes, a read-only mmap,
 * a memoryview: never copied; PacketIter holds the buffer until it is
 * exhausted or freed), ``pos`` < len(buf) for decode().  ``flags`` are the
 * FLAG_* constants (errata and libipt-2.0 switches).  Records are the
 * NamedTuple classes of hwtrace.pt.packets, built like tuple.__new__.
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 2

#include "_pt_packets.h"

static const char *const kind_class[PT_K_COUNT] = {
    "Pad", "Psb", "Psbend", "Ovf", "Stop", "Tnt8", "Tnt64", "Tip",
    "TipPge", "TipPgd", "Fup", "ModeExec", "ModeTsx", "Pip", "Tsc",
    "Cbr", "Tma", "Mtc", "Cyc", "Vmcs", "Mnt", "Exstop", "Mwait", "Pwre",
    "Pwrx", "Ptw", "Cfe", "Evd", "Trig", "Invalid"};

/* Set once at module initialization, never changed afterwards. */
static PyTypeObject *classes[PT_K_COUNT];
static PyTypeObject *pterror_class;
static PyObject *err_str[4];    /* indexed by -PT_EOS, -PT_BAD_OPC, ... */
static PyObject *empty_str;
static PyObject *str_pos, *str_sync;

/* ---- Python objects ---------------------------------------------------- */

static PyObject *new_tuple(PyTypeObject *cls, Py_ssize_t n)
{
    return cls->tp_alloc(cls, n);
}

static PyObject *make_record(const struct pt_pkt *k, Py_ssize_t offset)
{
    int nf = pt_kind_nfields[k->kind];
    PyObject *t = new_tuple(classes[k->kind], 2 + nf), *v;
    if (!t)
        return NULL;
    if (!(v = PyLong_FromSsize_t(offset)))
        goto fail;
    PyTuple_SET_ITEM(t, 0, v);
    if (!(v = PyLong_FromLong(k->size)))
        goto fail;
    PyTuple_SET_ITEM(t, 1, v);
    for (int i = 0; i < nf; i++) {
        if (!(v = PyLong_FromUnsignedLongLong(k->f[i])))
            goto fail;
        PyTuple_SET_ITEM(t, 2 + i, v);
    }
    return t;
fail:
    Py_DECREF(t);
    return NULL;
}

static PyObject *make_error(int r, Py_ssize_t offset)
{
    PyObject *t = new_tuple(pterror_class, 3), *v;
    if (!t)
        return NULL;
    Py_INCREF(err_str[-r]);
    PyTuple_SET_ITEM(t, 0, err_str[-r]);
    if (!(v = PyLong_FromSsize_t(offset))) {
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 1, v);
    Py_INCREF(empty_str);
    PyTuple_SET_ITEM(t, 2, empty_str);
    return t;
}

/* The bytes of ``o`` (any C-contiguous buffer, read in place): fills
 * ``view`` (release it with PyBuffer_Release, also after a failure). */
static int get_buffer(PyObject *o, Py_buffer *view, const uint8_t **b,
                      Py_ssize_t *n)
{
    if (PyObject_GetBuffer(o, view, PyBUF_SIMPLE) < 0) {
        view->obj = NULL;
        return -1;
    }
    *b = (const uint8_t *)view->buf;
    *n = view->len;
    return 0;
}

static int get_ssize(PyObject *o, Py_ssize_t *v)
{
    *v = PyLong_AsSsize_t(o);
    return (*v == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* decode(buf, pos, flags): the packet at pos (0 <= pos < len(buf)). */
static PyObject *py_decode(PyObject *self, PyObject *const *args,
                           Py_ssize_t nargs)
{
    const uint8_t *b;
    Py_ssize_t e, p, flags;
    struct pt_pkt k;
    Py_buffer view;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(buf, pos, flags)");
        return NULL;
    }
    if (get_ssize(args[1], &p) || get_ssize(args[2], &flags))
        return NULL;
    if (PyBytes_CheckExact(args[0])) {      /* no buffer export needed */
        b = (const uint8_t *)PyBytes_AS_STRING(args[0]);
        e = PyBytes_GET_SIZE(args[0]);
        view.obj = NULL;
    } else if (get_buffer(args[0], &view, &b, &e))
        return NULL;
    PyObject *res;
    if (p < 0 || p >= e)
        res = make_error(PT_EOS, p);
    else {
        int r = pt_decode_at(b, p, e, (unsigned)flags, &k);
        res = r > 0 ? make_record(&k, p) : make_error(r, p);
    }
    if (view.obj)
        PyBuffer_Release(&view);
    return res;
}

/* count(buf, pos, sync, flags) -> (packets, errors, pos, sync) */
static PyObject *py_count(PyObject *self, PyObject *const *args,
                          Py_ssize_t nargs)
{
    const uint8_t *b;
    Py_ssize_t e, pos, sync, flags, limit = PY_SSIZE_T_MAX;
    Py_ssize_t npk = 0, nerr = 0;
    struct pt_pkt k;
    Py_buffer view;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "count(buf, pos, sync, flags[, limit])");
        return NULL;
    }
    if (get_ssize(args[1], &pos) || get_ssize(args[2], &sync)
            || get_ssize(args[3], &flags)
            || (nargs == 5 && get_ssize(args[4], &limit)))
        return NULL;
    if (get_buffer(args[0], &view, &b, &e))
        return NULL;
    if (limit > e)
        limit = e;
    unsigned fl = (unsigned)flags;
    Py_BEGIN_ALLOW_THREADS
    while (pos < limit) {
        int r = pt_decode_at(b, pos, e, fl, &k);
        if (r > 0) {
            pos += r;
            npk++;
            continue;
        }
        if (r == PT_EOS)
            break;
        nerr++;
        Py_ssize_t found = pt_find_psb(b, e, pt_resync_start(pos, sync));
        if (found < 0)
            break;
        pos = sync = found;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnnn)", npk, nerr, pos, sync);
}

static PyObject *py_find_psb_forward(PyObject *self, PyObject *const *args,
                                     Py_ssize_t nargs)
{
    const uint8_t *b;
    Py_ssize_t e, start, found;
    Py_buffer view;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "find_psb_forward(buf, start)");
        return NULL;
    }
    if (get_ssize(args[1], &start) || get_buffer(args[0], &view, &b, &e))
        return NULL;
    if (start < 0)
        start = 0;
    found = pt_find_psb(b, e, start);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
}

/* ---- PacketIter: the packets() loop ------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *dec;      /* the PacketDecoder whose _pos/_sync we keep */
    Py_buffer view;     /* the trace, held while iterating (obj: NULL after) */
    PyObject *release;  /* release(pos) -> next release offset, or NULL */
    Py_ssize_t release_at;
    Py_ssize_t pos, sync;
    unsigned flags;
    int done;           /* exhausted: position stored */
    int resync;         /* an error was yielded: resync next */
} PacketIter;

/* Store pos (and sync) into the decoder, as the twin's finally clause and
 * sync_forward() do.  Preserves a pending exception. */
static int store_position(PacketIter *it, int with_sync)
{
    PyObject *exc_type, *exc_value, *exc_tb, *v;
    int rc = 0;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    v = PyLong_FromSsize_t(it->pos);
    if (!v || PyObject_SetAttr(it->dec, str_pos, v) < 0)
        rc = -1;
    Py_XDECREF(v);
    if (rc == 0 && with_sync) {
        v = PyLong_FromSsize_t(it->sync);
        if (!v || PyObject_SetAttr(it->dec, str_sync, v) < 0)
            rc = -1;
        Py_XDECREF(v);
    }
    if (rc == 0)
        PyErr_Restore(exc_type, exc_value, exc_tb);
    else {
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
    }
    return rc;
}

/* Give the buffer back (its owner, e.g. an mmap, can then be closed). */
static void iter_drop_buffer(PacketIter *it)
{
    if (it->view.obj)
        PyBuffer_Release(&it->view);
    it->view.obj = NULL;
    Py_CLEAR(it->release);
}

static PyObject *iter_finish(PacketIter *it)
{
    if (!it->done) {
        it->done = 1;
        store_position(it, 1);
    }
    iter_drop_buffer(it);
    return NULL;
}

/* Call release(pos) once pos reaches release_at; it returns the next. */
static int iter_release(PacketIter *it)
{
    PyObject *pos = PyLong_FromSsize_t(it->pos), *r;
    if (!pos)
        return -1;
    r = PyObject_CallOneArg(it->release, pos);
    Py_DECREF(pos);
    if (!r)
        return -1;
    it->release_at = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    return (it->release_at == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *iter_next(PacketIter *it)
{
    if (it->done)
        return NULL;
    const uint8_t *b = (const uint8_t *)it->view.buf;
    Py_ssize_t e = it->view.len, p;
    struct pt_pkt k;
    if (it->resync) {
        /* after an error: the twin's sync_forward() on resuming */
        it->resync = 0;
        Py_ssize_t found = pt_find_psb(b, e, pt_resync_start(it->pos, it->sync));
        if (found < 0) {
            it->done = 1;       /* offset stays at the error */
            iter_drop_buffer(it);
            return NULL;
        }
        it->pos = it->sync = found;
        if (store_position(it, 1) < 0)
            return NULL;
    }
    p = it->pos;
    if (p >= e)
        return iter_finish(it);
    if (it->release && p >= it->release_at && iter_release(it) < 0)
        return NULL;
    int r = pt_decode_at(b, p, e, it->flags, &k);
    if (r > 0) {
        PyObject *rec = make_record(&k, p);
        if (rec)
            it->pos = p + r;
        return rec;
    }
    if (r == PT_EOS)
        return iter_finish(it);
    PyObject *err = make_error(r, p);
    if (!err || store_position(it, 0) < 0) {
        Py_XDECREF(err);
        return NULL;
    }
    it->resync = 1;
    return err;
}

static PyObject *iter_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *dec, *buf, *release = Py_None;
    Py_ssize_t pos, sync, flags;
    if (!PyArg_ParseTuple(args, "OOnnn|O:PacketIter", &dec, &buf, &pos,
                          &sync, &flags, &release))
        return NULL;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "negative position");
        return NULL;
    }
    if (release != Py_None && !PyCallable_Check(release)) {
        PyErr_SetString(PyExc_TypeError, "release must be callable or None");
        return NULL;
    }
    PacketIter *it = (PacketIter *)type->tp_alloc(type, 0);
    if (!it)
        return NULL;
    if (PyObject_GetBuffer(buf, &it->view, PyBUF_SIMPLE) < 0) {
        it->view.obj = NULL;
        it->done = 1;
        Py_DECREF(it);
        return NULL;
    }
    Py_INCREF(dec);
    it->dec = dec;
    it->release = release == Py_None ? NULL : Py_NewRef(release);
    it->release_at = 0;
    it->pos = pos;
    it->sync = sync;
    it->flags = (unsigned)flags;
    it->done = 0;
    it->resync = 0;
    return (PyObject *)it;
}

static void iter_dealloc(PacketIter *it)
{
    PyObject_GC_UnTrack(it);
    if (!it->done && it->dec) {
        it->done = 1;
        if (store_position(it, 1) < 0)
            PyErr_WriteUnraisable((PyObject *)it);
    }
    Py_CLEAR(it->dec);
    iter_drop_buffer(it);
    Py_TYPE(it)->tp_free((PyObject *)it);
}

static int iter_traverse(PacketIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->dec);
    Py_VISIT(it->view.obj);
    Py_VISIT(it->release);
    return 0;
}

static int iter_clear(PacketIter *it)
{
    it->done = 1;
    Py_CLEAR(it->dec);
    iter_drop_buffer(it);
    return 0;
}

static PyTypeObject PacketIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hwtrace.pt._c_packets.PacketIter",
    .tp_basicsize = sizeof(PacketIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "PacketIter(decoder, buf, pos, sync, flags[, release]): "
              "packets() loop",
    .tp_new = iter_new,
    .tp_dealloc = (destructor)iter_dealloc,
    .tp_traverse = (traverseproc)iter_traverse,
    .tp_clear = (inquiry)iter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iter_next,
};

/* ---- module ------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL,
     "decode(buf, pos, flags) -> the packet record or PtError at pos"},
    {"count", (PyCFunction)(void (*)(void))py_count, METH_FASTCALL,
     "count(buf, pos, sync, flags) -> (packets, errors, pos, sync)"},
    {"find_psb_forward", (PyCFunction)(void (*)(void))py_find_psb_forward,
     METH_FASTCALL, "find_psb_forward(buf, start) -> offset or -1"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_c_packets",
    "Compiled Intel PT packet scanner (twin: hwtrace.pt.decoder).", -1,
    methods
};

static int get_class(PyObject *mod, const char *name, PyTypeObject **out)
{
    PyObject *c = PyObject_GetAttrString(mod, name);
    if (!c)
        return -1;
    if (!PyType_Check(c) || !PyType_IsSubtype((PyTypeObject *)c,
                                               &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "%s is not a tuple type", name);
        Py_DECREF(c);
        return -1;
    }
    *out = (PyTypeObject *)c;       /* reference kept for the process */
    return 0;
}

static int get_str(PyObject *mod, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(mod, name);
    return *out ? 0 : -1;
}

PyMODINIT_FUNC PyInit__c_packets(void)
{
    PyObject *m = NULL, *pk = NULL, *er = NULL;
    pk = PyImport_ImportModule("hwtrace.pt.packets");
    er = PyImport_ImportModule("hwtrace.pt.errors");
    if (!pk || !er)
        goto fail;
    for (int i = 0; i < PT_K_COUNT; i++)
        if (get_class(pk, kind_class[i], &classes[i]))
            goto fail;
    if (get_class(er, "PtError", &pterror_class)
            || get_str(er, "EOS", &err_str[-PT_EOS])
            || get_str(er, "BAD_OPC", &err_str[-PT_BAD_OPC])
            || get_str(er, "BAD_PACKET", &err_str[-PT_BAD_PACKET]))
        goto fail;
    empty_str = PyUnicode_FromString("");
    str_pos = PyUnicode_InternFromString("_pos");
    str_sync = PyUnicode_InternFromString("_sync");
    if (!empty_str || !str_pos || !str_sync)
        goto fail;
    if (PyType_Ready(&PacketIterType) < 0)
        goto fail;
    m = PyModule_Create(&moduledef);
    if (!m)
        goto fail;
    Py_INCREF(&PacketIterType);
    if (PyModule_AddObject(m, "PacketIter", (PyObject *)&PacketIterType) < 0
            || PyModule_AddIntConstant(m, "ABI", ABI) < 0
            || PyModule_AddStringConstant(m, "SOURCE_SHA256",
                                          HWTRACE_SOURCE_SHA256) < 0
            || PyModule_AddIntConstant(m, "FLAG_SKD007", PT_FLAG_SKD007) < 0
            || PyModule_AddIntConstant(m, "FLAG_SKZ84", PT_FLAG_SKZ84) < 0
            || PyModule_AddIntConstant(m, "FLAG_NO_CFE", PT_FLAG_NO_CFE) < 0
            || PyModule_AddIntConstant(m, "FLAG_NO_EVD", PT_FLAG_NO_EVD) < 0
            || PyModule_AddIntConstant(m, "FLAG_NO_TRIG", PT_FLAG_NO_TRIG) < 0)
        goto fail;
    Py_DECREF(pk);
    Py_DECREF(er);
    return m;
fail:
    Py_XDECREF(m);
    Py_XDECREF(pk);
    Py_XDECREF(er);
    return NULL;
}

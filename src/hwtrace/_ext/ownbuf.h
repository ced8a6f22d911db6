/* Memory a compiled core filled, handed to Python as it is: an object
 * that owns it (releasing it with the function it was given when it
 * goes) and lends it, writable, through the buffer protocol --
 * np.frombuffer over it instead of over a bytes or bytearray copy.
 *
 * Header only (each extension its own type): define OWNBUF_NAME, the
 * type's dotted name, before including it, and call ownbuf_ready() at
 * module init. */
#ifndef HWTRACE_EXT_OWNBUF_H
#define HWTRACE_EXT_OWNBUF_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef OWNBUF_NAME
#error "define OWNBUF_NAME (the type's dotted name) before including ownbuf.h"
#endif

typedef struct {
    PyObject_HEAD
    void *p;
    Py_ssize_t n;
    void (*release)(void *);
} OwnBuf;

static char ownbuf_empty_[1];

static int ownbuf_getbuffer_(PyObject *self, Py_buffer *view, int flags)
{
    OwnBuf *o = (OwnBuf *)self;
    return PyBuffer_FillInfo(view, self, o->p ? o->p : (void *)ownbuf_empty_,
                             o->n, 0, flags);
}

static void ownbuf_dealloc_(PyObject *self)
{
    OwnBuf *o = (OwnBuf *)self;
    if (o->p && o->release)
        o->release(o->p);
    Py_TYPE(self)->tp_free(self);
}

static Py_ssize_t ownbuf_len_(PyObject *self)
{
    return ((OwnBuf *)self)->n;
}

static PyBufferProcs ownbuf_as_buffer_ = {ownbuf_getbuffer_, NULL};
static PySequenceMethods ownbuf_as_sequence_ = {.sq_length = ownbuf_len_};

static PyTypeObject OwnBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = OWNBUF_NAME,
    .tp_doc = "memory a compiled core filled (a buffer: numpy.frombuffer)",
    .tp_basicsize = sizeof(OwnBuf),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = ownbuf_dealloc_,
    .tp_as_buffer = &ownbuf_as_buffer_,
    .tp_as_sequence = &ownbuf_as_sequence_,
};

static inline int ownbuf_ready(void)
{
    return PyType_Ready(&OwnBufType);
}

/* A new object owning p's n bytes (release(p) when it goes); NULL with an
 * exception set on failure, p then still the caller's. */
static inline PyObject *ownbuf_new(void *p, Py_ssize_t n, void (*release)(void *))
{
    OwnBuf *o = PyObject_New(OwnBuf, &OwnBufType);
    if (!o)
        return NULL;
    o->p = p;
    o->n = n;
    o->release = release;
    return (PyObject *)o;
}

#endif

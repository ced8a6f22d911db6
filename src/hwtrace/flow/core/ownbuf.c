/* Record buffers owned by a Python object: see ownbuf.h. */
#include "ownbuf.h"

typedef struct {
    PyObject_HEAD
    uint8_t *p;
    Py_ssize_t n;
} OwnBuf;

static char EMPTY[1];

static int ownbuf_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    OwnBuf *o = (OwnBuf *)self;
    return PyBuffer_FillInfo(view, self, o->p ? (void *)o->p : (void *)EMPTY,
                             o->n, 0, flags);
}

static void ownbuf_dealloc(PyObject *self)
{
    free(((OwnBuf *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static Py_ssize_t ownbuf_len(PyObject *self)
{
    return ((OwnBuf *)self)->n;
}

static PyBufferProcs OWNBUF_AS_BUFFER = {ownbuf_getbuffer, NULL};
static PySequenceMethods OWNBUF_AS_SEQUENCE = {.sq_length = ownbuf_len};

static PyTypeObject OwnBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hwtrace.flow._c_flow.RecordBuffer",
    .tp_doc = "a batch's records, as the compiled core wrote them",
    .tp_basicsize = sizeof(OwnBuf),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = ownbuf_dealloc,
    .tp_as_buffer = &OWNBUF_AS_BUFFER,
    .tp_as_sequence = &OWNBUF_AS_SEQUENCE,
};

int ownbuf_ready(void)
{
    return PyType_Ready(&OwnBufType);
}

PyObject *ownbuf_take(struct bytebuf *b)
{
    OwnBuf *o = PyObject_New(OwnBuf, &OwnBufType);
    if (!o)
        return NULL;
    size_t n = b->n;
    uint8_t *p = b->p;
    if (p && n < b->cap) {
        uint8_t *q = realloc(p, n ? n : 1);     /* (shrinking: in place) */
        if (q)
            p = q;
    }
    o->p = p;
    o->n = (Py_ssize_t)n;
    b->p = NULL;
    b->n = b->cap = 0;
    /* room for the next batch's, up to 64 MB (none if it cannot be had:
       bb_reserve tries again as records come) */
    if (n)
        (void)bb_reserve(b, n < (64u << 20) ? n : (64u << 20));
    return (PyObject *)o;
}

/* The export core's shared pieces (textcols.h): lending the output
 * buffer to write(), tables of bytes, the column check. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "textcols.h"

int tc_lend(Buf *b, PyObject *write)
{
    if (!b->len)
        return 0;
    PyObject *chunk = PyMemoryView_FromMemory(b->p, b->len, PyBUF_READ);
    if (!chunk)
        return -1;
    PyObject *r = PyObject_CallOneArg(write, chunk);
    PyObject *rel = PyObject_CallMethod(chunk, "release", NULL);
    Py_DECREF(chunk);
    if (!r) {
        Py_XDECREF(rel);
        return -1;
    }
    Py_DECREF(r);
    if (!rel)
        return -1;
    Py_DECREF(rel);
    b->len = 0;
    return 0;
}

int tc_tab_get(PyObject *o, Tab *t)
{
    PyObject *seq = PySequence_Fast(o, "slice_packets: a table is a sequence");
    if (!seq)
        return -1;
    t->n = PySequence_Fast_GET_SIZE(seq);
    t->sp = PyMem_Malloc((t->n ? t->n : 1) * sizeof(char *));
    t->sl = PyMem_Malloc((t->n ? t->n : 1) * sizeof(Py_ssize_t));
    if (!t->sp || !t->sl) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < t->n; j++) {
        PyObject *s = PySequence_Fast_GET_ITEM(seq, j);
        if (!PyBytes_Check(s)) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "slice_packets: table entries are bytes");
            return -1;
        }
        /* the bytes live as long as the caller's table */
        t->sp[j] = PyBytes_AS_STRING(s);
        t->sl[j] = PyBytes_GET_SIZE(s);
    }
    Py_DECREF(seq);
    return 0;
}

int tc_get_buf(PyObject *o, Py_buffer *b, int *has, Py_ssize_t n, Py_ssize_t item,
               const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    *has = 1;
    if (b->len != n * item) {
        PyErr_Format(PyExc_ValueError, "rows: %s has %zd bytes, not %zd", what,
                     b->len, n * item);
        return -1;
    }
    return 0;
}

#include "segment.h"

PyObject *py_segment(PyObject *m, PyObject *args)
{
    (void)m; (void)args;
    PyErr_SetString(PyExc_NotImplementedError, "segment");
    return NULL;
}

PyObject *py_state_probe(PyObject *m, PyObject *args)
{
    (void)m; (void)args;
    PyErr_SetString(PyExc_NotImplementedError, "state_probe");
    return NULL;
}

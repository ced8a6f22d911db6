/* What hwtrace.analysis' compiled core shares between its files: buffers
 * in (a C-contiguous buffer of n items of itemsize bytes) and the call-path
 * multiplier (slices.PATH_MUL).  Included after <Python.h>. */
#ifndef HWTRACE_ANALYSIS_BUF_H
#define HWTRACE_ANALYSIS_BUF_H

#include <stdint.h>

#define PATH_MUL 0x100000001B3ull

/* -- buffers in ------------------------------------------------------------- */
static inline int get_buf(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t n,
                   const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->len % itemsize || (n >= 0 && b->len / itemsize != n)) {
        PyErr_Format(PyExc_ValueError, "walk: %s has the wrong size", what);
        PyBuffer_Release(b);
        b->obj = NULL;
        return -1;
    }
    return 0;
}

/* release every buffer of the list that was got (obj set) */
static inline void release_bufs(Py_buffer *const *bufs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (bufs[i]->obj)
            PyBuffer_Release(bufs[i]);
}
#define RELEASE_BUFS(...)                                                       \
    release_bufs((Py_buffer *[]){__VA_ARGS__},                                  \
                 sizeof((Py_buffer *[]){__VA_ARGS__}) / sizeof(Py_buffer *))

#endif

/* The compiled x86 decoder's module functions of _c_flow (pyx86.c). */
#ifndef HWTRACE_CORE_PYX86_H
#define HWTRACE_CORE_PYX86_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* x86_decode(code, mode) -> (size, iclass, kind, rel, flags), or
 * ("truncated", needed) / ("invalid", 0) */
PyObject *py_x86_decode(PyObject *m, PyObject *args);
/* x86_fill(code, mode, max) -> None, or (records, used, count, done) */
PyObject *py_x86_fill(PyObject *m, PyObject *args);

#endif

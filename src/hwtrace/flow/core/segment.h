/* Segment jobs of the parallel counts path (hwtrace.flow.fast_parallel):
 * a decode from a PSB recording checkpoints of the decode state. */
#ifndef HWTRACE_CORE_SEGMENT_H
#define HWTRACE_CORE_SEGMENT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SEGMENT_DOC "segment(...): not yet"
#define STATE_PROBE_DOC "state_probe(...): not yet"

PyObject *py_segment(PyObject *m, PyObject *args);
PyObject *py_state_probe(PyObject *m, PyObject *args);

#endif

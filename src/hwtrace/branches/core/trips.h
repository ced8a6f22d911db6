/* The branch source's compiled runs (twin: hwtrace.branches.decoded._Consumer):
 * the boundary between _c_format.c (the module) and core/trips.c.
 *
 *   transfers(...)   a run of a batch's records as branch records
 *                    (twin: _Consumer._vector)
 *   trips(...)       runs and the system-call round trips between them,
 *                    the events from the items and the plain rows
 *                    (twin: _Consumer.feed_batch's loop over both)
 *
 * Both are METH_FASTCALL functions; trips.c documents their arguments. */
#ifndef HWTRACE_BRANCHES_TRIPS_H
#define HWTRACE_BRANCHES_TRIPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *bt_transfers(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *bt_trips(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif

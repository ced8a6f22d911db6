/* The rows after the call-stack matching (rows.c), as methods of
 * hwtrace.analysis._c_runs; their Python twins are in clock.py, rows.py,
 * runs.py (commit), profile.py, batchfeed.py and branches/calls.py (see
 * rows.c).  Included after <Python.h>. */
#ifndef HWTRACE_ANALYSIS_ROWS_H
#define HWTRACE_ANALYSIS_ROWS_H

#define ROWS_FN(name) \
    PyObject *hw_rows_##name(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
ROWS_FN(times);
ROWS_FN(begins);
ROWS_FN(children);
ROWS_FN(outermost);
ROWS_FN(records);
ROWS_FN(commit);
ROWS_FN(dense_rows);

#define ROWS_METHOD(name, doc) \
    {#name, (PyCFunction)(void (*)(void))hw_rows_##name, METH_FASTCALL, doc}
#define ROWS_METHODS \
    ROWS_METHOD(times, "Times of rows between the clock's anchors (clock.TimeBase.times)."), \
    ROWS_METHOD(begins, "Begin times of ending rows from the begin rows " \
                "(rows.Pending._begins)."), \
    ROWS_METHOD(children, "Callee sums of ending rows (rows.Pending._children)."), \
    ROWS_METHOD(outermost, "Ending activations no same-function one encloses " \
                "(profile.Profile._outermost)."), \
    ROWS_METHOD(records, "A batch's record columns as the builder reads them " \
                "(blockcols.columns)."), \
    ROWS_METHOD(commit, "The rows of a match (runs.commit)."), \
    ROWS_METHOD(dense_rows, "Rows of (hi, lo) keys in a dense int32 table " \
                "(branches.calls' heads).")

#endif

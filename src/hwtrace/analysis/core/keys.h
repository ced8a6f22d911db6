/* A table of distinct uint64 keys held in the caller's numpy arrays
 * (keys.c), as methods of hwtrace.analysis._c_runs; its Python side is
 * slices.KeyIndex, whose twins are the sorted tables of slices.PathTable
 * and export.folded._Weights.  Included after <Python.h>. */
#ifndef HWTRACE_ANALYSIS_KEYS_H
#define HWTRACE_ANALYSIS_KEYS_H

#define KEYS_FN(name) \
    PyObject *hw_keys_##name(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
KEYS_FN(index);
KEYS_FN(find);

#define KEYS_METHOD(name, doc) \
    {"keys_" #name, (PyCFunction)(void (*)(void))hw_keys_##name, METH_FASTCALL, doc}
#define KEYS_METHODS \
    KEYS_METHOD(index, "Numbers of keys, new keys added (slices.KeyIndex.add)."), \
    KEYS_METHOD(find, "Numbers of known keys, -1 for others (slices.KeyIndex.find).")

#endif

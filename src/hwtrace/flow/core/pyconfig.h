/* The flow core's configuration at the Python boundary (pyconfig.c). */
#ifndef HWTRACE_CORE_PYCONFIG_H
#define HWTRACE_CORE_PYCONFIG_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"

/* t: hwtrace.flow.fast._config_tuple(...) -> c (errata bits, address
 * filter, timing, flags); -1 with a Python exception if malformed */
int parse_config(PyObject *t, struct core_config *c);

#endif

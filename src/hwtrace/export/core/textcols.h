/* What the export core's files share (_c_textcols.c and core/ files; the
 * module's methods are listed there): a growable output buffer lent to a
 * write() callback a chunk at a time, tables of bytes, the column check.
 * Included after <Python.h>. */
#ifndef HWTRACE_EXPORT_TEXTCOLS_H
#define HWTRACE_EXPORT_TEXTCOLS_H

#include <stdint.h>

#include "../../_ext/textput.h"

/* -- output ------------------------------------------------------------------------ */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static inline int buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n)
            cap *= 2;
        char *q = PyMem_Realloc(b->p, cap);
        if (!q) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = q;
        b->cap = cap;
    }
    put(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* what b holds to write(), lent as a read-only memoryview over b's own
   memory (no bytes object: a BufferedWriter hands a chunk bigger than its
   buffer straight to the file) and released after the call, so a writer
   that kept it can not see b reused; b emptied.  0, or -1 with an
   exception set */
int tc_lend(Buf *b, PyObject *write);

/* bytes gathered before each write: at least a 1 MB file buffer, which a
   BufferedWriter then passes on without copying (4 MB chunks cost more
   system time here than they saved); made while the last are still in
   the cache */
#define STREAM_CHUNK (1 << 20)

/* -- input ------------------------------------------------------------------------- */
typedef struct {
    const char **sp;
    Py_ssize_t *sl, n;
} Tab;

/* a sequence of bytes as pointers and lengths (the bytes live as long as
   the caller's table); 0, or -1 with an exception set (t's arrays to
   PyMem_Free either way) */
int tc_tab_get(PyObject *o, Tab *t);

/* o as a C-contiguous buffer of n items of ``item`` bytes (*has set once
   b must be released); 0, or -1 with an exception set */
int tc_get_buf(PyObject *o, Py_buffer *b, int *has, Py_ssize_t n, Py_ssize_t item,
               const char *what);

/* -- the module's methods (core/ files) ------------------------------------------------- */
PyObject *tc_folded(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *tc_slice_packets(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *tc_chrome_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif

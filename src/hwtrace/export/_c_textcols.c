/* Compiled core of hwtrace.export.textcols: a Lines' columns side by side.
 *
 * The Python twin is Lines.render / Lines.text (a byte matrix of the
 * columns and a mask or NULs squeezed out); this copies each row's bytes
 * of each column straight into the output.  The boundary is narrow and
 * stateless:
 *
 *   assemble(n, cols) -> bytes
 *
 * ``cols``: a list of (m, rowwise, right, ln): ``m`` a C-contiguous uint8
 * buffer, either one row of w bytes for every line (rowwise false) or n
 * rows of w bytes (rowwise true); ``ln`` None (all w bytes of the row) or
 * an int64 buffer of n lengths, clamped to [0, w], of the bytes taken from
 * the row's left (right false) or right end (right true).
 *
 *   digits(v, width) -> bytearray
 *
 * The twin of textcols._digits: n rows of ``width`` ASCII digits, the
 * uint64 values of ``v`` right-aligned and zero-padded (the low ``width``
 * digits of a value with more).
 *
 * ABI is bumped whenever this interface changes; SOURCE_SHA256 is set by
 * setup.py so that the selector (hwtrace._ext) can detect a stale build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif
#define ABI 2

typedef struct {
    Py_buffer m, ln;
    int has_m, has_ln;
    int rowwise, right;
    Py_ssize_t w;
} Col;

static PyObject *py_assemble(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "assemble(n, cols)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "assemble: n < 0");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "cols must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t nc = PySequence_Fast_GET_SIZE(seq);
    Col *cols = PyMem_Calloc(nc ? nc : 1, sizeof(Col));
    PyObject *res = NULL;
    if (!cols) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t c = 0; c < nc; c++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, c);
        Col *k = &cols[c];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
            PyErr_SetString(PyExc_TypeError, "assemble: a column is (m, rowwise, right, ln)");
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 0), &k->m, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        k->has_m = 1;
        k->rowwise = PyObject_IsTrue(PyTuple_GET_ITEM(t, 1));
        k->right = PyObject_IsTrue(PyTuple_GET_ITEM(t, 2));
        if (k->rowwise < 0 || k->right < 0)
            goto done;
        if (k->rowwise) {
            if (n == 0 ? k->m.len != 0 : k->m.len % n) {
                PyErr_SetString(PyExc_ValueError, "assemble: matrix rows != n");
                goto done;
            }
            k->w = n ? k->m.len / n : 0;
        } else {
            k->w = k->m.len;
        }
        PyObject *lo = PyTuple_GET_ITEM(t, 3);
        if (lo != Py_None) {
            if (PyObject_GetBuffer(lo, &k->ln, PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            k->has_ln = 1;
            if (k->ln.len != n * 8) {
                PyErr_SetString(PyExc_ValueError, "assemble: lengths != n");
                goto done;
            }
        }
        total += k->w;
    }
    /* the exact size first */
    Py_ssize_t size = 0;
    for (Py_ssize_t c = 0; c < nc; c++) {
        Col *k = &cols[c];
        if (!k->has_ln) {
            size += k->w * n;
            continue;
        }
        const int64_t *ln = k->ln.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t l = ln[i];
            size += l < 0 ? 0 : (l > k->w ? k->w : l);
        }
    }
    res = PyBytes_FromStringAndSize(NULL, size);
    if (!res)
        goto done;
    char *p = PyBytes_AS_STRING(res);
    for (Py_ssize_t i = 0; i < n; i++) {
        for (Py_ssize_t c = 0; c < nc; c++) {
            Col *k = &cols[c];
            const char *row = (const char *)k->m.buf + (k->rowwise ? i * k->w : 0);
            Py_ssize_t l = k->w;
            if (k->has_ln) {
                int64_t v = ((const int64_t *)k->ln.buf)[i];
                l = v < 0 ? 0 : (v > k->w ? k->w : v);
            }
            if (!l)
                continue;
            memcpy(p, k->right ? row + (k->w - l) : row, l);
            p += l;
        }
    }
    (void)total;
done:
    if (cols) {
        for (Py_ssize_t c = 0; c < nc; c++) {
            if (cols[c].has_m)
                PyBuffer_Release(&cols[c].m);
            if (cols[c].has_ln)
                PyBuffer_Release(&cols[c].ln);
        }
        PyMem_Free(cols);
    }
    Py_DECREF(seq);
    return res;
}

static PyObject *py_digits(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "digits(v, width)");
        return NULL;
    }
    Py_ssize_t w = PyLong_AsSsize_t(args[1]);
    if (w < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "digits: width < 0");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *res = NULL;
    if (b.len % 8) {
        PyErr_SetString(PyExc_ValueError, "digits: v is not uint64");
        goto done;
    }
    Py_ssize_t n = b.len / 8;
    res = PyByteArray_FromStringAndSize(NULL, n * w);
    if (!res)
        goto done;
    char *out = PyByteArray_AS_STRING(res);
    const uint64_t *v = b.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x = v[i];
        char *row = out + i * w;
        for (Py_ssize_t k = w - 1; k >= 0; k--) {
            row[k] = (char)('0' + x % 10);
            x /= 10;
        }
    }
done:
    PyBuffer_Release(&b);
    return res;
}

static PyMethodDef methods[] = {
    {"assemble", (PyCFunction)(void (*)(void))py_assemble, METH_FASTCALL,
     "assemble(n, cols) -> bytes"},
    {"digits", (PyCFunction)(void (*)(void))py_digits, METH_FASTCALL,
     "digits(v, width) -> bytearray"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_c_textcols",
    "Compiled column assembly (twin: hwtrace.export.textcols.Lines).", -1,
    methods
};

PyMODINIT_FUNC PyInit__c_textcols(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", ABI) < 0
            || PyModule_AddStringConstant(m, "SOURCE_SHA256",
                                          HWTRACE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

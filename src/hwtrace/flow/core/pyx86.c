/* The compiled x86 decoder (x86.h) at the Python boundary: the module
 * functions x86_decode (the differential tests' hook) and x86_fill
 * (hwtrace.flow.fast.filler's records for what the C fills leave to
 * Python). */
#include "pyx86.h"

#include "common.h"
#include "x86.h"

/* x86_decode(code, mode) -> (size, iclass, kind, rel, flags), or
 * ("truncated", needed) / ("invalid", 0): hwtrace.x86.decode(code, mode)
 * (rel as the twin gives it: signed, JMPABS's target unsigned; flags as
 * fast._flags_of without IF_TRUNC) -- the differential tests' hook */
PyObject *py_x86_decode(PyObject *m, PyObject *args)
{
    Py_buffer v;
    int mode, needed = 0;
    (void)m;
    if (!PyArg_ParseTuple(args, "y*i", &v, &mode))
        return NULL;
    if (mode < 1 || mode > 3) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "x86_decode: bad mode");
        return NULL;
    }
    struct x86_insn x;
    int r = x86_decode(v.buf, (size_t)v.len, mode, &x, &needed);
    PyBuffer_Release(&v);
    if (r == X86_TRUNC)
        return Py_BuildValue("(si)", "truncated", needed);
    if (r != X86_OK)
        return Py_BuildValue("(si)", "invalid", 0);
    PyObject *rel = x.kind == K_JMPABS
        ? PyLong_FromUnsignedLongLong((unsigned long long)x.rel)
        : PyLong_FromLongLong((long long)x.rel);
    if (!rel)
        return NULL;
    return Py_BuildValue("(iiiNi)", x.size, x.iclass, x.kind, rel,
                         x86_flags(&x));
}

/* x86_fill(code, mode, max) -> None if the first instruction does not
 * decode (no bytes, truncated or invalid: the twin's path), else (records, used,
 * count, done): fast._REC records of the instructions from code[0] on --
 * plain ones and the one that ends them, at most max -- ``used`` bytes.
 * done: nothing follows (a non-OTHER instruction, max reached, or an
 * invalid one next); else the bytes ran out (or end inside the next
 * instruction) and the twin goes on at ``used``. */
PyObject *py_x86_fill(PyObject *m, PyObject *args)
{
    Py_buffer v;
    int mode, max;
    (void)m;
    if (!PyArg_ParseTuple(args, "y*ii", &v, &mode, &max))
        return NULL;
    if (mode < 1 || mode > 3 || max <= 0) {
        PyBuffer_Release(&v);
        Py_RETURN_NONE;
    }
    const uint8_t *c = v.buf;
    size_t len = (size_t)v.len, off = 0;
    uint8_t stackbuf[64 * 11];
    uint8_t *out = stackbuf;
    size_t cap = sizeof stackbuf / 11;
    int cnt = 0, done = 0;
    while (cnt < max) {
        size_t rem = len - off, n = rem < 15 ? rem : 15;
        struct x86_insn x;
        int needed;
        if (!rem)
            break;
        int r = x86_decode(c + off, n, mode, &x, &needed);
        if (r != X86_OK) {
            if (!cnt) {
                PyBuffer_Release(&v);
                Py_RETURN_NONE;
            }
            done = r == X86_INVALID;
            break;
        }
        if ((size_t)cnt == cap) {
            size_t ncap = cap * 4 < (size_t)max ? cap * 4 : (size_t)max;
            uint8_t *o = PyMem_Malloc(ncap * 11);
            if (!o) {
                if (out != stackbuf)
                    PyMem_Free(out);
                PyBuffer_Release(&v);
                return PyErr_NoMemory();
            }
            memcpy(o, out, (size_t)cnt * 11);
            if (out != stackbuf)
                PyMem_Free(out);
            out = o;
            cap = ncap;
        }
        uint8_t *rec = out + (size_t)cnt * 11;
        uint64_t rel = (uint64_t)x.rel;
        rec[0] = x.size;
        rec[1] = x.iclass;
        rec[2] = (uint8_t)x86_flags(&x);
        memcpy(rec + 3, &rel, 8);
        cnt++;
        off += x.size;
        if (x.iclass != C_OTHER) {
            done = 1;
            break;
        }
    }
    PyBuffer_Release(&v);
    if (!cnt)                           /* no bytes at all */
        Py_RETURN_NONE;
    if (cnt == max)
        done = 1;
    PyObject *recs = PyBytes_FromStringAndSize((const char *)out,
                                               (Py_ssize_t)cnt * 11);
    if (out != stackbuf)
        PyMem_Free(out);
    if (!recs)
        return NULL;
    return Py_BuildValue("(Nnii)", recs, (Py_ssize_t)off, cnt, done);
}

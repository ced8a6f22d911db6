/* A table of distinct uint64 keys, each numbered in the order it was
 * first added (0, 1, ...): an open-addressing hash of slots over arrays
 * the caller owns and grows (slices.KeyIndex), so that the views sum and
 * look up per call path in one pass instead of sorting every row they
 * meet (methods of hwtrace.analysis._c_runs, declared in keys.h):
 *
 *   keys_index(slots, keys, used, new, idx, firsts, sums, w) -> used
 *       every key of ``new`` (uint64) gets its number in ``idx`` (int64,
 *       or None); a key not in the table is appended to ``keys`` as number
 *       ``used`` (then used + 1, ...) and, with ``firsts`` (int64 or
 *       None), the position in ``new`` where it first came is written to
 *       firsts[number - used on entry]; with ``sums`` (float64, one per
 *       number) and ``w`` (float64, one per key of ``new``),
 *       sums[number] += w[i] in the order of ``new``.  Returns the new
 *       count.  ``slots`` (int64, a power of two long, -1 where empty,
 *       else a number) must stay at most half full: the caller grows it
 *       (ValueError otherwise, the table unchanged past that key).
 *   keys_find(slots, keys, q, out)
 *       out[i] (int64) the number of q[i], or -1.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "buf.h"
#include "keys.h"

static inline size_t key_hash(uint64_t k, size_t mask)
{
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return (size_t)k & mask;
}

/* the slot holding ``k``, or the empty slot where it would go */
static inline size_t key_slot(const int64_t *slots, const uint64_t *keys, size_t mask,
                              uint64_t k)
{
    size_t h = key_hash(k, mask);
    for (;;) {
        int64_t s = slots[h];
        if (s < 0 || keys[s] == k)
            return h;
        h = (h + 1) & mask;
    }
}

static int writable(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    if (b->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "keys: %s has the wrong size", what);
        PyBuffer_Release(b);
        b->obj = NULL;
        return -1;
    }
    return 0;
}

static int slots_ok(Py_buffer *bs)
{
    size_t cap = (size_t)(bs->len / 8);
    if (cap == 0 || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "keys: slots is not a power of two long");
        return 0;
    }
    return 1;
}

PyObject *hw_keys_index(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "keys_index(slots, keys, used, new, idx, firsts, sums, w)");
        return NULL;
    }
    Py_buffer bs = {0}, bk = {0}, bn = {0}, bi = {0}, bf = {0}, bu = {0}, bw = {0};
    PyObject *res = NULL;
    Py_ssize_t used = PyLong_AsSsize_t(args[2]);
    if (used == -1 && PyErr_Occurred())
        return NULL;
    if (writable(args[0], &bs, 8, "slots") < 0 || !slots_ok(&bs)
        || writable(args[1], &bk, 8, "keys") < 0
        || get_buf(args[3], &bn, 8, -1, "new") < 0)
        goto done;
    Py_ssize_t n = bn.len / 8;
    if ((args[4] != Py_None && writable(args[4], &bi, 8, "idx") < 0)
        || (args[5] != Py_None && writable(args[5], &bf, 8, "firsts") < 0)
        || (args[6] != Py_None && writable(args[6], &bu, 8, "sums") < 0)
        || (args[7] != Py_None && get_buf(args[7], &bw, 8, n, "w") < 0))
        goto done;
    Py_ssize_t kcap = bk.len / 8;
    if (used < 0 || used > kcap || (bi.obj && bi.len / 8 < n)
        || (bu.obj != NULL) != (bw.obj != NULL)) {
        PyErr_SetString(PyExc_ValueError, "keys_index: bad sizes");
        goto done;
    }
    int64_t *slots = bs.buf;
    uint64_t *keys = bk.buf;
    const uint64_t *nk = bn.buf;
    int64_t *idx = bi.obj ? bi.buf : NULL;
    int64_t *firsts = bf.obj ? bf.buf : NULL;
    double *sums = bu.obj ? bu.buf : NULL;
    const double *w = bw.obj ? bw.buf : NULL;
    Py_ssize_t fcap = bf.obj ? bf.len / 8 : 0, scap = bu.obj ? bu.len / 8 : 0;
    size_t mask = (size_t)(bs.len / 8) - 1;
    Py_ssize_t limit = (Py_ssize_t)((mask + 1) / 2), used0 = used;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t k = nk[i];
        size_t h = key_slot(slots, keys, mask, k);
        int64_t s = slots[h];
        if (s < 0) {
            if (used >= limit || used >= kcap || (firsts && used - used0 >= fcap)
                || (sums && used >= scap)) {
                PyErr_SetString(PyExc_ValueError, "keys_index: the table is full");
                goto done;
            }
            s = slots[h] = used;
            keys[used] = k;
            if (firsts)
                firsts[used - used0] = i;
            used++;
        }
        if (idx)
            idx[i] = s;
        if (sums)
            sums[s] += w[i];
    }
    res = PyLong_FromSsize_t(used);
done:
    RELEASE_BUFS(&bs, &bk, &bn, &bi, &bf, &bu, &bw);
    return res;
}

PyObject *hw_keys_find(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "keys_find(slots, keys, q, out)");
        return NULL;
    }
    Py_buffer bs = {0}, bk = {0}, bq = {0}, bo = {0};
    PyObject *res = NULL;
    if (get_buf(args[0], &bs, 8, -1, "slots") < 0 || !slots_ok(&bs)
        || get_buf(args[1], &bk, 8, -1, "keys") < 0
        || get_buf(args[2], &bq, 8, -1, "q") < 0
        || writable(args[3], &bo, 8, "out") < 0)
        goto done;
    Py_ssize_t n = bq.len / 8;
    if (bo.len / 8 < n) {
        PyErr_SetString(PyExc_ValueError, "keys_find: out is too short");
        goto done;
    }
    const int64_t *slots = bs.buf;
    const uint64_t *keys = bk.buf;
    const uint64_t *q = bq.buf;
    int64_t *out = bo.buf;
    size_t mask = (size_t)(bs.len / 8) - 1;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = slots[key_slot(slots, keys, mask, q[i])];
    res = Py_NewRef(Py_None);
done:
    RELEASE_BUFS(&bs, &bk, &bq, &bo);
    return res;
}

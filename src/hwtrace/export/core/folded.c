/* folded(order, lo, hi, name, weight, names, isroot, head, lo0, hi0, write):
 * flame-graph stacks of a call-path tree (the export core's method; see
 * _c_textcols.c for the interface, folded.py for the twin). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "textcols.h"

PyObject *tc_folded(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "folded(order, lo, hi, name, weight, names, "
                        "isroot, head, lo0, hi0, write)");
        return NULL;
    }
    Py_buffer bo, bl, bh, bn, bw, br;
    int ho = 0, hl = 0, hh = 0, hn = 0, hw = 0, hr = 0;
    PyObject *res = NULL, *tab = NULL;
    const char **sp = NULL;
    Py_ssize_t *sl = NULL, *chain_prev = NULL, *chain_name = NULL, *tmp = NULL;
    Py_ssize_t *sk = NULL, *sc = NULL;
    char *sr = NULL;
    Buf out = {NULL, 0, 0}, line = {NULL, 0, 0};
    Py_ssize_t *pc = NULL, *pend = NULL;
    if (PyObject_GetBuffer(args[0], &bo, PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    ho = 1;
    Py_ssize_t m = bo.len / 8;
    if (tc_get_buf(args[1], &bl, &hl, m, 8, "lo") < 0
            || tc_get_buf(args[2], &bh, &hh, m, 8, "hi") < 0
            || tc_get_buf(args[3], &bn, &hn, m, 8, "name") < 0
            || tc_get_buf(args[4], &bw, &hw, m, 8, "weight") < 0)
        goto done;
    tab = PySequence_Fast(args[5], "folded: names is a sequence");
    if (!tab)
        goto done;
    Py_ssize_t nt = PySequence_Fast_GET_SIZE(tab);
    if (tc_get_buf(args[6], &br, &hr, nt, 1, "isroot") < 0)
        goto done;
    if (!PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "folded: head is bytes");
        goto done;
    }
    Py_ssize_t lo0 = PyLong_AsSsize_t(args[8]), hi0 = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred())
        goto done;
    const int64_t *order = bo.buf, *lo = bl.buf, *hi = bh.buf, *name = bn.buf;
    const double *weight = bw.buf;
    const uint8_t *isroot = br.buf;
    sp = PyMem_Malloc((nt ? nt : 1) * sizeof(char *));
    sl = PyMem_Malloc((nt ? nt : 1) * sizeof(Py_ssize_t));
    chain_prev = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
    chain_name = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
    tmp = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
    sk = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    sc = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    sr = PyMem_Malloc(m + 1);
    pc = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    pend = PyMem_Malloc((m + 1) * sizeof(Py_ssize_t));
    if (!sp || !sl || !chain_prev || !chain_name || !tmp || !sk || !sc || !sr || !pc
            || !pend) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < nt; j++) {
        PyObject *s = PySequence_Fast_GET_ITEM(tab, j);
        if (!PyBytes_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "folded: names are bytes");
            goto done;
        }
        sp[j] = PyBytes_AS_STRING(s);
        sl[j] = PyBytes_GET_SIZE(s);
    }
    /* the tree must be one: every child index and name in range, each
       node pushed at most once (else the stacks would overflow) */
    if (lo0 < 0 || hi0 < lo0 || hi0 > m)
        goto bad_tree;
    for (Py_ssize_t k = 0; k < m; k++)
        if (lo[k] < 0 || hi[k] < lo[k] || hi[k] > m || order[k] < 0 || order[k] >= m
                || name[k] < 0 || name[k] >= nt)
            goto bad_tree;
    const char *head = PyBytes_AS_STRING(args[7]);
    Py_ssize_t headlen = PyBytes_GET_SIZE(args[7]);
    int has_head = headlen > 0;
    Py_ssize_t top = 0, nchain = 0, pushed = 0;
    /* the last line written (without its weight): its chain entries
       pc[0..pd) bottom first, where each frame's text ends in it */
    Py_ssize_t pd = 0, headpart = 0;
    if (has_head && (buf_put(&line, head, headlen) < 0 || buf_put(&line, ";", 1) < 0))
        goto done;
    headpart = line.len;
    sk[top] = -1;
    sc[top] = -1;
    sr[top] = 0;             /* the root: (rooted) as the caller says below */
    int root_rooted = 1;
    for (Py_ssize_t j = 0; j < nt; j++)
        if (!isroot[j]) {
            root_rooted = 0;
            break;
        }
    sr[top++] = (char)root_rooted;
    while (top) {
        top--;
        Py_ssize_t q = sk[top], cq = sc[top];
        int rq = sr[top];
        Py_ssize_t a = q < 0 ? lo0 : lo[q], z = q < 0 ? hi0 : hi[q];
        for (Py_ssize_t o = a; o < z; o++) {
            Py_ssize_t k = order[o];
            Py_ssize_t cn = name[k];
            int r = rq || isroot[cn];
            Py_ssize_t ck = -1;
            if (r) {
                if (nchain >= m)
                    goto bad_tree;
                ck = nchain++;
                chain_prev[ck] = rq ? cq : -1;
                chain_name[ck] = cn;
                double w = weight[k];
                double v = w ? nearbyint(w) : 0.0;
                if (v > 0) {
                    /* the line's frames, bottom first, are its chain;
                       the frames it shares with the line before (the
                       same chain entries: an entry is one node) are
                       that line's text up to there, copied at once */
                    Py_ssize_t d = 0;
                    for (Py_ssize_t c = ck; c >= 0; c = chain_prev[c])
                        tmp[d++] = c;
                    Py_ssize_t c = d < pd ? d : pd;
                    while (c > 0 && pc[c - 1] != tmp[d - c])
                        c--;
                    line.len = c ? pend[c - 1] : headpart;
                    for (Py_ssize_t j = c; j < d; j++) {
                        Py_ssize_t f = chain_name[tmp[d - 1 - j]];
                        if ((j && buf_put(&line, ";", 1) < 0)
                                || buf_put(&line, sp[f], sl[f]) < 0)
                            goto done;
                        pc[j] = tmp[d - 1 - j];
                        pend[j] = line.len;
                    }
                    pd = d;
                    if (buf_put(&out, line.p, line.len) < 0)
                        goto done;
                    char num[40];
                    int nn = snprintf(num, sizeof num, " %.0f\n", v);
                    if (buf_put(&out, num, nn) < 0)
                        goto done;
                    if (out.len >= STREAM_CHUNK && tc_lend(&out, args[10]) < 0)
                        goto done;
                }
            }
            if (++pushed > m)
                goto bad_tree;
            sk[top] = k;
            sc[top] = ck;
            sr[top++] = (char)r;
        }
    }
    if (tc_lend(&out, args[10]) < 0)
        goto done;
    res = Py_NewRef(Py_None);
    goto done;
bad_tree:
    PyErr_SetString(PyExc_ValueError, "folded: not a tree");
done:
    if (ho) PyBuffer_Release(&bo);
    if (hl) PyBuffer_Release(&bl);
    if (hh) PyBuffer_Release(&bh);
    if (hn) PyBuffer_Release(&bn);
    if (hw) PyBuffer_Release(&bw);
    if (hr) PyBuffer_Release(&br);
    Py_XDECREF(tab);
    PyMem_Free(sp);
    PyMem_Free(sl);
    PyMem_Free(chain_prev);
    PyMem_Free(chain_name);
    PyMem_Free(tmp);
    PyMem_Free(sk);
    PyMem_Free(sc);
    PyMem_Free(sr);
    PyMem_Free(out.p);
    PyMem_Free(line.p);
    PyMem_Free(pc);
    PyMem_Free(pend);
    return res;
}

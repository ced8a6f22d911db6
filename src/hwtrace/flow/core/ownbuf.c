/* Record buffers owned by a Python object: see ownbuf.h. */
#include "ownbuf.h"

#define OWNBUF_NAME "hwtrace.flow._c_flow.RecordBuffer"
#include "../../_ext/ownbuf.h"

int bytebuf_ready(void)
{
    return ownbuf_ready();
}

PyObject *bytebuf_take(struct bytebuf *b)
{
    size_t n = b->n;
    uint8_t *p = b->p;
    if (p && n < b->cap) {
        uint8_t *q = realloc(p, n ? n : 1);     /* (shrinking: in place) */
        if (q) {
            b->p = p = q;
            b->cap = n ? n : 1;
        }
    }
    PyObject *o = ownbuf_new(p, (Py_ssize_t)n, free);
    if (!o)
        return NULL;
    b->p = NULL;
    b->n = b->cap = 0;
    /* room for the next batch's, up to 64 MB (none if it cannot be had:
       bb_reserve tries again as records come) */
    if (n)
        (void)bb_reserve(b, n < (64u << 20) ? n : (64u << 20));
    return o;
}

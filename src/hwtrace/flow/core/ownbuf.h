/* A batch's record buffers handed to Python as they are
 * (_ext/ownbuf.h): np.frombuffer over the struct bytebuf's own memory,
 * not over the bytearray it was copied into before (~10 MB a batch of
 * 2**18 records: ~1 GB of copying on yes in cpu mode, 84 M
 * instructions). */
#ifndef HWTRACE_CORE_OWNBUF_H
#define HWTRACE_CORE_OWNBUF_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "block.h"

/* the type ready (at module init) */
int bytebuf_ready(void);

/* a new object owning b's memory (its n bytes: the rest given back);
 * b is left empty with room for as many bytes again (the next batch's
 * records are about as many); NULL with an exception set on failure (b
 * unchanged) */
PyObject *bytebuf_take(struct bytebuf *b);

#endif

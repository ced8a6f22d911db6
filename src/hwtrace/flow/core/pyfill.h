/* The instruction caches' miss handler of the Python boundary (the
 * glue's side of icache.h's fill): an image's instructions decoded in C
 * from its mappings' bytes where that gives the twin's answer
 * (imgmap.h), and the Python ``fill(ip, mode)`` of
 * hwtrace.flow.fast.filler for the rest.
 *
 *   filler    fill(ip, mode) -> an error code (int), or (lo, last, packed)
 *             with packed n records "<BBBQ" (size, iclass, flags, rel) of
 *             consecutive instructions from ip in the mapping [lo, last]
 *   mappings  mappings(image) -> None (no C fills: every miss goes to
 *             fill), or (generation, ((begin, end, offset, load), ...)):
 *             the image's mappings [begin, end) in address order, each
 *             ``offset`` bytes into its section's data, which load()
 *             returns (any buffer; called on the mapping's first miss
 *             and kept alive from then on).  Then the image's attribute
 *             ``generation`` is read on every miss; when it is no longer
 *             the one given, mappings(image) is asked again. */
#ifndef HWTRACE_CORE_PYFILL_H
#define HWTRACE_CORE_PYFILL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "imgmap.h"

struct pyfill;

/* the miss handler of image: filler(image) is its fill (asked for on
 * the first miss C does not answer); mappings may be NULL (Python fills
 * only).  NULL with a Python exception on failure */
struct pyfill *pyfill_new(PyObject *image, PyObject *filler,
                          PyObject *mappings);
void pyfill_free(struct pyfill *f);
int pyfill_traverse(struct pyfill *f, visitproc visit, void *arg);
/* icache.h's ic_fill_fn, ctx a struct pyfill */
int pyfill_fill(void *ctx, struct icache *ic, uint64_t ip, int mode);
/* misses answered in C and by the Python fill so far */
void pyfill_counts(const struct pyfill *f, uint64_t *in_c,
                   uint64_t *in_python);

/* fill_probe(image, filler, mappings, ips, mode) -> (looked, all, (in C,
 * in Python)): a fresh cache's entries at each of ips (looked up in
 * turn) and every entry the fills added, as (ip, mode, err, size, iclass,
 * flags, rel, lo, last) -- the tests' hook (mappings None: Python fills
 * only) */
PyObject *pyfill_probe(PyObject *m, PyObject *args);

#endif

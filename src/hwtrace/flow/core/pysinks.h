/* Sinks of the compiled core that build Python results: batches (packed
 * BLOCK / INSN record buffers and items, docs/pipeline.md), counts with
 * the error items (decode --quiet --stat) and edge counts (coverage
 * --edges); and the conversion of core events to
 * hwtrace.flow.events.Event objects. */
#ifndef HWTRACE_CORE_PYSINKS_H
#define HWTRACE_CORE_PYSINKS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "session.h"
#include "walk.h"

#define BLOCK_REC 40

/* a plain event's row (hwtrace.flow.plain.PLAIN): an event the views take
 * in bulk carried as a column record instead of an Event object (see
 * batch_sink.plain) */
#define PLAIN_REC 56
enum { PF_IP_SUPPRESSED = 1, PF_STATUS_UPDATE = 2, PF_HAS_TSC = 4,
       PF_STAMPED = 8, PF_RESUMED = 16 };
enum { PO_RESUMED = 1, PO_FOLLOWS = 2, PO_MODE = 4, PO_RATIO = 8 };

/* Python classes and names the sinks use (set at module init) */
struct pyrefs {
    PyObject *event_cls;        /* hwtrace.flow.events.Event */
    PyObject *error_cls;        /* ErrorItem(kind, offset, ip, code) */
    PyObject *status_cls;       /* StatusItem(name, offset, ip_suppressed) */
    PyObject *ev_names[EV_NTYPES];
    PyObject *codes[E_NCODES];
    PyObject *kinds[3];
    PyObject *statuses[2];
    PyObject *modes[3];
    PyObject *binds[3];
    PyObject *attr[64];         /* attribute names, see pysinks.c */
    PyObject *kinds_pt[PT_K_COUNT];     /* packet type names */
};

extern struct pyrefs PYREFS;
int pyrefs_init(void);

/* a Python Event equal to the twin's object for ev (new reference) */
PyObject *event_to_py(const struct event *ev);

struct batch_sink {
    struct bytebuf blocks, insns;
    PyObject *items;            /* list of (index, offset, item) */
    uint64_t nrec;
    size_t max_records;
    int want_insns;
    PyObject *next_event;       /* an Event made for the switcher, reused */
    /* plain: every event that carries no more than a PLAIN_REC row holds
       goes to ``rows`` instead of ``items`` (its row's ``pos``: its place
       among the batch's items and rows, counted by ``nitems``) */
    int plain;
    struct bytebuf rows;
    uint32_t nitems;
};

struct count_sink {
    struct walk w;              /* instructions, blocks (and edges) */
    uint64_t events;
    PyObject *errors;           /* [(kind, offset, ip, code)] */
};

extern const struct sink_ops BATCH_OPS, COUNT_OPS, EDGE_OPS;

/* an item of the batch at the current record index (steals ``item``) */
int batch_add_item(struct batch_sink *b, ptrdiff_t offset, PyObject *item);

PyObject *edges_dict(struct edge_table *e);
/* the table's edges sorted by (from, to), packed as little-endian u64
 * triples (from, to, n): bytes (fast.PackedEdges.table) */
PyObject *edges_packed(struct edge_table *e);
/* edge_text(table, lines) -> (text or None, taken): coverage --edges's
 * lines of a packed table (bytes, ASCII) and the sum of its counts */
PyObject *py_edge_text(PyObject *mod, PyObject *args);

#endif

/* The edge counts of coverage --edges: a hash table of (from, to) -> n
 * with a small direct-mapped front (the hot edges of a loop stay in a few
 * cache lines instead of probing a table of every edge), and the table's
 * edges sorted by (from, to) and printed as coverage --edges prints them,
 * so the command needs no Python object per edge. */
#ifndef HWTRACE_CORE_EDGESET_H
#define HWTRACE_CORE_EDGESET_H

#include <stddef.h>
#include <stdint.h>

struct edge {
    uint64_t from, to, n;
};

#define EDGE_FRONT_BITS 13
#define EDGE_FRONT (1u << EDGE_FRONT_BITS)  /* front slots */

struct edge_table {
    struct edge *tab;           /* open addressing, n == 0: empty */
    size_t cap, n;
    struct edge *front;         /* EDGE_FRONT slots or NULL (none yet);
                                   counts not yet in tab */
};

/* the slow half of edge_add: the front slot f taken for (from, to) */
int edge_add_slow(struct edge_table *e, struct edge *f, uint64_t from,
                  uint64_t to, uint64_t n);

static inline size_t edge_front_slot(uint64_t from, uint64_t to)
{
    uint64_t h = (from ^ (to * 0x9E3779B97F4A7C15ULL)) * 0xff51afd7ed558ccdULL;
    return (size_t)(h >> (64 - EDGE_FRONT_BITS));
}

/* adds n to the count of (from, to): 0 or -E_NOMEM */
static inline int edge_add(struct edge_table *e, uint64_t from, uint64_t to,
                           uint64_t n)
{
    if (e->front) {
        struct edge *f = &e->front[edge_front_slot(from, to)];
        if (f->n && f->from == from && f->to == to) {
            f->n += n;
            return 0;
        }
        return edge_add_slow(e, f, from, to, n);
    }
    return edge_add_slow(e, NULL, from, to, n);
}

/* the front's counts into the table (call before reading tab) */
int edge_settle(struct edge_table *e);
void edge_free(struct edge_table *e);

/* the edges sorted by (from, to) into ``out``, which has room for e->n
 * (after edge_settle); e->n */
size_t edge_sort_into(const struct edge_table *e, struct edge *out);

/* the lines of coverage --edges for ``n`` sorted edges: "FROM TO COUNT\n"
 * (16 hex digits each address, decimal count) into out, which has room
 * for n * EDGE_LINE_MAX bytes; the bytes written */
#define EDGE_LINE_MAX 55
size_t edge_lines(const struct edge *s, size_t n, char *out);

#endif

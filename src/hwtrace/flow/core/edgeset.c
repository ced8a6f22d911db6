/* The edge counts of coverage --edges: see edgeset.h. */
#include <stdlib.h>
#include <string.h>

#include "bigarr.h"
#include "common.h"
#include "edgeset.h"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static size_t slot(uint64_t from, uint64_t to, size_t mask)
{
    return mix(from ^ mix(to)) & mask;
}

static int grow(struct edge_table *e)
{
    size_t cap = e->cap ? e->cap * 2 : 1024;
    struct edge *nt = ba_zalloc(cap * sizeof *nt);
    if (!nt)
        return -E_NOMEM;
    for (size_t j = 0; j < e->cap; j++) {
        struct edge *x = &e->tab[j];
        if (!x->n)
            continue;
        size_t i = slot(x->from, x->to, cap - 1);
        while (nt[i].n)
            i = (i + 1) & (cap - 1);
        nt[i] = *x;
    }
    ba_free(e->tab, e->cap * sizeof *e->tab);
    e->tab = nt;
    e->cap = cap;
    return 0;
}

/* (from, to) += n in the table */
static int table_add(struct edge_table *e, uint64_t from, uint64_t to,
                     uint64_t n)
{
    if (2 * (e->n + 1) > e->cap)
        TRY(grow(e));
    size_t mask = e->cap - 1;
    size_t i = slot(from, to, mask);
    for (;;) {
        struct edge *x = &e->tab[i];
        if (!x->n) {
            x->from = from;
            x->to = to;
            x->n = n;
            e->n++;
            return 0;
        }
        if (x->from == from && x->to == to) {
            x->n += n;
            return 0;
        }
        i = (i + 1) & mask;
    }
}

int edge_add_slow(struct edge_table *e, struct edge *f, uint64_t from,
                  uint64_t to, uint64_t n)
{
    if (!f) {
        e->front = calloc(EDGE_FRONT, sizeof *e->front);
        if (!e->front)
            return -E_NOMEM;
        f = &e->front[edge_front_slot(from, to)];
    }
    if (f->n)                   /* the edge there makes room */
        TRY(table_add(e, f->from, f->to, f->n));
    f->from = from;
    f->to = to;
    f->n = n;
    return 0;
}

int edge_settle(struct edge_table *e)
{
    if (!e->front)
        return 0;
    for (size_t i = 0; i < EDGE_FRONT; i++) {
        struct edge *f = &e->front[i];
        if (f->n) {
            TRY(table_add(e, f->from, f->to, f->n));
            f->n = 0;
        }
    }
    return 0;
}

void edge_free(struct edge_table *e)
{
    ba_free(e->tab, e->cap * sizeof *e->tab);
    free(e->front);
    memset(e, 0, sizeof *e);
}

static int by_from_to(const void *a, const void *b)
{
    const struct edge *x = a, *y = b;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    if (x->to != y->to)
        return x->to < y->to ? -1 : 1;
    return 0;
}

struct edge *edge_sorted(const struct edge_table *e)
{
    if (!e->n)
        return NULL;
    struct edge *s = malloc(e->n * sizeof *s);
    if (!s)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < e->cap; i++)
        if (e->tab[i].n)
            s[k++] = e->tab[i];
    qsort(s, k, sizeof *s, by_from_to);
    return s;
}

static char *hex16(char *p, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) {
        p[i] = digits[v & 15];
        v >>= 4;
    }
    return p + 16;
}

size_t edge_lines(const struct edge *s, size_t n, char *out)
{
    char *p = out;
    for (size_t k = 0; k < n; k++) {
        p = hex16(p, s[k].from);
        *p++ = ' ';
        p = hex16(p, s[k].to);
        *p++ = ' ';
        char tmp[20];
        int m = 0;
        uint64_t v = s[k].n;
        do {
            tmp[m++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (m)
            *p++ = tmp[--m];
        *p++ = '\n';
    }
    return (size_t)(p - out);
}

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

/* (from, to) += n in the table, which grows past a load of 3/4, not 1/2:
 * the edges are 24 bytes each and most of them come at the end, from the
 * chains (chain_flush_edges), into a table that doubles two or three times
 * then -- the python3 recording's 69 K edges took a 6 MiB table at load
 * 0.26 (after 1.5 and 3 MiB ones), each of its pages zeroed at first
 * touch, where 3 MiB hold them at 0.53 */
static int table_add(struct edge_table *e, uint64_t from, uint64_t to,
                     uint64_t n)
{
    if (4 * (e->n + 1) > 3 * e->cap)
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

/* (from, to) order: a table's keys are distinct, so the order is total and
 * the sorted array unique */
static inline int before(const struct edge *x, const struct edge *y)
{
    return x->from != y->from ? x->from < y->from : x->to < y->to;
}

static void insertion_sort(struct edge *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        struct edge x = a[i];
        size_t j = i;
        for (; j && before(&x, &a[j - 1]); j--)
            a[j] = a[j - 1];
        a[j] = x;
    }
}

static void sift_down(struct edge *a, size_t root, size_t n)
{
    struct edge x = a[root];
    for (;;) {
        size_t c = 2 * root + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(&a[c], &a[c + 1]))
            c++;
        if (!before(&x, &a[c]))
            break;
        a[root] = a[c];
        root = c;
    }
    a[root] = x;
}

static void heap_sort(struct edge *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(a, i, n);
    while (n > 1) {
        struct edge t = a[0];
        a[0] = a[--n];
        a[n] = t;
        sift_down(a, 0, n);
    }
}

static void swap_edges(struct edge *x, struct edge *y)
{
    struct edge t = *x;
    *x = *y;
    *y = t;
}

/* introsort: quicksort (median of three), insertion sort below 16 edges,
 * heapsort past the depth limit; the comparison inline, not through
 * qsort's function pointer (glibc's qsort, a merge sort copying 24-byte
 * elements through memcpy: ~57 M instructions for the python3 recording's
 * 61 K edges, 1.4% of coverage --edges) */
static void intro_sort(struct edge *a, size_t n, int depth)
{
    while (n > 16) {
        if (!depth--) {
            heap_sort(a, n);
            return;
        }
        struct edge *m = a + n / 2, *z = a + n - 1;
        if (before(m, a))
            swap_edges(m, a);
        if (before(z, m)) {
            swap_edges(z, m);
            if (before(m, a))
                swap_edges(m, a);
        }
        /* a[0] <= pivot <= a[n-1]: sentinels for the scans */
        struct edge p = *m;
        size_t i = 0, j = n - 1;
        for (;;) {
            do
                i++;
            while (before(&a[i], &p));
            do
                j--;
            while (before(&p, &a[j]));
            if (i >= j)
                break;
            swap_edges(&a[i], &a[j]);
        }
        /* [0, j] <= pivot <= [j + 1, n): recurse on the smaller part */
        size_t left = j + 1;
        if (left < n - left) {
            intro_sort(a, left, depth);
            a += left;
            n -= left;
        } else {
            intro_sort(a + left, n - left, depth);
            n = left;
        }
    }
    insertion_sort(a, n);
}

size_t edge_sort_into(const struct edge_table *e, struct edge *out)
{
    size_t k = 0;
    for (size_t i = 0; i < e->cap; i++)
        if (e->tab[i].n)
            out[k++] = e->tab[i];
    int depth = 0;
    for (size_t m = k; m > 1; m >>= 1)
        depth += 2;
    intro_sort(out, k, depth);
    return k;
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

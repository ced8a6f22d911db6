/* Large growing arrays in transparent huge pages: see bigarr.h. */
#define _GNU_SOURCE             /* mremap, MAP_ANONYMOUS, MADV_HUGEPAGE */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bigarr.h"

#define BA_HUGE ((size_t)2 << 20)       /* x86-64's huge page */

/* what an array of n >= BA_MIN bytes maps: whole huge pages (a huge page
 * backs only a 2 MiB range that lies wholly inside the mapping) */
static size_t mapped_len(size_t n)
{
    return (n + BA_HUGE - 1) & ~(BA_HUGE - 1);
}

static void advise(void *p, size_t len)
{
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);     /* advice: may be refused */
#else
    (void)p;
    (void)len;
#endif
}

void *ba_map(size_t len)
{
    size_t over = len + BA_HUGE;
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *b = (char *)(((uintptr_t)p + BA_HUGE - 1) & ~(BA_HUGE - 1));
    if (b > p)
        munmap(p, (size_t)(b - p));
    if (b + len < p + over)
        munmap(b + len, (size_t)(p + over - (b + len)));
    advise(b, len);
    return b;
}

void *ba_zalloc(size_t n)
{
    if (n >= BA_MIN)
        return ba_map(mapped_len(n));
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (p)
        memset(p, 0, n);
    return p;
}

void *ba_grow(void *p, size_t n, size_t m)
{
    if (n >= BA_MIN) {          /* mapped: its pages move, no copy */
        size_t old = mapped_len(n), len = mapped_len(m);
        if (len == old)
            return p;
        /* into the start of a new aligned mapping (a plain mremap may
         * move it off a huge page boundary); the rest of it is zero */
        char *q = ba_map(len);
        if (!q)
            return NULL;
        if (mremap(p, old, old, MREMAP_MAYMOVE | MREMAP_FIXED, q) ==
            MAP_FAILED) {
            munmap(q, len);
            return NULL;
        }
        return q;
    }
    char *q = ba_zalloc(m);
    if (!q)
        return NULL;
    if (n)
        memcpy(q, p, n);
    free(p);
    return q;
}

void ba_free(void *p, size_t n)
{
    if (!p)
        return;
    if (n >= BA_MIN)
        munmap(p, mapped_len(n));
    else
        free(p);
}

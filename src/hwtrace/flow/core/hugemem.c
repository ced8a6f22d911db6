/* Chunks in transparent huge pages: see hugemem.h. */
#define _DEFAULT_SOURCE         /* MAP_ANONYMOUS, MADV_HUGEPAGE */
#include <stdlib.h>
#include <sys/mman.h>

#include "hugemem.h"

#define HM_HUGE ((size_t)2 << 20)       /* x86-64's huge page */
#define HM_BLOCK ((size_t)4 << 20)

/* a HM_BLOCK-byte block at a HM_HUGE boundary, or NULL */
static void *new_block(void)
{
    size_t len = HM_BLOCK + HM_HUGE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *b = (char *)(((uintptr_t)p + HM_HUGE - 1) & ~(HM_HUGE - 1));
    if (b > p)
        munmap(p, (size_t)(b - p));
    if (b + HM_BLOCK < p + len)
        munmap(b + HM_BLOCK, (size_t)(p + len - (b + HM_BLOCK)));
#ifdef MADV_HUGEPAGE
    madvise(b, HM_BLOCK, MADV_HUGEPAGE);  /* advice: may be refused */
#endif
    return b;
}

void *hm_chunk(struct hugemem *h, size_t n)
{
    n = (n + 63) & ~(size_t)63;
    if (n > HM_MAX)
        return NULL;
    if (h->nsmall < HM_SMALL) {
        void *p = aligned_alloc(64, n);
        if (p)
            h->small[h->nsmall++] = p;
        return p;
    }
    if (h->left < n) {
        void **nb = realloc(h->blocks, (h->nblocks + 1) * sizeof *nb);
        if (!nb)
            return NULL;
        h->blocks = nb;
        char *b = new_block();
        if (!b)
            return NULL;
        h->blocks[h->nblocks++] = b;
        h->bump = b;
        h->left = HM_BLOCK;
    }
    void *p = h->bump;
    h->bump += n;
    h->left -= n;
    return p;
}

void hm_free(struct hugemem *h)
{
    for (uint32_t i = 0; i < h->nsmall; i++)
        free(h->small[i]);
    h->nsmall = 0;
    for (uint32_t i = 0; i < h->nblocks; i++)
        munmap(h->blocks[i], HM_BLOCK);
    free(h->blocks);
    h->blocks = NULL;
    h->nblocks = 0;
    h->bump = NULL;
    h->left = 0;
}

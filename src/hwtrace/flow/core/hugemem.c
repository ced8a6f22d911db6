/* Chunks in transparent huge pages: see hugemem.h. */
#include <stdlib.h>
#include <sys/mman.h>

#include "bigarr.h"
#include "hugemem.h"

#define HM_BLOCK ((size_t)4 << 20)

void *hm_chunk(struct hugemem *h, size_t n)
{
    n = (n + 63) & ~(size_t)63;
    if (n > HM_MAX)
        return NULL;
    if (h->nsmall < HM_SMALL && h->small_bytes + n <= HM_SMALL_BYTES) {
        void *p = aligned_alloc(64, n);
        if (p) {
            h->small[h->nsmall++] = p;
            h->small_bytes += n;
        }
        return p;
    }
    if (h->left < n) {
        void **nb = realloc(h->blocks, (h->nblocks + 1) * sizeof *nb);
        if (!nb)
            return NULL;
        h->blocks = nb;
        char *b = ba_map(HM_BLOCK);
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
    h->small_bytes = 0;
    for (uint32_t i = 0; i < h->nblocks; i++)
        munmap(h->blocks[i], HM_BLOCK);
    free(h->blocks);
    h->blocks = NULL;
    h->nblocks = 0;
    h->bump = NULL;
    h->left = 0;
}

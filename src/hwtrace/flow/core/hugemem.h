/* Memory for the caches' fixed-size chunks, in transparent huge pages.
 *
 * The instruction and run caches (icache.c) grow by fixed-size chunks that
 * live until the cache is freed.  A decode of a large trace touches tens
 * of megabytes of them once, and each fresh 4 KiB page is a page fault
 * (python3-0: ~4,000 of the command's ~20,000; ~2 us each).  A hugemem
 * hands the chunks out of 2 MiB-aligned blocks advised MADV_HUGEPAGE, so
 * the kernel can back them with 2 MiB pages (one fault each) where
 * transparent huge pages are enabled for advised memory; where they are
 * not, the blocks are ordinary anonymous memory.  Only memory, never
 * results: the chunks' contents are the same either way.
 *
 * Small caches pay nothing: each hugemem's chunks come from malloc (4 KiB
 * pages, faulted in as they are touched) until they add up to
 * HM_SMALL_BYTES, and from the blocks after that.  A block's first touch
 * zeroes a whole 2 MiB page, so a cache that needs a few chunks more than
 * malloc gave must not take one: the gzip recording's chain cache used 64
 * KiB of its first block (the third chunk of 64 KiB, HM_SMALL was 2
 * chunks) and paid the zeroing of a 2 MiB page for it. */
#ifndef HWTRACE_HUGEMEM_H
#define HWTRACE_HUGEMEM_H

#include <stddef.h>
#include <stdint.h>

#define HM_SMALL 16             /* chunks from malloc at most */
#define HM_SMALL_BYTES ((size_t)1 << 20)  /* and bytes */

#define HM_MAX ((size_t)1 << 20)       /* the largest chunk */

struct hugemem {                /* all zero: empty */
    void *small[HM_SMALL];      /* the chunks from malloc */
    uint32_t nsmall;
    size_t small_bytes;         /* theirs */
    uint32_t nblocks;
    void **blocks;              /* whole blocks (4 MiB each) */
    char *bump;                 /* free space in the last block */
    size_t left;
};

/* a chunk of n bytes (n <= HM_MAX), 64-byte aligned, or NULL; freed
 * only by hm_free, with all the others */
void *hm_chunk(struct hugemem *h, size_t n);
void hm_free(struct hugemem *h);

#endif

/* The mappings of a static image, so that an instruction-cache miss
 * (icache.h) is filled in C: the x86 records of the instructions from an
 * IP, decoded from the bytes of the mapping that holds it (core/x86.h).
 *
 * It answers what the twin's fill (hwtrace.flow.fast.filler) answers
 * from the same bytes with the compiled x86 decoder, and nothing else:
 * an IP that no mapping holds, a first instruction that is invalid or
 * runs past the mapping's bytes (the twin completes it from the next
 * section and marks it truncated), an unknown mode -- those stay the
 * glue's Python fill.  A fill stops where the bytes run out inside an
 * instruction; the cache asks again there when the walk gets there, so
 * the cache holds the same entries either way (an entry depends on its
 * (ip, mode) and the image alone). */
#ifndef HWTRACE_CORE_IMGMAP_H
#define HWTRACE_CORE_IMGMAP_H

#include "icache.h"

struct imgmap_ent {
    uint64_t begin, last;       /* the mapping [begin, last] */
    const uint8_t *bytes;       /* its bytes from begin; NULL: not known
                                   yet (the glue loads them on a hit) */
    uint64_t nbytes;            /* how many: fewer than the mapping's
                                   size where its section's data ends
                                   early (a file that shrank) */
};

struct imgmap {
    struct imgmap_ent *e;       /* sorted by begin, not overlapping */
    uint32_t n;
};

/* instructions one fill adds at most (as the twin's fast.FILL_MAX) */
#define IMGMAP_FILL_MAX 1024

/* the index of the mapping holding ip, or -1 */
int imgmap_find(const struct imgmap *m, uint64_t ip);

/* add the entries of the instructions from ip in mapping e (bytes
 * known) to ic: the plain ones (class OTHER) and the one that ends them,
 * at most IMGMAP_FILL_MAX, while their bytes are there.  1: the entry
 * for ip is added; 0: not (the first instruction is invalid or runs past
 * the bytes, or mode is not 0..2: the Python fill's case); < 0: -E_NOMEM */
int imgmap_fill(struct icache *ic, const struct imgmap_ent *e, uint64_t ip,
                int mode);

#endif

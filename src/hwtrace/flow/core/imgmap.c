/* Filling the instruction cache from an image's mappings: see imgmap.h. */
#include "imgmap.h"
#include "x86.h"

int imgmap_find(const struct imgmap *m, uint64_t ip)
{
    uint32_t lo = 0, hi = m->n;         /* the first mapping past ip */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (m->e[mid].begin <= ip)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!lo || ip > m->e[lo - 1].last)
        return -1;
    return (int)(lo - 1);
}

int imgmap_fill(struct icache *ic, const struct imgmap_ent *e, uint64_t ip,
                int mode)
{
    if (mode < 0 || mode > 2 || !e->bytes || ip < e->begin || ip > e->last)
        return 0;
    uint64_t at = ip - e->begin;
    if (at >= e->nbytes)
        return 0;
    /* the bytes the twin's fill hands x86_fill: to the mapping's end or
     * the data's, whichever comes first (last - ip + 1 may be 2**64) */
    uint64_t len = e->nbytes - at, to_end = e->last - ip;
    if (to_end < len)
        len = to_end + 1;
    const uint8_t *c = e->bytes + at;
    struct insn_info in;
    memset(&in, 0, sizeof in);
    in.lo = e->begin;
    in.last = e->last;
    in.mode = (int8_t)mode;
    uint64_t off = 0;
    for (int cnt = 0; cnt < IMGMAP_FILL_MAX && off < len; cnt++) {
        uint64_t rem = len - off;
        struct x86_insn x;
        int needed;
        if (x86_decode(c + off, rem < 15 ? (size_t)rem : 15, mode + 1, &x,
                       &needed) != X86_OK) {
            if (!cnt)
                return 0;
            break;
        }
        in.ip = ip + off;
        in.size = x.size;
        in.iclass = x.iclass;
        in.flags = (uint8_t)x86_flags(&x);
        in.rel = (int64_t)x.rel;
        TRY(ic_add(ic, &in));
        off += x.size;
        if (x.iclass != C_OTHER)
            break;
    }
    return 1;
}

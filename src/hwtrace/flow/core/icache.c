/* The instruction and run caches: see icache.h. */
#include <stdlib.h>

#include "bigarr.h"
#include "icache.h"

#define CHUNK 4096u

_Static_assert(CHUNK * sizeof(struct run) <= HM_MAX &&
               CHUNK * sizeof(struct insn_info) <= HM_MAX,
               "a chunk fits hm_chunk");

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline uint64_t key_of(uint64_t ip, int mode)
{
    return mix(ip * 4 + (uint64_t)(mode + 1));
}

struct icache *ic_new(void *key, ic_fill_fn fill, void *ctx)
{
    struct icache *ic = calloc(1, sizeof *ic);
    if (!ic)
        return NULL;
    ic->key = key;
    ic->fill = fill;
    ic->ctx = ctx;
    ic->slots_cap = 1024;
    ic->slots = calloc(ic->slots_cap, sizeof *ic->slots);
    ic->rslots_cap = 1024;
    ic->rslots = calloc(ic->rslots_cap, sizeof *ic->rslots);
    if (!ic->slots || !ic->rslots) {
        ic_free(ic);
        return NULL;
    }
    return ic;
}

void ic_free(struct icache *ic)
{
    if (!ic)
        return;
    free(ic->chunks);
    for (uint32_t i = 0; i < ic->nr; i++) {
        struct run *r = &ic->rchunks[i / CHUNK][i % CHUNK];
        free(r->packed);
    }
    free(ic->rchunks);
    hm_free(&ic->mem);
    ba_free(ic->slots, (size_t)ic->slots_cap * sizeof *ic->slots);
    ba_free(ic->rslots, (size_t)ic->rslots_cap * sizeof *ic->rslots);
    free(ic);
}

static inline struct insn_info *entry(struct icache *ic, uint32_t k)
{
    return &ic->chunks[k / CHUNK][k % CHUNK];
}

static inline struct run *rentry(struct icache *ic, uint32_t k)
{
    return &ic->rchunks[k / CHUNK][k % CHUNK];
}

static int grow_slots(uint32_t **slots, uint32_t *cap, uint32_t n,
                      uint64_t (*key)(void *, uint32_t), void *ctx)
{
    uint32_t ncap = *cap * 2;
    uint32_t *ns = ba_zalloc((size_t)ncap * sizeof *ns);
    if (!ns)
        return -E_NOMEM;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = (uint32_t)key(ctx, j) & (ncap - 1);
        while (ns[i])
            i = (i + 1) & (ncap - 1);
        ns[i] = j + 1;
    }
    ba_free(*slots, (size_t)*cap * sizeof **slots);
    *slots = ns;
    *cap = ncap;
    return 0;
}

static uint64_t insn_key(void *ctx, uint32_t j)
{
    struct insn_info *e = entry(ctx, j);
    return key_of(e->ip, e->mode);
}

static uint64_t run_key(void *ctx, uint32_t j)
{
    struct run *r = rentry(ctx, j);
    return key_of(r->ip, r->mode);
}

static struct insn_info *find(struct icache *ic, uint64_t ip, int mode,
                              uint32_t *slot)
{
    uint32_t mask = ic->slots_cap - 1;
    uint32_t i = (uint32_t)key_of(ip, mode) & mask;
    for (;;) {
        uint32_t k = ic->slots[i];
        if (!k)
            break;
        struct insn_info *e = entry(ic, k - 1);
        if (e->ip == ip && e->mode == mode)
            return e;
        i = (i + 1) & mask;
    }
    *slot = i;
    return NULL;
}

const struct insn_info *ic_entry(const struct icache *ic, uint32_t k)
{
    return &ic->chunks[k / CHUNK][k % CHUNK];
}

int ic_add(struct icache *ic, const struct insn_info *in)
{
    uint32_t slot;
    if (find(ic, in->ip, in->mode, &slot))
        return 0;
    if (ic->n == UINT32_MAX - 1)
        return -E_NOMEM;
    if (ic->n / CHUNK >= ic->nchunks) {
        struct insn_info **nc = realloc(ic->chunks,
                                        (ic->nchunks + 1) * sizeof *nc);
        if (!nc)
            return -E_NOMEM;
        ic->chunks = nc;
        nc[ic->nchunks] = hm_chunk(&ic->mem, CHUNK * sizeof **nc);
        if (!nc[ic->nchunks])
            return -E_NOMEM;
        ic->nchunks++;
    }
    *entry(ic, ic->n) = *in;
    ic->slots[slot] = ++ic->n;
    if (2 * (uint64_t)ic->n > ic->slots_cap)
        return grow_slots(&ic->slots, &ic->slots_cap, ic->n, insn_key, ic);
    return 0;
}

const struct insn_info *ic_lookup(struct icache *ic, uint64_t ip, int mode,
                                  int *err)
{
    uint32_t slot;
    struct insn_info *e = find(ic, ip, mode, &slot);
    if (e)
        return e;
    int r = ic->fill(ic->ctx, ic, ip, mode);
    if (r < 0) {
        *err = r;
        return NULL;
    }
    e = find(ic, ip, mode, &slot);
    if (!e) {
        *err = -E_INTERNAL;
        return NULL;
    }
    return e;
}

/* block._fill: the plain OTHER instructions from ip inside ip's mapping,
 * with their INSN records */
static int build_run(struct icache *ic, struct run *r, uint64_t ip, int mode)
{
    int err = 0;
    memset(r, 0, sizeof *r);
    r->ip = ip;
    r->mode = (int8_t)mode;
    r->next_ip = ip;
    const struct insn_info *i = ic_lookup(ic, ip, mode, &err);
    if (!i)
        return err;
    r->first = i;
    if (i->err)
        return 0;                       /* no mapping / no instruction */
    r->lo = i->lo;
    r->last = i->last;
    uint64_t cur = ip;
    uint32_t cap = 0;
    for (;;) {
        if (i->err || i->iclass != C_OTHER)
            break;
        if (r->n == cap) {
            cap = cap ? 2 * cap : 8;
            uint8_t *np = realloc(r->packed, (size_t)cap * INSN_REC);
            if (!np)
                return -E_NOMEM;
            r->packed = np;
        }
        pack_insn(r->packed + (size_t)r->n * INSN_REC, cur, i->size,
                  i->iclass);
        r->last_ip = cur;
        r->last_size = i->size;
        r->last_trunc = (i->flags & IF_TRUNC) != 0;
        r->n++;
        cur += i->size;
        if (!(r->lo <= cur && cur <= r->last))
            break;
        i = ic_lookup(ic, cur, mode, &err);
        if (!i)
            return err;
    }
    r->next_ip = cur;
    if (r->n && r->lo <= cur && cur <= r->last && !i->err && i->ip == cur) {
        /* a copy next to the run: one cache line less per block */
        r->term_info = *i;
        r->term = &r->term_info;
        r->has_term = 1;
    }
    return 0;
}

int ic_each_run(struct icache *ic, int (*fn)(void *, struct run *), void *ctx)
{
    for (uint32_t i = 0; i < ic->nr; i++)
        TRY(fn(ctx, rentry(ic, i)));
    return 0;
}

struct run *ic_run(struct icache *ic, uint64_t ip, int mode, int *err)
{
    uint32_t mask = ic->rslots_cap - 1;
    uint32_t i = (uint32_t)key_of(ip, mode) & mask;
    for (;;) {
        uint32_t k = ic->rslots[i];
        if (!k)
            break;
        struct run *r = rentry(ic, k - 1);
        if (r->ip == ip && r->mode == mode)
            return r;
        i = (i + 1) & mask;
    }
    if (ic->nr / CHUNK >= ic->nrchunks) {
        struct run **nc = realloc(ic->rchunks, (ic->nrchunks + 1) * sizeof *nc);
        if (!nc) {
            *err = -E_NOMEM;
            return NULL;
        }
        ic->rchunks = nc;
        nc[ic->nrchunks] = hm_chunk(&ic->mem, CHUNK * sizeof **nc);
        if (!nc[ic->nrchunks]) {
            *err = -E_NOMEM;
            return NULL;
        }
        ic->nrchunks++;
    }
    struct run *r = rentry(ic, ic->nr);
    int e = build_run(ic, r, ip, mode);
    if (e < 0) {
        free(r->packed);
        *err = e;
        return NULL;
    }
    /* build_run may have filled the cache: the run slots are unchanged */
    ic->rslots[i] = ++ic->nr;
    if (2 * (uint64_t)ic->nr > ic->rslots_cap &&
        grow_slots(&ic->rslots, &ic->rslots_cap, ic->nr, run_key, ic) < 0) {
        *err = -E_NOMEM;
        return NULL;
    }
    return r;
}


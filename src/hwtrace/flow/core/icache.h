/* The instruction cache of one image (hwtrace.flow.fetch.InsnCache) and
 * the block decoder's cache of plain runs (hwtrace.flow.block's _run /
 * _fill), keyed by (exec mode, IP).
 *
 * x86 decoding is the glue's (core/pyfill.h: core/x86.h over the image's
 * mappings, or fast.filler with the twin's InsnCache for errors and
 * section crossings): on a miss the cache calls ``fill(ip, mode)``, which
 * adds the entry for ip
 * -- an instruction, or the fetch error the twin's InsnCache.decode raises
 * there -- and may add the instructions that follow it.  Entries never
 * move (chunked storage): pointers to them stay valid for the cache's
 * life. */
#ifndef HWTRACE_CORE_ICACHE_H
#define HWTRACE_CORE_ICACHE_H

#include "common.h"
#include "hugemem.h"

enum { IF_INDIRECT = 1, IF_FAR = 2, IF_CPL = 4, IF_CR3 = 8, IF_VMPTRLD = 16,
       IF_VMENTRY = 32, IF_TRUNC = 64 };

struct insn_info {
    uint64_t ip;
    int64_t rel;                /* x86's rel (a JMPABS target: indirect) */
    uint64_t lo, last;          /* the mapping of ip: [lo, last] */
    uint8_t size, iclass, flags;
    int8_t err;                 /* 0, or E_NOMAP / E_BAD_INSN: no insn */
    int8_t mode;
};

/* fetch.next_ip: the IP after i when it doesn't depend on trace */
static inline int insn_next_ip(const struct insn_info *i, uint64_t *out)
{
    int c = i->iclass;
    if (c == C_OTHER || c == C_PTWRITE) {
        *out = i->ip + i->size;
        return 1;
    }
    if ((c == C_CALL || c == C_JUMP) && !(i->flags & IF_INDIRECT)) {
        *out = i->ip + i->size + (uint64_t)i->rel;
        return 1;
    }
    return 0;
}

#define RUN_SUCC 2

struct run {                    /* a cached plain run (block._fill) */
    /* what the hot path reads, together */
    uint64_t ip;
    uint64_t next_ip;           /* the IP after the run */
    uint64_t lo, last;          /* the mapping of its first instruction */
    uint32_t n;                 /* plain instructions; 0: the twin's None */
    int8_t mode;
    uint8_t has_term;
    uint8_t last_size, last_trunc;  /* the run's last instruction */
    /* the runs executed after this one's terminating branch (the
     * next-run lookup without hashing) */
    uint64_t succ_ip[RUN_SUCC];
    struct run *succ[RUN_SUCC];
    /* the last successor not in succ (an indirect branch's targets past
     * the first two: an interpreter's dispatch, a virtual call), replaced
     * on each miss -- the next-run lookup without hashing while a target
     * repeats; no edge counter (edges take the table) */
    uint64_t mru_ip;
    struct run *mru;
    const struct insn_info *term;   /* the entry at next_ip if in the same
                                       mapping and already known (a copy:
                                       term_info), else NULL */
    struct insn_info term_info;
    /* edges: times each successor followed the terminating branch,
     * counted here by the walk and added up at the end (walk.h) */
    uint64_t succ_n[RUN_SUCC];
    /* the rest */
    uint64_t last_ip;
    const struct insn_info *first;  /* its first instruction's entry */
    uint8_t *packed;            /* n INSN records (ip u8, size u1, iclass
                                   u1) */
};

struct icache;
/* fill(ctx, cache, ip, mode): add the entry for (ip, mode) with ic_add;
 * 0, or -E_PYERR / -E_NOMEM */
typedef int (*ic_fill_fn)(void *ctx, struct icache *ic, uint64_t ip,
                          int mode);

struct icache {
    void *key;                  /* the image (the glue's) */
    ic_fill_fn fill;
    void *ctx;
    struct insn_info **chunks;
    uint32_t nchunks, n;
    uint32_t *slots;            /* entry index + 1 by hash of (ip, mode) */
    uint32_t slots_cap;
    struct run **rchunks;
    uint32_t nrchunks, nr;
    uint32_t *rslots;
    uint32_t rslots_cap;
    struct hugemem mem;         /* the chunks (of both kinds) */
};

struct icache *ic_new(void *key, ic_fill_fn fill, void *ctx);
void ic_free(struct icache *ic);
/* add an entry (the fill callback's job); an existing one is kept */
int ic_add(struct icache *ic, const struct insn_info *i);
/* the entry at (ip, mode), filled on a miss; NULL with *err set
 * (-E_PYERR / -E_NOMEM) if the fill failed */
const struct insn_info *ic_lookup(struct icache *ic, uint64_t ip, int mode,
                                  int *err);
/* the entries, in the order they were added (k < ic->n) */
const struct insn_info *ic_entry(const struct icache *ic, uint32_t k);
/* calls fn(ctx, run) for every run (fn returns < 0 to stop) */
int ic_each_run(struct icache *ic, int (*fn)(void *, struct run *),
                void *ctx);
/* the run at (ip, mode) (n == 0: none); NULL with *err on failure */
struct run *ic_run(struct icache *ic, uint64_t ip, int mode, int *err);

#define INSN_REC 10

static inline uint64_t packed_ip(const uint8_t *rec)
{
    uint64_t ip;
    memcpy(&ip, rec, 8);
    return ip;
}

static inline void pack_insn(uint8_t *out, uint64_t ip, int size, int iclass)
{
    memcpy(out, &ip, 8);        /* little-endian hosts only (x86-64) */
    out[8] = (uint8_t)size;
    out[9] = (uint8_t)iclass;
}

#endif

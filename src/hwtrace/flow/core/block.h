/* The block decoder (hwtrace.flow.block.BlockDecoder) over the
 * instruction decoder, with the run cache, and the record a block (or a
 * stretch of the instruction decoder's flow) becomes. */
#ifndef HWTRACE_CORE_BLOCK_H
#define HWTRACE_CORE_BLOCK_H

#include <stdlib.h>

#include "insn.h"

#define MAX_BLOCK_INSNS 0xFFFF

struct bytebuf {
    uint8_t *p;
    size_t n, cap;
};

static inline int bb_reserve(struct bytebuf *b, size_t more)
{
    if (b->n + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more)
        cap *= 2;
    uint8_t *np = realloc(b->p, cap);
    if (!np)
        return -E_NOMEM;
    b->p = np;
    b->cap = cap;
    return 0;
}

/* BLOCK record flags (docs/pipeline.md) */
enum { RF_SPECULATIVE = 1, RF_TRUNCATED = 2, RF_INDIRECT = 4 };

struct rec {
    uint64_t ip, end_ip;
    ptrdiff_t offset;
    uint64_t tsc;
    uint8_t have_tsc;
    uint32_t ninsn;
    int8_t mode;
    uint8_t spec, trunc, iclass, size, indirect;
    struct bytebuf *insns;      /* INSN records go here, or NULL */
};

static inline int rec_add(struct rec *r, const struct insn_info *i, int spec)
{
    if (!r->ninsn) {
        r->ip = i->ip;
        r->mode = i->mode;
        r->spec = (uint8_t)spec;
    }
    r->ninsn++;
    r->end_ip = i->ip;
    r->iclass = i->iclass;
    r->size = i->size;
    r->trunc = (i->flags & IF_TRUNC) != 0;
    r->indirect = (i->flags & IF_INDIRECT) != 0;
    if (r->insns) {
        TRY(bb_reserve(r->insns, INSN_REC));
        pack_insn(r->insns->p + r->insns->n, i->ip, i->size, i->iclass);
        r->insns->n += INSN_REC;
    }
    return 0;
}

/* the first k instructions of run ru */
static inline int rec_add_run(struct rec *r, const struct run *ru,
                              uint32_t k, int spec)
{
    if (!r->ninsn) {
        r->ip = ru->ip;
        r->mode = ru->mode;
        r->spec = (uint8_t)spec;
    }
    r->ninsn += k;
    r->iclass = C_OTHER;
    r->indirect = 0;
    if (k == ru->n) {
        r->end_ip = ru->last_ip;
        r->size = ru->last_size;
        r->trunc = ru->last_trunc;
    } else {
        const uint8_t *p = ru->packed + (size_t)(k - 1) * INSN_REC;
        r->end_ip = packed_ip(p);
        r->size = p[8];
        r->trunc = 0;
    }
    if (r->insns) {
        size_t n = (size_t)k * INSN_REC;
        TRY(bb_reserve(r->insns, n));
        memcpy(r->insns->p + r->insns->n, ru->packed, n);
        r->insns->n += n;
    }
    return 0;
}

/* BlockDecoder.next: a status, R_ERR (d->err, the partial block in *r)
 * or R_FATAL; *r must be empty (ninsn 0) */
int blk_next(struct insn_dec *d, struct rec *r);

/* the run at (ip, mode) if p's successors (or its last other one) have
 * it, else NULL */
static inline struct run *run_succ(const struct run *p, uint64_t ip,
                                   int mode)
{
    for (int i = 0; i < RUN_SUCC; i++) {
        struct run *ru = p->succ[i];
        if (ru && p->succ_ip[i] == ip && ru->mode == mode)
            return ru;
    }
    if (p->mru && p->mru_ip == ip && p->mru->mode == mode)
        return p->mru;
    return NULL;
}

/* the run the fast paths may take at d's IP (enabled, nothing pending,
 * not resynchronizing, none of ``slow_mask`` in the status), else NULL
 * (*err < 0: a fatal error); the previous run's successors first.  Where
 * the run there has no instructions (a branch at d's IP), *first (if not
 * NULL) is set to that branch's entry, the ``known`` of insn_next. */
static inline struct run *fast_run_first(struct insn_dec *d, int slow_mask,
                                         int *err,
                                         const struct insn_info **first)
{
    *err = 0;
    if (!d->enabled || d->process_event || d->resyncing ||
        (d->status & slow_mask) || d->mode == MODE_NONE)
        return NULL;
    uint64_t ip = d->ip;
    int mode = d->mode;
    struct run *p = d->prev_run, *ru;
    if (p && (ru = run_succ(p, ip, mode)))
        goto have;
    ru = ic_run(d->ic, ip, mode, err);
    if (!ru)
        return NULL;
    if (p) {
        int i = 0;
        for (; i < RUN_SUCC; i++) {
            if (!p->succ[i]) {
                p->succ[i] = ru;
                p->succ_ip[i] = ip;
                break;
            }
        }
        if (i == RUN_SUCC) {
            p->mru = ru;
            p->mru_ip = ip;
        }
    }
have:
    if (ru->n)
        return ru;
    if (first)
        *first = ru->first;
    return NULL;
}

static inline struct run *fast_run(struct insn_dec *d, int slow_mask,
                                   int *err)
{
    return fast_run_first(d, slow_mask, err, NULL);
}

#endif

/* The counts and edges fast path: see walk.h. */
#include <stdlib.h>

#include "walk.h"

/* -- TNT chains --------------------------------------------------------------- */

/* the chain for the decoder's state, if one applies (chain.h); NULL with
 * *err < 0 on a fatal error.  With no TNT bit cached, the key is the next
 * TNT packet's bits (q_tnt_peek), cached where a chain is found for them
 * (q_cache_tnt_quick: the query's own packet step, taken ahead of it) --
 * a chain takes at least one bit, so the next query is that packet's
 * first bit whether the chain then applies or not.  A chain then starts
 * where the last one ran out of bits, after a TIP or a run, instead of a
 * general step (insn_next, q_cond_branch) for the first bit of every
 * packet.  ``known``: the entry at the IP, or NULL (see queries_bit). */
/* whether the instruction at the decoder's IP, ``known`` (or NULL),
 * queries a TNT bit first in a step insn_next_quick could take: a
 * conditional branch or a near return, nothing pending */
static inline int queries_bit(const struct insn_dec *d,
                              const struct insn_info *known)
{
    return known && known->ip == d->ip && known->mode == d->mode &&
           !known->err &&
           (known->iclass == C_COND || known->iclass == C_RETURN) &&
           !(d->status & (ST_DEFERRED | ST_EVENT_PENDING)) &&
           !d->process_event && !d->resyncing && d->enabled &&
           !d->cfg->tick;
}

static inline __attribute__((always_inline)) struct chain *
walk_chain(struct session *s, struct walk *w, int *err,
           const struct insn_info *known, int plain)
{
    *err = 0;
    struct insn_dec *d = &s->d;
    struct query *q = &d->q;
    uint64_t index = q->tnt_index, bits = q->tnt_bits;
    int peeked = 0;
    ptrdiff_t to = 0;
    if (!index) {
        if (!q_tnt_peek(q, &index, &bits, &to))
            return NULL;
        peeked = 1;
    }
    struct chain_cache *cc = &w->chains;     /* (ready: walk) */
    struct chain *ch = chain_get(cc, d, index, bits, err, plain);
    if (!ch) {
        /* no chain (a return whose call it does not have): the packet
         * cached all the same where the next instruction queries it */
        if (peeked && *err >= 0 && queries_bit(d, known))
            q_cache_tnt_to(q, to);
        return NULL;
    }
    if (peeked && !q_cache_tnt_to(q, to)) {
        *err = -E_INTERNAL;     /* q_tnt_peek said it would */
        return NULL;
    }
    return chain_status_clean(q, index, ch) ? ch : NULL;
}

/* the chain that the next lookup tries first (chain_get's guess, the
 * successor of ``ch``), its two lines fetched ahead: the guess's first
 * load was the walk's costliest miss (perf: 15% of sess_run's samples on
 * python3, on the compare of its ip0), and the step after the chain (a
 * TIP, a run) has work of its own to do while the lines come */
static inline void prefetch_succ(const struct chain_cache *cc,
                                 const struct chain *ch)
{
    if (ch->succ) {
        const char *g = (const char *)&cc->ents[ch->succ - 1];
        __builtin_prefetch(g);
        __builtin_prefetch(g + 64);
    }
}

/* the decoder and the session after the chain, as its steps leave them */
static inline void walk_apply(struct session *s, struct walk *w,
                              struct chain *ch)
{
    struct insn_dec *d = &s->d;
    d->q.tnt_index >>= ch->c;
    d->icount = ch->icount;
    d->have_mark = 0;
    d->status = 0;
    if (ch->npush) {
        const uint64_t *push = (ch->have_from & CHAIN_PIN) ? ch->pin
                                                           : ch->push;
        for (int j = 0; j < ch->npush; j++)
            rs_push(d, push[j]);
    }
    if (ch->have_from & CHAIN_RET)
        rs_pop(d, &d->ip);      /* chain_get: the stack has it */
    else
        d->ip = ch->end_ip;
    if (ch->last_run)
        d->prev_run = ch->last_run;
    w->insns += ch->insns;
    s->last_ip = ch->last_ip;
    s->status = 0;
    s->known = ch->next;
}

int walk_done(struct walk *w)
{
    int r = 0;
    if (w->edges && w->chains.edges)
        r = chain_flush_edges(&w->chains, w->edges);
    chain_free(&w->chains);
    if (w->edges && r >= 0)
        r = edge_settle(w->edges);
    return r;
}

/* -- blocks ----------------------------------------------------------------- */

/* blk_next without a record: the block's instructions (*ninsn: those it
 * has so far, with the bounds lo, last if have_bounds, and ``known`` the
 * entry at d->ip or NULL) and last IP */
static int blk_count(struct insn_dec *d, uint32_t *ninsn, uint64_t *end_ip,
                     int have_bounds, uint64_t lo, uint64_t last,
                     const struct insn_info *known)
{
    int status = 0, err = 0;
    uint32_t n = *ninsn;
    for (;;) {
        uint32_t room = MAX_BLOCK_INSNS - n;
        if (!room)
            break;
        struct run *ru = known ? NULL
                               : fast_run_first(d, ST_EVENT_PENDING | ST_EOS,
                                                &err, &known);
        if (err < 0) {
            d->fatal = -err;
            return R_FATAL;
        }
        if (ru) {
            status = 0;
            if (ru->n > room) {
                n += room;
                *end_ip = packed_ip(ru->packed + (size_t)(room - 1) * INSN_REC);
                d->icount += room;
                d->ip = packed_ip(ru->packed + (size_t)room * INSN_REC);
                *ninsn = n;
                return 0;
            }
            n += ru->n;
            *end_ip = ru->last_ip;
            d->icount += ru->n;
            d->ip = ru->next_ip;
            d->prev_run = ru;
            if (!have_bounds) {
                lo = ru->lo;
                last = ru->last;
                have_bounds = 1;
            }
            if (!(lo <= d->ip && d->ip <= last))
                break;
            known = ru->term;
            continue;
        }
        const struct insn_info *i = known;
        /* a conditional branch or return with no bit cached: the next
         * TNT packet cached here, as walk_insns does after walk_chain, so
         * insn_next_quick takes it */
        uint64_t pi, pb;
        ptrdiff_t to;
        if (queries_bit(d, known) && q_tnt_peek(&d->q, &pi, &pb, &to))
            q_cache_tnt_to(&d->q, to);
        int s = insn_step(d, known, &i);
        known = NULL;
        if (s == R_FATAL)
            return s;
        if (s == R_ERR) {
            if (d->err.insn) {
                n++;
                *end_ip = d->err.insn->ip;
            }
            *ninsn = n;
            return R_ERR;
        }
        status = s;
        n++;
        *end_ip = i->ip;
        if (status & (ST_EVENT_PENDING | ST_EOS))
            break;
        if (i->iclass != C_OTHER) {
            int c = i->iclass, ends = 1;
            if (c == C_CALL && !(i->flags & IF_INDIRECT))
                ends = d->cfg->end_on_call;
            else if (c == C_JUMP && !(i->flags & IF_INDIRECT))
                ends = d->cfg->end_on_jump;
            if (ends)
                break;
        }
        if (!d->enabled)
            break;
        if (!have_bounds) {
            lo = i->lo;
            last = i->last;
            have_bounds = 1;
        }
        if (!(lo <= d->ip && d->ip <= last))
            break;
    }
    *ninsn = n;
    return status;
}

static int walk_blocks(struct session *s, struct walk *w)
{
    struct insn_dec *d = &s->d;
    int chained = 0;
    while (!(s->status & (ST_EVENT_PENDING | ST_EOS))) {
        uint32_t n0 = 0;
        uint64_t end = 0, lo = 0, last = 0;
        const struct insn_info *known = NULL;
        struct chain *ch = NULL;
        if (!chained) {
            int err;
            ch = walk_chain(s, w, &err, NULL, 0);
            if (err < 0)
                return err;
        }
        chained = 0;
        if (ch) {
            uint64_t before = s->last_ip;
            walk_apply(s, w, ch);
            w->blocks += ch->blocks;
            chained = 1;
            if (!ch->bn) {
                /* the next chain may start where this one ran out of
                 * bits or returned */
                chained = d->q.tnt_index != 0 &&
                          !(ch->have_from & CHAIN_RET);
                continue;
            }
            /* the block it leaves open: last_ip stays the last whole
             * block's end (step_block's: an error in the open block
             * leaves it, and an event's error after the resync reports
             * it) */
            s->last_ip = ch->blocks ? ch->blk_end : before;
            n0 = ch->bn;
            lo = ch->lo;
            last = ch->last;
            known = ch->next;
            end = ch->last_ip;
        }
        uint32_t n = n0;
        int st = blk_count(d, &n, &end, n0 != 0, lo, last, known);
        if (st == R_FATAL)
            return -(d->fatal ? d->fatal : E_INTERNAL);
        if (n) {
            w->insns += n - n0;
            w->blocks++;
        }
        if (st == R_ERR) {
            s->err = d->err;
            s->state = SS_ERR;
            return 0;
        }
        s->last_ip = end;
        s->status = st;
    }
    return 0;
}

/* -- instructions ----------------------------------------------------------------- */

/* insn_tip_ready right after a chain was applied (walk_insns' tip): the
 * decoder's flags it checks are chain_get's plain ones, which the chain
 * left as they were, and the status the chain left is 0 -- only the
 * query's part is left to check */
static inline int tip_ready_after_chain(const struct insn_dec *d)
{
    const struct query *q = &d->q;
    return !q->tnt_index && !q->nxt_err && q->nxt.kind == PT_K_TIP &&
           !evq_pending(&q->evq, BIND_TIP);
}

static inline int edge_to(struct walk *w, uint64_t ip)
{
    if (w->edges && w->have_from)
        return edge_add(w->edges, w->from, ip, 1);
    return 0;
}

/* edge_to for the step right after chain ``oc`` (or NULL): its last
 * branch's edge, where the step is at its end_ip, on its out_n */
static inline int edge_to_after(struct walk *w, struct chain *oc,
                                uint64_t ip)
{
    if (oc && w->have_from && ip == oc->end_ip) {
        if (++oc->out_n == UINT32_MAX) {
            TRY(edge_add(w->edges, oc->last_ip, oc->end_ip, oc->out_n));
            oc->out_n = 0;
        }
        return 0;
    }
    return edge_to(w, ip);
}

/* the edge from the branch that ended run p to the run ru that follows:
 * in p's successor counter where ru is one of p's successors (no
 * hashing), else in the table */
static inline int edge_to_run(struct walk *w, struct run *p, struct run *ru)
{
    if (!w->edges || !w->have_from)
        return 0;
    if (p && p->term && p->term->ip == w->from) {
        for (int i = 0; i < RUN_SUCC; i++) {
            if (p->succ[i] == ru && p->succ_ip[i] == ru->ip) {
                p->succ_n[i]++;
                return 0;
            }
        }
    }
    return edge_add(w->edges, w->from, ru->ip, 1);
}

int walk_flush_run(void *ctx, struct run *ru)
{
    struct walk *w = ctx;
    for (int i = 0; i < RUN_SUCC; i++) {
        if (ru->succ_n[i]) {
            TRY(edge_add(w->edges, ru->term->ip, ru->succ_ip[i],
                         ru->succ_n[i]));
            ru->succ_n[i] = 0;
        }
    }
    return 0;
}

static int walk_insns(struct session *s, struct walk *w)
{
    struct insn_dec *d = &s->d;
    int err = 0;
    int chained = 0;
    /* the chain applied last where its last instruction is a branch
     * whose edge (to its end_ip, as it leaves no return to the stack's
     * top) this step may count on it: edge_to_after */
    struct chain *out = NULL;
    /* the chain applied last where it stops before an indirect branch
     * (its nk; the step after it at its next, d->ip) */
    struct chain *tip = NULL;
    /* the last step applied a chain: the decoder's flags chain_get checks
     * hold but for the instruction count (chain_get's plain) */
    int plain = 0;
    while (!(s->status & (ST_EVENT_PENDING | ST_EOS))) {
        struct chain *ch = NULL, *oc = out, *tc = tip;
        out = tip = NULL;
        if (!chained) {
            ch = walk_chain(s, w, &err, s->known, plain);
            if (err < 0)
                return err;
        }
        chained = 0;
        if (ch) {
            if (w->edges && w->have_from) {
                /* the edge into the chain (d->ip is its ip0) */
                if (ch->in_n && ch->in_from == w->from) {
                    ch->in_n++;
                } else {
                    if (ch->in_n)
                        TRY(edge_add(w->edges, ch->in_from, ch->ip0,
                                     ch->in_n));
                    ch->in_from = w->from;
                    ch->in_n = 1;
                }
            }
            walk_apply(s, w, ch);
            prefetch_succ(&w->chains, ch);
            ch->uses++;         /* for its edges (walk_done) */
            w->from = ch->last_ip;
            w->have_from = ch->have_from & 1;
            /* the next chain may start where this one ran out of bits or
             * returned */
            chained = d->q.tnt_index != 0 && !(ch->have_from & CHAIN_RET);
            if (w->edges && (ch->have_from & (1 | CHAIN_RET)) == 1)
                out = ch;
            if (ch->nk)
                tip = ch;
            plain = 1;
            continue;
        }
        plain = 0;
        const struct insn_info *known = s->known;
        s->known = NULL;
        const struct insn_info *i = known;
        int r;
        if (tc && tip_ready_after_chain(d)) {
            /* insn_step's TIP step for the chain's next (known, at
             * d->ip, insn_tip_next's part on it checked by the chain),
             * its size and class from the chain's line, not the entry */
            uint64_t ip = d->ip;
            r = insn_next_tip_as(d, known, tc->nk & 15, tc->nk >> 4);
            if (r >= 0) {
                TRY(edge_to_after(w, oc, ip));
                w->have_from = 1;       /* (a jump, call or return) */
                w->from = ip;
                w->insns++;
                s->last_ip = ip;
                s->status = r;
                /* a clean TIP step changes none of chain_get's flags (a
                 * deferred error or an event would be in the status) */
                plain = r == 0 && d->status == 0 && !d->q.deferred;
                continue;
            }
        } else {
            struct run *p = d->prev_run;
            struct run *ru = known && known->ip == d->ip ? NULL :
                fast_run_first(d, ST_EVENT_PENDING | ST_DEFERRED | ST_EOS,
                               &err, &known);
            if (err < 0)
                return err;
            if (ru) {
                TRY(edge_to_run(w, p, ru));
                w->have_from = 0;
                w->insns += ru->n;
                d->icount += ru->n;
                d->ip = ru->next_ip;
                d->prev_run = ru;
                s->last_ip = ru->last_ip;
                s->status = 0;
                s->known = ru->term;
                continue;
            }
            i = known;
            r = insn_step(d, known, &i);
        }
        if (r == R_FATAL)
            return -(d->fatal ? d->fatal : E_INTERNAL);
        if (r == R_ERR) {
            i = d->err.insn;
            if (i) {
                TRY(edge_to_after(w, oc, i->ip));
                w->have_from = i->iclass != C_OTHER &&
                               i->iclass != C_PTWRITE;
                w->from = i->ip;
                w->insns++;
            }
            s->err = d->err;
            s->state = SS_ERR;
            return 0;
        }
        TRY(edge_to_after(w, oc, i->ip));
        w->have_from = i->iclass != C_OTHER && i->iclass != C_PTWRITE;
        w->from = i->ip;
        w->insns++;
        s->last_ip = i->ip;
        s->status = r;
    }
    return 0;
}

int walk(struct session *s, struct walk *w)
{
    struct chain_cache *cc = &w->chains;
    if (!cc->ready) {
        cc->ready = 1;
        cc->block = s->block;
        cc->edges = w->edges && !s->block;
        cc->end_on_call = s->d.cfg->end_on_call;
        cc->end_on_jump = s->d.cfg->end_on_jump;
    }
    /* the session's count is the walk's: added once, not at every step */
    uint64_t before = w->insns;
    int r = s->block ? walk_blocks(s, w) : walk_insns(s, w);
    s->ninsn += w->insns - before;
    return r;
}

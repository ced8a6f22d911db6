/* The block decoder: a port of hwtrace.flow.block.BlockDecoder.next. */
#include "block.h"

/* _ends_block for a branch (iclass not OTHER) */
static int ends_block(const struct insn_dec *d, const struct insn_info *i)
{
    int c = i->iclass;
    if (c == C_CALL && !(i->flags & IF_INDIRECT))
        return d->cfg->end_on_call;
    if (c == C_JUMP && !(i->flags & IF_INDIRECT))
        return d->cfg->end_on_jump;
    return 1;
}

int blk_next(struct insn_dec *d, struct rec *r)
{
    uint64_t lo = 0, last = 0;
    int have_bounds = 0, status = 0, err;
    const struct insn_info *known = NULL;
    for (;;) {
        uint32_t room = MAX_BLOCK_INSNS - r->ninsn;
        if (!room)
            return status;
        /* right after a run its terminating branch comes (no run starts
         * at a branch): no lookup for it */
        struct run *ru = known ? NULL
                               : fast_run(d, ST_EVENT_PENDING | ST_EOS, &err);
        if (err < 0) {
            d->fatal = -err;
            return R_FATAL;
        }
        if (ru) {
            status = 0;
            int spec = d->speculative;
            if (ru->n > room) {
                if (rec_add_run(r, ru, room, spec) < 0) {
                    d->fatal = E_NOMEM;
                    return R_FATAL;
                }
                d->icount += room;
                d->ip = packed_ip(ru->packed + (size_t)room * INSN_REC);
                return 0;
            }
            if (rec_add_run(r, ru, ru->n, spec) < 0) {
                d->fatal = E_NOMEM;
                return R_FATAL;
            }
            d->icount += ru->n;
            d->ip = ru->next_ip;
            d->prev_run = ru;
            if (!have_bounds) {
                lo = ru->lo;
                last = ru->last;
                have_bounds = 1;
            }
            if (!(lo <= d->ip && d->ip <= last))
                return 0;
            known = ru->term;
            continue;
        }
        const struct insn_info *i = known;
        int spec = d->speculative;
        int s = insn_next_quick(d, known);
        if (s == R_SLOW)
            s = insn_next(d, known, &i, &spec);
        known = NULL;
        if (s == R_FATAL)
            return s;
        if (s == R_ERR) {
            if (d->err.insn && rec_add(r, d->err.insn, d->err.spec) < 0) {
                d->fatal = E_NOMEM;
                return R_FATAL;
            }
            return R_ERR;
        }
        status = s;
        if (rec_add(r, i, spec) < 0) {
            d->fatal = E_NOMEM;
            return R_FATAL;
        }
        if (status & (ST_EVENT_PENDING | ST_EOS))
            break;
        if (i->iclass != C_OTHER && ends_block(d, i))
            break;
        if (!d->enabled)
            break;
        if (!have_bounds) {
            /* a block stays inside the section it started in */
            lo = i->lo;
            last = i->last;
            have_bounds = 1;
        }
        if (!(lo <= d->ip && d->ip <= last))
            break;
    }
    return status;
}

/* The drive loop: see session.h and hwtrace.flow.session. */
#include "session.h"
#include "walk.h"

void sess_init(struct session *s, const uint8_t *buf, ptrdiff_t end,
               const struct core_config *cfg, struct icache *ic, int block,
               int resync)
{
    memset(s, 0, sizeof *s);
    insn_init(&s->d, buf, end, cfg, ic);
    s->d.disable_at_trace_branch = block;
    s->block = block;
    s->resync = resync;
    s->sync_at = -1;
    s->state = SS_SYNC;
}

void sess_free(struct session *s)
{
    insn_free(&s->d);
    free(s->stage.p);
    s->stage.p = NULL;
}

static ptrdiff_t offset23(struct session *s)
{
    if (s->plain_offsets)
        return insn_offset(&s->d);
    return insn_error_offset(&s->d);
}

static int fatal(struct session *s, int code)
{
    if (code < 0)
        code = -code;
    s->fatal = code ? code : E_INTERNAL;
    return SESS_FATAL;
}

/* the time a record begins with */
static void rec_time(struct session *s, struct rec *r)
{
    const struct flow_time *t = &s->d.q.time;
    r->tsc = t->m_tsc;
    r->have_tsc = t->m_have;
}

static int flush(struct session *s)
{
    if (!s->open.ninsn)
        return 0;
    s->ninsn += s->open.ninsn;
    int r = s->ops->record(s->ctx, &s->open,
                           s->want_insns ? s->stage.p : NULL);
    s->open.ninsn = 0;
    s->stage.n = 0;
    return r;
}

static void open_new(struct session *s, ptrdiff_t offset)
{
    s->open.ninsn = 0;
    s->open.offset = offset;
    s->open.insns = s->want_insns ? &s->stage : NULL;
    s->stage.n = 0;
    rec_time(s, &s->open);
}

/* the instruction decoder's instructions: does one at ``offset`` with
 * speculative flag ``spec`` in ``mode`` continue the open record? */
static int continues(struct session *s, ptrdiff_t offset, int spec, int mode)
{
    return s->open.ninsn && s->open_other && s->open.offset == offset &&
           s->open.spec == spec && s->open.mode == mode;
}

static int add_insn(struct session *s, const struct insn_info *i, int spec,
                    ptrdiff_t offset)
{
    if (!continues(s, offset, spec, i->mode)) {
        TRY(flush(s));
        open_new(s, offset);
    }
    TRY(rec_add(&s->open, i, spec));
    s->open_other = i->iclass == C_OTHER;
    /* a branch ends its record at once (a batch may end after it) */
    return s->open_other ? 0 : flush(s);
}

static int item_event(struct session *s, const struct event *ev,
                      ptrdiff_t offset)
{
    TRY(flush(s));
    return s->ops->event(s->ctx, ev, offset);
}

static int item_error(struct session *s, int kind, ptrdiff_t offset,
                      uint64_t ip, int code)
{
    TRY(flush(s));
    if (s->obs && s->obs->at_error)
        TRY(s->obs->at_error(s->obs->ctx, s, code));
    return s->ops->error(s->ctx, kind, offset, ip, code);
}

static int item_status(struct session *s, int name, ptrdiff_t offset,
                       int ip_suppressed)
{
    TRY(flush(s));
    return s->ops->status(s->ctx, name, offset, ip_suppressed);
}

static int step_sync(struct session *s)
{
    struct insn_dec *d = &s->d;
    int r;
    if (s->sync_at >= 0) {
        r = insn_sync_set(d, s->sync_at);
        s->sync_at = -1;
    } else {
        r = insn_sync_forward(d);
    }
    s->last_ip = 0;
    if (r == R_FATAL)
        return fatal(s, d->fatal);
    if (r == R_ERR) {
        if (d->err.code == E_EOS) {
            s->state = SS_DONE;
            return 0;
        }
        ptrdiff_t pos = insn_offset(d);
        TRY(item_error(s, K_SYNC_ERROR, pos, 0, d->err.code));
        if (pos <= s->last_sync) {
            s->state = SS_DONE;
            return 0;
        }
        s->last_sync = pos;
        return 0;
    }
    if (s->hooks && s->hooks->after_sync)
        TRY(s->hooks->after_sync(s->hooks->ctx, s));
    s->status = r;
    s->state = SS_LOOP;
    return 0;
}

static int step_event(struct session *s)
{
    struct insn_dec *d = &s->d;
    ptrdiff_t offset = offset23(s);
    struct event ev;
    int r = insn_event(d, &ev);
    if (r == R_FATAL)
        return fatal(s, d->fatal);
    if (r == R_ERR) {
        s->err = d->err;
        s->err.ip = s->last_ip;
        s->state = SS_ERR;
        return 0;
    }
    if (s->hooks && s->hooks->after_event)
        TRY(s->hooks->after_event(s->hooks->ctx, s, &ev));
    TRY(item_event(s, &ev, offset));
    s->status = r;
    if (s->obs && s->obs->at_event)
        TRY(s->obs->at_event(s->obs->ctx, s, &ev));
    return 0;
}

static int step_block(struct session *s)
{
    struct insn_dec *d = &s->d;
    ptrdiff_t offset = insn_offset(d);
    struct rec *r = &s->open;
    open_new(s, offset);
    int st = blk_next(d, r);
    if (st == R_FATAL)
        return fatal(s, d->fatal);
    rec_time(s, r);
    if (st == R_ERR) {
        if (r->ninsn)
            TRY(flush(s));
        s->err = d->err;
        s->state = SS_ERR;
        return 0;
    }
    s->last_ip = r->end_ip;
    TRY(flush(s));
    s->status = st;
    return 0;
}

static int step_insn(struct session *s)
{
    struct insn_dec *d = &s->d;
    ptrdiff_t offset = insn_offset(d);
    int err;
    /* the twin's fast path, a run at a time: tracing on, nothing pending,
     * not at the end (then each instruction returns status 0); a run
     * never starts at the branch that ends the one before */
    const struct insn_info *known = s->known;
    s->known = NULL;
    struct run *ru = known && known->ip == d->ip ? NULL :
        fast_run(d, ST_EVENT_PENDING | ST_DEFERRED | ST_EOS, &err);
    if (err < 0)
        return fatal(s, err);
    if (ru) {
        int spec = d->speculative;
        if (!continues(s, offset, spec, ru->mode)) {
            TRY(flush(s));
            open_new(s, offset);
        }
        TRY(rec_add_run(&s->open, ru, ru->n, spec));
        s->open_other = 1;
        d->icount += ru->n;
        d->ip = ru->next_ip;
        d->prev_run = ru;
        s->last_ip = ru->last_ip;
        s->status = 0;
        s->known = ru->term;
        return 0;
    }
    const struct insn_info *i = known;
    int spec = d->speculative;
    int r = insn_next_quick(d, known);
    if (r == R_SLOW)
        r = insn_next(d, known, &i, &spec);
    if (r == R_FATAL)
        return fatal(s, d->fatal);
    if (r == R_ERR) {
        if (d->err.insn)
            TRY(add_insn(s, d->err.insn, d->err.spec, offset));
        s->err = d->err;
        s->state = SS_ERR;
        return 0;
    }
    s->last_ip = i->ip;
    TRY(add_insn(s, i, spec, offset));
    s->status = r;
    return 0;
}

static int step_err(struct session *s)
{
    if (s->err.code == E_EOS) {
        s->state = SS_DONE;
        return 0;
    }
    TRY(item_error(s, K_ERROR, s->err.offset, s->err.ip, s->err.code));
    s->state = s->resync ? SS_RESYNC : SS_SYNC;
    return 0;
}

static int step_resync(struct session *s)
{
    struct insn_dec *d = &s->d;
    int r = insn_resync(d);
    if (r == R_FATAL)
        return fatal(s, d->fatal);
    if (r == R_ERR) {
        if (d->err.code == E_EOS) {
            s->state = SS_DONE;
            return 0;
        }
        TRY(item_error(s, K_RESYNC_ERROR, d->err.offset, s->err.ip,
                       d->err.code));
        s->state = SS_SYNC;
        return 0;
    }
    if (s->hooks && s->hooks->after_sync)
        TRY(s->hooks->after_sync(s->hooks->ctx, s));
    s->status = r;
    if (!s->block)
        s->last_ip = s->err.ip;
    TRY(item_status(s, S_RESYNCED, offset23(s),
                    (r & ST_IP_SUPPRESSED) != 0));
    s->state = SS_LOOP;
    return 0;
}

static int step_loop(struct session *s)
{
    if (s->status & ST_EVENT_PENDING)
        return step_event(s);
    if (s->status & ST_EOS) {
        if (!(s->status & ST_IP_SUPPRESSED))
            TRY(item_status(s, S_END_OF_TRACE, offset23(s), 0));
        s->state = SS_DONE;
        return 0;
    }
    if (s->obs && s->obs->before_record)
        TRY(s->obs->before_record(s->obs->ctx, s));
    return s->block ? step_block(s) : step_insn(s);
}

int sess_flush(struct session *s)
{
    return flush(s);
}

int sess_run(struct session *s)
{
    for (;;) {
        int r;
        /* one record or item at most per step: the sink may cut after
         * any of them, as the twin's batches do */
        if (s->ops->full(s->ctx))
            return SESS_YIELD;
        switch (s->state) {
        case SS_SYNC:
            r = step_sync(s);
            break;
        case SS_LOOP:
            if (s->walk && !s->obs &&
                !(s->status & (ST_EVENT_PENDING | ST_EOS))) {
                /* no record open: the walk's instructions come after
                 * the open record's */
                r = flush(s);
                if (r >= 0)
                    r = walk(s, s->walk);
            } else {
                r = step_loop(s);
            }
            break;
        case SS_ERR:
            r = step_err(s);
            break;
        case SS_RESYNC:
            r = step_resync(s);
            break;
        default:
            r = flush(s);
            if (r < 0)
                return fatal(s, r);
            return SESS_DONE;
        }
        if (r == -E_STOP)
            return SESS_STOPPED;
        if (r < 0)
            return s->fatal ? SESS_FATAL : fatal(s, r);
        if (s->d.q.fatal)
            return fatal(s, s->d.q.fatal);
    }
}

/* The instruction flow decoder: a port of hwtrace.flow.insn.InsnDecoder
 * with hwtrace.flow.evtrace_insn (libipt's pt_insn_decoder).
 *
 * The verbs return a status (>= 0), R_ERR with the twin's DecodeError in
 * d->err, or R_FATAL (a callback raised, or memory ran out: the decode
 * stops and the Python exception propagates). */
#ifndef HWTRACE_CORE_INSN_H
#define HWTRACE_CORE_INSN_H

#include "icache.h"
#include "query.h"

#define R_ERR (-1)
#define R_FATAL (-2)
#define R_SLOW (-3)             /* insn_next_quick: take insn_next */

static inline int is_fatal(int code)
{
    if (code < 0)
        code = -code;
    return code == E_PYERR || code == E_NOMEM || code == E_STOP;
}

struct derr {                   /* DecodeError */
    int code;
    ptrdiff_t offset;
    uint64_t ip;
    const struct insn_info *insn;   /* decoded before the error, or NULL */
    uint8_t spec;                   /* that instruction's speculative flag */
};

#define RS_CAP 64

struct insn_dec {
    struct query q;
    const struct core_config *cfg;
    struct icache *ic;
    int disable_at_trace_branch;
    int fatal;                  /* the fatal code that stopped it */
    uint64_t rs[RS_CAP];        /* return stack: rs_n entries, the newest */
    int rs_top, rs_n;           /* at rs_top */
    /* _reset() state */
    int8_t mode;
    uint64_t ip;
    int status;
    uint8_t enabled, process_event, speculative, process_insn;
    struct event ev;
    uint8_t ev_spent;           /* resync must not hand ev out again: its
                                   processing failed, or a resync resumed
                                   at its IP */
    const struct insn_info *p_insn;
    uint8_t bound_paging, bound_vmcs, bound_ptwrite;
    uint64_t last_tsc;
    uint8_t resyncing;
    int injected;               /* 0, 1: inj_ev, 2: inj_err */
    struct event inj_ev;
    struct derr inj_err;
    uint64_t icount;
    uint8_t have_mark;
    int8_t mark_mode;
    uint64_t mark_ip, mark_n, mark_lim;
    uint8_t have_cr3, have_vmcs;
    uint64_t cr3, vmcs;
    uint8_t ev_at_set, ev_at_stay;
    ptrdiff_t ev_at_start, ev_at_end;
    /* the offset of the packet that published the event insn_event
     * delivered last (-1: unknown): the next event may be fetched, and
     * ev_at* overwritten, before that call returns */
    ptrdiff_t delivered_start;
    struct derr err;            /* the last error returned */
    /* the run whose instructions were taken last (a cache: its successor
     * runs save the next run's lookup; cleared with the image) */
    struct run *prev_run;
};

void insn_init(struct insn_dec *d, const uint8_t *buf, ptrdiff_t end,
               const struct core_config *cfg, struct icache *ic);
void insn_free(struct insn_dec *d);
static inline void insn_set_image(struct insn_dec *d, struct icache *ic)
{
    d->ic = ic;
    d->prev_run = NULL;
}

int insn_sync_forward(struct insn_dec *d);
int insn_sync_set(struct insn_dec *d, ptrdiff_t offset);
int insn_resync(struct insn_dec *d);
/* next(): *out the instruction (also with R_ERR when err.insn is set),
 * *spec its speculative flag; ``known``: the entry at d->ip if the caller
 * has it, else NULL */
int insn_next(struct insn_dec *d, const struct insn_info *known,
              const struct insn_info **out, int *spec);
/* Instructions without a query after which direct branches are watched
 * for a loop that never reads trace again (insn.c, watch_loop) */
#define LOOP_WATCH (1u << 16)

static inline void rs_push(struct insn_dec *d, uint64_t ip)
{
    d->rs_top = (int)((unsigned)(d->rs_top + 1) % RS_CAP);
    d->rs[d->rs_top] = ip;
    if (d->rs_n < RS_CAP)
        d->rs_n++;
}

static inline int rs_pop(struct insn_dec *d, uint64_t *ip)
{
    if (!d->rs_n)
        return 0;
    *ip = d->rs[d->rs_top];
    d->rs_top = (int)((unsigned)(d->rs_top + RS_CAP - 1) % RS_CAP);
    d->rs_n--;
    return 1;
}

/* _status */
static inline int status_of(const struct insn_dec *d, int flags)
{
    if (!d->enabled)
        flags |= ST_IP_SUPPRESSED;
    if ((d->status & ST_EOS) && !d->process_event)
        flags |= ST_EOS;
    return flags;
}

/* the end of next() after the instruction proceeded, an event pending */
int insn_finish(struct insn_dec *d, const struct insn_info *i);

/* insn_next for ``i``, the entry at d->ip, where nothing is pending and
 * it needs no trace beyond a cached TNT bit (plain instructions, direct
 * jumps and calls, conditional branches and compressed returns with their
 * bit cached): the same status, state and errors; R_SLOW without changing
 * anything where insn_next must do it.  Inline: the hot path. */
static inline __attribute__((always_inline)) int
insn_next_quick(struct insn_dec *d, const struct insn_info *i)
{
    if ((d->status & (ST_DEFERRED | ST_EVENT_PENDING)) || d->process_event ||
        d->resyncing || !d->enabled || d->cfg->tick)
        return R_SLOW;
    if (!i || i->ip != d->ip || i->mode != d->mode || i->err)
        return R_SLOW;
    struct query *q = &d->q;
    uint64_t fall = d->ip + i->size;
    uint64_t index;
    int status;
    switch (i->iclass) {
    case C_OTHER: case C_PTWRITE:
        d->icount++;
        d->ip = fall;
        break;
    case C_COND:
        index = q->tnt_index;
        if (!index)
            return R_SLOW;
        q->tnt_index = index >> 1;
        d->icount = 0;
        d->have_mark = 0;
        status = q->tnt_index ? (q->deferred ? ST_DEFERRED : 0)
                              : q_status_flags(q);
        d->status = status;
        if (status & ST_DEFERRED)
            d->resyncing = 1;
        d->ip = (q->tnt_bits & index) ? fall + (uint64_t)i->rel : fall;
        break;
    case C_CALL: case C_JUMP:
        if ((i->flags & IF_INDIRECT) || d->icount + 1 > LOOP_WATCH)
            return R_SLOW;
        d->icount++;
        if (i->iclass == C_CALL && i->rel)
            rs_push(d, fall);
        d->ip = fall + (uint64_t)i->rel;
        break;
    case C_RETURN:
        index = q->tnt_index;
        if (!index || !(q->tnt_bits & index) || !d->rs_n)
            return R_SLOW;
        q->tnt_index = index >> 1;
        d->icount = 0;
        d->have_mark = 0;
        status = q->tnt_index ? (q->deferred ? ST_DEFERRED : 0)
                              : q_status_flags(q);
        d->status = status;
        if (status & ST_DEFERRED)
            d->resyncing = 1;
        rs_pop(d, &d->ip);
        break;
    default:
        return R_SLOW;
    }
    if (!d->process_event && !(d->status & ST_EVENT_PENDING))
        return status_of(d, 0);
    return insn_finish(d, i);
}
/* whether insn_next for ``i``, the entry at d->ip (or NULL), is an
 * indirect branch's plain step: a near indirect jump or call or a near
 * return, nothing pending (insn_next_quick's conditions), no TNT bit
 * cached and a TIP next that binds no event -- one q_indirect_branch (a
 * return's TNT query fails first, a TIP being next) */
/* insn_tip_next's conditions on the decoder and the query alone (for
 * a walk that knows the instruction's part holds) */
static inline int insn_tip_ready(const struct insn_dec *d)
{
    const struct query *q = &d->q;
    return !(d->status & (ST_DEFERRED | ST_EVENT_PENDING)) &&
           !d->process_event && !d->resyncing && d->enabled &&
           !d->cfg->tick && !q->tnt_index && !q->nxt_err &&
           q->nxt.kind == PT_K_TIP && !evq_pending(&q->evq, BIND_TIP);
}
static inline int insn_tip_next(const struct insn_dec *d,
                                const struct insn_info *i)
{
    return i && i->ip == d->ip && i->mode == d->mode && !i->err &&
           (i->flags & IF_INDIRECT) &&
           (i->iclass == C_JUMP || i->iclass == C_CALL ||
            i->iclass == C_RETURN) &&
           insn_tip_ready(d);
}
/* insn_next's error for instruction i at ip (its R_ERR or R_FATAL) */
int insn_error(struct insn_dec *d, int code, uint64_t ip,
               const struct insn_info *i);
/* insn_next where insn_tip_next says so: the same status, state and
 * errors (proceed's, indirect_branch's and insn_next's steps for it);
 * inline, the TIP's query too (q_indirect_branch_quick) */
static inline __attribute__((always_inline)) int
insn_next_tip_as(struct insn_dec *d, const struct insn_info *i, int size,
                 int iclass);
static inline __attribute__((always_inline)) int
insn_next_tip(struct insn_dec *d, const struct insn_info *i)
{
    return insn_next_tip_as(d, i, i->size, i->iclass);
}
/* insn_next_tip with i's size and iclass given (a walk that has them
 * nearer than i: i is read only for an error or a pending event) */
static inline __attribute__((always_inline)) int
insn_next_tip_as(struct insn_dec *d, const struct insn_info *i, int size,
                 int iclass)
{
    struct query *q = &d->q;
    uint64_t ip = d->ip, fall = ip + (unsigned)size;
    d->ip = fall;
    if (iclass == C_CALL)
        rs_push(d, fall);
    else if (iclass == C_RETURN)
        q->err_off = q_offset(q);   /* q_cond_branch's answer, a TIP next */
    /* proceed's count, then indirect_branch's */
    d->icount = 0;
    d->have_mark = 0;
    int status;
    uint64_t target = 0;
    int r = q_indirect_branch_quick(q, &status, &target);
    if (r < 0)
        return insn_error(d, r, ip, i);
    d->status = status;
    if (status & ST_DEFERRED)
        d->resyncing = 1;
    if (status & ST_IP_SUPPRESSED)
        return insn_error(d, -E_NOIP, ip, i);
    d->ip = target;
    /* status_of from the local, not d->status: GCC read d->status with
     * the flags after it as one 8-byte load right after the 4-byte store
     * above, a store-forwarding stall at every TIP (perf: ~6% of the
     * edge walk's samples on the next instruction) */
    if (!d->process_event && !(status & ST_EVENT_PENDING))
        return (d->enabled ? 0 : ST_IP_SUPPRESSED) | (status & ST_EOS);
    return insn_finish(d, i);
}
/* one step of the walks at d->ip with ``known`` the entry there (or
 * NULL): insn_next_tip where insn_tip_next says so, else insn_next_quick,
 * else insn_next (*i: the instruction it stepped, where that one finds it) */
static inline __attribute__((always_inline)) int
insn_step(struct insn_dec *d, const struct insn_info *known,
          const struct insn_info **i)
{
    if (insn_tip_next(d, known))
        return insn_next_tip(d, known);
    int r = insn_next_quick(d, known), spec;
    if (r == R_SLOW)
        r = insn_next(d, known, i, &spec);
    return r;
}
/* event(): *ev the event */
int insn_event(struct insn_dec *d, struct event *ev);
/* the offset libipt 2.3 reports now (error_offset) */
ptrdiff_t insn_error_offset(struct insn_dec *d);

static inline ptrdiff_t insn_offset(const struct insn_dec *d)
{
    return q_offset(&d->q);
}

/* the return stack, oldest first, into out (RS_CAP entries); its size */
int insn_stack(const struct insn_dec *d, uint64_t *out);

#endif

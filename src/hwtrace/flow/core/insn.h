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

/* The instruction flow decoder (hwtrace.flow.insn, evtrace_insn): see
 * insn.h.  The twin's _Err exceptions are negative -E_* returns of the
 * static helpers; the verbs turn them into DecodeErrors (d->err). */
#include "insn.h"

#define BDM64_MAX_STEPS 0x100

/* -- state ---------------------------------------------------------------- */

static void reset(struct insn_dec *d)
{
    d->mode = MODE_NONE;
    d->ip = 0;
    d->status = 0;
    d->enabled = d->process_event = d->speculative = d->process_insn = 0;
    d->ev_spent = 0;
    d->p_insn = NULL;
    d->bound_paging = d->bound_vmcs = d->bound_ptwrite = 0;
    d->last_tsc = 0;
    d->resyncing = 0;
    d->injected = 0;
    d->icount = 0;
    d->have_mark = 0;
    d->rs_n = d->rs_top = 0;
    d->have_cr3 = d->have_vmcs = 0;
    d->ev_at_set = 0;
    d->delivered_start = -1;
}

void insn_init(struct insn_dec *d, const uint8_t *buf, ptrdiff_t end,
               const struct core_config *cfg, struct icache *ic)
{
    memset(d, 0, sizeof *d);
    q_init(&d->q, buf, end, cfg);
    d->cfg = cfg;
    d->ic = ic;
    reset(d);
}

void insn_free(struct insn_dec *d)
{
    q_free(&d->q);
}


int insn_stack(const struct insn_dec *d, uint64_t *out)
{
    for (int i = 0; i < d->rs_n; i++)
        out[i] = d->rs[(d->rs_top - (d->rs_n - 1 - i) + RS_CAP) % RS_CAP];
    return d->rs_n;
}

/* -- errors ----------------------------------------------------------------- */

ptrdiff_t insn_error_offset(struct insn_dec *d)
{
    struct query *q = &d->q;
    if (d->cfg->offsets20)
        return q_offset(q);
    if (d->process_event) {
        if (!d->ev_at_set)
            return q_offset(q);
        return q_after_event(q, d->ev_at_stay, d->ev_at_start, d->ev_at_end);
    }
    if (q->tnt_index)
        return q_skip_pads(q, q->tnt_end);
    ptrdiff_t r = q_lookahead(q);
    if (r < 0) {
        q->fatal = E_NOMEM;
        return q_offset(q);
    }
    return r;
}

/* _error(code, ip, insn): R_ERR with d->err, or R_FATAL */
static int error(struct insn_dec *d, int code, uint64_t ip,
                 const struct insn_info *insn, int spec)
{
    if (code < 0)
        code = -code;
    if (is_fatal(code)) {
        d->fatal = code;
        return R_FATAL;
    }
    d->err.code = code;
    d->err.offset = insn_error_offset(d);
    d->err.ip = ip;
    d->err.insn = insn;
    d->err.spec = (uint8_t)spec;
    if (d->q.fatal) {
        d->fatal = d->q.fatal;
        return R_FATAL;
    }
    return R_ERR;
}

static int deferred(struct insn_dec *d)
{
    d->err.code = d->q.deferred;
    d->err.offset = d->q.deferred_off;
    d->err.ip = d->ip;
    d->err.insn = NULL;
    return R_ERR;
}


/* _event_pending: 1 if an event is being processed (fetching it if the
 * status says one is pending), 0 if not, -E_* */
static int event_pending(struct insn_dec *d)
{
    if (d->process_event)
        return 1;
    if (!(d->status & ST_EVENT_PENDING))
        return 0;
    int status;
    TRY(q_event(&d->q, &status, &d->ev));
    d->ev_spent = 0;
    d->status = status;
    d->have_mark = 0;
    if (status & ST_DEFERRED)
        d->resyncing = 1;
    d->ev_at_set = d->q.event_at_set;
    d->ev_at_stay = d->q.event_at_stay;
    d->ev_at_start = d->q.event_at_start;
    d->ev_at_end = d->q.event_at_end;
    d->last_tsc = d->ev.tsc;
    d->process_event = 1;
    return 1;
}

/* -- queries for instructions ------------------------------------------------- */

static void tick(struct insn_dec *d, uint64_t ip)
{
    if (!d->enabled || d->process_event)
        return;
    const struct flow_time *t = &d->q.time;
    if (t->m_tsc == d->last_tsc)
        return;
    struct event *ev = &d->ev;
    ev_init(ev, EV_TICK);
    ev->ip = ip;
    ev->has_tsc = t->m_have;
    ev->tsc = t->m_tsc;
    ev->lost_mtc = t->m_lost_mtc;
    ev->lost_cyc = t->m_lost_cyc;
    d->ev_spent = 0;
    d->last_tsc = t->m_tsc;
    d->process_event = 1;
}

static int cond_branch(struct insn_dec *d)
{
    d->icount = 0;
    d->have_mark = 0;
    int status, taken;
    TRY(q_cond_branch_fast(&d->q, &status, &taken));
    if (d->cfg->tick)
        tick(d, d->ip);
    d->status = status;
    if (status & ST_DEFERRED)
        d->resyncing = 1;
    return taken;
}

static int indirect_branch(struct insn_dec *d, uint64_t evip, uint64_t *target)
{
    d->icount = 0;
    d->have_mark = 0;
    int status;
    TRY(q_indirect_branch(&d->q, &status, target));
    if (d->cfg->tick)
        tick(d, evip);
    d->status = status;
    if (status & ST_DEFERRED)
        d->resyncing = 1;
    if (status & ST_IP_SUPPRESSED)
        return -E_NOIP;
    return 0;
}

/* _watch_loop (see the twin): Brent's cycle finding over direct branches
 * long after the last query */
static int watch_loop(struct insn_dec *d, const struct insn_info *i)
{
    uint64_t n = d->icount;
    if (!d->have_mark || n >= d->mark_lim) {
        d->have_mark = 1;
        d->mark_ip = i->ip;
        d->mark_mode = i->mode;
        d->mark_n = n;
        d->mark_lim = 2 * n;
    } else if (d->mark_ip == i->ip && d->mark_mode == i->mode) {
        return -E_TRACELESS_LOOP;
    }
    return 0;
}

static int proceed(struct insn_dec *d, const struct insn_info *i)
{
    d->icount++;
    uint64_t ip = d->ip + i->size;
    d->ip = ip;
    int c = i->iclass;
    if (c == C_OTHER || c == C_PTWRITE)
        return 0;
    if (c == C_COND) {
        int t = cond_branch(d);
        if (t < 0)
            return t;
        if (!t)
            return 0;
    } else if (c == C_CALL) {
        if (i->rel || (i->flags & IF_INDIRECT))
            rs_push(d, ip);
    } else if (c == C_RETURN) {
        int status, taken;
        if (q_cond_branch_fast(&d->q, &status, &taken) == 0) {
            d->icount = 0;
            d->have_mark = 0;
            if (d->cfg->tick)
                tick(d, d->ip);
            d->status = status;
            if (status & ST_DEFERRED)
                d->resyncing = 1;
            if (!taken)
                return -E_BAD_RETCOMP;
            uint64_t target;
            if (!rs_pop(d, &target))
                return -E_RETSTACK_EMPTY;
            d->ip = target;
            return 0;
        }
        if (d->q.fatal)
            return -d->q.fatal;
    } else if (c == C_UNKNOWN) {
        return -E_BAD_INSN;
    }
    if (!(i->flags & IF_INDIRECT)) {
        d->ip += (uint64_t)i->rel;
        if (d->icount > LOOP_WATCH)
            TRY(watch_loop(d, i));
    } else {
        uint64_t target = 0;
        TRY(indirect_branch(d, i->ip, &target));
        d->ip = target;
    }
    return 0;
}

/* -- events binding to instructions ----------------------------------------------- */

static int at_skl014(struct insn_dec *d, const struct insn_info *i)
{
    if (!d->ev.ip_suppressed)
        return 0;
    int c = i->iclass;
    if ((c == C_CALL || c == C_JUMP) && !(i->flags & IF_INDIRECT)) {
        uint64_t target;
        if (insn_next_ip(i, &target) && !addr_filter_check(d->cfg, target))
            return 1;
    }
    return 0;
}

static int at_disabled_event(struct insn_dec *d, const struct insn_info *i)
{
    const struct event *ev = &d->ev;
    if (ev->ip_suppressed) {
        if (i->flags & (IF_FAR | IF_CPL | IF_CR3))
            return 1;
        if (d->cfg->addr_cfg && d->cfg->skl014 && at_skl014(d, i))
            return 1;
        if (d->disable_at_trace_branch &&
            ((i->flags & IF_INDIRECT) || i->iclass == C_COND))
            return 1;
        return 0;
    }
    int c = i->iclass;
    if (c == C_OTHER || c == C_PTWRITE)
        return 0;
    if ((c == C_CALL || c == C_JUMP) && !(i->flags & IF_INDIRECT)) {
        uint64_t nip;
        insn_next_ip(i, &nip);
        return nip == ev->ip;
    }
    if (c == C_UNKNOWN)
        return -E_BAD_INSN;
    return 1;
}

static int postpone(struct insn_dec *d, const struct insn_info *i)
{
    if (!d->process_insn) {
        d->process_insn = 1;
        d->p_insn = i;
    }
    return status_of(d, ST_EVENT_PENDING);
}

static void clear_postponed(struct insn_dec *d)
{
    d->process_insn = 0;
    d->bound_paging = d->bound_vmcs = d->bound_ptwrite = 0;
}

static int proceed_postponed(struct insn_dec *d)
{
    if (!d->process_insn)
        return -E_INTERNAL;
    if (!d->enabled) {
        clear_postponed(d);
        return 0;
    }
    TRY(proceed(d, d->p_insn));
    clear_postponed(d);
    return 0;
}

static int at_insn_type(int t)          /* evtrace_insn._AT_INSN */
{
    return t == EV_IRET || t == EV_VMENTRY || t == EV_UIRET;
}

/* _check_insn_event: a status (EVENT_PENDING if it binds), 0, or -E_* */
static int check_insn_event(struct insn_dec *d, const struct insn_info *i)
{
    int p = event_pending(d);
    if (p <= 0)
        return p;
    struct event *ev = &d->ev;
    int t = ev->type;
    uint64_t nip;
    switch (t) {
    case EV_DISABLED: {
        if (ev->status_update)
            return 0;
        int r = at_disabled_event(d, i);
        if (r <= 0)
            return r;
        if (!insn_next_ip(i, &nip)) {
            nip = 0;
            if (i->iclass == C_CALL || i->iclass == C_FAR_CALL)
                nip = i->ip + i->size;
        }
        d->ip = nip;
        return status_of(d, ST_EVENT_PENDING);
    }
    case EV_PAGING:
        if (d->bound_paging || !(i->flags & (IF_FAR | IF_CR3)))
            return 0;
        d->bound_paging = 1;
        return postpone(d, i);
    case EV_VMCS:
        if (d->bound_vmcs || !(i->flags & (IF_FAR | IF_VMPTRLD)))
            return 0;
        d->bound_vmcs = 1;
        return postpone(d, i);
    case EV_PTWRITE:
        if (d->bound_ptwrite)
            return 0;
        if (ev->ip_suppressed) {
            if (i->iclass != C_PTWRITE)
                return 0;
        } else if (d->ip != ev->ip) {
            return 0;
        }
        d->bound_ptwrite = 1;
        return postpone(d, i);
    }
    /* evtrace_insn.check_insn_event */
    if (!ev_is_cfe(t) || !d->enabled)
        return 0;
    int bind = EV_HAS(ev, BIND) ? ev->bind : BIND_NONE;
    if (bind == BIND_INSN) {
        if (insn_next_ip(i, &nip))
            return 0;
    } else if (bind != BIND_NONE || ev->ip_suppressed || !at_insn_type(t) ||
               i->ip != ev->ip) {
        return 0;
    }
    return postpone(d, i);
}

/* fetch.range_is_contiguous */
static int range_is_contiguous(struct insn_dec *d, uint64_t begin,
                               uint64_t end, int mode, int steps)
{
    uint64_t ip = begin;
    while (ip != end) {
        if (!steps)
            return 0;
        steps--;
        if (mode == MODE_NONE)
            return 0;
        int err = 0;
        const struct insn_info *i = ic_lookup(d->ic, ip, mode, &err);
        if (!i)
            return err;
        if (i->err)
            return 0;
        uint64_t nip;
        if (!insn_next_ip(i, &nip))
            return 0;
        ip = nip;
    }
    return 1;
}

static int bdm64(struct insn_dec *d, const struct insn_info *i)
{
    if (!d->ev.aborted)
        return 0;
    if (i->iclass == C_OTHER || i->iclass == C_PTWRITE)
        return 0;
    int r = range_is_contiguous(d, d->ip, d->ev.ip, d->mode, BDM64_MAX_STEPS);
    if (r)
        return r < 0 ? r : 0;
    d->ip = d->ev.ip;
    return 1;
}

static int skd022(struct insn_dec *d)
{
    if (d->mode == MODE_NONE)
        return 0;
    int err = 0;
    const struct insn_info *i = ic_lookup(d->ic, d->ip, d->mode, &err);
    if (!i)
        return err;
    if (i->err || !(i->flags & IF_VMENTRY))
        return 0;
    d->ev.type = EV_DISABLED;
    return 1;
}

/* evtrace_insn.check_ip_event */
static int evtrace_check_ip_event(struct insn_dec *d, int pending)
{
    struct event *ev = &d->ev;
    int t = ev->type;
    if (t == EV_TRIG) {
        if (!d->enabled)
            return pending;
        if (!ev->ip_suppressed)
            return ev->ip == d->ip ? pending : status_of(d, 0);
        if (EV_HAS(ev, ICNTV) && ev->icntv) {
            if (d->icount != ev->icnt)
                return status_of(d, 0);
            ev->ip = d->ip;
            ev->ip_suppressed = 0;
            EV_SET(ev, ICNT, ev->icnt = 0);
        }
        return pending;
    }
    if (ev_is_cfe(t) && d->enabled) {
        int bind = EV_HAS(ev, BIND) ? ev->bind : BIND_NONE;
        if (bind == BIND_INSN)
            return status_of(d, 0);
        if (bind == BIND_IP)
            return ev->at == d->ip ? pending : status_of(d, 0);
        if (!ev->ip_suppressed) {
            if (at_insn_type(t) || ev->ip != d->ip)
                return status_of(d, 0);
        }
    }
    return pending;
}

/* _check_ip_event(insn): a status, or -E_* */
static int check_ip_event(struct insn_dec *d, const struct insn_info *i)
{
    int p = event_pending(d);
    if (p < 0)
        return p;
    if (!p)
        return status_of(d, 0);
    struct event *ev = &d->ev;
    int t = ev->type;
    uint64_t ip = d->ip;
    int pending = status_of(d, ST_EVENT_PENDING);
    switch (t) {
    case EV_DISABLED:
        if (ev->status_update)
            return pending;
        break;
    case EV_ENABLED: case EV_OVERFLOW: case EV_STOP:
        return pending;
    case EV_ASYNC_DISABLED: {
        if (ev->at != ip)
            return status_of(d, 0);
        if (d->cfg->skd022) {
            int r = skd022(d);
            if (r < 0)
                return r;
            if (r)
                return status_of(d, 0);
        }
        return pending;
    }
    case EV_TSX:
        if (ev->ip_suppressed)
            return pending;
        if (i && d->cfg->bdm64)
            TRY(bdm64(d, i));
        if (d->ip != ev->ip)
            return status_of(d, 0);
        return pending;
    case EV_ASYNC_BRANCH:
        if (ev->from != ip)
            return status_of(d, 0);
        return pending;
    case EV_EXEC_MODE: case EV_ASYNC_PAGING: case EV_ASYNC_VMCS:
    case EV_IFLAGS:
        if (!ev->ip_suppressed && ev->ip != ip &&
            (d->enabled || t == EV_ASYNC_PAGING || t == EV_ASYNC_VMCS))
            return status_of(d, 0);
        return pending;
    case EV_PAGING: case EV_VMCS: case EV_PTWRITE:
        if (d->enabled)
            return status_of(d, 0);
        return pending;
    case EV_EXSTOP: case EV_MWAIT:
        if (!ev->ip_suppressed && d->enabled && ip != ev->ip)
            return status_of(d, 0);
        return pending;
    case EV_PWRE: case EV_PWRX: case EV_TICK: case EV_CBR: case EV_MNT:
        return pending;
    default:
        return evtrace_check_ip_event(d, pending);
    }
    return status_of(d, 0);
}

/* -- synchronization -------------------------------------------------------------- */

static int start(struct insn_dec *d, int r, int status, uint64_t ip)
{
    if (r < 0) {
        if (is_fatal(r) || d->q.fatal)
            return error(d, r, 0, NULL, 0);
        d->err.code = -r;
        d->err.offset = d->q.err_off;
        d->err.ip = 0;
        d->err.insn = NULL;
        return R_ERR;
    }
    d->status = status;
    if (!(status & ST_IP_SUPPRESSED)) {
        d->ip = ip;
        d->enabled = 1;
    }
    int s = check_ip_event(d, NULL);
    if (s < 0)
        return error(d, s, d->ip, NULL, 0);
    return s;
}

int insn_sync_forward(struct insn_dec *d)
{
    int status = 0;
    uint64_t ip = 0;
    reset(d);
    int r = q_sync_forward(&d->q, &status, &ip);
    return start(d, r, status, ip);
}

int insn_sync_set(struct insn_dec *d, ptrdiff_t offset)
{
    int status = 0;
    uint64_t ip = 0;
    reset(d);
    int r = q_sync_set(&d->q, offset, &status, &ip);
    return start(d, r, status, ip);
}

/* -- the verbs -------------------------------------------------------------------- */

int insn_next(struct insn_dec *d, const struct insn_info *known,
              const struct insn_info **out, int *spec)
{
    *out = NULL;
    if ((d->status & ST_DEFERRED) && !d->process_event &&
        !(d->status & ST_EVENT_PENDING))
        return deferred(d);
    if (d->resyncing) {
        int r = insn_resync(d);
        if (r < 0)
            return r;
        if (r & ST_EVENT_PENDING)
            return error(d, E_EVENT_IGNORED, d->ip, NULL, 0);
    }
    if (!d->enabled) {
        if (d->status & ST_EOS)
            return error(d, E_EOS, d->ip, NULL, 0);
        return error(d, E_NO_ENABLE, d->ip, NULL, 0);
    }
    uint64_t ip = d->ip;
    const struct insn_info *i = known;
    if (!i || i->ip != ip || i->mode != d->mode) {
        if (d->mode == MODE_NONE)
            return error(d, E_BAD_INSN, ip, NULL, 0);
        int err = 0;
        i = ic_lookup(d->ic, ip, d->mode, &err);
        if (!i)
            return error(d, err, ip, NULL, 0);
    }
    if (i->err)
        return error(d, i->err, ip, NULL, 0);
    int sp = d->speculative;
    *out = i;
    *spec = sp;
    int s = 0;
    if (d->process_event || (d->status & ST_EVENT_PENDING)) {
        s = check_insn_event(d, i);
        if (s < 0)
            return error(d, s, ip, i, sp);
        if (s & ST_EVENT_PENDING)
            return s;
    }
    s = proceed(d, i);
    if (s < 0)
        return error(d, s, ip, i, sp);
    /* nothing pending: _check_ip_event is _status(0) */
    if (!d->process_event && !(d->status & ST_EVENT_PENDING))
        return status_of(d, 0);
    s = check_ip_event(d, i);
    if (s < 0)
        return error(d, s, ip, i, sp);
    return s;
}

int insn_error(struct insn_dec *d, int code, uint64_t ip,
               const struct insn_info *i)
{
    return error(d, code, ip, i, d->speculative);
}

/* _TRACE_ON: packets only a CPU that traces writes */
static int trace_on(const struct event *ev)
{
    if (!EV_HAS(ev, FOLLOWS))
        return 0;
    switch (ev->follows) {
    case PT_K_TNT8: case PT_K_TNT64: case PT_K_TIP: case PT_K_FUP:
    case PT_K_TIP_PGD:
        return 1;
    }
    return 0;
}

int insn_finish(struct insn_dec *d, const struct insn_info *i)
{
    int s = check_ip_event(d, i);
    if (s < 0)
        return error(d, s, i->ip, i, d->speculative);
    return s;
}

static int process_enabled(struct insn_dec *d, const struct event *ev)
{
    if (ev->status_update) {
        if (!d->enabled) {
            if (d->cfg->strict)
                return -E_BAD_STATUS_UPDATE;
            /* tracing is on at the PSB's IP, the packets after the PSB+
             * show it: go on there */
            if (trace_on(ev) && !ev->ip_suppressed) {
                d->ip = ev->ip;
                d->enabled = 1;
            }
        }
        return 0;
    }
    if (ev->ip_suppressed)
        return -E_NOIP;
    if (d->enabled)
        return -E_BAD_CONTEXT;
    d->ip = ev->ip;
    d->enabled = 1;
    return 0;
}

static int process_disabled(struct insn_dec *d, const struct event *ev)
{
    if (ev->status_update) {
        if (d->enabled) {
            if (d->cfg->strict)
                return -E_BAD_STATUS_UPDATE;
            /* a PSB+ without FUP while we trace: a TIP.PGE next means
             * tracing did stop; TNT/TIP next, the CPU still traced */
            if (EV_HAS(ev, FOLLOWS) && ev->follows == PT_K_TIP_PGE)
                d->enabled = 0;
        }
        return 0;
    }
    if (!d->enabled)
        return -E_BAD_CONTEXT;
    d->enabled = 0;
    return 0;
}

static void process_asid(struct insn_dec *d, const struct event *ev)
{
    if (ev->type == EV_PAGING || ev->type == EV_ASYNC_PAGING) {
        d->cr3 = ev->cr3;
        d->have_cr3 = 1;
    } else {
        d->vmcs = ev->base;
        d->have_vmcs = 1;
    }
}

static int ip_reference(int t)          /* _IP_REFERENCE */
{
    switch (t) {
    case EV_ENABLED: case EV_ASYNC_BRANCH: case EV_OVERFLOW: case EV_TSX:
    case EV_EXSTOP: case EV_MWAIT: case EV_IFLAGS: case EV_TRIG:
    case EV_ASYNC_DISABLED: case EV_EXEC_MODE:
        return 1;
    }
    return 0;
}

static int process_event(struct insn_dec *d, struct event *ev)
{
    int t = ev->type;
    switch (t) {
    case EV_ENABLED:
        if (d->ip == ev->ip)
            EV_SET(ev, RESUMED, ev->resumed = 1);
        TRY(process_enabled(d, ev));
        break;
    case EV_ASYNC_DISABLED:
        if (!ev->ip_suppressed && d->ip != ev->at)
            return -E_BAD_QUERY;
        TRY(process_disabled(d, ev));
        break;
    case EV_DISABLED:
        TRY(process_disabled(d, ev));
        break;
    case EV_ASYNC_BRANCH:
        if (d->ip != ev->from)
            return -E_BAD_QUERY;
        if (ev->status_update || !d->enabled)
            return -E_BAD_CONTEXT;
        d->ip = ev->to;
        break;
    case EV_ASYNC_PAGING: case EV_ASYNC_VMCS:
        if (!ev->ip_suppressed && d->ip != ev->ip)
            return -E_BAD_QUERY;
        process_asid(d, ev);
        break;
    case EV_PAGING: case EV_VMCS:
        process_asid(d, ev);
        break;
    case EV_OVERFLOW:
        if (ev->status_update)
            return -E_BAD_CONTEXT;
        if (ev->ip_suppressed) {
            d->enabled = 0;
            d->ip = 0;
        } else {
            d->ip = ev->ip;
            d->enabled = 1;
        }
        d->speculative = 0;
        break;
    case EV_EXEC_MODE:
        if (ev->status_update && d->enabled && d->mode != MODE_NONE &&
            d->mode != ev->mode)
            return -E_BAD_STATUS_UPDATE;
        d->mode = ev->mode;
        break;
    case EV_TSX:
        d->speculative = ev->speculative;
        break;
    case EV_STOP:
        if (ev->status_update || d->enabled)
            return -E_BAD_CONTEXT;
        break;
    case EV_EXSTOP: case EV_MWAIT:
        if (!ev->ip_suppressed && d->enabled && d->ip != ev->ip)
            return -E_BAD_QUERY;
        break;
    case EV_TRIG:                       /* evtrace_insn.process_event */
        if (!ev->ip_suppressed && d->enabled && ev->ip != d->ip)
            return -E_BAD_QUERY;
        break;
    default:
        break;
    }
    if (ip_reference(t) && !ev->ip_suppressed)
        d->icount = 0;
    d->process_event = 0;
    return 0;
}

int insn_event(struct insn_dec *d, struct event *out)
{
    if (d->injected) {
        int inj = d->injected;
        d->injected = 0;
        if (inj == 2) {
            d->err = d->inj_err;
            return R_ERR;
        }
        *out = d->inj_ev;
        return status_of(d, ST_EVENT_PENDING);
    }
    if (!d->process_event)
        return error(d, E_BAD_QUERY, d->ip, NULL, 0);
    d->have_mark = 0;
    d->delivered_start = d->ev_at_set ? d->ev_at_start : -1;
    int r = process_event(d, &d->ev);
    if (r < 0) {
        d->ev_spent = 1;
        return error(d, r, d->ip, NULL, 0);
    }
    *out = d->ev;
    int s = 0;
    if (d->process_insn) {
        s = check_insn_event(d, d->p_insn);
        if (s >= 0 && (s & ST_EVENT_PENDING))
            return s;
        if (s >= 0)
            s = proceed_postponed(d);
    }
    if (s >= 0)
        s = check_ip_event(d, NULL);
    if (s < 0) {
        /* the event is delivered; the error comes with the next call */
        int e = error(d, s, d->ip, NULL, 0);
        if (e == R_FATAL)
            return e;
        d->inj_err = d->err;
        d->injected = 2;
        return status_of(d, ST_EVENT_PENDING);
    }
    return s;
}

static int ip_event_type(int t)         /* _IP_EVENTS */
{
    switch (t) {
    case EV_TSX: case EV_EXSTOP: case EV_MWAIT: case EV_PTWRITE:
    case EV_EXEC_MODE: case EV_ASYNC_PAGING: case EV_ASYNC_VMCS:
    case EV_IFLAGS:
        return 1;
    }
    return 0;
}

int insn_resync(struct insn_dec *d)
{
    if (d->q.deferred)
        return deferred(d);
    if (d->process_event && d->ev_spent)
        d->process_event = 0;       /* it would fail the same way again */
    if (d->process_event && d->ev.status_update && d->q.last_psb >= 0)
        return insn_sync_set(d, d->q.last_psb);
    clear_postponed(d);
    d->resyncing = 0;
    for (;;) {
        if (!(d->process_event || (d->status & ST_EVENT_PENDING))) {
            int status, have;
            uint64_t target = 0;
            int r = q_skip_to_ip(&d->q, &status, &target, &have);
            if (r < 0)
                return error(d, r, d->ip, NULL, 0);
            d->status = status;
            if (have) {
                d->ip = target;
                d->enabled = 1;
                int s = check_ip_event(d, NULL);
                return s < 0 ? error(d, s, d->ip, NULL, 0) : s;
            }
            if (!(status & ST_EVENT_PENDING))
                return error(d, E_BAD_QUERY, d->ip, NULL, 0);
            continue;
        }
        int r = event_pending(d);
        if (r < 0)
            return error(d, r, d->ip, NULL, 0);
        struct event *ev = &d->ev;
        int t = ev->type;
        if (t == EV_ENABLED) {
            if (ev->status_update) {
                d->ip = ev->ip;
                d->enabled = 1;
            } else if (d->enabled) {
                /* tracing was on as far as we know: show the gap */
                ev_init(&d->inj_ev, EV_DISABLED);
                d->inj_ev.ip_suppressed = 1;
                d->injected = 1;
                d->enabled = 0;
            }
            return status_of(d, ST_EVENT_PENDING);
        }
        if (t == EV_EXEC_MODE && ev->status_update) {
            if (d->enabled && d->mode != MODE_NONE && d->mode != ev->mode)
                return error(d, E_BAD_STATUS_UPDATE, d->ip, NULL, 0);
            return status_of(d, ST_EVENT_PENDING);
        }
        int s = -1;
        if (t == EV_ASYNC_BRANCH) {
            d->ip = ev->from;
            d->enabled = 1;
            d->ev_spent = 1;
            s = check_ip_event(d, NULL);
        } else if (t == EV_ASYNC_DISABLED) {
            d->ip = ev->at;
            d->enabled = 1;
            d->ev_spent = 1;
            s = check_ip_event(d, NULL);
        } else if (ip_event_type(t) && !ev->ip_suppressed) {
            d->ip = ev->ip;
            d->enabled = 1;
            d->ev_spent = 1;
            s = check_ip_event(d, NULL);
        } else if (t == EV_OVERFLOW || t == EV_DISABLED || t == EV_STOP) {
            return status_of(d, ST_EVENT_PENDING);
        } else {
            /* an event without IP: the user gets it, then we look on */
            d->resyncing = 1;
            return status_of(d, ST_EVENT_PENDING);
        }
        return s < 0 ? error(d, s, d->ip, NULL, 0) : s;
    }
}

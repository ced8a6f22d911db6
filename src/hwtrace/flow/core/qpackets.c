/* The query decoder's decode steps for branch and event packets: TIP*,
 * FUP, PIP, VMCS, MODE (hwtrace.flow.query), power events and PTWRITE
 * (hwtrace.flow.power), event trace CFE/EVD and TRIG
 * (hwtrace.flow.evtrace). */
#include "query.h"

static int is_async_ip_event(int t)  /* async_paging/async_vmcs/exec_mode/iflags */
{
    return t == EV_ASYNC_PAGING || t == EV_ASYNC_VMCS || t == EV_EXEC_MODE ||
           t == EV_IFLAGS;
}

int q_dec_tip(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    q->mode_exec_pending = 0;
    TRY(q_update_ip(q, p));
    if (!evq_dequeue(&q->evq, BIND_TIP, &ev)) {
        q_consume(q);
        return 0;
    }
    int t = ev.type;
    if (t == EV_ASYNC_BRANCH) {
        q->consume_packet = 1;
        q_event_ip(q, &ev, 1);
    } else if (is_async_ip_event(t)) {
        q_event_ip(q, &ev, 0);
    } else if (!ev_is_cfe(t)) {             /* evtrace.bind_tip */
        return -E_BAD_CONTEXT;
    }
    q_publish(q, &ev);
    if (evq_pending(&q->evq, BIND_TIP))
        return 0;
    if (!q->consume_packet)
        return 0;
    q->consume_packet = 0;
    q_consume(q);
    return 0;
}

int q_dec_tip_pge(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    int have = 0;
    uint64_t ip;
    q->mode_exec_pending = 0;
    TRY(q_update_ip(q, p));
    if (!q_query_ip(q, &ip))
        return -E_BAD_PACKET;
    if (!q->consume_packet) {
        ev_init(&ev, EV_ENABLED);
        ev.ip = ip;
        EV_SET(&ev, RESUMED, ev.resumed = 0);
        have = 1;
        q->tnt_bits = q->tnt_index = 0;
        q->consume_packet = 1;
        q->enabled = 1;
    } else if (evq_dequeue(&q->evq, BIND_TIP, &ev)) {
        have = 1;
        if (ev.type == EV_EXEC_MODE || ev.type == EV_IFLAGS)
            q_event_ip(q, &ev, 0);
        else if (!ev_is_cfe(ev.type))       /* evtrace.bind_tip_pge */
            return -E_BAD_CONTEXT;
    }
    if (!have)
        return -E_INTERNAL;
    q_publish(q, &ev);
    if (evq_pending(&q->evq, BIND_TIP))
        return 0;
    q->consume_packet = 0;
    q_consume(q);
    return 0;
}

int q_dec_tip_pgd(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    q->mode_exec_pending = 0;
    TRY(q_update_ip(q, p));
    if (evq_dequeue(&q->evq, BIND_TIP, &ev)) {
        int t = ev.type;
        if (t == EV_ASYNC_BRANCH) {
            ev.type = EV_ASYNC_DISABLED;
            ev.at = ev.from;
            q_event_ip(q, &ev, 0);
        } else if (is_async_ip_event(t)) {
            ev.ip_suppressed = 1;
        } else if (ev_is_cfe(t)) {          /* evtrace.bind_tip_pgd */
            q_publish(q, &ev);              /* the disable comes next */
            return 0;
        } else {
            return -E_BAD_CONTEXT;
        }
    } else {
        ev_init(&ev, EV_DISABLED);
        q_event_ip(q, &ev, 0);
    }
    q_publish(q, &ev);
    if (evq_pending(&q->evq, BIND_TIP))
        return 0;
    q->enabled = 0;
    q_consume(q);
    return 0;
}

/* evtrace.bind_fup_cfe: the FUP completes the first CFE waiting for it;
 * 1 if the FUP is used up */
static int bind_fup_cfe(struct query *q)
{
    struct evlist *pending = &q->evt.fup;
    struct event ev = *evl_at(pending, 0);
    evl_remove(pending, 0);
    if (ev.type == EV_NTYPES)               /* an unknown CFE with IP */
        return pending->n == 0;
    uint64_t ip;
    int have = q_query_ip(q, &ip);
    if (EV_HAS(&ev, BIND) && ev.bind == BIND_IP) {
        ev.at = have ? ip : 0;
        if (have) {
            ev.ip = ip;
            ev.ip_suppressed = 0;
        }
        q_publish(q, &ev);
        return 0;
    }
    if (!have)
        ev.ip_suppressed = 1;
    else
        ev.ip = ip;
    q_publish(q, &ev);
    return pending->n == 0;
}

int q_dec_fup(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    uint64_t ip;
    TRY(q_update_ip(q, p));
    if (evq_dequeue(&q->evq, BIND_FUP, &ev)) {
        int t = ev.type;
        if (t == EV_OVERFLOW) {
            q->consume_packet = 1;
            if (!q_query_ip(q, &ip))
                return -E_NOIP;
            ev.ip = ip;
            q->enabled = 1;
        } else if (t == EV_TSX) {
            if (!ev.aborted)
                q->consume_packet = 1;
            q_event_ip(q, &ev, 0);
        } else if (t == EV_EXSTOP || t == EV_MWAIT || t == EV_PTWRITE) {
            q->consume_packet = 1;
            q_event_ip(q, &ev, 0);
        } else if (t == EV_TRIG) {          /* evtrace.bind_fup */
            q->consume_packet = 1;
            q_event_ip(q, &ev, 0);
        } else {
            return -E_INTERNAL;
        }
        q_publish(q, &ev);
        if (evq_pending(&q->evq, BIND_FUP))
            return 0;
        if (!q->consume_packet)
            return 0;
        q->consume_packet = 0;
        q_consume(q);
        return 0;
    }
    if (q->evt.fup.n) {
        if (bind_fup_cfe(q))
            q_consume(q);
        return 0;
    }
    if (q->mode_exec_pending &&
        evq_find(&q->evq, BIND_TIP, EV_ASYNC_BRANCH) < 0) {
        /* MODE.EXEC + FUP: a mode / interrupt-flag change at the FUP's IP */
        if (evq_dequeue(&q->evq, BIND_TIP, &ev)) {
            q_event_ip(q, &ev, 0);
            q_publish(q, &ev);
            if (evq_pending(&q->evq, BIND_TIP))
                return 0;
        }
        q->mode_exec_pending = 0;
        q_consume(q);
        return 0;
    }
    if (!q_query_ip(q, &ip))
        return q->have_ip ? -E_IP_SUPPRESSED : -E_NOIP;
    ev_init(&ev, EV_ASYNC_BRANCH);
    ev.from = ip;
    TRY(q_enqueue(q, BIND_TIP, &ev));
    q_consume(q);
    return 0;
}

int q_dec_pip(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    int async = evq_find(&q->evq, BIND_TIP, EV_ASYNC_BRANCH) >= 0;
    ev_init(&ev, async ? EV_ASYNC_PAGING : EV_PAGING);
    EV_SET(&ev, CR3, ev.cr3 = p->f[0]);
    EV_SET(&ev, NON_ROOT, ev.non_root = p->f[1] != 0);
    if (async)
        TRY(q_enqueue(q, BIND_TIP, &ev));
    else
        q_publish(q, &ev);
    q_consume(q);
    return 0;
}

int q_dec_vmcs(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    int async = evq_find(&q->evq, BIND_TIP, EV_ASYNC_BRANCH) >= 0;
    ev_init(&ev, async ? EV_ASYNC_VMCS : EV_VMCS);
    EV_SET(&ev, BASE, ev.base = p->f[0]);
    if (async) {
        if (evq_enqueue_before(&q->evq, BIND_TIP, &ev, EV_ASYNC_PAGING) < 0) {
            q->fatal = E_NOMEM;
            return -E_NOMEM;
        }
    } else {
        q_publish(q, &ev);
    }
    q_consume(q);
    return 0;
}

int q_dec_mode(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    if (p->kind == PT_K_MODE_EXEC) {
        int mode = q_exec_mode(p);
        if (mode != q->cur_mode) {
            ev_init(&ev, EV_EXEC_MODE);
            EV_SET(&ev, MODE, ev.mode = (int8_t)mode);
            TRY(q_enqueue(q, BIND_TIP, &ev));
            q->cur_mode = (int8_t)mode;
        }
        int iflag = (p->f[2] & 1) != 0;
        if (q->cfg->iflags && iflag != q->cur_if) {
            ev_init(&ev, EV_IFLAGS);
            EV_SET(&ev, IFLAG, ev.iflag = (uint8_t)iflag);
            TRY(q_enqueue(q, BIND_TIP, &ev));
        }
        q->cur_if = (int8_t)iflag;
        q->mode_exec_pending = 1;
    } else {
        ev_init(&ev, EV_TSX);
        EV_SET(&ev, SPECULATIVE, ev.speculative = p->f[0] != 0);
        EV_SET(&ev, ABORTED, ev.aborted = p->f[1] != 0);
        if (q->enabled) {
            TRY(q_enqueue(q, BIND_FUP, &ev));
        } else {
            ev.ip_suppressed = 1;
            q_publish(q, &ev);
        }
    }
    q_consume(q);
    return 0;
}

/* -- power events and PTWRITE (hwtrace.flow.power) ------------------------- */

int q_dec_exstop(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    int ip = p->f[0] != 0;
    if (evq_take(&q->evq, BIND_EXSTOP, EV_MWAIT, &ev)) {
        if (ip) {
            TRY(q_enqueue(q, BIND_FUP, &ev));
        } else {
            ev.ip_suppressed = 1;
            q_publish(q, &ev);
        }
        return 0;
    }
    ev_init(&ev, EV_EXSTOP);
    if (ip) {
        TRY(q_enqueue(q, BIND_FUP, &ev));
    } else {
        ev.ip_suppressed = 1;
        q_publish(q, &ev);
    }
    q_consume(q);
    return 0;
}

int q_dec_mwait(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    ev_init(&ev, EV_MWAIT);
    EV_SET(&ev, HINTS, ev.hints = p->f[0]);
    EV_SET(&ev, EXT, ev.ext = p->f[1]);
    TRY(q_enqueue(q, BIND_EXSTOP, &ev));
    q_consume(q);
    return 0;
}

int q_dec_pwre(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    ev_init(&ev, EV_PWRE);
    EV_SET(&ev, STATE, ev.state = p->f[0]);
    EV_SET(&ev, SUB_STATE, ev.sub_state = p->f[1]);
    EV_SET(&ev, HW, ev.hw = p->f[2] != 0);
    TRY(q_enqueue(q, BIND_EXSTOP, &ev));
    q_consume(q);
    return 0;
}

int q_dec_pwrx(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    if (evq_dequeue(&q->evq, BIND_EXSTOP, &ev)) {
        if (ev.type != EV_PWRE)
            ev.ip_suppressed = 1;
        q_publish(q, &ev);
        return 0;
    }
    ev_init(&ev, EV_PWRX);
    EV_SET(&ev, LAST, ev.last = p->f[0]);
    EV_SET(&ev, DEEPEST, ev.deepest = p->f[1]);
    EV_SET(&ev, INTERRUPT, ev.interrupt = p->f[2] != 0);
    EV_SET(&ev, STORE, ev.store = p->f[3] != 0);
    EV_SET(&ev, AUTONOMOUS, ev.autonomous = p->f[4] != 0);
    q_publish(q, &ev);
    q_consume(q);
    return 0;
}

int q_dec_ptw(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    uint64_t size = p->f[0] == 0 ? 4 : p->f[0] == 1 ? 8 : 0;
    if (!size)
        return -E_BAD_PACKET;
    ev_init(&ev, EV_PTWRITE);
    EV_SET(&ev, SIZE, ev.size = size);
    EV_SET(&ev, PAYLOAD, ev.payload = p->f[1]);
    if (p->f[2]) {
        TRY(q_enqueue(q, BIND_FUP, &ev));
    } else {
        ev.ip_suppressed = 1;
        q_publish(q, &ev);
    }
    q_consume(q);
    return 0;
}

/* -- event trace (hwtrace.flow.evtrace) ---------------------------------------- */

/* CFE type -> event type, or -1 */
static int cfe_event(uint64_t ct)
{
    switch (ct) {
    case 1: return EV_INTERRUPT;
    case 2: return EV_IRET;
    case 3: return EV_SMI;
    case 4: return EV_RSM;
    case 5: return EV_SIPI;
    case 6: return EV_INIT;
    case 7: return EV_VMENTRY;
    case 8: case 9: return EV_VMEXIT;
    case 10: return EV_SHUTDOWN;
    case 12: return EV_UINTR;
    case 13: return EV_UIRET;
    case 14: return EV_SWINTR;
    case 15: return EV_SYSCALL;
    }
    return -1;
}

/* _EVD_OK: the EVD types (bits) a CFE type takes */
static unsigned evd_ok(uint64_t ct)
{
    return ct == 1 ? 1u : (ct == 8 || ct == 9) ? 6u : 0u;
}

/* _binding: BIND_IP, BIND_INSN or BIND_NONE */
static int cfe_binding(const struct query *q, const struct pt_pkt *p,
                       ptrdiff_t off)
{
    if (!q->enabled)
        return BIND_NONE;
    ptrdiff_t pos = off + p->size;
    struct pt_pkt n;
    for (;;) {
        if (q_peek(q, pos, &n))
            return BIND_NONE;
        switch (n.kind) {
        case PT_K_PAD: case PT_K_TSC: case PT_K_TMA: case PT_K_MTC:
        case PT_K_CYC: case PT_K_CBR: case PT_K_MNT: case PT_K_EVD:
        case PT_K_CFE: case PT_K_MODE_EXEC: case PT_K_MODE_TSX:
        case PT_K_PIP: case PT_K_VMCS: case PT_K_PTW: case PT_K_EXSTOP:
        case PT_K_MWAIT: case PT_K_PWRE: case PT_K_PWRX: case PT_K_TRIG:
            pos += n.size;
            continue;
        case PT_K_FUP:
            return BIND_IP;
        case PT_K_TIP: case PT_K_TIP_PGD:
            return BIND_INSN;
        default:
            return BIND_NONE;
        }
    }
}

int q_cfe_will_event(struct query *q, const struct pt_pkt *p, ptrdiff_t off)
{
    if (cfe_event(p->f[0]) < 0)
        return 0;
    if (q->evt.evd_have & ~evd_ok(p->f[0]))
        return 1;
    if (p->f[2])
        return 0;
    return cfe_binding(q, p, off) == BIND_NONE;
}

int q_dec_cfe(struct query *q, const struct pt_pkt *p, ptrdiff_t off)
{
    uint64_t ct = p->f[0];
    int type = cfe_event(ct);
    struct event ev;
    if (type < 0) {
        q->evt.evd_have = 0;
        if (p->f[2]) {
            ev_init(&ev, EV_NTYPES);        /* the twin's None */
            if (evl_push(&q->evt.fup, &ev) < 0) {
                q->fatal = E_NOMEM;
                return -E_NOMEM;
            }
        }
        q_consume(q);
        return 0;
    }
    if (q->evt.evd_have & ~evd_ok(ct))
        return -E_BAD_CONTEXT;
    unsigned have = q->evt.evd_have;
    q->evt.evd_have = 0;
    ev_init(&ev, type);
    if (ct == 1 || ct == 5 || ct == 9 || ct == 12 || ct == 14)
        EV_SET(&ev, VECTOR, ev.vector = p->f[1]);
    if (ct == 1) {
        EV_SET(&ev, HAS_CR2, ev.has_cr2 = (have & 1) != 0);
        EV_SET(&ev, CR2, ev.cr2 = (have & 1) ? q->evt.evd[0] : 0);
    } else if (ct == 8 || ct == 9) {
        EV_SET(&ev, HAS_VECTOR, ev.has_vector = ct == 9);
        if (ct != 9)
            EV_SET(&ev, VECTOR, ev.vector = 0);
        EV_SET(&ev, HAS_VMXR, ev.has_vmxr = (have & 4) != 0);
        EV_SET(&ev, VMXR, ev.vmxr = (have & 4) ? q->evt.evd[2] : 0);
        EV_SET(&ev, HAS_VMXQ, ev.has_vmxq = (have & 2) != 0);
        EV_SET(&ev, VMXQ, ev.vmxq = (have & 2) ? q->evt.evd[1] : 0);
    }
    if (p->f[2]) {
        if (evl_push(&q->evt.fup, &ev) < 0) {
            q->fatal = E_NOMEM;
            return -E_NOMEM;
        }
    } else {
        ev.ip_suppressed = 1;
        int bind = cfe_binding(q, p, off);
        if (bind == BIND_NONE) {
            q_publish(q, &ev);
        } else {
            EV_SET(&ev, BIND, ev.bind = (uint8_t)bind);
            if (bind == BIND_IP) {
                if (evl_push(&q->evt.fup, &ev) < 0) {
                    q->fatal = E_NOMEM;
                    return -E_NOMEM;
                }
            } else {
                TRY(q_enqueue(q, BIND_TIP, &ev));
            }
        }
    }
    q_consume(q);
    return 0;
}

int q_evd_fails(const struct query *q, const struct pt_pkt *p)
{
    uint64_t t = p->f[0];
    if (t > 2)
        return 0;
    if (t == 0)
        return (q->evt.evd_have & 6) != 0;
    return (q->evt.evd_have & 1) != 0;
}

int q_dec_evd(struct query *q, const struct pt_pkt *p)
{
    if (q_evd_fails(q, p))
        return -E_BAD_CONTEXT;
    if (p->f[0] <= 2) {
        q->evt.evd_have |= (uint8_t)(1u << p->f[0]);
        q->evt.evd[p->f[0]] = p->f[1];
    }
    q_consume(q);
    return 0;
}

int q_dec_trig(struct query *q, const struct pt_pkt *p)
{
    struct event ev;
    ev_init(&ev, EV_TRIG);
    EV_SET(&ev, TRBV, ev.trbv = p->f[0]);
    EV_SET(&ev, ICNT, ev.icnt = p->f[1]);
    EV_SET(&ev, MULT, ev.mult = p->f[4] != 0);
    EV_SET(&ev, ICNTV, ev.icntv = p->f[3] != 0);
    if (p->f[2]) {
        TRY(q_enqueue(q, BIND_FUP, &ev));
    } else {
        ev.ip_suppressed = 1;
        q_publish(q, &ev);
    }
    q_consume(q);
    return 0;
}

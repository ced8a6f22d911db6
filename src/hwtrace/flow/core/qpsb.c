/* PSB+ headers (hwtrace.flow.psb) and OVF with its errata SKD010, APL11,
 * APL12 (hwtrace.flow.overflow) for the query decoder. */
#include "query.h"

/* the status and timing packets (and PSBEND) BDM70's scan passes over */
static int bdm70_skips(int kind)
{
    switch (kind) {
    case PT_K_PAD: case PT_K_TSC: case PT_K_CBR: case PT_K_PSBEND:
    case PT_K_PIP: case PT_K_MODE_EXEC: case PT_K_MODE_TSX:
    case PT_K_VMCS: case PT_K_TMA: case PT_K_MTC: case PT_K_CYC:
    case PT_K_MNT:
        return 1;
    }
    return 0;
}

/* psb.next_kind: the kind of the first packet from pos on that is not
 * one of the status and timing packets a PSB+ may hold (PSBEND skipped
 * too); -1 (None) at the end or at a packet that does not decode */
static int next_kind(const struct query *q, ptrdiff_t pos)
{
    struct pt_pkt p;
    for (;;) {
        if (q_peek(q, pos, &p))
            return -1;
        if (!bdm70_skips(p.kind))
            return p.kind;
        pos += p.size;
    }
}

/* psb.bdm70: a PSB+ FUP although tracing is only enabled by a TIP.PGE
 * right after it */
static int bdm70(const struct query *q, ptrdiff_t pos)
{
    return next_kind(q, pos) == PT_K_TIP_PGE;
}

/* psb.header_error: libipt 2.0 picks a PSB+ packet's decoder by its
 * opcode alone; one that may not be in a PSB+ (no header decoder) is
 * "unexpected packet context" however malformed or cut, any other fails
 * as it decodes, a cut opcode is the end */
static int header_error(const struct query *q, ptrdiff_t pos, int err)
{
    if (pos >= q->end)
        return err;
    unsigned b = q->buf[pos];
    if (b == 0x02) {
        if (pos + 1 >= q->end)
            return E_EOS;
        switch (q->buf[pos + 1]) {
        case 0x82: case 0xa3: case 0x83: case 0x62: case 0xe2: case 0xc2:
        case 0x22: case 0xa2:
            return E_BAD_CONTEXT;   /* PSB TNT-64 STOP EXSTOP MWAIT PWRE PWRX */
        }
        return (q->buf[pos + 1] & 0x1f) == 0x12 ? E_BAD_CONTEXT : err;
    }
    if (b == 0x00 || b == 0x99 || b == 0x19 || b == 0x59 || (b & 3) == 3)
        return err;                 /* PAD MODE TSC MTC CYC */
    if (!(b & 1) || (b & 0x1f) == 0x0d || (b & 0x1f) == 0x11 ||
        (b & 0x1f) == 0x01)
        return E_BAD_CONTEXT;       /* TNT-8 TIP TIP.PGE TIP.PGD */
    return err;                     /* FUP, an unknown opcode */
}

/* psb.bdm70_scan_error: libipt 2.0's own scan for BDM70's TIP.PGE fails
 * the PSB+ on a packet that does not decode before it decides (the end
 * is no error); 0 or that error */
static int bdm70_scan_error(const struct query *q, ptrdiff_t pos)
{
    struct pt_pkt p;
    for (;;) {
        int e = q_peek(q, pos, &p);
        if (e)
            return e == E_EOS ? 0 : e;
        if (!bdm70_skips(p.kind))
            return 0;
        pos += p.size;
    }
}

/* psb.read_psb_header */
static int read_psb_header(struct query *q)
{
    struct evq *evq = &q->evq;
    if (evq_pending(evq, BIND_PSBEND) || evq_pending(evq, BIND_TIP) ||
        evq_pending(evq, BIND_FUP))
        return -E_BAD_CONTEXT;
    q->ip = 0;
    q->have_ip = q->ip_suppressed = 0;
    int was_enabled = q->enabled;
    q->enabled = 0;
    struct event ev;
    ev_init(&ev, EV_DISABLED);
    ev.status_update = 1;
    TRY(q_enqueue(q, BIND_PSBEND, &ev));
    int first = 1;                  /* the status is queue entry 0 */
    for (;;) {
        if (q->nxt_err)
            return -header_error(q, q->pos, q->nxt_err);
        const struct pt_pkt *p = &q->nxt;
        int k = p->kind;
        if (k == PT_K_PSBEND)
            break;
        if (k == PT_K_OVF) {
            if (!q->enabled) {
                evq_dequeue(evq, BIND_PSBEND, &ev);
                first = 0;
            }
            break;
        }
        switch (k) {
        case PT_K_PAD:
        case PT_K_INVALID:          /* SKZ84's TMA, which libipt skips */
            break;
        case PT_K_FUP: {
            if (q->cfg->bdm70 && !was_enabled && !q->enabled) {
                int e = bdm70_scan_error(q, q->nxt_off + p->size);
                if (e)
                    return -e;
            }
            int enabled = p->f[0] != 0;
            if (enabled && psb_fup_announces_pge(q->cfg) &&
                bdm70(q, q->nxt_off + p->size))
                enabled = 0;
            q->enabled = (uint8_t)enabled;
            if (enabled)
                TRY(q_update_ip(q, p));
            break;
        }
        case PT_K_MODE_EXEC: {
            int mode = q_exec_mode(p);
            if (was_enabled && q->enabled && q->cur_mode != MODE_NONE &&
                mode != q->cur_mode)
                return -E_BAD_STATUS_UPDATE;
            q->cur_mode = (int8_t)mode;
            q->cur_if = (p->f[2] & 1) != 0;
            ev_init(&ev, EV_EXEC_MODE);
            EV_SET(&ev, MODE, ev.mode = (int8_t)mode);
            ev.status_update = 1;
            TRY(q_enqueue(q, BIND_PSBEND, &ev));
            if (q->cfg->iflags) {
                ev_init(&ev, EV_IFLAGS);
                EV_SET(&ev, IFLAG, ev.iflag = (p->f[2] & 1) != 0);
                ev.status_update = 1;
                TRY(q_enqueue(q, BIND_PSBEND, &ev));
            }
            break;
        }
        case PT_K_MODE_TSX:
            ev_init(&ev, EV_TSX);
            EV_SET(&ev, SPECULATIVE, ev.speculative = p->f[0] != 0);
            EV_SET(&ev, ABORTED, ev.aborted = p->f[1] != 0);
            ev.status_update = 1;
            TRY(q_enqueue(q, BIND_PSBEND, &ev));
            break;
        case PT_K_PIP:
            ev_init(&ev, EV_ASYNC_PAGING);
            EV_SET(&ev, CR3, ev.cr3 = p->f[0]);
            EV_SET(&ev, NON_ROOT, ev.non_root = p->f[1] != 0);
            ev.status_update = 1;
            TRY(q_enqueue(q, BIND_PSBEND, &ev));
            break;
        case PT_K_VMCS:
            ev_init(&ev, EV_ASYNC_VMCS);
            EV_SET(&ev, BASE, ev.base = p->f[0]);
            ev.status_update = 1;
            TRY(q_enqueue(q, BIND_PSBEND, &ev));
            break;
        case PT_K_MNT:
            ev_init(&ev, EV_MNT);
            EV_SET(&ev, PAYLOAD, ev.payload = p->f[0]);
            TRY(q_enqueue(q, BIND_PSBEND, &ev));
            break;
        case PT_K_CBR:
            TRY(ft_update(&q->time, q->cfg, p, 1));
            ev_init(&ev, EV_CBR);
            EV_SET(&ev, RATIO, ev.ratio = p->f[0]);
            ev.status_update = 1;
            TRY(q_enqueue(q, BIND_PSBEND, &ev));
            break;
        case PT_K_TSC: case PT_K_TMA: case PT_K_MTC: case PT_K_CYC:
            TRY(ft_update(&q->time, q->cfg, p, 1));
            break;
        case PT_K_CFE: case PT_K_EVD: case PT_K_TRIG:
            break;
        default:
            return -E_BAD_CONTEXT;
        }
        q->pos += p->size;
        q_fetch(q);
    }
    if (first) {
        struct event *f = evl_at(&evq->q[BIND_PSBEND], 0);
        if (!q->cfg->strict)
            EV_SET(f, FOLLOWS, f->follows = (int8_t)next_kind(q, q->pos));
        if (q->enabled) {
            f->type = EV_ENABLED;
            EV_SET(f, RESUMED, f->resumed = 0);
        } else {
            f->ip_suppressed = 1;
        }
    }
    return 0;
}

/* QueryDecoder._decode_psb */
int q_decode_psb(struct query *q)
{
    ptrdiff_t start = q->pos;
    if (q->release && start >= q->release_at &&
        q->release(q->release_ctx, start, &q->release_at) < 0) {
        q->fatal = E_PYERR;
        return -E_PYERR;
    }
    q->last_psb = start;
    /* arm SKL168's check of the next MTC's calibration (libipt 2.0's
     * query decoder does this at every PSB) */
    ft_psb(&q->time, q->cfg);
    q_consume(q);
    int r = read_psb_header(q);
    if (r < 0) {
        if (r != -E_BAD_STATUS_UPDATE) {
            q->pos = start;
            q_fetch(q);
        }
        evq_clear(&q->evq, BIND_PSBEND);
    }
    return r;
}

/* -- OVF ----------------------------------------------------------------------- */

#define NOT_HANDLED 1

static int is_timing(int k)
{
    return k == PT_K_TSC || k == PT_K_TMA || k == PT_K_MTC || k == PT_K_CYC ||
           k == PT_K_CBR;
}

/* find_ovf_fup: 1 with the FUP in *fup (at *off), 0 (None: the overflow
 * resolved with tracing disabled) or -E_* (an error string) */
static int find_ovf_fup(const struct query *q, struct pt_pkt *fup,
                        ptrdiff_t *off)
{
    ptrdiff_t pos = q->pos;
    struct pt_pkt p;
    for (;;) {
        int e = q_peek(q, pos, &p);
        if (e)
            return -e;
        int k = p.kind;
        if (k == PT_K_FUP) {
            *fup = p;
            *off = pos;
            return 1;
        }
        if (k == PT_K_PAD || k == PT_K_MNT || k == PT_K_INVALID ||
            is_timing(k)) {
            pos += p.size;
            continue;
        }
        if (k == PT_K_PSBEND || k == PT_K_TIP || k == PT_K_TIP_PGD ||
            k == PT_K_TNT8 || k == PT_K_TNT64)
            return -E_BAD_CONTEXT;
        return 0;
    }
}

/* header_has_fup: same results as find_ovf_fup, for a PSB+ at pos */
static int header_has_fup(const struct query *q, ptrdiff_t pos,
                          struct pt_pkt *fup, ptrdiff_t *off)
{
    struct pt_pkt p;
    for (;;) {
        int e = q_peek(q, pos, &p);
        if (e)
            return -e;
        int k = p.kind;
        if (k == PT_K_FUP) {
            *fup = p;
            *off = pos;
            return 1;
        }
        if (k == PT_K_PSBEND || k == PT_K_OVF)
            return 0;
        if (k == PT_K_MODE_EXEC || k == PT_K_MODE_TSX || k == PT_K_PIP ||
            k == PT_K_VMCS || k == PT_K_MNT || k == PT_K_PAD ||
            is_timing(k)) {
            pos += p.size;
            continue;
        }
        return -E_BAD_CONTEXT;
    }
}

static int recover_at_ip(struct query *q, const struct pt_pkt *ippkt,
                         ptrdiff_t resume)
{
    TRY(q_update_ip(q, ippkt));
    struct event ev;
    ev_init(&ev, EV_OVERFLOW);
    q_stamp(q, &ev);
    q_event_ip(q, &ev, 0);
    q->enabled = 1;
    q_publish(q, &ev);
    q->pos = resume;
    q_fetch(q);
    return 0;
}

static void recover_disabled(struct query *q, ptrdiff_t resume)
{
    struct event ev;
    ev_init(&ev, EV_OVERFLOW);
    q_stamp(q, &ev);
    ev.ip_suppressed = 1;
    q_publish(q, &ev);
    q->pos = resume;
    q_fetch(q);
}

/* SKD010: the FUP after an OVF may be missing */
static int skd010(struct query *q)
{
    ptrdiff_t pos = q->pos;
    struct pt_pkt p, tsx, fup;
    int have_tsx = 0;
    for (;;) {
        if (q_peek(q, pos, &p))
            return NOT_HANDLED;
        switch (p.kind) {
        case PT_K_TIP_PGE:
            return NOT_HANDLED;
        case PT_K_TIP_PGD:
            recover_disabled(q, pos + p.size);
            return 0;
        case PT_K_TNT8: case PT_K_TNT64:
            return NOT_HANDLED;
        case PT_K_PIP: case PT_K_VMCS: case PT_K_MODE_EXEC:
            break;
        case PT_K_MODE_TSX:
            if (have_tsx)
                return NOT_HANDLED;
            tsx = p;
            have_tsx = 1;
            break;
        case PT_K_FUP:
            if (have_tsx) {
                struct event ev;
                ev_init(&ev, EV_TSX);
                EV_SET(&ev, SPECULATIVE, ev.speculative = tsx.f[0] != 0);
                EV_SET(&ev, ABORTED, ev.aborted = tsx.f[1] != 0);
                TRY(q_enqueue(q, BIND_FUP, &ev));
            }
            TRY(recover_at_ip(q, &p, pos));
            return 0;
        case PT_K_TIP:
            TRY(recover_at_ip(q, &p, pos + p.size));
            return 0;
        case PT_K_PSB: {
            ptrdiff_t off;
            int r = header_has_fup(q, pos + p.size, &fup, &off);
            if (r != 1)
                return NOT_HANDLED;
            TRY(recover_at_ip(q, &fup, pos));
            return 0;
        }
        case PT_K_PSBEND:
            return -E_BAD_CONTEXT;
        case PT_K_OVF: case PT_K_STOP:
            return NOT_HANDLED;
        case PT_K_PAD: case PT_K_MNT: case PT_K_PWRE: case PT_K_PWRX:
        case PT_K_TSC: case PT_K_TMA: case PT_K_MTC: case PT_K_CYC:
        case PT_K_CBR:
            break;
        case PT_K_EXSTOP:
            if (!p.f[0])
                break;
            return NOT_HANDLED;
        case PT_K_PTW:
            if (!p.f[2])
                break;
            return NOT_HANDLED;
        default:
            return NOT_HANDLED;
        }
        pos += p.size;
    }
}

/* APL11: an OVF may be followed by a spurious TIP.PGD */
static int apl11(struct query *q)
{
    ptrdiff_t pos = q->pos;
    struct pt_pkt p;
    for (;;) {
        if (q_peek(q, pos, &p))
            return NOT_HANDLED;
        int k = p.kind;
        if (k == PT_K_TIP_PGD) {
            recover_disabled(q, pos + p.size);
            return 0;
        }
        if (k == PT_K_PAD || k == PT_K_MNT || is_timing(k)) {
            pos += p.size;
            continue;
        }
        return NOT_HANDLED;
    }
}

/* APL12: a FUP may follow an OVF although tracing was disabled
 * (overflow._apl12): 0 handled, NOT_HANDLED, or a packet's decode error */
static int apl12(struct query *q, const struct pt_pkt *fup, ptrdiff_t fup_off)
{
    ptrdiff_t after = fup_off + fup->size, pos = after;
    struct pt_pkt p, f2;
    for (;;) {
        int e = q_peek(q, pos, &p);
        if (e)                  /* a packet that does not decode fails */
            return e == E_EOS ? NOT_HANDLED : -e;
        switch (p.kind) {
        case PT_K_TNT8: case PT_K_TNT64: case PT_K_TIP: case PT_K_TIP_PGD:
        case PT_K_PSBEND: case PT_K_OVF:
            return NOT_HANDLED;
        case PT_K_PSB: {
            ptrdiff_t off;
            int h = header_has_fup(q, pos + p.size, &f2, &off);
            if (h == -E_BAD_OPC || h == -E_BAD_PACKET)
                return h;
            if (h != 0)
                return NOT_HANDLED;
            recover_disabled(q, after);
            return 0;
        }
        case PT_K_STOP: case PT_K_TIP_PGE:
            recover_disabled(q, after);
            return 0;
        case PT_K_PAD: case PT_K_FUP: case PT_K_EXSTOP: case PT_K_MWAIT:
        case PT_K_PWRE: case PT_K_PWRX: case PT_K_PTW: case PT_K_MNT:
        case PT_K_PIP: case PT_K_VMCS: case PT_K_MODE_EXEC:
        case PT_K_MODE_TSX: case PT_K_TSC: case PT_K_TMA: case PT_K_MTC:
        case PT_K_CYC: case PT_K_CBR:
            break;
        default:
            return NOT_HANDLED;
        }
        pos += p.size;
    }
}

/* overflow.decode_ovf */
int q_dec_ovf(struct query *q, const struct pt_pkt *pkt)
{
    struct event ev;
    if (evq_dequeue(&q->evq, BIND_PSBEND, &ev)) {
        q_finish_psbend_event(q, &ev);
        q_publish(q, &ev);
        return 0;
    }
    if (evq_dequeue(&q->evq, BIND_EXSTOP, &ev) ||
        evq_dequeue(&q->evq, BIND_FUP, &ev)) {
        if (ev.type != EV_PWRE)
            ev.ip_suppressed = 1;
        q_publish(q, &ev);
        return 0;
    }
    q_overflow_reset(q);
    /* past the OVF; SKD007's (a CYC's first byte, then the OVF) is a byte
     * longer than its size: libipt skips that byte as it decodes the CYC */
    q->pos += pkt->size + (q->buf[q->pos] != 0x02);
    q_fetch(q);
    const struct core_config *c = q->cfg;
    struct pt_pkt fup;
    ptrdiff_t fup_off = 0;
    memset(&fup, 0, sizeof fup);
    int r = find_ovf_fup(q, &fup, &fup_off);
    if (r != 1) {
        if (c->skd010) {
            int h = skd010(q);
            if (h < 0)
                return h;
            if (h != NOT_HANDLED)
                return 0;
        }
        if (c->apl11 && r == -E_BAD_CONTEXT && apl11(q) != NOT_HANDLED)
            return 0;
        if (r < 0 && r != -E_EOS)
            return r;
        ev_init(&ev, EV_OVERFLOW);
        q_stamp(q, &ev);
        ev.ip_suppressed = 1;
        q_publish(q, &ev);
        return 0;
    }
    if (c->apl12) {
        int h = apl12(q, &fup, fup_off);
        if (h < 0)
            return h;
        if (h != NOT_HANDLED)
            return 0;
    }
    ev_init(&ev, EV_OVERFLOW);
    q_stamp(q, &ev);                /* the time of the OVF, not of its FUP */
    return q_enqueue(q, BIND_FUP, &ev);
}

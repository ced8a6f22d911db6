/* Segment jobs: checkpoints and the state key (see segment.h).
 *
 * The key serializes every field of the session (query, instruction
 * decoder, session loop) that a later decision can read.  Left out:
 *
 *   inputs and caches    buf, end, cfg, the image caches (ic), release*,
 *                        disable_at_trace_branch (the decoder kind), the
 *                        packet at pos (nxt*: a function of pos), fetches
 *                        (a counter), the sink and hooks
 *   the return stack     kept apart (struct checkpoint.stack)
 *   transient values     the query's published event, event_at and err_off,
 *                        the instruction decoder's delivered_start (read by
 *                        the after_event hook of the same call),
 *                        the decoders' err (each read right after it is
 *                        set, within one call), open/stage (no record is
 *                        open where checkpoints are taken), fatal
 *   never read           sync (only compared with pos: pos == sync is in
 *                        the key), cr3 / vmcs (written at paging events,
 *                        never read), the time's cbr / have_cbr (nothing
 *                        in the flow asks for the core:bus ratio), the
 *                        calibration's lost_mtc and min/max_fcr (only their
 *                        order: have_fcr is in the key), mark_n
 *   dead while a guard   tnt_bits beyond the TNT index, tnt_end without TNT
 *   says so              bits, evd[i] without its bit, deferred_off without
 *                        deferred, the calibration's ctc/cyc_mtc before its
 *                        first MTC and fcr without have_fcr, the mark
 *                        without have_mark, the event being processed (ev,
 *                        ev_spent, ev_at*) when none is, p_insn when no
 *                        instruction is postponed, the injected event /
 *                        error unless that is what is injected
 *   last_ip unless the   the session's last IP is the IP of an error from
 *   block decoder        the events before the next record; each record
 *   resyncs              sets it, a synchronization clears it, and only the
 *                        block decoder's resync keeps it (its next error
 *                        could be such an event's)
 *   session bookkeeping  last_sync (compared only with later sync-error
 *                        positions, which lie past every PSB where
 *                        checkpoints are taken), ninsn, want_*, block, resync,
 *                        sync_at, plain_offsets (the same for every job)
 */
#include <stdio.h>
#include <stdlib.h>

#include "segment.h"

enum { L_ALWAYS, L_TNT, L_EVD0, L_EVD1, L_EVD2, L_DEFERRED, L_TC_MTC, L_FCR,
       L_MARK, L_PEV, L_PINSN, L_INJ_EV, L_INJ_ERR, L_LAST_IP };

struct sfield {
    const char *name;
    size_t off, size;
    int live;
};

#define SF(f, live) {#f, offsetof(struct session, f), \
                     sizeof(((struct session *)0)->f), live}

static const struct sfield STATE[] = {
    SF(state, L_ALWAYS), SF(status, L_ALWAYS), SF(last_ip, L_LAST_IP),
    SF(d.q.pos, L_ALWAYS), SF(d.q.ip, L_ALWAYS), SF(d.q.have_ip, L_ALWAYS),
    SF(d.q.ip_suppressed, L_ALWAYS), SF(d.q.tnt_index, L_ALWAYS),
    SF(d.q.tnt_bits, L_TNT), SF(d.q.tnt_end, L_TNT),
    SF(d.q.consume_packet, L_ALWAYS), SF(d.q.enabled, L_ALWAYS),
    SF(d.q.mode_exec_pending, L_ALWAYS), SF(d.q.cur_mode, L_ALWAYS),
    SF(d.q.cur_if, L_ALWAYS), SF(d.q.evt.evd_have, L_ALWAYS),
    SF(d.q.evt.evd[0], L_EVD0), SF(d.q.evt.evd[1], L_EVD1),
    SF(d.q.evt.evd[2], L_EVD2), SF(d.q.last_psb, L_ALWAYS),
    SF(d.q.deferred, L_ALWAYS), SF(d.q.deferred_off, L_DEFERRED),
    SF(d.q.time.time.tsc, L_ALWAYS), SF(d.q.time.time.base, L_ALWAYS),
    SF(d.q.time.time.fc, L_ALWAYS), SF(d.q.time.time.ctc, L_ALWAYS),
    SF(d.q.time.time.ctc_cyc, L_ALWAYS),
    SF(d.q.time.time.lost_mtc, L_ALWAYS),
    SF(d.q.time.time.lost_cyc, L_ALWAYS),
    SF(d.q.time.time.have_tsc, L_ALWAYS),
    SF(d.q.time.time.have_tma, L_ALWAYS),
    SF(d.q.time.time.have_mtc, L_ALWAYS),
    SF(d.q.time.tcal.fcr, L_FCR), SF(d.q.time.tcal.tsc, L_ALWAYS),
    SF(d.q.time.tcal.cyc_tsc, L_ALWAYS), SF(d.q.time.tcal.cyc_mtc, L_TC_MTC),
    SF(d.q.time.tcal.ctc, L_TC_MTC), SF(d.q.time.tcal.have_mtc, L_ALWAYS),
    SF(d.q.time.tcal.check_skl168, L_ALWAYS),
    SF(d.q.time.m_tsc, L_ALWAYS), SF(d.q.time.m_lost_mtc, L_ALWAYS),
    SF(d.q.time.m_lost_cyc, L_ALWAYS), SF(d.q.time.m_have, L_ALWAYS),
    SF(d.mode, L_ALWAYS), SF(d.ip, L_ALWAYS), SF(d.status, L_ALWAYS),
    SF(d.enabled, L_ALWAYS), SF(d.process_event, L_ALWAYS),
    SF(d.speculative, L_ALWAYS), SF(d.process_insn, L_ALWAYS),
    SF(d.bound_paging, L_ALWAYS), SF(d.bound_vmcs, L_ALWAYS),
    SF(d.bound_ptwrite, L_ALWAYS), SF(d.last_tsc, L_ALWAYS),
    SF(d.resyncing, L_ALWAYS), SF(d.injected, L_ALWAYS),
    SF(d.icount, L_ALWAYS), SF(d.have_mark, L_ALWAYS),
    SF(d.mark_mode, L_MARK), SF(d.mark_ip, L_MARK), SF(d.mark_lim, L_MARK),
    SF(d.ev_spent, L_PEV), SF(d.ev_at_set, L_PEV), SF(d.ev_at_stay, L_PEV),
    SF(d.ev_at_start, L_PEV), SF(d.ev_at_end, L_PEV),
    SF(d.inj_err.code, L_INJ_ERR), SF(d.inj_err.offset, L_INJ_ERR),
    SF(d.inj_err.ip, L_INJ_ERR), SF(d.inj_err.spec, L_INJ_ERR),
};
#define NSTATE (sizeof STATE / sizeof STATE[0])

/* every field of an event */
#define EF(f) {#f, offsetof(struct event, f), \
               sizeof(((struct event *)0)->f), 0}
static const struct sfield EVFIELD[] = {
    EF(type), EF(ip_suppressed), EF(status_update), EF(has_tsc), EF(stamped),
    EF(mode), EF(non_root), EF(speculative), EF(aborted), EF(hw),
    EF(interrupt), EF(store), EF(autonomous), EF(resumed), EF(iflag),
    EF(has_cr2), EF(has_vector), EF(has_vmxr), EF(has_vmxq), EF(icntv),
    EF(mult), EF(bind), EF(follows), EF(set), EF(tsc), EF(lost_mtc), EF(lost_cyc), EF(ip),
    EF(at), EF(from), EF(to), EF(cr3), EF(base), EF(hints), EF(ext),
    EF(state), EF(sub_state), EF(last), EF(deepest), EF(size), EF(payload),
    EF(ratio), EF(vector), EF(cr2), EF(vmxr), EF(vmxq), EF(trbv), EF(icnt),
};
#define NEVFIELD (sizeof EVFIELD / sizeof EVFIELD[0])

static uint64_t field_value(const void *base, const struct sfield *f)
{
    const uint8_t *p = (const uint8_t *)base + f->off;
    switch (f->size) {
    case 1: return *p;
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

static int have_fcr(const struct session *s)
{
    return s->d.q.time.tcal.min_fcr <= s->d.q.time.tcal.max_fcr;
}

static int is_live(const struct session *s, int live)
{
    const struct query *q = &s->d.q;
    switch (live) {
    case L_TNT: return q->tnt_index != 0;
    case L_EVD0: return q->evt.evd_have & 1;
    case L_EVD1: return (q->evt.evd_have >> 1) & 1;
    case L_EVD2: return (q->evt.evd_have >> 2) & 1;
    case L_DEFERRED: return q->deferred != 0;
    case L_TC_MTC: return q->time.tcal.have_mtc;
    case L_FCR: return have_fcr(s);
    case L_MARK: return s->d.have_mark;
    case L_PEV: return s->d.process_event;
    case L_PINSN: return s->d.process_insn;
    case L_INJ_EV: return s->d.injected == 1;
    case L_INJ_ERR: return s->d.injected == 2;
    case L_LAST_IP: return s->block && s->resync;
    default: return 1;
    }
}

struct w {
    uint64_t *p;
    size_t n, cap;
};

static int put(struct w *w, uint64_t v)
{
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        uint64_t *np = realloc(w->p, cap * sizeof *np);
        if (!np)
            return -1;
        w->p = np;
        w->cap = cap;
    }
    w->p[w->n++] = v;
    return 0;
}

static int put_event(struct w *w, const struct event *ev)
{
    for (size_t j = 0; j < NEVFIELD; j++)
        if (put(w, field_value(ev, &EVFIELD[j])) < 0)
            return -1;
    return 0;
}

static int put_list(struct w *w, const struct evlist *l)
{
    if (put(w, l->n) < 0)
        return -1;
    for (uint32_t i = 0; i < l->n; i++)
        if (put_event(w, &l->ev[l->head + i]) < 0)
            return -1;
    return 0;
}

uint8_t *state_key(const struct session *s, size_t *len)
{
    const struct query *q = &s->d.q;
    struct w w = {NULL, 0, 0};
    int e = put(&w, 1);                         /* layout version */
    for (size_t i = 0; !e && i < NSTATE; i++) {
        const struct sfield *f = &STATE[i];
        uint64_t v = 0;
        if (is_live(s, f->live))
            v = field_value(s, f);
        if (f->off == offsetof(struct session, d.q.tnt_bits))
            v &= q->tnt_index ? (q->tnt_index << 1) - 1 : 0;
        e = put(&w, v);
    }
    if (!e)
        e = put(&w, q->pos == q->sync) || put(&w, have_fcr(s));
    const struct insn_info *pi = s->d.process_insn ? s->d.p_insn : NULL;
    if (!e)
        e = put(&w, pi ? pi->ip : 0) || put(&w, pi ? (uint64_t)pi->mode : 0);
    for (int b = 0; !e && b < NBIND; b++)
        e = put_list(&w, &q->evq.q[b]);
    if (!e)
        e = put_list(&w, &q->evt.fup);
    if (!e)
        e = s->d.process_event ? put_event(&w, &s->d.ev) : put(&w, 0);
    if (!e)
        e = s->d.injected == 1 ? put_event(&w, &s->d.inj_ev) : put(&w, 0);
    if (!e)
        e = put(&w, s->d.injected == 2 && s->d.inj_err.insn ?
                    s->d.inj_err.insn->ip : 0);
    if (e) {
        free(w.p);
        return NULL;
    }
    *len = w.n * sizeof *w.p;
    return (uint8_t *)w.p;
}

/* -- the probe ------------------------------------------------------------- */

static int probe_one(const struct session *orig, struct session *tp,
                     uint8_t *field, const char *name,
                     int (*out)(void *, const char *, int), void *ctx)
{
    (void)orig;
    size_t n0, n1;
    uint8_t *k0 = state_key(tp, &n0);
    field[0] ^= 1;
    uint8_t *k1 = state_key(tp, &n1);
    field[0] ^= 1;
    if (!k0 || !k1) {
        free(k0);
        free(k1);
        return -1;
    }
    int changed = n0 != n1 || memcmp(k0, k1, n0);
    free(k0);
    free(k1);
    return out(ctx, name, changed);
}

static void make_live(struct session *tp, int live)
{
    struct query *q = &tp->d.q;
    switch (live) {
    case L_TNT: q->tnt_index = 1 << 7; break;
    case L_EVD0: q->evt.evd_have |= 1; break;
    case L_EVD1: q->evt.evd_have |= 2; break;
    case L_EVD2: q->evt.evd_have |= 4; break;
    case L_DEFERRED: q->deferred = E_BAD_STATUS_UPDATE; break;
    case L_TC_MTC: q->time.tcal.have_mtc = 1; break;
    case L_FCR: q->time.tcal.min_fcr = 0; q->time.tcal.max_fcr = 1; break;
    case L_MARK: tp->d.have_mark = 1; break;
    case L_PEV: tp->d.process_event = 1; break;
    case L_INJ_ERR: tp->d.injected = 2; tp->d.inj_err.insn = NULL; break;
    case L_LAST_IP: tp->block = tp->resync = 1; break;
    }
}

int state_probe(const struct session *s,
                int (*out)(void *, const char *, int), void *ctx)
{
    struct session *tp = malloc(sizeof *tp);
    if (!tp)
        return -1;
    int r = 0;
    char name[96];
    for (size_t i = 0; !r && i < NSTATE; i++) {
        *tp = *s;
        make_live(tp, STATE[i].live);
        r = probe_one(s, tp, (uint8_t *)tp + STATE[i].off, STATE[i].name,
                      out, ctx);
    }
    /* each field of the event being processed and of the injected one */
    for (size_t j = 0; !r && j < NEVFIELD; j++) {
        *tp = *s;
        tp->d.process_event = 1;
        snprintf(name, sizeof name, "ev.%s", EVFIELD[j].name);
        r = probe_one(s, tp, (uint8_t *)&tp->d.ev + EVFIELD[j].off, name,
                      out, ctx);
        if (r)
            break;
        *tp = *s;
        tp->d.injected = 1;
        snprintf(name, sizeof name, "inj_ev.%s", EVFIELD[j].name);
        r = probe_one(s, tp, (uint8_t *)&tp->d.inj_ev + EVFIELD[j].off, name,
                      out, ctx);
    }
    /* an event in a queue (a copy with one of its own) */
    for (int b = 0; !r && b < NBIND + 1; b++) {
        struct event ev;
        ev_init(&ev, EV_EXEC_MODE);
        for (size_t j = 0; !r && j < NEVFIELD; j++) {
            *tp = *s;
            struct evlist *l = b < NBIND ? &tp->d.q.evq.q[b]
                                         : &tp->d.q.evt.fup;
            struct evlist one = {&ev, 0, 1, 1};
            *l = one;
            if (b < NBIND)
                snprintf(name, sizeof name, "evq%d[0].%s", b,
                         EVFIELD[j].name);
            else
                snprintf(name, sizeof name, "evt.fup[0].%s",
                         EVFIELD[j].name);
            r = probe_one(s, tp, (uint8_t *)&ev + EVFIELD[j].off, name, out,
                          ctx);
        }
    }
    free(tp);
    return r;
}

/* -- checkpoints -------------------------------------------------------------- */

static int seg_at_event(void *ctx, struct session *s, const struct event *ev);
static int seg_at_error(void *ctx, struct session *s, int code);
static int seg_before_record(void *ctx, struct session *s);

void seg_init(struct segment *g, ptrdiff_t stop_at, int head, int tail)
{
    memset(g, 0, sizeof *g);
    g->stop_at = stop_at;
    g->head = head;
    g->tail = tail;
    g->armed = g->last_armed = -1;
    g->obs.ctx = g;
    g->obs.at_event = seg_at_event;
    g->obs.at_error = seg_at_error;
    g->obs.before_record = seg_before_record;
}

void seg_free(struct segment *g)
{
    for (int i = 0; i < g->ncps; i++)
        free(g->cps[i].key);
    free(g->cps);
    free(g->underflows);
    g->cps = NULL;
    g->underflows = NULL;
    g->ncps = g->nunder = 0;
}

static int seg_at_event(void *ctx, struct session *s, const struct event *ev)
{
    struct segment *g = ctx;
    if (!ev->status_update)
        return 0;
    ptrdiff_t psb = s->d.q.last_psb;
    if (psb < 0)
        return 0;
    if (psb != g->last_armed) {
        g->last_armed = psb;
        g->psbs_armed++;
        /* tail PSBs done (each may have given two checkpoints: a PSB+
         * whose FUP is inside a block publishes its status in two
         * groups): stop at the next one's first status update */
        if (g->stop_at >= 0 && psb >= g->stop_at && ++g->past > g->tail) {
            g->stopped = 1;
            return -E_STOP;
        }
    }
    if (g->psbs_armed <= g->head || (g->stop_at >= 0 && psb >= g->stop_at))
        g->armed = psb;
    return 0;
}

static int seg_at_error(void *ctx, struct session *s, int code)
{
    struct segment *g = ctx;
    (void)s;
    if (code != E_RETSTACK_EMPTY)
        return 0;
    if (g->nunder == g->capunder) {
        int cap = g->capunder ? 2 * g->capunder : 8;
        int *n = realloc(g->underflows, cap * sizeof *n);
        if (!n)
            return -E_NOMEM;
        g->underflows = n;
        g->capunder = cap;
    }
    g->underflows[g->nunder++] = g->ncps;
    return 0;
}

static int seg_before_record(void *ctx, struct session *s)
{
    struct segment *g = ctx;
    if (g->armed < 0)
        return 0;
    ptrdiff_t psb = g->armed;
    g->armed = -1;
    if (g->ncps == g->capcps) {
        int cap = g->capcps ? 2 * g->capcps : 16;
        struct checkpoint *n = realloc(g->cps, cap * sizeof *n);
        if (!n)
            return -E_NOMEM;
        g->cps = n;
        g->capcps = cap;
    }
    struct checkpoint *cp = &g->cps[g->ncps];
    cp->key = state_key(s, &cp->keylen);
    if (!cp->key)
        return -E_NOMEM;
    cp->psb = psb;
    cp->nstack = insn_stack(&s->d, cp->stack);
    memset(cp->out, 0, sizeof cp->out);
    if (g->position)
        g->position(g->ctx, cp->out);
    g->ncps++;
    return 0;
}

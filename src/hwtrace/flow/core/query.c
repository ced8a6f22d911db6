/* The query decoder's core: packets, last IP, synchronization, status,
 * read-ahead and the queries (hwtrace.flow.query.QueryDecoder). */
#include <stdlib.h>

#include "query.h"

static const char *const ERRSTR[E_NCODES] = {
    "", "internal error", "invalid argument", "decoder out of sync",
    "unknown opcode", "unknown packet", "unexpected packet context",
    "reached end of trace stream", "trace stream does not match query",
    "out of memory", "bad configuration", "no ip", "ip has been suppressed",
    "no memory mapped at this address", "unknown instruction",
    "no timing information", "no core:bus ratio", "bad image",
    "locking error", "not supported", "compressed return without call",
    "bad compressed return", "bad status update",
    "expected tracing enabled event", "event ignored", "overflow",
    "bad file", "unknown cpu", "endless loop without trace"};

const char *core_errstr(int code)
{
    if (code < 0)
        code = -code;
    if (code > 0 && code < E_NCODES)
        return ERRSTR[code];
    return "internal error";
}

static void q_reset(struct query *q)
{
    q->ip = 0;
    q->have_ip = q->ip_suppressed = 0;
    q->tnt_bits = q->tnt_index = 0;
    evq_clear(&q->evq, -1);
    q->has_published = 0;
    q->consume_packet = 0;
    q->enabled = 0;
    q->evt.evd_have = 0;
    q->evt.fup.head = q->evt.fup.n = 0;
    q->cur_mode = MODE_NONE;
    q->cur_if = -1;
    q->mode_exec_pending = 0;
    q->tnt_end = 0;
    q->event_at_set = 0;
    q->last_psb = -1;
    q->deferred = 0;
}

void q_init(struct query *q, const uint8_t *buf, ptrdiff_t end,
            const struct core_config *cfg)
{
    memset(q, 0, sizeof *q);
    q->buf = buf;
    q->end = end;
    q->cfg = cfg;
    q->pos = q->sync = -1;
    q->nxt_err = E_NOSYNC;
    ft_reset(&q->time);
    q_reset(q);
}

void q_free(struct query *q)
{
    evq_free(&q->evq);
    evl_free(&q->evt.fup);
}

int q_clone(struct query *dst, const struct query *src)
{
    *dst = *src;
    dst->release = NULL;
    if (evq_copy(&dst->evq, &src->evq) < 0)
        return -E_NOMEM;
    if (evl_copy(&dst->evt.fup, &src->evt.fup) < 0) {
        evq_free(&dst->evq);
        return -E_NOMEM;
    }
    return 0;
}

/* -- packets ---------------------------------------------------------------- */

static int pkt_error(int r)
{
    return r == PT_EOS ? E_EOS : r == PT_BAD_OPC ? E_BAD_OPC : E_BAD_PACKET;
}


/* q_fetch: TNT-8 and TIP, nearly every packet of a trace the walk reads,
 * are decoded by q_fetch_quick as pt_decode_at decodes them (the same
 * record); the others, and those two within 9 bytes of the end, go to
 * pt_decode_at */
static inline void fetch(struct query *q)
{
    ptrdiff_t pos = q->pos, end = q->end;
    if (q_fetch_quick(q, pos))
        return;
    q->nxt_off = pos;
    q->fetches++;
    if (pos >= end) {
        q->nxt_err = E_EOS;
        return;
    }
    int r = pt_decode_at(q->buf, pos, end, q->cfg->pflags, &q->nxt);
    q->nxt_err = r < 0 ? pkt_error(r) : 0;
}

void q_fetch(struct query *q)
{
    fetch(q);
}

void q_consume(struct query *q)
{
    q->pos += q->nxt.size;
    fetch(q);
}

/* -- MTCs between the walk's TNTs and TIPs (query.h's quick steps) ------- */

__attribute__((noinline)) ptrdiff_t
q_mtc_skip(const struct query *q, ptrdiff_t pos)
{
    uint64_t last = q->time.time.ctc;
    while (pos + 2 <= q->end && q->buf[pos] == 0x59 &&
           ft_mtc_ok(&q->time, q->cfg, q->buf[pos + 1], &last))
        pos += 2;
    return pos;
}

/* the read-ahead's steps for the MTCs from pos to q_mtc_skip's ``to``:
 * each one's time update and fetch, the position past it */
static void mtc_apply(struct query *q, ptrdiff_t pos, ptrdiff_t to)
{
    for (; pos < to; pos += 2) {
        ft_mtc_quick(&q->time, q->cfg, q->buf[pos + 1]);
        q->fetches++;
    }
    q->pos = to;
}

__attribute__((noinline)) int
q_fetch_quick_mtc_slow(struct query *q, ptrdiff_t pos)
{
    ptrdiff_t to = q_mtc_skip(q, pos);
    if (to == pos || !q_fetch_quick(q, to))
        return 0;
    mtc_apply(q, pos, to);
    return 1;
}

__attribute__((noinline)) int
q_cache_tnt_mtc(struct query *q)
{
    ptrdiff_t next = q->pos + q->nxt.size;
    ptrdiff_t to = q_mtc_skip(q, next);
    return to != next && q_cache_tnt_mtc_to(q, to);
}

__attribute__((noinline)) int
q_cache_tnt_mtc_to(struct query *q, ptrdiff_t to)
{
    uint64_t n = q->nxt.f[0], bits = q->nxt.f[1];
    ptrdiff_t next = q->pos + q->nxt.size;
    if (!q_fetch_quick(q, to))
        return 0;
    ft_mark(&q->time);          /* the query's time: before the MTCs */
    mtc_apply(q, next, to);
    q->has_published = 0;
    q->tnt_bits = bits;
    q->tnt_index = (uint64_t)1 << (n - 1);
    q->tnt_end = next;
    return 1;
}

/* peek_after: the packet at pos (0) or its error code */
int q_peek(const struct query *q, ptrdiff_t pos, struct pt_pkt *p)
{
    if (pos >= q->end)
        return E_EOS;
    int r = pt_decode_at(q->buf, pos, q->end, q->cfg->pflags, p);
    return r < 0 ? pkt_error(r) : 0;
}

/* -- last IP ------------------------------------------------------------------ */


int q_update_ip(struct query *q, const struct pt_pkt *p)
{
    return q_update_ip_quick(q, p->f[0], p->f[1]);
}

void q_event_ip(struct query *q, struct event *ev, int to)
{
    uint64_t ip;
    if (!q_query_ip(q, &ip))
        ev->ip_suppressed = 1;
    else if (to)
        ev->to = ip;
    else
        ev->ip = ip;
}

void q_stamp(struct query *q, struct event *ev)
{
    const struct core_time *t = &q->time.time;
    ev->tsc = t->tsc;
    ev->lost_mtc = t->lost_mtc;
    ev->lost_cyc = t->lost_cyc;
    ev->has_tsc = t->have_tsc;
    ev->stamped = 1;
}

/* -- synchronization ----------------------------------------------------------- */

static int q_start(struct query *q, ptrdiff_t pos, int *status, uint64_t *ip)
{
    q_reset(q);
    ft_reset(&q->time);
    q->pos = q->sync = pos;
    q_fetch(q);
    if (q->nxt_err || q->nxt.kind != PT_K_PSB) {
        q->err_off = pos;
        return -E_NOSYNC;
    }
    int r = q_decode_psb(q);
    int have = 0;
    if (r >= 0) {
        have = q_query_ip(q, ip);
        r = q_read_ahead(q);
    }
    if (r < 0) {
        q->err_off = q_offset(q);
        return r;
    }
    *status = q_status_flags(q);
    if (!have)
        *status |= ST_IP_SUPPRESSED;
    return 0;
}

int q_sync_forward(struct query *q, int *status, uint64_t *ip)
{
    ptrdiff_t start = 0;
    if (q->pos >= 0) {
        start = q->pos == q->sync ? q->pos + 16 : q->pos;
        start -= start < 15 ? start : 15;
    }
    ptrdiff_t found = pt_find_psb(q->buf, q->end, start);
    if (found < 0) {
        q->err_off = q_offset(q);
        return -E_EOS;
    }
    return q_start(q, found, status, ip);
}

int q_sync_set(struct query *q, ptrdiff_t offset, int *status, uint64_t *ip)
{
    if (offset < 0 || offset > q->end) {
        q->err_off = q_offset(q);
        return -E_EOS;
    }
    return q_start(q, offset, status, ip);
}

/* -- status --------------------------------------------------------------------- */

/* _bad_packet_kind: 1 "branch", 2 "event", 0 None -- of a malformed
 * packet, or one cut by the end of the trace whose opcode is whole */
int q_bad_packet_kind(const struct query *q)
{
    if (q->nxt_err != E_BAD_PACKET && q->nxt_err != E_EOS)
        return 0;
    ptrdiff_t pos = q->nxt_off;
    if (pos >= q->end)
        return 0;
    if (q->nxt_err == E_EOS && q->buf[pos] == 0x02 &&
        (pos + 1 >= q->end || (q->buf[pos + 1] == 0xc3 && pos + 2 >= q->end)))
        return 0;                       /* the opcode itself is cut */
    uint8_t b = q->buf[pos];
    if ((b & 1) == 0 && b != 0 && b != 2)
        return 1;
    uint8_t low = b & 0x1f;
    if (low == 0x0d)
        return 1;
    if (low == 0x01 || low == 0x11 || b == 0x99)
        return 2;
    if (b == 0x02 && pos + 1 < q->end) {
        uint8_t b1 = q->buf[pos + 1];
        if (b1 == 0xa3)
            return 1;
        switch (b1) {
        case 0x43: case 0x03: case 0xc8: case 0xf3: case 0x83: case 0xc3:
        case 0x62: case 0xe2: case 0xc2: case 0x22: case 0xa2:
            return 2;
        }
    }
    return 0;
}

const uint8_t q_will_event_kind[PT_K_COUNT] = {
    [PT_K_TIP_PGE] = 1, [PT_K_TIP_PGD] = 1, [PT_K_OVF] = 1, [PT_K_PIP] = 1,
    [PT_K_MODE_TSX] = 1, [PT_K_STOP] = 1, [PT_K_VMCS] = 1, [PT_K_MNT] = 1,
    [PT_K_EXSTOP] = 1, [PT_K_MWAIT] = 1, [PT_K_PWRE] = 1, [PT_K_PWRX] = 1,
    [PT_K_PTW] = 1, [PT_K_CBR] = 1, [PT_K_TRIG] = 1,
    [PT_K_CFE] = 2, [PT_K_EVD] = 2, [PT_K_PSBEND] = 2, [PT_K_TIP] = 2,
    [PT_K_FUP] = 2,
};

/* _err_opcode: the packet a malformed or cut one is by its opcode where
 * libipt's queries look at that before decoding it: PT_K_TIP, PT_K_TNT8
 * (TNT-8, TNT-64), PT_K_FUP; else -1 */
static int err_opcode(const struct query *q)
{
    int kind = q_bad_packet_kind(q);
    if (kind == 1)
        return (q->buf[q->nxt_off] & 0x1f) == 0x0d ? PT_K_TIP : PT_K_TNT8;
    if ((q->nxt_err == E_BAD_PACKET || q->nxt_err == E_EOS) &&
        q->nxt_off < q->end && (q->buf[q->nxt_off] & 0x1f) == 0x1d)
        return PT_K_FUP;
    return -1;
}

int q_will_event_slow(struct query *q)
{
    int k = q->nxt.kind;
    if (q->nxt_err) {
        if (q_bad_packet_kind(q) == 2)
            return 1;
        k = err_opcode(q);              /* TIP, FUP: by the queue */
        if (k != PT_K_TIP && k != PT_K_FUP)
            return 0;
    }
    switch (k) {
    case PT_K_TIP_PGE: case PT_K_TIP_PGD: case PT_K_OVF: case PT_K_PIP:
    case PT_K_MODE_TSX: case PT_K_STOP: case PT_K_VMCS: case PT_K_MNT:
    case PT_K_EXSTOP: case PT_K_MWAIT: case PT_K_PWRE: case PT_K_PWRX:
    case PT_K_PTW: case PT_K_CBR: case PT_K_TRIG:
        return 1;
    case PT_K_CFE:
        return q_cfe_will_event(q, &q->nxt, q->nxt_off);
    case PT_K_EVD:
        return q_evd_fails(q, &q->nxt);
    case PT_K_PSBEND:
        return evq_pending(&q->evq, BIND_PSBEND);
    case PT_K_TIP:
        return evq_pending(&q->evq, BIND_TIP);
    case PT_K_FUP:
        return evq_pending(&q->evq, BIND_FUP) || q->evt.fup.n != 0 ||
               (q->mode_exec_pending && evq_pending(&q->evq, BIND_TIP) &&
                evq_find(&q->evq, BIND_TIP, EV_ASYNC_BRANCH) < 0);
    }
    return 0;
}

static int is_tnt(int k)
{
    return k == PT_K_TNT8 || k == PT_K_TNT64;
}

/* _stops_read_ahead: libipt's read-ahead stops at a packet that does not
 * decode where its opcode says a branch or event packet, or a FUP an
 * event binds to, instead of failing on it */
int q_stops_read_ahead(struct query *q)
{
    return q_bad_packet_kind(q) || q_will_event_slow(q);
}

int q_read_ahead(struct query *q)
{
    for (;;) {
        if (q->nxt_err) {
            if (q_stops_read_ahead(q))
                return 0;
            int e = q->nxt_err;
            if (e == E_EOS && q->nxt_off < q->end) {
                /* a status packet cut by the end: libipt gives up
                 * reading ahead at the end */
                q->pos = q->end;
                fetch(q);
            }
            return -e;
        }
        int k = q->nxt.kind;
        if (k == PT_K_TIP || is_tnt(k))
            return 0;
        if (q_will_event(q))
            return 0;
        int r = q_decode(q);
        if (r == -E_EOS) {
            /* a PSB+ cut by the end of the trace: libipt gives up reading
             * ahead at the end (no packet next: the end) */
            q->pos = q->end;
            fetch(q);
        }
        if (r < 0)
            return r;
    }
}

static __attribute__((noinline)) int read_ahead_tolerant_slow(struct query *q)
{
    int r = q_read_ahead(q);
    if (r == -E_BAD_STATUS_UPDATE) {
        q->deferred = E_BAD_STATUS_UPDATE;
        q->deferred_off = q->pos;
    } else if (r < 0 && r != -E_EOS) {
        return r;
    }
    return 0;
}

/* read_ahead_tolerant: with a TNT or TIP next (q_read_ahead's first test)
 * there is nothing to read ahead */
static inline int read_ahead_tolerant(struct query *q)
{
    if (!q->nxt_err && (q->nxt.kind == PT_K_TIP || is_tnt(q->nxt.kind)))
        return 0;
    return read_ahead_tolerant_slow(q);
}

/* -- queries ---------------------------------------------------------------------- */

static int dec_tnt(struct query *q, const struct pt_pkt *p);

/* q_decode for a packet whose kind the caller read (no error): a TNT or
 * TIP goes straight to its step (q_decode's switch is a jump table's
 * indirect branch) */
static inline int decode_known(struct query *q, int k)
{
    if (is_tnt(k)) {
        struct pt_pkt pkt = q->nxt;
        return dec_tnt(q, &pkt);
    }
    if (k == PT_K_TIP) {
        struct pt_pkt pkt = q->nxt;
        return q_dec_tip(q, &pkt);
    }
    return q_decode(q);
}

static int cache_tnt(struct query *q)
{
    for (;;) {
        if (q->nxt_err)         /* libipt asks by the opcodes read ahead */
            return q_will_event(q) || err_opcode(q) == PT_K_TIP ?
                   -E_BAD_QUERY : -q->nxt_err;
        if (q_will_event(q))
            return -E_BAD_QUERY;
        int k = q->nxt.kind;
        if (k == PT_K_TIP)
            return -E_BAD_QUERY;
        q->has_published = 0;
        TRY(decode_known(q, k));
        if (q->has_published)
            return -E_EVENT_IGNORED;
        if (is_tnt(k))
            break;
        TRY(q_read_ahead(q));
    }
    ft_mark(&q->time);
    return read_ahead_tolerant(q);
}

static int tnt_take(struct query *q)
{
    uint64_t index = q->tnt_index;
    if (!index)
        return -1;
    q->tnt_index = index >> 1;
    return (q->tnt_bits & index) ? 1 : 0;
}

/* The walk's two queries in the common case: a TNT (no bit cached) or a
 * TIP (no event bound to it) next, and after it another TNT-8 or TIP that
 * fetch_quick decodes -- the steps of cache_tnt/indirect_branch, dec_tnt/
 * q_dec_tip, read_ahead_tolerant and q_status_flags for these packets, in
 * a function that calls nothing (any other case goes on in a tail call to
 * the general steps, so the fast path saves no registers). */



/* the fast paths' step past the packet they answered from: take it, mark
 * the time, read ahead; a read-ahead error is reported at its offset */
static inline int step_past(struct query *q)
{
    fetch(q);
    ft_mark(&q->time);
    int r = read_ahead_tolerant(q);
    if (r < 0)
        q->err_off = q_offset(q);
    return r;
}

/* after the TNT's bits are cached and the position is past it */
static __attribute__((noinline)) int refill_rest(struct query *q,
                                                 int *status, int *taken)
{
    int r = step_past(q);
    if (r < 0)
        return r;
    *taken = tnt_take(q);
    *status = q_status_flags(q);
    return 0;
}

/* q_cond_branch with no bit cached and a TNT next: no event binds to a
 * TNT, nothing is published, its first bit is taken */
static inline int refill_tnt(struct query *q, int *status, int *taken)
{
    uint64_t n = q->nxt.f[0];
    uint64_t bits = q->nxt.f[1], index = (uint64_t)1 << (n - 1);
    ptrdiff_t next = q->pos + q->nxt.size;
    q->has_published = 0;
    q->tnt_bits = bits;
    q->tnt_index = index;
    q->tnt_end = next;
    q->pos = next;
    /* the mark first: the packet does not change the time (and the time's
     * loads then never wait for the fetch's stores) */
    ft_mark(&q->time);
    if (!q_fetch_quick_mtc(q, next))
        return refill_rest(q, status, taken);
    q->tnt_index = index >> 1;
    *taken = (bits & index) != 0;
    *status = q_status_quick(q);
    return 0;
}

static __attribute__((noinline)) int cond_branch(struct query *q,
                                                 int *status, int *taken);


int q_cond_branch(struct query *q, int *status, int *taken)
{
    if (!q->tnt_index && !q->nxt_err) {
        int k = q->nxt.kind;
        if (is_tnt(k) && q->nxt.f[0] > 0)
            return refill_tnt(q, status, taken);
        if (k == PT_K_TIP) {
            /* cache_tnt's answer, event or not: the walk asks this at a
             * return that may be compressed, and then for the TIP */
            q->err_off = q_offset(q);
            return -E_BAD_QUERY;
        }
    }
    return cond_branch(q, status, taken);
}

static int cond_branch(struct query *q, int *status, int *taken)
{
    int r = 0;
    if (!q->tnt_index)
        r = cache_tnt(q);
    if (r >= 0) {
        int t = tnt_take(q);
        if (t < 0) {
            r = -E_BAD_QUERY;
        } else {
            *taken = t;
            *status = q_status_flags(q);
            return 0;
        }
    }
    q->err_off = q_offset(q);
    return r;
}

static int indirect_branch(struct query *q, int *status, uint64_t *target)
{
    int have;
    for (;;) {
        if (q->nxt_err)
            return q_will_event(q) ||
                   (q->tnt_index && err_opcode(q) == PT_K_TNT8) ?
                   -E_BAD_QUERY : -q->nxt_err;
        if (q_will_event(q))
            return -E_BAD_QUERY;
        int k = q->nxt.kind;
        if (is_tnt(k) && q->tnt_index)
            return -E_BAD_QUERY;
        q->has_published = 0;
        TRY(decode_known(q, k));
        if (q->has_published)
            return -E_EVENT_IGNORED;
        if (k == PT_K_TIP) {
            have = q_query_ip(q, target);
            break;
        }
        TRY(q_read_ahead(q));
    }
    ft_mark(&q->time);
    TRY(read_ahead_tolerant(q));
    *status = q_status_flags(q);
    if (!have)
        *status |= ST_IP_SUPPRESSED;
    return 0;
}

int q_indirect_branch(struct query *q, int *status, uint64_t *target)
{
    return q_indirect_branch_quick(q, status, target);
}


int q_tip_rest(struct query *q, int *status, int have)
{
    int r = step_past(q);
    if (r < 0)
        return r;
    *status = q_status_flags(q) | (have ? 0 : ST_IP_SUPPRESSED);
    return 0;
}

int q_indirect_branch_slow(struct query *q, int *status, uint64_t *target)
{
    int r = indirect_branch(q, status, target);
    if (r < 0)
        q->err_off = q_offset(q);
    return r;
}

static int skip_to_ip(struct query *q, int *status, uint64_t *target,
                      int *have)
{
    q->tnt_bits = q->tnt_index = 0;
    for (;;) {
        if (q->nxt_err)
            return -q->nxt_err;
        if (q_will_event(q)) {
            *status = q_status_flags(q);
            *have = 0;
            return 0;
        }
        int k = q->nxt.kind;
        q->has_published = 0;
        TRY(q_decode(q));
        if (q->has_published)
            return -E_EVENT_IGNORED;
        if (is_tnt(k)) {
            q->tnt_bits = q->tnt_index = 0;
        } else if (k == PT_K_TIP) {
            *have = q_query_ip(q, target);
            ft_mark(&q->time);
            TRY(read_ahead_tolerant(q));
            *status = q_status_flags(q);
            if (!*have)
                *status |= ST_IP_SUPPRESSED;
            return 0;
        }
        TRY(q_read_ahead(q));
    }
}

int q_skip_to_ip(struct query *q, int *status, uint64_t *target, int *have)
{
    int r = skip_to_ip(q, status, target, have);
    if (r < 0)
        q->err_off = q_offset(q);
    return r;
}

static int event(struct query *q, int *status, struct event *ev)
{
    if (q->tnt_index)
        return -E_BAD_QUERY;
    for (;;) {
        if (q->nxt_err) {
            int k = err_opcode(q);
            return (k == PT_K_TIP || k == PT_K_TNT8) && !q_will_event(q) ?
                   -E_BAD_QUERY : -q->nxt_err;
        }
        int k = q->nxt.kind;
        if ((k == PT_K_TIP || is_tnt(k)) && !q_will_event(q))
            return -E_BAD_QUERY;
        q->has_published = 0;
        ptrdiff_t start = q->pos;
        int size = q->nxt.size;
        TRY(q_decode(q));
        if (q->has_published) {
            struct event *p = &q->published;
            if (!p->stamped)
                q_stamp(q, p);
            q->event_at_set = 1;
            q->event_at_stay = (uint8_t)q_stays(k, p);
            q->event_at_start = start;
            q->event_at_end = q->pos > start + size ? q->pos : start + size;
            *ev = *p;
            break;
        }
        TRY(q_read_ahead(q));
    }
    ft_mark(&q->time);
    TRY(read_ahead_tolerant(q));
    *status = q_status_flags(q);
    return 0;
}

int q_event(struct query *q, int *status, struct event *ev)
{
    int r = event(q, status, ev);
    if (r < 0)
        q->err_off = q_offset(q);
    return r;
}

/* -- decode steps -------------------------------------------------------------- */

int q_exec_mode(const struct pt_pkt *p)
{
    int csl = p->f[0] & 1, csd = p->f[1] & 1;
    if (csl && csd)
        return MODE_NONE;
    return csl ? 2 : csd ? 1 : 0;
}

static int dec_tnt(struct query *q, const struct pt_pkt *p)
{
    if (q->tnt_index)
        return -E_BAD_CONTEXT;
    q->tnt_bits = p->f[1];
    q->tnt_index = p->f[0] > 0 ? (uint64_t)1 << (p->f[0] - 1) : 0;
    q->tnt_end = q->pos + p->size;
    q_consume(q);
    return 0;
}

static int dec_cbr(struct query *q, const struct pt_pkt *p)
{
    TRY(ft_update(&q->time, q->cfg, p, 0));
    struct event ev;
    ev_init(&ev, EV_CBR);
    EV_SET(&ev, RATIO, ev.ratio = p->f[0]);
    q_publish(q, &ev);
    q_consume(q);
    return 0;
}

int q_decode(struct query *q)
{
    /* the decode steps read the packet from a copy: they consume it */
    struct pt_pkt pkt = q->nxt;
    ptrdiff_t off = q->nxt_off;
    struct event ev;
    switch (pkt.kind) {
    case PT_K_PAD: case PT_K_INVALID:
        q_consume(q);
        return 0;
    case PT_K_PSB:
        return q_decode_psb(q);
    case PT_K_PSBEND:
        if (evq_dequeue(&q->evq, BIND_PSBEND, &ev)) {
            q_finish_psbend_event(q, &ev);
            q_publish(q, &ev);
            if (evq_pending(&q->evq, BIND_PSBEND))
                return 0;
        }
        q_consume(q);
        return 0;
    case PT_K_TNT8: case PT_K_TNT64:
        return dec_tnt(q, &pkt);
    case PT_K_TIP:
        return q_dec_tip(q, &pkt);
    case PT_K_TIP_PGE:
        return q_dec_tip_pge(q, &pkt);
    case PT_K_TIP_PGD:
        return q_dec_tip_pgd(q, &pkt);
    case PT_K_FUP:
        return q_dec_fup(q, &pkt);
    case PT_K_PIP:
        return q_dec_pip(q, &pkt);
    case PT_K_VMCS:
        return q_dec_vmcs(q, &pkt);
    case PT_K_MODE_EXEC: case PT_K_MODE_TSX:
        return q_dec_mode(q, &pkt);
    case PT_K_OVF:
        return q_dec_ovf(q, &pkt);
    case PT_K_STOP:
        ev_init(&ev, EV_STOP);
        q_publish(q, &ev);
        q_consume(q);
        return 0;
    case PT_K_MNT:
        ev_init(&ev, EV_MNT);
        EV_SET(&ev, PAYLOAD, ev.payload = pkt.f[0]);
        q_publish(q, &ev);
        q_consume(q);
        return 0;
    case PT_K_EXSTOP:
        return q_dec_exstop(q, &pkt);
    case PT_K_MWAIT:
        return q_dec_mwait(q, &pkt);
    case PT_K_PWRE:
        return q_dec_pwre(q, &pkt);
    case PT_K_PWRX:
        return q_dec_pwrx(q, &pkt);
    case PT_K_PTW:
        return q_dec_ptw(q, &pkt);
    case PT_K_TSC: case PT_K_TMA: case PT_K_MTC: case PT_K_CYC:
        TRY(ft_update(&q->time, q->cfg, &pkt, 0));
        q_consume(q);
        return 0;
    case PT_K_CBR:
        return dec_cbr(q, &pkt);
    case PT_K_CFE:
        return q_dec_cfe(q, &pkt, off);
    case PT_K_EVD:
        return q_dec_evd(q, &pkt);
    case PT_K_TRIG:
        return q_dec_trig(q, &pkt);
    }
    return -E_BAD_OPC;
}

/* -- state at OVF and PSBEND ------------------------------------------------------ */

void q_overflow_reset(struct query *q)
{
    ft_overflow(&q->time, q->cfg);
    q->ip = 0;
    q->have_ip = q->ip_suppressed = 0;
    q->tnt_bits = q->tnt_index = 0;
    evq_clear(&q->evq, -1);
    q->consume_packet = 0;
    q->enabled = 0;
    q->evt.evd_have = 0;
    q->evt.fup.head = q->evt.fup.n = 0;
    q->cur_mode = MODE_NONE;
    q->cur_if = -1;
    q->mode_exec_pending = 0;
}

void q_finish_psbend_event(struct query *q, struct event *ev)
{
    switch (ev->type) {
    case EV_ENABLED: case EV_EXEC_MODE: case EV_TSX: case EV_ASYNC_PAGING:
    case EV_ASYNC_VMCS: case EV_IFLAGS:
        q_event_ip(q, ev, 0);
    }
    q_stamp(q, ev);
}

/* The query/event decoder: a port of hwtrace.flow.query with psb,
 * overflow, power, evtrace and evtpos (libipt's pt_query_decoder).
 *
 * Results: 0 / >= 0 on success; -E_* on failure, with the trace offset the
 * twin's PtError carries in q->err_off.  Internally the twin's ``Fail``
 * exceptions are negative returns (the state changes made before the
 * failure stay, as they do there). */
#ifndef HWTRACE_CORE_QUERY_H
#define HWTRACE_CORE_QUERY_H

#include "event.h"
#include "timing.h"

struct evt_state {              /* evtrace.EventTraceState */
    uint8_t evd_have;           /* EVD types 0..2 waiting for their CFE */
    uint64_t evd[3];
    struct evlist fup;          /* CFE events waiting for a FUP; an entry
                                   with type EV_NTYPES is the twin's None */
};

struct query {
    const uint8_t *buf;
    ptrdiff_t end;
    const struct core_config *cfg;
    ptrdiff_t pos, sync;        /* -1: None */
    /* the packet at pos (the twin's ``next``): nxt_err 0, or the error */
    struct pt_pkt nxt;
    ptrdiff_t nxt_off;
    int nxt_err;
    uint64_t fetches;           /* q_fetch calls (the twin's ``next is``) */
    struct flow_time time;
    /* _reset() state */
    uint64_t ip;
    uint8_t have_ip, ip_suppressed;
    uint64_t tnt_bits, tnt_index;
    struct evq evq;
    struct event published;
    uint8_t has_published, consume_packet, enabled, mode_exec_pending;
    int8_t cur_mode, cur_if;    /* -1: None */
    struct evt_state evt;
    ptrdiff_t tnt_end;
    uint8_t event_at_set, event_at_stay;
    ptrdiff_t event_at_start, event_at_end;
    ptrdiff_t last_psb;         /* -1: None */
    int deferred;               /* 0 or the error code; at deferred_off */
    ptrdiff_t deferred_off;
    /* the offset of the last error returned */
    ptrdiff_t err_off;
    /* an allocation failed: the decode stops (the twin's MemoryError) */
    int fatal;
    /* called at PSBs once the position passes release_at (a file
     * mapping's release_before: memory only, never results); sets
     * release_at; < 0 on failure (fatal) */
    int (*release)(void *ctx, ptrdiff_t pos, ptrdiff_t *next);
    void *release_ctx;
    ptrdiff_t release_at;
};

void q_init(struct query *q, const uint8_t *buf, ptrdiff_t end,
            const struct core_config *cfg);
void q_free(struct query *q);
int q_clone(struct query *dst, const struct query *src);

static inline ptrdiff_t q_offset(const struct query *q)
{
    return q->pos >= 0 ? q->pos : 0;
}

static inline ptrdiff_t q_sync_offset(const struct query *q)
{
    return q->sync >= 0 ? q->sync : 0;
}

/* (status, ip): *ip valid if !(status & ST_IP_SUPPRESSED) */
int q_sync_forward(struct query *q, int *status, uint64_t *ip);
int q_sync_set(struct query *q, ptrdiff_t offset, int *status, uint64_t *ip);
int q_cond_branch(struct query *q, int *status, int *taken);

static inline int q_status_flags(struct query *q);

/* q_cond_branch where TNT bits are cached (the common case, inline) */
static inline int q_cond_branch_fast(struct query *q, int *status,
                                     int *taken)
{
    uint64_t index = q->tnt_index;
    if (!index)
        return q_cond_branch(q, status, taken);
    q->tnt_index = index >> 1;
    *taken = (q->tnt_bits & index) != 0;
    *status = q->tnt_index ? (q->deferred ? ST_DEFERRED : 0)
                           : q_status_flags(q);
    return 0;
}
int q_indirect_branch(struct query *q, int *status, uint64_t *target);
/* where the MTCs at pos end, as far as ft_mtc_ok takes them in a row
 * (the read-ahead's steps past them; pos if none), changing nothing */
ptrdiff_t q_mtc_skip(const struct query *q, ptrdiff_t pos);

/* whether a TNT-8 or TIP starts with byte x (q_fetch_quick's packets) */
static inline int q_quick_first(unsigned x)
{
    return (!(x & 1) && x >= 4) ||                      /* TNT-8 */
           ((x & 0x1f) == 0x0d && pt_ipc_size[x >> 5] >= 0);    /* TIP */
}

/* q_cond_branch's packet step ahead of its query, for a walk that knows
 * the next query is q_cond_branch's: with no TNT bit cached, nothing
 * deferred and a TNT next whose following packet, after any MTCs
 * ft_mtc_ok takes, is a TNT-8 or TIP (refill_tnt's fast case), the TNT's
 * bits cached, those MTCs' steps taken and the position past them as
 * q_cond_branch leaves them, but its first bit not taken (the next
 * query takes it, from the cache, with the status q_cond_branch would
 * give); 1, or 0 with nothing changed (only if q_tnt_peek would not
 * say 1: call it where it did).  q_tnt_peek: whether it would cache, and
 * what (*index: the first bit's mask, *bits; *to: the position past the
 * TNT and the MTCs after it, for q_cache_tnt_to), changing nothing. */
static inline __attribute__((always_inline)) int
q_tnt_peek(const struct query *q, uint64_t *index, uint64_t *bits,
           ptrdiff_t *to)
{
    /* the kind first: after a TIP step, a TIP next fails here at once */
    if ((q->nxt.kind != PT_K_TNT8 && q->nxt.kind != PT_K_TNT64) ||
        q->tnt_index || q->nxt_err || q->deferred || !q->nxt.f[0])
        return 0;
    ptrdiff_t after = q->pos + q->nxt.size;
    if (after + 9 > q->end)
        return 0;
    unsigned x = q->buf[after];
    if (!q_quick_first(x)) {
        if (x != 0x59)
            return 0;
        after = q_mtc_skip(q, after);
        if (after + 9 > q->end || !q_quick_first(q->buf[after]))
            return 0;
    }
    *index = (uint64_t)1 << (q->nxt.f[0] - 1);
    *bits = q->nxt.f[1];
    *to = after;
    return 1;
}
int q_skip_to_ip(struct query *q, int *status, uint64_t *target,
                 int *have);
int q_event(struct query *q, int *status, struct event *ev);

/* -- internals shared by the query's source files ------------------------ */

void q_fetch(struct query *q);
void q_consume(struct query *q);
int q_peek(const struct query *q, ptrdiff_t pos, struct pt_pkt *p);
int q_update_ip(struct query *q, const struct pt_pkt *p);
static inline int q_query_ip(const struct query *q, uint64_t *ip)
{
    if (!q->have_ip || q->ip_suppressed)
        return 0;
    *ip = q->ip;
    return 1;
}
void q_event_ip(struct query *q, struct event *ev, int to);
void q_stamp(struct query *q, struct event *ev);
static inline void q_publish(struct query *q, const struct event *ev)
{
    q->published = *ev;
    q->has_published = 1;
}
int q_decode(struct query *q);              /* _decode(self.next) */
int q_read_ahead(struct query *q);
/* _will_event: whether the next packet is (or binds) an event.  By the
 * packet's kind where that decides it (q_will_event_kind: 0 no, 1 yes,
 * 2 it depends on the queue or the packet: q_will_event_slow) -- it is
 * asked after every TNT and TIP, and a switch there was a jump table's
 * mispredicted indirect branch each time */
extern const uint8_t q_will_event_kind[PT_K_COUNT];
int q_will_event_slow(struct query *q);
static inline int q_will_event(struct query *q)
{
    if (!q->nxt_err && (unsigned)q->nxt.kind < PT_K_COUNT) {
        int c = q_will_event_kind[q->nxt.kind];
        if (c < 2)
            return c;
        if (q->nxt.kind == PT_K_TIP)
            return evq_pending(&q->evq, BIND_TIP);
    }
    return q_will_event_slow(q);
}
/* _bad_packet_kind: what libipt, which reads ahead by opcodes, takes a
 * malformed packet or one the end of the trace cut for (1 branch, 2 event) */
int q_bad_packet_kind(const struct query *q);
/* _will_eos: no packet is next -- the trace ended, or it ends in a status
 * packet cut short or an opcode cut (libipt gives up reading ahead there);
 * a branch or event packet (or a FUP an event binds to) cut short is the
 * next packet until a query needs it decoded */
int q_stops_read_ahead(struct query *q);
static inline int q_will_eos(struct query *q)
{
    return q->nxt_err == E_EOS && !q_stops_read_ahead(q);
}
static inline int q_status_flags(struct query *q)
{
    int flags = q->deferred ? ST_DEFERRED : 0;
    if (!q->tnt_index) {
        if (q_will_event(q))
            flags |= ST_EVENT_PENDING;
        if (q_will_eos(q))
            flags |= ST_EOS;
    }
    return flags;
}
int q_exec_mode(const struct pt_pkt *p);   /* MODE.EXEC -> mode */
void q_overflow_reset(struct query *q);
void q_finish_psbend_event(struct query *q, struct event *ev);
static inline int q_enqueue(struct query *q, int b, const struct event *ev)
{
    if (evq_enqueue(&q->evq, b, ev) < 0) {
        q->fatal = E_NOMEM;
        return -E_NOMEM;
    }
    return 0;
}

/* -- the walk's common packets, inline (query.c's fast paths) ------------- */

/* the payload of a TIP/FUP-format packet with n (0..8) bytes at b, where
 * 8 bytes may be read (one unaligned load instead of pt_le's loop) */
static inline uint64_t q_ip_payload(const uint8_t *b, int n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, b, 8);
    return n >= 8 ? v : v & (((uint64_t)1 << (8 * n)) - 1);
#else
    return n ? pt_le(b, n) : 0;
#endif
}

/* the last IP's bits an IP compression keeps (1, 2, 4: the high 48, 32,
 * 16 bits; 6: none; 3 sign-extends bit 47; 0 suppresses; 5, 7 invalid) */
static const uint64_t Q_IPC_KEEP[8] = {
    0, ~(uint64_t)0xffff, ~(uint64_t)0xffffffff, 0, ~(uint64_t)0xffffffffffff,
    0, 0, 0};

/* the last-IP update, without the jump table a switch on the compression
 * becomes (an indirect branch at every TIP) */
static inline int q_update_ip_quick(struct query *q, uint64_t ipc, uint64_t ip)
{
    if (ipc == 0) {
        q->ip_suppressed = 1;
        return 0;
    }
    if (ipc > 7 || !((0x5fu >> ipc) & 1))
        return -E_BAD_PACKET;
    if (ipc == 3)
        ip = (ip & ((uint64_t)1 << 47)) ? (ip | ~(uint64_t)0xffffffffffff)
                                        : ip;
    else
        ip |= q->ip & Q_IPC_KEEP[ipc];
    q->ip = ip;
    q->have_ip = 1;
    q->ip_suppressed = 0;
    return 0;
}

/* fetch for a TNT-8 or a TIP at pos (with 8 bytes after its first byte
 * in the buffer): 1 and q->nxt set as fetch sets it; 0 and nothing
 * changed for any other packet */
static inline int q_fetch_quick(struct query *q, ptrdiff_t pos)
{
    if (pos + 9 > q->end)
        return 0;
    const uint8_t *b = q->buf + pos;
    unsigned x = b[0];
    if (!(x & 1) && x >= 4) {                       /* TNT-8 */
        unsigned v = x >> 1;
        int n = 31 - __builtin_clz(v);
        q->nxt.kind = PT_K_TNT8;
        q->nxt.size = 1;
        q->nxt.f[0] = (uint64_t)n;
        q->nxt.f[1] = v ^ (1u << n);
    } else if ((x & 0x1f) == 0x0d && pt_ipc_size[x >> 5] >= 0) { /* TIP */
        int n = pt_ipc_size[x >> 5];
        q->nxt.kind = PT_K_TIP;
        q->nxt.size = n + 1;
        q->nxt.f[0] = x >> 5;
        q->nxt.f[1] = q_ip_payload(b + 1, n);
    } else {
        return 0;
    }
    q->nxt_off = pos;
    q->fetches++;
    q->nxt_err = 0;
    return 1;
}

/* q_fetch_quick after the MTCs at pos that ft_mtc_ok takes, and the
 * read-ahead's steps for them (each one's time update and fetch, the
 * position past them) where it decodes the packet after them; 0 and
 * nothing changed where it does not (the caller's general steps take the
 * MTCs).  With q->pos == pos, after the query's ft_mark: the time it
 * answers with is the time before them. */
int q_fetch_quick_mtc_slow(struct query *q, ptrdiff_t pos);
static inline __attribute__((always_inline)) int
q_fetch_quick_mtc(struct query *q, ptrdiff_t pos)
{
    return q_fetch_quick(q, pos) || q_fetch_quick_mtc_slow(q, pos);
}

/* q_status_flags with a TNT-8 or TIP next (q_will_event: a TIP binds
 * the events queued for it, a TNT none; not the end) */
static inline int q_status_quick(const struct query *q)
{
    int flags = q->deferred ? ST_DEFERRED : 0;
    if (!q->tnt_index && q->nxt.kind == PT_K_TIP &&
            evq_pending(&q->evq, BIND_TIP))
        flags |= ST_EVENT_PENDING;
    return flags;
}

/* q_cache_tnt_quick (see q_tnt_peek above) */
int q_cache_tnt_mtc(struct query *q);    /* MTCs after the TNT */
static inline __attribute__((always_inline)) int
q_cache_tnt_quick(struct query *q)
{
    uint64_t n = q->nxt.f[0], bits = q->nxt.f[1];
    ptrdiff_t next = q->pos + q->nxt.size;
    if (!q_fetch_quick(q, next))      /* nothing changed where it fails */
        return q_cache_tnt_mtc(q);
    ft_mark(&q->time);
    q->has_published = 0;
    q->tnt_bits = bits;
    q->tnt_index = (uint64_t)1 << (n - 1);
    q->tnt_end = next;
    q->pos = next;
    return 1;
}

/* q_cache_tnt_quick where q_tnt_peek_to said 1 and gave ``to``: the MTCs
 * between the TNT and to taken without q_mtc_skip's second look (a
 * third of the packets between the python3 recording's TNTs and TIPs) */
int q_cache_tnt_mtc_to(struct query *q, ptrdiff_t to);
static inline __attribute__((always_inline)) int
q_cache_tnt_to(struct query *q, ptrdiff_t to)
{
    if (to != q->pos + q->nxt.size)
        return q_cache_tnt_mtc_to(q, to);
    return q_cache_tnt_quick(q);
}

/* q_indirect_branch's steps after its TIP, or where the TIP binds an
 * event or is not next (query.c) */
int q_tip_rest(struct query *q, int *status, int have);
int q_indirect_branch_slow(struct query *q, int *status, uint64_t *target);
/* q_indirect_branch, inline: a TIP next that binds no event */
static inline __attribute__((always_inline)) int
q_indirect_branch_quick(struct query *q, int *status, uint64_t *target)
{
    /* a TIP next that binds no event: indirect_branch's one step, with
     * q_dec_tip's (nothing to dequeue, nothing published) */
    if (!q->nxt_err && q->nxt.kind == PT_K_TIP &&
            !evq_pending(&q->evq, BIND_TIP)) {
        q->has_published = 0;
        q->mode_exec_pending = 0;
        int r = q_update_ip_quick(q, q->nxt.f[0], q->nxt.f[1]);
        if (r < 0) {
            q->err_off = q_offset(q);
            return r;
        }
        ptrdiff_t next = q->pos + q->nxt.size;
        q->pos = next;
        int have = q_query_ip(q, target);
        ft_mark(&q->time);                  /* see refill_tnt */
        if (!q_fetch_quick_mtc(q, next))
            return q_tip_rest(q, status, have);
        *status = q_status_quick(q) | (have ? 0 : ST_IP_SUPPRESSED);
        return 0;
    }
    return q_indirect_branch_slow(q, status, target);
}

/* qpackets.c: the decode steps of event packets */
int q_dec_tip(struct query *q, const struct pt_pkt *p);
int q_dec_tip_pge(struct query *q, const struct pt_pkt *p);
int q_dec_tip_pgd(struct query *q, const struct pt_pkt *p);
int q_dec_fup(struct query *q, const struct pt_pkt *p);
int q_dec_pip(struct query *q, const struct pt_pkt *p);
int q_dec_vmcs(struct query *q, const struct pt_pkt *p);
int q_dec_mode(struct query *q, const struct pt_pkt *p);
int q_dec_exstop(struct query *q, const struct pt_pkt *p);
int q_dec_mwait(struct query *q, const struct pt_pkt *p);
int q_dec_pwre(struct query *q, const struct pt_pkt *p);
int q_dec_pwrx(struct query *q, const struct pt_pkt *p);
int q_dec_ptw(struct query *q, const struct pt_pkt *p);
int q_dec_cfe(struct query *q, const struct pt_pkt *p, ptrdiff_t off);
int q_dec_evd(struct query *q, const struct pt_pkt *p);
int q_dec_trig(struct query *q, const struct pt_pkt *p);
int q_cfe_will_event(struct query *q, const struct pt_pkt *p, ptrdiff_t off);
int q_evd_fails(const struct query *q, const struct pt_pkt *p);

/* qpsb.c: PSB+ and OVF */
int q_decode_psb(struct query *q);
int q_dec_ovf(struct query *q, const struct pt_pkt *p);

/* evtpos.c: libipt 2.3's offsets */
ptrdiff_t q_skip_pads(const struct query *q, ptrdiff_t pos);
int q_stays(int kind, const struct event *ev);
ptrdiff_t q_after_event(const struct query *q, int stay, ptrdiff_t pos,
                        ptrdiff_t end);
/* where the event decoder stands after fetching the next TNT, TIP or
 * event (on a copy of q); -E_NOMEM if the copy fails */
ptrdiff_t q_lookahead(const struct query *q);

#endif

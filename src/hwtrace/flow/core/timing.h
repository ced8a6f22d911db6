/* Time as the flow decoders see it: libipt's pt_time / pt_time_cal
 * (hwtrace.pt.timing's Time and TimeCal) behind hwtrace.flow.timing's
 * FlowTime (apply timing packets, mark the time of a query, stamp events).
 *
 * Python's integers are unbounded; where the twin masks to 64 or 32 bits
 * the arithmetic here wraps the same way, and the configuration values are
 * limited (by the glue) to ranges where nothing else can overflow:
 * nom_freq < 2**56, cpuid values < 2**64. */
#ifndef HWTRACE_CORE_TIMING_H
#define HWTRACE_CORE_TIMING_H

#include "common.h"

struct core_time {              /* Time */
    uint64_t tsc, base, fc, ctc, ctc_cyc, lost_mtc, lost_cyc, cbr;
    uint8_t have_tsc, have_cbr, have_tma, have_mtc;
};

struct core_tcal {              /* TimeCal */
    uint64_t fcr, min_fcr, max_fcr, tsc, cyc_tsc, cyc_mtc, ctc, lost_mtc;
    uint8_t have_mtc, check_skl168;
};

struct flow_time {              /* FlowTime */
    struct core_time time;
    struct core_tcal tcal;
    /* the time at the last query: (tsc, lost_mtc, lost_cyc, have_tsc) */
    uint64_t m_tsc, m_lost_mtc, m_lost_cyc;
    uint8_t m_have;
};

void ft_reset(struct flow_time *t);
/* FlowTime.update for a timing packet (TSC, CBR, TMA, MTC, CYC): 0 or
 * -E_* where the twin raises TimeError (configuration errors ignored). */
int ft_update(struct flow_time *t, const struct core_config *c,
              const struct pt_pkt *p, int header);
void ft_psb(struct flow_time *t, const struct core_config *c);
void ft_overflow(struct flow_time *t, const struct core_config *c);

static inline void ft_mark(struct flow_time *t)
{
    /* tsc through a register: GCC's SLP vectorizer paired it with
     * lost_mtc through a 16-byte load from 8 bytes before it, over the
     * query's ``fetches`` the caller (q_fetch_quick) had just incremented
     * -- a store-forwarding stall at every TNT packet the walk caches
     * (perf: ~8% of the edge walk's samples) */
    uint64_t tsc = t->time.tsc;
    __asm__("" : "+r"(tsc));
    t->m_tsc = tsc;
    t->m_lost_mtc = t->time.lost_mtc;
    t->m_lost_cyc = t->time.lost_cyc;
    t->m_have = t->time.have_tsc;
}

/* -- MTC, inline: the walk's quick packet steps (query.h) take the MTCs
 * between its TNTs and TIPs here instead of the read-ahead's general step
 * (q_decode -> ft_update).  Only the common case, where ft_update cannot
 * fail and changes little: TimeCal has had an MTC and counted no CYC
 * since (tc_update_mtc then only forgets the SKL168 check), and Time has
 * its MTC (tm_update_mtc: the CTC delta to TSC) or a TSC without TMA (it
 * ignores the MTC).  Any other case -- first MTC, CYC, a CTC going back
 * beyond one wrap (ft_update's error) -- stays with the general step. */

/* whether ft_mtc_quick applies an MTC of this payload where the last CTC
 * is *last (then set to the MTC's: the next one's *last), changing
 * nothing else */
static inline int ft_mtc_ok(const struct flow_time *t,
                            const struct core_config *c, uint64_t payload,
                            uint64_t *last)
{
    const struct core_time *tm = &t->time;
    if (!t->tcal.have_mtc || t->tcal.cyc_mtc)
        return 0;
    if (tm->have_tsc && !tm->have_tma)
        return 1;
    if (!tm->have_mtc)
        return 0;
    uint64_t ctc = shl64(payload, c->mtc_freq) & 0xffffffffULL;
    if (ctc < *last &&
            ((ctc + shl64(1, c->mtc_freq + 8)) & 0xffffffffULL) < *last)
        return 0;
    *last = ctc;
    return 1;
}

/* ft_update for an MTC where ft_mtc_ok says so (with *last the time's
 * CTC): the same state */
static inline void ft_mtc_quick(struct flow_time *t,
                                const struct core_config *c,
                                uint64_t payload)
{
    struct core_time *tm = &t->time;
    t->tcal.check_skl168 = 0;
    if (tm->have_tsc && !tm->have_tma)
        return;
    uint64_t ctc = shl64(payload, c->mtc_freq) & 0xffffffffULL;
    uint64_t last = tm->ctc;
    if (ctc < last)             /* one wrap (ft_mtc_ok: no more) */
        ctc = (ctc + shl64(1, c->mtc_freq + 8)) & 0xffffffffULL;
    uint64_t delta = ctc - last;
    ctc = shl64(payload, c->mtc_freq) & 0xffffffffULL;
    if (tm->fc || tm->lost_cyc)
        tm->ctc_cyc = ctc;
    tm->fc = 0;
    tm->ctc = ctc;
    tm->lost_cyc = 0;
    if (c->eax && c->ebx) {     /* else ctc_to_fc's ignored config error */
        tm->base += (delta * c->ebx) / c->eax;
        tm->tsc = tm->base;
    }
}

#endif

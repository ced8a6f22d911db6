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

#endif

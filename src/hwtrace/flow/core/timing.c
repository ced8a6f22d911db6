/* Timing: a port of hwtrace.pt.timing (Time, TimeCal) and
 * hwtrace.flow.timing (FlowTime); see timing.h. */
#include "timing.h"

enum { T_OK = 0, T_BAD_PACKET = -E_BAD_PACKET, T_BAD_CONTEXT = -E_BAD_CONTEXT,
       T_BAD_CONFIG = -E_BAD_CONFIG, T_INTERNAL = -E_INTERNAL };

#define FCR_SHIFT 8
#define U32 0xffffffffULL
#define TMA_CTC_BITS 16
#define TMA_CTC_MASK 0xffffULL
#define MTC_BITS 8
#define TSC_BITS 56

static int ctc_delta(uint64_t ctc, uint64_t last, const struct core_config *c,
                     uint64_t *out)
{
    if (ctc < last) {
        ctc = (ctc + shl64(1, c->mtc_freq + MTC_BITS)) & U32;
        if (ctc < last)
            return T_BAD_PACKET;
    }
    *out = ctc - last;
    return T_OK;
}

static int ctc_to_fc(uint64_t ctc, const struct core_config *c, uint64_t *out)
{
    if (!c->eax || !c->ebx)
        return T_BAD_CONFIG;
    *out = (ctc * c->ebx) / c->eax;
    return T_OK;
}

/* -- Time ------------------------------------------------------------------ */

static void tm_reset(struct core_time *t)
{
    memset(t, 0, sizeof *t);
}

static void tm_update_tsc(struct core_time *t, uint64_t tsc)
{
    t->have_tsc = 1;
    t->have_tma = t->have_mtc = 0;
    t->tsc = t->base = tsc;
    t->ctc = 0;
    t->fc = 0;
    t->lost_mtc = t->lost_cyc = 0;
}

static int tm_update_cbr(struct core_time *t, uint64_t ratio)
{
    if (!ratio)
        return T_BAD_PACKET;
    t->have_cbr = 1;
    t->cbr = ratio;
    return T_OK;
}

static int tm_update_tma(struct core_time *t, uint64_t ctc, uint64_t fc,
                         const struct core_config *c)
{
    if (!t->have_tsc || t->have_tma)
        return T_BAD_CONTEXT;
    if (t->have_mtc)
        return T_INTERNAL;
    uint64_t mtc_hi = c->mtc_freq + MTC_BITS;
    uint64_t mask = shl64(1, mtc_hi) - 1;
    t->have_tma = 1;
    t->base -= fc;
    t->fc += fc;
    if (mtc_hi <= TMA_CTC_BITS)
        t->have_mtc = 1;
    t->ctc = t->ctc_cyc = ctc & mask & U32;
    return T_OK;
}

static int tm_update_mtc(struct core_time *t, uint64_t payload,
                         const struct core_config *c)
{
    int have_tsc = t->have_tsc, have_tma = t->have_tma,
        have_mtc = t->have_mtc;
    if (have_tsc && !have_tma)
        return T_OK;
    uint64_t base = t->base, last = t->ctc;
    uint64_t f = c->mtc_freq;
    uint64_t ctc = shl64(payload, f) & U32;
    if (t->fc || t->lost_cyc || !have_mtc)
        t->ctc_cyc = ctc;
    t->have_mtc = 1;
    t->fc = 0;
    t->ctc = ctc;
    t->lost_cyc = 0;
    if (!have_mtc) {
        if (!have_tma)
            return T_OK;
        if (last & ~TMA_CTC_MASK)
            return T_INTERNAL;
        uint64_t lo = ctc & TMA_CTC_MASK, hi = ctc & ~TMA_CTC_MASK & U32;
        if (lo < last) {
            hi = (hi - ((uint64_t)1 << TMA_CTC_BITS)) & U32;
            hi &= shl64(0xff, f) & U32;
        }
        last |= hi;
    }
    uint64_t delta, tsc;
    int r = ctc_delta(ctc, last, c, &delta);
    if (r) {
        t->lost_mtc++;
        return r;
    }
    r = ctc_to_fc(delta, c, &tsc);
    if (r)
        return r;
    base += tsc;
    t->tsc = t->base = base;
    return T_OK;
}

static int tm_adjust_cyc(struct core_time *t, uint64_t *cyc,
                         const struct core_config *c, uint64_t fcr)
{
    uint64_t last = t->ctc_cyc, ctc = t->ctc;
    if (ctc == last)
        return T_OK;
    uint64_t delta, fc;
    int r = ctc_delta(ctc, last, c, &delta);
    if (r)
        return r;
    r = ctc_to_fc(delta, c, &fc);
    if (r)
        return r;
    uint64_t old = (fc << FCR_SHIFT) / fcr;
    if (*cyc < old)
        *cyc = old;
    *cyc -= old;
    return T_OK;
}

static int tm_update_cyc(struct core_time *t, uint64_t cyc,
                         const struct core_config *c, uint64_t fcr)
{
    if (!fcr) {
        t->lost_cyc++;
        return T_OK;
    }
    uint64_t fc = t->fc;
    if (!fc) {
        int r = tm_adjust_cyc(t, &cyc, c, fcr);
        if (r)
            return r;
    }
    fc += (cyc * fcr) >> FCR_SHIFT;
    t->fc = fc;
    t->tsc = t->base + fc;
    return T_OK;
}

/* -- TimeCal ------------------------------------------------------------------ */

static void tc_reset(struct core_tcal *t)
{
    memset(t, 0, sizeof *t);
    t->min_fcr = UINT64_MAX;
}

static int tc_have_fcr(const struct core_tcal *t)
{
    return t->min_fcr <= t->max_fcr;
}

static void tc_set_fcr(struct core_tcal *t, uint64_t fcr)
{
    t->fcr = fcr;
    if (fcr < t->min_fcr)
        t->min_fcr = fcr;
    if (fcr > t->max_fcr)
        t->max_fcr = fcr;
}

static void tc_update_tsc(struct core_tcal *t, uint64_t tsc)
{
    t->tsc = tsc;
    t->cyc_tsc = 0;
}

static int tc_header_tsc(struct core_tcal *t, uint64_t tsc)
{
    uint64_t last = t->tsc, cyc = t->cyc_tsc;
    t->tsc = tsc;
    t->cyc_tsc = 0;
    if (!last || !cyc)
        return T_OK;
    if (t->have_mtc)
        return T_OK;
    if (tsc < last) {
        tsc += (uint64_t)1 << TSC_BITS;
        if (tsc < last)
            return T_BAD_PACKET;
    }
    uint64_t delta = tsc - last;
    if (delta & ~(UINT64_MAX >> FCR_SHIFT))
        return T_INTERNAL;
    tc_set_fcr(t, (delta << FCR_SHIFT) / cyc);
    return T_OK;
}

static int tc_header_cbr(struct core_tcal *t, uint64_t ratio,
                         const struct core_config *c)
{
    uint64_t p1 = c->nom_freq;
    if (!p1)
        return T_OK;
    if (!ratio)
        return T_BAD_PACKET;
    tc_set_fcr(t, (p1 << FCR_SHIFT) / ratio);
    return T_OK;
}

static int tc_update_cbr(struct core_tcal *t, uint64_t ratio,
                         const struct core_config *c)
{
    tc_reset(t);
    return tc_header_cbr(t, ratio, c);
}

static int tc_update_mtc(struct core_tcal *t, uint64_t payload,
                         const struct core_config *c)
{
    uint64_t last = t->ctc, cyc = t->cyc_mtc;
    int have_mtc = t->have_mtc, check = t->check_skl168;
    t->check_skl168 = 0;
    uint64_t ctc = shl64(payload, c->mtc_freq) & U32;
    if (!have_mtc) {
        t->cyc_mtc = 0;
        t->ctc = ctc;
        t->have_mtc = 1;
        return T_OK;
    }
    if (!cyc)
        return T_OK;
    t->have_mtc = 1;
    t->cyc_mtc = 0;
    t->ctc = ctc;
    t->lost_mtc++;
    uint64_t delta, fc;
    int r = ctc_delta(ctc, last, c, &delta);
    if (r)
        return r;
    r = ctc_to_fc(delta, c, &fc);
    if (r)
        return r;
    if (fc & ~(UINT64_MAX >> FCR_SHIFT))
        return T_INTERNAL;
    uint64_t fcr = (fc << FCR_SHIFT) / cyc;
    if (check) {
        /* SKL168: skip this calibration if MTCs were lost or a wrap CYC
         * looks lost */
        if (c->mtc_freq < 64 && ((uint64_t)1 << c->mtc_freq) < delta)
            return T_OK;
        if (c->mtc_freq < 10 && tc_have_fcr(t)) {
            uint64_t dfc = (t->fcr * (cyc + 0xf00)) >> FCR_SHIFT;
            if (dfc < fc)
                return T_OK;
        }
    }
    tc_set_fcr(t, fcr);
    t->lost_mtc = 0;
    return T_OK;
}

static void tc_update_cyc(struct core_tcal *t, uint64_t cyc)
{
    t->cyc_mtc += cyc;
    t->cyc_tsc += cyc;
}

static void tc_update_ovf(struct core_tcal *t)
{
    t->tsc = t->cyc_tsc = t->cyc_mtc = 0;
    t->ctc = 0;
    t->have_mtc = 0;
}

/* -- FlowTime ------------------------------------------------------------------ */

void ft_reset(struct flow_time *t)
{
    tm_reset(&t->time);
    tc_reset(&t->tcal);
    t->m_tsc = t->m_lost_mtc = t->m_lost_cyc = 0;
    t->m_have = 0;
}

/* _check: configuration errors only make timing imprecise */
#define CHECK(x) do { int r_ = (x); \
    if (r_ && r_ != T_BAD_CONFIG) return r_; } while (0)

int ft_update(struct flow_time *t, const struct core_config *c,
              const struct pt_pkt *p, int header)
{
    struct core_time *tm = &t->time;
    struct core_tcal *tc = &t->tcal;
    switch (p->kind) {
    case PT_K_TSC:
        if (header)
            CHECK(tc_header_tsc(tc, p->f[0]));
        else
            tc_update_tsc(tc, p->f[0]);
        tm_update_tsc(tm, p->f[0]);
        break;
    case PT_K_CBR:
        CHECK(header ? tc_header_cbr(tc, p->f[0], c)
                     : tc_update_cbr(tc, p->f[0], c));
        CHECK(tm_update_cbr(tm, p->f[0]));
        break;
    case PT_K_TMA:
        CHECK(tm_update_tma(tm, p->f[0], p->f[1], c));
        break;
    case PT_K_MTC:
        CHECK(tc_update_mtc(tc, p->f[0], c));
        CHECK(tm_update_mtc(tm, p->f[0], c));
        break;
    case PT_K_CYC: {
        tc_update_cyc(tc, p->f[0]);
        uint64_t fcr = tc_have_fcr(tc) ? tc->fcr : 0;
        CHECK(tm_update_cyc(tm, p->f[0], c, fcr));
        break;
    }
    default:
        break;
    }
    return 0;
}

void ft_psb(struct flow_time *t, const struct core_config *c)
{
    if (c->skl168)
        t->tcal.check_skl168 = 1;
}

void ft_overflow(struct flow_time *t, const struct core_config *c)
{
    if (c->keep_tcal)
        tc_update_ovf(&t->tcal);
    else
        tc_reset(&t->tcal);
}

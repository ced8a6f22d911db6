/* The compiled flow core: instruction/block counting and edge coverage over
 * Intel PT packets plus a block cache, for hwtrace.flow.fast.
 *
 *   decode(data, fill, flags, pkt_flags, want_edges)
 *       -> (None, insns, blocks, edges)        decoded exactly
 *       -> (reason, 0, 0, None)                 bailed out: the Python twin
 *                                               must decode this trace
 *
 * It follows hwtrace.flow.query / insn / block / session (the Python twin)
 * step by step for the packets of ordinary traces -- PSB+ (PAD, FUP,
 * MODE.exec, TSC, TMA, MTC, CYC, CBR, MNT), TNT-8/64, TIP, TIP.PGE,
 * TIP.PGD, MODE.exec, TSC, TMA, MTC, CYC, CBR, MNT, PAD, FUP + TIP and
 * FUP + TIP.PGD -- and the events they make (enabled, disabled, exec_mode,
 * cbr, mnt, async_branch, async_disabled, with and without status update;
 * an event bound to an IP ahead of the flow waits until the flow reaches
 * it, as in the twin).  Timing packets change no flow without tick events, but
 * the twin's time tracker can fail on them (a CTC going backwards, a TMA
 * without TSC, ...), so the core keeps the same time state and bails out
 * where the twin would report that error.  Anything else, every decode error and
 * every case where the twin's behaviour has more branches than ported here
 * bails out instead of guessing, so a result, when there is one, is the
 * twin's.
 *
 * Block cache: per (mode, IP) the straight-line run up to the next
 * instruction that is not a plain OTHER (a branch, PTWRITE, or one an
 * event can bind to: far, CPL- or CR3-changing) or to the end of the
 * mapping: instruction count, last IP, class, size, displacement, mapping
 * bounds.  Runs come from ``fill(ip, mode)`` -- the Python instruction
 * cache, so x86 decoding is the twin's -- once per run and decode call.
 * Address space: one per call (PIP bails out), and the cache lives for one
 * call, so an image change between calls is always seen.
 *
 * Edges: for each executed branch instruction (class not OTHER/PTWRITE),
 * (its IP, the IP of the next executed instruction), counted.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../pt/_pt_packets.h"

#define ABI_VERSION 2

#ifndef HWTRACE_SOURCE_SHA256
#define HWTRACE_SOURCE_SHA256 ""
#endif

/* IClass values (hwtrace.x86.insn.IClass) */
enum { C_UNKNOWN = 0, C_OTHER = 1, C_CALL = 2, C_RETURN = 3, C_JUMP = 4,
       C_COND = 5, C_FAR_CALL = 6, C_FAR_RETURN = 7, C_FAR_JUMP = 8,
       C_PTWRITE = 9 };

enum { F_BLOCK = 1, F_END_ON_CALL = 2, F_END_ON_JUMP = 4, F_BDM70 = 8,
       F_SKD022 = 16 };

/* events (the subset) */
enum { EV_ENABLED, EV_DISABLED, EV_EXEC_MODE, EV_CBR, EV_ASYNC_BRANCH,
       EV_ASYNC_DISABLED };

struct event {
    int type;
    int su;             /* status update */
    int ip_supp;
    uint64_t ip;        /* async branch: from; async disabled: at */
    uint64_t to;        /* async branch: to (async disabled: ip) */
    int mode;
};

struct run {
    uint64_t ip, last_ip, lo, hi;
    int64_t rel;
    /* the first two runs executed after this one (run index + 1, 0: none)
     * and, if this one ends with a branch, the edge counts to them */
    uint64_t succ_ip[2], succ_n[2];
    uint32_t succ_run[2];
    uint32_t ninsn;
    uint8_t mode, size, iclass, indirect, special, vmentry;
};

struct edge {
    uint64_t from, to, n;
};

#define MAXEV 64
#define RS_CAP 64

struct dec {
    const uint8_t *buf;
    ptrdiff_t end;
    unsigned pflags, flags;
    jmp_buf bail;
    const char *reason;
    PyObject *fill;

    /* packet cursor */
    ptrdiff_t pos, cpos;     /* cpos: position pkt/pr were decoded at */
    struct pt_pkt pkt;
    int pr;

    /* query state */
    uint64_t lip;
    int have_ip, ip_supp, q_enabled;
    uint64_t tnt_bits, tnt_idx;
    int cur_mode;            /* -1: none */
    int mode_exec_pending;
    int tipq_mode;           /* exec_mode queued for the next TIP*: -1 none */
    int async_q;             /* an async branch (FUP) queued for the TIP* */
    uint64_t async_from;
    struct event psbq[MAXEV];
    int psbq_n;
    int st_pend, st_eos;     /* status flags of the last query */

    /* insn state */
    uint64_t ip;
    int mode, enabled;
    uint64_t rs[RS_CAP];
    int rs_top, rs_n;
    int dis_pending, dis_supp;
    uint64_t dis_ip;
    /* an exec-mode event waiting for the flow to reach its IP (a PSB+
     * whose FUP is ahead of the instruction the last query was for) */
    int ipev_pending;
    struct event ipev;

    /* the events of the current batch */
    struct event ev[MAXEV];
    int ev_n, ev_i;

    /* block cache: runs in a dense array (indices stay valid), found
     * through an open-addressing index of run index + 1 */
    struct run *runs;
    size_t runs_cap, runs_n;
    uint32_t *slots;
    size_t slots_cap;
    int have_prev;           /* prev: the run executed last */
    uint32_t prev;

    /* edges */
    int want_edges;
    struct edge *edges;
    size_t edges_cap, edges_n;

    uint64_t insns, blocks;

    /* timing (hwtrace.pt.timing's Time and TimeCal), kept only to find the
     * timing errors the twin reports; SKL168's check is never armed there
     * (nothing calls TimeCal.update_psb), so it is not here either */
    struct {
        unsigned mtc_freq;
        uint64_t nom_freq, eax, ebx;
    } tcfg;
    struct {
        uint64_t tsc, base, fc, lost_cyc;
        uint32_t ctc, ctc_cyc;
        int have_tsc, have_tma, have_mtc;
    } tm;
    struct {
        uint64_t fcr, min_fcr, max_fcr, tsc, cyc_tsc, cyc_mtc;
        uint32_t ctc;
        int have_mtc;
    } tc;
};

#define BAIL(d, why) do { (d)->reason = (why); longjmp((d)->bail, 1); } while (0)

/* -- packets ------------------------------------------------------------- */

static int peek(struct dec *d)
{
    if (d->cpos != d->pos) {
        d->cpos = d->pos;
        if (d->pos >= d->end)
            d->pr = PT_EOS;
        else
            d->pr = pt_decode_at(d->buf, d->pos, d->end, d->pflags, &d->pkt);
    }
    if (d->pr == PT_EOS)
        return -1;
    if (d->pr < 0)
        BAIL(d, "packet decode error");
    return d->pkt.kind;
}

static void consume(struct dec *d)
{
    d->pos += d->pkt.size;
}

static void update_ip(struct dec *d, const struct pt_pkt *p)
{
    uint64_t ipc = p->f[0], ip = p->f[1];
    switch (ipc) {
    case 0: d->ip_supp = 1; return;
    case 1: d->lip = (d->lip & ~(uint64_t)0xffff) | ip; break;
    case 2: d->lip = (d->lip & ~(uint64_t)0xffffffff) | ip; break;
    case 3: d->lip = (ip & ((uint64_t)1 << 47)) ? (ip | ~(uint64_t)0xffffffffffff)
                                              : ip; break;
    case 4: d->lip = (d->lip & ~(uint64_t)0xffffffffffff) | ip; break;
    case 6: d->lip = ip; break;
    default: BAIL(d, "bad ip compression");
    }
    d->have_ip = 1;
    d->ip_supp = 0;
}

static int query_ip(struct dec *d, uint64_t *ip)
{
    if (!d->have_ip || d->ip_supp)
        return 0;
    *ip = d->lip;
    return 1;
}

/* -- timing (errors only) ------------------------------------------------- *
 * A port of hwtrace.pt.timing (Time, TimeCal) and hwtrace.flow.timing
 * (FlowTime.update): results that are configuration errors are ignored
 * there ("BAD_CONFIG"); every other error is a decode error of the twin, so
 * the core bails out on it. */

enum { T_OK = 0, T_BAD_CONFIG = 1, T_ERROR = 2 };
#define FCR_SHIFT 8
#define U32 0xffffffffULL

static void tc_reset(struct dec *d)
{
    memset(&d->tc, 0, sizeof d->tc);
    d->tc.min_fcr = UINT64_MAX;
}

static int ctc_delta(struct dec *d, uint64_t ctc, uint64_t last, uint64_t *out)
{
    if (ctc < last) {
        ctc = (ctc + ((uint64_t)1 << (d->tcfg.mtc_freq + 8))) & U32;
        if (ctc < last)
            return T_ERROR;
    }
    *out = ctc - last;
    return T_OK;
}

static int ctc_to_fc(struct dec *d, uint64_t ctc, uint64_t *out)
{
    if (!d->tcfg.eax || !d->tcfg.ebx)
        return T_BAD_CONFIG;
    *out = (ctc * d->tcfg.ebx) / d->tcfg.eax;
    return T_OK;
}

static int have_fcr(struct dec *d)
{
    return d->tc.min_fcr <= d->tc.max_fcr;
}

static void set_fcr(struct dec *d, uint64_t fcr)
{
    d->tc.fcr = fcr;
    if (fcr < d->tc.min_fcr)
        d->tc.min_fcr = fcr;
    if (fcr > d->tc.max_fcr)
        d->tc.max_fcr = fcr;
}

static int tc_header_tsc(struct dec *d, uint64_t tsc)
{
    uint64_t last = d->tc.tsc, cyc = d->tc.cyc_tsc;
    d->tc.tsc = tsc;
    d->tc.cyc_tsc = 0;
    if (!last || !cyc || d->tc.have_mtc)
        return T_OK;
    if (tsc < last) {
        tsc += (uint64_t)1 << 56;       /* TSC payloads have 56 bits */
        if (tsc < last)
            return T_ERROR;
    }
    uint64_t delta = tsc - last;
    if (delta & ~(UINT64_MAX >> FCR_SHIFT))
        return T_ERROR;
    set_fcr(d, (delta << FCR_SHIFT) / cyc);
    return T_OK;
}

static int tc_header_cbr(struct dec *d, uint64_t ratio)
{
    if (!d->tcfg.nom_freq)
        return T_OK;
    if (!ratio)
        return T_ERROR;
    set_fcr(d, (d->tcfg.nom_freq << FCR_SHIFT) / ratio);
    return T_OK;
}

static int tc_update_mtc(struct dec *d, uint64_t payload)
{
    uint64_t last = d->tc.ctc, cyc = d->tc.cyc_mtc;
    uint64_t ctc = (payload << d->tcfg.mtc_freq) & U32;
    if (!d->tc.have_mtc) {
        d->tc.cyc_mtc = 0;
        d->tc.ctc = (uint32_t)ctc;
        d->tc.have_mtc = 1;
        return T_OK;
    }
    if (!cyc)
        return T_OK;
    d->tc.cyc_mtc = 0;
    d->tc.ctc = (uint32_t)ctc;
    uint64_t delta, fc;
    if (ctc_delta(d, ctc, last, &delta))
        return T_ERROR;
    int r = ctc_to_fc(d, delta, &fc);
    if (r)
        return r;
    if (fc & ~(UINT64_MAX >> FCR_SHIFT))
        return T_ERROR;
    set_fcr(d, (fc << FCR_SHIFT) / cyc);
    return T_OK;
}

static int tm_update_tma(struct dec *d, uint64_t ctc, uint64_t fc)
{
    if (!d->tm.have_tsc || d->tm.have_tma)
        return T_ERROR;
    if (d->tm.have_mtc)
        return T_ERROR;
    unsigned hi = d->tcfg.mtc_freq + 8;
    uint64_t mask = ((uint64_t)1 << hi) - 1;
    d->tm.have_tma = 1;
    d->tm.base -= fc;
    d->tm.fc += fc;
    if (hi <= 16)
        d->tm.have_mtc = 1;
    d->tm.ctc = d->tm.ctc_cyc = (uint32_t)(ctc & mask & U32);
    return T_OK;
}

static int tm_update_mtc(struct dec *d, uint64_t payload)
{
    int have_tsc = d->tm.have_tsc, have_tma = d->tm.have_tma,
        have_mtc = d->tm.have_mtc;
    if (have_tsc && !have_tma)
        return T_OK;
    uint64_t base = d->tm.base, last = d->tm.ctc;
    unsigned f = d->tcfg.mtc_freq;
    uint64_t ctc = (payload << f) & U32;
    if (d->tm.fc || d->tm.lost_cyc || !have_mtc)
        d->tm.ctc_cyc = (uint32_t)ctc;
    d->tm.have_mtc = 1;
    d->tm.fc = 0;
    d->tm.ctc = (uint32_t)ctc;
    d->tm.lost_cyc = 0;
    if (!have_mtc) {
        if (!have_tma)
            return T_OK;
        if (last & ~(uint64_t)0xffff)
            return T_ERROR;
        uint64_t lo = ctc & 0xffff, hi = ctc & ~(uint64_t)0xffff & U32;
        if (lo < last) {
            hi = (hi - ((uint64_t)1 << 16)) & U32;
            hi &= ((uint64_t)0xff << f) & U32;
        }
        last |= hi;
    }
    uint64_t delta, tsc;
    if (ctc_delta(d, ctc, last, &delta))
        return T_ERROR;
    int r = ctc_to_fc(d, delta, &tsc);
    if (r)
        return r;
    d->tm.tsc = d->tm.base = base + tsc;
    return T_OK;
}

static int tm_update_cyc(struct dec *d, uint64_t cyc, uint64_t fcr)
{
    if (!fcr) {
        d->tm.lost_cyc++;
        return T_OK;
    }
    uint64_t fc = d->tm.fc;
    if (!fc && d->tm.ctc != d->tm.ctc_cyc) {
        /* _adjust_cyc */
        uint64_t delta, f;
        if (ctc_delta(d, d->tm.ctc, d->tm.ctc_cyc, &delta))
            return T_ERROR;
        int r = ctc_to_fc(d, delta, &f);
        if (r)
            return r;
        uint64_t old = (f << FCR_SHIFT) / fcr;
        if (cyc < old)
            cyc = old;
        cyc -= old;
    }
    fc += (cyc * fcr) >> FCR_SHIFT;
    d->tm.fc = fc;
    d->tm.tsc = d->tm.base + fc;
    return T_OK;
}

static void tcheck(struct dec *d, int r)
{
    if (r == T_ERROR)
        BAIL(d, "timing error");
}

/* FlowTime.update for the packet in d->pkt */
static void time_update(struct dec *d, int header)
{
    const struct pt_pkt *p = &d->pkt;
    switch (p->kind) {
    case PT_K_TSC:
        if (header) {
            tcheck(d, tc_header_tsc(d, p->f[0]));
        } else {
            d->tc.tsc = p->f[0];
            d->tc.cyc_tsc = 0;
        }
        d->tm.have_tsc = 1;
        d->tm.have_tma = d->tm.have_mtc = 0;
        d->tm.tsc = d->tm.base = p->f[0];
        d->tm.ctc = 0;
        d->tm.fc = 0;
        d->tm.lost_cyc = 0;
        break;
    case PT_K_CBR:
        if (!header)
            tc_reset(d);
        tcheck(d, tc_header_cbr(d, p->f[0]));
        if (!p->f[0])
            BAIL(d, "CBR 0");
        break;
    case PT_K_TMA:
        tcheck(d, tm_update_tma(d, p->f[0], p->f[1]));
        break;
    case PT_K_MTC:
        tcheck(d, tc_update_mtc(d, p->f[0]));
        tcheck(d, tm_update_mtc(d, p->f[0]));
        break;
    case PT_K_CYC: {
        d->tc.cyc_mtc += p->f[0];
        d->tc.cyc_tsc += p->f[0];
        uint64_t fcr = have_fcr(d) ? d->tc.fcr : 0;
        tcheck(d, tm_update_cyc(d, p->f[0], fcr));
        break;
    }
    default:
        BAIL(d, "internal: not a timing packet");
    }
}

static int exec_mode_of(struct dec *d, const struct pt_pkt *p)
{
    /* f: csl, csd, iflag;  (csl, csd): (0,0) 16, (0,1) 32, (1,0) 64 */
    int csl = p->f[0] & 1, csd = p->f[1] & 1;
    if (csl && csd)
        BAIL(d, "reserved exec mode");
    return csl ? 2 : csd ? 1 : 0;
}

static int is_event_kind(int k)
{
    switch (k) {
    case PT_K_TIP_PGE: case PT_K_TIP_PGD: case PT_K_OVF: case PT_K_PIP:
    case PT_K_STOP: case PT_K_VMCS: case PT_K_MNT: case PT_K_EXSTOP:
    case PT_K_MWAIT: case PT_K_PWRE: case PT_K_PWRX: case PT_K_PTW:
    case PT_K_CBR: case PT_K_CFE: case PT_K_EVD: case PT_K_TRIG:
        return 1;
    }
    return 0;
}

/* _will_event for the packet at pos (-1: end of trace) */
static int will_event(struct dec *d, int k)
{
    if (k < 0)
        return 0;
    if (is_event_kind(k))
        return 1;
    if (k == PT_K_PSBEND)
        return d->psbq_n > 0;
    if (k == PT_K_TIP)
        return d->tipq_mode >= 0 || d->async_q;
    return 0;
}

static void set_flags(struct dec *d)
{
    d->st_pend = d->st_eos = 0;
    if (d->tnt_idx)
        return;
    int k = peek(d);
    if (k < 0)
        d->st_eos = 1;
    else
        d->st_pend = will_event(d, k);
}

static int bdm70(struct dec *d, ptrdiff_t pos)
{
    struct pt_pkt p;
    for (;;) {
        if (pos >= d->end)
            return 0;
        int r = pt_decode_at(d->buf, pos, d->end, d->pflags, &p);
        if (r < 0)
            return 0;
        switch (p.kind) {
        case PT_K_TIP_PGE:
            return 1;
        case PT_K_PAD: case PT_K_TSC: case PT_K_CBR: case PT_K_PSBEND:
        case PT_K_PIP: case PT_K_MODE_EXEC: case PT_K_MODE_TSX:
        case PT_K_VMCS: case PT_K_TMA: case PT_K_MTC: case PT_K_CYC:
        case PT_K_MNT:
            break;
        default:
            return 0;
        }
        pos += p.size;
    }
}

/* PSB+: pos at the PSB; leaves pos at the PSBEND with its events queued. */
static void psb_header(struct dec *d)
{
    if (d->psbq_n || d->tipq_mode >= 0 || d->async_q)
        BAIL(d, "PSB with events pending");
    if (peek(d) != PT_K_PSB)
        BAIL(d, "no PSB");
    consume(d);
    d->lip = 0;
    d->have_ip = d->ip_supp = 0;
    d->q_enabled = 0;
    d->psbq_n = 1;           /* the enabled/disabled status, filled in below */
    for (;;) {
        int k = peek(d);
        if (k < 0)
            BAIL(d, "end of trace in PSB+");
        if (k == PT_K_PSBEND)
            break;
        struct pt_pkt *p = &d->pkt;
        struct event *ev;
        switch (k) {
        case PT_K_PAD:
            break;
        case PT_K_TSC: case PT_K_TMA: case PT_K_MTC: case PT_K_CYC:
            time_update(d, 1);
            break;
        case PT_K_MNT:
            /* not a status update; binds at once and changes nothing */
            if (d->psbq_n >= MAXEV)
                BAIL(d, "too many PSB+ events");
            ev = &d->psbq[d->psbq_n++];
            memset(ev, 0, sizeof *ev);
            ev->type = EV_CBR;
            break;
        case PT_K_FUP: {
            int enabled = p->f[0] != 0;
            if (enabled && (d->flags & F_BDM70) && bdm70(d, d->pos + p->size))
                enabled = 0;
            d->q_enabled = enabled;
            if (enabled)
                update_ip(d, p);
            break;
        }
        case PT_K_MODE_EXEC:
            if (d->psbq_n >= MAXEV)
                BAIL(d, "too many PSB+ events");
            d->cur_mode = exec_mode_of(d, p);
            ev = &d->psbq[d->psbq_n++];
            memset(ev, 0, sizeof *ev);
            ev->type = EV_EXEC_MODE;
            ev->su = 1;
            ev->mode = d->cur_mode;
            break;
        case PT_K_CBR:
            time_update(d, 1);
            if (d->psbq_n >= MAXEV)
                BAIL(d, "too many PSB+ events");
            ev = &d->psbq[d->psbq_n++];
            memset(ev, 0, sizeof *ev);
            ev->type = EV_CBR;
            ev->su = 1;
            break;
        default:
            BAIL(d, "unsupported packet in PSB+");
        }
        consume(d);
    }
    struct event *first = &d->psbq[0];
    memset(first, 0, sizeof *first);
    first->su = 1;
    first->type = d->q_enabled ? EV_ENABLED : EV_DISABLED;
    first->ip_supp = !d->q_enabled;
}

/* Decode status packets up to the next branch or event packet. */
static void read_ahead(struct dec *d)
{
    for (;;) {
        int k = peek(d);
        if (k < 0)
            return;
        switch (k) {
        case PT_K_TIP: case PT_K_TNT8: case PT_K_TNT64:
            return;
        case PT_K_PAD:
            consume(d);
            continue;
        case PT_K_TSC: case PT_K_TMA: case PT_K_MTC: case PT_K_CYC:
            time_update(d, 0);
            consume(d);
            continue;
        case PT_K_PSB:
            psb_header(d);
            continue;
        case PT_K_FUP: {
            /* _dec_fup outside PSB+: an asynchronous branch from the
             * FUP's IP, bound to the next TIP/TIP.PGD.  (After a MODE.EXEC
             * the twin takes it for a mode/iflags change: not ported.) */
            uint64_t from;
            if (d->mode_exec_pending || d->async_q)
                BAIL(d, "FUP after MODE.EXEC");
            update_ip(d, &d->pkt);
            if (!query_ip(d, &from))
                BAIL(d, "FUP without IP");
            d->async_q = 1;
            d->async_from = from;
            consume(d);
            continue;
        }
        case PT_K_MODE_EXEC: {
            int mode = exec_mode_of(d, &d->pkt);
            if (mode != d->cur_mode) {
                if (d->tipq_mode >= 0)
                    BAIL(d, "two exec modes queued");
                d->tipq_mode = mode;
                d->cur_mode = mode;
            }
            d->mode_exec_pending = 1;
            consume(d);
            continue;
        }
        default:
            if (will_event(d, k))
                return;
            BAIL(d, "unsupported packet");
        }
    }
}

static void tnt_fill(struct dec *d)
{
    uint64_t n = d->pkt.f[0];
    if (d->tnt_idx)
        BAIL(d, "TNT cache not empty");
    d->tnt_bits = d->pkt.f[1];
    d->tnt_idx = n ? (uint64_t)1 << (n - 1) : 0;
}

/* 1 taken, 0 not taken, -1 no TNT here (next is a TIP or an event) */
static int cond_branch(struct dec *d)
{
    if (!d->tnt_idx) {
        int k = peek(d);
        if (k < 0)
            BAIL(d, "end of trace at a conditional branch");
        if (will_event(d, k) || k == PT_K_TIP)
            return -1;
        if (k != PT_K_TNT8 && k != PT_K_TNT64)
            BAIL(d, "unexpected packet");
        tnt_fill(d);
        consume(d);
        read_ahead(d);
        if (!d->tnt_idx)
            BAIL(d, "empty TNT");
    }
    int taken = (d->tnt_bits & d->tnt_idx) != 0;
    d->tnt_idx >>= 1;
    set_flags(d);
    return taken;
}

static uint64_t indirect_branch(struct dec *d)
{
    for (;;) {
        int k = peek(d);
        if (k < 0)
            BAIL(d, "end of trace at an indirect branch");
        if (will_event(d, k))
            BAIL(d, "event at an indirect branch");
        if (k == PT_K_TNT8 || k == PT_K_TNT64) {
            if (d->tnt_idx)
                BAIL(d, "TNT at an indirect branch");
            tnt_fill(d);
            consume(d);
            read_ahead(d);
            continue;
        }
        if (k != PT_K_TIP)
            BAIL(d, "unexpected packet");
        d->mode_exec_pending = 0;
        update_ip(d, &d->pkt);
        consume(d);
        uint64_t target;
        if (!query_ip(d, &target))
            BAIL(d, "suppressed TIP");
        read_ahead(d);
        set_flags(d);
        return target;
    }
}

/* The events of the event packet at pos (status said one is pending). */
static void fetch_batch(struct dec *d)
{
    int k = peek(d);
    struct event *ev = d->ev;
    d->ev_n = d->ev_i = 0;
    struct pt_pkt *p = &d->pkt;
    uint64_t ip;
    switch (k) {
    case PT_K_TIP:
        /* _dec_tip with an async branch queued: it, then an exec mode */
        if (!d->async_q)
            BAIL(d, "exec mode bound to a TIP");
        d->mode_exec_pending = 0;
        update_ip(d, p);
        if (!query_ip(d, &ip))
            BAIL(d, "async branch to a suppressed IP");
        memset(ev, 0, sizeof *ev);
        ev->type = EV_ASYNC_BRANCH;
        ev->ip = d->async_from;
        ev->to = ip;
        d->async_q = 0;
        d->ev_n = 1;
        if (d->tipq_mode >= 0) {
            memset(ev + 1, 0, sizeof *ev);
            ev[1].type = EV_EXEC_MODE;
            ev[1].ip = ip;
            ev[1].mode = d->tipq_mode;
            d->tipq_mode = -1;
            d->ev_n = 2;
        }
        break;
    case PT_K_TIP_PGE:
        if (d->async_q)
            BAIL(d, "TIP.PGE with an async branch queued");
        d->mode_exec_pending = 0;
        update_ip(d, p);
        if (!query_ip(d, &ip))
            BAIL(d, "TIP.PGE without IP");
        memset(ev, 0, sizeof *ev);
        ev->type = EV_ENABLED;
        ev->ip = ip;
        d->ev_n = 1;
        if (d->tipq_mode >= 0) {
            memset(ev + 1, 0, sizeof *ev);
            ev[1].type = EV_EXEC_MODE;
            ev[1].ip = ip;
            ev[1].mode = d->tipq_mode;
            d->tipq_mode = -1;
            d->ev_n = 2;
        }
        d->tnt_idx = 0;
        d->q_enabled = 1;
        break;
    case PT_K_TIP_PGD:
        d->mode_exec_pending = 0;
        update_ip(d, p);
        if (d->tipq_mode >= 0)
            BAIL(d, "exec mode bound to TIP.PGD");
        memset(ev, 0, sizeof *ev);
        if (d->async_q) {
            /* FUP + TIP.PGD: disabled at the FUP's IP */
            ev->type = EV_ASYNC_DISABLED;
            ev->ip = d->async_from;
            ev->ip_supp = !query_ip(d, &ev->to);
            d->async_q = 0;
        } else {
            ev->type = EV_DISABLED;
            ev->ip_supp = !query_ip(d, &ev->ip);
        }
        d->ev_n = 1;
        d->q_enabled = 0;
        break;
    case PT_K_CBR:
        time_update(d, 0);
        /* fall through: like MNT, an event that changes no flow */
    case PT_K_MNT:
        memset(ev, 0, sizeof *ev);
        ev->type = EV_CBR;
        d->ev_n = 1;
        break;
    case PT_K_PSBEND:
        if (!d->psbq_n)
            BAIL(d, "internal: PSBEND without events");
        memcpy(ev, d->psbq, d->psbq_n * sizeof *ev);
        d->ev_n = d->psbq_n;
        d->psbq_n = 0;
        /* finish_psbend_event: enabled/exec_mode get the header's IP */
        for (int i = 0; i < d->ev_n; i++)
            if (ev[i].type == EV_ENABLED || ev[i].type == EV_EXEC_MODE) {
                ev[i].ip_supp = !query_ip(d, &ev[i].ip);
            }
        break;
    default:
        BAIL(d, "unsupported event");
    }
    consume(d);
    read_ahead(d);
    set_flags(d);
}

/* _check_ip_event: does the current event apply now?  (The port handles
 * only events that do; a disable waits for its instruction.) */
static uint32_t lookup(struct dec *d, uint64_t ip, int mode);

static int binds_now(struct dec *d, const struct event *ev)
{
    switch (ev->type) {
    case EV_DISABLED:
        return ev->su;
    case EV_EXEC_MODE:
        /* the twin's _check_ip_event: it waits for its IP */
        return ev->ip_supp || ev->ip == d->ip || !d->enabled;
    case EV_ASYNC_BRANCH:
        return ev->ip == d->ip;
    case EV_ASYNC_DISABLED:
        if (ev->ip != d->ip)
            return 0;
        /* _skd022: at a VMLAUNCH/VMRESUME the twin turns it into a
         * disable bound to that instruction (not ported) */
        if ((d->flags & F_SKD022) && d->runs[lookup(d, d->ip, d->mode)].vmentry)
            BAIL(d, "SKD022 at an async disable");
        return 1;
    default:
        return 1;
    }
}

static void process(struct dec *d, const struct event *ev)
{
    switch (ev->type) {
    case EV_ENABLED:
        if (ev->su) {
            if (!d->enabled)
                BAIL(d, "bad status update (enabled)");
            return;
        }
        if (d->enabled)
            BAIL(d, "enabled while enabled");
        d->ip = ev->ip;
        d->enabled = 1;
        return;
    case EV_DISABLED:
        if (ev->su) {
            if (d->enabled)
                BAIL(d, "bad status update (disabled)");
            return;
        }
        if (!d->enabled)
            BAIL(d, "disabled while disabled");
        d->enabled = 0;
        return;
    case EV_ASYNC_BRANCH:
        if (ev->su || !d->enabled)
            BAIL(d, "async branch while disabled");
        d->ip = ev->to;
        return;
    case EV_ASYNC_DISABLED:
        if (!d->enabled)
            BAIL(d, "async disable while disabled");
        d->enabled = 0;
        return;
    case EV_EXEC_MODE:
        if (ev->su && d->enabled && d->mode >= 0 && d->mode != ev->mode)
            BAIL(d, "bad status update (exec mode)");
        d->mode = ev->mode;
        return;
    default:
        return;
    }
}

/* An exec-mode event that binds later, at its IP: the twin decodes on
 * (queries included) and checks the IP after each instruction.  Only the
 * simple case is ported: it is the last event there is for now. */
static void wait_for_ip(struct dec *d, const struct event *ev)
{
    (void)ev;
    if (d->st_pend || d->dis_pending || d->ipev_pending)
        BAIL(d, "event waiting for its IP with more events");
    d->ipev = d->ev[d->ev_i];       /* it stays current (ev_i) */
    d->ipev_pending = 1;
}

/* Process events from the current batch on (the first one is known to
 * bind now), fetching more batches while the status says so.  A disable
 * that waits for its instruction stops the drain. */
static void drain(struct dec *d)
{
    for (;;) {
        while (d->ev_i < d->ev_n) {
            struct event *ev = &d->ev[d->ev_i];
            if (!binds_now(d, ev)) {
                if (ev->type == EV_EXEC_MODE || ev->type == EV_ASYNC_BRANCH ||
                    ev->type == EV_ASYNC_DISABLED) {
                    wait_for_ip(d, ev);
                    return;
                }
                if (ev->type != EV_DISABLED || d->ev_i + 1 != d->ev_n)
                    BAIL(d, "internal: unbound event");
                d->dis_pending = 1;
                d->dis_supp = ev->ip_supp;
                d->dis_ip = ev->ip;
                d->ev_i++;
                return;
            }
            process(d, ev);
            d->ev_i++;
        }
        if (!d->st_pend)
            return;
        fetch_batch(d);
    }
}

/* -- block cache ------------------------------------------------------------ */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static void slots_grow(struct dec *d)
{
    size_t cap = d->slots_cap * 2;
    uint32_t *ns = calloc(cap, sizeof *ns);
    if (!ns)
        BAIL(d, "out of memory");
    for (size_t j = 0; j < d->runs_n; j++) {
        struct run *r = &d->runs[j];
        size_t i = mix(r->ip * 4 + r->mode) & (cap - 1);
        while (ns[i])
            i = (i + 1) & (cap - 1);
        ns[i] = (uint32_t)j + 1;
    }
    free(d->slots);
    d->slots = ns;
    d->slots_cap = cap;
}

/* The index of the run at (ip, mode), decoded by fill() on a miss. */
static uint32_t lookup(struct dec *d, uint64_t ip, int mode)
{
    if (mode < 0)
        BAIL(d, "unknown exec mode");
    size_t mask = d->slots_cap - 1;
    size_t i = mix(ip * 4 + mode) & mask;
    for (;;) {
        uint32_t k = d->slots[i];
        if (!k)
            break;
        struct run *r = &d->runs[k - 1];
        if (r->ip == ip && r->mode == mode)
            return k - 1;
        i = (i + 1) & mask;
    }
    /* a miss: the Python twin decodes the run */
    PyObject *t = PyObject_CallFunction(d->fill, "Ki", (unsigned long long)ip,
                                        mode);
    if (!t)
        BAIL(d, NULL);
    if (t == Py_None) {
        Py_DECREF(t);
        BAIL(d, "instruction fetch/decode error");
    }
    unsigned long long n, last, lo, hi;
    long long rel;
    int size, iclass, indirect, special, vmentry;
    if (!PyArg_ParseTuple(t, "KKiiiLiKKi", &n, &last, &size, &iclass,
                          &indirect, &rel, &special, &lo, &hi, &vmentry)) {
        Py_DECREF(t);
        BAIL(d, NULL);
    }
    Py_DECREF(t);
    if (d->runs_n == d->runs_cap) {
        size_t cap = d->runs_cap * 2;
        struct run *nr = realloc(d->runs, cap * sizeof *nr);
        if (!nr || cap > UINT32_MAX / 2)
            BAIL(d, "out of memory");
        d->runs = nr;
        d->runs_cap = cap;
    }
    uint32_t idx = (uint32_t)d->runs_n++;
    struct run *r = &d->runs[idx];
    memset(r, 0, sizeof *r);
    r->ip = ip;
    r->mode = (uint8_t)mode;
    r->ninsn = (uint32_t)n;
    r->last_ip = last;
    r->size = (uint8_t)size;
    r->iclass = (uint8_t)iclass;
    r->indirect = (uint8_t)indirect;
    r->special = (uint8_t)special;
    r->vmentry = (uint8_t)vmentry;
    r->rel = rel;
    r->lo = lo;
    r->hi = hi;
    d->slots[i] = idx + 1;
    if (2 * d->runs_n > d->slots_cap)
        slots_grow(d);
    return idx;
}

static int is_branch(int c);
static void add_edge(struct dec *d, uint64_t from, uint64_t to, uint64_t n);

/* The run at the current IP, executed after run d->prev (if any): the
 * previous run remembers its first two successors, so the hot path needs
 * no hash lookup; the edge from its branch is counted there. */
static uint32_t next_run(struct dec *d)
{
    uint64_t ip = d->ip;
    if (!d->have_prev) {
        d->have_prev = 1;
        return d->prev = lookup(d, ip, d->mode);
    }
    struct run *p = &d->runs[d->prev];
    int edge = d->want_edges && is_branch(p->iclass);
    for (int i = 0; i < 2; i++) {
        uint32_t k = p->succ_run[i];
        if (k && p->succ_ip[i] == ip && d->runs[k - 1].mode == d->mode) {
            p->succ_n[i] += edge;
            return d->prev = k - 1;
        }
    }
    uint32_t idx = lookup(d, ip, d->mode);
    p = &d->runs[d->prev];           /* lookup may have moved the runs */
    for (int i = 0; i < 2; i++) {
        if (!p->succ_run[i]) {
            p->succ_run[i] = idx + 1;
            p->succ_ip[i] = ip;
            p->succ_n[i] = edge;
            return d->prev = idx;
        }
    }
    if (edge)
        add_edge(d, p->last_ip, ip, 1);
    return d->prev = idx;
}

/* -- edges --------------------------------------------------------------- */

static void edges_grow(struct dec *d)
{
    size_t cap = d->edges_cap * 2;
    struct edge *ne = calloc(cap, sizeof *ne);
    if (!ne)
        BAIL(d, "out of memory");
    for (size_t j = 0; j < d->edges_cap; j++) {
        struct edge *e = &d->edges[j];
        if (!e->n)
            continue;
        size_t i = mix(e->from ^ mix(e->to)) & (cap - 1);
        while (ne[i].n)
            i = (i + 1) & (cap - 1);
        ne[i] = *e;
    }
    free(d->edges);
    d->edges = ne;
    d->edges_cap = cap;
}

static void add_edge(struct dec *d, uint64_t from, uint64_t to, uint64_t n)
{
    size_t mask = d->edges_cap - 1;
    size_t i = mix(from ^ mix(to)) & mask;
    for (;;) {
        struct edge *e = &d->edges[i];
        if (!e->n) {
            e->from = from;
            e->to = to;
            e->n = n;
            if (2 * ++d->edges_n > d->edges_cap)
                edges_grow(d);
            return;
        }
        if (e->from == from && e->to == to) {
            e->n += n;
            return;
        }
        i = (i + 1) & mask;
    }
}

static void flush_edges(struct dec *d)
{
    for (size_t j = 0; j < d->runs_n; j++) {
        struct run *r = &d->runs[j];
        for (int i = 0; i < 2; i++)
            if (r->succ_n[i])
                add_edge(d, r->last_ip, r->succ_ip[i], r->succ_n[i]);
    }
}

/* -- the flow ------------------------------------------------------------- */

static void rs_push(struct dec *d, uint64_t ip)
{
    d->rs_top = (d->rs_top + 1) % RS_CAP;
    d->rs[d->rs_top] = ip;
    if (d->rs_n < RS_CAP)
        d->rs_n++;
}

static uint64_t rs_pop(struct dec *d)
{
    if (!d->rs_n)
        BAIL(d, "return stack empty");
    uint64_t ip = d->rs[d->rs_top];
    d->rs_top = (d->rs_top + RS_CAP - 1) % RS_CAP;
    d->rs_n--;
    return ip;
}

static int is_branch(int c)
{
    return c != C_OTHER && c != C_PTWRITE;
}

/* _at_disabled_event for the run's last instruction (the others are plain
 * OTHER instructions a disable never binds to). */
static int disable_binds(struct dec *d, const struct run *r)
{
    int c = r->iclass;
    if (d->dis_supp) {
        if (r->special)
            return 1;
        if ((d->flags & F_BLOCK) && (r->indirect || c == C_COND))
            return 1;
        return 0;
    }
    if (c == C_OTHER || c == C_PTWRITE)
        return 0;
    if ((c == C_CALL || c == C_JUMP) && !r->indirect)
        return r->last_ip + r->size + r->rel == d->dis_ip;
    if (c == C_UNKNOWN)
        BAIL(d, "bad instruction");
    return 1;
}

static uint64_t next_ip_after(const struct run *r)
{
    int c = r->iclass;
    uint64_t fall = r->last_ip + r->size;
    if (c == C_OTHER || c == C_PTWRITE)
        return fall;
    if ((c == C_CALL || c == C_JUMP) && !r->indirect)
        return fall + r->rel;
    if (c == C_CALL || c == C_FAR_CALL)
        return fall;
    return 0;
}

/* One block (block mode) or one stretch of instructions up to the next
 * event / end (insn mode: then "blocks" are not counted by the caller). */
static void one_block(struct dec *d)
{
    uint64_t lo = 0, hi = 0, n = 0;
    int have_bounds = 0;
    d->blocks++;
    for (;;) {
        uint32_t ri = next_run(d);          /* may move d->runs */
        struct run *r = &d->runs[ri];
        /* Every query ends this loop, so n counts instructions without
         * trace.  Past libipt's block limit (a uint16_t count) the Python
         * decoders split the block and watch for a loop that never reads
         * trace again (``jmp $``): theirs to do, not this core's. */
        n += r->ninsn;
        if (n > 0xFFFF)
            BAIL(d, "long stretch without trace");
        if (!have_bounds) {
            lo = r->lo;
            hi = r->hi;
            have_bounds = 1;
        }
        int c = r->iclass;
        if (d->ipev_pending && r->ip < d->ipev.ip && d->ipev.ip <= r->last_ip)
            BAIL(d, "event IP inside a run");
        if (d->dis_pending && disable_binds(d, r)) {
            d->insns += r->ninsn;
            d->ip = next_ip_after(r);
            d->dis_pending = 0;
            d->enabled = 0;
            drain(d);       /* the events after the disable */
            return;
        }
        d->insns += r->ninsn;
        uint64_t fall = r->last_ip + r->size;
        int queried = 0;
        switch (c) {
        case C_OTHER: case C_PTWRITE:
            d->ip = fall;
            break;
        case C_COND:
            if (d->dis_pending)
                BAIL(d, "query with a disable pending");
            queried = 1;
            switch (cond_branch(d)) {
            case 1: d->ip = fall + r->rel; break;
            case 0: d->ip = fall; break;
            default: BAIL(d, "conditional branch without TNT");
            }
            break;
        case C_RETURN:
            if (d->dis_pending)
                BAIL(d, "query with a disable pending");
            queried = 1;
            {
                int t = cond_branch(d);
                if (t == 0)
                    BAIL(d, "bad return compression");
                if (t == 1) {
                    d->ip = rs_pop(d);
                    break;
                }
            }
            if (!r->indirect)
                d->ip = fall + r->rel;
            else
                d->ip = indirect_branch(d);
            break;
        case C_UNKNOWN:
            BAIL(d, "bad instruction");
        default:
            if (c == C_CALL && (r->rel || r->indirect))
                rs_push(d, fall);
            if (!r->indirect) {
                d->ip = fall + r->rel;
            } else {
                if (d->dis_pending)
                    BAIL(d, "query with a disable pending");
                queried = 1;
                d->ip = indirect_branch(d);
            }
        }
        if (d->ipev_pending) {
            if (d->st_pend || d->st_eos || d->dis_pending)
                BAIL(d, "events while one waits for its IP");
            if (binds_now(d, &d->ipev)) {
                /* it binds here: the block ends, the events are drained */
                d->ipev_pending = 0;
                drain(d);
                return;
            }
        }
        if (queried) {
            if (d->st_pend) {
                fetch_batch(d);
                if (binds_now(d, &d->ev[0])) {
                    drain(d);
                    return;
                }
                if (d->ev[0].type != EV_DISABLED) {
                    /* an event waiting for its IP */
                    wait_for_ip(d, &d->ev[0]);
                    goto next;
                }
                /* a disable that waits for its instruction */
                if (d->ev_n != 1)
                    BAIL(d, "internal: unbound event");
                d->dis_pending = 1;
                d->dis_supp = d->ev[0].ip_supp;
                d->dis_ip = d->ev[0].ip;
                d->ev_i = 1;
            } else if (d->st_eos) {
                return;
            }
        }
    next:
        r = &d->runs[ri];           /* binds_now's lookup may move runs */
        if (is_branch(c) || c == C_PTWRITE) {
            if (c == C_CALL && !r->indirect) {
                if (d->flags & F_END_ON_CALL)
                    return;
            } else if (c == C_JUMP && !r->indirect) {
                if (d->flags & F_END_ON_JUMP)
                    return;
            } else {
                return;
            }
        }
        if (!(lo <= d->ip && d->ip < hi))
            return;
    }
}

static void run_all(struct dec *d)
{
    ptrdiff_t psb = pt_find_psb(d->buf, d->end, 0);
    if (psb < 0)
        return;
    d->pos = psb;
    psb_header(d);
    uint64_t ip;
    if (query_ip(d, &ip)) {
        d->ip = ip;
        d->enabled = 1;
    }
    read_ahead(d);
    set_flags(d);
    if (!d->st_pend)
        BAIL(d, "internal: no PSB+ events");
    fetch_batch(d);
    if (!binds_now(d, &d->ev[0]))
        BAIL(d, "internal: PSB+ event does not bind");
    drain(d);
    for (;;) {
        /* the session loop: events are drained; end, or the next block */
        if (d->st_eos && !d->dis_pending && !d->ipev_pending &&
            d->ev_i >= d->ev_n)
            return;
        if (!d->enabled)
            BAIL(d, "no tracing enabled and no event");
        one_block(d);
    }
}

/* -- Python boundary ---------------------------------------------------- */

static PyObject *py_decode(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *fill;
    unsigned int flags, pflags;
    int want_edges;
    unsigned int mtc_freq = 0;
    unsigned long long nom_freq = 0, eax = 0, ebx = 0;
    if (!PyArg_ParseTuple(args, "y*OIIp|(IKKK)", &view, &fill, &flags,
                          &pflags, &want_edges, &mtc_freq, &nom_freq, &eax,
                          &ebx))
        return NULL;
    if (mtc_freq > 15 || nom_freq > UINT32_MAX || eax > UINT32_MAX ||
        ebx > UINT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "timing parameter out of range");
        return NULL;
    }
    struct dec *d = calloc(1, sizeof *d);
    if (!d) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    d->buf = view.buf;
    d->end = view.len;
    d->flags = flags;
    d->pflags = pflags;
    d->fill = fill;
    d->cpos = -1;
    d->cur_mode = -1;
    d->tipq_mode = -1;
    d->mode = -1;
    d->want_edges = want_edges;
    d->tcfg.mtc_freq = mtc_freq;
    d->tcfg.nom_freq = nom_freq;
    d->tcfg.eax = eax;
    d->tcfg.ebx = ebx;
    tc_reset(d);
    d->runs_cap = 1024;
    d->runs = calloc(d->runs_cap, sizeof *d->runs);
    d->slots_cap = 4096;
    d->slots = calloc(d->slots_cap, sizeof *d->slots);
    d->edges_cap = 1024;
    d->edges = calloc(d->edges_cap, sizeof *d->edges);
    PyObject *result = NULL;
    if (!d->runs || !d->slots || !d->edges) {
        PyErr_NoMemory();
    } else if (setjmp(d->bail)) {
        if (d->reason)
            result = Py_BuildValue("(sKKO)", d->reason, 0ULL, 0ULL, Py_None);
        /* else: a Python exception from fill is set */
    } else {
        run_all(d);
        if (want_edges)
            flush_edges(d);
        PyObject *edges = Py_None;
        Py_INCREF(edges);
        if (want_edges) {
            Py_DECREF(edges);
            edges = PyDict_New();
            for (size_t i = 0; edges && i < d->edges_cap; i++) {
                struct edge *e = &d->edges[i];
                if (!e->n)
                    continue;
                PyObject *k = Py_BuildValue("(KK)", (unsigned long long)e->from,
                                            (unsigned long long)e->to);
                PyObject *v = PyLong_FromUnsignedLongLong(e->n);
                if (!k || !v || PyDict_SetItem(edges, k, v) < 0) {
                    Py_XDECREF(k);
                    Py_XDECREF(v);
                    Py_CLEAR(edges);
                    break;
                }
                Py_DECREF(k);
                Py_DECREF(v);
            }
        }
        if (edges) {
            result = Py_BuildValue("(OKKN)", Py_None,
                                   (unsigned long long)d->insns,
                                   (unsigned long long)d->blocks, edges);
        }
    }
    free(d->runs);
    free(d->slots);
    free(d->edges);
    free(d);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS,
     "decode(data, fill, flags, pkt_flags, want_edges[, (mtc_freq, "
     "nom_freq, cpuid_0x15_eax, cpuid_0x15_ebx)]) -> "
     "(bail_reason|None, insns, blocks, edges|None)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c_flow",
                                    "hwtrace's compiled flow core", -1,
                                    methods};

PyMODINIT_FUNC PyInit__c_flow(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", ABI_VERSION) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_SHA256",
                                   HWTRACE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

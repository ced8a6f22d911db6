/* The compiled flow core: instruction/block counting and edge coverage over
 * Intel PT packets plus a block cache, for hwtrace.flow.fast.
 *
 *   decode(data, fill, flags, pkt_flags, want_edges[, timing[, release]])
 *       release(pos) -> next pos: called at the first PSB at or past each
 *       returned offset, so a file mapping can drop the pages behind the
 *       decode (hwtrace.cli._tracemap); the core only reads forward
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
 *
 *   decode_segment(data, fill, flags, pkt_flags, timing, start, stop_at,
 *                  tail, head)
 *       -> (reason|None, insns, blocks, checkpoints, stopped)
 *
 * One job of the parallel counts path (hwtrace.flow.fast_parallel): the
 * decode above, synchronized at the PSB at offset ``start`` (-1: the trace
 * start, as decode() does), recording checkpoints (see "Checkpoints"
 * below) at its first ``head`` PSBs and at every PSB at or after
 * ``stop_at``, and stopping (stopped=True) once ``tail`` of the latter are
 * recorded (stop_at -1: runs to the end).  A bail returns the checkpoints
 * recorded before it too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../pt/_pt_packets.h"

#define ABI_VERSION 4

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
    PyObject *release;       /* release(pos) -> next offset, or NULL */
    ptrdiff_t release_at;
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

    /* decode_segment (seg.on == 0 for decode()): checkpoints, see below */
    struct {
        int on;
        ptrdiff_t start, stop_at, arm;  /* arm: PSB awaiting its checkpoint */
        int head, tail, psbs, past, stopped;
        PyObject *cps;                  /* list of checkpoint tuples */
    } seg;

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

static void psb_seen(struct dec *d, ptrdiff_t pos);

/* PSB+: pos at the PSB; leaves pos at the PSBEND with its events queued. */
static void psb_header(struct dec *d)
{
    if (d->psbq_n || d->tipq_mode >= 0 || d->async_q)
        BAIL(d, "PSB with events pending");
    if (peek(d) != PT_K_PSB)
        BAIL(d, "no PSB");
    if (d->seg.on)
        psb_seen(d, d->pos);
    if (d->release && d->pos >= d->release_at) {
        PyObject *r = PyObject_CallFunction(d->release, "n",
                                            (Py_ssize_t)d->pos);
        if (!r)
            BAIL(d, NULL);
        d->release_at = PyLong_AsSsize_t(r);
        Py_DECREF(r);
        if (d->release_at == -1 && PyErr_Occurred())
            BAIL(d, NULL);
    }
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

/* -- checkpoints (decode_segment) ------------------------------------------ *
 *
 * Where: a PSB is *armed* when its header is read (psb_header) and it is
 * one of the job's first ``head`` PSBs or at/after ``stop_at``.  Its
 * checkpoint is recorded at the first top of the session loop (run_all:
 * no block in progress) where
 *   - the PSB+'s events have been fetched (psbq_n == 0: the PSBEND batch
 *     was taken, so every TNT bit from before the PSB has been used),
 *   - every fetched event has been processed (ev_i == ev_n),
 *   - no disable waits for its instruction (!dis_pending) and no event
 *     waits for its IP (!ipev_pending).
 * A decoder synchronized at that PSB (a fresh job) is in such a state right
 * after it processed the PSB+; the sequential decoder after it used up the
 * TNT bits from before the PSB and its PSB+ events bound.  (A later PSB
 * read before that point replaces the armed one.)
 *
 * What: (pos, key, stack, insns, blocks): the armed PSB's offset, the key
 * (below), the return stack oldest first, the counters so far.  Two
 * decoders with equal keys count the same from there on, up to the return
 * stack: a decoder with fewer entries (a suffix of the other's) pops the
 * same addresses until it would pop past its bottom, and then bails
 * ("return stack empty") -- which a job reports (with the checkpoints
 * before it), so the stitch sees it.
 *
 * The key is not a hash but the live decode state itself, serialized
 * (injective: equal keys are equal states).  Every field of struct dec,
 * state or not:
 *
 *   STATE (in the key)                        NOT STATE
 *   pos            packet position            buf, end, pflags, flags,
 *   lip, have_ip, ip_supp   last IP            tcfg: inputs (the same for
 *   q_enabled      query-level enable           every job of a decode)
 *   tnt_idx, tnt_bits (the bits still to use)  cpos, pkt, pr: the decoded
 *   cur_mode, mode_exec_pending, tipq_mode     packet at pos (a cache)
 *   async_q, async_from (if async_q)           runs, runs_*, slots*,
 *   psbq_n, psbq[0..psbq_n)                    have_prev, prev: the block
 *   st_pend, st_eos  status of the last query  cache (a function of the
 *   ip, mode, enabled  the flow                image; prev/succ only feed
 *   dis_pending, dis_supp + dis_ip (if         edges)
 *     dis_pending)                             want_edges, edges*: output
 *   ipev_pending, ipev (if pending)            insns, blocks: the counts
 *   ev[ev_i..ev_n)  the batch still to do      rs, rs_top, rs_n: the
 *   tm.*           the time (tsc and base are  return stack (apart, above)
 *                  only ever written: kept     bail, reason, fill, seg:
 *                  anyway)                     machinery
 *   tc.tsc, tc.cyc_tsc, tc.have_mtc            ev beyond [ev_i, ev_n),
 *   tc.ctc, tc.cyc_mtc (if tc.have_mtc:        psbq beyond psbq_n, ipev /
 *     overwritten unread before the first      async_from / dis_* when not
 *     MTC)                                     pending: dead, never read
 *   have_fcr = tc.min_fcr <= tc.max_fcr,       tc.min_fcr, tc.max_fcr:
 *     tc.fcr (if have_fcr)                     only their order is read
 *
 * The STATE table below lists the scalar ones; state_probe() (a test
 * hook) checks that flipping any of them, or any field of a live event,
 * changes the key. */

enum { LIVE_ALWAYS, LIVE_ASYNC, LIVE_DIS, LIVE_IPEV, LIVE_TNT, LIVE_TC_MTC,
       LIVE_FCR };

struct sfield {
    const char *name;
    size_t off, size;
    int live;
};

#define SF(f, live) {#f, offsetof(struct dec, f), sizeof(((struct dec *)0)->f), \
                     live}
static const struct sfield STATE[] = {
    SF(pos, LIVE_ALWAYS), SF(lip, LIVE_ALWAYS), SF(have_ip, LIVE_ALWAYS),
    SF(ip_supp, LIVE_ALWAYS), SF(q_enabled, LIVE_ALWAYS),
    SF(tnt_idx, LIVE_ALWAYS), SF(tnt_bits, LIVE_TNT),
    SF(cur_mode, LIVE_ALWAYS), SF(mode_exec_pending, LIVE_ALWAYS),
    SF(tipq_mode, LIVE_ALWAYS), SF(async_q, LIVE_ALWAYS),
    SF(async_from, LIVE_ASYNC), SF(psbq_n, LIVE_ALWAYS),
    SF(st_pend, LIVE_ALWAYS), SF(st_eos, LIVE_ALWAYS),
    SF(ip, LIVE_ALWAYS), SF(mode, LIVE_ALWAYS), SF(enabled, LIVE_ALWAYS),
    SF(dis_pending, LIVE_ALWAYS), SF(dis_supp, LIVE_DIS),
    SF(dis_ip, LIVE_DIS), SF(ipev_pending, LIVE_ALWAYS),
    SF(tm.tsc, LIVE_ALWAYS), SF(tm.base, LIVE_ALWAYS), SF(tm.fc, LIVE_ALWAYS),
    SF(tm.lost_cyc, LIVE_ALWAYS), SF(tm.ctc, LIVE_ALWAYS),
    SF(tm.ctc_cyc, LIVE_ALWAYS), SF(tm.have_tsc, LIVE_ALWAYS),
    SF(tm.have_tma, LIVE_ALWAYS), SF(tm.have_mtc, LIVE_ALWAYS),
    SF(tc.tsc, LIVE_ALWAYS), SF(tc.cyc_tsc, LIVE_ALWAYS),
    SF(tc.have_mtc, LIVE_ALWAYS), SF(tc.ctc, LIVE_TC_MTC),
    SF(tc.cyc_mtc, LIVE_TC_MTC), SF(tc.fcr, LIVE_FCR),
};
#define NSTATE (sizeof STATE / sizeof STATE[0])

/* the fields of a live event */
#define EF(f) {#f, offsetof(struct event, f), sizeof(((struct event *)0)->f), 0}
static const struct sfield EVFIELD[] = {
    EF(type), EF(su), EF(ip_supp), EF(ip), EF(to), EF(mode),
};
#define NEVFIELD (sizeof EVFIELD / sizeof EVFIELD[0])

static uint64_t field_value(const void *base, const struct sfield *f)
{
    const uint8_t *p = (const uint8_t *)base + f->off;
    switch (f->size) {
    case 1: return *(const uint8_t *)p;
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

static int field_live(const struct dec *d, int live)
{
    switch (live) {
    case LIVE_ASYNC: return d->async_q;
    case LIVE_DIS: return d->dis_pending;
    case LIVE_IPEV: return d->ipev_pending;
    case LIVE_TC_MTC: return d->tc.have_mtc;
    case LIVE_FCR: return d->tc.min_fcr <= d->tc.max_fcr;
    default: return 1;
    }
}

#define KEY_MAX (NSTATE + 8 + (2 * MAXEV + 1) * NEVFIELD)

static size_t put_events(uint64_t *w, size_t n, const struct event *ev,
                         int count)
{
    w[n++] = (uint64_t)count;
    for (int i = 0; i < count; i++)
        for (size_t j = 0; j < NEVFIELD; j++)
            w[n++] = field_value(&ev[i], &EVFIELD[j]);
    return n;
}

/* The key of d's state (see above) into w; its length in words. */
static size_t state_key(const struct dec *d, uint64_t *w)
{
    size_t n = 0;
    w[n++] = 1;                         /* layout version */
    for (size_t i = 0; i < NSTATE; i++) {
        const struct sfield *f = &STATE[i];
        uint64_t v = 0;
        if (field_live(d, f->live))
            v = field_value(d, f);
        if (f->live == LIVE_TNT)        /* the bits not used yet */
            v &= d->tnt_idx ? (d->tnt_idx << 1) - 1 : 0;
        w[n++] = v;
    }
    w[n++] = field_live(d, LIVE_FCR);   /* have_fcr */
    n = put_events(w, n, d->psbq, d->psbq_n);
    n = put_events(w, n, d->ev + d->ev_i,
                   d->ev_i < d->ev_n ? d->ev_n - d->ev_i : 0);
    n = put_events(w, n, &d->ipev, d->ipev_pending ? 1 : 0);
    return n;
}

static void psb_seen(struct dec *d, ptrdiff_t pos)
{
    d->seg.psbs++;
    if (d->seg.psbs <= d->seg.head ||
        (d->seg.stop_at >= 0 && pos >= d->seg.stop_at))
        d->seg.arm = pos;
}

static PyObject *stack_tuple(const struct dec *d)
{
    PyObject *t = PyTuple_New(d->rs_n);
    for (int i = 0; t && i < d->rs_n; i++) {
        int at = (d->rs_top - (d->rs_n - 1 - i) + RS_CAP) % RS_CAP;
        PyObject *v = PyLong_FromUnsignedLongLong(d->rs[at]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* At the top of the session loop: record the armed PSB's checkpoint if
 * this is its place (see above); 1 if the job has recorded enough. */
static int checkpoint(struct dec *d)
{
    if (d->psbq_n || d->ev_i < d->ev_n || d->dis_pending || d->ipev_pending)
        return 0;
    ptrdiff_t at = d->seg.arm;
    d->seg.arm = -1;
    uint64_t w[KEY_MAX];
    size_t n = state_key(d, w);
    PyObject *stack = stack_tuple(d);
    if (!stack)
        BAIL(d, NULL);
    PyObject *t = Py_BuildValue("(ny#NKK)", (Py_ssize_t)at, (const char *)w,
                                (Py_ssize_t)(n * sizeof *w), stack,
                                (unsigned long long)d->insns,
                                (unsigned long long)d->blocks);
    if (!t || PyList_Append(d->seg.cps, t) < 0) {
        Py_XDECREF(t);
        BAIL(d, NULL);
    }
    Py_DECREF(t);
    if (d->seg.stop_at >= 0 && at >= d->seg.stop_at &&
        ++d->seg.past >= d->seg.tail) {
        d->seg.stopped = 1;
        return 1;
    }
    return 0;
}

static void run_all(struct dec *d)
{
    ptrdiff_t psb = d->seg.on && d->seg.start >= 0 ? d->seg.start
                                                    : pt_find_psb(d->buf, d->end, 0);
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
        if (d->seg.arm >= 0 && checkpoint(d))
            return;
        if (d->st_eos && !d->dis_pending && !d->ipev_pending &&
            d->ev_i >= d->ev_n)
            return;
        if (!d->enabled)
            BAIL(d, "no tracing enabled and no event");
        one_block(d);
    }
}

/* -- Python boundary ---------------------------------------------------- */

static struct dec *dec_new(Py_buffer *view, PyObject *fill, unsigned flags,
                           unsigned pflags, int want_edges, unsigned mtc_freq,
                           unsigned long long nom_freq, unsigned long long eax,
                           unsigned long long ebx)
{
    if (mtc_freq > 15 || nom_freq > UINT32_MAX || eax > UINT32_MAX ||
        ebx > UINT32_MAX) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "timing parameter out of range");
        return NULL;
    }
    struct dec *d = calloc(1, sizeof *d);
    if (!d) {
        PyBuffer_Release(view);
        PyErr_NoMemory();
        return NULL;
    }
    d->buf = view->buf;
    d->end = view->len;
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
    d->seg.arm = -1;
    tc_reset(d);
    d->runs_cap = 1024;
    d->runs = calloc(d->runs_cap, sizeof *d->runs);
    d->slots_cap = 4096;
    d->slots = calloc(d->slots_cap, sizeof *d->slots);
    d->edges_cap = 1024;
    d->edges = calloc(d->edges_cap, sizeof *d->edges);
    if (!d->runs || !d->slots || !d->edges) {
        free(d->runs);
        free(d->slots);
        free(d->edges);
        free(d);
        PyBuffer_Release(view);
        PyErr_NoMemory();
        return NULL;
    }
    return d;
}

static void dec_free(struct dec *d, Py_buffer *view)
{
    free(d->runs);
    free(d->slots);
    free(d->edges);
    free(d);
    PyBuffer_Release(view);
}

static PyObject *py_decode(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *fill;
    unsigned int flags, pflags;
    int want_edges;
    unsigned int mtc_freq = 0;
    unsigned long long nom_freq = 0, eax = 0, ebx = 0;
    PyObject *release = Py_None;
    if (!PyArg_ParseTuple(args, "y*OIIp|(IKKK)O", &view, &fill, &flags,
                          &pflags, &want_edges, &mtc_freq, &nom_freq, &eax,
                          &ebx, &release))
        return NULL;
    if (release != Py_None && !PyCallable_Check(release)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "release must be callable or None");
        return NULL;
    }
    struct dec *d = dec_new(&view, fill, flags, pflags, want_edges, mtc_freq,
                            nom_freq, eax, ebx);
    if (!d)
        return NULL;
    d->release = release == Py_None ? NULL : release;   /* borrowed: the
                                                            call holds it */
    PyObject *result = NULL;
    if (setjmp(d->bail)) {
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
    dec_free(d, &view);
    return result;
}

/* A decoder for a segment job: a PSB must be at ``start`` (-1: the trace
 * start, if ``start_optional``); seg.cps is a new list.  NULL with an
 * exception set (the buffer released) on error. */
static struct dec *seg_new(Py_buffer *view, PyObject *fill, unsigned flags,
                           unsigned pflags, unsigned mtc_freq,
                           unsigned long long nom_freq,
                           unsigned long long eax, unsigned long long ebx,
                           Py_ssize_t start, int start_optional)
{
    if (start < 0 ? !start_optional :
        (start + 16 > view->len ||
         memcmp((const uint8_t *)view->buf + start, pt_psb_bytes, 16))) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "start: no PSB there");
        return NULL;
    }
    struct dec *d = dec_new(view, fill, flags, pflags, 0, mtc_freq,
                            nom_freq, eax, ebx);
    if (!d)
        return NULL;
    d->seg.on = 1;
    d->seg.start = start;
    d->seg.arm = -1;
    d->seg.cps = PyList_New(0);
    if (!d->seg.cps) {
        dec_free(d, view);
        return NULL;
    }
    return d;
}

/* decode_segment(data, fill, flags, pkt_flags, timing, start, stop_at,
 * tail, head): see the top of this file and "checkpoints". */
static PyObject *py_decode_segment(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *fill;
    unsigned int flags, pflags, mtc_freq;
    unsigned long long nom_freq, eax, ebx;
    Py_ssize_t start, stop_at;
    int tail, head;
    if (!PyArg_ParseTuple(args, "y*OII(IKKK)nnii", &view, &fill, &flags,
                          &pflags, &mtc_freq, &nom_freq, &eax, &ebx, &start,
                          &stop_at, &tail, &head))
        return NULL;
    struct dec *d = seg_new(&view, fill, flags, pflags, mtc_freq, nom_freq,
                            eax, ebx, start, 1);
    if (!d)
        return NULL;
    d->seg.stop_at = stop_at;
    d->seg.tail = tail;
    d->seg.head = head;
    PyObject *result = NULL;
    if (setjmp(d->bail)) {
        if (d->reason)
            result = Py_BuildValue("(sKKOO)", d->reason,
                                   (unsigned long long)d->insns,
                                   (unsigned long long)d->blocks, d->seg.cps,
                                   Py_False);
    } else {
        run_all(d);
        result = Py_BuildValue("(OKKOO)", Py_None,
                               (unsigned long long)d->insns,
                               (unsigned long long)d->blocks, d->seg.cps,
                               d->seg.stopped ? Py_True : Py_False);
    }
    Py_XDECREF(d->seg.cps);
    dec_free(d, &view);
    return result;
}

/* state_probe(data, fill, flags, pkt_flags, timing, start): a test hook.
 * Decodes from the PSB at ``start`` to its checkpoint and returns, for
 * every state field of the key and every field of an event in each live
 * queue, (name, whether flipping its lowest bit changes the key) -- with
 * the field made live first (its guard set) where it is conditional. */
static PyObject *py_state_probe(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *fill;
    unsigned int flags, pflags, mtc_freq;
    unsigned long long nom_freq, eax, ebx;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*OII(IKKK)n", &view, &fill, &flags, &pflags,
                          &mtc_freq, &nom_freq, &eax, &ebx, &start))
        return NULL;
    struct dec *d = seg_new(&view, fill, flags, pflags, mtc_freq, nom_freq,
                            eax, ebx, start, 0);
    if (!d)
        return NULL;
    d->seg.stop_at = start;
    d->seg.tail = d->seg.head = 1;
    PyObject *result = NULL;
    struct dec *tp = malloc(sizeof *tp);    /* large: not on the stack */
    if (!tp) {
        PyErr_NoMemory();
        /* no memory */
    } else if (setjmp(d->bail)) {
        if (d->reason)
            PyErr_Format(PyExc_RuntimeError, "bailed: %s", d->reason);
    } else {
        run_all(d);
        result = PyList_New(0);
        uint64_t w0[KEY_MAX], w1[KEY_MAX];
        size_t nf = NSTATE + 3 * NEVFIELD;
        for (size_t i = 0; result && i < nf; i++) {
            *tp = *d;
            uint8_t *field;
            char name[64];
            if (i < NSTATE) {
                const struct sfield *f = &STATE[i];
                switch (f->live) {
                case LIVE_ASYNC: tp->async_q = 1; break;
                case LIVE_DIS: tp->dis_pending = 1; break;
                case LIVE_TNT: tp->tnt_idx = 1 << 7; break;
                case LIVE_TC_MTC: tp->tc.have_mtc = 1; break;
                case LIVE_FCR: tp->tc.min_fcr = 0; tp->tc.max_fcr = 1; break;
                }
                field = (uint8_t *)tp + f->off;
                snprintf(name, sizeof name, "%s", f->name);
            } else {
                size_t q = (i - NSTATE) / NEVFIELD, j = (i - NSTATE) % NEVFIELD;
                struct event *ev;
                if (q == 0) {
                    if (!tp->psbq_n)
                        tp->psbq_n = 1;
                    ev = &tp->psbq[0];
                } else if (q == 1) {
                    if (tp->ev_i >= tp->ev_n) {
                        tp->ev_i = 0;
                        tp->ev_n = 1;
                    }
                    ev = &tp->ev[tp->ev_i];
                } else {
                    tp->ipev_pending = 1;
                    ev = &tp->ipev;
                }
                field = (uint8_t *)ev + EVFIELD[j].off;
                snprintf(name, sizeof name, "%s.%s",
                         q == 0 ? "psbq[0]" : q == 1 ? "ev[ev_i]" : "ipev",
                         EVFIELD[j].name);
            }
            size_t n0 = state_key(tp, w0);
            field[0] ^= 1;
            size_t n1 = state_key(tp, w1);
            int changed = n0 != n1 || memcmp(w0, w1, n0 * sizeof *w0);
            PyObject *t = Py_BuildValue("(sO)", name,
                                        changed ? Py_True : Py_False);
            if (!t || PyList_Append(result, t) < 0)
                Py_CLEAR(result);
            Py_XDECREF(t);
        }
    }
    free(tp);
    Py_XDECREF(d->seg.cps);
    dec_free(d, &view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS,
     "decode(data, fill, flags, pkt_flags, want_edges[, (mtc_freq, "
     "nom_freq, cpuid_0x15_eax, cpuid_0x15_ebx)]) -> "
     "(bail_reason|None, insns, blocks, edges|None)"},
    {"decode_segment", py_decode_segment, METH_VARARGS,
     "decode_segment(data, fill, flags, pkt_flags, (mtc_freq, nom_freq, "
     "cpuid_0x15_eax, cpuid_0x15_ebx), start, stop_at, tail, head) -> "
     "(bail_reason|None, insns, blocks, [(psb, key, stack, insns, blocks)], "
     "stopped)"},
    {"state_probe", py_state_probe, METH_VARARGS,
     "state_probe(data, fill, flags, pkt_flags, timing, start) -> "
     "[(field, flipping it changes the key)] (a test hook)"},
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

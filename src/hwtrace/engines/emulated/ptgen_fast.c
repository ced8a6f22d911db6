/*
 * hwtrace compiled PT generator: the C twin of flow.py + ptgen.py for the
 * common case (QEMU logs, no address ranges, no INSN / SIGNAL records; the
 * signal deliveries QEMU does not log are inferred in ptgen_signals.c, as
 * flow._find_signals does).  Python (fast.py) decides eligibility,
 * classifies the blocks and hands them over; the output must be byte for
 * byte what the Python generator writes (tests compare them).
 *
 *   ptgen_fast LOG BLOCKS OUTDIR MODE NCPU CTL CR3MATCH T0 NOM EAX EBX LONGTNT CR3FILE KEEP
 *
 * BLOCKS: per BLOCK record of LOG, in order, 40 bytes:
 *   u64 pc, u64 last, u64 target, u64 nlip, u32 ninsn, u8 kind, u8[3] pad.
 * CR3FILE: lines "pid cr3".  KEEP: bytes of each stream kept (0: all): the
 * rest is generated and counted but not stored (a stop-on-full buffer of
 * that size keeps no more; a long run's streams need not fit in memory).
 * Writes OUTDIR/cpuN.pt or OUTDIR/tidN.pt (at most KEEP bytes) and
 * OUTDIR/summary.txt: "stream KEY N insns bytes" (bytes generated), "switch CPU T PPID PTID PID TID",
 * "start TID T", "exec TID T" (per PROC_EXEC record) and "exit TID T" lines
 * (times on the emulated TSC: every thread on one clock, as schedule.py).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ptgen_signals.h"

/* ------------------------------------------------------------ tracer */
struct tracer {
    unsigned char *buf; size_t len, cap;
    uint64_t total;                     /* bytes generated (len: stored, <= g_keep) */
    uint64_t since_psb;
    int branch_en, user, tsc_en, mtc_en, mtc_freq, cyc_en, retc, tnt_max;
    uint64_t cyc_thresh, psb_period, eax, ebx, cbr;
    int triggered, in_user, ctx_ok, pkt_en, mode_sent, have_last;
    uint64_t last_ip, tnt_bits; int tnt_n;
    uint64_t rs[64]; int rs_top, rs_n;   /* circular return stack */
    uint64_t t, mtc_p, cyc_acc, cur_ip, insns;
    uint64_t mtc_cp, mtc_lo, mtc_hi;    /* art(t) >> mtc_freq == mtc_cp for t in [lo, hi) */
    int psb_due; uint64_t psb_at;       /* PSB+ due where t reaches psb_at */
};

static size_t g_keep = SIZE_MAX;       /* bytes of a stream stored */

static void emit(struct tracer *tr, const void *p, size_t n)
{
    tr->since_psb += n;
    tr->total += n;
    if (n > g_keep - tr->len) n = g_keep - tr->len;
    if (!n) return;
    if (tr->len + n > tr->cap) {
        tr->cap = tr->cap ? tr->cap * 2 : 1 << 16;
        while (tr->cap < tr->len + n) tr->cap *= 2;
        tr->buf = realloc(tr->buf, tr->cap);
    }
    memcpy(tr->buf + tr->len, p, n);
    tr->len += n;
}

static uint64_t art(struct tracer *tr, uint64_t t) { return (uint64_t)((unsigned __int128)t * tr->eax / tr->ebx); }

static void put_cyc(struct tracer *tr, uint64_t v)
{
    unsigned char b[16]; int n = 0;
    b[n++] = (unsigned char)(((v & 0x1f) << 3) | 3);
    v >>= 5;
    while (v) {
        b[n - 1] |= (n == 1) ? 4 : 1;
        b[n++] = (unsigned char)((v & 0x7f) << 1);
        v >>= 7;
    }
    emit(tr, b, n);
}

static void cyc(struct tracer *tr)
{
    if (tr->cyc_en && tr->cyc_acc && tr->cyc_acc >= tr->cyc_thresh) {
        put_cyc(tr, tr->cyc_acc);
        tr->cyc_acc = 0;
    }
}

static const int ipc_bytes[7] = {0, 2, 4, 6, 6, 0, 8};

static void ip_pkt(struct tracer *tr, int op, int suppressed, uint64_t ip)
{
    unsigned char b[9];
    if (tr->cyc_en) cyc(tr);
    if (suppressed) { b[0] = (unsigned char)op; emit(tr, b, 1); return; }
    int ipc; uint64_t payload;
    uint64_t sext = (ip & 0xffffffffffffULL) | ((ip & (1ULL << 47)) ? 0xffff000000000000ULL : 0);
    if (tr->have_last && (ip >> 16) == (tr->last_ip >> 16)) { ipc = 1; payload = ip & 0xffff; }
    else if (tr->have_last && (ip >> 32) == (tr->last_ip >> 32)) { ipc = 2; payload = ip & 0xffffffff; }
    else if (sext == ip) {
        ipc = (tr->have_last && (ip >> 48) == (tr->last_ip >> 48)) ? 4 : 3;
        payload = ip & 0xffffffffffffULL;
    } else if (tr->have_last && (ip >> 48) == (tr->last_ip >> 48)) { ipc = 4; payload = ip & 0xffffffffffffULL; }
    else { ipc = 6; payload = ip; }
    tr->last_ip = ip; tr->have_last = 1;
    b[0] = (unsigned char)((ipc << 5) | op);
    memcpy(b + 1, &payload, 8);
    emit(tr, b, 1 + ipc_bytes[ipc]);
}

static void flush_tnt(struct tracer *tr)
{
    int n = tr->tnt_n;
    if (!n) return;
    if (tr->cyc_en) cyc(tr);
    if (n <= 6) {
        unsigned char b = (unsigned char)((((uint64_t)1 << n) | tr->tnt_bits) << 1);
        emit(tr, &b, 1);
    } else {
        unsigned char b[8] = {0x02, 0xa3};
        uint64_t v = ((uint64_t)1 << n) | tr->tnt_bits;
        memcpy(b + 2, &v, 6);
        emit(tr, b, 8);
    }
    tr->tnt_bits = 0; tr->tnt_n = 0;
}

static void tnt(struct tracer *tr, int taken)
{
    tr->tnt_bits = (tr->tnt_bits << 1) | (uint64_t)taken;
    if (++tr->tnt_n == tr->tnt_max) flush_tnt(tr);
}

static void rs_clear(struct tracer *tr) { tr->rs_n = 0; }
static void rs_push(struct tracer *tr, uint64_t v)
{
    tr->rs_top = (tr->rs_top + 1) & 63;
    tr->rs[tr->rs_top] = v;
    if (tr->rs_n < 64) tr->rs_n++;
}

static const unsigned char PSB[16] = {2,0x82,2,0x82,2,0x82,2,0x82,2,0x82,2,0x82,2,0x82,2,0x82};
static const unsigned char MODE64[2] = {0x99, 0x01};

static void psb_plus(struct tracer *tr)
{
    flush_tnt(tr);
    emit(tr, PSB, 16);
    tr->since_psb = 0;
    tr->psb_due = 0;
    tr->have_last = 0;
    rs_clear(tr);
    tr->mode_sent = 0;
    if (tr->tsc_en) {
        unsigned char b[8] = {0x19};
        uint64_t v = tr->t & ((1ULL << 56) - 1);
        memcpy(b + 1, &v, 7);
        emit(tr, b, 8);
        tr->cyc_acc = 0;        /* in the TSC (ptgen._psb_plus) */
        if (tr->mtc_en) {
            uint64_t a = art(tr, tr->t);
            uint64_t fc = tr->t - (uint64_t)((unsigned __int128)a * tr->ebx / tr->eax);
            if (fc > 511) fc = 511;
            unsigned char m[7] = {0x02, 0x73, (unsigned char)(a & 0xff), (unsigned char)((a >> 8) & 0xff), 0,
                                  (unsigned char)(fc & 0xff), (unsigned char)(fc >> 8)};
            emit(tr, m, 7);
        }
    }
    unsigned char c[4] = {0x02, 0x03, (unsigned char)tr->cbr, 0};
    emit(tr, c, 4);
    if (tr->pkt_en) {
        emit(tr, MODE64, 2);
        tr->mode_sent = 1;
        ip_pkt(tr, 0x1d, 0, tr->cur_ip);
    }
    unsigned char e[2] = {0x02, 0x23};
    emit(tr, e, 2);
}

static void update_pkt_en(struct tracer *tr)
{
    tr->pkt_en = tr->triggered && tr->in_user && tr->ctx_ok && tr->branch_en;
}

static void enter(struct tracer *tr, uint64_t ip, int ctx_ok)
{
    tr->cur_ip = ip;
    tr->in_user = tr->user;
    tr->ctx_ok = ctx_ok;
    if (!tr->triggered) return;
    update_pkt_en(tr);
    if (tr->pkt_en) {
        if (!tr->mode_sent) { emit(tr, MODE64, 2); tr->mode_sent = 1; }
        rs_clear(tr);
        ip_pkt(tr, 0x11, 0, ip);
    }
}

static void leave_sync(struct tracer *tr)
{
    if (tr->pkt_en) { flush_tnt(tr); ip_pkt(tr, 0x01, 1, 0); }
    tr->in_user = 0; tr->pkt_en = 0;
}

static void leave_async(struct tracer *tr, uint64_t next_ip)
{
    if (tr->pkt_en) { flush_tnt(tr); ip_pkt(tr, 0x1d, 0, next_ip); ip_pkt(tr, 0x01, 1, 0); }
    tr->in_user = 0; tr->pkt_en = 0;
}

/* The times t whose MTC period art(t) >> mtc_freq is p's: [t, the first
 * one of period p + 1) (art grows with t); retire's 128-bit division is
 * then done once per period, not per run */
static void mtc_window(struct tracer *tr, uint64_t p)
{
    tr->mtc_cp = p;
    tr->mtc_lo = tr->t;
    unsigned __int128 hi = tr->eax
        ? ((((unsigned __int128)p + 1) << tr->mtc_freq) * tr->ebx + tr->eax - 1) / tr->eax
        : ~(unsigned __int128)0;
    tr->mtc_hi = hi > UINT64_MAX ? UINT64_MAX : (uint64_t)hi;
}

static void retire(struct tracer *tr, uint64_t n)
{
    if (tr->pkt_en) tr->insns += n;
    if (!tr->triggered) return;
    tr->t += n;
    tr->cyc_acc += n;
    if (tr->mtc_en && !(tr->mtc_p == tr->mtc_cp && tr->t >= tr->mtc_lo && tr->t < tr->mtc_hi)) {
        uint64_t p = art(tr, tr->t) >> tr->mtc_freq;
        if (p != tr->mtc_p) {
            tr->mtc_p = p;
            if (tr->cyc_en) {
                /* ptgen.Tracer.retire: the CYC before the MTC counts the
                 * cycles up to the tick the ART reached period p */
                uint64_t at = (uint64_t)((((unsigned __int128)p << tr->mtc_freq) * tr->ebx
                                          + tr->eax - 1) / tr->eax);
                uint64_t later = tr->t - at;
                tr->cyc_acc -= later;
                cyc(tr);
                tr->cyc_acc += later;
            }
            unsigned char b[2] = {0x59, (unsigned char)(p & 0xff)};
            emit(tr, b, 2);
        }
        mtc_window(tr, p);
    }
}

/* ptgen.Tracer.run: n instructions of a straight-line run retire, the
 * first at ip, their lengths in sizes; PSB+ where it is due (one retired
 * instruction after PacketByteCnt reached the period), mid-block included */
static void run_insns_psb(struct tracer *tr, uint64_t ip, uint64_t n, const unsigned char *sizes)
{
    for (;;) {
        if (!tr->psb_due) {
            if (tr->since_psb < tr->psb_period || !tr->triggered) break;
            tr->psb_due = 1;
            tr->psb_at = tr->t + 1;
        }
        uint64_t j = tr->psb_at > tr->t ? tr->psb_at - tr->t : 0;
        if (j >= n || !tr->triggered) break;
        if (j) {
            retire(tr, j);
            for (uint64_t k = 0; k < j; k++) ip += sizes[k];
            sizes += j;
            n -= j;
        }
        tr->cur_ip = ip;
        psb_plus(tr);
    }
    tr->cur_ip = ip;
    if (n) retire(tr, n);
}

/* Whether a run of n instructions needs no PSB+ (the common case). */
static inline int no_psb_in(const struct tracer *tr, uint64_t n)
{
    if (tr->psb_due)
        return tr->psb_at >= tr->t + n || !tr->triggered;
    return tr->since_psb < tr->psb_period || !tr->triggered;
}

static void branch(struct tracer *tr, int kind, uint64_t nlip, uint64_t next_ip)
{
    if (!tr->triggered || !tr->in_user || !tr->pkt_en) return;
    switch (kind) {
    case K_JCC: tnt(tr, next_ip != nlip); break;
    case K_RET:
        if (tr->retc && tr->rs_n && tr->rs[tr->rs_top] == next_ip) {
            tr->rs_top = (tr->rs_top + 63) & 63; tr->rs_n--;
            tnt(tr, 1);
        } else { flush_tnt(tr); ip_pkt(tr, 0x0d, 0, next_ip); }
        break;
    case K_CALL: if (next_ip != nlip) rs_push(tr, nlip); break;
    case K_CALL_IND: rs_push(tr, nlip); flush_tnt(tr); ip_pkt(tr, 0x0d, 0, next_ip); break;
    case K_JMP_IND: case K_FAR: flush_tnt(tr); ip_pkt(tr, 0x0d, 0, next_ip); break;
    }
}

static void finish(struct tracer *tr)
{
    if (tr->pkt_en) { flush_tnt(tr); ip_pkt(tr, 0x1d, 0, tr->cur_ip); ip_pkt(tr, 0x01, 1, 0); tr->pkt_en = 0; }
    flush_tnt(tr);
}

/* ptgen.Tracer.idle_until: nothing traced ran until TSC t; the clock jumps
 * there, said by TSC (+ TMA with MTC; without TSC, the new period's MTC), CBR */
static void idle_until(struct tracer *tr, uint64_t t)
{
    if (t <= tr->t) return;
    tr->t = t;
    if (!tr->triggered) return;
    flush_tnt(tr);
    tr->cyc_acc = 0;
    uint64_t p = art(tr, t) >> tr->mtc_freq;
    if (tr->tsc_en) {
        unsigned char b[8] = {0x19};
        uint64_t v = t & ((1ULL << 56) - 1);
        memcpy(b + 1, &v, 7);
        emit(tr, b, 8);
        if (tr->mtc_en) {
            uint64_t a = art(tr, t);
            uint64_t fc = t - (uint64_t)((unsigned __int128)a * tr->ebx / tr->eax);
            if (fc > 511) fc = 511;
            unsigned char m[7] = {0x02, 0x73, (unsigned char)(a & 0xff), (unsigned char)((a >> 8) & 0xff), 0,
                                  (unsigned char)(fc & 0xff), (unsigned char)(fc >> 8)};
            emit(tr, m, 7);
        }
    } else if (tr->mtc_en && p != tr->mtc_p) {
        unsigned char b[2] = {0x59, (unsigned char)(p & 0xff)};
        emit(tr, b, 2);
    }
    unsigned char c[4] = {0x02, 0x03, (unsigned char)tr->cbr, 0};
    emit(tr, c, 4);
    tr->mtc_p = p;
}

static uint64_t g_ctl, g_t0, g_nom, g_eax, g_ebx; static int g_long_tnt;

static void tracer_init(struct tracer *tr, uint64_t t0)
{
    memset(tr, 0, sizeof *tr);
    uint64_t ctl = g_ctl;
    tr->branch_en = !!(ctl & (1 << 13));
    tr->user = !!(ctl & (1 << 3));
    tr->tsc_en = !!(ctl & (1 << 10));
    tr->mtc_en = !!(ctl & (1 << 9));
    tr->mtc_freq = (ctl >> 14) & 0xf;
    tr->cyc_en = !!(ctl & (1 << 1));
    int ct = (ctl >> 19) & 0xf;
    tr->cyc_thresh = ct ? (1ULL << (ct - 1)) : 0;
    tr->psb_period = 1ULL << (11 + ((ctl >> 24) & 0xf));
    tr->retc = !(ctl & (1 << 11));
    tr->tnt_max = g_long_tnt ? 47 : 6;
    tr->eax = g_eax; tr->ebx = g_ebx; tr->cbr = g_nom;
    tr->triggered = 1; tr->ctx_ok = 1;
    tr->t = t0;
    tr->mtc_p = art(tr, tr->t) >> tr->mtc_freq;
    psb_plus(tr);
}

/* ------------------------------------------------------------ the log */
struct proc { uint32_t pid; struct table t; int ctx_ok; struct hset h;    /* h: its signal handlers */
              int seen, handler_ran; };  /* seen: in a CTX or BLOCK (flow.load's tables); sig_handler_ran */
struct seg { uint32_t tid_i; int32_t cpu; uint64_t time; size_t start, end; int index; uint64_t first_ip; int has_first, has_items; };
struct thread { uint32_t tid, pid; int proc_i; struct blk *pending; int in_kernel; int nseg; int seg0;
                struct blk cut;        /* a run cut short (pending may point here) */
                struct sigscan sig; int scan; };  /* its signal deliveries; scan: needs sig_scan */

/* A slice (schedule.py): a thread's records from one TIME to the next */
struct slice { uint32_t tid_i; int seg, ordinal, items, execs, has_first, has_next, last, head;
               size_t start, end; uint64_t h0, h1, first_ip, next_ip; };
static struct slice *raw; static int nraw, curraw = -1;

static void raw_open(uint32_t tid_i, int seg, size_t start, uint64_t h0)
{
    raw = realloc(raw, (nraw + 1) * sizeof *raw);
    memset(&raw[nraw], 0, sizeof raw[nraw]);
    raw[nraw].tid_i = tid_i; raw[nraw].seg = seg; raw[nraw].start = start; raw[nraw].h0 = h0;
    curraw = nraw++;
}

static struct proc *procs; static int nprocs;
static struct thread *threads; static int nthreads;
static struct seg *segs; static int nsegs;

static int proc_of(uint32_t pid)
{
    for (int i = 0; i < nprocs; i++) if (procs[i].pid == pid) return i;
    procs = realloc(procs, (nprocs + 1) * sizeof *procs);
    memset(&procs[nprocs], 0, sizeof procs[nprocs]);
    procs[nprocs].pid = pid; procs[nprocs].ctx_ok = 1;
    return nprocs++;
}

static int thread_of(uint32_t tid, uint32_t pid)
{
    for (int i = nthreads - 1; i >= 0; i--) if (threads[i].tid == tid) return i;
    threads = realloc(threads, (nthreads + 1) * sizeof *threads);
    memset(&threads[nthreads], 0, sizeof threads[nthreads]);
    threads[nthreads].tid = tid; threads[nthreads].pid = pid;
    threads[nthreads].proc_i = proc_of(pid); threads[nthreads].in_kernel = 1;
    return nthreads++;
}

static void table_set(struct table *t, uint32_t id, struct blk *b)
{
    if (id >= t->n) {
        uint32_t n = t->n ? t->n : 1024;
        while (n <= id) n *= 2;
        t->b = realloc(t->b, n * sizeof *t->b);
        memset(t->b + t->n, 0, (n - t->n) * sizeof *t->b);
        t->n = n;
    }
    t->b[id] = b;
}

const unsigned char *L; static size_t LN;
struct blk *blocks;                             /* the BLOCKS file */
const unsigned char **blk_sizes;                /* per block: its sizes[] in L */
static uint32_t rd32(size_t o) { uint32_t v; memcpy(&v, L + o, 4); return v; }
static uint64_t rd64(size_t o) { uint64_t v; memcpy(&v, L + o, 8); return v; }

/* size of the record at o (type byte included); 0 on error */
size_t rec_size(size_t o)
{
    switch (L[o]) {
    case 0x01: return 13;
    case 0x02: return 9;
    case 0x03: return 1 + 20 + (size_t)(L[o + 17] | (L[o + 18] << 8)) + (size_t)(L[o + 19] | (L[o + 20] << 8));
    case 0x04: return 5 + 4 * (size_t)rd32(o + 1);
    case 0x05: return 7;
    case 0x06: return 10 + L[o + 9];
    case 0x10: case 0x11: case 0x12: case 0x14: return 5;
    case 0x13: return 4 + (size_t)(L[o + 2] | (L[o + 3] << 8));
    case 0x15: return 9;
    case 0x20: return 9;
    case 0x21: return 17;
    case 0x22: return 22;
    case 0x23: return 21;
    case 0x30: { size_t n = (size_t)(L[o + 33] | (L[o + 34] << 8)); return 35 + n + 1 + L[o + 35 + n]; }
    case 0x31: return 21;
    }
    return 0;
}

/* User code was left asynchronously before resume_ip and goes on at pc
 * (flow._interrupted).  inl: the process has handlers, so it is a delivery
 * (and no sig_scan needed: see main): a jcc before it was not taken */
static void interrupted(struct tracer *tr, const struct blk *p, uint64_t resume_ip, uint64_t pc,
                        int ctx_ok, int inl)
{
    if (inl && p->kind == K_JCC) branch(tr, K_JCC, p->nlip, resume_ip);
    leave_async(tr, resume_ip);
    enter(tr, pc, inl ? ctx_ok : tr->ctx_ok);
}

static inline __attribute__((always_inline))
void step(struct tracer *tr, struct blk *b, const unsigned char *sz, struct blk **pendp,
          int *in_kernel, int ctx_ok, int inl)
{
    struct blk *pending = *pendp;
    uint64_t pc = b->pc, cnt = b->ninsn;
    if (*in_kernel) { enter(tr, pc, ctx_ok); *in_kernel = 0; }
    else if (pending) {
        int kd = pending->kind;
        if (kd == K_REP && pc == pending->last) cnt--;
        else if (kd == K_OTHER || kd == K_REP) {
            if (pc != pending->nlip) interrupted(tr, pending, pending->nlip, pc, ctx_ok, inl);
        } else if (kd == K_JCC) {
            if (pc == pending->target || pc == pending->nlip) branch(tr, kd, pending->nlip, pc);
            else interrupted(tr, pending, pending->nlip, pc, ctx_ok, inl);
        } else if (kd == K_JMP || kd == K_CALL) {
            branch(tr, kd, pending->nlip, pending->target);
            if (pc != pending->target) interrupted(tr, pending, pending->target, pc, ctx_ok, inl);
        } else if (kd == K_TRAP) { leave_sync(tr); enter(tr, pc, ctx_ok); }
        else branch(tr, kd, pending->nlip, pc);
    }
    if (cnt == b->ninsn && cnt && no_psb_in(tr, cnt)) {
        tr->cur_ip = pc;
        retire(tr, cnt);
    } else if (cnt == b->ninsn) {      /* (an empty run too: PSB+ may fall due, as Tracer.run) */
        run_insns_psb(tr, pc, cnt, sz ? sz : blk_sizes[b - blocks]);
    } else if (cnt) {
        if (!sz) sz = blk_sizes[b - blocks];
        run_insns_psb(tr, pc + sz[0], cnt, sz + 1);   /* after the rep that went on */
    }
    *pendp = b;
}

/* flow._run_one's SIGNAL item: user code was left asynchronously at ip */
static void deliver(struct tracer *tr, struct blk **pendp, int *in_kernel, uint64_t ip)
{
    struct blk *p = *pendp;
    if (!*in_kernel) {
        if (!ip && p) ip = p->nlip;
        if (p && p->kind == K_REP && ip == p->last) { if (tr->pkt_en) tr->insns--; }  /* retires after */
        else if (p && p->kind != K_OTHER && p->kind != K_REP && p->kind != K_TRAP) branch(tr, p->kind, p->nlip, ip);
        leave_async(tr, ip);
    }
    *in_kernel = 1; *pendp = NULL;
}

/* The thread's signal events at its block b (o, k): the deliveries before
 * it; 1 if it was run, cut by a fault (pending then points at th->cut) */
static int at_signals(struct thread *th, struct tracer *tr, size_t o, uint32_t k, const struct blk *b,
                      struct blk **pendp, int *in_kernel, int ctx_ok)
{
    struct sigscan *sg = &th->sig;
    const struct sigev *cut = NULL;
    while (sg->at < sg->nev && sg->ev[sg->at].off == o && sg->ev[sg->at].k == k) {
        const struct sigev *e = &sg->ev[sg->at++];
        if (e->cut) cut = e;
        else deliver(tr, pendp, in_kernel, e->ip);
    }
    if (!cut) return 0;
    struct blk c = {b->pc, 0, 0, cut->ip, cut->n, K_OTHER, {0}};
    step(tr, &c, blk_sizes[b - blocks], pendp, in_kernel, ctx_ok, 1);
    th->cut = c; *pendp = &th->cut;
    return 1;
}

static void run_seg(struct thread *th, struct tracer *tr, const struct seg *s)
{
    struct table *tab = &procs[th->proc_i].t;
    int ctx_ok = procs[th->proc_i].ctx_ok;
    struct blk *pending = th->pending;
    int in_kernel = th->in_kernel;
    const struct sigscan *sg = &th->sig;
    int inl = procs[th->proc_i].h.n > 0;
    for (size_t o = s->start; o < s->end; o += rec_size(o)) {
        if (L[o] == 0x04) {
            uint32_t n = rd32(o + 1);
            int slow = sg->at < sg->nev && sg->ev[sg->at].off == o;   /* a signal in it */
            for (uint32_t k = 0; k < n; k++) {
                struct blk *b = tab->b[rd32(o + 5 + 4 * k)];
                if (!(slow && at_signals(th, tr, o, k, b, &pending, &in_kernel, ctx_ok)))
                    step(tr, b, NULL, &pending, &in_kernel, ctx_ok, inl);
            }
        } else if (L[o] == 0x05) {
            /* EXEC_PART: the block ran only so far (flow.load's cut) */
            struct blk *b = tab->b[rd32(o + 1)];
            const unsigned char *sz = blk_sizes[b - blocks];
            uint32_t left = (uint32_t)(L[o + 5] | (L[o + 6] << 8));
            if (at_signals(th, tr, o, 0, b, &pending, &in_kernel, ctx_ok)) continue;  /* left >= ninsn */
            if (left >= b->ninsn) { step(tr, b, NULL, &pending, &in_kernel, ctx_ok, inl); continue; }
            struct blk cut = {b->pc, 0, 0, b->pc, left, K_OTHER, {0}};
            for (uint32_t k = 0; k < left; k++) cut.nlip += sz[k];
            if (left) cut.last = cut.nlip - sz[left - 1];
            step(tr, &cut, sz, &pending, &in_kernel, ctx_ok, inl);
            th->cut = cut;
            pending = &th->cut;
        } else if (L[o] == 0x20) {
            if (pending && !in_kernel) { leave_sync(tr); tr->cur_ip = pending->nlip; }
            in_kernel = 1;
            pending = NULL;
        }
    }
    th->pending = pending;
    th->in_kernel = in_kernel;
}

/* flow._leave_unfinished: the log ends after run p, nothing says where it went */
static void leave_unfinished(struct tracer *tr, struct blk *p)
{
    int k = p->kind;
    if (k == K_TRAP) leave_sync(tr);
    else if (k == K_OTHER || k == K_REP) leave_async(tr, p->nlip);
    else if (k == K_JMP || k == K_CALL) { branch(tr, k, p->nlip, p->target); leave_async(tr, p->target); }
    else { if (tr->pkt_en) tr->insns--; leave_async(tr, p->last); }
}

static void switch_out(struct thread *th, struct tracer *tr, int has_next, uint64_t next_ip)
{
    if (th->in_kernel) return;
    struct blk *p = th->pending;
    if (p && has_next) {
        int k = p->kind;
        if (k == K_TRAP) { leave_sync(tr); th->in_kernel = 1; th->pending = NULL; return; }
        if (k == K_REP && next_ip == p->last) { if (tr->pkt_en) tr->insns--; }
        else if (k != K_OTHER && k != K_REP)
            branch(tr, k, p->nlip, (k == K_JMP || k == K_CALL) ? p->target : next_ip);
        leave_async(tr, next_ip);
    } else if (p)
        leave_unfinished(tr, p);
    else
        leave_async(tr, tr->cur_ip);
    th->in_kernel = 1; th->pending = NULL;
}

static void end_thread(struct thread *th, struct tracer *tr)
{
    if (!th->in_kernel && th->pending) leave_unfinished(tr, th->pending);
    th->in_kernel = 1; th->pending = NULL;
}

static void write_file(const char *dir, const char *name, struct tracer *tr)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(tr->buf, 1, tr->len, f) != tr->len) { perror(path); exit(1); }
    fclose(f);
}

/* A slice's records are read once: let its pages of the mapped log go (a
 * long run's log is gigabytes; a BLOCK record in them read again later is
 * paged back in from the file, the mapping being private and never written). */
static void release(const struct slice *x)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t a = (x->start + pg - 1) / pg * pg, b = x->end / pg * pg;
    if (b > a && b <= LN) madvise((void *)(L + a), b - a, MADV_DONTNEED);
}

/* ------------------------------------------------------------ schedule.py */
static struct slice *sl;

static int cmp_slice(const void *a, const void *b)
{
    const struct slice *x = a, *y = b;
    if (x->h0 != y->h0) return x->h0 < y->h0 ? -1 : 1;
    if (x->h1 != y->h1) return x->h1 < y->h1 ? -1 : 1;
    uint32_t tx = threads[x->tid_i].tid, ty = threads[y->tid_i].tid;
    if (tx != ty) return tx < ty ? -1 : 1;
    return x->ordinal - y->ordinal;
}

/* schedule.thread_slices for every thread, then sorted as schedule.slices */
static int build_slices(void)
{
    sl = malloc((nraw ? nraw : 1) * sizeof *sl);
    int n = 0;
    /* each thread's raw slices, in log order (a counting sort by thread) */
    int *idx = malloc((nraw ? nraw : 1) * sizeof(int)), *at = calloc(nthreads + 1, sizeof(int));
    for (int i = 0; i < nraw; i++) at[raw[i].tid_i + 1]++;
    for (int ti = 0; ti < nthreads; ti++) at[ti + 1] += at[ti];
    int *fill = malloc((nthreads + 1) * sizeof(int));
    memcpy(fill, at, (nthreads + 1) * sizeof(int));
    for (int i = 0; i < nraw; i++) idx[fill[raw[i].tid_i]++] = i;
    free(fill);
    for (int ti = 0; ti < nthreads; ti++) {
        int k = at[ti + 1] - at[ti];
        int *mine = idx + at[ti];
        for (int j = 1; j < k; j++)             /* the host clock never runs back */
            if (raw[mine[j]].h0 < raw[mine[j - 1]].h0) raw[mine[j]].h0 = raw[mine[j - 1]].h0;
        int first = n, nxt_has = 0; uint64_t nxt = 0;
        for (int j = k - 1; j >= 0; j--) {
            struct slice *r = &raw[mine[j]];
            if (!r->items) continue;
            struct slice v = *r;
            v.ordinal = j;
            v.h1 = j + 1 < k ? raw[mine[j + 1]].h0 : r->h0;
            v.next_ip = nxt; v.has_next = nxt_has;
            v.last = n == first;
            sl[n++] = v;
            if (r->has_first) { nxt = r->first_ip; nxt_has = 1; }
        }
    }
    free(idx);
    free(at);
    qsort(sl, n, sizeof *sl, cmp_slice);
    return n;
}

/* schedule.Frontier: a min-heap of (h1, E_end) */
struct fent { uint64_t h1, e; };
static struct fent *fh; static int nfh, capfh; static uint64_t fval;

static void fr_add(uint64_t h1, uint64_t e)
{
    if (nfh == capfh) { capfh = capfh ? capfh * 2 : 1024; fh = realloc(fh, capfh * sizeof *fh); }
    int i = nfh++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (fh[p].h1 < h1 || (fh[p].h1 == h1 && fh[p].e <= e)) break;
        fh[i] = fh[p]; i = p;
    }
    fh[i].h1 = h1; fh[i].e = e;
}

static uint64_t fr_at(uint64_t h0)
{
    while (nfh && fh[0].h1 <= h0) {
        if (fh[0].e > fval) fval = fh[0].e;
        struct fent last = fh[--nfh];
        int i = 0;
        for (;;) {
            int c = 2 * i + 1;
            if (c >= nfh) break;
            if (c + 1 < nfh && (fh[c + 1].h1 < fh[c].h1 || (fh[c + 1].h1 == fh[c].h1 && fh[c + 1].e < fh[c].e))) c++;
            if (last.h1 < fh[c].h1 || (last.h1 == fh[c].h1 && last.e <= fh[c].e)) break;
            fh[i] = fh[c]; i = c;
        }
        fh[i] = last;
    }
    return fval;
}

static void run_slice(struct thread *th, struct tracer *tr, const struct slice *x)
{
    struct seg s = segs[x->seg];
    s.start = x->start; s.end = x->end;
    run_seg(th, tr, &s);
}

/* schedule._catch_up */
static void catch_up(struct thread *th, struct tracer *tr, const struct slice *x, uint64_t start, int running)
{
    if (start <= tr->t) return;
    if (running && !th->in_kernel)
        switch_out(th, tr, x->has_first || x->has_next, x->has_first ? x->first_ip : x->next_ip);
    idle_until(tr, start);
}

static void ran(FILE *sum, const struct slice *x, struct tracer *tr, int *started)
{
    struct thread *th = &threads[x->tid_i];
    if (!started[x->tid_i]) {
        started[x->tid_i] = 1;
        fprintf(sum, "start %u %" PRIu64 "\n", th->tid, tr->t);
    }
    for (int i = 0; i < x->execs; i++) fprintf(sum, "exec %u %" PRIu64 "\n", th->tid, tr->t);
}

/* schedule.run_cpus */
static void run_cpus(FILE *sum, const char *outdir, int ncpu, int n)
{
    for (int si = 0; si < nsegs; si++) segs[si].cpu = segs[si].cpu >= 0 ? segs[si].cpu % ncpu : 0;
    struct tracer *trs = calloc(ncpu, sizeof *trs);
    for (int c = 0; c < ncpu; c++) tracer_init(&trs[c], g_t0);
    fval = g_t0;
    int *on_tid = malloc(ncpu * sizeof(int)), *on_has = malloc(ncpu * sizeof(int));
    uint64_t *on_next = malloc(ncpu * sizeof(uint64_t));
    int *last_tid = malloc(ncpu * sizeof(int));
    for (int c = 0; c < ncpu; c++) { on_tid[c] = -1; last_tid[c] = -1; }
    int *where = malloc((nthreads + 1) * sizeof(int)), *started = calloc(nthreads + 1, sizeof(int));
    uint64_t *own_end = calloc(nthreads + 1, sizeof(uint64_t));
    for (int i = 0; i < nthreads; i++) where[i] = -1;
    for (int k = 0; k < n; k++) {
        struct slice *x = &sl[k];
        int ti = (int)x->tid_i, cpu = segs[x->seg].cpu;
        struct thread *th = &threads[ti];
        struct tracer *tr = &trs[cpu];
        int prev = on_tid[cpu];
        if (prev != ti) {
            if (prev >= 0 && where[prev] == cpu)
                switch_out(&threads[prev], tr, on_has[cpu], on_next[cpu]);
            if (where[ti] >= 0 && where[ti] != cpu) {
                int oc = where[ti];
                if (on_tid[oc] == ti) {
                    switch_out(th, &trs[oc], on_has[oc], on_next[oc]);
                    on_tid[oc] = -1;
                }
                if (last_tid[oc] == ti) {   /* it migrated: the CPU it left goes idle */
                    fprintf(sum, "switch %d %" PRIu64 " %ld %ld -1 -1\n", oc, trs[oc].t,
                            (long)th->pid, (long)th->tid);
                    last_tid[oc] = -1;
                }
            }
        }
        uint64_t start = fr_at(x->h0);
        if (own_end[ti] > start) start = own_end[ti];
        if (start > tr->t) {
            int p = last_tid[cpu];
            if (p >= 0 && p != ti) {       /* the CPU idles */
                fprintf(sum, "switch %d %" PRIu64 " %ld %ld -1 -1\n", cpu, tr->t,
                        (long)threads[p].pid, (long)threads[p].tid);
                last_tid[cpu] = -1;
            }
            catch_up(th, tr, x, start, prev == ti);
        }
        if (last_tid[cpu] != ti) {
            int p = last_tid[cpu];
            fprintf(sum, "switch %d %" PRIu64 " %ld %ld %u %u\n", cpu, tr->t,
                    p >= 0 ? (long)threads[p].pid : -1L, p >= 0 ? (long)threads[p].tid : -1L, th->pid, th->tid);
        }
        last_tid[cpu] = ti;
        ran(sum, x, tr, started);
        run_slice(th, tr, x);
        release(x);
        on_tid[cpu] = ti; on_has[cpu] = x->has_next; on_next[cpu] = x->next_ip;
        where[ti] = cpu;
        own_end[ti] = tr->t;
        fr_add(x->h1, tr->t);
        if (x->last) {
            end_thread(th, tr);
            fprintf(sum, "exit %u %" PRIu64 "\n", th->tid, tr->t);
            on_tid[cpu] = -1;
            where[ti] = -1;
        }
    }
    for (int c = 0; c < ncpu; c++) {
        finish(&trs[c]);
        char name[64];
        snprintf(name, sizeof name, "cpu%d.pt", c);
        write_file(outdir, name, &trs[c]);
        fprintf(sum, "stream cpu %d %" PRIu64 " %" PRIu64 "\n", c, trs[c].insns, trs[c].total);
    }
}

static void thread_done(FILE *sum, const char *outdir, struct thread *th, struct tracer *tr)
{
    finish(tr);
    fprintf(sum, "exit %u %" PRIu64 "\n", th->tid, tr->t);
    char name[64];
    snprintf(name, sizeof name, "tid%u.pt", th->tid);
    write_file(outdir, name, tr);
    fprintf(sum, "stream tid %u %" PRIu64 " %" PRIu64 "\n", th->tid, tr->insns, tr->total);
    free(tr->buf);
    tr->buf = NULL;
}

/* schedule.run_threads: a tracer per thread, begun when the thread begins */
static void run_threads(FILE *sum, const char *outdir, int n)
{
    struct tracer *trs = calloc(nthreads + 1, sizeof *trs);
    int *begun = calloc(nthreads + 1, sizeof(int)), *started = calloc(nthreads + 1, sizeof(int));
    fval = g_t0;
    for (int k = 0; k < n; k++) {
        struct slice *x = &sl[k];
        int ti = (int)x->tid_i;
        struct thread *th = &threads[ti];
        struct tracer *tr = &trs[ti];
        uint64_t start = fr_at(x->h0);
        if (!begun[ti]) { begun[ti] = 1; tracer_init(tr, start); }
        else catch_up(th, tr, x, start, 1);
        ran(sum, x, tr, started);
        run_slice(th, tr, x);
        release(x);
        fr_add(x->h1, tr->t);
        if (x->last) {
            end_thread(th, tr);
            thread_done(sum, outdir, th, tr);
        }
    }
    for (int ti = 0; ti < nthreads; ti++)
        if (!begun[ti]) { tracer_init(&trs[ti], g_t0); thread_done(sum, outdir, &threads[ti], &trs[ti]); }
}

int main(int argc, char **argv)
{
    if (argc != 15) { fprintf(stderr, "usage: see ptgen_fast.c\n"); return 2; }
    const char *outdir = argv[3];
    int cpu_mode = strcmp(argv[4], "cpu") == 0;
    int ncpu = atoi(argv[5]);
    g_ctl = strtoull(argv[6], 0, 0);
    uint64_t cr3_match = strtoull(argv[7], 0, 0);
    g_t0 = strtoull(argv[8], 0, 0); g_nom = strtoull(argv[9], 0, 0);
    g_eax = strtoull(argv[10], 0, 0); g_ebx = strtoull(argv[11], 0, 0);
    g_long_tnt = atoi(argv[12]);
    if (strtoull(argv[14], 0, 0)) g_keep = (size_t)strtoull(argv[14], 0, 0);

    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) { perror(argv[1]); return 1; }
    LN = (size_t)st.st_size;
    L = LN ? mmap(0, LN, PROT_READ, MAP_PRIVATE, fd, 0) : (const unsigned char *)"";
    FILE *bf = fopen(argv[2], "rb");
    if (!bf) { perror(argv[2]); return 1; }
    fseek(bf, 0, SEEK_END);
    long nb = ftell(bf) / (long)sizeof(struct blk);
    fseek(bf, 0, SEEK_SET);
    blocks = malloc((nb ? nb : 1) * sizeof *blocks);
    blk_sizes = malloc((nb ? nb : 1) * sizeof *blk_sizes);
    if (nb && fread(blocks, sizeof *blocks, nb, bf) != (size_t)nb) { perror("blocks"); return 1; }
    fclose(bf);

    /* pass 1: tables, threads, segments */
    size_t o = rd32(4) >> 16;   /* hdr_size */
    o = (size_t)(L[6] | (L[7] << 8));
    long bi = 0;
    int cur_seg = -1;
    uint64_t last_time = 0;
    while (o < LN) {
        size_t sz = rec_size(o);
        if (!sz || o + sz > LN) { fprintf(stderr, "bad record at %zu\n", o); return 1; }
        switch (L[o]) {
        case 0x01: {
            uint32_t pid = rd32(o + 1), tid = rd32(o + 5);
            int ti = thread_of(tid, pid);
            procs[threads[ti].proc_i].seen = 1;
            if (cur_seg >= 0) segs[cur_seg].end = o;
            segs = realloc(segs, (nsegs + 1) * sizeof *segs);
            struct seg *s = &segs[nsegs];
            memset(s, 0, sizeof *s);
            s->tid_i = (uint32_t)ti; s->cpu = (int32_t)rd32(o + 9); s->time = last_time;
            s->start = o + sz; s->index = threads[ti].nseg++;
            cur_seg = nsegs++;
            proc_of(pid);
            if (curraw >= 0) raw[curraw].end = o;
            raw_open((uint32_t)ti, cur_seg, o + sz, last_time);
            raw[curraw].head = 1;       /* no TIME of the segment yet */
            break;
        }
        case 0x02:
            last_time = rd64(o + 1);
            if (cur_seg >= 0 && !segs[cur_seg].has_items) segs[cur_seg].time = last_time;
            if (cur_seg >= 0 && raw[curraw].head && !raw[curraw].items) {
                raw[curraw].h0 = last_time;         /* nothing before the segment's first TIME */
                raw[curraw].start = o;
                raw[curraw].head = 0;   /* a second TIME ends an empty slice (schedule.thread_slices) */
            } else if (cur_seg >= 0) {
                raw[curraw].end = o;
                raw_open(segs[cur_seg].tid_i, cur_seg, o, last_time);
            }
            break;
        case 0x03: {
            uint32_t pid = rd32(o + 1), id = rd32(o + 5);
            if (bi >= nb) { fprintf(stderr, "blocks file too short\n"); return 1; }
            int pi = proc_of(pid);
            procs[pi].seen = 1;
            blk_sizes[bi] = L + o + 21;
            table_set(&procs[pi].t, id, &blocks[bi++]);
            break;
        }
        case 0x04: case 0x05:
            if (cur_seg >= 0 && !segs[cur_seg].has_first && (L[o] == 0x05 || rd32(o + 1))) {
                struct seg *s = &segs[cur_seg];
                int pi = proc_of(threads[s->tid_i].pid);
                uint32_t id = rd32(o + (L[o] == 0x05 ? 1 : 5));
                struct blk *b = id < procs[pi].t.n ? procs[pi].t.b[id] : NULL;
                if (!b) { fprintf(stderr, "undefined block %u\n", id); return 1; }
                s->first_ip = b->pc; s->has_first = 1;
            }
            break;
        case 0x12: {
            uint32_t ppid = rd32(o + 1);
            if (ppid && cur_seg >= 0) {
                int ci = proc_of(threads[segs[cur_seg].tid_i].pid);
                int pi = proc_of(ppid);
                if (procs[pi].seen) hset_copy(&procs[ci].h, &procs[pi].h);  /* the handlers are inherited */
                struct table own = procs[ci].t, t = {0, 0};
                for (uint32_t i = 0; i < procs[pi].t.n; i++) if (procs[pi].t.b[i]) table_set(&t, i, procs[pi].t.b[i]);
                for (uint32_t i = 0; i < own.n; i++) if (own.b[i]) table_set(&t, i, own.b[i]);
                free(own.b);
                procs[ci].t = t;
            }
            break;
        }
        case 0x20:
            if (cur_seg >= 0 && rd64(o + 1) == 15) threads[segs[cur_seg].tid_i].scan = 1;  /* rt_sigreturn */
            break;
        case 0x23:
            if (cur_seg >= 0) hset_add(&procs[threads[segs[cur_seg].tid_i].proc_i].h, rd32(o + 1), rd64(o + 5));
            break;
        }
        if (cur_seg >= 0) {
            struct slice *r = &raw[curraw];
            switch (L[o]) {     /* records the Python loader keeps as items */
            case 0x04: if (rd32(o + 1)) segs[cur_seg].has_items = r->items = 1; break;
            case 0x05: case 0x06: case 0x11: case 0x13: case 0x14:
            case 0x20: case 0x21: case 0x22: case 0x23:
                segs[cur_seg].has_items = r->items = 1; break;
            }
            if (L[o] == 0x13) r->execs++;
            if (!r->has_first && ((L[o] == 0x04 && rd32(o + 1)) || L[o] == 0x05)) {
                int pi = proc_of(threads[segs[cur_seg].tid_i].pid);
                uint32_t id = rd32(o + (L[o] == 0x04 ? 5 : 1));
                struct blk *b = id < procs[pi].t.n ? procs[pi].t.b[id] : NULL;
                if (b) { r->first_ip = b->pc; r->has_first = 1; }
            }
        }
        o += sz;
    }
    if (cur_seg >= 0) segs[cur_seg].end = LN;
    if (curraw >= 0) raw[curraw].end = LN;
    /* CR3 filter: per-process context */
    FILE *cf = fopen(argv[13], "r");
    unsigned long cpid, ccr3;
    while (cf && fscanf(cf, "%lu %lu", &cpid, &ccr3) == 2)
        if (g_ctl & (1 << 7)) {
            int pi = proc_of((uint32_t)cpid);
            procs[pi].ctx_ok = ccr3 == cr3_match;
        }
    if (cf) fclose(cf);
    /* where signals were delivered (ptgen_signals.c) in each thread that may have run a
     * handler or returned from one; elsewhere step's interrupted() finds a delivery's IP */
    for (int pi = 0; pi < nprocs; pi++) procs[pi].handler_ran = sig_handler_ran(&procs[pi].h, &procs[pi].t);
    for (int ti = 0; ti < nthreads; ti++) {
        int hr = procs[threads[ti].proc_i].handler_ran;
        threads[ti].scan = hr == 2 || (hr && threads[ti].scan);
    }
    for (int si = 0; si < nsegs; si++) {
        struct thread *th = &threads[segs[si].tid_i];
        if (th->scan) sig_scan(&th->sig, &procs[th->proc_i].t, &procs[th->proc_i].h, segs[si].start, segs[si].end);
    }
    for (int ti = 0; ti < nthreads; ti++)
        if (threads[ti].scan) sig_done(&threads[ti].sig, &procs[threads[ti].proc_i].h);

    char sp[4096];
    snprintf(sp, sizeof sp, "%s/summary.txt", outdir);
    FILE *sum = fopen(sp, "w");
    int nsl = build_slices();
    if (cpu_mode) run_cpus(sum, outdir, ncpu, nsl);
    else run_threads(sum, outdir, nsl);
    fclose(sum);
    return 0;
}

/*
 * Where signals were delivered, for the compiled generator: the C twin of
 * flow._find_signals (and of flow.load's handlers / sync_handlers).
 *
 * QEMU logs no delivery.  A delivery is a transfer no instruction explains
 * (or an indirect one into a handler) while the thread is in user code; the
 * IP it interrupted is where the handler's rt_sigreturn resumes, known only
 * later in the thread's records: so a first pass over each thread (this
 * file) collects the deliveries, and the run (ptgen_fast.c) replays them as
 * the Python generator does its SIGNAL items.  A handler entered at a kernel
 * exit is no SIGNAL item, but its rt_sigreturn resumes where the handler it
 * interrupted would have (a delivery on another handler's rt_sigreturn).  A
 * fault signal's handler resuming inside the block before it cuts that
 * block before the faulting instruction; a block EXEC_PART cut short puts
 * the signal right after it, wherever the handler returns.
 */
#include <stdlib.h>
#include <string.h>

#include "ptgen_signals.h"

#define NR_RT_SIGRETURN 15

/* flow.SYNC_SIGNALS: SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV */
static int sync_signo(uint32_t s) { return s == 4 || s == 5 || s == 7 || s == 8 || s == 11; }

void hset_add(struct hset *h, uint32_t signo, uint64_t handler)
{
    if (handler <= 1) return;           /* SIG_DFL, SIG_IGN */
    int sync = sync_signo(signo);
    for (int i = 0; i < h->n; i++)
        if (h->pc[i] == handler) { h->sync[i] |= (uint8_t)sync; return; }
    h->pc = realloc(h->pc, (h->n + 1) * sizeof *h->pc);
    h->sync = realloc(h->sync, (h->n + 1) * sizeof *h->sync);
    h->pc[h->n] = handler;
    h->sync[h->n] = (uint8_t)sync;
    h->n++;
}

void hset_copy(struct hset *dst, const struct hset *src)
{
    dst->n = src->n;
    dst->pc = realloc(dst->pc, (src->n + 1) * sizeof *dst->pc);
    dst->sync = realloc(dst->sync, (src->n + 1) * sizeof *dst->sync);
    if (src->n) {
        memcpy(dst->pc, src->pc, src->n * sizeof *dst->pc);
        memcpy(dst->sync, src->sync, src->n * sizeof *dst->sync);
    }
}

int hset_has(const struct hset *h, uint64_t pc)
{
    for (int i = 0; i < h->n; i++) if (h->pc[i] == pc) return 1;
    return 0;
}

int sig_handler_ran(const struct hset *h, const struct table *t)
{
    if (!h->n) return 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->b[i] && hset_has(h, t->b[i]->pc)) return 2;
    return 1;
}

static int hset_sync(const struct hset *h, uint64_t pc)
{
    for (int i = 0; i < h->n; i++) if (h->pc[i] == pc) return h->sync[i];
    return 0;
}

/* a delivery: the handler's first block (off, k), the block before it */
struct sigfix {
    size_t off, poff; uint32_t k, pk;
    struct blk prev; const unsigned char *prev_sz; int prev_cut;
    uint64_t handler; int slot;
};

#define PUSH(arr, n, cap, v) do { \
    if ((n) == (cap)) { (cap) = (cap) ? 2 * (cap) : 16; (arr) = realloc((arr), (cap) * sizeof *(arr)); } \
    (arr)[(n)++] = (v); } while (0)

static uint32_t rd32s(size_t o) { uint32_t v; memcpy(&v, L + o, 4); return v; }
static uint64_t rd64s(size_t o) { uint64_t v; memcpy(&v, L + o, 8); return v; }

/* flow._explained */
static int explained(const struct blk *p, uint64_t pc, const struct hset *h)
{
    switch (p->kind) {
    case K_OTHER: return pc == p->nlip;
    case K_REP: return pc == p->nlip || pc == p->last;
    case K_JCC: return pc == p->target || pc == p->nlip;
    case K_JMP: case K_CALL: return pc == p->target;
    case K_TRAP: return 1;
    }
    return !hset_has(h, pc);
}

static void visit(struct sigscan *s, const struct hset *h, const struct blk *b,
                  const unsigned char *sz, int cut, size_t off, uint32_t k)
{
    if (!s->in_user && hset_has(h, b->pc) &&
            (!s->has_prev || s->prev.kind != K_TRAP || b->pc != s->prev.nlip)) {
        /* delivered at a kernel exit, maybe on another handler's rt_sigreturn */
        PUSH(s->deliv, s->ndeliv, s->capdeliv, -s->resume);
        s->resume = 0;
    } else if (s->resume) {
        s->slots[s->resume - 1] = b->pc;
        s->resume = 0;
    }
    if (s->in_user && s->has_prev && !explained(&s->prev, b->pc, h)) {
        PUSH(s->slots, s->nslots, s->capslots, 0);
        PUSH(s->deliv, s->ndeliv, s->capdeliv, (int64_t)s->nslots);
        struct sigfix f = {off, s->prev_off, k, s->prev_k, s->prev, s->prev_sz, s->prev_cut,
                           b->pc, s->nslots - 1};
        PUSH(s->fix, s->nfix, s->capfix, f);
    }
    s->in_user = 1;
    s->prev = *b; s->prev_sz = sz; s->prev_cut = cut;
    s->prev_off = off; s->prev_k = k;
    s->has_prev = 1;
}

void sig_scan(struct sigscan *s, const struct table *tab, const struct hset *h,
              size_t start, size_t end)
{
    for (size_t o = start; o < end; o += rec_size(o)) {
        if (L[o] == 0x04) {
            uint32_t n = rd32s(o + 1);
            for (uint32_t k = 0; k < n; k++) {
                struct blk *b = tab->b[rd32s(o + 5 + 4 * k)];
                visit(s, h, b, blk_sizes[b - blocks], 0, o, k);
            }
        } else if (L[o] == 0x05) {
            struct blk *b = tab->b[rd32s(o + 1)];
            const unsigned char *sz = blk_sizes[b - blocks];
            uint32_t left = (uint32_t)(L[o + 5] | (L[o + 6] << 8));
            if (left >= b->ninsn) { visit(s, h, b, sz, 0, o, 0); continue; }
            struct blk cut = {b->pc, 0, 0, b->pc, left, K_OTHER, {0}};
            for (uint32_t k = 0; k < left; k++) cut.nlip += sz[k];
            if (left) cut.last = cut.nlip - sz[left - 1];
            visit(s, h, &cut, sz, 1, o, 0);
        } else if (L[o] == 0x20) {
            s->in_user = 0;
            if (rd64s(o + 1) == NR_RT_SIGRETURN && s->ndeliv) {
                int64_t d = s->deliv[--s->ndeliv];
                s->resume = d > 0 ? d : -d;
            }
        }
    }
}

void sig_done(struct sigscan *s, const struct hset *h)
{
    for (int i = 0; i < s->nfix; i++) {
        const struct sigfix *f = &s->fix[i];
        const struct blk *p = &f->prev;
        uint64_t ip = s->slots[f->slot];
        if (f->prev_cut)
            ip = p->nlip;
        else if (ip && hset_sync(h, f->handler) && p->pc <= ip && ip <= p->last) {
            /* a fault: the instructions from ip on never retired */
            uint64_t a = p->pc;
            for (uint32_t j = 0; j < p->ninsn; a += f->prev_sz[j], j++)
                if (a == ip) {
                    struct sigev e = {f->poff, f->pk, 1, j, ip};
                    PUSH(s->ev, s->nev, s->capev, e);
                    break;
                }
        }
        if (!ip) ip = (p->kind == K_JMP || p->kind == K_CALL) ? p->target : p->nlip;
        struct sigev e = {f->off, f->k, 0, 0, ip};
        PUSH(s->ev, s->nev, s->capev, e);
    }
    /* in program order already: a fix's block before is just before its
     * handler's first block, itself at or before the next fix's block before */
    free(s->deliv); free(s->slots); free(s->fix);
    s->deliv = NULL; s->slots = NULL; s->fix = NULL;
    s->ndeliv = s->nslots = s->nfix = 0;
}

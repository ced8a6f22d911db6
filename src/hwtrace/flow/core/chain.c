/* The walk's TNT chain cache: see chain.h. */
#include <stddef.h>
#include <stdlib.h>

#include "bigarr.h"
#include "block.h"
#include "chain.h"
#include "walk.h"

#define CHAIN_MAX_EDGES 255     /* a chain stops before more */
/* chains are looked up with any TNT bit left (tnt_index >= 1): since they
 * take a packet's last bit, short packets chain too (python3 recording:
 * 9.1 G instructions under cachegrind against 10.4 G with 5 bits at least,
 * tnt_index >= 16); a CFLAGS -DCHAIN_MIN_INDEX=16 build tries that */
/* (CHAIN_MIN_INDEX, CHAIN_MAX_INSNS: chain.h) */
/* a chain's counts fit its 16-bit fields: insns <= CHAIN_MAX_INSNS, bn <
 * MAX_BLOCK_INSNS, nedges <= CHAIN_MAX_EDGES */
_Static_assert(CHAIN_MAX_INSNS <= 0xFFFF && MAX_BLOCK_INSNS <= 0xFFFF &&
               CHAIN_MAX_EDGES <= 0xFF, "chain counts are 16-bit (nedges "
               "8-bit)");
/* the fields the walk reads first share a cache line */
_Static_assert(offsetof(struct chain, last_run) + sizeof(struct run *) <= 64,
               "struct chain's first cache line");
/* Tried and not taken (python3 recording, decode --quiet --stat DIR,
 * cachegrind, the core's functions alone: 8.08 G instructions, 31.2 M D1
 * read misses here): the last 4 lookups kept on the run at the decoder's
 * IP (looked up and kept among the last run's successors where they miss)
 * instead of this table took its probes from 3.2 M to 0.22 M but gave
 * 8.30 G / 33.8 M -- the lookups only move to other cache lines of a
 * larger run, as each block's run and chain entry are misses anyway;
 * 8.29 G / 32.5 M with struct run laid out by cache line; 4 (not 1) last
 * other successors per run: 8.09 G / 34.0 M (half the image lookups, a
 * larger run); that layout alone: 8.09 G / 30.8 M, inside the noise of a
 * timed run.  Taken since (cachegrind --cache-sim=yes, core functions,
 * python3 recording, decode --quiet --stat DIR: 6.702 G / 30.17 M D1 read
 * misses before): the last chain's successor tried first (chain_get),
 * 6.703 G / 28.85 M, and a chain's hot fields in its first cache line,
 * 6.670 G / 26.61 M.  Tried after them and not taken: the chain's next
 * entry as the block walk's ``known`` where it leaves no block open (no
 * run lookup at its end), 6.668 G / 26.86 M; blk_count reading a run's
 * last_ip only for the block's last run, 6.727 G / 25.28 M (5% fewer
 * misses for 58 M more instructions: at this core's ~3 instructions a
 * cycle, a wash; the timed runs could not tell them apart); the block
 * walk not reading the chain's next entry (on its second line; only the
 * instruction walk uses it), 6.665 G / 26.63 M against 6.670 G / 26.70 M
 * and L2-sized (512 KiB) last-level misses 6.07 M against 6.08 M: the
 * walk reads that line anyway for the calls it pushes or the open
 * block; prefetching the returned chain's successor entry (cachegrind
 * does not model it): perf cpu-clock samples, two runs each, walk 28.9 /
 * 29.4% and chain_get 13.4 / 13.9% of the process without, 30.2 / 29.0%
 * and 14.4 / 13.6% with -- nothing to see.
 *
 * Issue 15's edges target (coverage --edges; python3 recording,
 * fast.edges in process, cachegrind --cache-sim=no, whole process with
 * start-up and the result's sort: 8.05 G at bebfa56).  The floor: a scratch
 * C loop over that stream's packets reading every TNT bit and
 * decompressing every TIP's IP (27.4 M bits, 4.38 M TIPs, no graph) takes
 * 0.06 s CPU (0.08 s sqlite3), so the walk's ~0.5 s is the graph's
 * memory and bookkeeping, not the packets.  Taken, one after another: a
 * chain starting at the branch that needs a new TNT packet (its bits
 * cached ahead of the query), 7.15 G; chains looked up with the next
 * packet's bits from anywhere (after a TIP, a run), 7.09 G (~1%, kept as
 * the base of the next); a TIP's indirect branch through insn_next_tip,
 * 6.83 G; the key's bits unreversed and the peeked TNT cached without a
 * second test, 6.59 G; a compressed return without its call as a chain's
 * last step (CHAIN_RET, 7.2 M fewer general steps), 6.09 G; the
 * successor guess inline in the walk (chain.h), 5.77 G.  Tried after the
 * TIP step went inline (5.564 G; cachegrind --cache-sim=yes with a
 * 512 KiB LL: 28.53 M D1 / 10.52 M LL read misses) and not taken: a
 * second successor guess per chain (succ2, the one before succ, swapped
 * on a hit): chain_find's calls fell by 42%, but 5.525 G / 28.33 M /
 * 10.65 M -- the field made struct chain three cache lines, and the timed
 * runs could not tell them apart (0.46-0.70 s against 0.50-0.58 s).
 * Where the walk's time goes at 643848e (python3 recording, one
 * fast.edges call, cachegrind with this host's caches: D1 48 KiB, LL
 * 1 MiB): 4.52 G instructions for the whole process, ~3.6 G of them the
 * walk (with chain_find and ic_run), ~200 per chain applied or step taken
 * -- as much instructions as misses (those functions' D1 read misses
 * 12.8 M, LL 2.65 M).
 * Counts: 9.81 M chain lookups, 7.63 M of them the successor guess,
 * 2.17 M chain_find (0.25 M on the run, 1.88 M in the table, 45 K new
 * chains), 9.52 M chains applied, 1.29 M runs and 5.17 M steps (4.38 M
 * of them TIPs), 0.67 M ic_run (0.26 M from the walk's run step).  Taken: two
 * store-forwarding stalls out of the TIP and TNT steps (insn_next_tip,
 * ft_mark; perf put 6.6% and 8.2% of walk's samples after them), the
 * return stack's index wrapped unsigned (4.502 G -> 4.447 G).  Tried
 * then and not taken: a direct-mapped front of 64 Ki chain indices
 * before the table (chain_find's table lookups mostly hit the 1 MiB LL
 * already: 4.447 G / 19.67 M D1 / 5.90 M LL read misses -> 4.430 G /
 * 19.41 M / 5.83 M, about 0.4% of the time); the guessed chain's second
 * line prefetched beside its first, and d->status in its own 8-byte word
 * (GCC tests its bits with process_event's through one 8-byte load, after
 * a 4-byte store of status: perf 1.5% -> 0.9% of walk's samples at the
 * one such load that showed) -- timed runs on a machine loaded 2-9 on 2
 * CPUs could not tell either apart.
 *
 * Issue 15's counts target (decode --quiet --stat: the block walk;
 * python3 recording, fast.count(..., "block") in process, cachegrind
 * --cache-sim=no: 6.526 G at 8f70b92).  Taken: CHAIN_RET in the block
 * walk's chains, 6.006 G; blk_count's TIP step through insn_next_tip,
 * 5.571 G; blk_count caching the next TNT packet for the instruction it
 * steps (the block walk looks chains up with no entry at hand, so no
 * packet was cached where none applied), 4.876 G.  Tried at 5.571 G and
 * not taken: the pushes pinned (CHAIN_PIN) in block chains that leave no
 * block open (lo, last unused then): 5.551 G, and with --cache-sim=yes
 * (512 KiB LL) 28.27 M D1 / 8.03 M LLd misses against 28.30 M / 8.01 M
 * -- nothing to see.
 *
 * Issue 15's edges target again (python3 recording, one fast.edges in
 * process, whole process under cachegrind --cache-sim=yes
 * --LL=1048576,16,64 -- instructions / D1 / LL read misses; 4.495 G /
 * 19.96 M / 5.90 M at a189af6; perf cpu-clock then: walk 41% of the
 * samples, chain_find 17% (its table slot's load 42% of them, the entry's
 * 21%, the previous run's successors 12%), ic_run 8%).  Taken: the edge
 * out of a chain to the step after it counted on the chain (out_n), 4.495
 * G / 18.69 M / 5.63 M; the TIP step after a chain from the chain's nk
 * (no insn entry read), 4.498 G / 17.72 M / 5.58 M; 8-byte table slots
 * and no lookup on the run at the decoder's IP, 4.464 G / 16.69 M /
 * 5.47 M (fast.count's block walk: 5.165 G / 22.87 M -> 5.099 G /
 * 21.92 M).  Counts (a counting build, not kept): 9.52 M chains
 * applied, 3.61 M of them ending at a return whose call they have not
 * (CHAIN_RET), 3.28 M before an indirect branch, 2.62 M out of key bits
 * (0.39 M at a return); bits taken per chain 1: 2.93 M, 2: 2.58 M, 3:
 * 1.02 M, 4: 0.73 M, 5: 0.40 M, 6: 1.86 M, with at most 6 at hand (TNT-8
 * packets: k is 6 for 3.23 M).  So chains stop at the trace's indirect
 * branches and returns far more than at a packet's end: a TNT refill
 * across packets could merge at most the 2.2 M that run out of bits at a
 * conditional branch, and a per-branch node graph takes a step per bit
 * (27.4 M) where chains take one per 2.9 bits.  What is left is about
 * one miss per chain applied (the successor guess's entry: 13% of walk's
 * samples on its first load), two per chain_find (slot, entry) and one
 * per edge-table front slot: 4x libipt on this recording needs fewer
 * chains per TIP interval (2.2 now: a key with the return's target
 * would let a chain run on through CHAIN_RET), not cheaper ones.
 *
 * The return's target in the key, tried and not taken (python3
 * recording; the code is commit 7b4958a, reverted):
 * where a chain stops at a return whose call it has not (CHAIN_RET),
 * chain_find looked up a second key, (ip0, bits, the return stack's top),
 * whose chain pops that top at the return and runs on (CHAIN_TOP; the
 * base entry's succ kept the last such chain, tried before the table;
 * uses and in_n 32-bit to make room for the top on the second line).
 * Exact (coverage --edges and decode --quiet --stat byte-identical on the
 * bench bundles, flowdiff, the chain check build), and it does what it
 * says -- coverage --edges: chains applied 9.52 M -> 7.01 M (CHAIN_RET
 * 3.61 M -> 0.78 M), decode --stat's block walk 7.98 M -> 5.93 M -- but
 * the successor guess misses more often (a chain's successor keyed by
 * the top varies with the caller): chain_find 2.17 M -> 3.05 M calls
 * (1.78 M of them for a top-keyed chain, each two lookups: 1.55 M found
 * through the base's succ, 0.23 M through the table), and 45 K -> 60 K
 * chains.  Whole process under cachegrind (--cache-sim=yes
 * --LL=1048576,16,64), coverage --edges -q DIR: 4.249 G instructions /
 * 14.58 M D1 / 4.79 M LL read misses before, 4.349 G / 14.60 M / 5.23 M
 * with it; decode --quiet --stat DIR: 5.096 G / 20.68 M / 4.47 M before,
 * 5.034 G / 20.68 M / 4.79 M with it.  fast.edges in process
 * (bench_coverage, best of 3, three runs each alternated, load 2-4 on 2
 * CPUs): 0.535-0.616 s before, 0.629-0.645 s with it.  Fewer chains, the
 * same D1 misses and more LL ones: the lookups the merged chains save
 * were mostly hits of the successor guess.
 *
 * Issue 15's edges target, third pass (python3 recording, coverage
 * --edges DIR, whole process under cachegrind --cache-sim=no: 6.726 G at
 * d448510).  Taken: the MTCs after a peeked TNT taken from the peek's
 * position (q_cache_tnt_to), 6.678 G; the key's bits under a leading one
 * (chain_key_top: a mask, not a bit count), 6.524 G; chain_add out of
 * chain_find's frame, 6.504 G; chain_get's flag checks skipped after a
 * chain (plain), the session's count once per walk, 6.315 G; the TIP
 * step after a chain checking only the query's part, 6.232 G; a TNT-8
 * next is clean for chain_status_clean, 6.141 G.  Counts then (a counting
 * build, not kept): 69.5 K chains (51 K applied), a 2 MiB table; 15.9 M
 * chains applied -- 4.1 M right after a TIP step, 10.8 M after a chain;
 * chain_find 4.2 M times, 1.0 M of them after a TIP (the successor guess
 * hits 76% there: CPython's dispatch is more regular than it looks),
 * 2.4 M after a chain.  Tried and not taken: a look-ahead that scanned
 * the packets two TIPs ahead (the target by the last-IP rules, the next
 * TNT-8's byte as the key) and prefetched the key's slot, then its
 * entry: the scan took 10% of the samples (a mispredicted branch per
 * packet kind) and chain_find's share did not move (the lookups after
 * TIPs are the fewest); the table at load 0.75 instead of 0.5 (1 MiB, not
 * 2): fast.edges in process 0.525 s against 0.527 s; -O3: 6.97 G against
 * 6.52 G.  Fewer instructions gave less time than their share (perf:
 * 8.7% fewer, ~5-9% faster in process on a loaded machine): what is left
 * is the chain entries' misses (the successor guess's first load) and
 * building the chains: perf with DWARF call graphs put 5.2% of the
 * samples in ic_run under new_chain (0.9% under the walk's run step),
 * 2.4% in the instruction cache's find, 1.5-2% in new_chain itself.
 * build() trying the last run's successors (run_succ) before ic_run, as
 * the walk's run step does: the same instructions and time (0.525 s
 * against 0.522 s in process) -- a chain is built where the walk first
 * gets there, before any successor is known.
 *
 * Issue 15's edges target, fourth pass (python3 recording, coverage
 * --edges --quiet DIR, whole commands timed interleaved on a loaded
 * 2-CPU machine, best of 9: 0.73-0.76 s before).  Taken: the instruction
 * walk prefetching both lines of the applied chain's successor (the
 * guess chain_get tries next; its first load had 15% of sess_run's
 * samples), ~3-5%; build() taking a plain run's terminating branch from
 * the run's term instead of a lookup of the run at its next_ip (a hash
 * probe and a run's line per run a chain goes through), ~5% (decode
 * --quiet --stat's block walk ~8%); the key table at load 3/4 (memory
 * zeroed at first touch, which perf put at 1-10% of the samples from
 * run to run on this VM).  Tried and not taken: the same prefetch in the
 * block walk (decode --quiet --stat: no difference the timed runs could
 * show). */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static uint64_t chain_hash(uint64_t ip, const void *ic, uint32_t tag)
{
    return mix(ip ^ ((uint64_t)tag << 40) ^ ((uintptr_t)ic << 12));
}

/* -- building ---------------------------------------------------------------- */

struct sim {                    /* a chain being built */
    uint64_t stack[RS_CAP];     /* the chain's own calls */
    int sn, depth;
    struct chain_edge *edges;
    uint32_t nedges, edges_cap;
    uint64_t from;
    int have_from;
};

/* the edge into ``to``: 0, 1 (the chain stops before), -E_NOMEM */
static int sim_edge(struct sim *m, uint64_t to)
{
    if (!m->have_from)
        return 0;
    if (m->nedges == CHAIN_MAX_EDGES)
        return 1;
    if (m->nedges == m->edges_cap) {
        uint32_t cap = m->edges_cap ? 2 * m->edges_cap : 8;
        struct chain_edge *ne = realloc(m->edges, cap * sizeof *ne);
        if (!ne)
            return -E_NOMEM;
        m->edges = ne;
        m->edges_cap = cap;
    }
    m->edges[m->nedges++] = (struct chain_edge){m->from, to};
    m->have_from = 0;
    return 0;
}

/* the state a chain leaves, kept as it is built */
struct end {
    int c;
    uint32_t insns, blocks, pre, icount, bn;
    int have_bounds;
    uint64_t lo, last, ip, last_ip, blk_end;
    struct run *last_run;
};

#define CHAIN_MEM_CHUNK ((size_t)64 << 10)

/* n bytes (8-byte aligned) for a chain's push or edges array, or NULL:
 * carved from the cache's hugemem chunks and freed with the cache
 * (chain_free), not a malloc each -- a large trace's tens of thousands of
 * chains otherwise spread over fresh heap pages, each a page fault
 * (python3-0: ~1,000) */
static void *chain_mem(struct chain_cache *cc, size_t n)
{
    n = (n + 7) & ~(size_t)7;
    if (cc->left < n) {
        size_t c = n > CHAIN_MEM_CHUNK ? n : CHAIN_MEM_CHUNK;
        char *p = hm_chunk(&cc->mem, c);
        if (!p)
            return NULL;
        cc->bump = p;
        cc->left = c;
    }
    void *p = cc->bump;
    cc->bump += n;
    cc->left -= n;
    return p;
}

/* the chain from (ip0, mode) with the k bits ``bits`` into *ch:
 * the steps insn_next_quick / blk_count would take, each whole or not at
 * all, up to the first one that needs trace beyond the key's bits */
static int build(struct chain_cache *cc, struct insn_dec *d, struct chain *ch,
                 uint64_t ip0, int mode, int k, int bits, struct sim *m)
{
    struct icache *ic = d->ic;
    int err = 0, edges = cc->edges, seen_query = 0, outer = 0;
    struct end e;
    memset(&e, 0, sizeof e);
    e.ip = ip0;
    const struct insn_info *next = NULL;
    /* the entry at e.ip where the run before it knows it (its term: the
     * branch that ends it), else NULL */
    const struct insn_info *term = NULL;
    for (;;) {
        next = NULL;
        struct run *ru = NULL;
        const struct insn_info *i = term;
        term = NULL;
        if (!i) {
            ru = ic_run(ic, e.ip, mode, &err);
            if (!ru) {
                if (err < 0)
                    return err;
                break;
            }
        }
        if (ru && ru->n) {
            if (e.insns + ru->n > CHAIN_MAX_INSNS ||
                e.bn + ru->n >= MAX_BLOCK_INSNS)
                break;
            if (edges) {
                int r = sim_edge(m, ru->ip);
                if (r < 0)
                    return r;
                if (r)
                    break;
            }
            e.insns += ru->n;
            e.icount += ru->n;
            e.bn += ru->n;
            if (!e.have_bounds) {
                e.lo = ru->lo;
                e.last = ru->last;
                e.have_bounds = 1;
            }
            e.ip = ru->next_ip;
            e.last_ip = ru->last_ip;
            e.last_run = ru;
            if (cc->block && !(e.lo <= e.ip && e.ip <= e.last)) {
                e.blocks++;             /* the block leaves its mapping */
                e.blk_end = e.last_ip;
                e.bn = 0;
                e.have_bounds = 0;
            }
            /* the branch that ends the run, from the run (a copy of its
             * entry: what the run at next_ip, a run of none, has as its
             * first) instead of that run's lookup -- one hash probe and
             * one run's line less per run a chain is built through (a
             * miss each: ic_run had 7% of coverage --edges's samples on
             * python3 from here) */
            term = ru->term;
            continue;
        }
        if (ru)
            i = ru->first;
        if (!i || i->err || i->ip != e.ip || i->mode != mode)
            break;
        next = i;
        if (e.insns + 1 > CHAIN_MAX_INSNS || e.bn + 1 >= MAX_BLOCK_INSNS)
            break;
        uint64_t fall = e.ip + i->size, ip;
        int bit = -1, to_top = 0;
        switch (i->iclass) {
        case C_COND:
            if (e.c == k)
                goto out;
            bit = (bits >> (k - 1 - e.c)) & 1;
            ip = bit ? fall + (uint64_t)i->rel : fall;
            break;
        case C_CALL: case C_JUMP:
            if ((i->flags & IF_INDIRECT) || e.icount + 1 > CHAIN_MAX_INSNS)
                goto out;
            if (i->iclass == C_CALL && i->rel && m->sn == RS_CAP)
                goto out;
            ip = fall + (uint64_t)i->rel;
            break;
        case C_RETURN:
            if (e.c == k || !((bits >> (k - 1 - e.c)) & 1))
                goto out;
            if (!m->sn) {
                /* a return the chain has not the call of: its last step,
                 * to the return stack's top (block walk: it ends the
                 * block, so the chain leaves none open) */
                to_top = 1;
                ip = 0;
            } else {
                ip = m->stack[m->sn - 1];
            }
            bit = 1;
            break;
        default:
            goto out;
        }
        if (edges) {
            int r = sim_edge(m, i->ip);
            if (r < 0)
                return r;
            if (r)
                break;
        }
        /* the step is taken */
        outer = to_top;
        if (i->iclass == C_CALL && i->rel)
            m->stack[m->sn++] = fall;
        else if (i->iclass == C_RETURN && !outer)
            m->sn--;
        if (m->sn > m->depth)
            m->depth = m->sn;
        m->from = i->ip;
        m->have_from = 1;
        e.ip = ip;
        e.last_ip = i->ip;
        e.insns++;
        e.bn++;
        if (!e.have_bounds) {
            e.lo = i->lo;
            e.last = i->last;
            e.have_bounds = 1;
        }
        int ends;
        if (bit >= 0) {
            ends = 1;
            e.icount = 0;
            e.c++;
            if (!seen_query) {
                seen_query = 1;
                e.pre = e.insns;
            }
        } else {
            e.icount++;
            ends = i->iclass == C_CALL ? cc->end_on_call : cc->end_on_jump;
        }
        if (cc->block && (ends || !(e.lo <= e.ip && e.ip <= e.last))) {
            e.blocks++;
            e.blk_end = e.last_ip;
            e.bn = 0;
            e.have_bounds = 0;
        }
        if (outer) {
            next = NULL;        /* the entry after it is not known */
            break;
        }
    }
out:
    if (!e.c)
        return 0;               /* no chain: nothing gained */
    /* the calls it leaves on the return stack */
    uint64_t *push = NULL;
    int pin = !cc->block && m->sn <= CHAIN_PIN_MAX;
    if (m->sn && !pin) {
        push = chain_mem(cc, m->sn * sizeof *push);
        if (!push)
            return -E_NOMEM;
        memcpy(push, m->stack, m->sn * sizeof *push);
    }
    struct chain_edge *ce = NULL;
    if (m->nedges) {
        ce = chain_mem(cc, m->nedges * sizeof *ce);
        if (!ce)
            return -E_NOMEM;    /* (push: freed with the cache) */
        memcpy(ce, m->edges, m->nedges * sizeof *ce);
    }
    ch->push = push;
    ch->npush = (uint8_t)m->sn;
    ch->depth = (uint8_t)m->depth;
    ch->edges = ce;
    ch->nedges = (uint8_t)m->nedges;
    if (next && next->ip == e.ip && next->mode == mode && !next->err &&
        (next->flags & IF_INDIRECT) &&
        (next->iclass == C_JUMP || next->iclass == C_CALL ||
         next->iclass == C_RETURN) && next->size && next->size <= 15)
        ch->nk = (uint8_t)(next->size | next->iclass << 4);
    ch->have_from = (uint8_t)(m->have_from | (outer ? CHAIN_RET : 0));
    ch->c = (uint8_t)e.c;
    ch->insns = (uint16_t)e.insns;
    ch->pre = (uint16_t)e.pre;
    ch->icount = (uint16_t)e.icount;
    if (cc->block) {            /* (else out_n, 0 from new_chain) */
        ch->blocks = (uint16_t)e.blocks;
        ch->bn = (uint16_t)e.bn;
    }
    ch->lo = e.lo;
    ch->last = e.last;
    ch->end_ip = e.ip;
    ch->last_ip = e.last_ip;
    ch->next = next;
    ch->last_run = e.last_run;
    if (cc->block)
        ch->blk_end = e.blk_end;
    ch->ip0 = ip0;
    if (pin) {                  /* over lo, last: the block walk's */
        memcpy(ch->pin, m->stack, m->sn * sizeof *m->stack);
        ch->have_from |= CHAIN_PIN;
    }
    return 0;
}

/* -- the table ----------------------------------------------------------------- */

/* a key's slot fingerprint (never 0: 0 is an empty slot) */
static inline uint32_t slot_fp(uint64_t h)
{
    return (uint32_t)(h >> 32) | 1;
}

static int grow(struct chain_cache *cc)
{
    size_t cap = cc->cap ? 2 * cc->cap : 4096;
    struct chain_slot *nt = ba_zalloc(cap * sizeof *nt);
    if (!nt)
        return -E_NOMEM;
    for (size_t j = 0; j < cc->cap; j++) {
        struct chain_slot *x = &cc->tab[j];
        if (!x->fp)
            continue;
        const struct chain *ch = &cc->ents[x->idx - 1];
        size_t i = chain_hash(ch->ip0, ch->ic, ch->tag) & (cap - 1);
        while (nt[i].fp)
            i = (i + 1) & (cap - 1);
        nt[i] = *x;
    }
    ba_free(cc->tab, cc->cap * sizeof *cc->tab);
    cc->tab = nt;
    cc->cap = cap;
    return 0;
}

/* a new entry for the key (k, bits) at the decoder's IP: its index + 1
 * (c 0: no chain there), or < 0 */
static long long new_chain(struct chain_cache *cc, struct insn_dec *d, int k,
                           int bits, uint32_t tag)
{
    if (cc->nents == cc->ents_cap) {
        size_t cap = cc->ents_cap ? 2 * cc->ents_cap : 1024;
        /* aligned: each entry starts a cache line (chain.h); a large
         * array grows in place (bigarr.h) */
        _Static_assert(_Alignof(struct chain) <= 64,
                       "ba_grow aligns to 64 bytes");
        struct chain *ne = ba_grow(cc->ents, cc->ents_cap * sizeof *ne,
                                   cap * sizeof *ne);
        if (!ne)
            return -E_NOMEM;
        cc->ents = ne;
        cc->ents_cap = cap;
    }
    struct chain *ch = &cc->ents[cc->nents];
    memset(ch, 0, sizeof *ch);
    ch->ip0 = d->ip;
    ch->ic = d->ic;
    ch->tag = tag;
    struct sim m;
    m.sn = m.depth = 0;
    m.edges = NULL;
    m.nedges = m.edges_cap = 0;
    m.have_from = 0;
    int r = build(cc, d, ch, d->ip, d->mode, k, bits, &m);
    free(m.edges);
    if (r < 0)
        return r;               /* (build allocates nothing then) */
    return (long long)++cc->nents;
}

/* The check build (CFLAGS -DCHAIN_CHECK, tests/test_flow_fast.py): the
 * shortcut past the table -- the last chain's successor -- is checked
 * against the table on every use (it must have the key, with the same
 * chain), and its uses counted on stderr at the walk's end.  Not in the
 * normal build. */
#ifdef CHAIN_CHECK
#include <stdio.h>
static unsigned long long checked_succ;
static void check_idx(const struct chain_cache *cc, uint64_t ip,
                      const struct icache *ic, uint32_t tag, uint32_t idx,
                      unsigned long long *n)
{
    size_t mask = cc->cap - 1;
    uint64_t h = chain_hash(ip, ic, tag);
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const struct chain_slot *sl = &cc->tab[i];
        if (!sl->fp)
            break;
        const struct chain *ch = &cc->ents[sl->idx - 1];
        if (ch->ip0 == ip && ch->tag == tag && ch->ic == ic) {
            if (sl->idx != idx || sl->fp != slot_fp(h))
                break;
            ++*n;
            return;
        }
    }
    fprintf(stderr, "chain check: shortcut at %#llx tag %#x gave %u, the "
            "table not\n", (unsigned long long)ip, tag, idx);
    abort();
}

void chain_check_succ(const struct chain_cache *cc, uint64_t ip,
                      const struct icache *ic, uint32_t tag, uint32_t idx)
{
    check_idx(cc, ip, ic, tag, idx, &checked_succ);
}
#endif

/* chain_find's miss: a new entry for the key in the empty slot sl (its
 * index + 1, c 0 where no chain applies), or < 0 -- out of line, so that
 * the lookup's hits (nine in ten on python3) keep a small frame (the
 * build inlined into chain_find saved and restored eleven registers at
 * every lookup) */
static __attribute__((noinline, cold)) long long
chain_add(struct chain_cache *cc, struct insn_dec *d, uint32_t tag,
          struct chain_slot *sl, uint32_t fp)
{
    int k = chain_tag_k(tag);
    long long r = new_chain(cc, d, k, (int)(tag & ((1u << k) - 1)), tag);
    if (r < 0)
        return r;
    sl->fp = fp;
    sl->idx = (uint32_t)r;
    cc->n++;
    return r;
}

static __attribute__((noinline, cold)) int chain_grow(struct chain_cache *cc)
{
    return grow(cc);
}

struct chain *chain_find(struct chain_cache *cc, struct insn_dec *d,
                         uint32_t tag, int *err)
{
    uint64_t ip = d->ip;
    uint32_t idx;
    /* grown past a load of 3/4, not 1/2 (a slot is 8 bytes with its
     * fingerprint: a probe past another key reads no entry): the python3
     * recording's 69 K keys take a 1 MiB table at load 0.53, not 2 MiB at
     * 0.26 after a 1 MiB one, pages zeroed at first touch that cost more
     * than the probes (perf: 1-1.4% of coverage --edges's samples in the
     * kernel's zeroing under the table's growth) */
    if (4 * (cc->n + 1) > 3 * cc->cap && (*err = chain_grow(cc)) < 0)
        return NULL;
    size_t mask = cc->cap - 1;
    uint64_t h = chain_hash(ip, d->ic, tag);
    uint32_t fp = slot_fp(h);
    size_t i = h & mask;
    struct chain_slot *sl;
    for (;;) {
        sl = &cc->tab[i];
        if (!sl->fp)
            break;
        if (sl->fp == fp) {
            const struct chain *ch = &cc->ents[sl->idx - 1];
            if (ch->ip0 == ip && ch->tag == tag && ch->ic == d->ic) {
                idx = sl->idx;
                goto found;
            }
        }
        i = (i + 1) & mask;
    }
    long long r = chain_add(cc, d, tag, sl, fp);
    if (r < 0) {
        *err = (int)r;
        return NULL;
    }
    idx = (uint32_t)r;
found:
    if (!cc->ents[idx - 1].c)
        return NULL;            /* no chain for the key */
    if (cc->last)       /* ents may have moved (new_chain) */
        cc->ents[cc->last - 1].succ = idx;
    return chain_applies(cc, d, idx);
}

int chain_flush_edges(struct chain_cache *cc, struct edge_table *e)
{
    for (size_t j = 0; j < cc->nents; j++) {
        struct chain *ch = &cc->ents[j];
        if (ch->in_n) {
            TRY(edge_add(e, ch->in_from, ch->ip0, ch->in_n));
            ch->in_n = 0;
        }
        if (ch->out_n) {        /* (cc->edges: an instruction walk's) */
            TRY(edge_add(e, ch->last_ip, ch->end_ip, ch->out_n));
            ch->out_n = 0;
        }
        if (!ch->uses)
            continue;
        for (uint32_t k = 0; k < ch->nedges; k++)
            TRY(edge_add(e, ch->edges[k].from, ch->edges[k].to, ch->uses));
        ch->uses = 0;
    }
    return 0;
}

void chain_free(struct chain_cache *cc)
{
#ifdef CHAIN_CHECK
    if (cc->ready)
        fprintf(stderr, "chain check: %llu successor lookups checked\n",
                checked_succ);
#endif
    hm_free(&cc->mem);          /* every chain's push and edges */
    ba_free(cc->ents, cc->ents_cap * sizeof *cc->ents);
    ba_free(cc->tab, cc->cap * sizeof *cc->tab);
    memset(cc, 0, sizeof *cc);
}

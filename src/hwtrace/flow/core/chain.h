/* The walk's TNT chain cache (the fast fuzzing decoders' idea, libxdc /
 * honeybee style): where the decoder stands at an IP with TNT bits cached
 * and nothing pending, what follows up to the K-th next TNT bit depends
 * only on (image, mode, IP, those K bits) -- plain runs, direct jumps and
 * calls, conditional branches and compressed returns whose call is in the
 * chain, and one compressed return whose call is not, as its last step,
 * to the return stack's top (CHAIN_RET; in the block walk it ends the
 * chain's last block, so such a chain leaves none open).  With no bit
 * cached the walk looks chains up with the next TNT packet's bits and
 * caches the packet where one is found (walk.c).  One lookup then gives the end IP, the instructions, the blocks,
 * the calls left on the return stack and the edges, instead of one walk
 * step per branch.
 *
 * A chain is built by the same rules the walk's steps follow
 * (insn_next_quick and blk_count) from its first to its last key bit, and
 * on to the instruction before the next one that needs trace (an indirect
 * branch, a branch past the key's bits), where the walk's own steps take over with the state the chain
 * leaves: the instructions since the last query, the block still open.
 * It takes a packet's last TNT bit only where the status stays clean
 * after it (no event next, not the end: what the walk's step would
 * compute), and never runs with a deferred error, a pending event, a tick
 * config or a return stack that could overflow. */
#ifndef HWTRACE_CORE_CHAIN_H
#define HWTRACE_CORE_CHAIN_H

#include "hugemem.h"
#include "insn.h"

#define CHAIN_BITS 8            /* TNT bits in a key at most */
#define CHAIN_RET 2             /* struct chain's have_from */
#define CHAIN_PIN 4             /* its pushes in pin (see there) */
#define CHAIN_PIN_MAX 2

struct chain_edge {
    uint64_t from, to;          /* once per pass (repeats listed again) */
};

struct chain {
    /* the first cache line: what the walk reads applying it (block
     * decoder, no open block), the key first (the table's, see
     * chain_slot: checked where the walk's guess of the next chain, succ,
     * is taken without the table) */
    uint64_t ip0;
    const struct icache *ic;
    uint32_t tag;               /* bits | 1 << k | (mode + 1) << 16
                                   (chain_key_top) */
    uint32_t succ;              /* the chain looked up after this one last
                                   time (index + 1; 0: none) */
    uint8_t c;                  /* TNT bits consumed */
    uint8_t npush, depth;       /* calls left on the return stack; the
                                   deepest the chain's own calls got */
    uint8_t have_from;          /* bit 0: its last instruction is a
                                   branch; CHAIN_RET: that is a return
                                   whose call is not in the chain (to the
                                   return stack's top: end_ip and next
                                   unused) */
    /* instruction counts: at most CHAIN_MAX_INSNS (chain.c) */
    uint16_t insns;
    uint16_t pre;               /* instructions before its first query */
    uint16_t icount;            /* instructions after its last query */
    uint8_t nedges;             /* at most CHAIN_MAX_EDGES (chain.c) */
    /* where ``next`` is an indirect branch (insn_tip_next's part on the
     * instruction holds): its size | iclass << 4, for the walk's TIP
     * step without reading the entry (a miss of its own); else 0 */
    uint8_t nk;
    union {
        struct {                /* block walk */
            uint16_t blocks;    /* the blocks it ends */
            uint16_t bn;        /* instructions of the block still open
                                   at its end (its bounds lo, last if
                                   not 0) */
        };
        /* instruction walk with edges: the times the walk's step after
         * the chain took its last branch's edge (last_ip -> end_ip;
         * CHAIN_RET: never), counted here on the line the walk has
         * just read instead of in the edge table's front (a miss of
         * its own at every such step); chain_flush_edges adds them */
        uint32_t out_n;
    };
    uint64_t end_ip;            /* the IP after the chain */
    uint64_t last_ip;           /* its last instruction */
    struct run *last_run;       /* its last run taken (a hint: prev_run) */
    /* the second: the rest the walk may read */
    const struct insn_info *next;   /* the entry at end_ip, or NULL */
    union {
        struct {
            uint64_t lo, last;  /* the open block's bounds (see bn) */
        };
        /* instruction walk (CHAIN_PIN): its pushes where there are at
         * most CHAIN_PIN_MAX, on the line the walk reads anyway, instead
         * of ``push`` (a miss of its own) */
        uint64_t pin[CHAIN_PIN_MAX];
    };
    uint64_t *push;             /* npush return addresses, oldest first */
    uint64_t uses;              /* times applied (edges mode: their edges
                                   at the end) */
    struct chain_edge *edges;   /* insn mode: the edges inside the chain */
    /* insn mode: the edge into the chain, counted here while it comes
     * from the same branch (in_n times from in_from to ip0), the table
     * gets it when another one comes or at the end */
    union {
        uint64_t in_from;
        /* block walk: the last instruction of the last block it ends
         * (if blocks): where it leaves a block open, the session's
         * last_ip (the last whole block's end, what an error in the open
         * block reports after a resync) is this, not last_ip */
        uint64_t blk_end;
    };
    uint64_t in_n;
} __attribute__((aligned(64)));

/* a slot of the table: the chain ents[idx - 1] for a key (ip0, ic, tag:
 * bit k - 1 - j of the tag's ``bits`` the j-th bit taken, j = 0 first,
 * as the TNT cache holds them), the key's hash's high half (never 0) in
 * fp; fp 0: an empty slot.  The key itself is the entry's: a key that
 * gives no chain has an entry all the same, with c 0 (chain.c).  Eight
 * bytes a slot, not the key's 24: the python3 recording's 45 K chains
 * need a 1 MiB table, not 3 MiB, and a lookup misses the cache less. */
struct chain_slot {
    uint32_t fp;
    uint32_t idx;
};

struct chain_cache {
    struct chain_slot *tab;
    size_t cap, n;
    struct chain *ents;
    size_t nents, ents_cap;
    struct hugemem mem;         /* the chains' push and edges arrays */
    char *bump;                 /* free space in mem's last chunk */
    size_t left;
    uint32_t last;              /* the chain chain_get returned last
                                   (index + 1; 0: none): its succ is
                                   tried first */
    int ready;                  /* the fields below are set */
    int block;                  /* block-decoder counting */
    int edges;                  /* keep the edges inside chains */
    int end_on_call, end_on_jump;
};

/* the chain for the decoder's state (see above), built on a miss; NULL
 * where none can apply (*err < 0: a fatal error building it).  Looked up
 * first as the successor of the chain it returned last (the key checked:
 * no hashing while the walk repeats a path, through indirect branches
 * too), then in the table (chain.c's notes: no longer on the run at
 * the decoder's IP) */
#ifndef CHAIN_MIN_INDEX
#define CHAIN_MIN_INDEX 1       /* chain.c's notes */
#endif
#define CHAIN_MAX_INSNS (LOOP_WATCH / 2)

/* chain_get past the last chain's successor (chain.c): the table, a new
 * chain */
struct chain *chain_find(struct chain_cache *cc, struct insn_dec *d,
                         uint32_t tag, int *err);

/* A key's k TNT bits (k <= CHAIN_BITS) in one number: the bits under a
 * leading one at bit k -- bit k - 1 - j the j-th bit taken -- so that k
 * needs no field of its own and the walk's usual case (all the bits
 * left, k < CHAIN_BITS) is a mask, not a count of them.  The tag adds
 * the mode above bit 16. */
static inline uint32_t chain_key_top(uint64_t index, uint64_t tnt_bits)
{
    int pos = 63 - __builtin_clzll(index);
    uint32_t bits = (uint32_t)(tnt_bits >> (pos + 1 - CHAIN_BITS)) &
                    ((1u << CHAIN_BITS) - 1);
    return bits | 1u << CHAIN_BITS;
}
/* the key's k */
static inline int chain_tag_k(uint32_t tag)
{
    return 31 - __builtin_clz(tag & 0xFFFF);
}
#ifdef CHAIN_CHECK
void chain_check_succ(const struct chain_cache *cc, uint64_t ip,
                      const struct icache *ic, uint32_t tag, uint32_t idx);
#endif

/* chain ents[idx - 1] if it applies to the decoder (its instructions
 * before its first query within the limit, room on the return stack, the
 * stack's top for its return), made the last one; else NULL */
static inline struct chain *chain_applies(struct chain_cache *cc,
                                          const struct insn_dec *d,
                                          uint32_t idx)
{
    struct chain *ch = &cc->ents[idx - 1];
    if (d->icount + ch->pre >= CHAIN_MAX_INSNS ||
        d->rs_n + ch->depth > RS_CAP ||
        ((ch->have_from & CHAIN_RET) && !d->rs_n))
        return NULL;
    cc->last = idx;
    return ch;
}

/* inline: the last chain's successor, where the walk repeats a path,
 * without a call */
/* ``plain``: the caller knows the flags checked first hold but for
 * d->icount's -- the last step applied a chain that chain_get returned
 * (applying it changes none of them, nor does q_cache_tnt_quick; the
 * status it leaves is 0) */
static inline __attribute__((always_inline)) struct chain *
chain_get(struct chain_cache *cc, struct insn_dec *d, uint64_t index,
          uint64_t tnt_bits, int *err, int plain)
{
    *err = 0;
    struct query *q = &d->q;
    if (index < CHAIN_MIN_INDEX)
        return NULL;
    if (!plain &&
        (q->deferred || !d->enabled ||
         d->process_event || d->resyncing || d->mode == MODE_NONE ||
         d->cfg->tick ||
         (d->status & (ST_DEFERRED | ST_EVENT_PENDING | ST_EOS))))
        return NULL;
    if (d->icount >= CHAIN_MAX_INSNS)
        return NULL;
    /* every bit left, the packet's last one too (see chain_status_clean):
     * the k bits from the index's down, as they stand (bit k - 1 - j the
     * j-th bit taken), under a leading one at bit k (chain_key) */
    uint32_t key;
    if (index < (1u << CHAIN_BITS))     /* k: all of them (TNT-8: always) */
        key = (uint32_t)(tnt_bits & (2 * index - 1)) | (uint32_t)(2 * index);
    else                                /* k = CHAIN_BITS, from the top */
        key = chain_key_top(index, tnt_bits);
    uint32_t tag = key | (uint32_t)(uint8_t)(d->mode + 1) << 16;
    /* the successor of the last chain, if its key is this one */
    if (cc->last) {
        uint32_t idx = cc->ents[cc->last - 1].succ;
        if (idx) {
            struct chain *g = &cc->ents[idx - 1];
            if (g->ip0 == d->ip && g->tag == tag && g->ic == d->ic) {
#ifdef CHAIN_CHECK
                chain_check_succ(cc, d->ip, d->ic, tag, idx);
#endif
                return chain_applies(cc, d, idx);
            }
        }
    }
    return chain_find(cc, d, tag, err);
}
/* ``index`` and ``tnt_bits`` are the query's TNT cache (tnt_index,
 * tnt_bits) or, before it is filled, what q_tnt_peek says it will hold;
 * the chain returned applies where chain_status_clean(q, index, ch) too
 * (with the cache filled) */

/* a chain that takes the last TNT bit cached leaves the status the
 * query gives then (insn_next_quick: q_status_flags with no bit left):
 * it applies only where that is 0 -- no event next, not the end (the
 * chain's instructions after its last bit are the steps of a decoder
 * with nothing pending; deferred errors never get here) */
static inline int chain_status_clean(struct query *q, uint64_t index,
                                     const struct chain *ch)
{
    /* a TNT-8 next, the usual case, is neither (q_will_event_kind) */
    return (index >> ch->c) ||
           (!q->nxt_err && q->nxt.kind == PT_K_TNT8) ||
           (!q_will_eos(q) && !q_will_event(q));
}
/* adds every edge of every chain times its uses, and the edges into and
 * out of chains still counted on them (edge_add's table) */
struct edge_table;
int chain_flush_edges(struct chain_cache *cc, struct edge_table *e);
void chain_free(struct chain_cache *cc);

#endif

/* Segment jobs of the parallel paths (hwtrace.flow.fast_parallel): a
 * decode that starts at a PSB (or the trace start) and records
 * checkpoints -- the decode state at chosen PSBs -- so that the stitch
 * (hwtrace.flow.parallel.stitch) can prove where two jobs' decodes are in
 * the same state and splice their outputs there.
 *
 * Where: a PSB is armed when the session hands out a status update of its
 * PSB+ (the query's last PSB) and it is one of the job's first ``head``
 * PSBs or at/after ``stop_at``; its checkpoint is recorded just before the
 * next record is decoded (nothing pending).  A decoder synchronized at
 * that PSB is then where the sequential one is after the same PSB+ events
 * (the Python twin's checkpoint.Recorder takes the same point).  After
 * ``tail`` PSBs at/after ``stop_at`` (one or two checkpoints each) the job
 * stops, at the next PSB's first status update.
 *
 * What: the key -- the live decode state serialized (injective: equal keys
 * are equal states; see segment.c for every field and why the few left
 * out are dead or inputs) -- the return stack apart (a later start may
 * lack entries from before its PSB), and the position of the output:
 * counts (instructions, blocks, events, errors) and, for batches, the
 * records and items so far. */
#ifndef HWTRACE_CORE_SEGMENT_H
#define HWTRACE_CORE_SEGMENT_H

#include "session.h"

struct checkpoint {
    ptrdiff_t psb;
    uint8_t *key;
    size_t keylen;
    uint64_t stack[RS_CAP];
    int nstack;
    uint64_t out[4];            /* the output position (the sink's) */
};

struct segment {
    ptrdiff_t stop_at;          /* -1: none */
    int head, tail;
    int psbs_armed;             /* distinct PSBs armed so far */
    ptrdiff_t armed;            /* the PSB awaiting its checkpoint, -1 */
    ptrdiff_t last_armed;
    int past;                   /* PSBs at/after stop_at */
    int stopped;
    struct checkpoint *cps;
    int ncps, capcps;
    int *underflows;            /* checkpoints before each RETSTACK_EMPTY */
    int nunder, capunder;
    /* the output position now (set by the owner) */
    void (*position)(void *ctx, uint64_t out[4]);
    void *ctx;
    struct observer obs;        /* what the session calls (ctx: this) */
};

void seg_init(struct segment *g, ptrdiff_t stop_at, int head, int tail);
void seg_free(struct segment *g);

/* the key of s's state into a new buffer (free()); NULL: no memory */
uint8_t *state_key(const struct session *s, size_t *len);

/* the probe (a test hook): for each state field, whether flipping its
 * lowest bit (made live first) changes the key; calls out(name, changed)
 * for each; -1 on no memory */
int state_probe(const struct session *s,
                int (*out)(void *ctx, const char *name, int changed),
                void *ctx);

#endif

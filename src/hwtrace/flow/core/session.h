/* The drive loop (hwtrace.flow.session.run_insn / run_blocks) as a
 * resumable state machine that hands records and items to a sink.
 *
 * Records (docs/pipeline.md): with the block decoder one per block; with
 * the instruction decoder maximal runs of its instructions that end at
 * every instruction whose class is not OTHER, before every item, and
 * where the decoder's offset or the speculative flag changes.  Items:
 * events, errors, statuses, in the order the twin's session hands them to
 * its sink.  sess_run() returns when the trace is done (SESS_DONE) or
 * when the sink says it is full (SESS_YIELD): it asks before each step,
 * and a step hands over at most one record or item, so a batch can end
 * after any of them (never inside a record). */
#ifndef HWTRACE_CORE_SESSION_H
#define HWTRACE_CORE_SESSION_H

#include "block.h"

enum { K_SYNC_ERROR, K_ERROR, K_RESYNC_ERROR };     /* error kinds */
enum { S_END_OF_TRACE, S_RESYNCED };                /* status names */

struct session;

struct sink_ops {
    /* a finished record; insns: its packed INSN records, or NULL */
    int (*record)(void *ctx, const struct rec *r, const uint8_t *insns);
    int (*event)(void *ctx, const struct event *ev, ptrdiff_t offset);
    int (*error)(void *ctx, int kind, ptrdiff_t offset, uint64_t ip,
                 int code);
    int (*status)(void *ctx, int name, ptrdiff_t offset, int ip_suppressed);
    int (*full)(void *ctx);         /* 1: yield before the next step */
};

/* an address-space switcher's look at the decode (flow.spaces): after a
 * synchronization that returned a status and after each event; it may
 * switch the decoder's image (insn_set_image).  0 or -E_PYERR. */
struct hooks {
    void *ctx;
    int (*after_sync)(void *ctx, struct session *s);
    int (*after_event)(void *ctx, struct session *s, const struct event *ev);
};

/* an observer of the decode (segment jobs' checkpoints): told of each
 * event handed out, of each error, and asked before each record is
 * decoded (the session loop's next(), nothing pending); -E_STOP stops the
 * decode (sess_run returns SESS_STOPPED) */
struct observer {
    void *ctx;
    int (*at_event)(void *ctx, struct session *s, const struct event *ev);
    int (*at_error)(void *ctx, struct session *s, int code);
    int (*before_record)(void *ctx, struct session *s);
};

enum { SS_SYNC, SS_LOOP, SS_ERR, SS_RESYNC, SS_DONE };
enum { SESS_DONE = 0, SESS_YIELD = 1, SESS_STOPPED = 2, SESS_FATAL = -1 };

struct session {
    struct insn_dec d;
    int block;                  /* the block decoder (else insn) */
    int resync;                 /* resync on error (--resync-on-error) */
    int plain_offsets;          /* the twin's _offset23 is dec.offset
                                   (a decoder wrapped by a switcher) */
    int want_insns;
    int want_tsc;
    const struct sink_ops *ops;
    void *ctx;
    const struct hooks *hooks;
    const struct observer *obs;
    struct walk *walk;          /* counts/edges: the fast path (walk.h) */
    ptrdiff_t sync_at;          /* >= 0: the first synchronization is at
                                   the PSB there (sync_set) */
    int state;
    int status;
    ptrdiff_t last_sync;
    uint64_t last_ip;
    struct derr err;
    /* the instruction decoder's open record */
    struct rec open;
    uint8_t open_other;         /* its last instruction is OTHER */
    struct bytebuf stage;       /* its INSN records */
    uint64_t ninsn;             /* instructions handed to the sink */
    int fatal;
    /* the instruction decoder: the entry at d.ip right after a run (its
     * terminating branch), or NULL */
    const struct insn_info *known;
};

void sess_init(struct session *s, const uint8_t *buf, ptrdiff_t end,
               const struct core_config *cfg, struct icache *ic, int block,
               int resync);
void sess_free(struct session *s);
int sess_run(struct session *s);
/* hand the open record (the instruction decoder's) to the sink now: an
 * item from outside the loop (an address-space switch) comes after it */
int sess_flush(struct session *s);

#endif

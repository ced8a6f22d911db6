/* The counts and edges fast path (decode --quiet --stat, coverage
 * --edges): the session's blocks or instructions without records, for as
 * long as nothing is pending -- the same decoder calls the session's
 * steps make (blk_next, insn_next_quick / insn_next), with counters where
 * they fill records.  Errors, events and the end go back to the session's
 * own steps; the counters are the count and edge sinks' (their record and
 * error callbacks keep them for the records those steps hand over). */
#ifndef HWTRACE_CORE_WALK_H
#define HWTRACE_CORE_WALK_H

#include "chain.h"
#include "edgeset.h"
#include "session.h"

struct walk {
    uint64_t insns, blocks;
    struct edge_table *edges;   /* NULL: counts only */
    uint64_t from;              /* the last branch, if have_from */
    int have_from;
    struct chain_cache chains;  /* TNT chains (chain.h) */
};

/* the session's SS_LOOP steps while nothing is pending: 0, or an error
 * as the steps return it */
int walk(struct session *s, struct walk *w);
/* the edges a run's successor counters hold, into w->edges (and the
 * counters cleared): call for every run of every image at the end */
int walk_flush_run(void *w, struct run *ru);
/* the end of a walk: the chains' edges into w->edges (if any), their
 * cache freed; 0 or -E_NOMEM */
int walk_done(struct walk *w);

#endif

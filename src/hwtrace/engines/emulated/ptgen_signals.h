/*
 * What ptgen_fast.c and ptgen_signals.c share: the block and table types,
 * the mapped log, and the signal deliveries found in a thread's records
 * (flow._find_signals: QEMU logs no delivery, it is inferred).
 */
#ifndef PTGEN_SIGNALS_H
#define PTGEN_SIGNALS_H

#include <stddef.h>
#include <stdint.h>

enum { K_OTHER, K_JCC, K_JMP, K_CALL, K_JMP_IND, K_CALL_IND, K_RET, K_FAR, K_TRAP, K_REP };

struct blk { uint64_t pc, last, target, nlip; uint32_t ninsn; uint8_t kind, pad[3]; };
struct table { struct blk **b; uint32_t n; };          /* id -> block */

/* ptgen_fast.c: the mapped log, the BLOCKS file and each block's sizes[] */
extern const unsigned char *L;
extern struct blk *blocks;
extern const unsigned char **blk_sizes;
size_t rec_size(size_t o);

/* A process's signal handlers (flow.load's handlers and sync_handlers) */
struct hset { uint64_t *pc; uint8_t *sync; int n; };
void hset_add(struct hset *h, uint32_t signo, uint64_t handler);   /* a SIGACTION */
void hset_copy(struct hset *dst, const struct hset *src);          /* PROC_START */
int hset_has(const struct hset *h, uint64_t pc);
/* 0: no handler; 1: handlers, none of them a block of the table; 2: one
 * is.  A thread needs sig_scan if its process's is 2, or 1 and the thread
 * made an rt_sigreturn: else no delivery's IP is known only later */
int sig_handler_ran(const struct hset *h, const struct table *t);

/* What the Python generator does at a block of the thread: a SIGNAL item
 * goes before it (!cut: the delivery, interrupting at ip), or it is cut to
 * its first n instructions, the next one at ip (cut: a fault). */
struct sigev { size_t off; uint32_t k; uint32_t cut, n; uint64_t ip; };

struct sigfix;
/* One thread's pass over its records in program order (flow._find_signals),
 * then its events, in program order; `at` is where the run stands. */
struct sigscan {
    struct blk prev; const unsigned char *prev_sz; size_t prev_off; uint32_t prev_k;
    int has_prev, prev_cut, in_user;    /* zeroed: a thread starts in the kernel */
    int64_t *deliv; int ndeliv, capdeliv;   /* open activations: slot + 1, or -(carried resume) */
    int64_t resume;                     /* slot + 1 of the activation that just returned; 0: none */
    uint64_t *slots; int nslots, capslots;
    struct sigfix *fix; int nfix, capfix;
    struct sigev *ev; int nev, capev, at;
};

void sig_scan(struct sigscan *s, const struct table *tab, const struct hset *h,
              size_t start, size_t end);
void sig_done(struct sigscan *s, const struct hset *h);

#endif

/* Shared declarations of the ptrace stepper's C sources:
 *   stepper.c       the tracer: launch/attach, stops, events, windows, main
 *   stepper_log.c   the execution-log writer (execlog.py format) and tables
 *   stepper_proc.c  /proc readers: maps and build-ids, CPU, task state,
 *                   program checks
 *   stepper_ild.c   the x86-64 instruction length/class decoder
 * One tracer per process: the log, options and thread list are globals. */
#ifndef HWTRACE_STEPPER_H
#define HWTRACE_STEPPER_H
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/user.h>
#include "stepper_ild.h"

struct options {
    const char *out;
    char **argv;
    pid_t attach;
    uint64_t start, stop, within;     /* window triggers (0 = none) */
    int start_rel, stop_rel, within_rel;
    const char *start_file, *stop_file, *within_file;   /* FILE@OFF: a file offset in FILE,
                                                           resolved when FILE is mapped */
    int follow_fork;
    int clock_insn;
    int block;                         /* 0 off, 1 auto */
    int accel;                         /* run straight lines natively to a DR breakpoint */
    unsigned cpu_every;
    unsigned quantum;                  /* stops a thread is followed before switching */
    int quiet;
};

struct insn_info { uint64_t pc; uint8_t len, kind, code[15]; };

struct pctab { struct insn_info *e; size_t cap, n; };

/* blocks: (start pc, ninsn) -> id */
struct blk { uint64_t pc; uint32_t n, id; };
struct blktab { struct blk *e; size_t cap, n; };

struct map { uint64_t start, end, off; unsigned prot; char *path; };

struct proc {
    pid_t pid;
    int live, armed;                   /* armed: window triggers valid in this image */
    int pending;                       /* a FILE@OFF trigger whose file is not mapped yet */
    uint64_t start, stop, within;      /* resolved trigger addresses */
    struct pctab pcs;
    struct blktab blocks;
    struct map *maps; size_t nmaps;
    struct proc *next;
};

#define RUNMAX 4096

struct thread {
    pid_t tid, pid;
    struct proc *p;
    int started;                       /* its first stop has been seen */
    int parked;                        /* stopped, waiting for its parent's event */
    int native;                        /* running with PTRACE_CONT (window closed) */
    int noexec;                        /* next SIGTRAP executed nothing */
    int sig;                           /* signal to deliver at the next resume */
    int injected;                      /* signal delivered at the last resume */
    int in_sys;                        /* syscall entered, SYSRET not yet written */
    uint64_t sys_nr; int64_t sys_ret;
    uint64_t sys_rsi, sys_rdi;         /* syscall arguments (for rt_sigaction) */
    uint64_t sig_act[2];               /* handler, flags read at rt_sigaction entry */
    int restart;                       /* syscall result was an ERESTART* code */
    uint64_t restart_pc;
    int exiting_sys;                   /* stepping exit/exit_group */
    int sys_logged;                    /* the syscall being stepped is in the log already
                                        * (written at its clone/fork/vfork event) */
    int exit_logged;                   /* its exit is in the log (written at PTRACE_EVENT_EXIT) */
    struct user_regs_struct r;         /* registers at the last stop */
    struct insn_info cur;              /* decoded instruction at r.rip */
    int how;                           /* last resume: 0 step, 1 block step, 2 cont, 3 run to run_to */
    uint64_t run_to;                   /* how 3: the branch a DR breakpoint stops at */
    uint64_t dr[4]; unsigned dr_age[4], dr_clock; unsigned dr7;   /* DR cache */
    int at_dr_hit;                     /* stopped by the cached breakpoint at pc */
    int regs_fresh;                    /* r was read at this very stop */
    int sig_async; uint64_t sig_ip;    /* the signal being delivered */
    int detach;                        /* detach at the next stop */
    int attached;                      /* seized by --pid (not a clone child) */
    int draining;                      /* detaching: swallowing our queued SIGTRAP */
    uint64_t run_start, run_next; uint32_t run_n;
    uint8_t run_sizes[RUNMAX];
    uint64_t ninsn;                    /* instructions retired (clock) */
    unsigned since_cpu; int cpu; int statfd;
    int win;                           /* inside a window */
    uint64_t win_sp, win_ret;
    uint64_t parent_tid;
    int rearm;                         /* set the trigger breakpoint at the next stop */
    pid_t held_for;                    /* a fork child inside its parent's window: starts
                                          once that parent thread's fork syscall is logged */
    struct thread *next;
};

extern struct options opt;
extern FILE *out;                      /* the execution log */
extern uint64_t tsc0, ns0;
extern struct thread *exec_owner;
extern pid_t ctx_tid;

void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

uint64_t now_ns(void);
void write_header(uint64_t hz);
struct insn_info *pc_find(struct pctab *t, uint64_t pc);
struct insn_info *pc_add(struct pctab *t, const struct insn_info *v);
uint32_t *blk_find(struct blktab *t, uint64_t pc, uint32_t n);
void blk_add(struct blktab *t, uint64_t pc, uint32_t n, uint32_t id);
void flush_exec(void);
uint64_t clock_value(struct thread *t);
void ctx(struct thread *t);
void rec(struct thread *t);
void end_run(struct thread *t);
void write_sysret(struct thread *t);
void retire(struct thread *t, struct insn_info *ii);
int read_mem(pid_t tid, uint64_t addr, void *buf, size_t len);
struct insn_info *insn_at(struct thread *t, uint64_t pc);
void w8(unsigned v);
void w16(unsigned v);
void w32(uint32_t v);
void w64(uint64_t v);
void pc_clear(struct pctab *t);
void build_id(const char *path, uint8_t *bid, unsigned *bidlen);
int update_maps(struct proc *p);
uint64_t exe_base(struct proc *p);
uint64_t file_addr(pid_t pid, const char *file, uint64_t off);
int sample_cpu(struct thread *t);
pid_t tgid_of(pid_t tid);
void why_not_permitted(pid_t pid);
char task_state(pid_t pid, pid_t tid);
int sigtrap_pending(struct thread *t);
char *find_program(const char *name);
void check_program(const char *path, const char *name);

/* stepper_debughw.c: DR0..DR7 of a thread; the trigger breakpoint armed or
 * disarmed; the triggers' addresses in p; the probes (1 works, -1 not) */
int set_dr(pid_t tid, int i, uint64_t v);
uint64_t get_dr(pid_t tid, int i);
void arm(struct thread *t, int on);
void resolve_triggers(struct proc *p);
int probe_blockstep(void);
int probe_main(void);

/* stepper_args.c: the command line into opt (the options, the LOG's .err
 * path in errpath, the program or --pid; usage errors end the stepper) */
extern char errpath[4096];
void parse_options(int argc, char **argv);

#endif

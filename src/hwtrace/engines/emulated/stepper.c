/* hwtrace ptrace stepper: observe a native execution instruction by
 * instruction through the debug hardware's single-step trap, and write it as
 * an execution log (format: execlog.py, version 1, source = ptrace stepper).
 *
 *   stepper [options] -o LOG -- PROGRAM ARGS...
 *   stepper [options] -o LOG --pid PID
 *   stepper --probe      one JSON line: do debug-register breakpoints work,
 *                        is DEBUGCTL.BTF (PTRACE_SINGLEBLOCK) honoured here
 *
 * Options:
 *   --start ADDR / --stop ADDR / --within ADDR   trigger windows: the tracee
 *        runs at native speed until a debug-register breakpoint (DR0..DR3
 *        through PTRACE_POKEUSER, enabled in DR7) fires at ADDR, is stepped
 *        inside the window, and runs natively again after it.  ADDR is an
 *        absolute hex address or +OFF relative to the load base of the main
 *        executable (PIE).  --within closes the window when that activation
 *        returns (return address and stack pointer match).
 *   --no-follow-fork   report fork/vfork children but do not trace them
 *   --clock tsc|insn   what TIME records hold (host TSC or per-thread count)
 *   --block auto|off   use PTRACE_SINGLEBLOCK if it really stops only after
 *                      branches (probed at start on a child running a known
 *                      sequence), or never
 *   --cpu-every N      sample the thread's CPU every N steps (default 1024)
 *   --quantum N        follow one thread for up to N stops before another (1000)
 *   --accel on|off     run straight lines natively to a DR breakpoint when BTF is ignored
 *   --quiet-errors     errors go to the log only (as the exit reason)
 *
 * The traced program's stdout/stderr are its own; the stepper's exit status
 * is the program's (killed by a signal: the stepper kills itself with it).
 * Errors of the stepper itself: one line on stderr (unless --quiet-errors),
 * exit status 125, and the line is also written to LOG.err.  Side files:
 * LOG.info (JSON: stepping mode, BTF probe result, counts, clock), LOG.vdso
 * (the [vdso] bytes), LOG.windows (window on/off lines: pid tid pc ninsn).
 *
 * What the log holds (execlog.py's records):
 *   - every retired user instruction, as straight-line runs: BLOCK (pc,
 *     sizes, bytes; defined once per process and (pc, length)) and EXEC;
 *     a rep-string instruction that traps per iteration retires once;
 *   - SYSCALL after each `syscall`, SYSRET before the next instruction (the
 *     handler's, when the kernel delivered a signal on the way out; the
 *     re-executed `syscall` when an interrupted one restarts);
 *   - SIGNAL when a handler interrupts user code (async=1, ip = the next
 *     instruction) or a faulting instruction (async=0, ip = it), or
 *     (handler 0) when such a signal killed the thread;
 *     SIGACTION after a successful rt_sigaction;
 *   - THREAD_START/EXIT, PROC_START/EXEC/EXIT; MMAP/MUNMAP of executable
 *     mappings (with build-ids) at start, exec and after mmap-family calls;
 *   - CTX (pid, tid, cpu sampled from /proc/PID/task/TID/stat field 39) and
 *     TIME (host TSC, its rate measured over the run into the header, or a
 *     per-thread instruction count).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>
#include "stepper.h"

#ifndef PTRACE_SINGLEBLOCK
#define PTRACE_SINGLEBLOCK 33
#endif

/* ---------------------------------------------------------------- options */

struct options opt = { .follow_fork = 1, .block = 1, .accel = 1, .cpu_every = 1024, .quantum = 1000 };
char errpath[4096];
static volatile sig_atomic_t quit_signal;

/* ---------------------------------------------------------------- processes and threads */

static struct proc *procs;
static struct thread *threads;
static int nthreads;
static pid_t main_pid;
static int main_status = -1;
static int have_main_status;
static int windowed;                   /* any trigger given */
static int blockstep_state;            /* 0 unknown, 1 honoured, -1 ignored */
static uint64_t total_steps;
static uint64_t total_runs;            /* straight lines run natively (accel) */

static struct thread *find_thread(pid_t tid)
{
    for (struct thread *t = threads; t; t = t->next)
        if (t->tid == tid) return t;
    return NULL;
}

static struct proc *find_proc(pid_t pid)
{
    for (struct proc *p = procs; p; p = p->next)
        if (p->pid == pid && p->live) return p;
    return NULL;
}

/* t's process mapped something: resolve its pending FILE@OFF triggers; once
 * all are, its threads get the trigger breakpoint (t now, the others at a
 * stop we ask for) and run without syscall-stops. */
static void resolve_pending(struct thread *t)
{
    struct proc *p = t->p;
    resolve_triggers(p);
    if (p->pending) return;
    arm(t, 1);
    for (struct thread *o = threads; o; o = o->next)
        if (o != t && o->p == p && o->started && o->native) {
            o->rearm = 1;
            ptrace(PTRACE_INTERRUPT, o->tid, 0, 0);
        }
}

/* ---------------------------------------------------------------- thread lifecycle */

static struct proc *new_proc(pid_t pid)
{
    struct proc *p = calloc(1, sizeof *p);
    if (!p) fail("out of memory");
    p->pid = pid; p->live = 1;
    p->next = procs; procs = p;
    return p;
}

static struct thread *new_thread(pid_t tid, struct proc *p)
{
    struct thread *t = calloc(1, sizeof *t);
    if (!t) fail("out of memory");
    t->tid = tid; t->pid = p->pid; t->p = p; t->statfd = -1; t->cpu = -1;
    t->next = threads; threads = t;
    nthreads++;
    return t;
}

static void release_held(struct thread *t);
static void begin_thread(struct thread *t);

static void drop_thread(struct thread *t)
{
    release_held(t);                   /* its fork children start anyway */
    for (struct thread **pp = &threads; *pp; pp = &(*pp)->next)
        if (*pp == t) { *pp = t->next; break; }
    if (exec_owner == t) { flush_exec(); exec_owner = NULL; }
    if (ctx_tid == t->tid) ctx_tid = -1;
    if (t->statfd >= 0) close(t->statfd);
    nthreads--;
    free(t);
}

/* ---------------------------------------------------------------- resuming */

static int is_restart_code(int64_t v) { return v == -512 || v == -513 || v == -514 || v == -516; }

/* Can a block step from pc be used: the straight line up to its first branch
 * holds no syscall, int, rep-string or window stop address. */
static int block_ok(struct thread *t)
{
    uint64_t pc = t->r.rip;
    for (int k = 0; k < 4096; k++) {
        struct insn_info *ii = insn_at(t, pc);
        if (t->win && t->p->stop && pc == t->p->stop) return 0;
        switch (ii->kind) {
        case K_OTHER: pc += ii->len; continue;
        case K_SYSCALL: case K_INT: case K_REPSTR: return 0;
        default: return 1;
        }
    }
    return 0;
}

/* Accelerated stepping: the straight line from pc to its first
 * control-transfer (or syscall, int, rep-string) instruction B holds only
 * instructions that fall through, so run it natively with an instruction
 * breakpoint on B (a small per-thread cache of DR slots), then step B.
 * Slot 0 is the window trigger's in windowed mode.  Returns 0 if not used. */
static int run_to_branch(struct thread *t)
{
    uint64_t pc = t->r.rip, b = pc;
    int k = 0;
    struct insn_info *ii = NULL;
    for (; k < 4096; k++) {
        if (t->win && t->p->stop && b == t->p->stop && k) return 0;
        ii = insn_at(t, b);
        if (ii->kind != K_OTHER) break;
        b += ii->len;
    }
    if (!ii || ii->kind == K_OTHER || k < 2) return 0;
    int first = windowed ? 1 : 0, slot = -1;
    for (int i = first; i < 4; i++)
        if (t->dr7 & (1u << (2 * i)) && t->dr[i] == b) { slot = i; break; }
    if (slot < 0) {
        slot = first;
        for (int i = first; i < 4; i++) {
            if (!(t->dr7 & (1u << (2 * i)))) { slot = i; break; }
            if (t->dr_age[i] < t->dr_age[slot]) slot = i;
        }
        if (set_dr(t->tid, slot, b) < 0) return 0;
        t->dr[slot] = b;
        if (!(t->dr7 & (1u << (2 * slot)))) {
            unsigned v = t->dr7 | (1u << (2 * slot));
            if (set_dr(t->tid, 7, v) < 0) return 0;
            t->dr7 = v;
        }
    }
    t->dr_age[slot] = ++t->dr_clock;
    t->how = 3;
    t->run_to = b;
    t->noexec = 0;                     /* PTRACE_CONT: no pending post-exec step report */
    total_runs++;
    total_steps--;
    if (ptrace(PTRACE_CONT, t->tid, 0, 0) < 0) return 0;
    return 1;
}

static int dr_cached(struct thread *t, uint64_t pc)
{
    for (int i = windowed ? 1 : 0; i < 4; i++)
        if ((t->dr7 & (1u << (2 * i))) && t->dr[i] == pc) return 1;
    return 0;
}

/* Retire the straight line [from, to) if `to` is on it (else nothing). */
static void retire_line(struct thread *t, uint64_t from, uint64_t to)
{
    uint64_t pc = from;
    int k = 0;
    for (; pc != to && k < 4096; k++) {
        struct insn_info *ii = insn_at(t, pc);
        if (ii->kind != K_OTHER) return;
        pc += ii->len;
    }
    if (pc != to) return;
    for (pc = from; pc != to; ) {
        struct insn_info ii = *insn_at(t, pc);
        retire(t, &ii);
        pc += ii.len;
    }
}

static int mapped(struct proc *p, uint64_t pc)
{
    for (size_t i = 0; i < p->nmaps; i++)
        if (pc >= p->maps[i].start && pc < p->maps[i].end) return 1;
    return 0;
}

/* The process maps code the log doesn't know (mapped while it ran
 * natively, outside a window): log its mappings as they are now. */
static void refresh_maps(struct proc *p)
{
    if (update_maps(p)) {
        pc_clear(&p->pcs);
        free(p->blocks.e); p->blocks.e = NULL; p->blocks.cap = p->blocks.n = 0;
    }
}

static void resume(struct thread *t)
{
    long sig = t->sig;
    t->injected = (int)sig;
    t->sig = 0;
    if (t->detach) {
        if (windowed || t->dr7) arm(t, 0);
        if (!sig && !t->draining && sigtrap_pending(t)) {
            /* our step/breakpoint SIGTRAP is queued: let it come to us and
             * drop it, or it would kill the process after the detach */
            t->draining = 1;
            ptrace(PTRACE_CONT, t->tid, 0, 0);
            return;
        }
        ptrace(PTRACE_DETACH, t->tid, 0, (void *)sig);
        drop_thread(t);
        return;
    }
    if (t->native) {
        t->how = 2;
        /* a trigger waits for its library: stop at syscalls to see it mapped */
        ptrace(t->p->pending && t->p->armed ? PTRACE_SYSCALL : PTRACE_CONT, t->tid, 0, (void *)sig);
        return;
    }
    if (!mapped(t->p, t->r.rip)) refresh_maps(t->p);
    t->cur = *insn_at(t, t->r.rip);
    if (t->cur.kind == K_SYSCALL) {
        t->sys_nr = t->r.rax; t->sys_rdi = t->r.rdi; t->sys_rsi = t->r.rsi;
        if (t->r.rax == 13 && t->r.rsi) {
            uint64_t act[2] = { 0, 0 };
            read_mem(t->tid, t->r.rsi, act, sizeof act);
            t->sig_act[0] = act[0]; t->sig_act[1] = act[1];
        }
    }
    total_steps++;
    t->how = 0;
    if (blockstep_state == 1 && !sig && !t->restart && block_ok(t))
        t->how = 1;
    if (t->how == 0 && opt.accel && !sig && !t->restart && t->cur.kind == K_OTHER &&
        blockstep_state != 1 && run_to_branch(t))
        return;
    if (t->dr7 && t->regs_fresh && !t->at_dr_hit && dr_cached(t, t->r.rip)) {
        /* stepping onto a cached breakpoint's instruction: set RF so it
         * doesn't fire before the instruction runs (a wasted stop) */
        t->r.eflags |= 0x10000;
        ptrace(PTRACE_SETREGS, t->tid, 0, &t->r);
    }
    t->at_dr_hit = 0;
    t->regs_fresh = 0;
    if (ptrace(t->how == 1 ? PTRACE_SINGLEBLOCK : PTRACE_SINGLESTEP, t->tid, 0, (void *)sig) < 0 && t->how == 1) {
        blockstep_state = -1;
        t->how = 0;
        ptrace(PTRACE_SINGLESTEP, t->tid, 0, (void *)sig);
    }
}

/* ---------------------------------------------------------------- windows */

static FILE *winlog;

static void win_open(struct thread *t)
{
    end_run(t);
    t->win = 1;
    t->native = 0;
    t->win_sp = t->r.rsp;
    uint64_t ret = 0;
    read_mem(t->tid, t->r.rsp, &ret, 8);
    t->win_ret = ret;
    arm(t, 0);
    if (winlog) fprintf(winlog, "on %d %d %#llx %llu\n", t->pid, t->tid, (unsigned long long)t->r.rip, (unsigned long long)t->ninsn);
}

static void win_close(struct thread *t)
{
    end_run(t);
    flush_exec();
    t->win = 0;
    if (winlog) fprintf(winlog, "off %d %d %#llx %llu\n", t->pid, t->tid, (unsigned long long)t->r.rip, (unsigned long long)t->ninsn);
    if (t->p->armed && (t->p->start || t->p->within)) {
        t->native = 1;
        arm(t, 1);
    } else if (t->p->armed) {
        t->native = 1;                 /* --stop only: never reopens */
    }
}

/* After a stop in a window: has it closed? */
static void window_check(struct thread *t)
{
    if (!t->win || !t->p->armed) return;
    if (t->p->within) {
        if ((t->r.rip == t->win_ret && t->r.rsp == t->win_sp + 8) || t->r.rsp > t->win_sp + 8)
            win_close(t);
    } else if (t->p->stop && t->r.rip == t->p->stop) {
        win_close(t);
    }
}

/* ---------------------------------------------------------------- stops */

static void sample(struct thread *t, int force)
{
    if (!force && ++t->since_cpu < opt.cpu_every) return;
    t->since_cpu = 0;
    int c = sample_cpu(t);
    if (c != t->cpu) {
        end_run(t);
        if (exec_owner == t) flush_exec();
        t->cpu = c;
    }
}

/* t's fork syscall is in the log: start the children it forked inside a
 * window (held until now, stopped at their first stop). */
static void release_held(struct thread *t)
{
    for (int again = 1; again; ) {
        again = 0;
        for (struct thread *c = threads; c; c = c->next)
            if (c->held_for == t->tid) {
                c->held_for = 0;
                if (c->parked) { begin_thread(c); again = 1; break; }
            }
    }
}

/* The first stop of a thread: announce it and start it. */
static void begin_thread(struct thread *t)
{
    t->started = 1;
    t->parked = 0;
    if (t->detach) {                   /* a fork child we only report */
        ptrace(PTRACE_DETACH, t->tid, 0, 0);
        drop_thread(t);
        return;
    }
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &t->r) < 0) return;
    t->regs_fresh = 1;
    sample(t, 1);
    if (t->tid == t->pid && t->p->nmaps == 0) {
        rec(t);
        w8(0x12); w32((uint32_t)t->parent_tid);    /* PROC_START (parent pid) */
        update_maps(t->p);
    }
    rec(t);
    w8(0x10); w32(t->tid == t->pid ? 0 : (uint32_t)t->parent_tid);
    if (is_restart_code((int64_t)t->r.rax) && t->r.rip >= 2) {
        uint8_t b[2] = { 0, 0 };
        read_mem(t->tid, t->r.rip - 2, b, 2);
        if (b[0] == 0x0f && b[1] == 0x05) { t->restart = 1; t->restart_pc = t->r.rip - 2; }
    }
    if (windowed && t->p->armed && t->win) {
        /* a fork child inside its parent's window: stepped from its first instruction */
    } else if (windowed && t->p->armed) {
        if (t->p->start || t->p->within) { t->native = 1; arm(t, 1); }
        else { t->win = 1; if (winlog) fprintf(winlog, "on %d %d %#llx %llu\n", t->pid, t->tid, (unsigned long long)t->r.rip, 0ull); }
    } else if (windowed) {
        t->native = 1;
    }
    resume(t);
}

/* Is t being stepped over the syscall instruction it stopped at (not a
 * restarted one, not natively)? */
static int stepping_syscall(struct thread *t)
{
    return t->started && !t->native && t->how == 0 && !t->restart && t->cur.kind == K_SYSCALL &&
           t->cur.pc == t->r.rip;
}

/* The syscall t is being stepped over retired and entered the kernel: its
 * run and SYSCALL go into the log now, at an event stop inside the syscall
 * (a clone's, an exit's), before anything it does becomes visible to
 * another thread -- the log is written in the order the tracer sees
 * things, and its TIMEs are read as they are written, so whatever that
 * other thread does after it comes after it. */
static void log_syscall_entry(struct thread *t)
{
    if (t->sys_logged) return;
    retire(t, &t->cur);
    end_run(t);
    rec(t); w8(0x20); w64(t->sys_nr);
    t->sys_logged = 1;
}

static void on_event(struct thread *t, int ev)
{
    unsigned long msg = 0;
    ptrace(PTRACE_GETEVENTMSG, t->tid, 0, &msg);
    if ((ev == PTRACE_EVENT_CLONE || ev == PTRACE_EVENT_FORK || ev == PTRACE_EVENT_VFORK) &&
        stepping_syscall(t))
        log_syscall_entry(t);          /* before the child's THREAD_START / PROC_START */
    if (ev == PTRACE_EVENT_CLONE || ev == PTRACE_EVENT_FORK || ev == PTRACE_EVENT_VFORK) {
        pid_t child = (pid_t)msg;
        struct thread *c = find_thread(child);
        pid_t tg = tgid_of(child);
        int is_thread = ev == PTRACE_EVENT_CLONE && tg == t->pid;
        if (!c) {
            struct proc *cp = is_thread ? t->p : new_proc(child);
            c = new_thread(child, cp);
        } else if (!is_thread && c->p == t->p) {
            c->p = new_proc(child); c->pid = child;
        }
        c->parent_tid = is_thread ? (uint64_t)t->tid : (uint64_t)t->pid;
        if (!is_thread) {
            c->p->armed = t->p->armed;
            c->p->start = t->p->start; c->p->stop = t->p->stop; c->p->within = t->p->within;
            c->p->pending = t->p->pending;
            if (!opt.follow_fork) c->detach = 1;
        }
        c->win = 0;
        if (!is_thread && ev == PTRACE_EVENT_FORK && t->win) {
            /* forked inside a window: the child is inside the same activation
             * (same stack), so it starts in the window -- after the parent's
             * fork syscall is in the log, so the window state it inherits
             * there is the one the child starts with */
            c->win = 1; c->win_sp = t->win_sp; c->win_ret = t->win_ret;
            if (!t->sys_logged) c->held_for = t->tid;
        }
        if (c->parked && !c->held_for) begin_thread(c);
    } else if (ev == PTRACE_EVENT_EXEC) {
        pid_t former = (pid_t)msg;
        if (former != t->tid) {
            struct thread *f = find_thread(former);
            if (f) {                      /* a non-leader exec'd: it becomes the leader */
                t->cur = f->cur; t->run_n = 0;
                end_run(f); drop_thread(f);
            }
        }
        /* other threads of the process are gone */
        for (struct thread *o = threads, *nx; o; o = nx) {
            nx = o->next;
            if (o != t && o->pid == t->pid) {
                end_run(o); rec(o); w8(0x11); w32(0); drop_thread(o);
            }
        }
        if (!t->native && t->cur.kind == K_SYSCALL && !t->sys_logged) {
            retire(t, &t->cur);
            end_run(t);
            rec(t); w8(0x20); w64(t->sys_nr);
        }
        t->sys_logged = 0;
        end_run(t);
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/%d/exe", t->pid);
        ssize_t k = readlink(link, path, sizeof path - 1);
        path[k > 0 ? k : 0] = 0;
        rec(t);
        w8(0x13); w8(1); w16((unsigned)strlen(path)); fwrite(path, 1, strlen(path), out);
        struct proc *p = t->p;
        pc_clear(&p->pcs);
        free(p->blocks.e); p->blocks.e = NULL; p->blocks.cap = p->blocks.n = 0;
        for (size_t i = 0; i < p->nmaps; i++) free(p->maps[i].path);
        free(p->maps); p->maps = NULL; p->nmaps = 0;
        update_maps(p);
        t->in_sys = 0;
        t->noexec = 1;
        t->dr7 = 0;                       /* exec flushed the debug registers */
        t->restart = 0;
        if (windowed) {                   /* triggers belong to the first image */
            p->armed = 0;
            t->win = 0;
            t->native = 1;
        }
    } else if (ev == PTRACE_EVENT_EXIT) {
        /* do_exit, before the exit is visible to anyone (the tid cleared
         * and pthread_join woken, the parent's wait): an exit or
         * exit_group of the thread's own goes into the log now, not when
         * its end is reported -- by then the joiner may have returned and
         * gone on in the log.  (A thread killed by another's exit_group
         * stops here only if it isn't SIGKILLed: its end is logged when
         * reported.) */
        int st = (int)msg;
        if (stepping_syscall(t) && !t->injected && WIFEXITED(st) && (t->sys_nr == 60 || t->sys_nr == 231)) {
            log_syscall_entry(t);
            end_run(t);
            rec(t); w8(0x11); w32((uint32_t)WEXITSTATUS(st));
            t->exit_logged = 1;
        }
    } else if (ev == PTRACE_EVENT_STOP) {
        /* group-stop or our interrupt: nothing executed */
    }
}

static void on_exit_status(struct thread *t, int st)
{
    int status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    if (t->started && !t->native && !t->exit_logged && t->cur.kind == K_SYSCALL && WIFEXITED(st) &&
        (t->cur.pc == t->r.rip) && (t->sys_nr == 60 || t->sys_nr == 231)) {
        log_syscall_entry(t);          /* (no PTRACE_EVENT_EXIT stop came) */
        t->in_sys = 0;
    }
    end_run(t);
    if (t->started && !t->native && !t->in_sys && !t->exit_logged && WIFSIGNALED(st) &&
        t->injected == WTERMSIG(st) && t->sig_ip) {
        /* a signal delivered in user code killed it: where (a fault: at
         * the instruction that faulted, which did not retire) */
        rec(t); w8(0x22); w32((uint32_t)t->injected); w8(t->sig_async ? 1 : 0);
        w64(0); w64(t->sig_ip);
    }
    if (t->started && !t->exit_logged) {
        rec(t); w8(0x11); w32((uint32_t)status);
        if (t->tid == t->pid) { w8(0x14); w32((uint32_t)status); t->p->live = 0; }
    } else if (t->started && t->tid == t->pid) {
        /* its THREAD_EXIT was logged at its exit: the process ended now
         * (its last thread is gone) */
        rec(t); w8(0x14); w32((uint32_t)status); t->p->live = 0;
    }
    if (t->tid == main_pid) { main_status = st; have_main_status = 1; }
    drop_thread(t);
}

static int sync_signal(int sig, int code)
{
    return (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP) && code > 0;
}

static void on_stop(struct thread *t, int st)
{
    int sig = WSTOPSIG(st), ev = st >> 16;
    if (t->draining) {
        ptrace(PTRACE_DETACH, t->tid, 0, (void *)(long)(ev || sig == SIGTRAP ? 0 : sig));
        drop_thread(t);
        return;
    }
    if (!t->started) {
        if ((t->parent_tid || t->tid == main_pid || t->attached) && !t->held_for) begin_thread(t);
        else t->parked = 1;            /* wait for the parent's clone/fork event (and syscall) */
        return;
    }
    if (ev) {
        if (ev == PTRACE_EVENT_STOP && t->how == 3) {
            /* interrupted (group-stop, or our detach) while running a
             * straight line natively: what ran of it retired */
            uint64_t from = t->r.rip;
            if (ptrace(PTRACE_GETREGS, t->tid, 0, &t->r) == 0) retire_line(t, from, t->r.rip);
            t->how = 0;
        }
        on_event(t, ev);
        if (ev == PTRACE_EVENT_EXIT && !t->detach) {
            ptrace(PTRACE_CONT, t->tid, 0, 0);     /* it ends: no step, nothing to decode */
            return;
        }
        if (ev == PTRACE_EVENT_STOP && opt.attach && !quit_signal &&
            (sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU)) {
            /* a group-stop of a seized process: keep it stopped until SIGCONT
             * (which reports another stop) */
            t->how = 2;
            ptrace(PTRACE_LISTEN, t->tid, 0, 0);
            return;
        }
        if (ev == PTRACE_EVENT_STOP && quit_signal && opt.attach) t->detach = 1;
        if (ev == PTRACE_EVENT_EXEC || ev == PTRACE_EVENT_STOP)
            ptrace(PTRACE_GETREGS, t->tid, 0, &t->r);
        if (t->rearm) {
            t->rearm = 0;
            if (t->native && t->p->armed) arm(t, 1);
        }
        resume(t);
        return;
    }
    siginfo_t si;
    if (t->native && sig == (SIGTRAP | 0x80)) {
        /* a syscall-stop (pending trigger): after an mmap, is its file there? */
        if (ptrace(PTRACE_GETREGS, t->tid, 0, &t->r) == 0 && t->r.orig_rax == 9 &&
            (int64_t)t->r.rax != -ENOSYS && !((int64_t)t->r.rax < 0 && (int64_t)t->r.rax > -4096))
            resolve_pending(t);
        resume(t);
        return;
    }
    if (t->native) {
        if (sig == SIGTRAP && t->p->armed) {
            uint64_t dr6 = get_dr(t->tid, 6);
            if (dr6 & 1) {
                set_dr(t->tid, 6, 0);
                ptrace(PTRACE_GETREGS, t->tid, 0, &t->r);
                sample(t, 1);
                win_open(t);
                resume(t);
                return;
            }
        }
        if (ptrace(PTRACE_GETSIGINFO, t->tid, 0, &si) < 0) sig = 0;   /* group-stop */
        t->sig = sig;
        resume(t);
        return;
    }

    struct user_regs_struct prev = t->r;
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &t->r) < 0) return;
    t->regs_fresh = 1;
    int stepped = 0;
    if (t->how == 3) {
        /* ran natively toward run_to: the line up to where it stopped retired */
        int reached = sig == SIGTRAP && t->r.rip == t->run_to;
        retire_line(t, prev.rip, t->r.rip);
        t->how = 0;
        if (reached) {
            t->at_dr_hit = 1;          /* the kernel set RF for the resume */
            sample(t, 0);
            window_check(t);
            if (quit_signal && opt.attach) t->detach = 1;
            resume(t);
            return;
        }
        goto signal_stop;              /* a signal (or fault) interrupted the line */
    }
    if (sig == SIGTRAP) {
        if (t->noexec) {
            t->noexec = 0;
        } else if (t->injected || t->cur.kind == K_INT) {
            int code = ptrace(PTRACE_GETSIGINFO, t->tid, 0, &si) == 0 ? si.si_code : 0;
            if (t->injected && code == SIGTRAP) {
                /* the kernel set up a handler frame: nothing retired */
                end_run(t);
                t->restart = 0;
                if (t->in_sys) {
                    write_sysret(t);
                } else {
                    rec(t);
                    w8(0x22); w32((uint32_t)t->injected); w8(t->sig_async ? 1 : 0);
                    w64(t->r.rip); w64(t->sig_ip);
                }
            } else if (t->cur.kind == K_INT && code == SI_KERNEL) {
                retire(t, &t->cur);          /* int3 retired; its SIGTRAP goes to the program */
                t->sig = SIGTRAP;
            } else {
                stepped = 1;
            }
        } else {
            stepped = 1;
        }
    } else {
signal_stop:
        /* signal-delivery-stop: nothing retired since the last stop */
        if (ptrace(PTRACE_GETSIGINFO, t->tid, 0, &si) < 0) {
            sig = 0;                       /* group-stop */
        } else {
            t->sig_async = !sync_signal(sig, si.si_code);
            t->sig_ip = t->r.rip;
        }
        t->sig = sig;
    }

    if (stepped && t->how == 0 && t->dr7 && t->r.rip == prev.rip && t->cur.kind != K_REPSTR) {
        /* a cached breakpoint (run_to_branch) fired before the instruction
         * ran: DR6 (ptrace's virtual copy, reset per #DB) says which trap */
        uint64_t dr6 = get_dr(t->tid, 6);
        if ((dr6 & 0xf) && !(dr6 & 0x4000)) {
            resume(t);                 /* the kernel set RF: the next step executes it */
            return;
        }
    }
    if (stepped) {
        if (t->how == 1) {
            /* block step: the straight line from prev.rip to its branch retired */
            uint64_t pc = prev.rip;
            for (int k = 0; k < 100000; k++) {
                struct insn_info ii = *insn_at(t, pc);
                retire(t, &ii);
                if (ii.kind != K_OTHER) break;
                pc += ii.len;
            }
        } else if (t->restart && t->r.rip == prev.rip && t->cur.kind != K_REPSTR &&
                   prev.rip == t->restart_pc + 2) {
            /* the interrupted syscall was restarted and ran again */
            struct insn_info sc = *insn_at(t, t->restart_pc);
            retire(t, &sc);
            t->sys_nr = t->r.orig_rax;
            end_run(t);
            rec(t); w8(0x20); w64(t->sys_nr);
            t->in_sys = 1;
            t->sys_ret = (int64_t)t->r.rax;
            t->restart = is_restart_code(t->sys_ret);
            sample(t, 1);
        } else if (t->cur.kind == K_REPSTR && t->r.rip == prev.rip) {
            /* one more iteration: retires when the pc moves on */
        } else {
            int logged = t->sys_logged && t->cur.kind == K_SYSCALL;
            t->sys_logged = 0;
            if (!logged) retire(t, &t->cur);       /* (else it retired at its event) */
            t->restart = 0;
            if (t->cur.kind == K_SYSCALL) {
                if (!logged) {
                    end_run(t);
                    rec(t); w8(0x20); w64(t->sys_nr);
                }
                release_held(t);
                t->in_sys = 1;
                t->sys_ret = (int64_t)t->r.rax;
                t->restart = is_restart_code(t->sys_ret);
                if (t->restart) t->restart_pc = t->cur.pc;
                uint64_t nr = t->sys_nr;
                if ((nr == 9 || nr == 10 || nr == 11 || nr == 25) && !(t->sys_ret < 0 && t->sys_ret > -4096)) {
                    if (update_maps(t->p)) {
                        pc_clear(&t->p->pcs);
                        free(t->p->blocks.e); t->p->blocks.e = NULL; t->p->blocks.cap = t->p->blocks.n = 0;
                    }
                }
                sample(t, 1);
            }
        }
        sample(t, 0);
    }
    window_check(t);
    if (quit_signal && opt.attach) t->detach = 1;
    resume(t);
}

/* ---------------------------------------------------------------- errors, setup */

void fail(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (errpath[0]) {
        FILE *f = fopen(errpath, "we");
        if (f) { fprintf(f, "%s\n", msg); fclose(f); }
    }
    if (!opt.quiet) fprintf(stderr, "hwtrace: %s\n", msg);
    for (struct thread *t = threads; t; t = t->next)
        if (opt.attach) ptrace(PTRACE_DETACH, t->tid, 0, 0);
        else kill(t->tid, SIGKILL);
    _exit(125);
}

static void on_quit(int sig) { quit_signal = sig; }

static const long trace_opts = PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC |
                               PTRACE_O_TRACEEXIT | PTRACE_O_TRACESYSGOOD;

static void launch(void)
{
    char *path = find_program(opt.argv[0]);
    if (!path) fail("%s: program not found", opt.argv[0]);
    check_program(path, opt.argv[0]);
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) fail("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) fail("fork: %s", strerror(errno));
    if (pid == 0) {
        close(pfd[0]);
        signal(SIGINT, SIG_DFL); signal(SIGQUIT, SIG_DFL); signal(SIGTERM, SIG_DFL);
        int err[2] = { 0, 0 };
        if (ptrace(PTRACE_TRACEME, 0, 0, 0) < 0) { err[0] = 1; err[1] = errno; }
        else { execv(path, opt.argv); err[0] = 2; err[1] = errno; }
        if (write(pfd[1], err, sizeof err) < 0) _exit(127);
        _exit(127);
    }
    close(pfd[1]);
    int err[2];
    ssize_t n = read(pfd[0], err, sizeof err);
    close(pfd[0]);
    main_pid = pid;
    if (n == sizeof err) {
        waitpid(pid, NULL, 0);
        if (err[0] == 1)
            fail("ptrace refused (%s): see /proc/sys/kernel/yama/ptrace_scope and the permissions of this user", strerror(err[1]));
        fail("%s: cannot execute: %s", opt.argv[0], strerror(err[1]));
    }
    int st;
    if (waitpid(pid, &st, __WALL) != pid || !WIFSTOPPED(st))
        fail("%s: the program did not stop after exec", opt.argv[0]);
    if (ptrace(PTRACE_SETOPTIONS, pid, 0, (void *)(trace_opts | PTRACE_O_EXITKILL)) < 0)
        fail("ptrace(SETOPTIONS): %s", strerror(errno));
    struct proc *p = new_proc(pid);
    struct thread *t = new_thread(pid, p);
    if (windowed) resolve_triggers(p);
    begin_thread(t);
}

static void attach(void)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", opt.attach);
    if (kill(opt.attach, 0) < 0 && errno == ESRCH) fail("no process with pid %d", opt.attach);
    main_pid = opt.attach;
    struct proc *p = new_proc(opt.attach);
    for (int again = 1; again; ) {
        again = 0;
        DIR *d = opendir(dir);
        if (!d) fail("pid %d: %s", opt.attach, strerror(errno));
        struct dirent *de;
        while ((de = readdir(d))) {
            pid_t tid = atoi(de->d_name);
            if (tid <= 0 || find_thread(tid)) continue;
            if (ptrace(PTRACE_SEIZE, tid, 0, (void *)trace_opts) < 0) {
                if (errno == ESRCH || task_state(opt.attach, tid) == 'Z' || task_state(opt.attach, tid) == 'X')
                    continue;                  /* exited meanwhile */
                int e = errno;
                closedir(d);
                if (e == EPERM) why_not_permitted(opt.attach);
                fail("cannot trace pid %d: %s", opt.attach, strerror(e));
            }
            struct thread *t = new_thread(tid, p);
            t->parent_tid = tid == opt.attach ? 0 : (uint64_t)opt.attach;
            t->attached = 1;
            ptrace(PTRACE_INTERRUPT, tid, 0, 0);
            again = 1;
        }
        closedir(d);
    }
    if (!threads) fail("process %d has exited", opt.attach);
    if (windowed) resolve_triggers(p);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--probe")) return probe_main();
    parse_options(argc, argv);
    if (opt.within && (opt.start || opt.stop)) fail("--within excludes --start/--stop");
    windowed = opt.start || opt.stop || opt.within;
    if (windowed && opt.stop) opt.block = 0;

    out = fopen(opt.out, "we");
    if (!out) fail("%s: %s", opt.out, strerror(errno));
    setvbuf(out, NULL, _IOFBF, 1 << 20);
    if (windowed) {
        char wp[4200];
        snprintf(wp, sizeof wp, "%s.windows", opt.out);
        winlog = fopen(wp, "we");
    }
    tsc0 = __rdtsc(); ns0 = now_ns();
    write_header(0);

    struct sigaction sa = { 0 };
    sa.sa_handler = on_quit;           /* no SA_RESTART: waitpid returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    if (opt.attach) sigaction(SIGINT, &sa, NULL);
    else { signal(SIGINT, SIG_IGN); signal(SIGQUIT, SIG_IGN); }

    blockstep_state = opt.block ? probe_blockstep() : -1;
    if (opt.attach) attach(); else launch();

    int interrupted = 0;
    pid_t focus = 0;
    unsigned focus_left = 0;
    while (nthreads > 0) {
        int st;
        if (quit_signal && !interrupted) {
            interrupted = 1;
            if (opt.attach) {
                /* A thread being stepped stops by itself (interrupting it
                 * could leave its step's SIGTRAP queued for after the
                 * detach); one running natively or in a syscall is
                 * interrupted. */
                for (struct thread *t = threads; t; t = t->next) {
                    t->detach = 1;
                    if (t->started && (t->native || t->how >= 2 || t->cur.kind == K_SYSCALL || t->restart))
                        ptrace(PTRACE_INTERRUPT, t->tid, 0, 0);
                }
            } else {
                for (struct thread *t = threads; t; t = t->next) kill(t->tid, SIGKILL);
            }
        }
        /* Keep following one thread for a quantum of stops while its next
         * stop is certain to come soon (an ordinary step or straight line,
         * not a syscall that may block, nor a signal delivery): fewer thread
         * switches in the log, like a scheduler's time slice. */
        pid_t tid = waitpid(focus && !quit_signal ? focus : -1, &st, __WALL);
        if (tid < 0) {
            if (errno == EINTR) continue;
            if (errno == ECHILD && focus) { focus = 0; continue; }
            if (errno == ECHILD) break;
            fail("waitpid: %s", strerror(errno));
        }
        struct thread *t = find_thread(tid);
        if (!t) {
            if (WIFSTOPPED(st)) {          /* a new thread/process before its parent's event */
                t = new_thread(tid, find_proc(tgid_of(tid)) ? find_proc(tgid_of(tid)) : new_proc(tgid_of(tid)));
                t->parked = 1;
                if (t->pid == tid) t->p->live = 1;
                continue;
            }
            if (tid == main_pid) { main_status = st; have_main_status = 1; }
            continue;
        }
        if (WIFEXITED(st) || WIFSIGNALED(st)) on_exit_status(t, st);
        else if (WIFSTOPPED(st)) on_stop(t, st);
        t = find_thread(tid);
        if (t && t->started && !t->native && !t->detach && !t->injected && !t->restart && nthreads > 1 &&
            (t->how == 3 || (t->how == 0 && t->cur.kind != K_SYSCALL)) &&
            (focus != tid ? (focus_left = opt.quantum) : focus_left) > 0) {
            focus = tid;
            focus_left--;
        } else {
            focus = 0;
        }
    }

    flush_exec();
    fflush(out);
    uint64_t hz = 0, dns = now_ns() - ns0;
    if (!opt.clock_insn && dns > 0)
        hz = (uint64_t)((double)(__rdtsc() - tsc0) * 1e9 / (double)dns);
    if (fseek(out, 16, SEEK_SET) == 0) { w64(hz); }
    if (fclose(out) != 0) fail("%s: write error", opt.out);
    if (winlog) fclose(winlog);
    {
        char ip[4200];
        snprintf(ip, sizeof ip, "%s.info", opt.out);
        FILE *f = fopen(ip, "we");
        if (f) {
            fprintf(f, "{\"stepping\": \"%s\", \"block_step\": \"%s\", \"steps\": %llu, \"native_runs\": %llu, "
                    "\"clock\": \"%s\", \"clock_hz\": %llu}\n",
                    blockstep_state > 0 ? "block" : total_runs ? "single+native-runs" : "single",
                    !opt.block ? "off" : blockstep_state > 0 ? "honoured" : "ignored",
                    (unsigned long long)total_steps, (unsigned long long)total_runs, opt.clock_insn ? "insn" : "tsc", (unsigned long long)hz);
            fclose(f);
        }
    }
    if (getenv("HWTRACE_STEPPER_STATS"))
        fprintf(stderr, "hwtrace-stepper: %llu steps, block-step %s\n", (unsigned long long)total_steps,
                blockstep_state > 0 ? "honoured" : blockstep_state < 0 ? "ignored (single-stepping)" : "unprobed");
    if (!have_main_status) return 0;   /* attached and detached */
    if (WIFEXITED(main_status)) return WEXITSTATUS(main_status);
    if (WIFSIGNALED(main_status)) {
        setrlimit(RLIMIT_CORE, &(struct rlimit){ 0, 0 });
        signal(WTERMSIG(main_status), SIG_DFL);
        sigset_t m; sigemptyset(&m); sigaddset(&m, WTERMSIG(main_status));
        sigprocmask(SIG_UNBLOCK, &m, NULL);
        raise(WTERMSIG(main_status));
        return 128 + WTERMSIG(main_status);
    }
    return 0;
}

/* hwtrace ptrace stepper: the debug hardware (stepper.h).  The trigger
 * breakpoint in DR0/DR7 (set through PTRACE_POKEUSER), the triggers'
 * addresses in a process, and the probes of what works on this machine:
 * execute breakpoints in the debug registers, and whether a block step
 * (PTRACE_SINGLEBLOCK, DEBUGCTL.BTF) stops only after branches -- many VMs
 * ignore BTF and step every instruction. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>
#include "stepper.h"

#ifndef PTRACE_SINGLEBLOCK
#define PTRACE_SINGLEBLOCK 33
#endif

int set_dr(pid_t tid, int i, uint64_t v)
{
    return (int)ptrace(PTRACE_POKEUSER, tid, (void *)(offsetof(struct user, u_debugreg) + (size_t)i * 8), (void *)v);
}

uint64_t get_dr(pid_t tid, int i)
{
    return (uint64_t)ptrace(PTRACE_PEEKUSER, tid, (void *)(offsetof(struct user, u_debugreg) + (size_t)i * 8), 0);
}

/* Arm (DR0 = start/within trigger) or disarm the thread's breakpoints. */
void arm(struct thread *t, int on)
{
    uint64_t a = t->p->within ? t->p->within : t->p->start;
    if (on && a) {
        set_dr(t->tid, 0, a);
        set_dr(t->tid, 7, 1);           /* L0, execute, length 1: native, only the trigger */
        t->dr7 = 1;
    } else {
        set_dr(t->tid, 7, 0);
        t->dr7 = 0;
    }
}

void resolve_triggers(struct proc *p)
{
    uint64_t base = (opt.start_rel || opt.stop_rel || opt.within_rel) ? exe_base(p) : 0;
    p->start = opt.start + (opt.start_rel ? base : 0);
    p->stop = opt.stop + (opt.stop_rel ? base : 0);
    p->within = opt.within + (opt.within_rel ? base : 0);
    /* FILE@OFF: where FILE is mapped, once it is (a shared library loaded later) */
    p->pending = 0;
    const char *files[3] = { opt.start_file, opt.stop_file, opt.within_file };
    uint64_t *addrs[3] = { &p->start, &p->stop, &p->within }, offs[3] = { opt.start, opt.stop, opt.within };
    for (int i = 0; i < 3; i++) {
        if (!files[i]) continue;
        *addrs[i] = file_addr(p->pid, files[i], offs[i]);
        if (!*addrs[i]) p->pending = 1;
    }
    p->armed = 1;
}

/* Does PTRACE_SINGLEBLOCK stop only after branches here (DEBUGCTL.BTF
 * honoured), or after every instruction (ignored, as in many VMs)?  Probed
 * once on a child of the stepper running a known sequence: from
 * btf_probe, a block step that honours BTF stops at btf_probe_target (after
 * the jmp), one that doesn't at btf_probe + 1. */
__asm__(".text\n"
        ".globl hwtrace_btf_probe\n"
        "hwtrace_btf_probe:\n"
        "  nop\n"
        "  nop\n"
        "  jmp 1f\n"
        "  ud2\n"
        "1:\n"
        ".globl hwtrace_btf_probe_target\n"
        "hwtrace_btf_probe_target:\n"
        "  nop\n"
        "  ud2\n");
extern char hwtrace_btf_probe[], hwtrace_btf_probe_target[];

int probe_blockstep(void)
{
    pid_t c = fork();
    if (c < 0) return -1;
    if (c == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        raise(SIGSTOP);
        _exit(0);
    }
    int st, result = -1;
    struct user_regs_struct r;
    if (waitpid(c, &st, 0) == c && WIFSTOPPED(st) && ptrace(PTRACE_GETREGS, c, 0, &r) == 0) {
        r.rip = (uint64_t)hwtrace_btf_probe;
        if (ptrace(PTRACE_SETREGS, c, 0, &r) == 0 && ptrace(PTRACE_SINGLEBLOCK, c, 0, 0) == 0 &&
            waitpid(c, &st, 0) == c && WIFSTOPPED(st) && WSTOPSIG(st) == SIGTRAP &&
            ptrace(PTRACE_GETREGS, c, 0, &r) == 0)
            result = r.rip == (uint64_t)hwtrace_btf_probe_target ? 1 : -1;
    }
    kill(c, SIGKILL);
    waitpid(c, &st, 0);
    return result;
}

/* Do debug-register breakpoints work here (DR0 through PTRACE_POKEUSER,
 * enabled in DR7: the trap comes at the address, DR6 says DR0)?  1 yes,
 * -1 no (why says why), 0 could not tell. */
__asm__(".text\n"
        ".globl hwtrace_dr_probe\n"
        "hwtrace_dr_probe:\n"
        "  nop\n"
        "  ret\n");
extern char hwtrace_dr_probe[];

static int probe_debugregs(char *why, size_t n)
{
    pid_t c = fork();
    if (c < 0) { snprintf(why, n, "fork: %s", strerror(errno)); return 0; }
    if (c == 0) {
        if (ptrace(PTRACE_TRACEME, 0, 0, 0) < 0) _exit(2);
        raise(SIGSTOP);
        ((void (*)(void))hwtrace_dr_probe)();
        _exit(0);
    }
    int st, result = 0;
    struct user_regs_struct r;
    if (waitpid(c, &st, 0) != c || !WIFSTOPPED(st)) {
        snprintf(why, n, "ptrace is refused here");
    } else if (set_dr(c, 0, (uint64_t)hwtrace_dr_probe) < 0 || set_dr(c, 7, 1) < 0) {
        snprintf(why, n, "PTRACE_POKEUSER of DR0/DR7 fails: %s", strerror(errno));
        result = -1;
    } else if (ptrace(PTRACE_CONT, c, 0, 0) == 0 && waitpid(c, &st, 0) == c) {
        if (WIFSTOPPED(st) && WSTOPSIG(st) == SIGTRAP && ptrace(PTRACE_GETREGS, c, 0, &r) == 0 &&
            r.rip == (uint64_t)hwtrace_dr_probe && (get_dr(c, 6) & 1)) {
            result = 1;
        } else {
            snprintf(why, n, "an execute breakpoint in DR0 did not stop the program");
            result = -1;
        }
    }
    kill(c, SIGKILL);
    waitpid(c, &st, 0);
    return result;
}

/* stepper --probe: one JSON line about the debug hardware here. */
int probe_main(void)
{
    char why[256] = "";
    int dr = probe_debugregs(why, sizeof why);
    int btf = probe_blockstep();
    printf("{\"debug_registers\": \"%s\", \"debug_registers_reason\": \"%s\", "
           "\"block_step\": \"%s\"}\n",
           dr > 0 ? "work" : dr < 0 ? "fail" : "unknown", why,
           btf > 0 ? "honoured" : btf < 0 ? "ignored" : "unknown");
    return 0;
}

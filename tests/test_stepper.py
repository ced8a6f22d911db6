"""The ptrace stepper: exact native instruction streams as execution logs.

Test programs are compiled with gcc into a tmp dir; expectations are exact
(instruction counts of assembly written for the test, call counts of a
recursive function, the records around syscalls, signals, fork and exec).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import _need
from hwtrace.engines.emulated import execlog as X
from hwtrace.engines.emulated import stepper

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ptrace stepper is Linux x86-64")


# ------------------------------------------------------------------ helpers

def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        _need("gcc", "the stepper and its test programs are compiled with gcc")
    return gcc


def build(tmp: Path, name: str, source: str, *flags: str, suffix: str = ".c") -> Path:
    src = tmp / (name + suffix)
    src.write_text(source)
    exe = tmp / name
    subprocess.run([_gcc(), *flags, "-o", str(exe), str(src)], check=True,
                   capture_output=True, text=True)
    return exe


def symbol(exe: Path, name: str) -> int:
    """st_value of a function symbol (for PIE: the offset from the load base)."""
    from elftools.elf.elffile import ELFFile
    with open(exe, "rb") as f:
        for sym in ELFFile(f).get_section_by_name(".symtab").iter_symbols():
            if sym.name == name:
                return sym["st_value"]
    raise KeyError(name)


class Run(NamedTuple):
    pc: int
    n: int


class Log:
    """A parsed execution log, with per-thread executed runs."""

    def __init__(self, path: Path):
        data = path.read_bytes()
        self.header, _ = X.parse_header(data)
        self.records = list(X.parse(data))
        self.blocks: dict[int, X.Block] = {}
        self.events: list[tuple[int, object]] = []   # (tid, record) for thread records
        self.runs: list[tuple[int, int, int]] = []   # (tid, pc, ninsn)
        tid = None
        for r in self.records:
            if isinstance(r, X.Ctx):
                tid = r.tid
            elif isinstance(r, X.Block):
                assert r.id not in self.blocks or True
                self.blocks[r.id] = r
            elif isinstance(r, X.Exec):
                for i in r.ids:
                    b = self.blocks[i]
                    self.runs.append((tid, b.pc, len(b.sizes)))
                    self.events.append((tid, Run(b.pc, len(b.sizes))))
            elif not isinstance(r, (X.Time, X.Mmap, X.Munmap)):
                self.events.append((tid, r))

    def insns(self, tid=None) -> int:
        return sum(n for t, _, n in self.runs if tid is None or t == tid)

    def run_starts(self, pc: int) -> int:
        return sum(1 for _, p, _ in self.runs if p == pc)

    def of(self, kind):
        return [r for r in self.records if isinstance(r, kind)]

    def after(self, pred, tid=None):
        """The event following each event matching pred (same thread)."""
        seq = [(t, e) for t, e in self.events if tid is None or t == tid]
        out = []
        for i, (t, e) in enumerate(seq):
            if pred(e):
                nxt = next((e2 for t2, e2 in seq[i + 1:] if t2 == t), None)
                out.append(nxt)
        return out


def trace(tmp: Path, argv, options=None, **kw):
    log = tmp / "out.xlog"
    status = stepper.run([str(a) for a in argv], log, options, **kw)
    return status, Log(log)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    _gcc()
    stepper.stepper_path()   # build once, before any test measures anything
    return tmp_path_factory.mktemp("stepper")


# ------------------------------------------------------------------ programs

TINY = r"""
.globl _start
.text
_start:
    mov $5, %ecx
1:  dec %ecx
    jnz 1b
    mov $1, %eax
    mov $1, %edi
    lea msg(%rip), %rsi
    mov $3, %edx
    syscall
    mov $60, %eax
    mov $3, %edi
    syscall
.data
msg: .ascii "hi\n"
"""
TINY_INSNS = 1 + 5 * 2 + 5 + 3

# fib in assembly: 14 instructions per inner activation, 4 per leaf
FIB_ASM = r"""
.text
.globl fib
.type fib, @function
fib:
    cmp $2, %rdi
    jl 1f
    push %rbx
    push %rbp
    mov %rdi, %rbx
    lea -1(%rdi), %rdi
    call fib
    mov %rax, %rbp
    lea -2(%rbx), %rdi
    call fib
    add %rbp, %rax
    pop %rbp
    pop %rbx
    ret
1:  mov %rdi, %rax
    ret
.globl run2
.type run2, @function
run2:
    push %rbx
    mov %rdi, %rbx
    call fib
.globl after1
after1:
    mov %rbx, %rdi
    call fib
.globl after2
after2:
    pop %rbx
    ret
"""
FIB_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
long run2(long n);
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    printf("%ld\n", run2(n));
    return 0;
}
"""


def fibnum(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def fib_calls(n):
    return 2 * fibnum(n + 1) - 1


def fib_insns(n):
    leaves = fibnum(n + 1)
    return 14 * (leaves - 1) + 4 * leaves


FIB_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int argc, char **argv) { long n = atol(argv[1]); printf("fib(%ld)=%ld\n", n, fib(n)); return 7; }
"""

THREADS_C = r"""
#include <pthread.h>
#include <stdio.h>
static long sum[4];
__attribute__((noinline)) void *worker(void *a) {
    long i = (long)a;
    for (int k = 0; k < 200; k++) sum[i] += k;
    return 0;
}
int main(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, worker, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    printf("%ld\n", sum[0] + sum[1] + sum[2] + sum[3]);
    return 0;
}
"""

SIGNALS_C = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/time.h>
static volatile int hits, alarmed;
void on_usr1(int s) { hits++; }
void on_alarm(int s) { alarmed = 1; }
void on_segv(int s) { printf("segv after %d hits\n", hits); fflush(stdout); _exit(42); }
__attribute__((noinline)) void spin(void) { while (!alarmed) ; }
__attribute__((noinline)) void crash(void) { *(volatile int *)16 = 1; }
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1; sigaction(SIGUSR1, &sa, 0);
    sa.sa_handler = on_alarm; sigaction(SIGALRM, &sa, 0);
    sa.sa_handler = on_segv; sigaction(SIGSEGV, &sa, 0);
    raise(SIGUSR1);
    kill(getpid(), SIGUSR1);
    signal(SIGUSR2, SIG_IGN);
    raise(SIGUSR2);
    struct itimerval it = {{0, 0}, {0, 20000}};
    setitimer(ITIMER_REAL, &it, 0);
    spin();
    printf("hits=%d\n", hits);
    fflush(stdout);
    crash();
    return 0;
}
"""

FORKEXEC_C = r"""
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) { execl(argv[1], "tiny", (char *)0); _exit(99); }
    int st;
    waitpid(p, &st, 0);
    printf("child %d\n", WEXITSTATUS(st));
    return 5;
}
"""

SPIN_C = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static volatile long counter;
static volatile int poked, done;
void on_usr1(int s) { poked = 1; }
void on_term(int s) { done = 1; }
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1; sigaction(SIGUSR1, &sa, 0);
    sa.sa_handler = on_term; sigaction(SIGTERM, &sa, 0);
    printf("ready\n"); fflush(stdout);
    while (!done) {
        counter++;
        if (poked) { poked = 0; printf("alive %d\n", counter > 0); fflush(stdout); }
    }
    printf("bye\n");
    return 11;
}
"""


# ------------------------------------------------------------------ tests

@pytest.mark.parametrize("accelerate", [False, True])
def test_exact_instruction_count_of_static_asm_program(tmp, capfd, accelerate):
    exe = build(tmp, "tiny", TINY, "-nostdlib", "-static", suffix=".S")
    status, log = trace(tmp, [exe], stepper.Options(accelerate=accelerate))
    assert status == 3
    assert capfd.readouterr().out == "hi\n"
    assert log.header.source == X.SOURCE_PTRACE
    assert log.header.clock == X.CLOCK_HOST_TSC and log.header.clock_hz > 0
    assert log.insns() == TINY_INSNS
    # the runs: the loop as observed, then the write and exit syscalls
    tid = log.runs[0][0]
    start = symbol(exe, "_start")
    assert [(p - start, n) for _, p, n in log.runs] == [
        (0, 3), (5, 2), (5, 2), (5, 2), (5, 7), (0x21, 3)]
    events = [e for t, e in log.events if not isinstance(e, Run)]
    assert events == [X.ProcStart(0), X.ThreadStart(0), X.Syscall(1), X.Sysret(1, 3),
                      X.Syscall(60), X.ThreadExit(3), X.ProcExit(3)]
    maps = [m for m in log.of(X.Mmap) if m.path == str(exe)]
    assert [(m.addr, m.offset, m.prot) for m in maps] == [(0x401000, 0x1000, 5)]
    assert len(maps[0].build_id) == 20
    assert {c.tid for c in log.of(X.Ctx)} == {tid}
    info = stepper.info(tmp / "out.xlog")
    if info["block_step"] == "honoured":
        assert info["stepping"] == "block"
    elif accelerate:
        # mov+dec run natively to the jnz; then the loop's jnz/dec are
        # stepped (a 1-instruction line isn't worth a breakpoint; RF keeps
        # the cached breakpoint on jnz from firing); the 4 and 2
        # instructions before each syscall run natively, then it is stepped
        assert (info["stepping"], info["steps"], info["native_runs"]) == (
            "single+native-runs", 1 + 4 * 2 + 2, 3)
    else:
        assert (info["stepping"], info["steps"], info["native_runs"]) == ("single", TINY_INSNS, 0)


def test_instruction_clock_counts_instructions(tmp):
    exe = tmp / "tiny"
    if not exe.exists():
        build(tmp, "tiny", TINY, "-nostdlib", "-static", suffix=".S")
    status, log = trace(tmp, [exe], stepper.Options(clock="insn"))
    assert status == 3
    assert log.header.clock == X.CLOCK_INSN_COUNT
    times = [r.value for r in log.records if isinstance(r, X.Time)]
    assert times == sorted(times) and times[-1] == TINY_INSNS


def test_recursive_fib_call_count(tmp, capfd):
    exe = build(tmp, "fibc", FIB_C, "-O0", "-static", "-no-pie")
    status, log = trace(tmp, [exe, 12])
    assert status == 7
    assert capfd.readouterr().out == f"fib(12)={fibnum(12)}\n"
    assert log.run_starts(symbol(exe, "fib")) == fib_calls(12)


def test_accelerated_and_single_stepped_streams_are_identical(tmp):
    """Running straight lines natively to a breakpoint changes nothing in
    the log's instruction stream (same program, no ASLR, both ways)."""
    if shutil.which("setarch") is None:
        _need("setarch", "runs both recordings without address randomization")
    exe = tmp / "fibc"
    if not exe.exists():
        build(tmp, "fibc", FIB_C, "-O0", "-static", "-no-pie")
    seqs = []
    for accelerate in (False, True):
        log = tmp / f"accel-{accelerate}.xlog"
        cmd = stepper.command([str(exe), "9"], log, stepper.Options(accelerate=accelerate))
        r = subprocess.run(["setarch", "-R", *cmd], capture_output=True, text=True, timeout=600)
        assert (r.returncode, r.stdout) == (7, f"fib(9)={fibnum(9)}\n")
        parsed = Log(log)
        pcs = []
        for _, pc, n in parsed.runs:
            for size in parsed.blocks[next(i for i, b in parsed.blocks.items()
                                          if b.pc == pc and len(b.sizes) == n)].sizes:
                pcs.append(pc)
                pc += size
        # (return values such as set_tid_address's tid differ between runs)
        events = [X.Sysret(e.nr, 0) if isinstance(e, X.Sysret) else e
                  for _, e in parsed.events if not isinstance(e, Run)]
        seqs.append((pcs, events))
        info = stepper.info(log)
        assert (info["native_runs"] > 0) == accelerate
    assert seqs[0] == seqs[1]
    assert len(seqs[0][0]) > 10000


def test_asm_fib_exact_instructions_in_pie(tmp, capfd):
    src = tmp / "fibasm.S"
    src.write_text(FIB_ASM)
    exe = build(tmp, "fibpie", FIB_MAIN, "-O1", "-pie", "-fPIE", str(src))
    status, log = trace(tmp, [exe, 10])
    assert status == 0
    assert capfd.readouterr().out == "55\n"
    base = next(m.addr - m.offset for m in log.of(X.Mmap) if m.path == str(exe))
    fib = base + symbol(exe, "fib")
    assert log.run_starts(fib) == 2 * fib_calls(10)
    # every instruction of fib's body, counted from the runs inside it
    end = base + symbol(exe, "run2")
    inside = 0
    for _, pc, n in log.runs:
        if fib <= pc < end:
            inside += n
    assert inside == 2 * fib_insns(10)


def test_threads_are_followed(tmp, capfd):
    exe = build(tmp, "threads", THREADS_C, "-O1", "-pthread")
    status, log = trace(tmp, [exe])
    assert status == 0
    assert capfd.readouterr().out == f"{4 * sum(range(200))}\n"
    starts = [(t, e) for t, e in log.events if isinstance(e, X.ThreadStart)]
    main = starts[0][0]
    assert starts[0][1] == X.ThreadStart(0)
    workers = {t for t, e in starts[1:]}
    assert len(workers) == 4 and all(e.parent_tid == main for _, e in starts[1:])
    exits = [(t, e) for t, e in log.events if isinstance(e, X.ThreadExit)]
    assert sorted(t for t, _ in exits) == sorted(workers | {main})
    assert exits[-1] == (main, X.ThreadExit(0))
    # each worker enters worker() exactly once, in its own thread
    base = next(m.addr - m.offset for m in log.of(X.Mmap) if m.path == str(exe))
    w = base + symbol(exe, "worker")
    entered = Counter(t for t, p, _ in log.runs if p == w)
    assert entered == Counter({t: 1 for t in workers})
    # a new thread starts right after its clone syscall returns (rax = 0)
    for t in workers:
        first = next(e for t2, e in log.events if t2 == t and isinstance(e, Run))
        assert first.pc != w


JOINS_C = r"""
#include <pthread.h>
#include <unistd.h>
#include <sys/syscall.h>
static void *worker(void *a) { volatile long s = 0; for (long i = 0; i < 300 * (long)a; i++) s += i; return 0; }
int main(void) {
    pthread_t t[3];
    for (long i = 0; i < 3; i++) pthread_create(&t[i], 0, worker, (void *)(3 - i));
    for (int i = 0; i < 3; i++) { pthread_join(t[i], 0); syscall(SYS_getppid); }
    return 0;
}
"""


def test_clone_and_exit_are_logged_before_other_threads_see_them(tmp):
    """The log is in the order things happened: a clone's SYSCALL before
    the child's THREAD_START (written at the parent's CLONE event: the
    child was begun there, before the step over the syscall stopped), and
    a worker's exit -- its SYSCALL(exit) and THREAD_EXIT, at
    PTRACE_EVENT_EXIT -- before main's first syscall after pthread_join
    returned (the exit used to be logged when WIFEXITED was seen, after
    the join could return and main go on)."""
    exe = build(tmp, "joins", JOINS_C, "-O1", "-pthread")
    status, log = trace(tmp, [exe])
    assert status == 0
    ev = log.events
    main = next(t for t, e in ev if isinstance(e, X.ThreadStart))
    workers = [t for t, e in ev if isinstance(e, X.ThreadStart) and t != main]
    assert len(workers) == 3
    clones = (56, 435)
    for w in workers:
        start = ev.index((w, X.ThreadStart(main)))
        ret = next(k for k, (t, e) in enumerate(ev)
                   if t == main and isinstance(e, X.Sysret) and e.nr in clones and e.ret == w)
        call = max(k for k in range(ret) if ev[k][0] == main and isinstance(ev[k][1], X.Syscall))
        assert ev[call][1].nr in clones and call < start
    marks = [k for k, (t, e) in enumerate(ev) if t == main and e == X.Syscall(110)]
    assert len(marks) == 3
    for w, mark in zip(workers, marks):
        mine = [k for k, (t, _e) in enumerate(ev) if t == w]
        assert ev[mine[-1]][1] == X.ThreadExit(0) and ev[mine[-2]][1] == X.Syscall(60)
        assert mine[-1] < mark


def test_signals_pass_through_and_are_logged(tmp, capfd):
    exe = build(tmp, "signals", SIGNALS_C, "-O1")
    status, log = trace(tmp, [exe])
    assert status == 42
    assert capfd.readouterr().out == "hits=2\nsegv after 2 hits\n"
    base = next(m.addr - m.offset for m in log.of(X.Mmap) if m.path == str(exe))
    sym = {n: base + symbol(exe, n) for n in ("on_usr1", "on_alarm", "on_segv", "spin", "crash")}
    # raise/kill: the handler runs when the syscall returns (SYSRET, then the handler)
    after_sysret = log.after(lambda e: isinstance(e, X.Sysret))
    usr1 = [e for e in after_sysret if isinstance(e, Run) and e.pc == sym["on_usr1"]]
    assert len(usr1) == 2
    assert log.run_starts(sym["on_usr1"]) == 2
    # SIGUSR2 is ignored: nothing is delivered
    handlers = {s.handler for s in log.of(X.Sigaction)}
    assert {sym["on_usr1"], sym["on_alarm"], sym["on_segv"]} <= handlers
    sigs = log.of(X.Signal)
    # the timer interrupts spin() asynchronously; the fault is synchronous
    alarm = [s for s in sigs if s.signo == signal.SIGALRM]
    assert len(alarm) == 1 and alarm[0].is_async and alarm[0].handler == sym["on_alarm"]
    assert sym["spin"] <= alarm[0].ip < sym["crash"]
    segv = [s for s in sigs if s.signo == signal.SIGSEGV]
    assert segv == [X.Signal(signal.SIGSEGV, False, sym["on_segv"], sym["crash"])]
    nxt = log.after(lambda e: isinstance(e, X.Signal))
    assert [e.pc for e in nxt] == [sym["on_alarm"], sym["on_segv"]]
    # the faulting store never retired: crash()'s first instruction is not in a run
    assert log.run_starts(sym["crash"]) == 0


def test_fork_and_exec_are_followed(tmp, capfd):
    tiny = tmp / "tiny"
    if not tiny.exists():
        build(tmp, "tiny", TINY, "-nostdlib", "-static", suffix=".S")
    exe = build(tmp, "forkexec", FORKEXEC_C, "-O1")
    status, log = trace(tmp, [exe, tiny])
    assert status == 5
    assert capfd.readouterr().out == "hi\nchild 3\n"
    procs = [(t, e) for t, e in log.events if isinstance(e, X.ProcStart)]
    assert len(procs) == 2
    parent = procs[0][0]
    child = procs[1][0]
    assert procs[1][1] == X.ProcStart(parent)
    execs = [(t, e) for t, e in log.events if isinstance(e, X.ProcExec)]
    assert execs == [(child, X.ProcExec(True, str(tiny)))]
    # after the exec: exactly the tiny program's instructions
    seq = [e for t, e in log.events if t == child]
    i = seq.index(X.ProcExec(True, str(tiny)))
    assert seq[i - 1] == X.Syscall(59)
    assert sum(e.n for e in seq[i:] if isinstance(e, Run)) == TINY_INSNS
    assert seq[-2:] == [X.ThreadExit(3), X.ProcExit(3)]
    pseq = [e for t, e in log.events if t == parent]
    assert pseq[-2:] == [X.ThreadExit(5), X.ProcExit(5)]
    # the child's maps after exec are the new image's
    assert any(m.pid == child and m.path == str(tiny) for m in log.of(X.Mmap))


def test_fork_not_followed(tmp, capfd):
    tiny = tmp / "tiny"
    if not tiny.exists():
        build(tmp, "tiny", TINY, "-nostdlib", "-static", suffix=".S")
    exe = tmp / "forkexec"
    if not exe.exists():
        build(tmp, "forkexec", FORKEXEC_C, "-O1")
    status, log = trace(tmp, [exe, tiny], stepper.Options(follow_fork=False))
    assert status == 5
    assert capfd.readouterr().out == "hi\nchild 3\n"
    assert len(log.of(X.ProcStart)) == 1 and log.of(X.ProcExec) == []


DLOPEN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libm.so.6", RTLD_NOW);
    if (!h) return 1;
    double (*f)(double) = (double (*)(double))dlsym(h, "sqrt");
    printf("%.1f\n", f(16.0));
    dlclose(h);
    return 0;
}
"""


def test_maps_follow_dlopen_and_dlclose(tmp, capfd):
    exe = build(tmp, "dlopen", DLOPEN_C, "-O1", "-ldl")
    status, log = trace(tmp, [exe])
    assert status == 0
    assert capfd.readouterr().out == "4.0\n"
    order = []
    for r in log.records:
        if isinstance(r, X.Mmap) and "libm.so" in r.path:
            order.append(("mmap", r.addr, r.addr + r.size))
        elif isinstance(r, X.Munmap):
            order.append(("munmap", r.addr, r.addr + r.size))
        elif isinstance(r, X.Exec):
            for i in r.ids:
                pc = log.blocks[i].pc
                if any(k == "mmap" and a <= pc < b for k, a, b in order):
                    order.append(("run", pc, pc))
    kinds = [k for k, _, _ in order]
    # libm's code is mapped (with its build-id) before any instruction in it
    # runs, and unmapped by dlclose
    assert kinds[0] == "mmap" and "run" in kinds
    libm = [m for m in log.of(X.Mmap) if "libm.so" in m.path]
    assert len(libm) == 1 and len(libm[0].build_id) == 20 and libm[0].prot == 5
    assert ("munmap", libm[0].addr, libm[0].addr + libm[0].size) in order
    assert kinds.index("munmap") > max(i for i, k in enumerate(kinds) if k == "run")


def test_vdso_bytes_are_saved_next_to_the_log(tmp):
    exe = tmp / "tiny"
    if not exe.exists():
        build(tmp, "tiny", TINY, "-nostdlib", "-static", suffix=".S")
    status, log = trace(tmp, [exe])
    assert status == 3
    vdso = [m for m in log.of(X.Mmap) if m.path == "[vdso]"]
    assert len(vdso) == 1
    saved = (tmp / "out.xlog.vdso").read_bytes()
    assert len(saved) == vdso[0].size and saved[:4] == b"\x7fELF"
    # the same kernel maps the same vDSO into this process
    import ctypes
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("[vdso]"):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            assert ctypes.string_at(start, end - start) == saved


def test_killed_by_signal_status(tmp):
    exe = build(tmp, "abort", "#include <stdlib.h>\nint main(void){abort();}\n", "-O1")
    status, log = trace(tmp, [exe])
    assert status == -signal.SIGABRT
    assert log.of(X.ProcExit) == [X.ProcExit(-signal.SIGABRT)]


def test_stdin_and_stderr_pass_through(tmp):
    # the stepper under a real parent: stdout/stderr/exit status unchanged
    code = ("import sys; from hwtrace.engines.emulated import stepper; "
            "sys.exit(stepper.run(sys.argv[1:], sys.argv[0] + '.x'))")
    script = tmp / "runner.py"
    script.write_text(code.replace("sys.argv[0] + '.x'", repr(str(tmp / "pt.xlog"))))
    r = subprocess.run([sys.executable, str(script), "sh", "-c",
                        "read x; echo out:$x; echo err >&2; exit 9"],
                       input="hello\n", capture_output=True, text=True, timeout=600)
    assert (r.returncode, r.stdout, r.stderr) == (9, "out:hello\n", "err\n")


def _gone(pid: int, timeout: float = 30.0) -> bool:
    """The process no longer runs (gone, or a zombie waiting for its reaper)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_no_orphan_when_the_stepper_dies(tmp, how):
    exe = tmp / "spin"
    if not exe.exists():
        build(tmp, "spin", SPIN_C, "-O1")
    proc = subprocess.Popen(stepper.command([str(exe)], tmp / "orphan.xlog"),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1
        tracee = int(children[0])
        proc.send_signal(how)
        status = proc.wait(timeout=60)
        assert status == -signal.SIGKILL   # the program was killed; so is the stepper
        assert _gone(tracee)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_attach_not_permitted_names_the_reason(tmp):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the stepper as another user")
    exe = tmp / "stepper-copy"
    shutil.copy(stepper.stepper_path(), exe)
    for d in (tmp, exe):
        os.chmod(d, 0o755)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            str(exe), "-o", "/dev/null", "--pid", str(victim.pid)],
                           capture_output=True, text=True, timeout=60, cwd=tmp)
        assert r.returncode == 125
        assert r.stderr == (f"hwtrace: cannot trace pid {victim.pid}: it belongs to uid 0, "
                            f"not to you (uid 65534); run as that user or with CAP_SYS_PTRACE\n")
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_bad_programs_are_one_line_errors(tmp):
    log = tmp / "bad.xlog"
    with pytest.raises(stepper.StepperError, match=r"^no-such-prog-xyz: program not found$"):
        stepper.run(["no-such-prog-xyz"], log)
    text = tmp / "notelf"
    text.write_text("hello\n")
    text.chmod(0o755)
    with pytest.raises(stepper.StepperError, match="not an ELF executable"):
        stepper.run([str(text)], log)
    elf32 = tmp / "elf32"
    elf32.write_bytes(b"\x7fELF\x01\x01\x01" + bytes(9) + b"\x02\x00\x03\x00" + bytes(44))
    elf32.chmod(0o755)
    with pytest.raises(stepper.StepperError, match="not an x86-64 program"):
        stepper.run([str(elf32)], log)
    with pytest.raises(stepper.StepperError, match="no process with pid"):
        stepper.run(2 ** 22 + 12345, log)
    # the CLI-level message is one line
    r = subprocess.run([str(stepper.stepper_path()), "-o", str(log), "--", "no-such-prog-xyz"],
                       capture_output=True, text=True)
    assert r.returncode == 125
    assert r.stderr == "hwtrace: no-such-prog-xyz: program not found\n"


def test_attach_and_detach_leave_the_process_running(tmp):
    exe = build(tmp, "spin", SPIN_C, "-O1")
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        log = tmp / "attach.xlog"
        status = stepper.run(proc.pid, log, timeout=0.5)
        assert status == 0
        assert proc.poll() is None
        status_text = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(r"^TracerPid:\s+0$", status_text, re.M)
        assert re.search(r"^State:\s+[RS]", status_text, re.M)
        parsed = Log(log)
        assert parsed.of(X.ThreadStart) == [X.ThreadStart(0)]
        assert parsed.insns() > 100
        assert {c.tid for c in parsed.of(X.Ctx)} == {proc.pid}
        # it still runs its loop and its handlers
        proc.send_signal(signal.SIGUSR1)
        assert proc.stdout.readline() == "alive 1\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline() == "bye\n"
        assert proc.wait(timeout=30) == 11
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


BLOCKED_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static volatile long c;
static volatile int stop;
void *spin(void *a) { while (!stop) c++; return 0; }
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, spin, 0);
    printf("ready\n");
    fflush(stdout);
    char buf[16];
    ssize_t n = read(0, buf, sizeof buf);   /* blocked here while traced */
    stop = 1;
    pthread_join(t, 0);
    printf("done %zd %d\n", n, c > 0);
    return 4;
}
"""


def test_attach_to_threads_blocked_in_a_syscall_and_detach(tmp):
    exe = build(tmp, "blocked", BLOCKED_C, "-O1", "-pthread")
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        tids = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task"))
        log = tmp / "attach2.xlog"
        assert stepper.run(proc.pid, log, timeout=0.5) == 0
        assert proc.poll() is None
        for tid in tids:
            text = Path(f"/proc/{proc.pid}/task/{tid}/status").read_text()
            assert re.search(r"^TracerPid:\s+0$", text, re.M)
        parsed = Log(log)
        assert sorted({c.tid for c in parsed.of(X.Ctx)}) == tids
        assert [t for t, e in parsed.events if isinstance(e, X.ThreadStart)] != []
        # the spinning thread was stepped; the reader ends in read(): its
        # last record is the read syscall's entry (or, attached while
        # already blocked in it, just its start)
        spinner = max(tids)
        assert parsed.insns(spinner) > 10
        main_events = [e for t, e in parsed.events if t == proc.pid and not isinstance(e, Run)]
        assert main_events[-1] in (X.ThreadStart(0), X.Syscall(0)), main_events[-3:]
        # it goes on as if never traced: the read gets its line
        out, _ = proc.communicate("hello\n", timeout=60)
        assert (out, proc.returncode) == ("done 6 1\n", 4)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("accelerate", [False, True])
def test_within_window_steps_only_inside(tmp, capfd, accelerate):
    src = tmp / "fibasm.S"
    src.write_text(FIB_ASM)
    exe = build(tmp, "fibwin", FIB_MAIN, "-O1", "-static", "-no-pie", str(src))
    fib = symbol(exe, "fib")
    status, log = trace(tmp, [exe, 10], stepper.Options(within=fib, accelerate=accelerate))
    assert status == 0
    assert capfd.readouterr().out == "55\n"
    wins = stepper.windows(tmp / "out.xlog")
    tid = wins[0].tid
    after1, after2 = symbol(exe, "after1"), symbol(exe, "after2")
    n = fib_insns(10)
    assert wins == [stepper.Window(True, tid, tid, fib, 0),
                    stepper.Window(False, tid, tid, after1, n),
                    stepper.Window(True, tid, tid, fib, n),
                    stepper.Window(False, tid, tid, after2, 2 * n)]
    assert log.insns() == 2 * n
    assert log.run_starts(fib) == 2 * fib_calls(10)
    info = stepper.info(tmp / "out.xlog")
    if not accelerate and info["block_step"] != "honoured":
        assert (info["steps"], info["native_runs"]) == (2 * n, 0)
    else:
        assert info["steps"] + info["native_runs"] < 2 * n


FIB_THREADS_MAIN = r"""
#include <pthread.h>
#include <stdio.h>
long run2(long n);
static long res[3];
void *worker(void *a) { long i = (long)a; res[i] = run2(8 + i); return 0; }
int main(void) {
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, worker, (void *)(i + 1));
    res[0] = run2(8);
    for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
    printf("%ld %ld %ld\n", res[0], res[1], res[2]);
    return 0;
}
"""


def test_within_windows_in_every_thread(tmp, capfd):
    src = tmp / "fibasm.S"
    src.write_text(FIB_ASM)
    exe = build(tmp, "fibthreads", FIB_THREADS_MAIN, "-O1", "-pthread", "-static", "-no-pie", str(src))
    fib = symbol(exe, "fib")
    status, log = trace(tmp, [exe], stepper.Options(within=fib))
    assert status == 0
    assert capfd.readouterr().out == f"{fibnum(8)} {fibnum(9)} {fibnum(10)}\n"
    wins = stepper.windows(tmp / "out.xlog")
    per_tid = Counter(w.tid for w in wins if w.on)
    assert sorted(per_tid.values()) == [2, 2, 2]
    # each thread's stepped instructions are exactly its two fib(n) activations
    counts = sorted(log.insns(t) for t in per_tid)
    assert counts == sorted(2 * fib_insns(n) for n in (8, 9, 10))
    assert log.run_starts(fib) == sum(2 * fib_calls(n) for n in (8, 9, 10))


def test_within_window_relative_address_in_pie(tmp, capfd):
    src = tmp / "fibasm.S"
    src.write_text(FIB_ASM)
    exe = build(tmp, "fibpie2", FIB_MAIN, "-O1", "-pie", "-fPIE", str(src))
    off = symbol(exe, "fib")
    status, log = trace(tmp, [exe, 8], stepper.Options(within=f"+{off:#x}"))
    assert status == 0
    assert capfd.readouterr().out == "21\n"
    assert log.insns() == 2 * fib_insns(8)
    assert len(stepper.windows(tmp / "out.xlog")) == 4


def test_start_stop_window(tmp, capfd):
    src = tmp / "fibasm.S"
    src.write_text(FIB_ASM)
    exe = tmp / "fibwin"
    if not exe.exists():
        build(tmp, "fibwin", FIB_MAIN, "-O1", "-static", "-no-pie", str(src))
    after1, after2 = symbol(exe, "after1"), symbol(exe, "after2")
    status, log = trace(tmp, [exe, 9], stepper.Options(start=after1, stop=after2))
    assert status == 0
    assert capfd.readouterr().out == "34\n"
    # mov, call, then one fib(9) activation
    assert log.insns() == 2 + fib_insns(9)
    assert [(w.on, w.pc) for w in stepper.windows(tmp / "out.xlog")] == [(True, after1), (False, after2)]
    assert log.runs[0][1] == after1


def test_missing_gcc_is_one_line(tmp, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp / "emptycache"))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(stepper.StepperError, match="needs gcc"):
        stepper.stepper_path()

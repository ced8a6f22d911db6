"""Where recordings put PSB+ and asynchronous events: where hardware does
(issue 15).  Real programs recorded with both emulated engines, decoded by
libipt (ptoracle) with zero errors and exactly ``instructions_observed``
instructions, and the packets checked against what the program itself saw.

* PSB+ goes one retired instruction after PacketByteCnt reached the PSB
  period, inside a block when that one is not its last (as a Skylake does:
  see ptgen's docstring): its FUP is usually not a branch target.
* A fault in the middle of a block (divide error, bad load) is traced at
  the faulting instruction (FUP at it, not retired) even when the handler
  never returns (siglongjmp), with QEMU as with the stepper.
* A signal that interrupts a tight loop: FUP at the instruction its
  handler's ucontext says was interrupted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from conftest import build_programs, run_hwtrace

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")

SOURCES = {
    # calls and returns, short blocks: many packets (every return a TIP,
    # with DisRETC), PSB+ every 2 KiB
    "fib": r"""
        #include <stdio.h>
        __attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
        int main(void) { printf("%d\n", fib(20)); return 0; }
    """,
    # a divide error and a bad load, each in the middle of a block; the
    # handler records where the fault was and jumps out (no sigreturn)
    "faults": r"""
        #define _GNU_SOURCE
        #include <setjmp.h>
        #include <signal.h>
        #include <stdio.h>
        #include <ucontext.h>
        static sigjmp_buf env;
        static volatile unsigned long rips[2];
        static volatile int n;
        static void on_fault(int sig, siginfo_t *si, void *uc) {
          (void)sig; (void)si;
          rips[n++] = ((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
          siglongjmp(env, 1);
        }
        __attribute__((noinline)) int divide(int a, int b, int c) { int x = a * 3 + c; x ^= c << 2; return x / b + c; }
        __attribute__((noinline)) int load(int *p, int c) { int x = c * 5 + 1; x ^= c >> 1; return x + *p; }
        int main(int argc, char **argv) {
          (void)argv;
          struct sigaction sa = {0};
          sa.sa_sigaction = on_fault;
          sa.sa_flags = SA_SIGINFO | SA_NODEFER;
          sigaction(SIGFPE, &sa, 0);
          sigaction(SIGSEGV, &sa, 0);
          int r = 0;
          if (!sigsetjmp(env, 1)) r += divide(argc, argc - 1, 7);
          if (!sigsetjmp(env, 1)) r += load((int *)(long)(argc - 1), 3);
          printf("%lx %lx\n", rips[0], rips[1]);
          return r;
        }
    """,
    # an uncaught fault: a bad load that is the first instruction after a
    # taken jcc ("load"), or a divide error inside a block ("divide")
    "fatal": r"""
        #include <string.h>
        __attribute__((noinline)) int get(int *p, int n) { int s = 0; for (int i = 0; i < n; i++) s += i; if (s > 10) return *p + s; return s; }
        __attribute__((noinline)) int divide(int a, int b, int c) { int x = a * 3 + c; x ^= c << 2; return x / b + c; }
        int main(int argc, char **argv) {
          if (strcmp(argv[1], "divide") == 0) return divide(argc, argc - 2, 7);
          return get((int *)(long)(argc - 2), 100);
        }
    """,
    # SIGALRM every 2 ms into a tight loop; the handler records every
    # delivery: where it interrupted, how many iterations had run, and
    # whether that place follows a syscall instruction.  A delivery at a
    # syscall's return (setitimer's) interrupted no user code; nor did one
    # on the way out of another handler's rt_sigreturn: it sees the same
    # place and count.  The loop ends after 5 deliveries that did; more
    # may come before the timer is off, outside the loop.
    "alarm": r"""
        #define _GNU_SOURCE
        #include <signal.h>
        #include <stdio.h>
        #include <sys/time.h>
        #include <ucontext.h>
        #define MAX 256
        static volatile unsigned long rips[MAX], at[MAX], iters;
        static volatile unsigned char after_syscall[MAX];
        static volatile unsigned long last_rip, last_at;
        static volatile int n, interrupts;
        static void on_alarm(int sig, siginfo_t *si, void *uc) {
          (void)sig; (void)si;
          const unsigned char *ip = (const unsigned char *)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
          int sc = ip[-2] == 0x0f && ip[-1] == 0x05;
          if (!sc && !(n && (unsigned long)ip == last_rip && iters == last_at)) interrupts++;
          if (n < MAX) { at[n] = iters; rips[n] = (unsigned long)ip; after_syscall[n] = sc; }
          last_rip = (unsigned long)ip; last_at = iters;
          n++;
        }
        int main(void) {
          struct sigaction sa = {0};
          sa.sa_sigaction = on_alarm;
          sa.sa_flags = SA_SIGINFO | SA_RESTART;
          sigaction(SIGALRM, &sa, 0);
          struct itimerval it = {{0, 2000}, {0, 2000}}, off = {{0, 0}, {0, 0}};
          setitimer(ITIMER_REAL, &it, 0);
          volatile unsigned long s = 0;
          for (unsigned long i = 0; interrupts < 5; i++) { s += i * i; iters++; }
          setitimer(ITIMER_REAL, &off, 0);
          int m = n;
          for (int k = 0; k < m && k < MAX; k++) printf("%lx %lu %d\n", rips[k], at[k], after_syscall[k]);
          return m > MAX;
        }
    """,
}


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    return build_programs(tmp_path_factory.mktemp("eventprogs"), SOURCES)


@pytest.fixture(params=["qemu", "ptrace"])
def engine(request):
    return request.param


def record_one(tmp_path, engine, exe, *config, args=(), status=0):
    """Record ``exe`` in thread mode: (its stdout, the bundle, its stream)."""
    b = tmp_path / "b"
    r = run_hwtrace("record", "--engine", engine, "--mode", "thread", *config, "-o", b, "--",
                    exe, *args)
    assert r.returncode == status, r.stderr
    (s,) = json.loads((b / "manifest.json").read_text())["streams"]
    return r.stdout, b, s


def decode(ptoracle, bundle, s):
    """libipt's instruction flow of stream ``s``: a list of instruction and
    event dicts in order, checked for no errors and exactly
    ``instructions_observed`` instructions."""
    args = run_hwtrace("images", bundle, "--pt", s["file"], "--lines").stdout.split()
    out = subprocess.run([str(ptoracle), "insn", str(bundle / s["file"]), *args],
                         capture_output=True, text=True, check=True).stdout
    items = [json.loads(line) for line in out.splitlines()]
    assert [x for x in items if "error" in x] == []
    assert sum("iclass" in x for x in items) == s["instructions_observed"]
    return items


def test_psb_plus_lands_mid_block(tmp_path, ptoracle, progs, engine):
    """Every PSB+ (PSBFreq 0: every 2 KiB) follows the instruction after
    the branch whose packet crossed the threshold; so when that one is not
    a branch, its FUP is in the middle of a block.  The packets' view
    (``hwtrace dump``: the FUP inside each PSB+) and libipt's (the status
    update before the instruction at that IP) agree."""
    out, b, s = record_one(tmp_path, engine, progs["fib"], "--config", "branch;user;tsc")
    assert out == "6765\n"
    dump = run_hwtrace("dump", b / s["file"]).stdout.splitlines()
    fups, in_psb = [], False
    for line in dump:
        w = line.split()
        if w[1:] == ["psb"]:
            in_psb = True
        elif w[1:] == ["psbend"]:
            in_psb = False
        elif in_psb and w[1] == "fup":
            fups.append(int(w[-1], 16))
    assert len(fups) > 20
    items = decode(ptoracle, b, s)
    insns = [x for x in items if "iclass" in x]
    where = {}          # index in items -> index of the next instruction
    k = 0
    for i, x in enumerate(items):
        if "iclass" in x:
            k += 1
        where[i] = k
    psbs = [(x["ip"], where[i]) for i, x in enumerate(items)
            if x.get("event") == "exec_mode" and x.get("status_update") and "ip" in x]
    assert [ip for ip, _ in psbs] == fups
    mid = 0
    for ip, k in psbs:
        assert insns[k]["ip"] == ip
        before, crossing = insns[k - 1], insns[k - 2]
        assert crossing["iclass"] != "other", (hex(ip), crossing)
        if before["iclass"] == "other":
            assert before["ip"] + before["size"] == ip      # falls through: mid-block
            mid += 1
    assert mid > len(psbs) // 4, (mid, len(psbs))


def _disassemble(exe, func):
    """[(link-time address, mnemonic, operands)] of ``func`` (objdump)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-w", str(exe)],
                         capture_output=True, text=True, check=True).stdout
    insns, inside = [], False
    for line in out.splitlines():
        if line.endswith(">:"):
            inside = line.endswith(f"<{func}>:")
        elif inside and re.match(r"^\s+[0-9a-f]+:\t", line):
            addr, _, text = line.partition(":\t")
            mn, _, ops = text.partition(" ")
            insns.append((int(addr, 16), mn, ops.strip()))
    return insns


def _async_fups(items):
    return [x["at"] for x in items if x.get("event") == "async_disabled"]


def test_faults_in_the_middle_of_a_block(tmp_path, ptoracle, progs, engine):
    """A divide error and a bad load, each after other instructions of its
    block, with a handler that siglongjmps out: FUP + TIP.PGD at exactly
    the instruction the handler's ucontext names, which did not retire
    there, right after the instruction before it in the same block."""
    out, b, s = record_one(tmp_path, engine, progs["faults"])
    rips = [int(x, 16) for x in out.split()]
    items = decode(ptoracle, b, s)
    assert _async_fups(items) == rips
    for rip in rips:
        i = next(i for i, x in enumerate(items) if x.get("at") == rip)
        before = next(x for x in reversed(items[:i]) if "iclass" in x)
        after = next(x for x in items[i:] if "iclass" in x)
        assert before["iclass"] == "other" and before["ip"] + before["size"] == rip
        assert after["ip"] != rip           # the handler runs, not the faulting instruction


def test_signal_interrupts_a_tight_loop(tmp_path, ptoracle, progs, engine):
    """SIGALRM into a loop: FUP + TIP.PGD at each place the handler's
    ucontext says it interrupted, in order (QEMU delivers signals between
    its blocks, so there those are block starts; the stepper anywhere).
    Every delivery counts, the ones after the loop too: the handler used to
    record only the first 5, and a slow (loaded) run took a 6th on the way
    to setitimer (at its PLT entry), traced but not in the list."""
    out, b, s = record_one(tmp_path, engine, progs["alarm"])
    seen = [tuple(int(w, 16 if i == 0 else 10) for i, w in enumerate(line.split()))
            for line in out.splitlines()]
    assert len(seen) >= 5
    # a delivery at a syscall's return, or at another handler's
    # rt_sigreturn, interrupted no user code
    want = [rip for k, (rip, it, sc) in enumerate(seen)
            if not sc and (k == 0 or seen[k - 1][:2] != (rip, it))]
    assert len(want) >= 5
    items = decode(ptoracle, b, s)
    assert _async_fups(items) == want
    loop = {x["ip"] for x in items if "iclass" in x}
    assert all(rip in loop for rip in want)


@pytest.mark.parametrize("case,sig", [("load", 11), ("divide", 8)])
def test_fatal_fault_ends_the_trace_at_it(tmp_path, ptoracle, progs, engine, case, sig):
    """A fault nothing handles ends the program: the trace ends with FUP +
    TIP.PGD at the faulting instruction, after everything before it
    retired -- the jcc whose target it is ("load"; QEMU logs that block
    as started with nothing retired, the stepper logs the signal), or the
    instruction before it in its block ("divide")."""
    from test_record import load_base
    exe = progs["fatal"]
    out, b, s = record_one(tmp_path, engine, exe, args=(case,), status=128 + sig)
    items = decode(ptoracle, b, s)
    base = load_base(b, exe)
    code = _disassemble(exe, "get" if case == "load" else "divide")
    if case == "load":      # jg to the load: the last jg's target
        jg = [(a, ops) for a, mn, ops in code if mn == "jg"][-1]
        before, fault = base + jg[0], base + int(jg[1].split()[0], 16)
    else:
        k = next(i for i, (_, mn, _o) in enumerate(code) if mn == "idiv")
        before, fault = base + code[k - 1][0], base + code[k][0]
    insns = [x for x in items if "iclass" in x]
    assert insns[-1]["ip"] == before and fault not in [x["ip"] for x in insns]
    assert _async_fups(items)[-1] == fault
    assert items[-1] == next(x for x in reversed(items) if x.get("event") == "async_disabled")

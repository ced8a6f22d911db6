"""Live branch tracing on real programs (issue 17.5): a window follows a
process forked inside it; calls into shared libraries the program loaded
while it ran natively are symbolized; a trigger on a shared-library
function works at launch; attaching reads only the symbol tables it needs;
live and decoded records agree across signal handlers; ``hwtrace info``
says what the debug hardware does here."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import run_hwtrace

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ptrace is Linux x86-64")

PROGS = {
    # work() forks; parent and child both go on inside it
    "forkwin": (["-O0", "-static", "-no-pie"], r"""
        #include <stdio.h>
        #include <unistd.h>
        #include <sys/wait.h>
        __attribute__((noinline)) long leaf(long x) { return x + 1; }
        __attribute__((noinline)) long work(void) {
          fflush(stdout);
          pid_t p = fork();
          long r = leaf(p == 0 ? 10 : 20);
          if (p == 0) { r += leaf(1); _exit((int)r); }
          int st; waitpid(p, &st, 0);
          return r + WEXITSTATUS(st);
        }
        int main(void) { long r = work(); printf("%ld\n", r); return 0; }
    """),
    # work() calls into libc, which the loader mapped before main
    "libcalls": (["-O0"], r"""
        #include <stdio.h>
        #include <stdlib.h>
        #include <string.h>
        static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
        __attribute__((noinline)) int work(int n) {
          int v[8] = {5, 3, 7, 1, 8, 2, 6, 4};
          qsort(v, 8, sizeof v[0], cmp);
          char buf[64]; snprintf(buf, sizeof buf, "%d %d", v[0], n);
          return (int)strlen(buf);
        }
        int main(void) { int r = work(3); printf("%d\n", r); return 0; }
    """),
    # qsort (libc) three times; the comparator counts its calls
    "qsorts": (["-O0"], r"""
        #include <stdio.h>
        #include <stdlib.h>
        static int calls;
        __attribute__((noinline)) int cmp(const void *a, const void *b) { calls++; return *(const int *)a - *(const int *)b; }
        int main(void) { int v[6] = {5, 3, 7, 1, 8, 2};
          for (int k = 0; k < 3; k++) { v[k] = 9 - k; qsort(v, 6, sizeof v[0], cmp); }
          printf("%d\n", calls); return 0; }
    """),
    "loop": (["-O0"], r"""
        #include <stdio.h>
        #include <unistd.h>
        __attribute__((noinline)) int tick(int i) { return i * 3 + 1; }
        int main(void) { volatile int s = 0; puts("ready"); fflush(stdout);
          for (int i = 0; ; i++) { s += tick(i); usleep(5000); } }
    """),
    # timer signals land anywhere in work(): its own code, its calls, the
    # nanosleep syscall; the handler calls and makes syscalls itself.  The
    # period must leave work() steps between signals when it is single-
    # stepped: a SIGALRM pending at the handler's sigreturn is delivered at
    # once, so with a period shorter than the handler's path (~25 steps)
    # work() starves -- 700 us was 13 steps at a slow VM's 18 k steps/s, and
    # the live run took 411 s (150 us here at 50 k steps/s: no end in 60 s)
    "timer": (["-O0", "-static", "-no-pie"], r"""
        #include <signal.h>
        #include <stdio.h>
        #include <unistd.h>
        #include <sys/time.h>
        static volatile int hits;
        __attribute__((noinline)) int leaf(int x) { return x + 1; }
        __attribute__((noinline)) void handler(int s) { hits = leaf(hits); if (hits == 2) getpid(); }
        __attribute__((noinline)) int work(void) {
          struct itimerval it = {{0, 5000}, {0, 5000}}; setitimer(ITIMER_REAL, &it, 0);
          int n = 0;
          do { for (int i = 0; i < 300; i++) n = leaf(n); usleep(300); } while (hits < 6);
          struct itimerval off = {{0, 0}, {0, 0}}; setitimer(ITIMER_REAL, &off, 0);
          return n > 0;
        }
        int main(void) { struct sigaction sa = {0}; sa.sa_handler = handler; sa.sa_flags = SA_RESTART;
          sigaction(SIGALRM, &sa, 0); int r = work(); printf("%d\n", r); return 0; }
    """),
    # SIGUSR2 raised in SIGUSR1's handler, blocked there: delivered at that
    # handler's sigreturn -- a handler entered where another one returns
    "chained": (["-O0", "-static", "-no-pie"], r"""
        #include <signal.h>
        #include <stdio.h>
        static volatile int a, b;
        __attribute__((noinline)) int leaf(int x) { return x + 1; }
        __attribute__((noinline)) void h2(int s) { b = leaf(b); }
        __attribute__((noinline)) void h1(int s) { a = leaf(a); raise(SIGUSR2); a = leaf(a); }
        __attribute__((noinline)) int work(void) { int n = leaf(0); raise(SIGUSR1); n = leaf(n); return n; }
        int main(void) {
          struct sigaction s1 = {0}, s2 = {0};
          s1.sa_handler = h1; sigemptyset(&s1.sa_mask); sigaddset(&s1.sa_mask, SIGUSR2);
          s2.sa_handler = h2;
          sigaction(SIGUSR1, &s1, 0); sigaction(SIGUSR2, &s2, 0);
          int r = work(); printf("%d %d %d\n", r, a, b); return 0; }
    """),
}


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    d = tmp_path_factory.mktemp("follow")
    for name, (flags, src) in PROGS.items():
        (d / f"{name}.c").write_text(textwrap.dedent(src))
        subprocess.run(["gcc", *flags, "-g", "-o", str(d / name), str(d / f"{name}.c")],
                       check=True, capture_output=True)
    from hwtrace.engines.emulated import stepper
    stepper.stepper_path()
    return d


def nm(exe) -> dict:
    """Every symbol name -> address (aliases included)."""
    out = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    return {p[2]: int(p[0], 16) for p in (x.split() for x in out.splitlines()) if len(p) == 3}


def live(*args, lines=1):
    r = run_hwtrace("branches", "--format", "jsonl", *args)
    out = r.stdout.splitlines()
    return r, out[:lines], [json.loads(x) for x in out[lines:]]


def test_within_follows_a_fork(progs):
    """fork() inside the window: the child goes on in it (depth as the
    parent's was), until it exits inside work()."""
    r, printed, recs = live("--kinds", "call,return,syscall,sysret", "--within", "work",
                            "--", progs / "forkwin")
    assert r.returncode == 0 and printed == ["34"], r.stderr
    parent = recs[0]["pid"]
    (child,) = {o["pid"] for o in recs} - {parent}
    at = nm(progs / "forkwin")
    mine = lambda pid: [(o["kind"], o["to"] if o["kind"] == "call" else None)
                        for o in recs if o["pid"] == pid and o["depth"] == 0
                        and (o.get("from_sym") or "").startswith("work")]
    assert mine(parent) == [("call", at["fflush"]), ("call", at["fork"]), ("call", at["leaf"]),
                            ("call", at["waitpid"]), ("return", None)]
    assert mine(child) == [("call", at["leaf"]), ("call", at["leaf"]), ("call", at["_exit"])]
    first = next(o for o in recs if o["pid"] == child)
    # its first record is the kernel's return from fork, as deep as the parent's syscall
    fork_sys = next(o for o in recs if o["pid"] == parent and o["kind"] == "syscall"
                    and o["depth"] > 0)
    assert (first["kind"], first["depth"]) == ("sysret", fork_sys["depth"])
    assert first["to"] == fork_sys["from"] + 2
    last = [o for o in recs if o["pid"] == child][-1]
    assert (last["kind"], last["depth"]) == ("syscall", 1)       # _exit's, inside work


def test_libc_calls_symbolized(progs):
    """Every end of a record in a library the loader mapped before main
    (outside any window) is named: by its symbol, or, where the library has
    no symbol, by the library's file and the link-time address."""
    from hwtrace.analysis.symbols import Image
    r, printed, recs = live("--kinds", "call,return", "--within", "work", "--",
                            progs / "libcalls")
    assert r.returncode == 0 and printed == ["3"], r.stderr
    names = {o.get("to_sym") for o in recs}
    assert {"qsort", "strlen"} <= {n.split("@")[0] for n in names if n} or \
        any(n and n.startswith("__qsort_r") for n in names)
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(libc):
        pytest.skip("no /usr/lib/x86_64-linux-gnu/libc.so.6")
    img = Image(libc)
    # libc's load bias, from the calls into functions it names (the most
    # common one: ld.so's lazy binding calls its own strcmp, a libc name)
    biases = collections.Counter(
        o["to"] - img.address_of(o["to_sym"]) for o in recs
        if o["kind"] == "call" and o.get("to_sym")
        and img.address_of(o["to_sym"]) is not None
        and not o["to_sym"].endswith("@plt"))
    img.bias = biases.most_common(1)[0][0]
    img.low, img.high = img.low + img.bias, img.high + img.bias
    ends = {(a, s) for o in recs
            for a, s in ((o["from"], o.get("from_sym")), (o["to"], o.get("to_sym")))
            if a is not None}
    # code no symbol covers is named FILE+0xLINK (its link-time address,
    # as nm and addr2line take it), like every view names it
    unnamed = {a: s for a, s in ends if s and s.startswith("libc.so.6+0x")}
    assert unnamed, "libc has functions without a symbol: some end is named by offset"
    for a, s in unnamed.items():
        assert img.contains(a) and img.lookup(a) is None, hex(a)
        assert int(s.split("+", 1)[1], 16) == a - img.bias, (hex(a), s)
    # an end with no name at all is in no mapped file, so never in libc
    assert not [a for a, s in ends if s is None and img.contains(a)]
    named_in_libc = [o for o in recs if o["to"] is not None and img.contains(o["to"])
                     and o.get("to_sym") and "+0x" not in o["to_sym"]]
    assert len(named_in_libc) > len(unnamed)


def test_library_trigger_at_launch(progs):
    """--within qsort (libc) of a program about to be launched: armed once
    libc is mapped; three windows, each with every comparator call."""
    r, printed, recs = live("--kinds", "call,return", "--within", "qsort", "--",
                            progs / "qsorts")
    assert r.returncode == 0, r.stderr
    calls = int(printed[0])
    assert calls > 0
    assert sum(1 for o in recs if o["kind"] == "return" and o["from_sym"].startswith("cmp")) == calls
    outer = [o for o in recs if o["kind"] == "return" and o["depth"] == 0]
    assert len(outer) == 3 and all(o["to_sym"].startswith("main") for o in outer)


def test_attach_reads_only_what_it_needs(progs):
    """Attaching: the trigger resolves from the process's own mappings (not
    from what the stepper logged), and only the executable's symbol table is
    read -- not the libraries' (the loop never enters them in a window)."""
    from hwtrace.branches import MaskSpec, TriggerSpec, parse_kinds
    from hwtrace.branches.live import trace_live
    proc = subprocess.Popen([str(progs / "loop")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        for _ in range(3):        # short attaches, each with its records
            r = run_hwtrace("branches", "--kinds", "return", "--within", "tick", "--format",
                            "jsonl", "--duration", "0.1", "--attach", proc.pid)
            assert r.returncode == 0, r.stderr
            recs = [json.loads(x) for x in r.stdout.splitlines()]
            assert {o["from_sym"].split("+")[0] for o in recs} <= {"tick"}
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            run = trace_live(proc.pid, d, TriggerSpec(within="tick"),
                             MaskSpec(parse_kinds("call,return")), timeout=2.0)
            recs = list(run.records())
            assert recs and {run.symbolizer.describe(o.from_).split("+")[0]
                             for o in recs} == {"tick"}
            read = [p for p, img in run.cache._base.items() if img is not None]
            assert read == [os.path.realpath(progs / "loop")]
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_signal_handlers_live_and_decoded_agree(progs, tmp_path):
    """One execution with timer signals inside the window (anywhere: work's
    code, its calls, a nanosleep), its stepper log read by the live source
    and its PT stream (generated from that log) by the decoded source: the
    same records, depths included; the window closes only when work
    returns.  And a live windowed run: every handler one level deeper than
    what it interrupted, back to the interrupted depth after sigreturn."""
    from hwtrace.branches import MaskSpec, TriggerSpec, parse_kinds
    from hwtrace.branches.decoded import decoded_records
    from hwtrace.branches.live import records_from_log, symbolizer_from_log
    from hwtrace.branches.tracker import Tracker
    from hwtrace.engines.emulated import flow, ptgen, stepper
    exe = str(progs / "timer")
    log = tmp_path / "x.xlog"
    assert stepper.run([exe], log, stepper.Options()) == 0
    data = log.read_bytes()
    sym = symbolizer_from_log(data)
    trig = TriggerSpec(within="work")
    mask = MaskSpec(parse_kinds("call,return,syscall,sysret,interrupt,iret"))
    lv = list(records_from_log(data, [], Tracker(trig.bind(sym, 0), mask.bind(sym, 0))))
    trace = flow.load(data)
    (res,) = flow.generate(trace, ptgen.TraceConfig(ctl=(1 << 13) | (1 << 3) | (1 << 10)),
                           mode="thread")
    pt = tmp_path / "t.pt"
    pt.write_bytes(bytes(res.tracer.buf))
    dec = list(decoded_records(pt, trig, mask, [exe]).records())
    key = lambda r: (r.kind, r.from_, r.to, r.depth)
    assert [key(r) for r in lv] == [key(r) for r in dec]
    handlers = [r for r in lv if r.kind == "iret" and sym.describe(r.to) == "handler"]
    assert len(handlers) >= 6
    assert (lv[-1].kind, lv[-1].depth, sym.describe(lv[-1].to).split("+")[0]) == \
        ("return", 0, "main")
    # live, windowed
    r, printed, recs = live("--kinds", "call,return,syscall,sysret,interrupt,iret",
                            "--within", "work", "--", exe)
    assert r.returncode == 0 and printed == ["1"], r.stderr
    check_handlers(recs)


def check_handlers(recs, handlers=("handler",)):
    """Each handler entry (iret to handler) is one deeper than the code it
    interrupted; its sigreturn's iret resumes at that depth (a handler
    entered at another's sigreturn takes its place); only the last record
    leaves work at depth 0."""
    stack = []
    sigreturn = lambda o: o["kind"] == "syscall" and (o.get("from_sym") or "").startswith("__restore_rt")
    for i, o in enumerate(recs):
        if o["kind"] == "iret" and (o.get("to_sym") or "") in handlers:
            before = recs[i - 1]
            if sigreturn(before):
                # delivered at the previous handler's sigreturn: it returns
                # where that one would have
                assert stack and o["depth"] == stack[-1] + 1, (i, o)
                continue
            stack.append(before["depth"])
            assert o["depth"] == before["depth"] + 1, (i, o)
        elif o["kind"] == "syscall" and (o.get("from_sym") or "").startswith("__restore_rt"):
            assert o["depth"] == stack[-1], (i, o)
        elif o["kind"] == "iret" and stack and recs[i - 1]["kind"] == "syscall" and \
                (recs[i - 1].get("from_sym") or "").startswith("__restore_rt"):
            assert o["depth"] == stack.pop(), (i, o)
    assert len(stack) == 0
    assert [o for o in recs if o["kind"] == "return" and o["depth"] == 0][-1:] == recs[-1:]
    assert recs[-1]["to_sym"].startswith("main")


def test_info_says_what_debug_hardware_does(tmp_path):
    from hwtrace.engines.emulated import stepper
    r = run_hwtrace("info", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["debug_hardware"]
    log = tmp_path / "t.xlog"
    assert stepper.run(["/bin/true"], log, stepper.Options()) == 0
    seen = stepper.info(log)["block_step"]          # what a real run found
    assert d["block_step"] == seen
    assert d["debug_registers"] == "work"           # the stepper's windows use them
    text = run_hwtrace("info").stdout
    if seen == "ignored":
        assert "BTF block-stepping   does not work here" in text
    else:
        assert "BTF block-stepping   works" in text
    assert "debug registers      work" in text


@pytest.mark.parametrize("engine", ["ptrace", "qemu"])
def test_handler_entered_at_a_sigreturn(progs, tmp_path, engine):
    """The second handler runs at the first one's sigreturn: it is one
    level deeper than work's raise, returns there, and work's window closes
    when work returns -- live, and decoded from a recording."""
    import shutil
    if engine == "qemu" and shutil.which("qemu-x86_64") is None:
        pytest.skip("needs qemu-user")
    args = ("--kinds", "call,return,syscall,sysret,interrupt,iret", "--within", "work")
    r, printed, lrecs = live(*args, "--", progs / "chained")
    assert r.returncode == 0 and printed == ["2 2 1"], r.stderr
    b = tmp_path / "b"
    rec = run_hwtrace("record", "--engine", engine, "--mode", "thread", "-o", b, "--",
                      progs / "chained")
    assert rec.returncode == 0, rec.stderr
    d = run_hwtrace("branches", *args, "--format", "jsonl", b)
    assert d.returncode == 0, d.stderr
    drecs = [json.loads(x) for x in d.stdout.splitlines()]
    key = lambda o: (o["kind"], o["from"], o["to"], o["depth"])
    assert [key(o) for o in lrecs] == [key(o) for o in drecs]
    check_handlers(lrecs, ("h1", "h2"))
    entries = [o for o in lrecs if o["kind"] == "iret" and (o.get("to_sym") or "")[:1] == "h"]
    assert [o["to_sym"] for o in entries] == ["h1", "h2"]
    assert entries[0]["depth"] == entries[1]["depth"]

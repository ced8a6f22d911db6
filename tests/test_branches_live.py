"""hwtrace branches on real programs: the ptrace stepper live, a decoded
emulated recording of the same program, and the errors a user can meet.

The test program is a recursive fib(n) built static and non-PIE (plus a
PIE build for the load bias); expected addresses come from objdump's
disassembly and the symbol table, expected records from simulating the
recursion.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import _need, run_hwtrace

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ptrace is Linux x86-64")

FIB_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long fib(long n)
{
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10;
    long r = fib(n);
    printf("fib(%ld) = %ld\n", n, r);
    return (int)(r & 0x3f);
}
"""
N = 7          # fib(7) = 13: 41 activations


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def activations(n):
    return 1 if n < 2 else 1 + activations(n - 1) + activations(n - 2)


def _tool(name):
    p = shutil.which(name)
    if p is None:
        _need(name, f"the test programs are built and inspected with {name}")
    return p


def disasm(exe: Path, func: str) -> list[tuple[int, int, str]]:
    """(address, size, text) of each instruction of func, per objdump."""
    out = subprocess.run([_tool("objdump"), "-d", "--no-show-raw-insn", "-w",
                          f"--disassemble={func}", str(exe)],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)$", line)
        if m:
            rows.append([int(m.group(1), 16), 0, m.group(2).strip()])
    for a, b in zip(rows, rows[1:]):
        a[1] = b[0] - a[0]
    return [tuple(r) for r in rows]


def symbol(exe: Path, name: str) -> int:
    out = subprocess.run([_tool("nm"), str(exe)], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise KeyError(name)


class Prog:
    def __init__(self, exe: Path):
        self.exe = exe
        self.fib = symbol(exe, "fib")
        f = disasm(exe, "fib")
        calls = [(a, s) for a, s, t in f if t.startswith("call") and t.endswith("<fib>")]
        rets = [a for a, s, t in f if t.startswith("ret")]
        assert len(calls) == 2 and len(rets) == 1, f    # -O0: one ret, two self calls
        (self.c1, s1), (self.c2, s2) = sorted(calls)      # fib(n-1) first
        self.after1, self.after2 = self.c1 + s1, self.c2 + s2
        self.ret = rets[0]
        m = disasm(exe, "main")
        mc = [(a, s) for a, s, t in m if t.startswith("call") and t.endswith("<fib>")]
        assert len(mc) == 1
        self.main_call, self.main_after = mc[0][0], mc[0][0] + mc[0][1]
        self.main_calls = [a for a, s, t in m if t.startswith("call")]

    def expected(self, n):
        """(kind, from, to, depth) of fib's calls and returns inside the
        outermost activation of fib(n)."""
        out = []

        def act(n, depth, ret_to):
            if n >= 2:
                out.append(("call", self.c1, self.fib, depth))
                act(n - 1, depth + 1, self.after1)
                out.append(("call", self.c2, self.fib, depth))
                act(n - 2, depth + 1, self.after2)
            out.append(("return", self.ret, ret_to, depth))
        act(n, 0, self.main_after)
        return out


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    gcc = _tool("gcc")
    tmp = tmp_path_factory.mktemp("branches")
    (tmp / "fib.c").write_text(FIB_C)
    for name, flags in (("fib", ["-static", "-no-pie"]), ("fib_pie", ["-pie", "-fPIE"])):
        subprocess.run([gcc, "-O0", "-g", *flags, "-o", str(tmp / name), str(tmp / "fib.c")],
                       check=True, capture_output=True)
    from hwtrace.engines.emulated import stepper
    stepper.stepper_path()
    return tmp


def split_output(stdout: str, program_lines: int):
    lines = stdout.splitlines()
    return lines[:program_lines], [json.loads(x) for x in lines[program_lines:]]


def test_within_fib_exact_calls_and_returns(progs):
    p = Prog(progs / "fib")
    r = run_hwtrace("branches", "--kinds", "call,return", "--within", "fib",
                    "--format", "jsonl", "--", progs / "fib", N)
    assert re.fullmatch(r"(hwtrace branches: note: this machine ignores DEBUGCTL\.BTF "
                        r"\(PTRACE_SINGLEBLOCK stops after every instruction\): "
                        r"single-stepped instead \([\d,]+ stops\)\n)?", r.stderr), r.stderr
    # the program's output and exit status, unchanged
    native = subprocess.run([progs / "fib", str(N)], capture_output=True, text=True)
    assert r.returncode == native.returncode == fib(N) & 0x3f
    out, recs = split_output(r.stdout, 1)
    assert out == native.stdout.splitlines() == [f"fib({N}) = {fib(N)}"]
    exp = p.expected(N)
    assert len(exp) == 2 * activations(N) - 1
    assert [(o["kind"], o["from"], o["to"], o["depth"]) for o in recs] == exp
    pid = recs[0]["pid"]
    assert all(o["pid"] == pid and o["tid"] == pid and isinstance(o["time"], int)
               for o in recs)
    # symbols (static non-PIE: no bias)
    assert {o["to_sym"] for o in recs if o["kind"] == "call"} == {"fib"}
    assert recs[-1]["to_sym"] == f"main+{p.main_after - symbol(p.exe, 'main'):#x}"
    assert recs[-1]["from_sym"] == f"fib+{p.ret - p.fib:#x}"


def test_pie_load_bias(progs):
    """A PIE runs at a random base: trigger and symbols follow the bias."""
    p = Prog(progs / "fib_pie")                       # link-time addresses
    r = run_hwtrace("branches", "--kinds", "call,return", "--within", "fib",
                    "--format", "jsonl", "--", progs / "fib_pie", 5)
    assert r.returncode == 5, r.stderr
    _, recs = split_output(r.stdout, 1)
    exp = p.expected(5)
    assert len(recs) == len(exp)
    bias = recs[0]["to"] - p.fib
    assert bias != 0 and bias % 4096 == 0
    assert [(o["kind"], o["from"] - bias, o["to"] - bias, o["depth"]) for o in recs] == exp
    assert recs[0]["to_sym"] == "fib" and recs[0]["from_sym"] == f"fib+{p.c1 - p.fib:#x}"
    # a number is a link-time address for a PIE about to run (objdump's view)
    r2 = run_hwtrace("branches", "--kinds", "call,return", "--within", hex(p.fib),
                     "--format", "jsonl", "--", progs / "fib_pie", 5)
    _, recs2 = split_output(r2.stdout, 1)
    bias2 = recs2[0]["to"] - p.fib
    assert [(o["kind"], o["from"] - bias2, o["to"] - bias2, o["depth"]) for o in recs2] == exp


def test_start_stop_and_range(progs):
    """--start fib --stop (main after the call) is the same window as
    --within fib here; --range main keeps only main's own branches."""
    p = Prog(progs / "fib")
    r = run_hwtrace("branches", "--kinds", "call,return", "--start", "fib",
                    "--stop", hex(p.main_after), "--format", "jsonl", "--",
                    progs / "fib", 5)
    assert r.returncode == 5, r.stderr
    _, recs = split_output(r.stdout, 1)
    assert [(o["kind"], o["from"], o["to"], o["depth"]) for o in recs] == p.expected(5)
    r = run_hwtrace("branches", "--kinds", "call", "--range", "main",
                    "--format", "jsonl", "--", progs / "fib", 3)
    _, recs = split_output(r.stdout, 1)
    assert [o["from"] for o in recs] == p.main_calls      # each call of main, once


@pytest.fixture(scope="module")
def bundle(progs):
    """The emulated engine's recording (ptrace execution source) of fib."""
    out = progs / "bundle"
    r = run_hwtrace("record", "--engine", "ptrace", "--mode", "thread", "-o", out,
                    "--", progs / "fib", N)
    assert r.returncode == fib(N) & 0x3f, r.stderr
    assert (out / "manifest.json").exists()
    return out


@pytest.mark.parametrize("args", [
    ("--kinds", "call,return", "--within", "fib"),
    ("--kinds", "all,cond_not_taken", "--within", "fib"),
    ("--kinds", "call,return,cond", "--start", "fib", "--stop", "printf"),
])
def test_live_and_decoded_agree(progs, bundle, args):
    live = run_hwtrace("branches", *args, "--format", "jsonl", "--", progs / "fib", N)
    assert live.returncode == fib(N) & 0x3f, live.stderr
    _, lrecs = split_output(live.stdout, 1)
    dec = run_hwtrace("branches", *args, "--format", "jsonl", bundle)
    assert dec.returncode == 0, dec.stderr
    drecs = [json.loads(x) for x in dec.stdout.splitlines()]
    key = [(o["kind"], o["from"], o["to"]) for o in lrecs]
    assert key == [(o["kind"], o["from"], o["to"]) for o in drecs]
    assert len(key) >= 2 * activations(N) - 1
    assert [o["depth"] for o in lrecs] == [o["depth"] for o in drecs]
    assert [o.get("to_sym") for o in lrecs] == [o.get("to_sym") for o in drecs]


def test_decoded_python_api(progs, bundle):
    from hwtrace.branches import MaskSpec, TriggerSpec, decoded_records, parse_kinds
    p = Prog(progs / "fib")
    t = decoded_records(bundle, TriggerSpec(within="fib"), MaskSpec(parse_kinds("call,return")))
    recs = list(t.records())
    assert [(r.kind, r.from_, r.to, r.depth) for r in recs] == p.expected(N)
    tid = recs[0].tid
    assert list(decoded_records(bundle, TriggerSpec(within="fib"),
                                MaskSpec(parse_kinds("call,return"),
                                         tids=frozenset({tid + 1}))).records()) == []
    np = pytest.importorskip("numpy")
    from hwtrace.branches import to_array
    a = to_array(decoded_records(bundle, TriggerSpec(within="fib"),
                                 MaskSpec(parse_kinds("call,return"))).records())
    assert a["from"].tolist() == [r.from_ for r in recs] and a.dtype.names[3] == "from"
    assert isinstance(a, np.ndarray)


def test_psb_inside_the_window(progs):
    """A longer recording (fib(18): ~5 KB of trace, a PSB+ every 2 KB) has
    PSB+ headers inside fib; their status-update enables are no trips
    through untraced code: every record is a call, return, jump or taken
    cond, and the calls and returns are exactly fib's."""
    from hwtrace.branches import MaskSpec, TriggerSpec, decoded_records, parse_kinds
    from hwtrace.streams import open_bundle
    p = Prog(progs / "fib")
    b = progs / "fib18"
    r = run_hwtrace("record", "--engine", "ptrace", "--mode", "thread", "-o", b,
                    "--", progs / "fib", 18)
    assert r.returncode == fib(18) & 0x3f, r.stderr
    end = p.fib + sum(s for _a, s, _t in disasm(progs / "fib", "fib"))

    seen = 0
    for st in open_bundle(b).streams:
        for batch in st.batches(view=True):
            for _i, _off, ev in batch.items:
                if getattr(ev, "type", None) == "enabled" and ev.status_update \
                        and p.fib <= ev.ip < end:
                    seen += 1
    assert seen >= 1
    recs = list(decoded_records(b, TriggerSpec(within="fib"),
                                MaskSpec(parse_kinds("all"))).records())
    assert {r.kind for r in recs} == {"call", "return", "jump", "cond"}
    assert None not in {r.to for r in recs}
    assert [(r.kind, r.from_, r.to, r.depth) for r in recs
            if r.kind in ("call", "return")] == p.expected(18)


# ------------------------------------------------------------------ bad input

def test_unknown_symbol(progs, bundle):
    for target in (["--", progs / "fib", 3], [bundle]):
        r = run_hwtrace("branches", "--within", "fibb", *target)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr == "hwtrace: branches: unknown symbol 'fibb' (close matches: fib)\n"
    r = run_hwtrace("branches", "--range", "mian", bundle)
    assert r.returncode == 2 and "unknown symbol 'mian' (close matches: main" in r.stderr
    r = run_hwtrace("branches", "--kinds", "calls", bundle)
    assert r.returncode == 2 and "unknown branch kind 'calls'" in r.stderr


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    pid = p.pid
    while os.path.exists(f"/proc/{pid}"):
        pid += 7919
    return pid


def test_nonexistent_pid():
    pid = _dead_pid()
    r = run_hwtrace("branches", "--attach", pid)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"hwtrace: branches: no process with pid {pid}\n"


def test_pid_already_traced():
    """A process with a tracer cannot get a second one: the error names
    the TracerPid setting."""
    child = subprocess.Popen([sys.executable, "-c",
                              "import ctypes, time\n"
                              "ctypes.CDLL(None).ptrace(0, 0, 0, 0)\n"   # PTRACE_TRACEME
                              "print('ok', flush=True)\n"
                              "time.sleep(60)\n"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ok\n"
        r = run_hwtrace("branches", "--attach", child.pid)
        assert r.returncode == 2
        assert r.stderr == (f"hwtrace: branches: cannot trace pid {child.pid}: already "
                            f"traced by pid {os.getpid()} (TracerPid in /proc/{child.pid}"
                            "/status); a process has one tracer at a time\n")
    finally:
        child.kill()
        child.wait()


DROP_AND_ATTACH = r"""
import os, sys
from hwtrace.cli import build_parser, main
import hwtrace.branches.live, hwtrace.engines.emulated.stepper
build_parser()                       # every module imported while still root
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
sys.exit(main(["branches", "--attach", sys.argv[1]]))
"""


def test_other_users_process():
    """Unprivileged, another user's process: the error names the uid rule
    (CAP_SYS_PTRACE) and the ptrace scope setting."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the tracer as another user")
    victim = subprocess.Popen(["sleep", "60"])
    try:
        r = subprocess.run([sys.executable, "-c", DROP_AND_ATTACH, str(victim.pid)],
                           capture_output=True, text=True, timeout=120, cwd="/")
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith(f"hwtrace: branches: cannot trace pid {victim.pid}: "
                                   "it runs as uid 0, not 65534; tracing another user's "
                                   "process needs CAP_SYS_PTRACE (root) [kernel.yama.ptrace_scope")
    finally:
        victim.kill()
        victim.wait()


def test_attach_live(progs, tmp_path):
    """--attach: a running process's branches within a function, then
    detached (--duration) and still running."""
    src = tmp_path / "loop.c"
    src.write_text(r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) int tick(int i) { return i * 3 + 1; }
int main(void) {
    volatile int s = 0;
    puts("ready"); fflush(stdout);
    for (int i = 0; ; i++) { s += tick(i); usleep(20000); }
}
""")
    exe = tmp_path / "loop"
    subprocess.run([_tool("gcc"), "-O0", "-static", "-no-pie", "-o", str(exe), str(src)],
                   check=True, capture_output=True)
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        r = run_hwtrace("branches", "--kinds", "return", "--within", "tick",
                        "--format", "jsonl", "--duration", "0.5", "--attach", proc.pid)
        assert r.returncode == 0, r.stderr
        recs = [json.loads(x) for x in r.stdout.splitlines()]
        assert recs, "tick ran ~25 times in 0.5 s"
        rets = [a for a, s, t in disasm(exe, "tick") if t.startswith("ret")]
        assert {(o["kind"], o["from"], o["depth"], o["from_sym"]) for o in recs} == \
            {("return", rets[0], 0, f"tick+{rets[0] - symbol(exe, 'tick'):#x}")}
        assert {o["to_sym"].split("+")[0] for o in recs} == {"main"}
        time.sleep(0.1)
        assert proc.poll() is None                        # detached, still running
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_raw_pt_and_flow_items(progs, bundle):
    """The same window from the bundle's raw .pt stream with --elf, and from
    ``hwtrace decode --format jsonl`` flow items with --elf."""
    p = Prog(progs / "fib")
    (pt,) = sorted(bundle.glob("*.pt"))
    items = progs / "items.jsonl"
    d = run_hwtrace("decode", "--pt", pt, "--elf", progs / "fib", "--format", "jsonl")
    assert d.returncode == 0, d.stderr
    items.write_text(d.stdout)
    for src in (pt, items):
        r = run_hwtrace("branches", "--kinds", "call,return", "--within", "fib",
                        "--format", "jsonl", "--elf", progs / "fib", src)
        assert r.returncode == 0, r.stderr
        recs = [json.loads(x) for x in r.stdout.splitlines()]
        assert [(o["kind"], o["from"], o["to"], o["depth"]) for o in recs] == p.expected(N)
        assert recs[0]["pid"] is None and recs[0]["to_sym"] == "fib"
    r = run_hwtrace("branches", "--within", "fib", pt)
    assert r.returncode == 2 and "a raw trace needs its code: --elf FILE[:BIAS]" in r.stderr


def test_text_format(progs, bundle):
    p = Prog(progs / "fib")
    r = run_hwtrace("branches", "--kinds", "call,return", "--within", "fib", bundle)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 * activations(N) - 1
    assert re.fullmatch(rf" *\d+/\d+   0 call +{p.c1:#x} fib\+{p.c1 - p.fib:#x} -> "
                        rf"{p.fib:#x} fib", lines[0]), lines[0]
    assert re.fullmatch(rf" *\d+/\d+   0 return +{p.ret:#x} fib\+{p.ret - p.fib:#x} -> "
                        rf"{p.main_after:#x} main\+0x[0-9a-f]+", lines[-1]), lines[-1]


def test_options_after_the_bundle(progs, bundle):
    a = run_hwtrace("branches", "--kinds", "return", "--within", "fib", bundle)
    b = run_hwtrace("branches", bundle, "--within", "fib", "--kinds", "return")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout
    assert len(a.stdout.splitlines()) == activations(N)
    c = run_hwtrace("branches", bundle, "--within", "fib", "more")
    assert c.returncode == 2 and "one BUNDLE expected" in c.stderr
    d = run_hwtrace("branches", bundle, "--", progs / "fib")
    assert d.returncode == 2 and "one BUNDLE expected" in d.stderr


ALARM_C = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <sys/time.h>
#include <ucontext.h>
static volatile int done;
static const struct itimerval once = {{0, 0}, {0, 20000}};
long spin(void);
void spin_end(void);
/* Only a signal that interrupted spin() past its first instruction ends it.
 * One that the (real-time) timer sends earlier -- before the window opened
 * (a loaded machine, a slow tracer), or right at spin's entry, which neither
 * source counts as inside -- re-arms the timer from outside the window.
 * spin() counts at least once, so the program prints 1 however late the
 * signal that ends it comes. */
__attribute__((noinline)) void handler(int s, siginfo_t *si, void *uc)
{
    unsigned long ip = ((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
    if (ip > (unsigned long)spin && ip < (unsigned long)spin_end)
        done = s;
    else
        setitimer(ITIMER_REAL, &once, 0);
}
__attribute__((noinline)) long spin(void) { long n = 0; do n++; while (!done); return n; }
__attribute__((noinline)) void spin_end(void) {}
int main(void)
{
    struct sigaction sa = {0};
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGALRM, &sa, 0);
    setitimer(ITIMER_REAL, &once, 0);
    printf("%d\n", spin() > 0);
    return 0;
}
"""


def test_async_signal_inside_a_window(progs):
    """A timer signal interrupts spin(): an interrupt record into the
    handler, the handler one level deeper, sigreturn back to where it hit,
    and the window closes only when spin returns -- live and recorded."""
    exe = progs / "alarm"
    (progs / "alarm.c").write_text(ALARM_C)
    subprocess.run([_tool("gcc"), "-O0", "-static", "-no-pie", "-o", str(exe),
                    str(progs / "alarm.c")], check=True, capture_output=True)
    b = progs / "alarm-bundle"
    r = run_hwtrace("record", "--engine", "ptrace", "--mode", "thread", "-o", b, "--", exe)
    assert r.returncode == 0, r.stderr
    args = ("--kinds", "call,return,syscall,sysret,interrupt,iret", "--within", "spin",
            "--format", "jsonl")
    live = run_hwtrace("branches", *args, "--", exe)
    assert live.returncode == 0 and live.stdout.startswith("1\n"), live.stderr
    dec = run_hwtrace("branches", *args, b)
    assert dec.returncode == 0, dec.stderr
    for recs in (split_output(live.stdout, 1)[1],
                 [json.loads(x) for x in dec.stdout.splitlines()]):
        # the kernel is not traced: into it and back are two records each,
        # the unknown end null (and so no symbol)
        sym = lambda o, end: o[end + "_sym"].split("+")[0] if o[end] is not None else None
        assert [(o["kind"], sym(o, "from"), sym(o, "to"), o["depth"])
                for o in recs] == [("interrupt", "spin", None, 0),
                                   ("iret", None, "handler", 1),
                                   ("return", "handler", "__restore_rt", 1),
                                   ("syscall", "__restore_rt", None, 0),
                                   ("iret", None, "spin", 0),
                                   ("return", "spin", "main", 0)]
        assert recs[4]["to"] == recs[0]["from"]       # resumed where it was interrupted


def test_cpu_mode_bundle(progs):
    """A per-CPU recording: the same records, each with the pid and tid of
    the thread the sideband's context switches say ran (issue 17.4), so
    --pid/--tid select them."""
    p = Prog(progs / "fib")
    b = progs / "cpu-bundle"
    r = run_hwtrace("record", "--engine", "ptrace", "--mode", "cpu", "-o", b,
                    "--", progs / "fib", 5)
    assert r.returncode == 5, r.stderr
    args = ("--kinds", "call,return", "--within", "fib", "--format", "jsonl")
    d = run_hwtrace("branches", *args, b)
    assert d.returncode == 0, d.stderr
    recs = [json.loads(x) for x in d.stdout.splitlines()]
    assert [(o["kind"], o["from"], o["to"], o["depth"]) for o in recs] == p.expected(5)
    side = [json.loads(x) for x in (b / "sideband.jsonl").read_text().splitlines()]
    pid = next(x["pid"] for x in side if x["type"] == "process")
    assert {(o["pid"], o["tid"]) for o in recs} == {(pid, pid)}
    for opt in ("--pid", "--tid"):
        sel = run_hwtrace("branches", *args, opt, pid, b)
        assert sel.returncode == 0 and sel.stdout == d.stdout, sel.stderr
        none = run_hwtrace("branches", *args, opt, pid + 1, b)
        assert none.returncode == 0 and none.stdout == "", none.stderr


def test_source_lines(progs, bundle):
    """--lines: file:line from DWARF for both ends (the test program is -g)."""
    lines = FIB_C.split("\n")
    call_line = next(i for i, t in enumerate(lines, 1) if "return fib(n - 1)" in t)
    main_line = next(i for i, t in enumerate(lines, 1) if "long r = fib(n);" in t)
    src = str(progs / "fib.c")
    r = run_hwtrace("branches", "--lines", "--kinds", "call,return", "--within", "fib",
                    "--format", "jsonl", bundle)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert {o["from_line"] for o in recs if o["kind"] == "call"} == {f"{src}:{call_line}"}
    assert {o["to_line"] for o in recs if o["kind"] == "return"} == \
        {f"{src}:{call_line}", f"{src}:{main_line}"}
    assert recs[-1]["to_line"] == f"{src}:{main_line}"
    t = run_hwtrace("branches", "--lines", "--kinds", "return", "--within", "fib", bundle)
    p = Prog(progs / "fib")
    main_off = p.main_after - symbol(progs / "fib", "main")
    assert t.stdout.splitlines()[-1].endswith(f"main+{main_off:#x} ({src}:{main_line})")

"""hwtrace calls: the indented function-call history of a trace."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import FORK_EXEC_C as FORK_EXEC, run_hwtrace
from hwtrace.analysis.records import Activation, Enter, Flag, Marker, StreamInfo
from hwtrace.branches.calls import CallHistory, fmt_duration

# ------------------------------------------------------------------ unit


def test_history_rendering():
    h = CallHistory()
    h.begin_stream(StreamInfo(pid=1, tid=2), "ns")
    h.add(Enter(0x10, "main", 0, 0.0, 0, Flag.BEGIN_UNKNOWN, 2))
    h.add(Enter(0x20, "f", 1, 100.0, 3, Flag.NONE, 2))
    h.add(Activation(0x20, "f", 1, 100.0, 2600.0, 3, 10, 0, 0.0, Flag.NONE, 2))
    h.add(Marker("overflow", 2700.0, 12, 0x40, "packet overflow", 2))
    h.add(Activation(0x10, "main", 0, 0.0, 2_000_000.0, 0, 20, 7, 2500.0,
                     Flag.BEGIN_UNKNOWN | Flag.TRUNCATED, 2))
    lines = list(h.lines())
    assert lines[0] == "thread 2:"
    assert re.fullmatch(r"  main +20 insns +2\.00ms  \[began before the trace, truncated\]",
                        lines[1]), lines[1]
    assert re.fullmatch(r"    f +7 insns +2\.50us", lines[2]), lines[2]
    assert lines[3] == "  -- overflow at insn 12: packet overflow"
    h2 = CallHistory(max_depth=0)
    h2.begin_stream(StreamInfo(tid=5), "insns")
    h2.add(Enter(0x10, "main", 0, 0, 0, Flag.NONE))
    h2.add(Enter(0x20, "f", 1, 1, 1, Flag.NONE))
    h2.add(Activation(0x20, "f", 1, 1, 4, 1, 4, 0, 0, Flag.NONE))
    lines = list(h2.lines())
    assert lines[0] == "thread 5:" and len(lines) == 2
    assert lines[1] == f"{'  main':<48} (open)"
    assert fmt_duration(1500, "ns") == "1.50us" and fmt_duration(12, "insns") == "12 insns"


# ------------------------------------------------------------------ system

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
    long r = fib(argc > 1 ? atol(argv[1]) : 10);
    printf("%ld\n", r);
    return 0;
}
"""
N = 6


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    import shutil
    if sys.platform != "linux" or shutil.which("gcc") is None:
        pytest.skip("needs Linux and gcc")
    tmp = tmp_path_factory.mktemp("calls")
    (tmp / "fib.c").write_text(FIB_C)
    exe = tmp / "fib"
    subprocess.run(["gcc", "-O0", "-static", "-no-pie", "-o", str(exe), str(tmp / "fib.c")],
                   check=True, capture_output=True)
    out = tmp / "bundle"
    r = run_hwtrace("record", "--engine", "ptrace", "--mode", "thread", "-o", out, "--", exe, N)
    assert r.returncode == 0 and (out / "manifest.json").exists(), r.stderr
    return exe, out


def _tree(n, depth, out):
    """Preorder (depth, n) of fib(n)'s activations."""
    out.append((depth, n))
    if n >= 2:
        _tree(n - 1, depth + 1, out)
        _tree(n - 2, depth + 1, out)
    return out


def test_calls_fib_history(rec, tmp_path):
    exe, bundle = rec
    r = run_hwtrace("calls", "--clock", "insns", bundle)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # a thread's section is headed by the thread and its program
    assert re.fullmatch(rf"thread \d+ \({re.escape(os.path.basename(exe))}\):", lines[0]), \
        lines[0]
    rows = []
    for line in lines[1:]:
        if line.startswith("  -- "):
            assert re.fullmatch(r"  -- \w+ at insn [\d,]+: .+", line)
            continue
        m = re.fullmatch(r"( +)(\S+) +([\d,]+) insns(  \[.*\])?", line)
        assert m, line
        rows.append((len(m.group(1)) // 2 - 1, m.group(2), int(m.group(3).replace(",", ""))))
    fibs = [(d, n) for d, name, n in rows if name == "fib"]
    tree = _tree(N, 0, [])
    assert len(fibs) == len(tree)
    d0 = fibs[0][0]
    assert [d - d0 for d, _ in fibs] == [d for d, _ in tree]
    # instruction counts follow the recursion: leaves all alike, inner
    # activations = a constant of their own + their two children
    by_n = {}
    for (_, insns), (_, n) in zip(fibs, tree):
        assert by_n.setdefault(n, insns) == insns
    own = by_n[2] - by_n[1] - by_n[0]
    assert by_n[0] == by_n[1] and own > 0
    for n in range(2, N + 1):
        assert by_n[n] == own + by_n[n - 1] + by_n[n - 2]
    # ... and the outermost one is exactly what the live stepper stepped
    # inside its --within fib window
    from hwtrace.engines.emulated import stepper
    log = tmp_path / "w.xlog"
    sym = int(subprocess.run(["nm", str(exe)], capture_output=True, text=True)
              .stdout.split(" T fib\n")[0].rsplit("\n", 1)[-1], 16)
    assert stepper.run([str(exe), str(N)], log, stepper.Options(within=sym)) == 0
    w = stepper.windows(log)
    assert [x.on for x in w] == [True, False] and w[0].pc == sym
    assert w[1].ninsn - w[0].ninsn == by_n[N]
    # main is the caller, one level up
    i = next(i for i, row in enumerate(rows) if row[1] == "fib")
    caller = next(row for row in reversed(rows[:i]) if row[0] == rows[i][0] - 1)
    assert caller[1] == "main"


def test_calls_max_depth_and_errors(rec):
    _, bundle = rec
    r = run_hwtrace("calls", "--max-depth", "0", bundle)
    assert r.returncode == 0
    body = r.stdout.splitlines()[1:]
    assert body and all(re.match(r"  \S", x) for x in body)
    r = run_hwtrace("calls", "/nonexistent/bundle")
    assert r.returncode == 2 and r.stderr == "hwtrace: /nonexistent/bundle: no such bundle or file\n"
    r = run_hwtrace("calls", "--max-depth", "-1", bundle)
    assert r.returncode == 2 and "must be 0 or more" in r.stderr


def test_history_streams_long_activations_early():
    """A long-lived activation (main) does not hold the history back: once
    past the first 256 K instructions and `hold` lines, what began long ago
    is written early, open, and its totals follow where it ends."""
    import io
    from hwtrace.branches.calls import EARLY
    out = io.StringIO()
    h = CallHistory(out=out, hold=8)
    h.begin_stream(StreamInfo(pid=1, tid=1), "insns")
    h.add(Enter(0x10, "main", 0, 0, 0, Flag.NONE))
    at = EARLY
    for k in range(40):
        h.add(Enter(0x20, "f", 1, at, at, Flag.NONE))
        h.add(Activation(0x20, "f", 1, at, at + 5, at, at + 5, 0, 0, Flag.NONE))
        at += 5
    h._end_stream() if False else h.add_slices(h._legacy.take(), h._legacy)
    early = out.getvalue().splitlines()
    assert early[0] == "thread 1:"
    assert early[1] == f"{'  main':<48} (open: totals where it ends)"
    assert all(re.fullmatch(r"    f +5 insns", ln) for ln in early[2:])
    assert 2 < len(early) < 42                  # not all of it yet
    h.add(Activation(0x10, "main", 0, 0, at + 3, 0, at + 3, 200, 200, Flag.TRUNCATED))
    h.close()
    rest = out.getvalue().splitlines()[len(early):]
    assert all(re.fullmatch(r"    f +5 insns", ln) for ln in rest[:-1])
    assert len(early) + len(rest) == 1 + 1 + 40 + 1
    assert re.fullmatch(rf"  end of main +{at + 3:,} insns  \[truncated\]", rest[-1]), rest[-1]




def test_calls_and_exports_name_each_process_by_its_programs(tmp_path):
    """A cpu-mode recording of a program whose child execs another: where
    a CPU's stream changes thread, calls names the thread and what its
    process ran (``tid T (parent -> child)``: the fork's child runs the
    parent's code until its exec); the Chrome and Perfetto exports name
    the processes' tracks the same way.  The compiled formatter and the
    twin write the same lines."""
    import json
    from conftest import build_programs
    progs = build_programs(tmp_path, {"parent": FORK_EXEC,
                                      "child": "int main(){return 0;}"})
    b = tmp_path / "b"
    r = run_hwtrace("record", "--mode", "cpu", "-o", b, "--", progs["parent"], progs["child"])
    assert r.returncode == 0, r.stderr
    d = json.loads(run_hwtrace("info", b, "--json", check=True).stdout)
    kid = next(p["pid"] for p in d["processes"] if p["exe"][-1] == str(progs["child"]))
    top = next(p["pid"] for p in d["processes"] if p["pid"] != kid)
    outs = []
    for env in ({}, {"HWTRACE_NO_EXTENSIONS": "1"}):
        for clock in ("insns", "tsc"):
            r = run_hwtrace("calls", "--clock", clock, b, env=env)
            assert r.returncode == 0, r.stderr
            text = r.stdout
            if clock == "insns":    # (no times: each CPU's stream on its own)
                assert f"tid {kid} (parent -> child)]" in text, text[:2000]
                assert f"tid {top} (parent)]" in text
                assert not re.search(r"tid \d+\]", text)
            else:                   # the streams in time order: by thread
                heads = [x for x in text.splitlines() if not x.startswith(" ")]
                assert heads == [f"thread {top} (parent):",
                                 f"thread {kid} (parent -> child):"], heads
                assert "[tid " not in text
            outs.append(text)
    assert outs[0] == outs[2] and outs[1] == outs[3]
    cj, pf = tmp_path / "t.json", tmp_path / "t.pftrace"
    r = run_hwtrace("export", b, "--chrome", cj, "--perfetto", pf)
    assert r.returncode == 0, r.stderr
    ev = json.loads(cj.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    assert names == {top: "parent", kid: "parent -> child"}
    raw = pf.read_bytes()
    assert b"parent -> child" in raw and b"process %d" % kid not in raw
    # summary: each process's share, by the program it ran last
    r = run_hwtrace("summary", b)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("processes: "))
    shares = dict(re.findall(r"(\w+ \d+) ([\d.]+)%", line))
    assert set(shares) == {f"parent {top}", f"child {kid}"}
    assert abs(sum(map(float, shares.values())) - 100) < 0.2


EXEC_ONLY = r"""
#include <unistd.h>
int main(int argc, char **argv) {
    execl(argv[1], argv[1], (char *)0);
    return 127;
}
"""


@pytest.mark.parametrize("mode", ["thread", "cpu"])
def test_an_exec_ends_the_old_program_and_begins_the_new_one(tmp_path, mode):
    """A process that execs: its old program's frames never return (they
    end ``[unwound]`` at the exec), and the new program's ``_start`` is a
    beginning at depth 0, not "began before the trace" -- in a thread's
    stream, and in a CPU's (a fork's child that execs, coming back to the
    CPU in its new program)."""
    from conftest import build_programs
    progs = build_programs(tmp_path, {"first": EXEC_ONLY if mode == "thread" else FORK_EXEC,
                                      "second": "int main(){return 0;}"})
    b = tmp_path / "b"
    # on one host CPU: a process that moves to another CPU begins afresh
    # in that CPU's stream (the views' known limit; not what this tests)
    r = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "hwtrace", "record",
                        "--mode", mode, "-o", str(b), "--", progs["first"], progs["second"]],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for env in ({}, {"HWTRACE_NO_EXTENSIONS": "1"}):
        r = run_hwtrace("calls", "--max-depth", "0", b, env=env)
        assert r.returncode == 0, r.stderr
        top = [x for x in r.stdout.splitlines() if x.startswith("  _start ")]
        # (cpu mode: the parent's _start too, switched out and back)
        news = [x for x in top if "began before" not in x and "goes on after" not in x]
        assert len(news) >= 2, r.stdout
        if mode == "thread":
            # ld.so's _start, the first program's (tail-called), ended at
            # the exec; then the second's two, from depth 0
            i = next(k for k, x in enumerate(top) if "unwound]" in x)
            assert len(top) == i + 3 and "began before" not in top[i + 1], top
        else:
            # the fork's child: its first program's frames, then (switched
            # out in its exec or not) the new program's _start
            lines, mine, child = r.stdout.splitlines(), [], False
            for x in lines:         # the child's lines (a note names each new
                # thread where a CPU's stream changes thread; a thread's
                # section is headed by it)
                m = re.search(r"tid \d+ \(([^)]*)\)\]", x) or \
                    re.fullmatch(r"thread \d+ \(([^)]*)\):", x)
                if m:
                    child = m.group(1) == "first -> second"
                if child:
                    mine.append(x)
            start = [x for x in mine if x.startswith("  _start ")]
            assert start and "began before" not in start[0] and \
                "goes on after" not in start[0], lines

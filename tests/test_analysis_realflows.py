"""Call stacks of real programs with non-local control flow, from flows
taken by gdb single-stepping static binaries (glibc's real setjmp/longjmp
code, not a model of it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter

from conftest import BUILD, _need

from hwtrace.analysis import Activation, Flag, reconstruct
from hwtrace.analysis.symbols import Symbolizer

from test_export_formats import GDB_STEP, iclass_of

LONGJMP_C = r"""
#include <setjmp.h>
static jmp_buf env;
__attribute__((noinline)) void deep(int n)
{
    if (n == 0)
        longjmp(env, 1);
    deep(n - 1);
}
__attribute__((noinline)) int guard(void)
{
    if (setjmp(env) == 0) {
        deep(5);
        return 0;
    }
    return 1;
}
int main(void)
{
    return guard() + guard();
}
"""


def build(name: str, source: str, compiler="gcc", ext="c", cflags=("-static",)):
    if not (shutil.which("gdb") and shutil.which(compiler)):
        _need(f"gdb and {compiler}", "needed to take a real program's flow")
    d = BUILD / "test-realflows" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / f"prog.{ext}").write_text(source)
    exe = d / "prog"
    r = subprocess.run([compiler, "-g", "-O0", *cflags, "-o", exe, d / f"prog.{ext}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        _need("static libc", r.stderr.strip().splitlines()[-1] if r.stderr else "build failed")
    return exe


def stepped_flow(name: str, source: str, start: str | None = None, **kw):
    """Single-step main (from ``start``, an address, if given) to its return."""
    exe = build(name, source, **kw)
    d = exe.parent
    (d / "step.py").write_text(GDB_STEP)
    flow = d / "flow.jsonl"
    env = dict(os.environ, FLOW_OUT=str(flow))
    if start:
        env["FLOW_START"] = start
    subprocess.run(["gdb", "-q", "-nx", "-batch", "-x", d / "step.py", exe],
                   check=True, capture_output=True, timeout=600, env=env)
    items = []
    for line in flow.read_text().splitlines()[1:]:
        pc, size, asm = json.loads(line)
        items.append({"ip": pc, "size": size, "iclass": iclass_of(asm)})
    sym = Symbolizer()
    sym.add_image(exe)
    return items, sym


def test_longjmp_unwinds_the_recursion():
    items, sym = stepped_flow("longjmp", LONGJMP_C)
    acts = [r for r in reconstruct(items, lookup=sym.lookup) if type(r) is Activation]
    deep = [a for a in acts if a.name == "deep"]
    guard = [a for a in acts if a.name == "guard"]
    main = [a for a in acts if a.name == "main"]
    # guard -> deep(5) -> ... -> deep(0) -> longjmp, twice
    assert len(deep) == 12
    assert all(a.flags == Flag.UNWOUND for a in deep)
    assert sorted(Counter(a.depth for a in deep).items()) == [(d, 2) for d in range(2, 8)]
    assert [(a.depth, a.flags) for a in guard] == [(1, Flag.NONE)] * 2
    assert [(a.depth, a.flags, a.insns) for a in main] == [(0, Flag.NONE, len(items))]
    # the unwound frames end where longjmp jumped back into guard: the
    # instructions after it are guard's own, not longjmp's
    g = guard[0]
    inner = [a for a in acts if g.begin_idx <= a.begin_idx and a.end_idx <= g.end_idx
             and a is not g]
    back = next(i + 1 for i, it in enumerate(items)
                if it["iclass"] == "jump" and sym.lookup(it["ip"])[1] == "__longjmp"
                and sym.lookup(items[i + 1]["ip"])[1] == "guard")
    assert max(a.end_idx for a in inner) == back
    assert back < g.end_idx
    jumper = [a for a in acts if a.name == "__longjmp"]
    assert len(jumper) == 2 and all(a.flags & Flag.UNWOUND for a in jumper)
    # everything nests inside main and each instruction is counted once
    assert sum(a.self_insns for a in acts) == len(items)


THROW_CC = r"""
struct Boom {};
__attribute__((noinline)) void deep(int n)
{
    if (n == 0)
        throw Boom();
    deep(n - 1);
}
__attribute__((noinline)) int guard()
{
    try {
        deep(3);
    } catch (const Boom &) {
        return 1;
    }
    return 0;
}
int main()
{
    return guard() + guard();
}
"""


def test_cxx_exception_unwinds_to_the_handler():
    # The first throw of a static binary runs the unwinder's one-time set-up
    # (millions of instructions): record from main's second call of guard.
    exe = build("throw", THROW_CC, compiler="g++", ext="cc")
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", exe],
                         capture_output=True, text=True, check=True).stdout
    body = dis.split("<main>:", 1)[1].split("\n\n", 1)[0]
    calls = [l.split(":")[0].strip() for l in body.splitlines()
             if "call" in l and "<_Z5guardv>" in l]
    assert len(calls) == 2
    items, sym = stepped_flow("throw", THROW_CC, start="0x" + calls[1],
                              compiler="g++", ext="cc")
    acts = [r for r in reconstruct(items, lookup=sym.lookup) if type(r) is Activation]
    by = lambda n: [a for a in acts if a.name == n]
    deep = by("deep(int)")
    assert [(a.depth, a.flags) for a in deep] == [(d, Flag.UNWOUND) for d in (5, 4, 3, 2)]
    assert [(a.depth, a.flags) for a in by("guard()")] == [(1, Flag.NONE)]
    main = by("main")
    assert [(a.depth, a.flags) for a in main] == [(0, Flag.BEGIN_UNKNOWN)]
    assert all(a.flags & Flag.UNWOUND for a in by("__cxa_throw") + by("_Unwind_RaiseException"))
    # the handler runs in guard, after the unwound frames ended
    catch = by("__cxa_begin_catch")
    assert [(a.depth, a.flags) for a in catch] == [(2, Flag.NONE)]
    assert catch[0].begin_idx > max(a.end_idx for a in deep)
    assert sum(a.self_insns for a in acts) == len(items)

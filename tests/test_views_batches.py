"""The views on batches (issue 15 parts 2-3, 17.3-17.4, 18.5): the
vectorized call stacks equal the one-at-a-time ones, loss is always said,
views narrow to a function, a depth, a duration or a window, threads get
their pid/tid and their own tracks, and the column formatters write what
Python's formatting writes.  Programs are real, built with gcc and
recorded with ``hwtrace record``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import IN_CI, run_hwtrace

from hwtrace.analysis import CallStackBuilder
from hwtrace.analysis.slices import to_records

FIB_C = r"""
#include <stdio.h>
#include <stdlib.h>
volatile int sink;
__attribute__((noinline)) int leaf(int x) { return x * 3; }
__attribute__((noinline)) int fib(int n)
{
    if (n < 2)
        return leaf(n);
    return fib(n - 1) + fib(n - 2);
}
int main(int argc, char **argv)
{
    sink = fib(argc > 1 ? atoi(argv[1]) : 10);
    sink += leaf(1);
    printf("%d\n", sink);
    return 0;
}
"""

#: two threads calling leaf() N times each (-DN=..., default 300)
MT_C = r"""
#include <pthread.h>
#include <stdio.h>
#ifndef N
#define N 300
#endif
__attribute__((noinline)) long leaf(long x) { return x * 3 + 1; }
__attribute__((noinline)) long work(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += leaf(i);
    return s;
}
static void *run(void *a) { return (void *)work((long)a); }
int main(void)
{
    pthread_t t[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&t[i], 0, run, (void *)N);
    long s = 0;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        s += (long)r;
    }
    printf("%ld\n", s);
    return 0;
}
"""


def _gcc(d, name, src, *flags):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc missing") if IN_CI else pytest.skip("gcc missing")
    (d / f"{name}.c").write_text(src)
    exe = d / name
    subprocess.run([gcc, "-O0", "-g", "-fno-inline", *flags, "-o", str(exe),
                    str(d / f"{name}.c")], check=True, capture_output=True)
    return exe


def _record(d, name, *argv, args=()):
    out = d / name
    r = run_hwtrace("record", *args, "-o", out, "--", *argv, timeout=600)
    if r.returncode != 0:
        if IN_CI:
            pytest.fail(f"hwtrace record failed: {r.stderr.strip()}")
        pytest.skip(f"hwtrace record not usable here: {r.stderr.strip()}")
    return out


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    d = tmp_path_factory.mktemp("views")
    exe = _gcc(d, "fib", FIB_C)
    return {"dir": d, "exe": exe,
            "thread": _record(d, "thread", exe, 10, args=("--mode", "thread")),
            "cpu": _record(d, "cpu", exe, 10)}


def _builders(bundle, vectorize):
    from hwtrace.streams import open_bundle
    ts = open_bundle(bundle)
    out = []
    for st in ts.streams:
        b = CallStackBuilder(st.info, ts.symbolizer.lookup, vectorize=vectorize)
        recs = []
        for batch in st.batches(view=True):
            b.feed_batch(batch)
            recs += b.take()
        b.finish()
        recs += b.take()
        out.append(recs)
    return out


@pytest.mark.parametrize("mode", ["thread", "cpu"])
def test_vectorized_runs_equal_one_at_a_time(rec, mode):
    """runs.solve (numpy over runs of records) gives exactly the records
    the builder's one-transfer-at-a-time rules give, times included."""
    vec = _builders(rec[mode], True)
    ref = _builders(rec[mode], False)
    assert vec == ref
    names = Counter(r.name for recs in vec for r in recs if hasattr(r, "end_idx"))
    assert names["fib"] == 177 and names["leaf"] == 90


def test_vectorized_runs_equal_on_the_corpus():
    """The same over the flow items of libipt's tests (overflows, TSX,
    disabled regions, decode errors: irregular transfers everywhere)."""
    from test_analysis_corpus import load
    from conftest import corpus_variants, CORPUS
    if not CORPUS.is_dir():
        pytest.skip("corpus missing")
    from hwtrace.analysis import reconstruct
    n = 0
    for d, v, _meta in corpus_variants():
        items = load(d, v)
        if items is None:
            continue
        a = list(reconstruct(items))
        b = list(reconstruct(items, vectorize=False))
        assert a == b, v
        n += 1
    assert n >= 200


# ------------------------------------------------------------------ loss is said

@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """fib(20) into a 4 KiB stop-on-full buffer: the recorder says the
    buffer filled (stopped, lost bytes)."""
    d = tmp_path_factory.mktemp("stopped")
    exe = _gcc(d, "fib", FIB_C)
    b = _record(d, "b", exe, 20, args=("--buffer-size", "4K"))
    m = json.loads((b / "manifest.json").read_text())
    # fib runs on either emulated CPU, so one or both buffers may fill
    lossy = [s for s in m["streams"] if s.get("stopped")]
    if not lossy:
        pytest.skip("this engine did not fill a 4 KiB buffer")
    return b, lossy


def test_summary_calls_export_say_what_was_lost(stopped, tmp_path):
    b, ss = stopped
    lost = [f"{s['file']}: buffer full, tracing stopped, {s['lost_bytes']:,} bytes lost"
            for s in ss]
    r = run_hwtrace("summary", b)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[2] == f"lost data / errors: {'; '.join(lost)}"
    assert "incomplete:" in r.stdout
    assert all(x in r.stderr for x in lost)
    c = run_hwtrace("calls", b)
    assert c.returncode == 0, c.stderr
    for s in ss:
        assert re.search(r"^  -- lost at insn [\d,]+: the buffer filled and tracing "
                         rf"stopped: {s['lost_bytes']:,} bytes lost$", c.stdout, re.M)
    j = tmp_path / "t.json"
    e = run_hwtrace("export", b, "--chrome", j)
    assert e.returncode == 0, e.stderr
    doc = json.loads(j.read_text())
    inst = [x for x in doc["traceEvents"] if x["ph"] == "i"]
    assert [x["name"] for x in inst] == ["lost"] * len(ss)
    assert doc["otherData"]["lost"] == lost


def test_coverage_says_loss_and_fails_when_nothing_decodes(stopped, tmp_path):
    b, ss = stopped
    r = run_hwtrace("coverage", "--edges", "-q", b)
    assert r.returncode == 0 and r.stdout.startswith("edges: ")
    for s in ss:
        assert f"{s['file']}: recorded with loss: buffer full, tracing stopped" in r.stderr
    # the wrong code for the trace: only decode errors
    pt = b / ss[0]["file"]
    r = run_hwtrace("coverage", "--edges", "--pt", pt, "--raw", f"{sys.executable}:0x1000")
    assert r.returncode == 1 and r.stdout == ""
    assert re.fullmatch(r"hwtrace: coverage: nothing could be decoded \([\d,]+ decode "
                        r"errors?\)\n", r.stderr), r.stderr


@pytest.mark.parametrize("view", [["summary"], ["calls"], ["export", "--folded", "OUT"]])
def test_garbage_and_empty_traces_are_named(rec, tmp_path, view):
    rnd = tmp_path / "random.pt"
    rnd.write_bytes(np.random.default_rng(7).integers(0, 256, 100_000, np.uint8).tobytes())
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in view]
    # (named before anything is decoded, as dump and decode name them)
    for f, why in ((rnd, "no PSB packet (sync point) in its 100,000 bytes"),
                   (empty, "empty file (0 bytes)")):
        r = run_hwtrace(*argv[:1], f, "--elf", rec["exe"], *argv[1:])
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.count("\n") == 1 and why in r.stderr, r.stderr


# ------------------------------------------------------------------ views that fit the question

def _slices_from_perfetto(data):
    from test_export_formats import slices_from_perfetto
    return slices_from_perfetto(data)


def test_export_function_holds_only_it_and_its_callees(rec, tmp_path):
    pf, fo, cj = tmp_path / "f.pftrace", tmp_path / "f.folded", tmp_path / "f.json"
    r = run_hwtrace("export", rec["thread"], "--function", "fib", "--perfetto", pf,
                    "--folded", fo, "--chrome", cj)
    assert r.returncode == 0, r.stderr
    slices, _tracks, _inst = _slices_from_perfetto(pf.read_bytes())
    assert Counter(s[0] for s in slices) == Counter({"fib": 177, "leaf": 89})
    # an end carries its instructions, and flags only where there are some
    from test_export_formats import perfetto_pb2
    pb = perfetto_pb2()
    ends = [p.track_event for p in pb.Trace.FromString(pf.read_bytes()).packet
            if p.HasField("track_event") and p.track_event.type == 2]
    assert ends and all([a.name for a in te.debug_annotations] == ["insns"] for te in ends)
    xs = [e for e in json.loads(cj.read_text())["traceEvents"] if e["ph"] == "X"]
    assert Counter(e["name"] for e in xs) == Counter({"fib": 177, "leaf": 89})
    stacks = [ln.rsplit(" ", 1)[0] for ln in fo.read_text().splitlines()]
    assert stacks and all(s.split(";")[0] == "fib" and set(s.split(";")) <= {"fib", "leaf"}
                          for s in stacks)


def test_calls_function_and_depth(rec):
    r = run_hwtrace("calls", rec["thread"], "--function", "fib", "--max-depth", "1")
    assert r.returncode == 0, r.stderr
    rows = [re.match(r"( +)(\S+) +([\d,]+) insns", ln) for ln in r.stdout.splitlines()[1:]]
    assert all(rows)
    got = [(len(m.group(1)) // 2 - 1, m.group(2)) for m in rows]
    assert got == [(0, "fib"), (1, "fib"), (1, "fib")]


def test_function_that_never_ran_is_said(rec, tmp_path):
    """``--function`` naming a function that never ran (a typo, a name
    inlined away) printed an empty view and nothing else; ``summary``
    said "clock: mixed" and headed time columns for nothing.  One note on
    the summary line says so; the exit status stays 0."""
    note = "--function nosuch: no activation of it in the trace"
    for cmd, extra in (("calls", []), ("summary", []),
                       ("export", ["--folded", tmp_path / "f.folded"])):
        r = run_hwtrace(cmd, rec["thread"], "--function", "nosuch", *extra)
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("\n") == 1 and note in r.stderr, (cmd, r.stderr)
        if cmd == "summary":
            assert "clock: none (nothing in the view)" in r.stdout, r.stdout
            assert "mixed" not in r.stdout and "time" not in r.stdout.split("\n\n")[1]
        ok = run_hwtrace(cmd, rec["thread"], "--function", "fib", *extra)
        assert ok.returncode == 0 and "no activation" not in ok.stderr, ok.stderr


def test_summary_window_counts_only_the_window(rec):
    a, b = 20_000, 60_000
    r = run_hwtrace("summary", rec["thread"], "--insns", f"{a}..{b}", "--top", "500")
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()
            if re.match(r"\S+ +[\d,]+ +[\d,]+ +[\d.]+% ", ln)]
    excl = sum(int(x[2].replace(",", "")) for x in rows)
    assert excl == b - a
    c = run_hwtrace("calls", rec["thread"], "--insns", f"{a}..{b}")
    assert c.returncode == 0, c.stderr
    assert "cut at the window's edge" in c.stdout


def test_calls_window_prints_no_activation_that_ended_before_it(rec):
    """An activation that began and ended before the window, both in one
    chunk of the builder's, is not held for the window (nothing would end
    it): it was printed ``(open)``, cut at the window's edge.  Every line
    of a window is whole, its top lines counting the window's
    instructions."""
    a, b = 20_000, 60_000
    c = run_hwtrace("calls", rec["thread"], "--insns", f"{a}..{b}")
    assert c.returncode == 0, c.stderr
    assert "(open" not in c.stdout
    top = [int(m.group(1).replace(",", "")) for ln in c.stdout.splitlines()
           if (m := re.match(r"  \S+ +([\d,]+) insns", ln))]
    assert sum(top) == b - a


def test_min_duration(rec, tmp_path):
    cj = tmp_path / "t.json"
    r = run_hwtrace("export", rec["thread"], "--min-duration", "500insns", "--clock",
                    "insns", "--chrome", cj, "--chrome-args")
    assert r.returncode == 0, r.stderr
    xs = [e for e in json.loads(cj.read_text())["traceEvents"] if e["ph"] == "X"]
    assert xs and all(e["args"]["insns"] >= 500 for e in xs)
    assert "leaf" not in {e["name"] for e in xs}


def test_time_window_needs_a_clock(rec):
    r = run_hwtrace("summary", rec["thread"], "--clock", "insns", "--time", "1ms..2ms")
    assert r.returncode == 2 and "--time: this trace has no timing" in r.stderr
    r = run_hwtrace("summary", rec["thread"], "--time", "5..x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_summary_shows_the_program_apart_from_start_up(rec):
    r = run_hwtrace("summary", rec["thread"])
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    sep = next(i for i, ln in enumerate(out) if ln.startswith("--- outside main"))
    program = [ln.split()[0] for ln in out[5:sep] if not ln.startswith("...")]
    assert program[0] == "fib"
    assert "_dl_relocate_object" not in program
    assert any(ln.startswith("_dl_") for ln in out[sep:])
    assert "clock: TSC, which counts instructions" in out[1]
    assert any(ln.startswith("calls: activations") for ln in out)


# ------------------------------------------------------------------ threads

@pytest.fixture(scope="module", params=[None, "branch;user;retc;tsc;mtc"],
                ids=["default", "mtc"])
def mt(request, tmp_path_factory):
    """With MTC on, libipt's times trail or lead the instructions (read
    ahead to the next TNT/TIP): a new thread resumes at its creator's IP
    (both return from clone), and a switch placed by such a time gave a
    worker's ``work`` to the main thread."""
    if sys.platform != "linux":
        pytest.skip("the ptrace engine is Linux x86-64")
    d = tmp_path_factory.mktemp("mt")
    exe = _gcc(d, "mt", MT_C, "-static", "-pthread")
    cfg = () if request.param is None else ("--config", request.param)
    return _record(d, "b", exe, args=("--engine", "ptrace", "--mode", "cpu", *cfg))


def test_cpu_mode_threads_have_their_own_tracks_and_pids(mt, tmp_path):
    side = [json.loads(x) for x in (mt / "sideband.jsonl").read_text().splitlines()]
    pid = next(x["pid"] for x in side if x["type"] == "process")
    tids = {x["tid"] for x in side if x["type"] == "thread"}
    assert len(tids) == 3
    cj, pf = tmp_path / "t.json", tmp_path / "t.pftrace"
    r = run_hwtrace("export", mt, "--chrome", cj, "--perfetto", pf)
    assert r.returncode == 0, r.stderr
    xs = [e for e in json.loads(cj.read_text())["traceEvents"] if e["ph"] == "X"]
    work = {e["tid"] for e in xs if e["name"] == "work"}
    assert len(work) == 2 and work <= tids - {pid}
    assert {e["pid"] for e in xs} == {pid}
    slices, tracks, _i = _slices_from_perfetto(pf.read_bytes())
    thread_of = {t.uuid: t.thread.tid for t in tracks.values() if t.HasField("thread")}
    assert {thread_of[s[4]] for s in slices if s[0] == "work"} == work
    b = run_hwtrace("branches", "--kinds", "call", "--format", "jsonl", mt)
    assert b.returncode == 0, b.stderr
    recs = [json.loads(x) for x in b.stdout.splitlines()]
    assert {o["pid"] for o in recs} == {pid} and {o["tid"] for o in recs} <= tids
    assert {o["tid"] for o in recs if o["to_sym"] == "work"} == work
    one = run_hwtrace("branches", "--kinds", "call", "--format", "jsonl", "--tid",
                      min(work), mt)
    mine = [json.loads(x) for x in one.stdout.splitlines()]
    assert mine and {o["tid"] for o in mine} == {min(work)}
    assert len(mine) == sum(o["tid"] == min(work) for o in recs)


# ------------------------------------------------------------------ formatting

def test_columns_format_like_python():
    from hwtrace.export._pb import varint
    from hwtrace.export.textcols import Lines
    rng = np.random.default_rng(3)
    v = np.concatenate((rng.integers(-10**12, 10**12, 500), [0, 1, -1, 999, 1000]))
    t = Lines(len(v)).int(v, 12, commas=True).lit(b"|").int(v).lit(b"\n")
    assert t.render().decode().splitlines() == [f"{x:>12,}|{x}" for x in v.tolist()]
    k = rng.integers(-2**40, 2**40, 500)
    t = Lines(len(k)).frac(k).lit(b"\n")
    assert [float(x) for x in t.render().split()] == [x / 1024 for x in k.tolist()]
    u = rng.integers(0, 2**63, 500, dtype=np.uint64)
    t = Lines(len(u)).varint(u).hex(u).lit(b"\n")
    want = b"".join(varint(int(x)) + f"{int(x):#x}\n".encode() for x in u)
    assert t.render() == want


def test_branch_lines_like_the_record_formatter():
    """The chunk formatter writes what Branch.to_json and the text
    formatter of one record write."""
    from hwtrace.analysis.symbols import Symbolizer
    from hwtrace.branches import Branch, to_array
    from hwtrace.branches.format import Namer, format_chunk
    from hwtrace.cli.branches import _Names, format_text
    sym = Symbolizer()
    sym.add_image(sys.executable)
    img = sym.images[0]
    funcs = [(s, n) for s, _z, n in img.functions()][:50]
    recs = []
    for i, (s, _n) in enumerate(funcs):
        recs.append(Branch(7, 8, "call", s + 4, s, 100 + i, i % 5))
        recs.append(Branch(None, None, "sysret", None, s + 1, None, None))
        recs.append(Branch(1, 1, "syscall", s, None, 5, 0))
    names = _Names(sym)
    a = to_array(recs)
    n = Namer(sym)
    got = format_chunk(a, n, "jsonl").decode().splitlines()
    assert [json.loads(x) for x in got] == [r.to_json(names) for r in recs]
    txt = format_chunk(a, n, "text").decode().splitlines()
    assert txt == [format_text(r, names) for r in recs]


#: a program that forks and execs another (argv[1]) and calls its own
#: a_work() meanwhile; the other calls b_hot().  Under QEMU both load at
#: the same address, so their functions overlap.
PARENT_C = r"""
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
volatile long sink;
__attribute__((noinline)) long a_work(long x) { return x * 7 + 1; }
int main(int argc, char **argv)
{
    pid_t p = fork();
    if (p == 0) { execv(argv[1], argv + 1); _exit(127); }
    for (long i = 0; i < 300; i++) sink += a_work(i);
    waitpid(p, 0, 0);
    return 0;
}
"""

CHILD_C = r"""
volatile long sink;
__attribute__((noinline)) long b_hot(long x) { return x * 3 + 2; }
int main(void) { for (long i = 0; i < 500; i++) sink += b_hot(i); return 0; }
"""


@pytest.mark.parametrize("mode", ["thread", "cpu"])
def test_programs_at_the_same_addresses_are_named_by_their_own(tmp_path, mode):
    """A parent and the program its child execs, loaded at the same
    addresses (QEMU loads every program at one base): each part of a
    stream is named by the files of the process that ran it.  One table
    of every mapped file named the child's b_hot by the parent's code
    (what the views said of any shell script: a shell's names for the
    programs it ran).  Vectorized and one at a time agree."""
    parent = _gcc(tmp_path, "parent", PARENT_C)
    child = _gcc(tmp_path, "child", CHILD_C)
    b = _record(tmp_path, "rec", parent, child, args=("--mode", mode))
    from hwtrace.streams import open_bundle
    ts = open_bundle(b)
    spaced = ts.space_lookup()
    assert spaced is not None

    def builders(vectorize):
        out = []
        for st in ts.streams:
            bl = CallStackBuilder(st.info, ts.symbolizer.lookup, vectorize=vectorize,
                                  space_lookup=spaced)
            recs = []
            for batch in st.batches(view=True, space_items=True):
                bl.feed_batch(batch)
                recs += bl.take()
            bl.finish()
            out.append(recs + bl.take())
        return out

    vec = builders(True)
    assert vec == builders(False)
    names = Counter(r.name for recs in vec for r in recs if hasattr(r, "end_idx"))
    assert names["b_hot"] == 500 and names["a_work"] == 300, names.most_common(8)
    r = run_hwtrace("summary", b)
    assert r.returncode == 0, r.stderr
    calls = {ln.split()[0]: ln.split()[1] for ln in r.stdout.splitlines()
             if ln.split() and ln.split()[0] in ("a_work", "b_hot")}
    assert calls == {"a_work": "300", "b_hot": "500"}, r.stdout
    # the two mains are told apart by their programs' names, not addresses
    r = run_hwtrace("summary", b, "--top", "1000")
    mains = {ln[:ln.index(")") + 1] for ln in r.stdout.splitlines() if ln.startswith("main")}
    assert mains == {"main (parent)", "main (child)"}, r.stdout
    for fmt in ("text", "jsonl"):
        r = run_hwtrace("branches", b, "--kinds", "call", "--format", fmt)
        assert r.returncode == 0, r.stderr
        to = Counter(re.findall(r"(?:-> 0x[0-9a-f]+ |\"to_sym\":\")(\w+)", r.stdout))
        assert (to["a_work"], to["b_hot"]) == (300, 500), (fmt, to.most_common(8))
    # triggers and ranges by each program's own symbols: a window opens
    # only in the process that runs the function
    pids = {}
    for fn in ("a_work", "b_hot"):
        for opt in ("--start", "--range"):
            r = run_hwtrace("branches", b, opt, fn, "--format", "jsonl")
            assert r.returncode == 0, r.stderr
            got = {json.loads(ln)["pid"] for ln in r.stdout.splitlines()}
            assert len(got) == 1, (fn, opt, got)
            pids.setdefault(fn, set()).update(got)
    assert len(pids["a_work"] | pids["b_hot"]) == 2, pids
    # coverage: each program's blocks against its own module, its lines
    from hwtrace.analysis.symbols import function_symbol
    from hwtrace.export.drcov import read_drcov
    dr, lc = tmp_path / "c.drcov", tmp_path / "c.lcov"
    r = run_hwtrace("export", b, "--drcov", dr, "--lcov", lc)
    assert r.returncode == 0, r.stderr
    mods, bbs = read_drcov(dr.read_bytes())
    mid = {path: m for m, _base, _end, path in mods}
    for exe, fn in ((parent, "a_work"), (child, "b_hot")):
        at = function_symbol(str(exe), fn)[0]
        assert any(m == mid[str(exe)] and off <= at < off + size
                   for m, off, size in bbs), (exe, fn)
    per_file = {rec.split("\n", 1)[0]: rec for rec in lc.read_text().split("SF:")[1:]}
    assert "FNDA:300,a_work" in per_file[f"{tmp_path}/parent.c"]
    assert "FNDA:500,b_hot" in per_file[f"{tmp_path}/child.c"]

"""hwtrace diff on real recordings: programs compiled and recorded here
with ``hwtrace record`` (the default engine, QEMU, unless said)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, IN_CI, run_hwtrace

FIB_C = r"""
#include <stdio.h>
#include <stdlib.h>
static int fib(int n)
{
    if (n < 2)                                  /* LINE:test */
        return n;
    return fib(n - 1) + fib(n - 2);
}
int main(int argc, char **argv)
{
    printf("%d\n", fib(argc > 1 ? atoi(argv[1]) : 10));
    return 0;
}
"""

# Reads a file; a record starting with '!' has no name and crashes.
PARSE_C = r"""
#include <stdio.h>
#include <string.h>
struct rec { int kind; char name[16]; };
static int checksum(const char *buf, int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s = s * 31 + buf[i];
    return s;
}
static void handle(struct rec *r, const char *buf, int n)
{
    if (buf[0] == '!')                          /* LINE:byte */
        r = NULL;
    r->kind = checksum(buf, n);                 /* LINE:crash */
    memcpy(r->name, buf, n < 15 ? n : 15);
}
int main(int argc, char **argv)
{
    char buf[64];
    struct rec rec;
    FILE *f = fopen(argv[1], "rb");
    if (!f)
        return 2;
    int n = (int)fread(buf, 1, sizeof buf, f);
    fclose(f);
    handle(&rec, buf, n);
    printf("%d\n", rec.kind);
    return 0;
}
"""


def line_of(src: str, tag: str) -> int:
    for i, text in enumerate(src.splitlines(), 1):
        if f"LINE:{tag}" in text:
            return i
    raise AssertionError(tag)


def need(*tools):
    for t in tools:
        if shutil.which(t) is None:
            if IN_CI:
                pytest.fail(f"{t} missing in CI")
            pytest.skip(f"needs {t}")


def build(tmp, name, src, *flags, out=None):
    c = tmp / f"{name}.c"
    c.write_text(src)
    exe = out or tmp / name
    exe.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-g", *flags, "-o", str(exe), str(c)], check=True,
                   capture_output=True)
    return exe


# The recorded programs see the same environment in every test: pytest
# names the current test in PYTEST_CURRENT_TEST, and a longer environment
# moves argv[0] on the stack, where libc's vectorized strrchr (finding the
# program's short name) branches on the string's alignment -- a real
# difference between two runs that diff duly reports.
ENV = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def record(out, *argv, engine=None, mode=None, ok=(0,), extra=(), aslr=True,
           cpu=None):
    extra = (["--engine", engine] if engine else []) + \
        (["--mode", mode] if mode else []) + list(extra)
    # aslr=False: the program's stack and libraries at fixed addresses
    # (setarch -R, as gdb runs programs), so libc's string functions see
    # argv at the same alignment in both runs
    pre = [] if aslr else ["setarch", "x86_64", "-R"]
    # cpu=N: every process on host CPU N (taskset), so a cpu-mode
    # recording's stream N interleaves them (the emulated engine puts a
    # piece of a thread's run on the CPU it ran on)
    pre = (["taskset", "-c", str(cpu)] if cpu is not None else []) + pre
    r = subprocess.run([*pre, sys.executable, "-m", "hwtrace", "record", *extra,
                        "-o", str(out), "--", *map(str, argv)],
                       capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode in ok, r.stderr
    assert (out / "manifest.json").exists(), r.stderr
    return out


def diff(a, b, *more):
    return run_hwtrace("diff", a, b, *more)


def jsonl(r) -> list[dict]:
    assert not r.stderr, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def of_type(recs, t):
    return [r for r in recs if r["type"] == t]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    need("gcc", "qemu-x86_64")
    return tmp_path_factory.mktemp("diff")


# fib's runs without MTC (record's default has it): MTC packets fall where
# the emulated clock's ART ticks, which count from the host TSC at the
# start, so the same instruction sits at a trace offset a few bytes apart
# in two runs -- the first divergence test compares those offsets
NO_MTC = ("--config", "branch;user;retc;tsc")


@pytest.fixture(scope="module")
def fib(work):
    exe = build(work, "fib", FIB_C, "-O0", "-static")
    return {n: record(work / f"fib{n}", exe, n, extra=NO_MTC)
            for n in (10, 11)}


# -- same program, different argument -----------------------------------------------

def test_fib_10_vs_11_first_divergence_at_the_test(fib):
    r = diff(fib[10], fib[11], "--format", "jsonl")
    assert r.returncode == 1
    recs = jsonl(r)
    first = of_type(recs, "divergence")[0]
    assert first["number"] == 1 and first["pair"] == 1
    assert first["function"] == "fib"
    # the conditional of `n < 2`, taken one way in each run
    br = first["branch"]
    assert br["kind"] == "conditional"
    assert br["line"].endswith(f"fib.c:{line_of(FIB_C, 'test')}")
    assert br["at"].startswith("fib+")
    assert br["a"]["taken"] != br["b"]["taken"]
    # fib(10) ... fib(1) in A: ten activations deep when A's n is 1 and
    # B's (fib(11) ... fib(2)) is 2
    stack = first["stack"]
    assert stack.count("fib") == 10
    assert stack[-1] == "fib" and stack[-11] == "main"
    assert stack == [f["function"] for f in first["frames"]["a"]]
    assert stack == [f["function"] for f in first["frames"]["b"]]
    # the same instructions ran before: same index, same trace offset
    a, b = first["a"], first["b"]
    assert a["insn"] == b["insn"] > 0
    assert a["offset"] == b["offset"]
    assert a["ip"] != b["ip"] and a["ip"] == br["a"]["ip"]
    assert first["common"][-1]["ip"] == br["ip"]
    # back in step once the divergent fib activation returned in both
    meet = first["region"]["meet"]
    assert meet is not None and meet["function"] == "fib"
    assert meet["a"]["insn"] > a["insn"] and meet["b"]["insn"] > b["insn"]
    # fib(11) makes 287 calls, fib(10) 177: the coverage rows say so
    counts = {c["function"]: c for c in of_type(recs, "coverage")
              if c["kind"] == "count"}
    assert counts["fib"]["calls"] == {"a": 177, "b": 287}
    end = of_type(recs, "pair_end")[0]
    assert end["divergences"] == 10 and end["more"] is True   # --max 10
    assert of_type(recs, "summary")[0]["same"] is False


def test_fib_text_and_max(fib):
    r = diff(fib[10], fib[11], "--max", "2")
    assert r.returncode == 1 and not r.stderr
    out = r.stdout
    assert "#1 first divergence in fib" in out
    assert f"fib.c:{line_of(FIB_C, 'test')}" in out
    assert "#2 in fib" in out and "#3" not in out
    assert "more follow (--max 2)" in out
    assert "the runs differ" in out


def test_all_divergences_are_the_leaves(fib):
    """fib(11)'s call tree is fib(10)'s with every leaf that is fib(1) in
    A grown into fib(2) in B: A has 55 fib(1) leaves, so 55 divergences,
    each at the n < 2 test; the rest of the runs is the same."""
    recs = jsonl(diff(fib[10], fib[11], "--format", "jsonl", "--max", "0"))
    divs = of_type(recs, "divergence")
    assert len(divs) == 55
    for d in divs:
        assert d["function"] == "fib"
        assert d["branch"]["line"].endswith(f"fib.c:{line_of(FIB_C, 'test')}")
        assert d["region"]["a"]["calls"] == 0          # A's fib(1) returns
        assert d["region"]["b"]["calls"] == 2          # B's fib(2) calls twice
    assert not of_type(recs, "pair_end")[0]["more"]


# -- identical runs -------------------------------------------------------------------

def test_identical_runs_are_the_same(work, fib):
    exe = work / "fib"
    again = record(work / "fib10-again", exe, 10, extra=NO_MTC)
    r = diff(fib[10], again)
    assert r.returncode == 0, r.stdout
    assert "the runs are the same" in r.stdout
    recs = jsonl(diff(fib[10], again, "--format", "jsonl"))
    assert not of_type(recs, "divergence") and not of_type(recs, "coverage")
    assert of_type(recs, "summary")[0]["same"] is True
    assert of_type(recs, "process")[0]["compared_by"] == "address"


# No libc: its own _start and raw system calls.  Under ASLR the stack
# moves by a random 16-byte-aligned offset too, and libc's vectorized
# string functions (strlen's page-cross check, in start-up and in main
# alike) branch on the page offset of strings on the stack -- in about 1
# run of 4 a libc program took another path before main, a real
# difference diff duly reported.  Nothing here looks at an address: the
# strings are measured a byte at a time.
BARE_C = r"""
typedef unsigned long size_t;

static long sys3(long nr, long a, long b, long c)
{
    long ret;
    __asm__ volatile ("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c)
                      : "rcx", "r11", "memory");
    return ret;
}

static size_t length(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

static int fib(int n)
{
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

static int digits(char *out, size_t v)
{
    char tmp[24];
    int n = 0, i = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while (v /= 10);
    while (n)
        out[i++] = tmp[--n];
    out[i++] = '\n';
    return i;
}

__attribute__((used, noreturn)) void start_c(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    size_t n = 0;
    char buf[32];
    for (long i = 0; i < argc; i++)
        n += length(argv[i]);
    n += (size_t)fib(12);
    sys3(1, 1, (long)buf, digits(buf, n));      /* write(1, buf, len) */
    for (;;)
        sys3(60, 0, 0, 0);                      /* exit(0) */
}

__asm__(".text\n.globl _start\n_start:\n"
        "  xor %ebp, %ebp\n  mov %rsp, %rdi\n  and $-16, %rsp\n"
        "  call start_c\n  hlt\n");
"""
BARE_FLAGS = ("-O1", "-static-pie", "-nostdlib", "-ffreestanding", "-fno-builtin",
              "-fno-stack-protector")


def _starts(bundle):
    out = {}
    for line in (bundle / "sideband.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["type"] == "mmap":
            out.setdefault(r["file"].rsplit("/", 1)[-1], r["start"])
    return out


def _aslr_on() -> bool:
    """Whether programs we start get randomized addresses: the system
    setting, and no ADDR_NO_RANDOMIZE (setarch -R) in our personality."""
    try:
        with open("/proc/sys/kernel/randomize_va_space") as f:
            system = f.read().strip() != "0"
        with open("/proc/self/personality") as f:
            personal = not int(f.read(), 16) & 0x0040000
    except OSError:
        return False
    return system and personal


def test_identical_runs_at_other_addresses(work):
    """Natively (ptrace engine) ASLR loads a static PIE and the vdso at
    other addresses each run: the runs still compare equal, module by
    module offset, and the output says so.  The program runs no libc (see
    BARE_C): a libc program is not a fair case, its string functions take
    another path for strings at another page offset of the randomized
    stack (and, linked dynamically, of ld.so.cache's mapping) -- a real
    difference, which diff reports."""
    need("gcc")
    exe = build(work, "bare", BARE_C, *BARE_FLAGS)
    a = record(work / "bare-a", exe, "aa", "bbb", engine="ptrace", mode="thread")
    b = record(work / "bare-b", exe, "aa", "bbb", engine="ptrace", mode="thread")
    recs = jsonl(diff(a, b, "--format", "jsonl"))
    assert of_type(recs, "summary")[0]["same"] is True
    moved = {k for k, v in _starts(a).items() if _starts(b).get(k) != v}
    if _aslr_on():
        # the point of the test (a 28-bit random base repeats 1 in 2**28)
        assert "bare" in moved
    proc = of_type(recs, "process")[0]
    notes = {m["b"].rsplit("/", 1)[-1]: m["how"] for m in proc["modules"]}
    for name, how in notes.items():
        assert how == ("module+offset" if name in moved else "address"), name
    assert proc["compared_by"] == ("module+offset" if moved else "address")
    assert diff(a, b).returncode == 0


def test_a_wrapped_trace_meets_where_it_begins(work, fib):
    """A circular buffer kept only the end of B's run: the recorder's
    instruction count says where in the run B's trace begins, and from
    there the runs are the same."""
    exe = work / "fib"
    # fib(22): a trace several times the 4 KiB buffer (fib(18)'s, ~3.7 KiB
    # under a small environment, did not wrap)
    full = record(work / "fib22", exe, 22)
    wrapped = record(work / "fib22-wrapped", exe, 22, extra=("--circular",
                                                            "--buffer-size", "4K"))
    recs = jsonl(diff(full, wrapped, "--format", "jsonl", "--max", "0"))
    (d,) = of_type(recs, "divergence")
    end = of_type(recs, "pair_end")[0]
    assert end["b"]["wrapped"] and not end["a"]["wrapped"]
    assert 0 < end["b"]["insns"] < end["a"]["insns"]
    meet = d["region"]["meet"]
    assert meet["how"] == "where B's trace begins"
    assert meet["b"]["insn"] == 0
    assert meet["a"]["insn"] == end["a"]["insns"] - end["b"]["insns"]
    assert d["region"]["a"]["insns"] == meet["a"]["insn"]
    assert "kept only the end of its run" in diff(full, wrapped).stdout


def test_lost_data_is_stepped_over(work, tmp_path):
    """Bytes of B's trace destroyed mid-stream: the decoder resyncs at the
    next PSB, and diff finds where A runs the code B's trace resumes with
    -- among the thousands of places fib runs it, the one from which the
    two stay in step -- so what B lost is exactly what A ran meanwhile."""
    a = record(work / "fib20", work / "fib", 20)
    b = tmp_path / "fib20-damaged"
    shutil.copytree(a, b)
    m = json.loads((b / "manifest.json").read_text())
    st = max(m["streams"], key=lambda s: s["size"])
    pt = b / st["file"]
    data = bytearray(pt.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 40] = b"\xff" * 40
    pt.write_bytes(bytes(data))
    recs = jsonl(diff(a, b, "--format", "jsonl", "--max", "0"))
    (d,) = of_type(recs, "divergence")
    assert d["reason"] == "B lost trace data here"
    meet = d["region"]["meet"]
    assert meet["how"] == "after lost data"
    end = of_type(recs, "pair_end")[0]
    assert end["b"]["gaps"] >= 1
    lost = end["a"]["insns"] - end["b"]["insns"]
    assert lost > 0 and meet["a"]["insn"] - meet["b"]["insn"] == lost
    assert d["region"]["a"]["insns"] == lost
    # the verdict says the only divergence is where data was lost
    assert of_type(recs, "summary")[0]["at_lost_data"] == 1
    text = diff(a, b, "--max", "0").stdout
    assert "1 divergence shown (where a trace lost data)" in text, text


# -- a crash versus a clean run -------------------------------------------------------

@pytest.fixture(scope="module")
def parse(work):
    exe = build(work, "parse", PARSE_C, "-O0", "-static")
    # file names of one length: the argv strings then lie at the same
    # addresses in both runs (a 1-byte shift moved argv[0] across a vector
    # boundary for libc's strrchr in some environments, a divergence before
    # the input byte)
    (work / "good.txt").write_text("hello world\n")
    (work / "evil.txt").write_text("!ello world\n")
    good = record(work / "good", exe, work / "good.txt")
    bad = record(work / "bad", exe, work / "evil.txt", ok=(139,))
    return good, bad


def test_crash_names_the_branch_on_the_input_byte(parse):
    good, bad = parse
    r = diff(good, bad, "--format", "jsonl")
    assert r.returncode == 1
    recs = jsonl(r)
    divs = of_type(recs, "divergence")
    first = divs[0]
    assert first["function"] == "handle"
    br = first["branch"]
    assert br["kind"] == "conditional"
    assert br["line"].endswith(f"parse.c:{line_of(PARSE_C, 'byte')}")
    # the crashing run went on to the line that sets the null pointer
    assert br["b"]["line"].endswith(f"parse.c:{line_of(PARSE_C, 'byte') + 1}")
    assert br["a"]["line"].endswith(f"parse.c:{line_of(PARSE_C, 'crash')}")
    assert first["stack"][-2:] == ["main", "handle"]
    # then B's trace ends (the fault) while A goes on
    last = divs[-1]
    assert last["b"]["ip"] is None or "cut short in B" in last.get("reason", "")
    assert "B's trace ends" in last["reason"]
    assert last["function"] == "handle"
    assert last["region"]["meet"] is None
    # printf ran in A only
    only_a = {c["function"] for c in of_type(recs, "coverage")
              if c["kind"] == "function" and c["only"] == "a"}
    assert "main" not in only_a and only_a


def test_crash_text(parse):
    good, bad = parse
    r = diff(good, bad)
    assert r.returncode == 1 and not r.stderr
    assert "#1 first divergence in handle" in r.stdout
    assert f"parse.c:{line_of(PARSE_C, 'byte')}" in r.stdout
    assert "B's trace ends" in r.stdout


def test_crash_natively_ends_at_the_faulting_instruction(work, parse):
    """With the ptrace engine the trace stops right before the faulting
    store: the last divergence is B's step cut short there.  (Natively,
    ASLR puts argv at a random alignment in each run, and the vectorized
    string functions of the loader and libc branch on it: a real
    divergence before the input byte in some runs.  The runs are made as
    one compares native runs, without ASLR.)"""
    exe = work / "parse"
    good = record(work / "good-p", exe, work / "good.txt", engine="ptrace",
                  aslr=False)
    bad = record(work / "bad-p", exe, work / "evil.txt", engine="ptrace", ok=(139,),
                 aslr=False)
    recs = jsonl(diff(good, bad, "--format", "jsonl"))
    divs = of_type(recs, "divergence")
    assert divs[0]["branch"]["line"].endswith(
        f"parse.c:{line_of(PARSE_C, 'byte')}")
    last = divs[-1]
    assert "cut short in B" in last["reason"]
    assert "before that instruction ran (a fault or a signal)" in last["reason"]
    assert f"parse.c:{line_of(PARSE_C, 'crash')}" in last["reason"]
    assert last["function"] == "handle"


# -- different builds -------------------------------------------------------------------

def test_builds_compared_by_symbol(work):
    # same path length, so the loader's look at its own path runs alike
    o0 = build(work, "fibsrc", FIB_C, "-O0", "-static", out=work / "O0" / "fib")
    o2 = build(work, "fibsrc", FIB_C, "-O2", "-static", out=work / "O2" / "fib")
    a = record(work / "fib-O0", o0, 10)
    b = record(work / "fib-O2", o2, 10)
    r = diff(a, b, "--format", "jsonl")
    assert r.returncode == 1
    recs = jsonl(r)
    proc = of_type(recs, "process")[0]
    assert proc["compared_by"] == "symbol+offset"
    (exe,) = [m for m in proc["modules"] if m["b"].endswith("/O2/fib")]
    assert exe["how"] == "symbol+offset" and exe["a"].endswith("/O0/fib")
    assert exe["build_id"]["a"] != exe["build_id"]["b"]
    assert exe["functions"]["matched"] > 100
    # libc's start-up code is the same in both: they part in main
    first = of_type(recs, "divergence")[0]
    assert first["function"] == "main"
    assert "builds' code differs" in first["reason"]
    # back in step when main returns into libc
    assert first["region"]["meet"]["how"] == "returned to a common frame"
    counts = {c["function"]: c for c in of_type(recs, "coverage")
              if c["kind"] == "count"}
    assert counts["fib"]["calls"]["a"] == 177
    text = diff(a, b).stdout
    assert "compared by symbol+offset" in text and "different builds" in text


# -- threads ----------------------------------------------------------------------------

THREADS_C = r"""
#include <pthread.h>
#include <stdio.h>
static long out[3];
__attribute__((noinline)) static long work(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i % 7;
    return s;
}
static void *worker(void *arg)
{
    long k = (long)arg;
    out[k] = work(2000 * (k + 1));
    return 0;
}
int main(void)
{
    pthread_t t[3];
    for (long k = 0; k < 3; k++) {
        pthread_create(&t[k], 0, worker, (void *)k);
        pthread_join(t[k], 0);
    }
    printf("%ld %ld %ld\n", out[0], out[1], out[2]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def threads(work):
    exe = build(work, "threads", THREADS_C, "-O1", "-pthread")
    return [record(work / f"threads{i}", exe, mode="thread") for i in (1, 2)]


def _tids(bundle):
    return sorted(s["tid"] for s in
                  json.loads((bundle / "manifest.json").read_text())["streams"])


def test_threads_paired_in_creation_order(threads):
    """Worker k loops 2000*(k+1) times: paired in creation order, no two
    paired workers part in work()."""
    a, b = threads
    recs = jsonl(diff(a, b, "--format", "jsonl", "--max", "0"))
    pairs = of_type(recs, "pair")
    assert len(pairs) == 4
    ta, tb = _tids(a), _tids(b)
    assert [p["a"]["tid"] for p in pairs] == ta     # main thread first
    assert [p["b"]["tid"] for p in pairs] == tb
    assert pairs[0]["a"]["tid"] == pairs[0]["a"]["pid"]
    assert all(d["function"] != "work" for d in of_type(recs, "divergence"))


def test_thread_override(threads):
    a, b = threads
    ta, tb = _tids(a), _tids(b)
    # swap the first two workers by hand: they part in work()
    r = diff(a, b, "--format", "jsonl", "--max", "0",
             "--thread", f"A:{ta[1]}=B:{tb[2]}",
             "--thread", f"A:{ta[2]}=B:{tb[1]}")
    recs = jsonl(r)
    pairs = {p["pair"]: p for p in of_type(recs, "pair")}
    given = [p for p in pairs.values() if p["paired_by"] == "given"]
    assert {(p["a"]["tid"], p["b"]["tid"]) for p in given} == \
        {(ta[1], tb[2]), (ta[2], tb[1])}
    in_work = {d["pair"] for d in of_type(recs, "divergence")
               if d["function"] == "work"}
    assert in_work == {p["pair"] for p in given}
    assert r.returncode == 1


FORK_C = r"""
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
__attribute__((noinline)) static long work(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)                /* LINE:loop */
        s += i % 7;
    return s;
}
int main(int argc, char **argv)
{
    long n = argc > 1 ? 1000 : 2000;
    pid_t p = fork();
    if (p == 0) {
        printf("%ld\n", work(n));
        return 0;
    }
    waitpid(p, 0, 0);
    printf("%ld\n", work(3000));
    return 0;
}
"""


def test_processes_paired_parent_with_parent_child_with_child(work):
    exe = build(work, "forky", FORK_C, "-O1")
    a = record(work / "fork-a", exe, mode="thread")
    b = record(work / "fork-b", exe, "x", mode="thread")
    recs = jsonl(diff(a, b, "--format", "jsonl", "--max", "0"))
    pairs = of_type(recs, "pair")
    assert len(pairs) == 2
    parent, child = pairs
    assert parent["a"]["tid"] == parent["a"]["pid"]
    assert child["a"]["pid"] != parent["a"]["pid"]
    assert child["b"]["pid"] != parent["b"]["pid"]
    divs = of_type(recs, "divergence")
    # the child loops 2000 times in A, 1000 in B: it parts at the loop test
    first = [d for d in divs if d["pair"] == child["pair"]][0]
    assert first["function"] == "work"
    assert first["branch"]["line"].endswith(f"forky.c:{line_of(FORK_C, 'loop')}")
    assert first["region"]["a"]["insns"] > first["region"]["b"]["insns"] == 0
    # the parents both run work(3000)
    assert all(d["function"] != "work" for d in divs
               if d["pair"] == parent["pair"])


# A parent and a child that take turns on one CPU (sched_yield): the
# child's work depends on argv, the parent's does not.
TURNS_C = r"""
#include <sched.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
__attribute__((noinline)) static long squares(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i * i;
    return s;
}
__attribute__((noinline)) static long digits(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        for (long k = i; k; k /= 10)
            s += k % 10;
    return s;
}
int main(int argc, char **argv)
{
    long s = squares(2000);
    pid_t p = fork();
    if (p == 0) {
        int kind = argc > 1 && argv[1][0] == 'd';
        for (int round = 0; round < 6; round++) {
            long r = kind ? digits(3000) : squares(3000);   /* LINE:kind */
            printf("child %d %ld\n", round, r);
            fflush(stdout);
            sched_yield();
        }
        return 0;
    }
    for (int round = 0; round < 6; round++) {
        s += squares(2500);
        printf("parent %d %ld\n", round, s);
        fflush(stdout);
        sched_yield();
    }
    waitpid(p, 0, 0);
    return 0;
}
"""


def _answer(recs) -> list:
    """What diff found, without the run's own ids and trace offsets."""
    out = []
    for r in recs:
        if r["type"] == "divergence":
            out.append(("divergence", r["pair"], r["function"], r["branch"].get("line"),
                        r["a"]["insn"], r["b"]["insn"]))
        elif r["type"] == "pair_end":
            out.append(("pair_end", r["pair"], r["a"]["insns"], r["b"]["insns"],
                        r["divergences"]))
        elif r["type"] == "summary":
            out.append(("summary", r["same"], r["divergences"], r["pairs"]))
    return out


def _interleaved(bundle) -> bool:
    """Does one CPU stream of this cpu-mode bundle hold both processes?"""
    on: dict = {}
    for line in (bundle / "sideband.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["type"] == "switch" and r["next_tid"] > 0:
            on.setdefault(r["cpu"], set()).add(r["next_tid"])
    return any(len(t) > 1 for t in on.values())


def test_cpu_mode_streams_interleaving_processes_are_split_by_thread(work):
    """The default cpu mode, both processes on one CPU: diff takes each
    thread's segments of the shared stream, finds the child parting at
    the argv test (one divergence per round) and the parents alike; two
    runs with the same argument compare equal; and the same runs recorded
    with --mode thread give the same answer, to the instruction."""
    need("taskset")
    exe = build(work, "turns", TURNS_C, "-O1", "-static")
    cpu = {k: record(work / f"turns-cpu-{k}", exe, k, aslr=False, cpu=0)
           for k in ("s", "d", "s2")}
    assert all(_interleaved(b) for b in cpu.values())
    thr = {k: record(work / f"turns-thread-{k}", exe, k, aslr=False, cpu=0,
                     mode="thread") for k in ("s", "d")}
    r = diff(cpu["s"], cpu["d"], "--format", "jsonl", "--max", "0")
    assert r.returncode == 1
    recs = jsonl(r)
    parent, child = of_type(recs, "pair")
    assert parent["a"]["tid"] == parent["a"]["pid"] != child["a"]["pid"]
    divs = of_type(recs, "divergence")
    assert len(divs) == 6 and {d["pair"] for d in divs} == {child["pair"]}
    for d in divs:
        assert d["function"] == "main"
        assert d["branch"]["line"].endswith(f"turns.c:{line_of(TURNS_C, 'kind')}")
    ends = of_type(recs, "pair_end")
    assert ends[0]["same"] and ends[0]["a"]["insns"] == ends[0]["b"]["insns"] > 0
    assert ends[1]["b"]["insns"] > ends[1]["a"]["insns"] > 0
    # every instruction the recorder saw went to one thread or the other
    for side, b in (("a", cpu["s"]), ("b", cpu["d"])):
        seen = sum(s["instructions_observed"] for s in
                   json.loads((b / "manifest.json").read_text())["streams"])
        assert sum(e[side]["insns"] for e in ends) == seen
    same = diff(cpu["s"], cpu["s2"], "--format", "jsonl")
    assert same.returncode == 0, same.stdout
    assert of_type(jsonl(same), "summary")[0]["same"] is True
    by_thread = jsonl(diff(thr["s"], thr["d"], "--format", "jsonl", "--max", "0"))
    assert _answer(by_thread) == _answer(recs)
    across = diff(cpu["s"], thr["s"], "--format", "jsonl")
    assert across.returncode == 0, across.stdout


# Three workers taking turns on one CPU; worker 1 does other work when
# argv says so.  Each new thread begins where its creator's clone returns.
TURNS_MT_C = r"""
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
static long out[3];
static int odd;
__attribute__((noinline)) static long work(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i % 7;
    return s;
}
__attribute__((noinline)) static long other(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i % 5 + 1;
    return s;
}
static void *worker(void *arg)
{
    long k = (long)arg;
    for (int r = 0; r < 5; r++) {
        out[k] += (k == 1 && odd) ? other(3000) : work(2000 * (k + 1));   /* LINE:odd */
        sched_yield();
    }
    return 0;
}
int main(int argc, char **argv)
{
    pthread_t t[3];
    odd = argc > 1 && argv[1][0] == 'o';
    for (long k = 0; k < 3; k++)
        pthread_create(&t[k], 0, worker, (void *)k);
    for (long k = 0; k < 3; k++)
        pthread_join(t[k], 0);
    printf("%ld %ld %ld\n", out[0], out[1], out[2]);
    return 0;
}
"""


def _flows(bundle) -> list:
    """Each thread's instruction count, as diff reads the bundle's
    threads (main thread first, then the others by count)."""
    ends = of_type(jsonl(diff(bundle, bundle, "--format", "jsonl")), "pair_end")
    assert all(e["same"] for e in ends)
    return [ends[0]["a"]["insns"]] + sorted(e["a"]["insns"] for e in ends[1:])


@pytest.mark.parametrize("config", [(), NO_MTC], ids=["mtc", "tsc-only"])
def test_cpu_mode_threads_taking_turns_split_as_thread_mode_records_them(work, config):
    """Threads of one process on one CPU, with the clock MTC packets tell
    (time alone places the switches) and with TSC packets only (exact,
    but a new thread resumes at its creator's clone return, so where a
    thread left off must know who made it): each thread's flow has what a
    --mode thread recording of the same run holds, to the instruction,
    and diff finds the worker that did other work."""
    need("taskset")
    exe = build(work, "turns_mt", TURNS_MT_C, "-O1", "-pthread", "-static")
    tag = "mtc" if not config else "tsc"
    cpu = {k: record(work / f"turns-mt-{tag}-cpu-{k}", exe, k, aslr=False,
                     cpu=0, extra=config) for k in ("e", "o")}
    thr = record(work / f"turns-mt-{tag}-thread-o", exe, "o", aslr=False,
                 cpu=0, mode="thread", extra=config)
    assert all(_interleaved(b) for b in cpu.values())
    got, want = _flows(cpu["o"]), _flows(thr)
    # the workers alike; the main thread's join may wait or not (where
    # the workers are then)
    assert got[1:] == want[1:] and len(got) == 4
    seen = sum(s["instructions_observed"] for s in
               json.loads((cpu["o"] / "manifest.json").read_text())["streams"])
    assert sum(got) == seen
    # the workers part where argv tells them apart (which worker goes with
    # which is the sideband's creation order: the engine's, not checked)
    recs = jsonl(diff(cpu["e"], cpu["o"], "--format", "jsonl", "--max", "0"))
    divs = [d for d in of_type(recs, "divergence") if d["pair"] > 1]
    line = f"turns_mt.c:{line_of(TURNS_MT_C, 'odd')}"
    assert divs and divs[0]["function"] == "worker"
    assert divs[0]["branch"]["line"].endswith(line)
    assert {d["function"] for d in divs} <= {"worker", "work", "other"}


# One thread hopping between two CPUs, a system call every few
# instructions (its pieces are many round trips: a disable and an enable
# per call)
HOP_CALLS_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>
static volatile long sink;
static void hop(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}
int main(void)
{
    int fd = open("/dev/null", O_WRONLY);
    char c = 'y';
    for (int r = 0; r < 8; r++) {
        hop(r & 1);
        for (int i = 0; i < 2000; i++) {
            write(fd, &c, 1);
            sink += i;
        }
    }
    printf("%ld\n", sink);
    return 0;
}
"""


def test_a_thread_moving_between_cpus_joins_alike_on_plain_rows(work):
    """cpu mode, a thread making system calls on both CPUs: its pieces
    joined on the streams' plain rows are those joined on their items
    (slice for slice, the rows made items), each call's round trip going
    on in the slice before it; two runs compare equal, and the Python
    twin says exactly what the compiled core does."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one host CPU: the thread cannot move")
    from hwtrace.diff import cpumerge
    from hwtrace.diff.threads import all_threads, threads_of
    from hwtrace.flow import plain
    from hwtrace.streams import open_bundle
    exe = build(work, "hopcalls", HOP_CALLS_C, "-O1", "-static")
    a, b = (record(work / f"hopcalls-{k}", exe, aslr=False) for k in "ab")
    (t,) = all_threads(threads_of(open_bundle(a)))
    assert len(t.streams) == 2 and not t.shared

    def pieces(rows: bool) -> list:
        out = []
        for p in cpumerge.merged_batches(
                [(st.info.cpu, st.batches(view=True, resync=True, space_items=True,
                                          plain_events=rows))
                 for st in t.streams], t.left):
            assert rows or p.plain is None
            out.append(p.plain is not None and len(p.plain))
            p = plain.classic(p)
            out.append((p.blocks.tobytes(), p.first_insn,
                        [(int(i), int(o), repr(it)) for i, o, it in p.items]))
        return out
    on_rows = pieces(True)
    assert any(on_rows[0::2])               # (the rows were there)
    assert on_rows[1::2] == pieces(False)[1::2]
    calls = sum(it.count("'disabled'") for _b, _f, its in on_rows[1::2]
                for _i, _o, it in its)
    assert calls >= 8 * 2000 and len(on_rows) // 2 < calls // 10
    r = diff(a, b, "--format", "jsonl")
    assert r.returncode == 0, r.stdout
    assert of_type(jsonl(r), "summary")[0]["same"] is True
    twin = run_hwtrace("diff", a, b, "--format", "jsonl",
                       env={"HWTRACE_NO_EXTENSIONS": "1"})
    assert twin.stdout == r.stdout and twin.returncode == 0


def test_processes_are_named_by_the_programs_they_ran(work):
    """A forked child that execs another program is named as calls and
    the exports name it, ``fe -> true``, not by its truncated command
    name; the record keeps ``comm`` and adds ``program``."""
    from conftest import FORK_EXEC_C, build_programs
    exe = build_programs(work, {"fe": FORK_EXEC_C})["fe"]
    true = shutil.which("true")
    out = record(work / "fe-true", exe, true, mode="thread")
    text = diff(out, out)
    assert text.returncode == 0, text.stderr
    child = [ln for ln in text.stdout.splitlines()
             if ln.startswith("process ") and "(fe -> true)" in ln]
    assert child, text.stdout
    recs = jsonl(diff(out, out, "--format", "jsonl"))
    progs = {p["a"]["program"] for p in of_type(recs, "process")}
    assert progs == {"fe", "fe -> true"}, progs
    assert {p["a"]["comm"] for p in of_type(recs, "pair")} >= {"fe"}


FORK_EXEC_ARG_C = r"""
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[1], argv[1], argv[2], (char *)0);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return 0;
}
"""

PICK_C = r"""
#include <stdlib.h>
static volatile int sink;
__attribute__((noinline)) void left(void) { sink = 1; }
__attribute__((noinline)) void right(void) { sink = 2; }
__attribute__((noinline)) void pick(int n) { if (n > 1) left(); else right(); }
int main(int argc, char **argv) { pick(atoi(argv[1])); return 0; }
"""


@pytest.mark.parametrize("how", ["thread", "cpu"])
def test_an_exec_empties_the_call_stack(work, how):
    """The frames open when a process execs (the forked child's call to
    execl) never return: the new program's call stack begins at its own
    ``_start``, as deep as the program is, not below the old program's
    frames named by whatever the new one maps at their addresses."""
    fx = build(work, "fx", FORK_EXEC_ARG_C, "-O1")
    pick = build(work, "pick", PICK_C, "-O1")
    opts = {"mode": "thread"} if how == "thread" else {"cpu": 0}
    a = record(work / f"pick1-{how}", fx, pick, 1, **opts)
    b = record(work / f"pick2-{how}", fx, pick, 2, **opts)
    recs = jsonl(diff(a, b, "--format", "jsonl", "--max", "1"))
    (d,) = [r for r in of_type(recs, "divergence") if r["function"] == "pick"]
    assert d["stack"][0] == "_start", d["stack"]
    assert d["stack"][-2:] == ["main", "pick"], d["stack"]
    assert d["depth"] == len(d["stack"]) <= 5, d["stack"]


def test_a_call_stack_both_runs_share_is_printed_once(fib):
    """The frames both runs share are listed once, not beside a column of
    "(same)"."""
    out = diff(fib[10], fib[11], "--max", "1").stdout
    assert "call stack, outermost first (the same in A and B):" in out, out
    assert "(same)" not in out and " | " not in out


# -- a hardware recording ------------------------------------------------------------------

def test_perf_import_of_a_cpu_wide_recording(tmp_path, hardware):
    """perf's CPU-wide context switches name every task that ran on the CPU
    (idle, kernel threads, perf itself): only the traced process's threads
    are paired, and a real Intel PT recording compares equal with itself."""
    fx = FIXTURES / "hase_loopy"
    out = tmp_path / "loopy"
    r = run_hwtrace("import", "-o", out, "--image", fx / "loopy",
                    fx / "loopy-20180404T162955.perf")
    assert r.returncode == 0, r.stderr
    recs = jsonl(diff(out, out, "--format", "jsonl"))
    (p,) = of_type(recs, "pair")
    assert p["a"]["tid"] == p["b"]["tid"] == 19233 and p["a"]["comm"] == "loopy"
    end = of_type(recs, "pair_end")[0]
    assert end["same"] and end["a"]["insns"] == end["b"]["insns"] == 57
    assert of_type(recs, "summary")[0]["same"] is True


def test_lldb_import_of_a_multi_core_recording(tmp_path, hardware):
    """LLDB's per-CPU capture of a 3-thread process (context switches of
    every task on those CPUs): each CPU's stream is one traced thread's,
    and the recording compares equal with itself, thread by thread."""
    fx = FIXTURES / "lldb_intelpt" / "intelpt-multi-core-trace"
    out = tmp_path / "mc"
    r = run_hwtrace("import", "-o", out, fx / "trace.json")
    assert r.returncode == 0, r.stderr
    recs = jsonl(diff(out, out, "--format", "jsonl"))
    pairs = of_type(recs, "pair")
    assert len(pairs) == 2
    assert all(p["a"]["pid"] == 3497234 and p["a"]["tid"] == p["b"]["tid"]
               for p in pairs)
    ends = of_type(recs, "pair_end")
    assert all(e["same"] and e["a"]["insns"] == e["b"]["insns"] > 0
               for e in ends)
    assert of_type(recs, "summary")[0]["same"] is True


# -- bad input ---------------------------------------------------------------------------

def _one_line_error(r):
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_missing_bundle(fib, tmp_path):
    msg = _one_line_error(diff(fib[10], tmp_path / "nope"))
    assert "nope" in msg


def test_bundle_without_streams(fib, tmp_path):
    empty = tmp_path / "empty"
    shutil.copytree(fib[10], empty)
    m = json.loads((empty / "manifest.json").read_text())
    m["streams"] = []
    (empty / "manifest.json").write_text(json.dumps(m))
    msg = _one_line_error(diff(empty, fib[10]))
    assert "no streams" in msg


def test_cpu_stream_of_several_processes_without_switches(work, tmp_path):
    """Nothing says which process ran when: one line, not a wrong answer."""
    need("taskset")
    exe = build(work, "forky", FORK_C, "-O1")
    b = record(tmp_path / "fork-cpu", exe, cpu=0)
    lines = (b / "sideband.jsonl").read_text().splitlines()
    (b / "sideband.jsonl").write_text("".join(
        f"{line}\n" for line in lines if json.loads(line)["type"] != "switch"))
    msg = _one_line_error(diff(b, b))
    assert "no context switches" in msg and "--mode thread" in msg


def test_bad_thread_options(fib):
    assert "A:TID=B:TID" in _one_line_error(
        diff(fib[10], fib[11], "--thread", "12=13"))
    assert "no thread 1 in A" in _one_line_error(
        diff(fib[10], fib[11], "--thread", "A:1=B:2"))
    assert "--max" in _one_line_error(diff(fib[10], fib[11], "--max", "-1"))

"""``calls`` over a cpu-mode recording, arranged by thread
(:mod:`hwtrace.branches.threadcalls`): one section per thread, in the
order the threads first appear, headed ``thread T (program)`` as a
``--mode thread`` recording's are, each activation one line with all its
instructions however often its thread was switched out or moved; the
first thread's section written as it goes, the others' held until their
turn (``hwtrace.cli._spool.TextSpools``)."""

from __future__ import annotations

import argparse
import collections
import io
import re
import subprocess
import sys

import pytest

from conftest import build_programs, run_hwtrace

# three workers each running a fixed amount of work, yielding the CPU
# between rounds: every thread is switched out many times
THREADS = r"""
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
static volatile long sink;
__attribute__((noinline)) void work(long n){ for(long i=0;i<n;i++) sink+=i^n; }
__attribute__((noinline)) void *run(void *a){ long n=(long)a;
    for(int k=0;k<20;k++){ work(n); sched_yield(); } return 0; }
int main(){ pthread_t t[3];
    for(long i=0;i<3;i++) pthread_create(&t[i],0,run,(void*)(300+i*100));
    for(int i=0;i<3;i++) pthread_join(t[i],0);
    printf("%ld\n",sink); return 0; }
"""

ENVS = [pytest.param({}, id="compiled"),
        pytest.param({"HWTRACE_NO_EXTENSIONS": "1"}, id="python")]


@pytest.fixture(scope="module")
def threads(tmp_path_factory):
    d = tmp_path_factory.mktemp("thr")
    # (bound at load: which thread's first call resolves a symbol lazily
    # would be the scheduler's choice)
    exe = build_programs(d, {"thr": THREADS}, "-lpthread", "-Wl,-z,now")["thr"]
    out = {}
    for mode in ("cpu", "thread"):
        r = run_hwtrace("record", "--mode", mode, "-o", d / mode, "--", exe)
        assert r.returncode == 0, r.stderr
        out[mode] = d / mode
    return out


def _sections(text: str) -> dict:
    """{header: [lines]} in order."""
    out: dict = {}
    cur = None
    for x in text.splitlines():
        if not x.startswith(" "):
            cur = x
            assert cur not in out, f"{cur} twice"
            out[cur] = []
        else:
            out[cur].append(x)
    return out


def _counts(lines: list, name: str) -> list:
    return [int(m.group(1).replace(",", "")) for x in lines
            if (m := re.match(rf" +{name} +([\d,]+) insns", x))]


def test_a_cpu_mode_recording_prints_a_section_per_thread(threads):
    r = run_hwtrace("calls", threads["cpu"])
    assert r.returncode == 0, r.stderr
    secs = _sections(r.stdout)
    heads = list(secs)
    assert len(heads) == 4 and all(re.fullmatch(r"thread \d+ \(thr\):", h)
                                   for h in heads), heads
    # the main thread appeared first; each worker's section is its own
    assert _counts(secs[heads[0]], "main") or \
        any(re.match(r" +main ", x) for x in secs[heads[0]]), secs[heads[0]][:20]
    assert "[tid " not in r.stdout
    assert "switched out" not in r.stdout and "goes on after" not in r.stdout
    runs = []
    for h in heads[1:]:
        lines = secs[h]
        assert len([x for x in lines if re.match(r" +start_thread ", x)]) == 1, lines[:20]
        rs = _counts(lines, "run")
        assert len(rs) == 1, lines[:20]            # one run, whole
        runs += rs
        assert len(_counts(lines, "work")) == 20
    # the workers' runs count what a thread-mode recording's count
    t = run_hwtrace("calls", threads["thread"])
    assert t.returncode == 0, t.stderr
    theirs = _sections(t.stdout)
    assert len(theirs) == 4
    assert sorted(runs) == sorted(c for h in theirs for c in _counts(theirs[h], "run"))
    mine_work = collections.Counter(c for h in heads for c in _counts(secs[h], "work"))
    their_work = collections.Counter(c for h in theirs for c in _counts(theirs[h], "work"))
    assert mine_work == their_work


def test_compiled_and_twin_write_the_same_bytes(threads):
    outs = []
    for env in ({}, {"HWTRACE_NO_EXTENSIONS": "1"}):
        r = run_hwtrace("calls", threads["cpu"], env=env)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1]


def test_calls_head_gets_the_first_thread_s_first_lines(threads):
    """``calls DIR | head -n 5``: the first lines are the first thread's,
    and the command ends quietly when the reader goes."""
    full = run_hwtrace("calls", threads["cpu"], check=True).stdout.splitlines()
    p = subprocess.Popen([sys.executable, "-m", "hwtrace", "calls", str(threads["cpu"])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = [p.stdout.readline().rstrip("\n") for _ in range(5)]
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=300)
    assert first == full[:5]
    assert p.returncode == 0 and "Traceback" not in err, err


class _Probe:
    """A ThreadCalls' out: what was written before the writer closed."""

    def __init__(self):
        self.buf = io.StringIO()
        self.at_close = None

    def write(self, s):
        self.buf.write(s)

    def flush(self):
        pass


def test_the_first_thread_goes_out_as_it_goes_the_others_at_their_turn(threads):
    from hwtrace.branches.threadcalls import ThreadCalls
    from hwtrace.cli._spool import TextSpools
    from hwtrace.cli._views import decode_into
    from hwtrace.cli.calls import _times

    out = _Probe()
    spools = TextSpools(memory=64)          # most of it through the file

    class Probe(ThreadCalls):
        def threads_gone(self, tids):
            # (what was out before the first thread ended: its exit, the
            # process's end, is told once its CPU's stream is decoded)
            if out.at_close is None and self._order and \
                    self._order[0].h._info.tid in tids:
                out.at_close = out.buf.getvalue()
            super().threads_gone(tids)

        def close(self):
            if out.at_close is None:
                out.at_close = out.buf.getvalue()
            super().close()

    w = Probe(None, out=out, hold=spools)
    args = argparse.Namespace(input=str(threads["cpu"]), elf=[], image_path=[],
                              clock="auto", tsc_hz=None)
    decode_into(args, [w], label="calls", opened=lambda inp: _times(w, inp))
    w.close()
    text = out.buf.getvalue()
    assert text == run_hwtrace("calls", threads["cpu"], check=True).stdout
    heads = [x for x in text.splitlines() if not x.startswith(" ")]
    early = [x for x in out.at_close.splitlines() if not x.startswith(" ")]
    # before the first thread ended: its section only, and lines of it
    assert early == heads[:1] and len(out.at_close.splitlines()) > 100
    assert spools.file is not None          # the rest waited in the file


def test_text_spools_keep_order_through_memory_and_file():
    from hwtrace.cli._spool import TextSpools
    pool = TextSpools(memory=10)
    a, b = pool(), pool()
    a.write("abc")
    b.write(b"xyz\xe2\x82\xac")
    a.write("defghijkl\u20ac")           # past the memory: to the file
    b.write("12")
    a.write(b"\xed\xa0\x80 raw")
    assert list(a) == ["abc", "defghijkl\u20ac", b"\xed\xa0\x80 raw"]
    assert list(b) == [b"xyz\xe2\x82\xac", "12"]
    a.close()
    b.close()
    assert pool.used == 0


# the main thread ends first (pthread_exit), its worker goes on
ENDS_FIRST = r"""
#include <pthread.h>
#include <sched.h>
static volatile long sink;
__attribute__((noinline)) void work(long n){ for(long i=0;i<n;i++) sink+=i^n; }
void *run(void *a){ for(int k=0;k<50;k++){ work(2000); sched_yield(); } return 0; }
int main(){ pthread_t t; pthread_create(&t,0,run,0); work(100); pthread_exit(0); }
"""


def test_a_thread_that_ends_hands_over_to_the_next(tmp_path):
    """The first thread's section is done once it ran for the last time
    (its last context switch switched it out): the next thread's section
    is written then, and goes on as it goes -- before the run's end."""
    import shutil
    from hwtrace.branches.threadcalls import ThreadCalls
    from hwtrace.cli._views import decode_into
    from hwtrace.cli.calls import _times
    if not shutil.which("taskset"):
        pytest.skip("no taskset")
    exe = build_programs(tmp_path, {"ends": ENDS_FIRST}, "-lpthread")["ends"]
    b = tmp_path / "b"
    # on one host CPU: the threads take turns, each exit a context switch
    r = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "hwtrace", "record",
                        "-o", str(b), "--", str(exe)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    out = _Probe()

    class Probe(ThreadCalls):
        def close(self):
            out.at_close = out.buf.getvalue()
            super().close()

    w = Probe(None, out=out)
    args = argparse.Namespace(input=str(b), elf=[], image_path=[], clock="auto",
                              tsc_hz=None)
    decode_into(args, [w], label="calls", opened=lambda inp: _times(w, inp))
    w.close()
    text = out.buf.getvalue()
    assert text == run_hwtrace("calls", b, check=True).stdout
    heads = list(_sections(text))
    assert len(heads) == 2, heads
    early = [x for x in out.at_close.splitlines() if not x.startswith(" ")]
    assert early == heads
    # the worker's whole run, after the main thread's section
    assert len(_counts(_sections(text)[heads[1]], "run")) == 1


def test_a_thread_back_after_its_end_keeps_every_instruction(threads):
    """Were the sideband wrong -- a thread running again after what
    looked like its last switch out -- its lines cut short there, and
    what it ran after, in a section of its own, count every instruction
    once."""
    from hwtrace.analysis.records import Flag
    from hwtrace.branches.threadcalls import ThreadCalls
    from hwtrace.cli._views import decode_into
    from hwtrace.cli.calls import _times

    out = _Probe()
    told = []

    class Early(ThreadCalls):
        def add_slices(self, chunk, ctx):
            super().add_slices(chunk, ctx)
            X = chunk.exits
            out_ = X[(X["flags"] & int(Flag.SWITCHED_OUT)) != 0] if len(X) else X
            if self._by_thread and not told and len(out_):
                told.append(int(out_["tid"][0]))
                self.threads_gone(told)

    w = Early(None, out=out)
    args = argparse.Namespace(input=str(threads["cpu"]), elf=[], image_path=[],
                              clock="auto", tsc_hz=None)
    _inp, totals, _p = decode_into(args, [w], label="calls",
                                   opened=lambda inp: _times(w, inp))
    w.close()
    text = out.buf.getvalue()
    heads = [x for x in text.splitlines() if not x.startswith(" ")]
    assert told and len(heads) >= 4, heads
    assert "(open" not in text
    top = sum(int(m.group(1).replace(",", "")) for x in text.splitlines()
              if (m := re.match(r"  (?:end of )?\S+ +([\d,]+) insns", x)))
    assert top == totals["insns"]


def _without_last_switch_out(src, dst, tid: int) -> None:
    """A copy of bundle ``src`` whose sideband has no switch out of thread
    ``tid`` after its last run (the one that ended it names no thread
    going out) and its exit recorded then -- as the emulated engine
    writes the last thread to run on a CPU, where nothing ran after it."""
    import json
    import shutil
    shutil.copytree(src, dst)
    recs = [json.loads(x) for x in (src / "sideband.jsonl").read_text().splitlines()]
    outs = [r for r in recs if r["type"] == "switch" and r["prev_tid"] == tid]
    last = max(outs, key=lambda r: r["time"])
    last["prev_tid"] = last["prev_pid"] = -1
    for r in recs:
        if r["type"] == "exit" and r["tid"] == tid:
            r["time"] = last["time"]
    (dst / "sideband.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_a_thread_whose_exit_is_recorded_hands_over_there(tmp_path):
    """A thread whose last run ends with its exit and no switch out of it
    (the sideband's exit record says it ended) ends its section there:
    the next thread's section is written then, before the run's end --
    and the text is what the recording with the switch out prints."""
    import shutil
    from hwtrace.branches.threadcalls import ThreadCalls
    from hwtrace.cli._views import decode_into
    from hwtrace.cli.calls import _times
    if not shutil.which("taskset"):
        pytest.skip("no taskset")
    exe = build_programs(tmp_path, {"ends": ENDS_FIRST}, "-lpthread")["ends"]
    b = tmp_path / "b"
    r = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "hwtrace", "record",
                        "-o", str(b), "--", str(exe)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    import json
    main = next(json.loads(x)["pid"] for x in (b / "sideband.jsonl").read_text().splitlines()
                if json.loads(x)["type"] == "process")
    e = tmp_path / "e"
    _without_last_switch_out(b, e, main)
    out = _Probe()

    class Probe(ThreadCalls):
        def close(self):
            out.at_close = out.buf.getvalue()
            super().close()

    w = Probe(None, out=out)
    args = argparse.Namespace(input=str(e), elf=[], image_path=[], clock="auto",
                              tsc_hz=None)
    decode_into(args, [w], label="calls", opened=lambda inp: _times(w, inp))
    w.close()
    text = out.buf.getvalue()
    assert text == run_hwtrace("calls", e, check=True).stdout
    assert text == run_hwtrace("calls", b, check=True).stdout
    heads = list(_sections(text))
    assert len(heads) == 2 and heads[0] == f"thread {main} (ends):", heads
    early = [x for x in out.at_close.splitlines() if not x.startswith(" ")]
    assert early == heads


# a thread moving between CPUs (sched_setaffinity) inside functions of
# more than ``CallHistory.hold`` (16 K) lines each
HOPS_LONG = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
static volatile long sink;
__attribute__((noinline)) int f(int x){ return x*3+1; }
__attribute__((noinline)) void leaf(int i){ for(int k=0;k<25000;k++) sink+=f(k^i); }
__attribute__((noinline)) void hop(int cpu){ cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu,&s);
    sched_setaffinity(0,sizeof s,&s); leaf(cpu); }
__attribute__((noinline)) void outer(int n){ for(int i=0;i<n;i++){ hop(i&1); leaf(i);} }
int main(){ outer(12); printf("%ld\n", sink); return 0; }
"""


def test_a_pause_is_no_open_line_where_long_lines_come_after_it(tmp_path):
    """The ``[untraced]`` frame of a thread switched out (no instruction
    in it: its own stream has none) is dropped before the rows after it
    come: else more than ``hold`` lines behind it, waiting, wrote it early
    as ``(open: ...)`` -- for good, with no ``end of`` line."""
    import os
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two host CPUs")
    exe = build_programs(tmp_path, {"hops": HOPS_LONG})["hops"]
    b = tmp_path / "b"
    r = run_hwtrace("record", "--mode", "cpu", "-o", b, "--", exe)
    assert r.returncode == 0, r.stderr
    text = run_hwtrace("calls", b, check=True).stdout
    opens = collections.Counter(m.group(1) for x in text.splitlines()
                                if (m := re.match(r" +(\S+) +\(open", x)))
    ends = collections.Counter(m.group(1) for x in text.splitlines()
                               if (m := re.match(r" +end of (\S+) ", x)))
    assert "[untraced]" not in text
    # (every line written early has its totals where it ends, but the
    # first thread's outermost ones, open when the trace ended)
    assert all(ends[k] == v for k, v in opens.items()
               if k not in ("_start", "__libc_start_main@GLIBC_2.2.5",
                            "__libc_start_call_main", "main", "outer")), (opens, ends)


# two threads in loops of user code, on one host CPU: each preempted
# there (no system call) while the other runs
PREEMPTED = r"""
#include <pthread.h>
static volatile long sink;
__attribute__((noinline)) void step(long i){ sink+=i; }
__attribute__((noinline)) void work(long n){ for(long i=0;i<n;i++) step(i); }
void *run(void *a){ work(2000000); return 0; }
int main(){ pthread_t t; pthread_create(&t,0,run,0); work(2000000); pthread_join(t,0);
    return 0; }
"""


def test_a_thread_preempted_in_its_code_shows_the_pause_as_its_own_stream(tmp_path):
    """A thread preempted in user code while another ran has an
    ``[untraced]`` frame there in its own stream (``--mode thread``);
    by thread, a cpu-mode recording's section shows it too -- only the
    one that stood for a move from CPU to CPU, nothing else run for the
    thread meanwhile, is no line (the hopping test's)."""
    import shutil
    if not shutil.which("taskset"):
        pytest.skip("no taskset")
    exe = build_programs(tmp_path, {"pre": PREEMPTED}, "-lpthread", "-Wl,-z,now")["pre"]
    pauses = {}
    for mode in ("cpu", "thread"):
        b = tmp_path / mode
        r = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "hwtrace", "record",
                            "--mode", mode, "-o", str(b), "--", str(exe)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        lines = run_hwtrace("calls", b, check=True).stdout.splitlines()
        found = [(lines[k - 1].split()[0], x.split()[1:]) for k, x in enumerate(lines)
                 if x.strip().startswith("[untraced]")]
        # each a pause of no instruction; most between two steps of the
        # loop (the scheduler may also take a thread off elsewhere: in
        # pthread_join's wait, at its start or end)
        assert all(rest == ["0", "insns"] for _, rest in found), found
        pauses[mode] = sum(p == "step" for p, _ in found)
    assert pauses["thread"] and pauses["cpu"], pauses

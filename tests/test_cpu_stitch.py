"""Cpu mode: a thread's call stack follows it from CPU to CPU.

The views feed a cpu-mode bundle's CPU streams in time order through
builders sharing their threads (:mod:`hwtrace.export.interleave`): a
thread that moves to another CPU goes on there with its stack
(``[switched out]`` on the CPU it left, ``[goes on after a switch]``
where it goes on), and the tree is the one a ``--mode thread`` recording
of the same program gives."""

from __future__ import annotations

import collections
import os
import re

import pytest

from conftest import build_programs, run_hwtrace

# one thread hopping between two CPUs (the emulated engine passes the
# affinity to the host: its thread really moves)
HOPPING = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
static volatile long sink;
__attribute__((noinline)) void leaf(int i){ for(int k=0;k<20000;k++) sink+=k^i; }
__attribute__((noinline)) void hop(int cpu){ cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu,&s);
    sched_setaffinity(0,sizeof s,&s); leaf(cpu); }
__attribute__((noinline)) void outer(int n){ for(int i=0;i<n;i++){ hop(i&1); leaf(i);} }
int main(){ outer(6); printf("%ld\n", sink); return 0; }
"""

ENVS = [pytest.param({}, id="compiled"),
        pytest.param({"HWTRACE_NO_EXTENSIONS": "1"}, id="python")]


@pytest.fixture(scope="module")
def hopping(tmp_path_factory):
    """The hopping program recorded in cpu mode and in thread mode."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one host CPU: the thread cannot move")
    d = tmp_path_factory.mktemp("hop")
    exe = build_programs(d, {"hop": HOPPING})["hop"]
    out = {}
    for mode in ("cpu", "thread"):
        r = run_hwtrace("record", "--mode", mode, "-o", d / mode, "--", exe)
        assert r.returncode == 0, r.stderr
        out[mode] = d / mode
    return out


def _summary(bundle, env) -> dict:
    r = run_hwtrace("summary", "--top", "1000", bundle, env=env)
    assert r.returncode == 0, r.stderr
    rows = {}
    for x in r.stdout.splitlines():
        m = re.match(r"(\S+) +([\d,]+) +([\d,]+) +[\d.]+% +([\d,]+)", x)
        if m and m.group(1) not in rows:
            rows[m.group(1)] = tuple(int(v.replace(",", "")) for v in m.groups()[1:])
    return rows


def _subtree(text: str, name: str) -> list:
    """The lines of ``name``'s first activation and its callees, as
    (depth, text without the indent)."""
    lines = text.splitlines()
    i = next(k for k, x in enumerate(lines) if re.match(rf" *{name} ", x))
    d0 = len(lines[i]) - len(lines[i].lstrip())
    out = []
    for x in lines[i:]:
        d = len(x) - len(x.lstrip())
        if out and (d <= d0 or not x.startswith(" ")):
            break
        out.append((d, x.strip()))
    return out


@pytest.mark.parametrize("env", ENVS)
def test_a_thread_moving_between_cpus_keeps_its_stack(hopping, env):
    """calls arranges a cpu-mode recording by thread: the hopping
    thread's activations are whole (one line each with every CPU's
    instructions, not a ``[switched out]`` slice and ``[goes on after a
    switch]`` ones) and its tree is the one ``--mode thread`` prints."""
    import json
    d = json.loads(run_hwtrace("info", hopping["cpu"], "--json", check=True).stdout)
    ran = [s for s in d["streams"] if s["instructions_observed"] > 100000]
    assert len(ran) == 2, d["streams"]          # it did run on both CPUs
    r = run_hwtrace("calls", hopping["cpu"], env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    heads = [x for x in lines if not x.startswith(" ")]
    assert len(heads) == 1 and re.fullmatch(r"thread \d+ \(hop\):", heads[0]), heads
    outer = [x for x in lines if x.strip().startswith("outer ")]
    assert len(outer) == 1 and "[" not in outer[0], outer
    assert not [x for x in lines if "switched out" in x or "goes on after" in x]
    inside = [x for x in lines if re.match(r"\s+(main|outer|hop|leaf) ", x)]
    assert inside and not [x for x in inside if "began before" in x], r.stdout
    # main's tree (depths, names, counts) is thread mode's
    t = run_hwtrace("calls", hopping["thread"], env=env)
    assert t.returncode == 0, t.stderr
    assert re.fullmatch(r"thread \d+ \(hop\):", t.stdout.splitlines()[0])
    mine, theirs = _subtree(r.stdout, "main"), _subtree(t.stdout, "main")
    assert len(mine) > 12 and mine == theirs


@pytest.mark.parametrize("env", ENVS)
def test_cpu_mode_counts_what_thread_mode_counts(hopping, env):
    cpu, thr = _summary(hopping["cpu"], env), _summary(hopping["thread"], env)
    for f in ("main", "outer", "hop", "leaf"):
        assert cpu[f] == thr[f], (f, cpu[f], thr[f])
    assert cpu["outer"][0] == 1 and cpu["hop"][0] == 6 and cpu["leaf"][0] == 12


def _folded(bundle, path) -> collections.Counter:
    r = run_hwtrace("export", "--folded", path, bundle)
    assert r.returncode == 0, r.stderr
    c = collections.Counter()
    for x in path.read_text().splitlines():
        stack, w = x.rsplit(" ", 1)
        c[stack] += int(w)
    return c


def test_cpu_mode_folded_stacks_are_thread_modes(hopping, tmp_path):
    cpu = _folded(hopping["cpu"], tmp_path / "cpu.folded")
    thr = _folded(hopping["thread"], tmp_path / "thread.folded")
    mine = {k: v for k, v in cpu.items() if ";main;" in k or k.startswith("main")}
    theirs = {k: v for k, v in thr.items() if ";main;" in k or k.startswith("main")}
    assert mine == theirs


def test_coverage_asked_for_too_changes_no_other_export(hopping, tmp_path):
    """``export --folded F --drcov D`` fed the CPU streams one by one (the
    coverage wanted them so), not in time order: the thread that moved
    lost its stack at each move, and F differed from ``export --folded F``
    alone.  Now every export comes from the time-ordered run, and the
    coverage is the one the streams give one by one."""
    alone = tmp_path / "alone.folded"
    run_hwtrace("export", hopping["cpu"], "--folded", alone, check=True)
    cov = {}
    for how in ("alone", "with"):
        f = tmp_path / f"{how}.drcov"
        extra = ["--folded", tmp_path / "with.folded", "--chrome", tmp_path / "c.json"] \
            if how == "with" else []
        r = run_hwtrace("export", hopping["cpu"], "--drcov", f, "--lcov", tmp_path / f"{how}.info",
                        *extra)
        assert r.returncode == 0, r.stderr
        cov[how] = (f.read_bytes(), (tmp_path / f"{how}.info").read_text())
    assert (tmp_path / "with.folded").read_text() == alone.read_text()
    assert cov["with"] == cov["alone"]
    assert b"/hop\n" in cov["with"][0] and "end_of_record" in cov["with"][1]


# ------------------------------------------------------------------ units

def _slices(builder) -> list:
    out = []
    for ch in builder.take_slices():
        out.append(("E", ch.enters.tolist()))
        out.append(("X", ch.exits.tolist()))
        out.append(("M", [(s, m.kind, m.index, m.detail) for s, m in ch.markers]))
    return out


def _flat(parts) -> tuple:
    """The rows, with their sequence numbers (which count the clock's
    anchors too, one per run of records) as ranks: their order."""
    from hwtrace.analysis.slices import SLICE
    es, xs = SLICE.names.index("eseq"), SLICE.names.index("xseq")
    rows = {"E": [], "X": [], "M": []}
    for k, v in parts:
        rows[k] += v
    seqs = sorted({r[es] for r in rows["E"] + rows["X"]} |
                  {r[xs] for r in rows["X"]} | {m[0] for m in rows["M"]})
    rank = {q: i for i, q in enumerate(seqs)}

    def ranked(r):
        r = list(r)
        r[es] = rank.get(r[es], r[es])
        r[xs] = rank.get(r[xs], r[xs])
        return tuple(r)
    return ([ranked(r) for r in rows["E"]], [ranked(r) for r in rows["X"]],
            [(rank[m[0]], *m[1:]) for m in rows["M"]])


def test_a_stream_cut_at_every_enable_builds_what_it_builds_whole(hopping):
    """The interleaving cuts a stream's batches where tracing is enabled:
    fed whole or cut at every enable, a builder makes the same slices."""
    from hwtrace.analysis.callstack import CallStackBuilder
    from hwtrace.cli._inputs import open_input
    from hwtrace.flow.batchcut import cut_at_enables
    inp = open_input(str(hopping["cpu"]))
    cuts = 0
    for s in inp.streams:
        outs = []
        for cut in (False, True):
            b = CallStackBuilder(s.info, inp.symbolizer.lookup)
            parts = []
            for batch in s.batches(max_records=1 << 18):
                pieces = cut_at_enables(batch) if cut else [batch]
                cuts += len(pieces) - 1
                assert sum(p.ninsn for p in pieces) == batch.ninsn
                for p in pieces:
                    b.feed_batch(p)
                    parts += _slices(b)
            b.finish()
            parts += _slices(b)
            outs.append((_flat(parts), b.names.names))
        assert outs[0] == outs[1]
    assert cuts > 10


def _item_key(item):
    j, off, x = item
    return j, off, type(x).__name__, tuple((a, getattr(x, a, None))
                                           for a in getattr(x, "__slots__", ()))


def test_cutting_plain_rows_is_cutting_their_items(hopping):
    """A batch whose plain events are rows (what the views decode) is cut
    at the same enables, at the same places, into the same pieces as the
    batch with every event an item -- found on the rows' columns, the
    rows made no Event."""
    from hwtrace.cli._inputs import open_input
    from hwtrace.flow import plain
    from hwtrace.flow.batchcut import Places, cut_at_enables, enables
    inp = open_input(str(hopping["cpu"]))
    seen = 0
    for s in inp.streams:
        for batch in s.batches(max_records=1 << 12, plain_events=True):
            if batch.plain is None or not len(batch.plain):
                continue
            whole = plain.classic(batch)
            en = enables(batch)
            assert en == enables(whole)
            places = Places(batch)
            assert [places.record(j) for j in range(places.n + 1)] == \
                [it[0] for it in whole.items] + [len(batch.blocks)]
            got, ref = cut_at_enables(batch), cut_at_enables(whole)
            assert len(got) == len(ref)
            for p, q in zip(got, ref):
                assert p.first_insn == q.first_insn
                assert p.blocks.tobytes() == q.blocks.tobytes()
                assert [_item_key(x) for x in plain.classic(p).items] == \
                    [_item_key(x) for x in q.items]
            seen += len(en)
    assert seen > 10


def test_the_spool_gives_back_its_chunks_in_order():
    import numpy as np
    from hwtrace.analysis.slices import Cols, Slices
    from hwtrace.cli._spool import Spool
    sp = Spool(memory=1)
    chunks = []
    for k in range(5):
        E = Cols.zeros(3)
        E["id"] = np.arange(3) + 10 * k
        chunks.append(Slices(E, Cols.zeros(k), [(k, "m")]))
        sp.add(chunks[-1])
    got = list(sp)
    sp.close()
    assert [c.enters["id"].tolist() for c in got] == \
        [c.enters["id"].tolist() for c in chunks]
    assert [len(c.exits) for c in got] == list(range(5))
    assert [c.markers for c in got] == [c.markers for c in chunks]


def _outer_slices(bundle, path) -> list:
    import json
    r = run_hwtrace("export", "--chrome", path, bundle)
    assert r.returncode == 0, r.stderr
    d = json.loads(path.read_text())
    ev = d["traceEvents"] if isinstance(d, dict) else d
    return sorted((e["ts"], e["dur"]) for e in ev
                  if e.get("ph") == "X" and e.get("name") == "outer")


def test_a_thread_leaving_a_cpu_ends_its_slices_there_when_it_leaves(hopping, tmp_path):
    """The slices on the CPU a thread left end when it left (that CPU's
    clock, idle, jumps to when it runs next before tracing resumes):
    the thread's slices follow each other, as long as thread mode's one
    activation."""
    cpu = _outer_slices(hopping["cpu"], tmp_path / "cpu.json")
    (thr,) = _outer_slices(hopping["thread"], tmp_path / "thread.json")
    assert len(cpu) > 1
    for (t0, d0), (t1, _d1) in zip(cpu, cpu[1:]):
        assert t0 + d0 <= t1 + 1.0, cpu
    total = sum(d for _t, d in cpu)
    assert abs(total - thr[1]) <= 0.01 * thr[1], (total, thr)


def test_a_stale_enable_time_is_cut_where_the_counted_clock_puts_it():
    """A counted clock (the emulated engine: one tick an instruction) times
    an enable by the count since the last time stamp when no timing packet
    came since (its own TSC is stale).  A stream fed up to another's next
    piece (``limit``) is cut at the first enable whose *counted* time is
    at or after it -- cut by the stale stamps, its builder switched in, at
    its later real time, a thread the other CPU still ran: that CPU's
    stretch up to it went to no thread (``thread unknown:``)."""
    import numpy as np
    from hwtrace.export.interleave import _next_enable
    # enables at places 1, 3, 5 (records 1, 2, 3), all stamped 1000
    cols = (np.array([1, 3, 5]), np.array([1, 2, 3]), np.array([1000, 1000, 1000]))
    start = np.array([100, 110, 130, 160, 200])     # instructions before each record
    clock = ((1000.0, 100, 1.0), start)             # time 1000 at instruction 100
    # counted: 1010, 1030, 1060
    assert _next_enable(cols, 0, 0, 0, 1020, clock) == 1
    assert _next_enable(cols, 0, 0, 0, 1060, clock) == 2
    assert _next_enable(cols, 0, 0, 0, 1061, clock) == 3
    # a later stamp moves the count on from there: 1500, then 1530
    cols2 = (cols[0], cols[1], np.array([1000, 1500, -1]))
    assert _next_enable(cols2, 0, 0, 0, 1400, clock) == 1
    assert _next_enable(cols2, 0, 0, 0, 1531, clock) == 3
    assert _next_enable(cols2, 0, 0, 0, 1530, clock) == 2
    # the stamps alone: every enable at 1000, none at or after 1020
    assert _next_enable(cols, 0, 0, 0, 1020) == 3


THREADS = r"""
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
static volatile long sink;
__attribute__((noinline)) long work(long n){ long s=0; for(long i=0;i<n;i++) s+=i^n; return s; }
void *run(void *a){ long n=(long)a; for(int k=0;k<50;k++){ sink+=work(n); sched_yield(); } return 0; }
int main(){ pthread_t t[3];
    for(long i=0;i<3;i++) pthread_create(&t[i],0,run,(void*)(20000+i*1000));
    for(int i=0;i<3;i++) pthread_join(t[i],0); printf("%ld\n",sink); return 0; }
"""


def test_ptrace_cpu_mode_threads_all_have_their_code(tmp_path):
    """The ptrace engine interleaves threads finely, its enables often
    with stale time stamps: every instruction of a cpu-mode recording's
    ``calls`` is some thread's (no ``thread unknown:`` section; about one
    recording in three had one), and each worker's ``run`` is one
    activation."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one host CPU")
    exe = build_programs(tmp_path, {"thr": THREADS})["thr"]
    b = tmp_path / "b"
    r = run_hwtrace("record", "--engine", "ptrace", "-o", b, "--", exe)
    assert r.returncode == 0, r.stderr
    out = run_hwtrace("calls", b, check=True).stdout
    heads = [x for x in out.splitlines() if not x.startswith(" ")]
    assert len(heads) == 4 and all(re.fullmatch(r"thread \d+ \(thr\):", h)
                                   for h in heads), heads
    runs = [x for x in out.splitlines() if re.match(r" +run ", x)]
    assert len(runs) == 3, runs


def test_a_thread_is_gone_only_once_its_last_rows_left_its_builder():
    """A thread's last run ended on a CPU (its builder is past the switch
    out of it), but its last rows wait in the builder for that CPU's next
    time stamp to time them: told gone then, ``calls`` wrote those rows
    as a second section of the same thread (seen on a loaded machine,
    about one ptrace recording in fifteen: ``thread 2979`` twice, its
    exit's system call alone in the second)."""
    from types import SimpleNamespace

    from hwtrace.analysis.clock import TimeBase
    from hwtrace.analysis.rows import Pending
    from hwtrace.export.interleave import _past_last_runs

    time = TimeBase()
    pending = Pending(time)
    row = (7, -1, 0x1000, 0, 0, 0, 100, 12, 5, 9, 1, 2, 0, 0.0, 0.0, 0, 0.0)
    pending.exits.add_row(row)              # thread 12's, no time stamp yet
    assert pending.holds(12) and not pending.holds(13)
    pending.markers.append((3, 9, "lost", None, "", 13))
    assert pending.holds(13)
    b = SimpleNamespace(_follow=SimpleNamespace(i=5), pending=pending)
    # (switch index, tid) of the last runs, taken from the end
    runs = [(4, 11), (2, 12), (1, 10)]
    assert _past_last_runs(runs, b, False) == [10]      # 12 waits for its rows
    assert runs == [(4, 11), (2, 12)]
    assert _past_last_runs(runs, b, True) == [12, 11]   # the stream ended
    pending.exits.take(lambda seq: len(seq))            # (timed and handed out)
    pending.markers.clear()
    assert not pending.holds(12) and not pending.holds(13)
    runs = [(4, 11), (2, 12)]
    b._follow.i = 3
    assert _past_last_runs(runs, b, False) == [12]      # 11: not past it yet
    assert runs == [(4, 11)]

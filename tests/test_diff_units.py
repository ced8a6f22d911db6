"""hwtrace.diff's pieces on hand-made flows: steps, call stacks, the
aligner, the pair counter, CPU-stream joining, thread pairing and
relocation."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from hwtrace.diff import align, counting, cpumerge, cpusplit, relocate, stack, steps
from hwtrace.diff.symtab import Module, SymTab
from hwtrace.diff.threads import (Process, Thread, ThreadsError, pair,
                                  parse_override)
from hwtrace.flow.batches import BLOCK, Batch, ErrorItem
from hwtrace.flow.events import Event
from hwtrace.x86.insn import IClass

O, C, R, J, JC, FC = (int(IClass.OTHER), int(IClass.CALL), int(IClass.RETURN),
                      int(IClass.JUMP), int(IClass.COND_JUMP),
                      int(IClass.FAR_CALL))


def batch(recs, items=(), first=0, at=0):
    """recs: (ip, end_ip, ninsn, iclass, size); record i's trace offset
    is 16 * (at + i)."""
    b = np.zeros(len(recs), BLOCK)
    for i, (ip, end, n, c, sz) in enumerate(recs):
        b[i] = (ip, end, 16 * (at + i), 0, n, c, sz, 3, 0)
    return Batch(b, None, list(items), first)


def split(recs, k):
    """recs as batches of at most k records."""
    return [batch(recs[i:i + k], at=i) for i in range(0, len(recs), k)] or \
        [batch([])]


def all_steps(batches, **kw):
    return steps.read_all(batches, **kw)


# -- steps ---------------------------------------------------------------------------

def test_records_cut_without_a_branch_join_into_one_step():
    recs = [(0x100, 0x104, 2, O, 4),        # cut (a PSB, say): goes on at 0x108
            (0x108, 0x10a, 1, JC, 2),
            (0x200, 0x210, 5, O, 3),        # not followed by 0x213: a new step
            (0x300, 0x301, 1, R, 1)]
    for k in (1, 2, 3, 4):
        s = all_steps(split(recs, k))
        assert [(int(x["rip"]), int(x["rend"]), int(x["n"])) for x in s] == \
            [(0x100, 0x10a, 3), (0x200, 0x210, 5), (0x300, 0x301, 1)], k
        assert s["idx"].tolist() == [0, 3, 8]
        assert s["off"].tolist() == [0, 32, 48]


def test_a_gap_splits_and_marks_the_step_after_it():
    recs = [(0x100, 0x104, 2, O, 4), (0x108, 0x10a, 1, JC, 2)]
    b = batch(recs, items=[(1, 20, ErrorItem("error", 20, 0x108, "lost"))])
    s = all_steps([b])
    assert [(int(x["rip"]), int(x["gap"])) for x in s] == [(0x100, 0), (0x108, 1)]
    # the same gap at the very end of a batch applies to the next one
    b1 = batch(recs[:1], items=[(1, 20, Event("overflow"))])
    s2 = all_steps([b1, batch(recs[1:])])
    assert [(int(x["rip"]), int(x["gap"])) for x in s2] == [(0x100, 0), (0x108, 1)]


def test_calls_returns_and_depth():
    recs = [(0x100, 0x105, 2, C, 5),        # call 0x400
            (0x400, 0x401, 1, C, 5),        # call to its own fall-through: no call
            (0x406, 0x407, 1, FC, 2),       # syscall back to the next insn: no call
            (0x409, 0x40a, 1, R, 1),        # return to 0x10a
            (0x10a, 0x10b, 1, R, 1)]        # return out of the traced start
    s = all_steps(split(recs, 2))
    assert s["delta"].tolist() == [1, 0, 0, -1, -1]
    assert s["depth"].tolist() == [0, 1, 1, 1, 0]
    # whatever the batch boundaries, the same steps (whole records)
    for k in (1, 3, 4, 5):
        assert (all_steps(split(recs, k)) == s).all(), k


def test_translate_reads_addresses_in_the_other_runs_terms():
    recs = [(0x100, 0x104, 2, JC, 2)]
    s = all_steps([batch(recs)], translate=lambda a: a + np.uint64(0x1000))
    assert (int(s[0]["ip"]), int(s[0]["end"]), int(s[0]["rip"])) == \
        (0x1100, 0x1104, 0x100)


# -- stack ---------------------------------------------------------------------------

def test_shadow_stack_matches_a_step_by_step_stack():
    rng = random.Random(7)
    for trial in range(50):
        n = rng.randrange(1, 200)
        st = np.zeros(n, steps.STEP)
        st["delta"] = [rng.choice((1, 1, 0, -1, -1)) for _ in range(n)]
        st["rend"] = np.arange(n) + 1000
        naive: list = []
        for d, site in zip(st["delta"].tolist(), st["rend"].tolist()):
            if d > 0:
                naive.append(site)
            elif d < 0 and naive:
                naive.pop()
        sh = stack.ShadowStack()
        cuts = sorted(rng.sample(range(n + 1), min(3, n + 1)))
        prev = 0
        for c in cuts + [n]:
            sh.advance(st[prev:c])
            prev = c
        assert sh.sites == naive, trial


# -- the aligner -----------------------------------------------------------------------

H = (0x100, 0x10a, 4, JC, 2)     # loop header: taken -> body, else exit
BODY = (0x200, 0x20e, 5, J, 2)   # back to the header
X = (0x10c, 0x120, 6, J, 2)      # after the loop
T = (0x300, 0x308, 3, R, 1)      # the rest


def run(a_recs, b_recs, k=3, **kw):
    ra = steps.StepReader(split(a_recs, k))
    rb = steps.StepReader(split(b_recs, k))
    return list(align.compare(ra, rb, **kw)), ra, rb


def test_identical_flows_have_no_divergence():
    flow = [H, BODY, H, BODY, H, X, T]
    divs, ra, rb = run(flow, flow, k=2)
    assert divs == [] and ra.insns == rb.insns == 4 * 3 + 5 * 2 + 6 + 3


def test_loop_run_longer_meets_after_the_loop():
    a = [H, BODY, H, X, T]
    b = [H, BODY, H, BODY, H, BODY, H, X, T]
    divs, _ra, _rb = run(a, b)
    (d,) = divs
    assert (d.a.ip, d.b.ip) == (X[0], BODY[0])
    assert d.a.idx == d.b.idx == 4 + 5 + 4
    assert d.a.prev[1] == H[1]                          # the deciding branch
    r = d.region
    assert (r.a_insns, r.b_insns) == (0, 2 * (5 + 4))
    ma, mb = r.meet
    assert ma.ip == mb.ip == X[0] and r.depth == d.a.depth


def test_a_trace_that_ends_never_meets():
    a = [H, BODY, H, X, T]
    b = [H, BODY, H]
    (d,), _ra, _rb = run(a, b)
    assert d.a.ip == X[0] and d.b.ip is None
    assert d.region.meet is None and d.region.why == "b-ended"
    assert d.region.a_insns == 6 + 3


def test_max_divergences_stops_and_says_so():
    a = [H, X, T, H, X, T]
    b = [H, BODY, H, X, T, H, BODY, H, X, T]
    divs, _ra, _rb = run(a, b)
    assert len(divs) == 2
    status: dict = {}
    divs, ra, rb = run(a, b, max_divergences=1, status=status)
    assert len(divs) == 1 and status["more"]
    assert ra.done and rb.done


def test_calls_after_the_divergence_are_not_meeting_points():
    call = (0x100, 0x105, 2, C, 5)          # call f
    f1 = (0x400, 0x40a, 3, JC, 2)           # f: taken -> f2, else f3
    f2 = (0x500, 0x502, 1, R, 1)
    f3 = (0x40c, 0x40d, 1, R, 1)
    back = (0x10a, 0x110, 2, J, 2)
    a = [call, f1, f3, back, T]
    b = [call, f1, f2, back, T]
    (d,), _ra, _rb = run(a, b)
    assert d.a.stack == [0x105] and d.a.depth == 1
    assert d.region.meet[0].ip == back[0] and d.region.depth == 0


def test_the_same_callee_from_other_call_sites_is_no_meeting_point():
    """Both runs call g after parting, from different call sites: g's code
    runs in frames the other run never had, so they meet after, in the
    frame that was open when they parted."""
    top = (0x100, 0x10a, 4, JC, 2)          # taken -> 0x700, else 0x10c
    site1 = (0x10c, 0x110, 2, C, 5)         # call g from 0x110
    site2 = (0x700, 0x704, 2, C, 5)         # call g from 0x704
    g = (0x900, 0x904, 2, R, 1)
    after1 = (0x115, 0x118, 1, J, 2)        # -> join
    after2 = (0x709, 0x70c, 1, J, 2)        # -> join
    join = (0x800, 0x808, 3, R, 1)
    a = [top, site1, g, after1, join]
    b = [top, site2, g, after2, join]
    (d,), _ra, _rb = run(a, b)
    ma, mb = d.region.meet
    assert ma.ip == mb.ip == join[0]
    assert (d.region.a_calls, d.region.b_calls) == (1, 1)
    assert d.region.a_callees == d.region.b_callees == {0x900: 1}


def test_after_lost_data_the_runs_meet_where_the_trace_resumes():
    """B lost the call into f and f's first steps: B resumes inside f at a
    depth it can't know; the runs meet at that step, B's depth is re-based
    on A's, and the rest compares equal."""
    call = (0x100, 0x105, 2, C, 5)
    f1 = (0x400, 0x40a, 3, JC, 2)
    f2 = (0x40c, 0x410, 2, J, 2)
    ret = (0x500, 0x501, 1, R, 1)
    back = (0x10a, 0x110, 2, R, 1)
    a = [call, f1, f2, ret, back]
    rb_batches = [batch([ret, back], items=[(0, 4, Event("overflow"))])]
    ra = steps.StepReader(split(a, 2))
    rb = steps.StepReader(rb_batches)
    (d,) = list(align.compare(ra, rb))
    assert d.b.gap and (d.a.ip, d.b.ip) == (call[0], ret[0])
    r = d.region
    assert r.how == "after lost data" and r.meet[0].ip == ret[0]
    assert (r.a_insns, r.b_insns) == (2 + 3 + 2, 0)
    assert r.meet[1].depth == r.meet[0].depth == 1
    assert r.meet[1].stack == r.meet[0].stack == [0x105]
    assert ra.depth == rb.depth == -1 and rb.gaps == 1


def test_a_trace_that_begins_later_meets_where_it_begins():
    """A circular buffer kept only A's newest trace: A begins at a step B
    runs later; they meet there, and the rest is the same."""
    b = [H, BODY, H, BODY, H, X, T]
    late = b[1:]
    (d,), ra, rb = run(late, b)
    assert (d.a.ip, d.b.ip) == (BODY[0], H[0]) and d.a.prev is None
    r = d.region
    assert r.how == "where A's trace begins"
    assert (r.a_insns, r.b_insns) == (0, 4)
    assert r.meet[0].ip == r.meet[1].ip == BODY[0]
    assert (r.meet[0].idx, r.meet[1].idx) == (0, 4)
    assert ra.insns == rb.insns - 4
    (d,), _ra, _rb = run(b, late)
    assert d.region.how == "where B's trace begins"
    assert (d.region.a_insns, d.region.b_insns) == (4, 0)


def test_lost_data_resuming_inside_a_step_meets_at_its_tail():
    """B resumes at a PSB+ written inside a basic block: its first step is
    the tail of a step A ran whole.  A also runs that tail alone elsewhere
    (a jump into the block) -- the place the two stay in step wins, A's
    step is split where B picks up, and the rest compares equal."""
    call = (0x100, 0x105, 2, C, 5)
    f1 = (0x400, 0x40a, 3, JC, 2)
    whole = (0x40c, 0x410, 3, J, 2)         # 0x40c, 0x40e, 0x410
    decoy = (0x40e, 0x410, 2, J, 2)         # the same code, jumped into
    tail = decoy
    ret = (0x500, 0x501, 1, R, 1)
    back = (0x10a, 0x110, 2, R, 1)
    a = [call, f1, decoy, f1, whole, ret, back]
    ra = steps.StepReader(split(a, 2))
    rb = steps.StepReader([batch([tail, ret, back],
                                 items=[(0, 4, Event("overflow"))])])
    (d,) = list(align.compare(ra, rb))
    assert d.b.gap and d.b.ip == tail[0]
    r = d.region
    assert r.how == "after lost data"
    ma, mb = r.meet
    assert ma.ip == mb.ip == tail[0]
    lost = 2 + 3 + 2 + 3 + 1                # up to whole's second insn
    assert (ma.idx, mb.idx) == (lost, 0)
    assert (r.a_insns, r.b_insns) == (lost, 0)
    assert ma.depth == mb.depth == 1 and ra.insns - rb.insns == lost


@pytest.mark.parametrize("begins", [(4 + 2, 0), (None, None)])
def test_a_trace_that_begins_inside_a_step_meets_at_its_tail(begins):
    """A circular buffer kept A's trace from a PSB+ inside BODY: A's first
    step is BODY's tail, which B never runs alone; they meet there (at
    the index the recorder's count gives, when it gives one)."""
    b = [H, BODY, H, BODY, H, X, T]
    late = [(0x206, 0x20e, 3, J, 2)] + b[2:]        # BODY's last 3 insns
    (d,), ra, rb = run(late, b, begins=begins)
    r = d.region
    assert r.how == "where A's trace begins"
    ma, mb = r.meet
    assert ma.ip == mb.ip == 0x206 and (ma.idx, mb.idx) == (0, 4 + 2)
    assert (r.a_insns, r.b_insns) == (0, 4 + 2)
    assert rb.insns - ra.insns == 4 + 2


def test_window_gives_up():
    a = [H, X] + [T] * 10
    b = [H, BODY] * 50
    (d,), _ra, _rb = run(a, b, window=20)
    assert d.region.meet is None and d.region.why == "window"


# -- counting ------------------------------------------------------------------------------

def test_pair_counter_is_exact_even_when_buckets_collide():
    rng = random.Random(3)
    pc = counting.PairCounter(bits=4)         # tiny: collisions, growth
    want: Counter = Counter()
    for _ in range(20):
        a = np.array([rng.randrange(50) for _ in range(300)], np.uint64)
        b = np.array([rng.randrange(3) for _ in range(300)], np.uint64)
        pc.add(a, b)
        want.update(zip(a.tolist(), b.tolist()))
    fa, fb, c = pc.items()
    assert dict(zip(zip(fa.tolist(), fb.tolist()), c.tolist())) == dict(want)
    assert list(zip(fa.tolist(), fb.tolist())) == sorted(want)
    xa = np.array([1, 2, 999], np.uint64)
    xb = np.array([0, 7, 0], np.uint64)
    hit = counting.pairs_in(xa, xb, fa, fb)
    assert hit.tolist() == [(1, 0) in want, (2, 7) in want, False]


# -- CPU streams ---------------------------------------------------------------------------

def ev(kind, **kw):
    return Event(kind, **kw)


def test_a_thread_that_moved_between_cpus_is_joined_in_order():
    s1 = (0x100, 0x10a, 4, JC, 2)
    s2 = (0x10c, 0x110, 2, J, 2)
    s3 = (0x200, 0x204, 2, FC, 2)       # syscall at 0x204: resumes at 0x206
    s4 = (0x206, 0x208, 1, R, 1)
    # cpu0: s1 then interrupted before 0x10c; later s4 after the syscall
    cpu0 = [batch([s1], [(0, 0, ev("enabled", ip=0x100)),
                         (1, 5, ev("async_disabled", at=0x10c))]),
            batch([s4], [(0, 9, ev("enabled", ip=0x206))])]
    # cpu1: goes on at 0x10c, runs s2, s3, disabled at the syscall
    cpu1 = [batch([s2, s3], [(0, 0, ev("enabled", ip=0x10c)),
                             (2, 7, ev("disabled", ip_suppressed=True))])]
    for order in ((0, 1), (1, 0)):
        streams = [(0, iter(cpu0)), (1, iter(cpu1))]
        streams = [streams[i] for i in order]
        got = [int(r["ip"]) for b in cpumerge.merged_batches(streams)
               for r in b.blocks]
        assert got == [0x100, 0x10c, 0x200, 0x206], order


def test_round_trips_go_on_in_one_slice_where_the_merge_takes_them_anyway(monkeypatch):
    """A thread making system calls on cpu0, then (migrated) on cpu1 --
    whose head starts where every call returns, at a time among them: the
    round trips before that time go on in the slice the first began
    (merged_batches would take cpu0's next segment anyway), the rest as
    when every segment is a slice of its own; the records come in the same
    order."""
    body = (0x200, 0x204, 3, FC, 2)         # syscall at 0x204: back at 0x206
    ret = (0x206, 0x20a, 2, J, 2)           # ... and jumps back to 0x200

    def calls(n, t0, cpu_items):
        recs, items = [], [(0, 0, ev("enabled", ip=0x200, has_tsc=True, tsc=t0))]
        for i in range(n):
            recs += [body, ret]
            items += [(2 * i + 1, 10 * i, ev("disabled", ip_suppressed=True, has_tsc=True,
                                             tsc=t0 + 10 * i + 5)),
                      (2 * i + 1, 10 * i + 1, ev("enabled", ip=0x206, has_tsc=True,
                                                 tsc=t0 + 10 * i + 9))]
        items += cpu_items
        return recs, items
    r0, i0 = calls(40, 100, [(80, 999, ev("disabled", ip_suppressed=True, has_tsc=True,
                                             tsc=600))])
    # cpu1: the thread migrated here, back from a call at 250
    r1, i1 = [ret], [(0, 0, ev("enabled", ip=0x206, has_tsc=True, tsc=250))]
    for i in range(5):
        r1 += [body, ret]
        i1 += [(2 * i + 2, 500 + 10 * i, ev("disabled", ip_suppressed=True, has_tsc=True,
                                            tsc=700 + 10 * i)),
               (2 * i + 2, 501 + 10 * i, ev("enabled", ip=0x206, has_tsc=True,
                                            tsc=704 + 10 * i))]

    def merged():
        streams = [(0, iter([batch(r0, i0)])), (1, iter([batch(r1, i1)]))]
        bs = list(cpumerge.merged_batches(streams))
        return [int(r["ip"]) for b in bs for r in b.blocks], len(bs)
    got, n = merged()
    with monkeypatch.context() as m:
        m.setattr(cpumerge, "_round_trips", lambda *a: 0)
        ref, n_ref = merged()
    assert got == ref
    assert n_ref > 40 and n < 10
    # (40 round trips: more than the first window _round_trips weighs)
    assert cpumerge._WINDOW < 40


def _lost_at(streams, **kw):
    """The merged records' ips, and the record index of each LostItem."""
    ips, lost = [], []
    for b in cpumerge.merged_batches(streams, **kw):
        for idx, _off, it in b.items:
            if isinstance(it, cpumerge.LostItem):
                lost.append((len(ips) + idx, it.cpu))
        ips += [int(r["ip"]) for r in b.blocks]
    return ips, lost


def test_a_stream_that_ends_inside_a_segment_leaves_a_gap():
    """cpu0's stream ends inside a segment (no disable: the rest was lost)
    and the thread goes on in cpu1's: what ran between is unknown, so the
    step that resumes is after a gap, not the branch target of cpu0's
    last record; the StepReader counts it."""
    s1 = (0x100, 0x10a, 4, J, 2)        # jumps to 0x200 ...
    s2 = (0x230, 0x234, 2, R, 1)        # ... but the trace goes on here
    cpu0 = [batch([s1], [(0, 0, ev("enabled", ip=0x100, has_tsc=True, tsc=1))])]
    cpu1 = [batch([s2], [(0, 0, ev("enabled", ip=0x230, has_tsc=True, tsc=9))])]
    ips, lost = _lost_at([(0, iter(cpu0)), (1, iter(cpu1))])
    assert ips == [0x100, 0x230] and lost == [(1, 0)]
    r = steps.StepReader(cpumerge.merged_batches(
        [(0, iter(list(cpu0))), (1, iter(list(cpu1)))]))
    got = steps.concat(list(r))
    assert got["gap"].tolist() == [0, 1] and r.gaps == 1


def test_a_stopped_stream_leaves_a_gap_even_after_a_disable():
    """A stop-on-full buffer that filled right after a system call's
    disable: the thread may have run on untraced before it moved, so the
    next segment (at the call's return, where every call returns) is
    after a gap; a stream that was not stopped joins with none."""
    s1 = (0x200, 0x204, 3, FC, 2)       # syscall at 0x204: back at 0x206
    s2 = (0x206, 0x20a, 2, J, 2)
    cpu0 = [batch([s1], [(0, 0, ev("enabled", ip=0x200, has_tsc=True, tsc=1)),
                         (1, 3, ev("disabled", ip_suppressed=True, has_tsc=True, tsc=2))])]
    cpu1 = [batch([s2], [(0, 0, ev("enabled", ip=0x206, has_tsc=True, tsc=9))])]
    ips, lost = _lost_at([(0, iter(list(cpu0))), (1, iter(list(cpu1)))], stopped={0})
    assert ips == [0x200, 0x206] and lost == [(1, 0)]
    ips, lost = _lost_at([(0, iter(list(cpu0))), (1, iter(list(cpu1)))])
    assert ips == [0x200, 0x206] and lost == []
    # the last stream's end is followed by nothing: no gap
    ips, lost = _lost_at([(0, iter(list(cpu0)))], stopped={0})
    assert lost == []


def test_a_wrapped_streams_first_segment_after_another_is_after_a_gap():
    s1 = (0x200, 0x204, 3, FC, 2)
    s2 = (0x206, 0x20a, 2, J, 2)
    cpu0 = [batch([s1], [(0, 0, ev("enabled", ip=0x200, has_tsc=True, tsc=1)),
                         (1, 3, ev("disabled", ip_suppressed=True, has_tsc=True, tsc=2))])]
    cpu1 = [batch([s2], [(0, 0, ev("enabled", ip=0x206, has_tsc=True, tsc=9))])]
    ips, lost = _lost_at([(0, iter(list(cpu0))), (1, iter(list(cpu1)))], wrapped={1})
    assert ips == [0x200, 0x206] and lost == [(1, 1)]
    # wrapped, but taken first: nothing of the thread came before it
    ips, lost = _lost_at([(0, iter(list(cpu0))), (1, iter(list(cpu1)))], wrapped={0})
    assert lost == []


def test_both_runs_lose_data_before_the_same_step_one_divergence():
    """A lost the call's body (its stream ended) and B lost data right
    before the same return step: one divergence, where they meet, and the
    rest compares equal (B's own gap is accounted for by the meeting)."""
    call = (0x100, 0x105, 2, C, 5)
    f1 = (0x400, 0x40a, 3, JC, 2)
    ret = (0x500, 0x501, 1, R, 1)
    back = (0x10a, 0x110, 2, R, 1)
    tail = (0x600, 0x604, 2, J, 2)
    ra = steps.StepReader([batch([call]),
                           batch([ret, back, tail],
                                 items=[(0, 4, cpumerge.LostItem(0, 16))])])
    rb = steps.StepReader([batch([call, f1]),
                           batch([ret, back, tail], items=[(0, 4, Event("overflow"))])])
    divs = list(align.compare(ra, rb))
    assert len(divs) == 1
    d = divs[0]
    assert d.a.gap and d.region.meet is not None
    assert ra.gaps == rb.gaps == 1


def test_equal_times_are_ordered_by_who_left_first():
    a = (0x100, 0x10a, 4, JC, 2)
    b = (0x300, 0x304, 2, R, 1)
    cpu0 = [batch([b], [(0, 0, ev("enabled", ip=0x300, has_tsc=True, tsc=5))])]
    cpu1 = [batch([a], [(0, 0, ev("enabled", ip=0x100, has_tsc=True, tsc=5)),
                        (1, 3, ev("async_disabled", at=0x999))])]
    got = [int(r["ip"]) for b_ in cpumerge.merged_batches(
        [(0, iter(cpu0)), (1, iter(cpu1))], left={1: 10}) for r in b_.blocks]
    assert got == [0x100, 0x300]


def _random_stream(rng, cpu):
    """A CPU stream of random segments (a few addresses, so that where
    one stops and where another goes on often meet; times often equal
    or missing), cut into batches at random: what merged_batches must
    join the same way however its events come (items or plain rows)."""
    recs, items = [], []
    ips = (0x200, 0x204, 0x206)
    size = {0x200: 4, 0x204: 2, 0x206: 4}

    def add(*what):
        items.append((len(recs), 16 * len(recs) + len(items), *what))
    traced = rng.random() < 0.3                 # began traced: no enable
    for _ in range(rng.randrange(1, 40)):
        if not traced:
            kw = {"has_tsc": True, "tsc": rng.randrange(5)} if rng.random() < 0.7 else {}
            add(ev("enabled", ip=rng.choice(ips), **kw))
        if rng.random() < 0.1:              # a run of system calls
            for _k in range(rng.randrange(10, 80)):
                recs.append((0x200, 0x202, 2, FC, 2))
                add(ev("disabled", ip_suppressed=True))
                kw = {"has_tsc": True, "tsc": rng.randrange(5)} if rng.random() < 0.7 else {}
                add(ev("enabled", ip=0x204, **kw))
        for _k in range(rng.choice((0, 1, 1, 2, 3))):
            ip = rng.choice(ips)
            recs.append((ip, ip + size[ip] - 2, 2, rng.choice((J, FC, O)), 2))
            if rng.random() < 0.2:
                add(ev("cbr", ratio=rng.randrange(1, 40)))
            if rng.random() < 0.1:          # a PSB+ restating the state
                add(ev("enabled", ip=rng.choice(ips), status_update=True))
        if rng.random() < 0.1:
            break                               # ends inside the segment
        if rng.random() < 0.3:
            add(ev("async_disabled", at=rng.choice(ips + (0,))))
        else:
            add(ev("disabled", ip_suppressed=True,
                   **({"has_tsc": True, "tsc": rng.randrange(5)}
                      if rng.random() < 0.5 else {})))
        if rng.random() < 0.1:
            add(ev("disabled", status_update=True))
        traced = False
    # cut into batches (an item at a cut goes with either side)
    cuts = sorted(rng.sample(range(len(recs) + 1), min(len(recs) + 1, rng.randrange(4))))
    out, r0, k = [], 0, 0
    for r1 in cuts + [len(recs)]:
        its = []
        while k < len(items) and (items[k][0] < r1 or (
                items[k][0] == r1 and (r1 == len(recs) or rng.random() < 0.5))):
            idx, off, it = items[k]
            its.append((idx - r0, off, it))
            k += 1
        b = batch(recs[r0:r1], its, first=2 * r0, at=r0)
        out.append(b)
        r0 = r1
    return out


def _as_rows(b):
    """``b`` with the events a plain row tells as rows (the compiled
    producer's ``plain_events``)."""
    from hwtrace.flow import plain
    keep, rows = plain.split(b.items)
    return b._replace(items=keep, plain=rows)


def _flat(pieces):
    """The merged pieces as (record ips and offsets, items at their
    place in the flow, pieces with the rows as items)."""
    from hwtrace.flow import plain
    recs, its, out = [], [], []
    for p in pieces:
        p = plain.classic(p)
        out.append((p.blocks.tobytes(), p.first_insn,
                    [(int(i), int(o), repr(it)) for i, o, it in p.items]))
        its += [(len(recs) + int(i), int(o), repr(it)) for i, o, it in p.items]
        recs += [(int(r["ip"]), int(r["offset"])) for r in p.blocks]
    return recs, its, out


@pytest.mark.parametrize("seed", range(200))
def test_random_streams_merge_alike_on_plain_rows_and_on_items(seed):
    """The merge reads a batch's marks on its plain rows as on its items:
    the same slices, each the same records and (rows made items) events;
    every record taken once."""
    rng = random.Random(seed)
    n = rng.choice((2, 2, 3))
    streams = [_random_stream(rng, c) for c in range(n)]
    kw = {"left": {c: rng.randrange(3) for c in range(n) if rng.random() < 0.6},
          "stopped": {c for c in range(n) if rng.random() < 0.3},
          "wrapped": {c for c in range(n) if rng.random() < 0.3}}

    def merged(rows=False):
        return _flat(cpumerge.merged_batches(
            [(c, iter([_as_rows(b) if rows else b for b in bs]))
             for c, bs in enumerate(streams)], **kw))
    assert any(len(_as_rows(b).plain) for bs in streams for b in bs)
    recs, its, pieces = merged()
    assert merged(rows=True) == (recs, its, pieces)
    assert sorted(recs) == sorted((int(r["ip"]), int(r["offset"]))
                                  for bs in streams for b in bs for r in b.blocks)


def _turns():
    """One CPU's stream, threads 7 and 9 taking turns (switches at 105 and
    115): 7 runs up to a system call, 9 until interrupted, 7 goes on after
    its system call; then (no switch left) 7 again."""
    from hwtrace.analysis.switches import SwitchTimeline
    from hwtrace.bundle import Switch
    a1 = (0x100, 0x10a, 4, JC, 2)
    a2 = (0x200, 0x204, 2, FC, 2)       # syscall at 0x204: resumes at 0x206
    b1 = (0x500, 0x508, 3, J, 2)
    a3 = (0x206, 0x208, 1, R, 1)
    a4 = (0x300, 0x302, 1, R, 1)
    cpu0 = [batch([a1, a2], [(0, 0, ev("enabled", ip=0x100, has_tsc=True, tsc=100)),
                             (2, 7, ev("disabled", ip_suppressed=True))]),
            batch([b1, a3], [(0, 9, ev("enabled", ip=0x500, has_tsc=True, tsc=106)),
                             (1, 11, ev("async_disabled", at=0x50c)),
                             (1, 12, ev("enabled", ip=0x206, has_tsc=True, tsc=116))],
                  first=6, at=3),
            batch([a4], [(0, 14, ev("disabled", ip_suppressed=True)),
                         (0, 15, ev("enabled", ip=0x300, has_tsc=True, tsc=130))],
                  first=10, at=5)]
    sw = [Switch(0, 90, -1, -1, 7, 7), Switch(0, 105, 7, 7, 9, 9),
          Switch(0, 115, 9, 9, 7, 7), Switch(1, 95, -1, -1, 3, 3)]
    return cpu0, (lambda: SwitchTimeline(sw, 0, 1.0, exact=True))


def test_a_cpu_stream_is_split_among_its_threads():
    cpu0, timeline = _turns()
    mine = list(cpusplit.own_batches(iter(cpu0), timeline(), 7))
    assert [int(r["ip"]) for b in mine for r in b.blocks] == [0x100, 0x200, 0x206, 0x300]
    assert [b.first_insn for b in mine] == [0, 9, 10]
    kinds = [it.type for b in mine for _i, _o, it in b.items]
    assert kinds == ["enabled", "disabled", "enabled", "disabled", "enabled"]
    theirs = list(cpusplit.own_batches(iter(cpu0), timeline(), 9))
    assert [int(r["ip"]) for b in theirs for r in b.blocks] == [0x500]
    assert [it.type for b in theirs for _i, _o, it in b.items] == \
        ["enabled", "async_disabled"]
    assert not list(cpusplit.own_batches(iter(cpu0), timeline(), 3))
    # 9 is not switched in again after the second batch: the walk ends
    # there, the third batch not decoded
    rest = iter(cpu0)
    told = []
    assert len(list(cpusplit.own_batches(rest, timeline(), 9,
                                         done=lambda: told.append(1)))) == 1
    assert told == [1] and next(rest) is cpu0[2]
    # the thread's segments join as they ran
    got = [int(r["ip"]) for b in cpumerge.merged_batches([(0, iter(mine))])
           for r in b.blocks]
    assert got == [0x100, 0x200, 0x206, 0x300]


def test_where_a_thread_left_off_says_who_resumes():
    """Enables the clock cannot place (no time since the first, no rate
    known): the thread that stopped right where tracing resumes is the
    one that runs (not one that comes first but stopped elsewhere), else
    one not seen yet."""
    from hwtrace.analysis.switches import SwitchTimeline
    from hwtrace.bundle import Switch
    a1 = (0x100, 0x104, 2, FC, 2)       # 7: syscall, goes on at 0x106
    b1 = (0x500, 0x504, 2, FC, 2)       # 9: syscall, goes on at 0x506
    a2 = (0x106, 0x108, 1, R, 1)
    b2 = (0x506, 0x508, 1, R, 1)
    on = [ev("enabled", ip=0x100, has_tsc=True, tsc=100)] + \
        [ev("enabled", ip=ip) for ip in (0x500, 0x106, 0x506)]
    off = ev("disabled", ip_suppressed=True)
    cpu0 = [batch([a1, b1, a2, b2], [(0, 0, on[0]), (1, 1, off), (1, 2, on[1]),
                                     (2, 3, off), (2, 4, on[2]), (3, 5, off),
                                     (3, 6, on[3])])]
    # thread 3 ran between 9 and 7, untraced (its segment came first)
    sw = [Switch(0, 100, -1, -1, 7, 7), Switch(0, 110, 7, 7, 9, 9),
          Switch(0, 110, 9, 9, 3, 3), Switch(0, 110, 3, 3, 7, 7),
          Switch(0, 110, 7, 7, 9, 9)]
    for tid, want in ((7, [0x100, 0x106]), (9, [0x500, 0x506]), (3, [])):
        tl = SwitchTimeline(sw, 0, None)
        got = [int(r["ip"]) for b in cpusplit.own_batches(iter(cpu0), tl, tid)
               for r in b.blocks]
        assert got == want, tid


def test_a_new_thread_begins_where_its_creator_left_off():
    """7 clones 9 (a system call at 0x204: both go on at 0x206), and the
    switch to 9 is due there by the exact clock: 9 runs first, though 7
    stopped right there too -- because 9, made by 7, begins there."""
    from hwtrace.analysis.switches import SwitchTimeline
    from hwtrace.bundle import Switch
    clone = (0x200, 0x204, 2, FC, 2)
    child = (0x206, 0x206, 1, R, 1)
    parent = (0x206, 0x208, 2, R, 1)
    off = ev("disabled", ip_suppressed=True)
    cpu0 = [batch([clone, child, parent],
                  [(0, 0, ev("enabled", ip=0x200, has_tsc=True, tsc=100)), (1, 1, off),
                   (1, 2, ev("enabled", ip=0x206)), (2, 3, ev("async_disabled", at=0x207)),
                   (2, 4, ev("enabled", ip=0x206))])]
    sw = [Switch(0, 100, -1, -1, 7, 7), Switch(0, 102, 7, 7, 9, 9),
          Switch(0, 103, 9, 9, 7, 7)]

    def ips(tid, born):
        tl = SwitchTimeline(sw, 0, 1.0, exact=True)
        return [int(r["ip"]) for b in cpusplit.own_batches(iter(cpu0), tl, tid, born=born)
                for r in b.blocks]
    assert ips(7, {9: 7}) == [0x200, 0x206] and ips(9, {9: 7}) == [0x206]
    assert ips(9, {}) == []         # not knowing who made it: 7 went on


# -- thread pairing ---------------------------------------------------------------------------

def th(pid, tid, time=0):
    return Thread(pid, tid, [], "p", time)


def proc(pid, threads, children=(), ppid=0):
    p = Process(pid, ppid, "p")
    p.threads = list(threads)
    p.children = list(children)
    return p


def test_pairing_follows_the_process_tree_and_creation_order():
    a = [proc(10, [th(10, 10), th(10, 11, 1), th(10, 12, 2)],
              [proc(20, [th(20, 20)]), proc(30, [th(30, 30)])])]
    b = [proc(50, [th(50, 50), th(50, 52, 1), th(50, 53, 2)],
              [proc(60, [th(60, 60)])])]
    p = pair(a, b)
    assert [(x.tid, y.tid) for x, y, _how in p.pairs] == \
        [(10, 50), (11, 52), (12, 53), (20, 60)]
    assert [t.tid for t in p.only_a] == [30] and p.only_b == []
    p2 = pair(a, b, [(11, 53)])
    assert [(x.tid, y.tid, how) for x, y, how in p2.pairs] == \
        [(10, 50, "tree"), (11, 53, "given"), (12, 52, "tree"), (20, 60, "tree")]
    with pytest.raises(ThreadsError, match="no thread 99 in A"):
        pair(a, b, [(99, 50)])
    with pytest.raises(ThreadsError, match="paired twice"):
        pair(a, b, [(11, 52), (12, 52)])
    assert parse_override("A:1=B:2") == (1, 2)
    with pytest.raises(ThreadsError):
        parse_override("1=2")


# -- relocation -------------------------------------------------------------------------------

class FakeImage:
    def __init__(self, bias, funcs):
        self.bias = bias
        self._f = funcs                      # (link address, size, name)

    def functions(self):
        for a, sz, n in self._f:
            yield a + self.bias, sz, n

    def line(self, addr):
        return None


def mod(path, build, low, size, bias, funcs, main=False):
    return Module(path, path, build, low, low + size, FakeImage(bias, funcs),
                  main)


def test_relocation_by_module_offset_and_by_symbol():
    libc = [(0x100, 0x40, "memcpy"), (0x200, 0x80, "printf")]
    a = SymTab([mod("/lib/libc.so", "aa", 0x7000, 0x1000, 0x7000, libc),
                mod("/bin/prog", "p1", 0x400000, 0x1000, 0,
                    [(0x400100, 0x20, "main"), (0x400200, 0x10, "f")], True)])
    b = SymTab([mod("/lib/libc.so", "aa", 0x9000, 0x1000, 0x9000, libc),
                mod("/bin/prog", "p2", 0x500000, 0x1000, 0,
                    [(0x500300, 0x30, "main"), (0x500400, 0x10, "g")], True),
                mod("/lib/extra.so", "ee", 0xa000, 0x100, 0xa000, [])])
    rel = relocate.relocation(a, b)
    assert rel.by == "symbol+offset"
    hows = {n.b: n.how for n in rel.notes}
    assert hows == {"/lib/libc.so": "module", "/bin/prog": "symbol",
                    "/lib/extra.so": "none"}
    x = np.array([0x9210,        # printf+0x10 in B's libc
                  0x500304,      # main+4
                  0x500325,      # main+0x25: past A's main (0x20 long)
                  0x500400,      # g: A has none
                  0xa010,        # only B has this module
                  0x123], np.uint64)   # outside every module: as it is
    got = rel(x).tolist()
    F = 1 << 63
    assert got == [0x7210, 0x400104, 0x500325 ^ F, 0x500400 ^ F, 0xa010 ^ F,
                   0x123]
    assert rel.module_names() == {"libc.so": "libc.so", "prog": "prog"}
    assert rel.how_at(0x500304) == "symbol" and rel.how_at(0x9210) == "module"


def test_symtab_lookup_table_agrees_with_the_long_way():
    """lookup names addresses from a table of the answers at every
    function and module boundary: the same ids as searching the functions
    and then the modules, everywhere -- at, just before and just after
    every boundary, and at random addresses -- with functions that overlap
    (clipped), a zero-size symbol, a function running past its module's
    end, modules without symbols and gaps between modules."""
    a = SymTab([
        mod("/lib/libc.so", "aa", 0x7000, 0x1000, 0x7000,
            [(0x100, 0x40, "memcpy"), (0x120, 0x80, "memmove"),
             (0x300, 0, "marker"), (0xf00, 0x400, "past_the_end")]),
        mod("/bin/prog", "p", 0x8000, 0x800, 0,
            [(0x8100, 0x20, "main"), (0x8200, 0x10, "f")], True),
        mod("/lib/bare.so", "bb", 0x10000, 0x100, 0x10000, []),
    ])
    edges = np.concatenate([a.starts, a.ends, a.mod_lo, a.mod_hi])
    x = np.concatenate([edges, edges - np.uint64(1), edges + np.uint64(1),
                        np.array([0, 1, 0x6fff, 0x12000, 2**64 - 1], np.uint64),
                        np.random.default_rng(7).integers(
                            0x6000, 0x11000, 5000).astype(np.uint64)])
    assert a.lookup(x).tolist() == a._lookup_each(x).tolist()
    assert a.name(a.func(0x7118)) == "memcpy"       # clipped at memmove:
    assert a.name(a.func(0x7130)) == "memmove"
    assert a.name(a.func(0x7ff0)) == "past_the_end"
    assert a.name(a.func(0x8150)) == "[prog]"
    assert a.func(0x9000) == -1 and a.func(0x10) == -1
    empty = SymTab([])
    assert empty.lookup(np.array([5], np.uint64)).tolist() == [-1]


def test_same_modules_at_the_same_place_need_no_relocation():
    f = [(0x100, 0x40, "main")]
    a = SymTab([mod("/bin/p", "x", 0x1000, 0x1000, 0x1000, f, True)])
    b = SymTab([mod("/bin/p", "x", 0x1000, 0x1000, 0x1000, f, True)])
    rel = relocate.relocation(a, b)
    assert rel.identity and rel.by == "address"


def test_a_file_mapped_twice_pairs_with_its_like():
    """A process that exec'd maps the loader once per program (a shell's
    child, then the gzip it became), at two places: each of B's pairs with
    A's at the same place.  Both used to pair with A's first, and the
    second moved by the distance between them: a divergence reported at
    the first instruction the two recordings ran alike."""
    ld = [(0x100, 0x40, "_dl_start")]
    a = SymTab([mod("/lib/ld.so", "11", 0x3000, 0x1000, 0x3000, ld),
                mod("/lib/ld.so", "11", 0x8000, 0x1000, 0x8000, ld)])
    b = SymTab([mod("/lib/ld.so", "11", 0x3000, 0x1000, 0x3000, ld),
                mod("/lib/ld.so", "11", 0x8000, 0x1000, 0x8000, ld)])
    rel = relocate.relocation(a, b)
    assert rel.identity and rel.by == "address"
    # moved alike: each by the same distance
    c = SymTab([mod("/lib/ld.so", "11", 0x4000, 0x1000, 0x4000, ld),
                mod("/lib/ld.so", "11", 0x9000, 0x1000, 0x9000, ld)])
    assert relocate.relocation(a, c)(np.array([0x4104, 0x9104], np.uint64)).tolist() \
        == [0x3104, 0x8104]


def test_steps_read_plain_rows_as_they_read_the_items():
    """A batch whose plain events are rows (hwtrace.flow.plain) gives the
    steps, the gaps and the last stop its items give -- disables (rows),
    overflows (rows: a gap), errors and async disables (items), in any
    order, the last stop a row's or an item's."""
    from hwtrace.flow import plain
    rng = random.Random(9)
    recs = [(0x100 + 16 * i, 0x108 + 16 * i, 3, [J, JC, FC, R][i % 4], 2) for i in range(40)]
    for _ in range(60):
        items = []
        for idx in sorted(rng.sample(range(0, 41), 12)):
            for _k in range(rng.randrange(1, 3)):
                c = rng.randrange(6)
                if c == 0:
                    e = ev("disabled", ip_suppressed=True, has_tsc=True, tsc=5)
                elif c == 1:
                    e = ev("disabled", ip=0x999, status_update=rng.random() < .3)
                elif c == 2:
                    e = ev("overflow", ip=0x500 + idx, status_update=rng.random() < .3)
                elif c == 3:
                    e = ErrorItem("error", idx, 0x700 + idx, "bad")
                elif c == 4:
                    e = ev("async_disabled", at=0x600 + idx, ip=0x1000)
                else:
                    e = ev("enabled", ip=0x100 + 16 * idx, has_tsc=True, tsc=7)
                items.append((idx, len(items), e))
        kept, rows = plain.split(items)
        assert len(rows) and len(kept) < len(items)
        whole = batch(recs, items)
        split_ = batch(recs, kept)._replace(plain=rows)
        outs = []
        for b in (whole, split_):
            r = steps.StepReader([b])
            outs.append((steps.concat(list(r)).tolist(), r.gaps, r.last_stop))
        assert outs[0] == outs[1]

"""Call-stack reconstruction on constructed flows with a known call tree."""

from __future__ import annotations

from collections import Counter

import pytest

from hwtrace.analysis import (Activation, CallStackBuilder, Enter, Flag,
                              Marker, StreamInfo, reconstruct,
                              reconstruct_branches)
from hwtrace.analysis.synth import FlowSynth, fib_calls, fib_flow


def acts(recs):
    return [r for r in recs if type(r) is Activation]


def check_nesting(recs):
    """Enter/Activation pair up like parentheses and slices nest."""
    stack = []
    for r in recs:
        if type(r) is Enter:
            assert r.depth == len(stack)
            if stack:
                assert r.begin >= stack[-1].begin
            stack.append(r)
        elif type(r) is Activation:
            e = stack.pop()
            assert (e.name, e.depth, e.begin, e.begin_idx) == \
                (r.name, r.depth, r.begin, r.begin_idx)
            assert r.end >= r.begin
    assert stack == []


def test_fib_call_tree_exact():
    s, items = fib_flow(7)
    recs = list(reconstruct(items, lookup=s.lookup))
    check_nesting(recs)
    a = acts(recs)
    c = Counter(x.name for x in a)
    assert c["fib"] == fib_calls(7) == 41
    assert c["main"] == 1
    # depth of fib activations: fib(7) at 1 .. deepest fib(1) at 1 + 6
    assert max(x.depth for x in a if x.name == "fib") == 7
    main = next(x for x in a if x.name == "main")
    assert main.flags == Flag.NONE        # the trace began at its entry
    top = [x for x in a if x.name == "fib" and x.depth == 1]
    assert len(top) == 1 and top[0].flags == Flag.NONE
    # the caller main returned into: a sibling, begun before the trace
    last = a[-1]
    assert last.name == "__libc_start_call_main" and last.depth == 0
    assert last.flags == Flag.BEGIN_UNKNOWN | Flag.TRUNCATED
    # instruction accounting: every instruction is in exactly one
    # activation's exclusive share
    assert sum(x.self_insns for x in a) == s.insns
    # inclusive = exclusive + callees
    for x in a:
        assert x.insns == x.self_insns + x.child_insns


def test_trace_starting_inside_a_function_marks_its_begin_unknown():
    s = FlowSynth(["main", "a"])
    s.start("main", offset=0x20)
    s.body(2); s.call("a"); s.body(1); s.ret(); s.body(1)
    a = acts(reconstruct(s.take(), lookup=s.lookup))
    assert [(x.name, x.func, x.flags) for x in a] == [
        ("a", s.addr["a"], Flag.NONE),
        ("main", s.addr["main"], Flag.BEGIN_UNKNOWN | Flag.TRUNCATED)]


def test_fib_leaf_sizes():
    s, items = fib_flow(3)
    a = acts(reconstruct(items, lookup=s.lookup))
    leaves = [x for x in a if x.name == "fib" and x.child_insns == 0]
    # fib(1)/fib(0): 5 + 2 + ret
    assert {x.insns for x in leaves} == {8}
    assert len(leaves) == 3


def test_instruction_clock_times_are_indices():
    s, items = fib_flow(4)
    b = CallStackBuilder(lookup=s.lookup, clock="insns")
    recs = list(reconstruct(items, builder=b))
    assert b.clock.unit == "insns"
    for x in acts(recs):
        assert (x.begin, x.end) == (x.begin_idx, x.end_idx)


def test_tsc_interpolation_between_ticks():
    # 10 TSC ticks per instruction, ticks every 7 instructions: interpolated
    # times must be exactly 10 * index (+ origin)
    s, items = fib_flow(5, repeat=2, tsc_per_insn=10, tick_every=7)
    b = CallStackBuilder(lookup=s.lookup)
    recs = list(reconstruct(items, builder=b))
    assert b.clock.unit == "tsc"
    a = acts(recs)
    assert Counter(x.name for x in a)["fib"] == 2 * fib_calls(5)
    fib = [x for x in a if x.name == "fib"]
    t0 = fib[0].begin - 10 * fib[0].begin_idx
    for x in fib:
        assert x.begin == pytest.approx(t0 + 10 * x.begin_idx)
        assert x.end == pytest.approx(t0 + 10 * x.end_idx)
    check_nesting(recs)


def test_tsc_frequency_gives_nanoseconds():
    s, items = fib_flow(3, tsc_per_insn=2, tick_every=1)
    b = CallStackBuilder(lookup=s.lookup, tsc_hz=2e9)   # 2 ticks = 1 ns
    a = acts(reconstruct(items, builder=b))
    assert b.clock.unit == "ns"
    fib = [x for x in a if x.name == "fib" and x.depth == 1][0]
    assert fib.duration == pytest.approx(fib.insns)


def test_auto_clock_falls_back_to_insns_when_no_timing():
    s, items = fib_flow(10)
    b = CallStackBuilder(lookup=s.lookup, max_pending=100)
    recs = list(reconstruct(items, builder=b))
    assert b.clock.unit == "insns"
    assert len(acts(recs)) == fib_calls(10) + 2


def test_overflow_closes_open_frames_no_staircase():
    s = FlowSynth(["main", "a", "b", "c"])
    s.start("main")
    s.body(3); s.call("a"); s.body(2); s.call("b"); s.body(2)
    items = s.take()
    items.append({"event": "overflow", "offset": 1234, "ip_suppressed": False,
                  "ip": s.addr["c"] + 8})
    # resume inside c, which then returns to code never seen
    s.ip = s.addr["c"] + 8
    s.body(2)
    s.rets.append(s.addr["main"] + 0x40)
    s.ret()
    s.body(1)
    items += s.take()
    recs = list(reconstruct(items, lookup=s.lookup))
    check_nesting(recs)
    a = acts(recs)
    before = [x for x in a if x.end_idx == 9]
    assert [(x.name, x.depth) for x in before] == [("b", 2), ("a", 1), ("main", 0)]
    assert all(x.flags & Flag.TRUNCATED for x in before)
    m = [r for r in recs if type(r) is Marker]
    assert [(x.kind, x.idx, x.offset) for x in m] == [("overflow", 9, 1234)]
    after = [x for x in a if x.begin_idx >= 9]
    # after the gap the stack restarts at depth 0: c, then main (sibling)
    assert [(x.name, x.depth) for x in after] == [("c", 0), ("main", 0)]
    assert after[0].flags == Flag.BEGIN_UNKNOWN
    assert after[1].flags == Flag.BEGIN_UNKNOWN | Flag.TRUNCATED


def test_decode_error_is_a_gap_with_offset():
    s = FlowSynth(["main", "a"])
    s.start("main")
    s.body(2); s.call("a"); s.body(1)
    items = s.take() + [{"error": "no memory mapped", "kind": "error",
                         "offset": 77, "ip": 0x1234}]
    s.start("a", 16, enabled=False)
    s.body(1)
    items += s.take()
    recs = list(reconstruct(items, lookup=s.lookup))
    m = [r for r in recs if type(r) is Marker]
    assert [(x.kind, x.offset, x.detail) for x in m] == [("error", 77, "no memory mapped")]
    a = acts(recs)
    assert [(x.name, x.depth, bool(x.flags & Flag.TRUNCATED)) for x in a] == \
        [("a", 1, True), ("main", 0, True), ("a", 0, True)]


def test_longjmp_unwinds_to_matching_frame():
    # main -> setjmp-ish caller a -> b -> c ; c longjmps (indirect jump)
    # back into a, which then returns to main normally
    s = FlowSynth(["main", "a", "b", "c"])
    s.start("main")
    s.body(1); s.call("a"); s.body(1); s.call("b"); s.body(1); s.call("c")
    s.body(1)
    s._insn(2, "jump")             # longjmp: jmp *%rdx into a's body
    s.ip = s.addr["a"] + 0x30
    s.rets.pop(); s.rets.pop()      # b's and c's return addresses are gone
    s.body(1)
    s.ret()                         # a returns to main: matches a's frame
    s.body(1)
    recs = list(reconstruct(s.take(), lookup=s.lookup))
    check_nesting(recs)
    a = acts(recs)
    got = [(x.name, x.depth, x.flags & ~Flag.BEGIN_UNKNOWN) for x in a]
    assert got == [("c", 3, Flag.UNWOUND), ("b", 2, Flag.UNWOUND),
                   ("a", 1, Flag.NONE), ("main", 0, Flag.TRUNCATED)]


def test_tail_call_replaces_frame():
    s = FlowSynth(["main", "a", "b"])
    s.start("main")
    s.body(1); s.call("a"); s.body(2); s.tail("b"); s.body(3); s.ret()
    s.body(1)
    a = acts(reconstruct(s.take(), lookup=s.lookup))
    assert [(x.name, x.depth, x.flags, x.insns) for x in a[:2]] == [
        ("a", 1, Flag.NONE, 3), ("b", 1, Flag.TAIL_CALL, 4)]
    # without a symbolizer a jump is just a jump
    s = FlowSynth(["main", "a", "b"])
    s.start("main")
    s.body(1); s.call("a"); s.body(2); s.tail("b"); s.body(3); s.ret()
    a = acts(reconstruct(s.take()))
    assert [(x.name, x.insns) for x in a[:1]] == [(f"0x{s.addr['a']:x}", 7)]


def test_call_to_next_instruction_is_not_a_call():
    s = FlowSynth(["main"])
    s.start("main")
    s.body(1)
    s._insn(5, "call")
    s.ip += 5                       # call 1f; 1: pop %rbx
    s.body(3)
    a = acts(reconstruct(s.take(), lookup=s.lookup))
    assert [x.name for x in a] == ["main"]


def test_syscall_with_untraced_kernel_is_one_frame():
    s = FlowSynth(["main", "write"])
    s.start("main")
    s.body(1); s.call("write"); s.body(2)
    s._insn(2, "far_call")
    resume = s.ip + 2
    items = s.take() + [
        {"event": "disabled", "offset": 5, "ip_suppressed": True},
        {"event": "enabled", "offset": 9, "ip_suppressed": False,
         "ip": resume, "resumed": False}]
    s.ip = resume
    s.body(1); s.ret(); s.body(1)
    items += s.take()
    recs = list(reconstruct(items, lookup=s.lookup))
    check_nesting(recs)
    a = acts(recs)
    assert [(x.name, x.depth, x.flags) for x in a] == [
        ("[syscall]", 2, Flag.FAR), ("write", 1, Flag.NONE),
        ("main", 0, Flag.TRUNCATED)]
    assert not [r for r in recs if type(r) is Marker]


def test_enabled_elsewhere_is_a_gap():
    s = FlowSynth(["main", "a"])
    s.start("main")
    s.body(1); s.call("a"); s.body(1)
    items = s.take() + [
        {"event": "disabled", "offset": 5, "ip_suppressed": False, "ip": 0x99},
        {"event": "enabled", "offset": 9, "ip_suppressed": False,
         "ip": s.addr["main"] + 0x80, "resumed": False}]
    s.ip = s.addr["main"] + 0x80
    s.body(1)
    recs = list(reconstruct(items + s.take(), lookup=s.lookup))
    assert [(r.kind, r.idx) for r in recs if type(r) is Marker] == [("gap", 3)]
    a = acts(recs)
    assert [(x.name, x.depth, bool(x.flags & Flag.TRUNCATED)) for x in a] == [
        ("a", 1, True), ("main", 0, True), ("main", 0, True)]


def test_tsx_abort_closes_speculative_frames():
    s = FlowSynth(["main", "a"])
    s.start("main")
    s.body(1)
    items = s.take() + [{"event": "tsx", "offset": 1, "ip_suppressed": False,
                         "speculative": True, "aborted": False}]
    s.call("a"); s.body(2)
    items += s.take() + [{"event": "tsx", "offset": 2, "ip_suppressed": False,
                          "speculative": False, "aborted": True}]
    s.ip = s.addr["main"] + 0x50
    s.body(1)
    a = acts(reconstruct(items + s.take(), lookup=s.lookup))
    assert [(x.name, x.flags) for x in a] == [
        ("a", Flag.ABORTED), ("main", Flag.TRUNCATED)]


def test_objects_and_enums_are_accepted():
    import enum
    from dataclasses import dataclass

    class IClass(enum.Enum):
        PTIC_OTHER = 1
        PTIC_CALL = 2
        PTIC_RETURN = 3

    @dataclass(frozen=True)
    class Insn:
        ip: int
        size: int
        iclass: IClass

    @dataclass(frozen=True)
    class Event:
        event: str
        offset: int
        tsc: int | None = None

    s, items = fib_flow(4)
    items = list(items)
    conv = []
    for d in items:
        if "iclass" in d:
            ic = {"other": IClass.PTIC_OTHER, "call": IClass.PTIC_CALL,
                  "return": IClass.PTIC_RETURN}[d["iclass"]]
            conv.append(Insn(d["ip"], d["size"], ic))
        else:
            conv.append(Event(d["event"], d["offset"]))
    want = acts(reconstruct(items, lookup=s.lookup))
    got = acts(reconstruct(conv, lookup=s.lookup))
    assert len(want) == fib_calls(4) + 2
    assert got == want


def test_bounded_memory_state():
    # a long flow: the builder's pending queue stays bounded
    s, items = fib_flow(12, repeat=20, tsc_per_insn=3, tick_every=50)
    b = CallStackBuilder(lookup=s.lookup, max_pending=1000)
    worst = 0
    n = 0
    for r in reconstruct(items, builder=b):
        n += 1
        worst = max(worst, b.clock.pending)
    assert n == 2 * (20 * fib_calls(12) + 2)
    assert worst <= 1001


def test_branch_records_two_threads():
    s = FlowSynth(["main", "f", "g"])
    m, f, g = (s.addr[k] for k in ("main", "f", "g"))
    recs = []
    for tid in (11, 12):
        recs += [
            {"pid": 1, "tid": tid, "kind": "call", "from": m + 0x10, "to": f, "time": 100},
            {"pid": 1, "tid": tid, "kind": "call", "from": f + 0x8, "to": g, "time": 110},
            {"pid": 1, "tid": tid, "kind": "return", "from": g + 0x20, "to": f + 0xd, "time": 130},
            {"pid": 1, "tid": tid, "kind": "jump", "from": f + 0x10, "to": f + 0x40, "time": 131},
            {"pid": 1, "tid": tid, "kind": "return", "from": f + 0x44, "to": m + 0x15, "time": 150},
        ]
    out = list(reconstruct_branches(recs, lookup=s.lookup))
    a = acts(out)
    for tid in (11, 12):
        mine = [(x.name, x.depth, x.begin, x.end) for x in a if x.tid == tid]
        assert mine[:2] == [("g", 2, 110, 130), ("f", 1, 100, 150)]
        assert mine[2][0] == "main" and mine[2][1] == 0


def test_flow_decoder_records_plug_in():
    """hwtrace.flow's own records (FlowInsn, Event) give the same result as
    their JSON form."""
    try:
        from hwtrace.flow.events import Event
        from hwtrace.flow.fetch import FlowInsn
        from hwtrace.flow.fetch import ICLASS_NAMES
    except ImportError as e:
        pytest.skip(f"flow decoder records not available: {e}")
    by_name = {v: k for k, v in ICLASS_NAMES.items()}
    s, items = fib_flow(5, tsc_per_insn=4, tick_every=5)
    items = list(items)
    objs = []
    for d in items:
        if "iclass" in d:
            objs.append(FlowInsn(d["ip"], d["size"], int(by_name[d["iclass"]]),
                                 "64bit"))
        else:
            ev = Event(d["event"], offset=d["offset"], ip=d.get("ip", 0),
                       ip_suppressed="ip" not in d)
            if "tsc" in d:
                ev.has_tsc = True
                ev.tsc = d["tsc"]
            objs.append(ev)
    # one event without a timestamp: its tsc field (0) must be ignored
    objs.insert(3, Event("tick", offset=0, ip=0))
    want = acts(reconstruct(items, lookup=s.lookup))
    got = acts(reconstruct(objs, lookup=s.lookup))
    assert len(want) == fib_calls(5) + 2
    assert got == want


def test_traced_kernel_syscall_and_interrupt():
    # user main -> syscall into a traced kernel entry, sysret back; then an
    # interrupt (async branch) into a handler that irets to the interrupted
    # instruction
    s = FlowSynth(["main", "entry_SYSCALL_64", "irq_handler"])
    s.start("main")
    s.body(2)
    s._insn(2, "far_call")
    back = s.ip + 2
    s.ip = s.addr["entry_SYSCALL_64"]
    s.body(5)
    s._insn(3, "far_return")
    s.ip = back
    s.body(2)
    items = s.take()
    interrupted = s.ip
    items.append({"event": "async_branch", "offset": 7, "ip_suppressed": False,
                  "from": interrupted, "to": s.addr["irq_handler"]})
    s.ip = s.addr["irq_handler"]
    s.body(4)
    s._insn(2, "far_return")
    s.ip = interrupted
    s.body(1)
    recs = list(reconstruct(items + s.take(), lookup=s.lookup))
    check_nesting(recs)
    got = [(a.name, a.depth, a.insns, a.flags) for a in acts(recs)]
    assert got == [("entry_SYSCALL_64", 1, 6, Flag.FAR),
                   ("irq_handler", 1, 5, Flag.ASYNC),
                   ("main", 0, 6 + 6 + 5, Flag.TRUNCATED)]


def test_callbacks_from_untraced_code():
    # main calls qsort, which is filtered out (tracing off inside it); qsort
    # calls the traced comparator twice, then returns to main
    s = FlowSynth(["main", "qsort", "cmp"])
    s.start("main")
    s.body(1)
    s._insn(5, "call")
    back = s.ip + 5
    items = s.take() + [{"event": "disabled", "offset": 1, "ip_suppressed": False,
                         "ip": s.addr["qsort"]}]
    for _ in range(2):
        items.append({"event": "enabled", "offset": 2, "ip_suppressed": False,
                      "ip": s.addr["cmp"], "resumed": False})
        s.ip = s.addr["cmp"]
        s.body(3)
        s._insn(1, "return")
        items += s.take() + [{"event": "disabled", "offset": 3, "ip_suppressed": True}]
    items.append({"event": "enabled", "offset": 4, "ip_suppressed": False,
                  "ip": back, "resumed": False})
    s.ip = back
    s.body(2)
    recs = list(reconstruct(items + s.take(), lookup=s.lookup))
    check_nesting(recs)
    assert [(a.name, a.depth, a.insns, a.flags) for a in acts(recs)] == [
        ("cmp", 2, 4, Flag.NONE), ("cmp", 2, 4, Flag.NONE),
        ("qsort", 1, 8, Flag.NONE), ("main", 0, 12, Flag.TRUNCATED)]
    assert not [r for r in recs if type(r) is Marker]


def signal_flow():
    """main is interrupted at X (kernel untraced); the signal handler runs,
    returns into the restorer, whose rt_sigreturn resumes main at X."""
    s = FlowSynth(["main", "handler", "__restore_rt"])
    s.start("main")
    s.body(3)
    x = s.ip
    items = s.take() + [
        {"event": "async_disabled", "offset": 1, "ip_suppressed": True, "at": x},
        {"event": "enabled", "offset": 2, "ip_suppressed": False,
         "ip": s.addr["handler"], "resumed": False}]
    s.ip = s.addr["handler"]
    s.body(4)
    s.rets.append(s.addr["__restore_rt"])
    s.ret()
    s.body(1)
    s._insn(2, "far_call")                       # rt_sigreturn
    items += s.take() + [
        {"event": "disabled", "offset": 3, "ip_suppressed": True},
        {"event": "enabled", "offset": 4, "ip_suppressed": False, "ip": x,
         "resumed": False}]
    s.ip = x
    s.body(2)
    return s, items + s.take()


def test_signal_handler_in_a_thread_stream():
    s, items = signal_flow()
    recs = list(reconstruct(items, StreamInfo(1, 1), lookup=s.lookup))
    check_nesting(recs)
    assert [(a.name, a.depth, a.insns, a.flags) for a in acts(recs)] == [
        ("handler", 2, 5, Flag.ASYNC),
        ("[syscall]", 2, 0, Flag.FAR | Flag.UNWOUND),
        ("[untraced]", 1, 7, Flag.ASYNC),
        ("main", 0, 12, Flag.TRUNCATED)]
    assert not [r for r in recs if type(r) is Marker]


def test_async_exit_then_elsewhere_in_a_cpu_stream_is_a_gap():
    s, items = signal_flow()
    recs = list(reconstruct(items, StreamInfo(cpu=0), lookup=s.lookup))
    check_nesting(recs)
    assert [(m.kind, m.idx) for m in recs if type(m) is Marker] == [("gap", 3)]
    got = [(a.name, a.depth, a.flags) for a in acts(recs)]
    assert got[:2] == [("[untraced]", 1, Flag.ASYNC | Flag.TRUNCATED),
                       ("main", 0, Flag.TRUNCATED)]
    assert got[2] == ("handler", 0, Flag.NONE)


def test_branch_records_with_unknown_ends():
    """Records into and out of the untraced kernel carry ``None`` for the
    unknown end (spec/branch-trace.md, as ``hwtrace branches`` writes them):
    a syscall and an interrupt each become one kernel frame that ends where
    user code resumes; a resume elsewhere (a signal handler) is an
    asynchronous activation; tracing that begins at a record from None
    starts the segment there."""
    recs = [
        {"pid": 1, "tid": 1, "kind": "sysret", "from": None, "to": 0x1000},
        {"pid": 1, "tid": 1, "kind": "syscall", "from": 0x1010, "to": None},
        {"pid": 1, "tid": 1, "kind": "sysret", "from": None, "to": 0x1012},
        {"pid": 1, "tid": 1, "kind": "interrupt", "from": 0x1020, "to": None},
        {"pid": 1, "tid": 1, "kind": "iret", "from": None, "to": 0x1020},
        {"pid": 1, "tid": 1, "kind": "interrupt", "from": 0x1030, "to": None},
        {"pid": 1, "tid": 1, "kind": "iret", "from": None, "to": 0x5000},
    ]
    out = list(reconstruct_branches(recs))
    check_nesting(out)
    a = acts(out)
    names = Counter(x.name for x in a)
    assert names["[syscall]"] == 1
    assert names["[interrupt]"] == 2
    handler = [x for x in a if x.name == "0x5000"]
    assert len(handler) == 1 and handler[0].flags & Flag.ASYNC


# ------------------------------------------------------------------ a CPU's stream, following context switches

class CpuFlow:
    """One CPU's flow items with threads 11 and 12 (same code, each its own
    FlowSynth) taking turns, and the context switches of the sideband; the
    TSC counts instructions from T0, as the emulated engines' clock does."""

    NAMES = ["run", "work", "leaf", "other"]
    T0 = 1000

    def __init__(self):
        self.s = {t: FlowSynth(self.NAMES) for t in (11, 12)}
        self.items: list = []
        self.n = 0
        self.switches: list = []
        self.cur = -1

    def run(self, tid, *steps):
        s = self.s[tid]
        for st in steps:
            if isinstance(st, int):
                s.body(st)
            elif st == "ret":
                s.ret()
            else:
                s.call(st)
        items = s.take()
        self.n += sum("iclass" in i for i in items)
        self.items += items

    def ev(self, name, **kw):
        self.items.append({"event": name, "offset": 0, "ip_suppressed": False,
                           "tsc": self.T0 + self.n, **kw})

    def switch(self, nxt):
        from hwtrace.bundle import Switch
        self.switches.append(Switch(0, self.T0 + self.n, 1, self.cur, 1, nxt))
        self.cur = nxt

    def out(self, tid):
        """Interrupted (FUP + TIP.PGD) before its next instruction."""
        self.ev("async_disabled", at=self.s[tid].ip)

    def into(self, tid, start=None):
        s = self.s[tid]
        if start:
            s.ip = s.addr[start]
        self.ev("enabled", ip=s.ip, resumed=False)

    def records(self, switches=True):
        info = StreamInfo(cpu=0, switches=tuple(self.switches) if switches else ())
        recs = list(reconstruct(self.items, info, lookup=self.s[11].lookup))
        check_nesting(recs)
        return recs


def slices(recs):
    return [(a.name, a.depth, a.insns, a.flags, a.tid) for a in acts(recs)]


S_OUT, S_IN, ASYNC = Flag.SWITCHED_OUT, Flag.SWITCHED_IN, Flag.ASYNC


def test_cpu_stream_follows_context_switches():
    """Two threads take turns on a CPU, each resuming where it was switched
    out: each keeps its own stack (no gap), its frames closed at the switch
    and opened again as slices of the same activations, so the records
    still nest on the CPU's one track; each slice says whose it is."""
    c = CpuFlow()
    c.switch(11)
    c.into(11, "run")
    c.run(11, 2, "work", 2, "leaf", 1)
    c.out(11)
    c.switch(12)
    c.into(12, "other")
    c.run(12, 3, "leaf", 1)
    c.out(12)
    c.switch(11)
    c.into(11)
    c.run(11, 1, "ret", 1, "ret", 1)          # leaf and work return
    c.out(11)
    c.switch(12)
    c.into(12)
    c.run(12, 1, "ret", 2)
    recs = c.records()
    assert not [r for r in recs if type(r) is Marker]
    assert slices(recs) == [
        ("[untraced]", 3, 0, ASYNC | S_OUT, 11), ("leaf", 2, 1, S_OUT, 11),
        ("work", 1, 4, S_OUT, 11), ("run", 0, 7, S_OUT, 11),
        # 12 is first seen here: what it runs began before
        ("[untraced]", 2, 0, ASYNC | S_OUT, 12), ("leaf", 1, 1, S_OUT, 12),
        ("other", 0, 5, Flag.BEGIN_UNKNOWN | S_OUT, 12),
        ("[untraced]", 3, 0, ASYNC | S_IN, 11), ("leaf", 2, 2, S_IN, 11),
        ("work", 1, 4, S_IN, 11),
        ("[untraced]", 1, 0, ASYNC | S_OUT, 11), ("run", 0, 5, S_OUT | S_IN, 11),
        ("[untraced]", 2, 0, ASYNC | S_IN, 12), ("leaf", 1, 2, S_IN, 12),
        ("other", 0, 4, Flag.BEGIN_UNKNOWN | Flag.TRUNCATED | S_IN, 12)]
    # every instruction in exactly one slice's exclusive share
    assert sum(a.self_insns for a in acts(recs)) == c.n
    # a slice going on with an earlier call is no call
    from hwtrace.analysis.profile import Profile
    p = Profile()
    p.begin_stream(StreamInfo(cpu=0))
    for r in recs:
        p.add(r)
    calls = {s.name: s.calls for s in p.funcs.values()}
    assert (calls["run"], calls["work"], calls["leaf"], calls["other"]) == (1, 1, 2, 0)
    # without the switches, as before: gaps at thread changes (the one back
    # into leaf at the same offset as the other thread goes unnoticed)
    old = c.records(switches=False)
    assert [(m.kind, m.detail) for m in old if type(m) is Marker] == \
        [("gap", "tracing resumed elsewhere")] * 2


def test_thread_back_from_another_cpu_starts_afresh():
    """A thread switched out here that comes back elsewhere ran on another
    CPU meanwhile: its stack here is stale; it starts afresh, without a
    gap (nothing was lost), and a switch to idle is nobody's resume."""
    c = CpuFlow()
    c.switch(11)
    c.into(11, "run")
    c.run(11, 2, "work", 2)
    c.out(11)
    c.switch(-1)                                # 11 migrated away
    c.switch(12)
    c.into(12, "other")
    c.run(12, 3)
    c.out(12)
    c.switch(11)
    s = c.s[11]
    s.rets.pop()                                # work returned elsewhere
    s.ip = s.addr["run"] + 0x40
    c.into(11)
    c.run(11, 2)
    recs = c.records()
    assert not [r for r in recs if type(r) is Marker]
    assert slices(recs) == [
        ("[untraced]", 2, 0, ASYNC | S_OUT, 11), ("work", 1, 2, S_OUT, 11),
        ("run", 0, 5, S_OUT, 11),
        ("[untraced]", 1, 0, ASYNC | S_OUT, 12),
        ("other", 0, 3, Flag.BEGIN_UNKNOWN | S_OUT, 12),
        ("run", 0, 2, Flag.BEGIN_UNKNOWN | Flag.TRUNCATED, 11)]


def test_same_resume_address_decided_by_time():
    """Both threads stopped at the same instruction (same code): an enable
    there before the next switch's time is the running thread going on
    (an interrupt, no switch); one at or after it is the other thread."""
    c = CpuFlow()
    c.switch(12)
    c.into(12, "work")
    c.run(12, 3)
    c.out(12)
    c.switch(11)
    c.into(11, "work")
    c.run(11, 3)
    c.out(11)                                   # an interrupt: 11 goes on
    c.into(11)
    c.run(11, 1)
    c.s[11].ip -= 4                             # a loop: back to work+12
    c.out(11)
    assert c.s[11].ip == c.s[12].ip             # where 12 stopped too
    c.switch(12)
    c.into(12)
    c.run(12, 2)
    recs = c.records()
    assert not [r for r in recs if type(r) is Marker]
    assert slices(recs) == [
        ("[untraced]", 1, 0, ASYNC | S_OUT, 12),
        ("work", 0, 3, Flag.NONE | S_OUT, 12),
        ("[untraced]", 1, 0, ASYNC, 11),
        ("[untraced]", 1, 0, ASYNC | S_OUT, 11),
        ("work", 0, 4, Flag.BEGIN_UNKNOWN | S_OUT, 11),
        ("[untraced]", 1, 0, ASYNC | S_IN, 12),
        ("work", 0, 2, Flag.TRUNCATED | S_IN, 12)]


def test_interrupt_right_after_a_call():
    """An interrupt between a call and its target's first instruction (the
    trace's FUP is the target): the callee's activation has begun, and
    execution resumes at its entry -- no bogus untraced callee."""
    s = FlowSynth(["main", "leaf"])
    s.start("main")
    s.body(2)
    s.call("leaf")
    items = s.take() + [
        {"event": "async_disabled", "offset": 1, "ip_suppressed": True, "at": s.ip},
        {"event": "enabled", "offset": 2, "ip_suppressed": False, "ip": s.ip,
         "resumed": True}]
    s.body(2)
    s.ret()
    s.body(1)
    recs = list(reconstruct(items + s.take(), StreamInfo(1, 1), lookup=s.lookup))
    check_nesting(recs)
    assert [(a.name, a.depth, a.insns, a.flags) for a in acts(recs)] == [
        ("[untraced]", 2, 0, Flag.ASYNC), ("leaf", 1, 3, Flag.NONE),
        ("main", 0, 7, Flag.TRUNCATED)]
    assert not [r for r in recs if type(r) is Marker]


def test_cpu_mode_recording_of_two_threads(tmp_path):
    """A real per-CPU recording (ptrace engine) of two threads running the
    same loop, taking turns on two CPUs and migrating between them: with
    the sideband's switches no "tracing resumed elsewhere" gap is left,
    every call is counted once (work twice, leaf 2 x 3000 times, each
    leaf exactly its instructions), and every stream's records nest."""
    import os
    import re
    import shutil
    import subprocess
    import sys

    from conftest import _need, run_hwtrace
    from hwtrace.streams import open_bundle
    from test_views_batches import MT_C

    if sys.platform != "linux":
        pytest.skip("the ptrace engine is Linux x86-64")
    gcc, objdump = shutil.which("gcc"), shutil.which("objdump")
    if gcc is None or objdump is None:
        _need("gcc/objdump", "the two-thread program is built and inspected with them")
    exe = tmp_path / "mt"
    (tmp_path / "mt.c").write_text(MT_C)
    subprocess.run([gcc, "-O1", "-static", "-pthread", "-DN=3000", "-o", str(exe),
                    str(tmp_path / "mt.c")],
                   check=True, capture_output=True)
    dis = subprocess.run([objdump, "-d", "--no-show-raw-insn", "--disassemble=leaf", str(exe)],
                         capture_output=True, text=True, check=True).stdout
    leaf_insns = len(re.findall(r"^\s+[0-9a-f]+:\s+\S", dis, re.M))
    b = tmp_path / "b"
    cmd = ["record", "--engine", "ptrace", "--mode", "cpu", "-o", b, "--", exe]
    # two CPUs at most, so the threads share them (and migrate) anywhere
    cpus = sorted(os.sched_getaffinity(0))[:2]
    taskset = shutil.which("taskset")
    if taskset and len(cpus) == 2:
        r = subprocess.run([taskset, "-c", ",".join(map(str, cpus)), sys.executable, "-m",
                            "hwtrace", *map(str, cmd)], capture_output=True, text=True)
    else:
        r = run_hwtrace(*cmd)
    assert r.returncode == 0 and r.stdout == f"{2 * sum(3 * i + 1 for i in range(3000))}\n", \
        r.stderr

    src = open_bundle(b)
    assert src.mode == "cpu"
    switched_in = gaps_before = 0
    for st in src.streams:
        assert st.info.switches, "a CPU's stream gets the recording's switches"
        for info in (st.info, st.info._replace(switches=())):
            bld = CallStackBuilder(info, src.symbolizer.lookup)
            recs = []
            for batch in st.batches(view=True):
                bld.feed_batch(batch)
                recs += bld.take()
            bld.finish()
            recs += bld.take()
            check_nesting(recs)
            markers = [m for m in recs if type(m) is Marker]
            if info.switches:
                assert markers == [], markers[:3]
                tids = {s.next_tid for s in info.switches} - {-1}
                assert {a.tid for a in acts(recs)} <= tids
                switched_in += sum(1 for a in acts(recs) if a.flags & Flag.SWITCHED_IN)
            else:
                gaps_before += sum(m.detail == "tracing resumed elsewhere" for m in markers)
    # the recording did exercise it: threads came back to a CPU, and the
    # same streams without their switches have those gaps
    assert switched_in > 0 and gaps_before > 0

    out = run_hwtrace("summary", "--top", "40", b)
    assert out.returncode == 0, out.stderr
    assert "lost data / errors: none" in out.stdout
    # function, calls, excl insns, excl%, incl insns
    rows = {ln.split()[0]: ln.split()[1:5] for ln in out.stdout.splitlines()[5:]
            if ln and not ln.startswith("...")}
    assert rows["work"][0] == "2"
    n = f"{6000 * leaf_insns:,}"
    assert (rows["leaf"][0], rows["leaf"][1], rows["leaf"][3]) == ("6,000", n, n)


def test_coverage_block_goes_on_across_a_psb():
    """A PSB+ (status-update events) inside a straight line of code does not
    cut the basic block in two; a real enable/disable does."""
    from hwtrace.analysis.coverage import CoverageCollector
    c = CoverageCollector()
    ins = lambda ip, cls="other": c.feed({"ip": ip, "size": 4, "iclass": cls})
    ins(0x100)
    c.feed({"event": "enabled", "ip": 0x104, "status_update": True, "resumed": True})
    c.feed({"event": "exec_mode", "ip": 0x104, "status_update": True, "mode": "64bit"})
    ins(0x104)
    ins(0x108, "jump")
    ins(0x200)
    c.feed({"event": "disabled", "ip_suppressed": True})
    c.feed({"event": "enabled", "ip": 0x204})
    ins(0x204)
    assert c.finish() == {(0x100, 12): 1, (0x200, 4): 1, (0x204, 4): 1}

"""Branch records without a live process: classification, the mask, the
trigger model on synthetic instruction streams, window edges of a
synthetic stepper log, symbol resolution and the record formats."""

from __future__ import annotations

import pytest

from hwtrace.branches import (ALL_KINDS, KINDS, Branch, Mask, MaskSpec,
                              SymbolNotFound, Trigger, TriggerSpec, parse_kinds,
                              to_array)
from hwtrace.branches import resolve
from hwtrace.branches.classify import classify, is_transfer
from hwtrace.branches.live import records_from_log
from hwtrace.branches.tracker import Tracker
from hwtrace.engines.emulated import execlog as X
from hwtrace.engines.emulated.stepper import Window
from hwtrace.x86 import decode

# ------------------------------------------------------------------ classify

CASES = [
    # bytes, from, to, kind
    (b"\xe8\x10\x00\x00\x00", 0x1000, 0x1015, "call"),
    (b"\xff\xd0", 0x1000, 0x5000, "indirect_call"),          # call *%rax
    (b"\xff\x15\x00\x00\x00\x00", 0x1000, 0x5000, "indirect_call"),
    (b"\xc3", 0x1000, 0x2000, "return"),
    (b"\xc2\x08\x00", 0x1000, 0x2000, "return"),
    (b"\xeb\x05", 0x1000, 0x1007, "jump"),
    (b"\xe9\x00\x01\x00\x00", 0x1000, 0x1105, "jump"),
    (b"\xff\xe0", 0x1000, 0x3000, "indirect_jump"),          # jmp *%rax
    (b"\x74\x05", 0x1000, 0x1007, "cond"),
    (b"\x74\x05", 0x1000, 0x1002, "cond_not_taken"),
    (b"\x0f\x85\x10\x00\x00\x00", 0x1000, 0x1016, "cond"),
    (b"\xe2\xfe", 0x1000, 0x1000, "cond"),                   # loop
    (b"\xe3\x02", 0x1000, 0x1002, "cond_not_taken"),         # jrcxz
    (b"\x0f\x05", 0x1000, 0x1002, "syscall"),
    (b"\x0f\x34", 0x1000, 0x1002, "syscall"),                # sysenter
    (b"\x48\x0f\x07", 0x1000, 0x7000, "sysret"),
    (b"\xcd\x80", 0x1000, 0x1002, "interrupt"),
    (b"\xcc", 0x1000, 0x1001, "interrupt"),
    (b"\x48\xcf", 0x1000, 0x2000, "iret"),
    (b"\xcb", 0x1000, 0x2000, "far"),                        # retf
    (b"\xff\x1c\x24", 0x1000, 0x2000, "far"),                # lcall *(%rsp)
    (b"\x90", 0x1000, 0x1001, None),
    (b"\x48\x89\xe5", 0x1000, 0x1003, None),
]


@pytest.mark.parametrize("code,frm,to,kind", CASES)
def test_classify(code, frm, to, kind):
    x = decode(code)
    assert classify(x, frm, to) == kind
    assert is_transfer(x) == (kind is not None)


def test_kinds_are_the_spec_table():
    assert KINDS == ("call", "return", "jump", "cond", "cond_not_taken",
                     "indirect_call", "indirect_jump", "far", "syscall",
                     "sysret", "interrupt", "iret")
    assert "cond_not_taken" not in ALL_KINDS and len(ALL_KINDS) == 11


def test_parse_kinds():
    assert parse_kinds("call,return") == {"call", "return"}
    assert parse_kinds(None) == ALL_KINDS
    assert parse_kinds("all") == ALL_KINDS
    assert parse_kinds("all,cond_not_taken") == frozenset(KINDS)
    assert parse_kinds(" Call , cond ") == {"call", "cond"}
    with pytest.raises(ValueError, match="unknown branch kind 'calls'.*indirect_call"):
        parse_kinds("calls")
    with pytest.raises(ValueError, match="no branch kinds"):
        parse_kinds(",")


# ------------------------------------------------------------------ records

def test_record_json_and_array():
    r = Branch(7, 8, "call", 0x401000, 0x402000, 123, 2)
    assert r.to_json() == {"pid": 7, "tid": 8, "kind": "call", "from": 0x401000,
                           "to": 0x402000, "time": 123, "depth": 2}
    names = {0x401000: "main+0x10", 0x402000: "f"}.get
    assert r.to_json(names)["from_sym"] == "main+0x10"
    assert r.to_json(names)["to_sym"] == "f"
    bare = Branch(None, None, "return", 1, 2)
    assert bare.to_json(lambda a: None) == {"pid": None, "tid": None, "kind": "return",
                                            "from": 1, "to": 2}
    assert r.key() == ("call", 0x401000, 0x402000)
    with pytest.raises(AttributeError):
        r.kind = "jump"
    np = pytest.importorskip("numpy")
    a = to_array([r, bare], chunk=1)
    assert a.dtype.names == ("pid", "tid", "kind", "from", "to", "time", "depth")
    assert a["from"].tolist() == [0x401000, 1]
    assert [KINDS[k] for k in a["kind"]] == ["call", "return"]
    assert a["pid"].tolist() == [7, -1] and a["depth"].tolist() == [2, -(1 << 31)]
    assert len(to_array([])) == 0 and isinstance(a, np.ndarray)
    from hwtrace.branches import iter_arrays
    parts = list(iter_arrays([r] * 5, chunk=2))
    assert [len(p) for p in parts] == [2, 2, 1]
    assert list(iter_arrays([])) == []

    # ends in untraced code: None, null in jsonl, 0 in the array, no symbol
    out = Branch(1, 1, "syscall", 0x40010e, None, None, 0)
    back = Branch(1, 1, "sysret", None, 0x400110, None, 0)
    assert out.to_json(names) == {"pid": 1, "tid": 1, "kind": "syscall",
                                  "from": 0x40010e, "to": None, "depth": 0}
    assert back.to_json(lambda a: "x") == {"pid": 1, "tid": 1, "kind": "sysret",
                                           "from": None, "to": 0x400110, "depth": 0,
                                           "to_sym": "x"}
    assert to_array([out, back])["to"].tolist() == [0, 0x400110]
    assert to_array([out, back])["from"].tolist() == [0x40010e, 0]


def test_text_format_unknown_ends():
    from hwtrace.cli.branches import format_text
    names = {0x40010e: "again+0x22", 0x400110: "again+0x24"}.get
    assert format_text(Branch(5, 6, "syscall", 0x40010e, None, None, 0), names) == \
        "          5/6   0 syscall        0x40010e again+0x22 -> ?"
    assert format_text(Branch(None, None, "sysret", None, 0x400110), names,
                       lambda a: "f.c:3") == \
        "            - sysret         ? -> 0x400110 again+0x24 (f.c:3)"


def test_mask_ranges_select_resumes_by_to():
    m = Mask(frozenset(KINDS), ranges=((0x100, 0x200),))
    assert m.accepts("sysret", None, 0x150) and not m.accepts("sysret", None, 0x250)
    assert m.accepts("syscall", 0x150, None) and not m.accepts("iret", None, None)


# ------------------------------------------------------------------ tracker

# A tiny synthetic program (64-bit code, addresses as in the comments):
#   main: 0x100 call f ; 0x105 nop ; 0x106 call f ; 0x10b jmp 0x10b...
#   f:    0x200 cmp    ; 0x203 je 0x20a (taken when depth limit hit)
#         0x205 call f ; 0x20a ret
CALL_F_100 = decode(b"\xe8\xfb\x00\x00\x00")       # 0x100 -> 0x200
CALL_F_106 = decode(b"\xe8\xf5\x00\x00\x00")       # 0x106 -> 0x200
CALL_F_205 = decode(b"\xe8\xf6\xff\xff\xff")       # 0x205 -> 0x200
JE = decode(b"\x74\x05")
RET = decode(b"\xc3")
assert CALL_F_100.target(0x100) == 0x200 and CALL_F_106.target(0x106) == 0x200
assert CALL_F_205.target(0x205) == 0x200 and JE.target(0x203) == 0x20a


def f_activation(levels: int, ret_to: int):
    """Steps (pc, x) of f recursing `levels` more times, returning to ret_to."""
    steps = [(0x200, None), (0x203, JE)]
    if levels:
        steps += [(0x205, CALL_F_205)] + f_activation(levels - 1, 0x20a)
    steps += [(0x20a, RET)]
    return steps


def program():
    return ([(0x100, CALL_F_100)] + f_activation(2, 0x105) + [(0x105, None),
            (0x106, CALL_F_106)] + f_activation(0, 0x10b) + [(0x10b, None)])


def run_tracker(trigger=None, mask=None, steps=None, pid=1, tid=1):
    t = Tracker(trigger, mask)
    th = t.thread(pid, tid)
    for pc, x in steps or program():
        t.step(th, pc, x, None)
    return t.out


def test_tracker_everything():
    recs = run_tracker(mask=Mask(frozenset(KINDS)))
    got = [(r.kind, r.from_, r.to, r.depth) for r in recs]
    assert got == [
        # where tracing begins: back from the kernel (execve) at the first insn
        ("sysret", None, 0x100, 0),
        ("call", 0x100, 0x200, 0),
        ("cond_not_taken", 0x203, 0x205, 1), ("call", 0x205, 0x200, 1),
        ("cond_not_taken", 0x203, 0x205, 2), ("call", 0x205, 0x200, 2),
        ("cond", 0x203, 0x20a, 3),
        ("return", 0x20a, 0x20a, 3), ("return", 0x20a, 0x20a, 2),
        ("return", 0x20a, 0x105, 1),
        ("call", 0x106, 0x200, 0), ("cond", 0x203, 0x20a, 1),
        ("return", 0x20a, 0x10b, 1),
    ]
    # the default mask drops cond_not_taken
    assert all(r.kind != "cond_not_taken" for r in run_tracker())


def test_within_each_activation_opens_a_window():
    recs = run_tracker(Trigger(within=0x200), Mask(frozenset({"call", "return"})))
    got = [(r.kind, r.from_, r.to, r.depth) for r in recs]
    assert got == [
        # first outermost activation: two recursive calls inside it
        ("call", 0x205, 0x200, 0), ("call", 0x205, 0x200, 1),
        ("return", 0x20a, 0x20a, 2), ("return", 0x20a, 0x20a, 1),
        ("return", 0x20a, 0x105, 0),
        # second activation (a new window; main's call is outside both)
        ("return", 0x20a, 0x10b, 0),
    ]


def test_start_stop_and_ranges():
    # on at the second call site in main, off when reaching 0x10b
    recs = run_tracker(Trigger(start=0x106, stop=0x10b), Mask(frozenset(KINDS)))
    assert [(r.kind, r.from_, r.to, r.depth) for r in recs] == [
        ("call", 0x106, 0x200, 0), ("cond", 0x203, 0x20a, 1),
        ("return", 0x20a, 0x10b, 1)]
    # only a stop: on from the beginning until 0x105 is reached
    recs = run_tracker(Trigger(stop=0x105), Mask(frozenset({"call"})))
    assert [r.from_ for r in recs] == [0x100, 0x205, 0x205]
    # from-ranges: only main's branches
    recs = run_tracker(None, Mask(frozenset({"call", "return"}), ranges=((0x100, 0x110),)))
    assert [(r.kind, r.from_) for r in recs] == [("call", 0x100), ("call", 0x106)]


def test_pid_tid_mask():
    m = Mask(frozenset({"call"}), tids=frozenset({5}))
    assert run_tracker(None, m, tid=4) == []
    assert len(run_tracker(None, m, tid=5)) == 4
    m = Mask(frozenset({"call"}), pids=frozenset({9}))
    assert run_tracker(None, m, pid=1) == []


def test_interrupt_and_gap():
    t = Tracker(None, Mask(frozenset(KINDS)))
    th = t.thread(1, 1)
    t.step(th, 0x100, CALL_F_100)
    t.interrupt(th, 0x200, 0x9000)         # signal arrives before f's first insn
    t.step(th, 0x9000, None)
    t.step(th, 0x9001, RET)
    t.gap(th)                              # continuity lost: the ret has no target
    t.step(th, 0x5000, None)
    # the signal: interrupted at 0x200 (to untraced code), back in the handler
    assert [(r.kind, r.from_, r.to) for r in t.out] == [
        ("sysret", None, 0x100), ("call", 0x100, 0x200), ("interrupt", 0x200, None),
        ("iret", None, 0x9000)]


# ------------------------------------------------------------------ live log

def test_log_window_edges():
    """A stepper log with two windows on one thread: the last instruction of
    a window gets the window's off pc as its target, and nothing links the
    end of one window to the start of the next."""
    w = X.Writer()
    w.ctx(10, 11)
    w.thread_start(0)
    code_f = b"\x90\xc3"                   # 0x200 nop ; 0x201 ret
    w.block(10, 1, 0x200, bytes([1, 1]), code_f)
    w.exec([1])
    w.exec([1])
    w.thread_exit(0)
    windows = [Window(True, 10, 11, 0x200, 0), Window(False, 10, 11, 0x105, 2),
               Window(True, 10, 11, 0x200, 2), Window(False, 10, 11, 0x10b, 4)]
    tr = Tracker(Trigger(within=0x200), Mask(frozenset(KINDS)))
    recs = list(records_from_log(bytes(w), windows, tr))
    assert [(r.pid, r.tid, r.kind, r.from_, r.to, r.depth) for r in recs] == [
        (10, 11, "return", 0x201, 0x105, 0), (10, 11, "return", 0x201, 0x10b, 0)]


def test_log_signal_and_syscall():
    w = X.Writer()
    w.ctx(3, 3)
    w.block(3, 1, 0x1000, bytes([2, 2]), b"\x0f\x05\x74\x00")  # syscall ; je +0
    w.block(3, 2, 0x8000, bytes([1]), b"\xc3")                  # handler: ret
    w.exec([1])
    w.signal(10, True, 0x8000, 0x1004)
    w.exec([2])
    tr = Tracker(None, Mask(frozenset(KINDS)))
    recs = list(records_from_log(bytes(w), [], tr))
    # the stepper never sees the kernel: a syscall and a signal delivery are
    # each a transfer out to None and one back from None
    assert [(r.kind, r.from_, r.to) for r in recs] == [
        ("sysret", None, 0x1000),
        ("syscall", 0x1000, None), ("sysret", None, 0x1002),
        ("cond_not_taken", 0x1002, 0x1004),
        ("interrupt", 0x1004, None), ("iret", None, 0x8000)]


# ------------------------------------------------------------------ resolve

class _Img:
    is_pie = False
    low = 0x400000

    def __init__(self, funcs):
        self._f = funcs

    def functions(self):
        return iter(self._f)


class _Sym:
    def __init__(self, *imgs):
        self.images = list(imgs)


def test_resolve():
    s = _Sym(_Img([(0x401000, 0x40, "fib"), (0x401040, 0x10, "fib_iter"),
                   (0x401100, 0x80, "main")]))
    assert resolve.address(s, "fib") == 0x401000
    assert resolve.address(s, "main+0x10") == 0x401110
    assert resolve.address(s, "0x1234") == 0x1234
    assert resolve.address(s, "4096") == 4096
    assert resolve.address(s, "+0x20", base=0x555000) == 0x555020
    assert resolve.address_range(s, "fib") == (0x401000, 0x401040)
    assert resolve.address_range(s, "0x10-0x20") == (0x10, 0x20)
    with pytest.raises(ValueError, match="empty range"):
        resolve.address_range(s, "0x20-0x10")
    with pytest.raises(SymbolNotFound) as e:
        resolve.address(s, "fibb")
    assert str(e.value) == "unknown symbol 'fibb' (close matches: fib)"
    with pytest.raises(SymbolNotFound, match=r"close matches: fib_iter\)"):
        resolve.address(s, "fib_itre")
    with pytest.raises(SymbolNotFound, match=r"'zzz' \(no close matches\)"):
        resolve.address(s, "zzz")
    m = MaskSpec(parse_kinds("call"), ranges=("main", "0x10-0x20")).bind(s)
    assert m.ranges == ((0x401100, 0x401180), (0x10, 0x20))
    assert TriggerSpec(within="fib").bind(s) == Trigger(within=0x401000)
    with pytest.raises(ValueError, match="excludes"):
        TriggerSpec(start="a", within="fib")


def test_signal_handlers_run_one_level_deeper():
    """A handler entered at a syscall's exit, or by an interrupt, is one
    level deeper; its sigreturn restores the depth; a --within window is
    not closed by the handler's return."""
    SYSCALL = decode(b"\x0f\x05")
    t = Tracker(Trigger(within=0x200), Mask(frozenset(KINDS)))
    th = t.thread(1, 1)
    steps = [
        (0x100, CALL_F_100),            # main: call f
        (0x200, SYSCALL),               # f: kill(getpid(), SIGUSR1)
        (0x9000, RET),                  # handler at syscall exit: ret
        (0x9100, SYSCALL),              # __restore_rt: rt_sigreturn
        (0x202, None),                  # back after f's syscall
    ]
    for pc, x in steps:
        t.step(th, pc, x)
    t.interrupt(th, 0x203, 0x9000)      # async signal before 0x203
    for pc, x in [(0x9000, RET), (0x9100, SYSCALL), (0x203, RET), (0x105, None)]:
        t.step(th, pc, x)
    assert [(r.kind, r.from_, r.to, r.depth) for r in t.out] == [
        # each transfer through the untraced kernel is two records; the
        # one back from None has the depth of the code it resumes
        ("syscall", 0x200, None, 0), ("iret", None, 0x9000, 1),
        ("return", 0x9000, 0x9100, 1),
        ("syscall", 0x9100, None, 0), ("iret", None, 0x202, 0),
        ("interrupt", 0x203, None, 0), ("iret", None, 0x9000, 1),
        ("return", 0x9000, 0x9100, 1),
        ("syscall", 0x9100, None, 0), ("iret", None, 0x203, 0),
        ("return", 0x203, 0x105, 0),
    ]
    assert not th.on


def test_log_undefined_block_is_a_log_error():
    w = X.Writer()
    w.ctx(1, 1)
    w.exec([7])
    with pytest.raises(X.ExecLogError, match="block 7 of pid 1 executed before"):
        list(records_from_log(bytes(w), [], Tracker()))


# ------------------------------------------------------------------ decoded batches

def _call_batches(n, per=64):
    """Batches of a loop that calls 0x200 from 0x100 (a record ending in
    the call, a record ending in a return): ``n`` calls."""
    import numpy as np
    from hwtrace.flow.batches import BLOCK, Batch
    done = 0
    first = 0
    while done < n:
        k = min(per, n - done)
        recs = []
        for _ in range(k):
            recs.append((0x100, 0x100, 0, 0, 1, 2, 5, 3, 0))     # call 0x200
            recs.append((0x200, 0x200, 0, 0, 1, 3, 1, 3, 0))     # ret
        b = np.array(recs, BLOCK)
        yield Batch(b, None, [], first)
        first += 2 * k
        done += k


class _Input:
    def __init__(self, batches):
        from hwtrace.analysis.records import StreamInfo
        from hwtrace.cli._inputs import InputStream
        from hwtrace.analysis.symbols import Symbolizer
        self.streams = [InputStream(StreamInfo(pid=1, tid=1), batches=batches)]
        self.symbolizer = Symbolizer()
        self.code = []


def test_decoded_arrays_stream_per_batch():
    """Decoded records come out as numpy chunks, batch after batch (a long
    trace is never held whole); stopping early stops the decoding."""
    from hwtrace.branches.decoded import CodeReader, DecodedTrace
    from hwtrace.branches.records import KIND_CODE
    pulled = []

    def batches(**kw):
        for b in _call_batches(1000):
            pulled.append(len(b.blocks))
            yield b
    r = CodeReader()
    r._files["mem"] = b"\xe8\xfb\x00\x00\x00"
    r.add(0x100, 5, "mem", 0)
    t = DecodedTrace(_Input(batches), r, TriggerSpec(), MaskSpec(frozenset({"call"})))
    it = t.arrays()
    first = next(it)
    assert len(pulled) == 1 and len(first) <= 64
    assert set(first["kind"].tolist()) == {KIND_CODE["call"]}
    assert (first["from"] == 0x100).all() and (first["to"] == 0x200).all()
    it.close()
    assert len(pulled) == 1
    recs = list(DecodedTrace(_Input(batches), r, TriggerSpec(),
                             MaskSpec(frozenset({"call", "return"}))).records())
    assert len(recs) == 2 * 1000 - 1           # the last return is pending at the end
    assert [x.depth for x in recs[:4]] == [0, 1, 0, 1]


@pytest.mark.parametrize("trigger,kinds", [
    (TriggerSpec(), None), (TriggerSpec(within="0x200"), {"call", "return"}),
    (TriggerSpec(start="0x200"), {"return"})])
def test_decoded_transfers_compiled_match_twin(monkeypatch, trigger, kinds):
    """The compiled transfers (decoded._Consumer._vector's core) give the
    twin's records, depths and windows."""
    import numpy as np
    from hwtrace.branches import decoded
    from hwtrace.branches.decoded import CodeReader, DecodedTrace
    r = CodeReader()
    r._files["mem"] = b"\xe8\xfb\x00\x00\x00"
    r.add(0x100, 5, "mem", 0)
    mask = MaskSpec() if kinds is None else MaskSpec(frozenset(kinds))
    got = []
    for impl in ("compiled", "python"):
        monkeypatch.setattr(decoded._Consumer, "impl", impl)
        t = DecodedTrace(_Input(lambda **kw: _call_batches(300)), r, trigger, mask)
        got.append(np.concatenate(list(t.arrays())).tobytes())
    assert got[0] == got[1] and len(got[0]) > 0


def _event_consumer(per_cpu=False):
    """A decoded-trace consumer over: 0x1000 syscall ; 0x1002 ret ;
    0x1003 int $0x80 ; 0x1005 nop."""
    from hwtrace.branches.decoded import CodeReader, _Consumer
    r = CodeReader()
    r._files["mem"] = b"\x0f\x05\xc3\xcd\x80\x90"
    r.add(0x1000, 6, "mem", 0)
    t = Tracker(None, Mask(frozenset(KINDS)))
    return _Consumer(t, t.thread(1, 1), r, per_cpu=per_cpu)


def test_decoded_enable_disable_events():
    """User-only trace: every way into and out of the untraced kernel is a
    record with a None end, as the hase_loopy capture's .trace lists them."""
    c = _event_consumer()
    feed = c.feed
    ins = lambda ip, cls="other": feed({"ip": ip, "size": 1, "iclass": cls})
    feed({"event": "disabled", "status_update": True, "ip_suppressed": True})  # PSB+
    feed({"event": "enabled", "ip": 0x1000, "tsc": 5})       # first: back from execve
    feed({"event": "async_disabled", "at": 0x1000, "tsc": 6})   # interrupt before 0x1000
    feed({"event": "enabled", "ip": 0x1000, "resumed": True, "tsc": 7})
    ins(0x1000, "far_call")
    feed({"event": "disabled", "ip_suppressed": True})
    feed({"event": "enabled", "ip": 0x1002, "resumed": True})   # back after the syscall
    ins(0x1002, "return")
    ins(0x1000, "far_call")
    feed({"event": "disabled", "ip_suppressed": True})
    feed({"event": "enabled", "ip": 0x1005})                 # a signal handler at exit
    ins(0x1005)
    ins(0x1003, "far_call")                                  # int $0x80 (rt_sigreturn)
    feed({"event": "disabled", "ip_suppressed": True})
    feed({"event": "enabled", "ip": 0x1002})                 # back where it was
    ins(0x1002, "return")
    feed({"event": "overflow"})
    feed({"event": "enabled", "ip": 0x1005})                 # after an unknown exit
    assert [(r.kind, r.from_, r.to, r.depth, r.time) for r in c.tracker.out] == [
        ("sysret", None, 0x1000, 0, 5),
        ("interrupt", 0x1000, None, 0, 6), ("iret", None, 0x1000, 0, 7),
        ("syscall", 0x1000, None, 0, 7), ("sysret", None, 0x1002, 0, 7),
        ("return", 0x1002, 0x1000, 0, 7),
        ("syscall", 0x1000, None, -1, 7), ("iret", None, 0x1005, 0, 7),
        ("interrupt", 0x1003, None, 0, 7), ("iret", None, 0x1002, -1, 7),
        ("iret", None, 0x1005, -1, 7),
    ]


def test_decoded_psb_status_updates_are_not_transfers():
    """A PSB+ can fall between a branch and its target (ptgen's pacing, or
    any hardware capture): its FUP is reported as a status-update enable
    at the target.  That is no trip through untraced code: the branch keeps
    its target and no iret from None appears (the async-signal window test
    saw ('iret', None, 'spin', 0) where a PSB+ fell inside spin's loop,
    and a handler's return to __restore_rt cut in two)."""
    c = _event_consumer()
    feed = c.feed
    ins = lambda ip, cls="other": feed({"ip": ip, "size": 1, "iclass": cls})
    psb_on = lambda ip: (feed({"event": "enabled", "ip": ip, "status_update": True,
                               "resumed": True}),
                         feed({"event": "exec_mode", "ip": ip, "status_update": True,
                               "mode": "64bit"}))
    psb_on(0x1002)                 # a trace starting at a PSB+: back from execve
    ins(0x1002, "return")
    psb_on(0x1005)                 # between the return and its target
    ins(0x1005)
    psb_on(0x1000)                 # between two plain instructions
    ins(0x1000, "far_call")        # syscall
    feed({"event": "disabled", "ip_suppressed": True})
    feed({"event": "disabled", "status_update": True, "ip_suppressed": True})  # PSB+, off
    feed({"event": "enabled", "ip": 0x1002})
    ins(0x1002, "return")
    feed({"event": "overflow"})    # after an overflow the state is unknown:
    psb_on(0x1005)                 # the PSB+ resumes tracing
    ins(0x1005)
    assert [(r.kind, r.from_, r.to) for r in c.tracker.out] == [
        ("sysret", None, 0x1002), ("return", 0x1002, 0x1005),
        ("syscall", 0x1000, None), ("sysret", None, 0x1002),
        ("iret", None, 0x1005)]


def test_decoded_traced_kernel_and_per_cpu():
    # the kernel traced (OS bit): the syscall goes on to the kernel entry
    c = _event_consumer()
    c.feed({"event": "enabled", "ip": 0x1000})
    c.insn(0x1000, 2, "far_call")
    c.insn(0xffffffff81000000, 3, "other")
    assert [r.key() for r in c.tracker.out] == [
        ("sysret", None, 0x1000), ("syscall", 0x1000, 0xffffffff81000000)]
    # per-CPU: an enable elsewhere may be another thread, not a handler
    c = _event_consumer(per_cpu=True)
    c.feed({"event": "enabled", "ip": 0x1000})
    c.insn(0x1000, 2, "far_call")
    c.feed({"event": "disabled", "ip_suppressed": True})
    c.feed({"event": "enabled", "ip": 0x1005})
    assert [(r.key(), r.depth) for r in c.tracker.out] == [
        (("sysret", None, 0x1000), 0), (("syscall", 0x1000, None), 0),
        (("iret", None, 0x1005), 0)]


def test_decoded_ip_filter_exit():
    """A call out of the traced ranges (TIP.PGD with the target IP) and the
    enable at its fall-through: the callee ran untraced, a return from None."""
    from hwtrace.branches.decoded import CodeReader, _Consumer
    r = CodeReader()
    r._files["mem"] = b"\xe8\xfb\x00\x00\x00\x90"       # 0x100 call 0x200 ; nop
    r.add(0x100, 6, "mem", 0)
    t = Tracker(None, Mask(frozenset(KINDS)))
    c = _Consumer(t, t.thread(1, 1), r)
    c.feed({"event": "enabled", "ip": 0x100})
    c.insn(0x100, 5, "call")
    c.feed({"event": "disabled", "ip": 0x200, "ip_suppressed": False})
    c.feed({"event": "enabled", "ip": 0x105})
    c.insn(0x105, 1, "other")
    assert [(r.key(), r.depth) for r in t.out] == [
        (("sysret", None, 0x100), 0), (("call", 0x100, 0x200), 0),
        (("return", None, 0x105), 0)]




def test_batch_events_read_as_their_json():
    """A batch's events go to the consumer from the Event itself
    (_batch_event); the records and state are those of feeding the
    event's JSON object (event_json), for every event kind it acts on,
    with and without a TSC, IP suppressed or not, status updates."""
    from hwtrace.flow.events import Event
    from hwtrace.flow.sinks import event_json
    evs = [Event("disabled", status_update=True, ip_suppressed=True),
           Event("enabled", ip=0x1000, has_tsc=True, tsc=5),
           Event("async_disabled", at=0x1000, has_tsc=True, tsc=6),
           Event("enabled", ip=0x1000, resumed=True, has_tsc=True, tsc=7),
           "far_call",
           Event("disabled", ip_suppressed=True),
           Event("enabled", ip=0x1002, resumed=True),
           "return", "far_call",
           Event("disabled", ip=0x1005),                 # its IP told
           Event("enabled", ip=0x1005, has_tsc=True, tsc=9),
           Event("enabled", ip=0x1005, status_update=True),
           Event("tick", ip=0x1005, has_tsc=True, tsc=11),
           Event("overflow", ip_suppressed=True),
           Event("disabled", status_update=True),
           Event("enabled", ip=0x1005, status_update=True, has_tsc=True, tsc=0),
           Event("async_disabled", at=0x1003),
           Event("enabled", ip=0x1002)]
    got = []
    for batch in (False, True):
        for per_cpu in (False, True):
            c = _event_consumer(per_cpu)
            ip = 0x1000
            for e in evs:
                if isinstance(e, str):
                    c.feed({"ip": ip, "size": 1, "iclass": e})
                    ip = 0x1002 if e == "far_call" else 0x1000
                elif batch:
                    c._batch_event(e)
                else:
                    c.feed(event_json(e, 0))
            th = c.th
            got.append(([(r.kind, r.from_, r.to, r.depth, r.time) for r in c.tracker.out],
                        c.time, c.enabled, th.exit, th.exit_at, th.depth))
    assert got[:2] == got[2:] and len(got[0][0]) > 5

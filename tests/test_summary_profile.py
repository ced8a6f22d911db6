"""Per-function totals behind ``hwtrace summary`` (and its rendering)."""

from __future__ import annotations

from hwtrace.analysis import Activation, Enter, Flag, Marker, StreamInfo, reconstruct
from hwtrace.analysis.profile import Profile
from hwtrace.analysis.synth import fib_calls, fib_flow
from hwtrace.cli.summary import render


def feed(profile, recs, info=StreamInfo(1, 1), unit="insns"):
    profile.begin_stream(info, unit)
    for r in recs:
        profile.add(r)


def test_recursion_counted_once_inclusive():
    s, items = fib_flow(6)
    items = list(items)
    p = Profile()
    feed(p, reconstruct(items, lookup=s.lookup))
    fib = p.funcs[("fib", s.addr["fib"])]
    assert fib.calls == fib_calls(6)
    top = [a for a in reconstruct(items, lookup=s.lookup)
           if type(a) is Activation and a.name == "fib" and a.depth == 1][0]
    assert fib.incl_insns == top.insns           # not the sum over the recursion
    assert fib.excl_insns == top.insns           # fib only calls fib
    assert p.insns == s.insns


def test_same_name_different_functions_stay_apart():
    recs = [Enter(0x1000, "_start", 0, 0, 0, Flag.BEGIN_UNKNOWN),
            Activation(0x1000, "_start", 0, 0, 5, 0, 5, 0, 0, Flag.BEGIN_UNKNOWN),
            Enter(0x2000, "_start", 0, 5, 5, Flag.TAIL_CALL),
            Activation(0x2000, "_start", 0, 5, 9, 5, 9, 0, 0, Flag.TAIL_CALL),
            Marker("overflow", 9, 9, 0x40, "trace overflow: data lost")]
    p = Profile()
    feed(p, recs)
    assert set(p.funcs) == {("_start", 0x1000), ("_start", 0x2000)}
    assert p.funcs[("_start", 0x1000)].calls == 0     # begun before the trace
    assert p.funcs[("_start", 0x2000)].calls == 1
    text = render(p, {"streams": 1, "insns": 9, "activations": 2}, "t", 5)
    lines = text.splitlines()
    assert lines[2] == "lost data / errors: 1 overflow"
    assert lines[3] == "  at insn 9: offset 0x40: overflow: trace overflow: data lost"
    names = [l.split()[0] for l in lines[6:]]
    assert names == ["_start@0x1000", "_start@0x2000"]


def test_one_function_loaded_by_two_processes_is_one_row():
    # a shell and the program it runs load ld.so each at its own base:
    # do_lookup_x at 0x7000 and 0x9000 is one function (one place: file and
    # link-time address), counted once; two mains of two programs stay two
    # rows, named by their files; two static helpers of one file by address
    def act(f, name, b, e):
        return Activation(f, name, 0, b, e, b, e, 0, 0, Flag(0))
    recs = [act(0x7000, "do_lookup_x", 0, 10), act(0x9000, "do_lookup_x", 10, 14),
            act(0x1100, "main", 14, 20), act(0x1200, "main", 20, 23),
            act(0x7400, "check", 23, 24), act(0x7500, "check", 24, 26)]
    places = {("do_lookup_x", 0x7000): ("ld.so", "/ld.so", 0x100),
              ("do_lookup_x", 0x9000): ("ld.so", "/ld.so", 0x100),
              ("main", 0x1100): ("sh", "/bin/sh", 0x1100),
              ("main", 0x1200): ("gzip", "/bin/gzip", 0x1200),
              ("check", 0x7400): ("ld.so", "/ld.so", 0x500),
              ("check", 0x7500): ("ld.so", "/ld.so", 0x600)}
    p = Profile(split=None)
    feed(p, recs)

    def place(name, f):
        return places.get((name, f))
    same = p.same_functions(place)
    merged = p.merged(p.funcs, same)
    assert merged[("do_lookup_x", 0x7000)].calls == 2
    assert merged[("do_lookup_x", 0x7000)].excl_insns == 14
    assert ("do_lookup_x", 0x9000) not in merged and len(merged) == 5
    assert p.funcs[("do_lookup_x", 0x7000)].calls == 1      # the profile's own: as it was
    text = render(p, {"streams": 1, "insns": 26, "activations": 6}, "t", 10,
                  same=same, place=place)
    names = {l.split()[0] if "(" not in l else l[:l.index(")") + 1]
             for l in text.splitlines()[5:] if l.strip()}
    assert names == {"do_lookup_x", "main (sh)", "main (gzip)",
                     "check@0x7400", "check@0x7500"}, text
    # without places (one program): as before
    text = render(p, {"streams": 1, "insns": 26, "activations": 6}, "t", 10)
    assert "do_lookup_x@0x9000" in text and "main@0x1200" in text


def _enter(f, name, d, b, flags=Flag(0)):
    return Enter(f, name, d, b, b, flags, 1)


def _act(f, name, d, b, e, child=0, flags=Flag(0)):
    return Activation(f, name, d, b, e, b, e, child, child, flags, 1)


def test_what_main_tail_calls_is_the_program():
    """node's main is one jump to node::Start: the function main
    tail-calls (and what that one calls) is main going on, not start-up;
    exit, called after it returns, is."""
    recs = [_enter(0x10, "_start", 0, 0), _enter(0x20, "__libc_start_main", 1, 1),
            _enter(0x30, "main", 2, 2), _act(0x30, "main", 2, 2, 3),
            _enter(0x40, "start", 2, 3, Flag.TAIL_CALL),
            _enter(0x50, "work", 3, 4), _act(0x50, "work", 3, 4, 100),
            _act(0x40, "start", 2, 3, 101, 96, Flag.TAIL_CALL),
            _enter(0x60, "exit", 2, 102), _act(0x60, "exit", 2, 102, 110),
            _act(0x20, "__libc_start_main", 1, 1, 111, 101),
            _act(0x10, "_start", 0, 0, 112, 111)]
    p = Profile()
    feed(p, recs, StreamInfo(1, 1))
    p.close()
    assert p.has_startup
    assert {k[0] for k in p.part("program")} == {"main", "start", "work"}
    assert {k[0] for k in p.part("startup")} == {"_start", "__libc_start_main", "exit"}


def test_a_thread_that_lost_its_stack_in_main_is_the_program():
    """A CPU's stream loses a thread's stack when it ran on another CPU
    meanwhile: main was switched out, never seen to return, and what the
    thread runs when it comes back (afresh) is still the program's."""
    recs = [_enter(0x10, "_start", 0, 0), _enter(0x30, "main", 1, 1),
            _enter(0x50, "work", 2, 2),
            _act(0x50, "work", 2, 2, 50, 0, Flag.SWITCHED_OUT),
            _act(0x30, "main", 1, 1, 50, 48, Flag.SWITCHED_OUT),
            _act(0x10, "_start", 0, 0, 50, 49, Flag.SWITCHED_OUT),
            _enter(0x50, "work", 0, 60, Flag.BEGIN_UNKNOWN),
            _act(0x50, "work", 0, 60, 90, 0, Flag.BEGIN_UNKNOWN),
            _enter(0x70, "more", 0, 90, Flag.BEGIN_UNKNOWN),
            _act(0x70, "more", 0, 90, 95, 0, Flag.BEGIN_UNKNOWN)]
    p = Profile()
    feed(p, recs, StreamInfo(1, 1))
    p.close()
    prog = p.part("program")
    assert {k[0] for k in prog} == {"main", "work", "more"}
    assert prog[("work", 0x50)].excl_insns == 48 + 30
    assert {k[0] for k in p.part("startup")} == {"_start"}

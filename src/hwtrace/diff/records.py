"""``hwtrace diff``'s records: what a divergence says, as plain dicts.

The jsonl output prints them as they are; the text output
(:mod:`.text`) renders them.  Addresses are integers (``ip``); each has
an ``at`` beside it (``function+0xoff`` in that run's symbols) and, where
the code has debug info, a ``line`` (``file:line``).

A divergence record (``"type": "divergence"``):

* ``function``: where the runs parted (the function of the deciding
  branch, in A's symbols), ``stack``: the function of every open frame
  there, outermost first (``frames`` has both runs' stacks with call
  sites and lines);
* ``a`` / ``b``: each run's first differing step -- ``insn`` (instruction
  index in the thread), ``offset`` (trace offset), ``ip``, ``at``,
  ``line`` and its first instructions (``next``); ``ip`` is null where
  that run's trace ended;
* ``common``: the last instructions both ran, ending with the deciding
  branch;
* ``branch``: the branch that decided -- ``kind`` "conditional" (with
  ``taken`` per run), "indirect" or "return" (two targets), or "syscall"
  -- with its ``ip``, ``at``, ``insn`` text, ``line``, and per run where
  it went (``a``/``b``: ``to``, ``at``); null where the difference is in
  the step itself (``reason`` says what: a trace ended, data was lost);
* ``region``: what each run did until they are in step again
  (instructions, calls, the functions called most) and where that is
  (``meet``: ``at``, ``how``, each run's instruction index), or why
  they never are (``end``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hwtrace.x86.decoder import decode
from hwtrace.x86.insn import Kind, X86Error

from . import disasm
from .align import Divergence, Point
from .steps import CALL, FAR_CALL, FAR_RETURN, RETURN

#: instructions shown before and after the parting
CONTEXT = 4

_SYSCALLS = frozenset({Kind.SYSCALL, Kind.SYSENTER, Kind.INT, Kind.INT3,
                       Kind.INT1, Kind.INTO})


@dataclass
class SideContext:
    """What a record needs from one run: its symbols and its code."""

    symtab: object          # .symtab.SymTab of the thread's process
    read: object            # read(addr, size) -> bytes | None
    label: str = ""
    relocation: object = None   # B: .relocate.Relocation into A's terms

    def where(self, ip: int | None) -> dict:
        if ip is None:
            return {"ip": None}
        out = {"ip": ip, "at": self.symtab.describe(ip)}
        line = self.symtab.line(ip)
        if line:
            out["line"] = line
        return out

    def function(self, ip: int) -> str:
        return self.symtab.name(self.symtab.func(ip))

    def lines(self, first: int, last: int, k: int, tail: bool) -> list:
        f = disasm.tail if tail else disasm.head
        out = []
        for ln in f(self._read, first, last, k):
            d = self.where(ln.ip)
            d["text"] = ln.text
            out.append(d)
        return out

    def _read(self, addr, size):
        try:
            return self.read(addr, size)
        except Exception:       # noqa: BLE001 - a lazily read image file
            return None

    def insn(self, ip: int):
        code = self._read(ip, 15)
        if not code:
            return None, None
        try:
            i = decode(code)
        except X86Error:
            return None, None
        return i, disasm.text_of(code[:i.size], ip, i)


def frames(side: SideContext, point: Point, at_branch: bool) -> list:
    """Open frames, outermost first: each frame's function and where it
    stands (its call site; the top one at the deciding branch, with
    ``at_branch``, else at the first differing step, or where the trace
    ended)."""
    if at_branch or point.ip is None:
        sites = list(point.before)
        here = point.prev[1] if point.prev is not None else None
    else:
        sites, here = list(point.stack), point.ip
    out = []
    for ip in sites + ([here] if here is not None else []):
        out.append({"function": side.function(ip), **side.where(ip)})
    return out


def _branch(ca: SideContext, cb: SideContext, pa: Point, pb: Point) -> tuple:
    """(branch dict or None, reason or None)."""
    if pa.ip is None and pb.ip is None:
        return None, "both traces end here"
    if pa.ip is None or pb.ip is None:
        who, other = ("A", "B") if pa.ip is None else ("B", "A")
        side, p = (ca, pa) if pa.ip is None else (cb, pb)
        return None, f"{who}'s trace ends here{_how_ended(side, p)}; " \
            f"{other} goes on"
    if pa.gap != pb.gap:
        return None, f"{'A' if pa.gap else 'B'} lost trace data here"
    if pa.prev is None:
        return None, "the runs begin at different places"
    if pa.tip == pb.tip:
        who, side, p = ("A", ca, pa) if pa.n < pb.n else ("B", cb, pb)
        if p.stop is not None:
            return None, f"the same code, cut short in {who}: {who}'s " \
                f"trace ends inside it{_how_ended(side, p)}"
        if cb.relocation is not None and \
                cb.relocation.how_at(pb.ip) == "symbol":
            return None, (f"the builds' code differs here: A runs {pa.n} "
                          f"instructions to {ca.symtab.describe(pa.end)}, "
                          f"B {pb.n} to {cb.symtab.describe(pb.end)}")
        return None, (f"the same code, cut short in {who} (an interrupt, "
                      f"a fault or a gap)")
    return _decided(ca, cb, pa, pb, pa.prev), None


def _how_ended(side: SideContext, p: Point) -> str:
    """How a trace's last stretch stopped, as a phrase."""
    if p.stop is None:
        return ""
    what, addr = p.stop
    at = f" at {side.symtab.describe(addr)}" if addr else ""
    line = side.symtab.line(addr) if addr else None
    at += f" ({line.rsplit('/', 1)[-1]})" if line else ""
    if what == "async_disabled":
        return f": tracing stopped{at} before that instruction ran " \
            f"(a fault or a signal)"
    if what == "disabled":
        return f": tracing was disabled{at}"
    if what == "overflow":
        return f": the trace overflowed{at}"
    return f": a decode error ({what}){at}"


def _decided(ca: SideContext, cb: SideContext, pa: Point, pb: Point,
             prev: tuple) -> dict:
    _ip, end, _n, cls, size, _off = prev
    insn, text = ca.insn(end)
    fall = end + size
    d = {"kind": None, **ca.where(end)}
    if text:
        d["insn"] = text
    if insn is not None and insn.is_cond:
        d["kind"] = "conditional"
    elif cls in (RETURN, FAR_RETURN):
        d["kind"] = "return"
    elif cls == FAR_CALL:
        d["kind"] = "syscall" if insn is not None and insn.kind in _SYSCALLS \
            else "far"
    elif insn is not None and insn.is_indirect:
        d["kind"] = "indirect"
    elif cls == CALL or insn is not None and insn.is_branch:
        d["kind"] = "direct"
    else:
        d["kind"] = "none"
    pbprev = pb.prev
    fall_b = pbprev[1] + pbprev[4] if pbprev else None
    for key, side, p, fl in (("a", ca, pa, fall), ("b", cb, pb, fall_b)):
        t = side.where(p.ip)
        if d["kind"] == "conditional":
            t = {"taken": p.ip != fl, **t}
        d[key] = t
    return d


def divergence(pair: int, div: Divergence, ca: SideContext,
               cb: SideContext) -> dict:
    """The record of one divergence."""
    pa, pb = div.a, div.b
    branch, reason = _branch(ca, cb, pa, pb)
    # where the runs were last together: at the deciding branch, or at
    # the last instruction both ran when one trace ends there
    last = branch is not None or pa.ip is None or pb.ip is None
    fa = frames(ca, pa, last)
    fb = frames(cb, pb, last)
    rec = {
        "type": "divergence", "pair": pair, "number": div.number,
        "function": fa[-1]["function"] if fa else None,
        "stack": [f["function"] for f in fa],
        "depth": len(fa),
    }
    for key, side, p in (("a", ca, pa), ("b", cb, pb)):
        d = {"insn": p.idx, "offset": p.off, **side.where(p.ip)}
        if p.ip is not None:
            d["next"] = side.lines(p.ip, p.end, CONTEXT, tail=False)
        rec[key] = d
    if pa.prev is not None:
        rec["common"] = ca.lines(pa.prev[0], pa.prev[1], CONTEXT, tail=True)
    rec["branch"] = branch
    if reason:
        rec["reason"] = reason
    rec["frames"] = {"a": fa, "b": fb}
    if div.region is not None:
        rec["region"] = region(div, ca, cb)
    return rec


def region(div: Divergence, ca: SideContext, cb: SideContext, top: int = 3) -> dict:
    r = div.region
    out = {}
    for key, side, insns, calls, callees in (
            ("a", ca, r.a_insns, r.a_calls, r.a_callees),
            ("b", cb, r.b_insns, r.b_calls, r.b_callees)):
        named: dict = {}
        for addr, c in callees.items():
            n = side.function(addr)
            named[n] = named.get(n, 0) + c
        most = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        out[key] = {"insns": insns, "calls": calls,
                    "callees": [{"function": n, "calls": c} for n, c in most]}
    if r.meet is not None:
        ma, mb = r.meet
        out["meet"] = {"how": r.how, **ca.where(ma.ip),
                       "function": ca.function(ma.ip) if ma.ip is not None else None,
                       "a": {"insn": ma.idx, "offset": ma.off},
                       "b": {"insn": mb.idx, "offset": mb.off}}
    else:
        out["meet"] = None
        out["end"] = {"a-ended": "A's trace ended; B never came back to a common frame",
                      "b-ended": "B's trace ended; A never came back to a common frame",
                      "ended": "both traces ended apart",
                      "window": "no common point within the look-ahead: "
                                "the rest is one region",
                      "gap": "the other run never reaches the code the "
                             "trace resumes at after the lost data"
                      }.get(r.why, r.why)
    return out

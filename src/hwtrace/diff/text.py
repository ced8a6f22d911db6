"""``hwtrace diff``'s readable output: the records of :mod:`.runs`
rendered as text (the first divergence of a thread pair in full, the
later ones as short summaries, then the coverage difference)."""

from __future__ import annotations

import os
from typing import Iterable, TextIO

#: coverage rows shown per list (jsonl has them all)
ROWS = 20


def _n(x) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def _line(d: dict) -> str:
    ln = d.get("line")
    if not ln:
        return ""
    f, _, no = ln.rpartition(":")
    return f"{os.path.basename(f)}:{no}"


def _at(d: dict | None) -> str:
    if not d or d.get("ip") is None:
        return "(end of trace)"
    return d.get("at") or f"0x{d['ip']:x}"


def _insns(out, rows: list, indent: str) -> None:
    w = max((len(_at(r)) for r in rows), default=0)
    t = max((len(r.get("text", "")) for r in rows), default=0)
    for r in rows:
        line = _line(r)
        out(f"{indent}{_at(r):<{w}}  {r.get('text', ''):<{t}}"
            f"{'  ' + line if line else ''}".rstrip())


def _where(d: dict) -> str:
    line = _line(d)
    return f"{_at(d)}{' (' + line + ')' if line else ''}"


def _went(branch: dict, side: str, pad: bool = True) -> str:
    t = branch.get(side) or {}
    where = _where(t) if t.get("ip") is not None else "(end of trace)"
    if "taken" in t:
        how = "taken" if t["taken"] else "not taken"
        return f"{how:<9} -> {where}" if pad else f"{how} -> {where}"
    return f"-> {where}"


def _deep(n: int) -> str:
    return f"{n} frame{'' if n == 1 else 's'} deep"


def _calls(n: int) -> str:
    return f"{_n(n)} call{'' if n == 1 else 's'}"


def _branch_line(b: dict) -> str:
    kind = {"conditional": "conditional branch", "indirect": "indirect branch",
            "return": "return", "syscall": "system call", "far": "far branch",
            "direct": "branch", "none": "instruction"}.get(b.get("kind"),
                                                           "branch")
    insn = f"  {b['insn']}" if b.get("insn") else ""
    line = _line(b)
    return f"{kind} at {_at(b)}{insn}{'  ' + line if line else ''}"


def _packed(lines: list) -> list:
    """Runs of one line repeated (a recursion) as ``line (xN)``."""
    packed: list = []
    for ln in lines:
        if packed and packed[-1][0] == ln:
            packed[-1][1] += 1
        else:
            packed.append([ln, 1])
    return [f"{ln} (x{k})" if k > 1 else ln for ln, k in packed]


def _stack(out, frames: dict, indent: str) -> None:
    """The frames both runs share once, then each run's own (a side by
    side table would be as wide as the longest C++ name)."""
    fa, fb = frames.get("a", []), frames.get("b", [])
    k = 0
    while k < min(len(fa), len(fb)) and fa[k].get("at") == fb[k].get("at"):
        k += 1
    rest_a, rest_b = fa[k:], fb[k:]
    same = not rest_a and not rest_b
    out(f"{indent}call stack, outermost first"
        f"{' (the same in A and B)' if same else ''}:")
    for ln in _packed([_where(f) for f in fa[:k]]):
        out(f"{indent}  {ln}")
    if same:
        return
    for side, rest in (("A", rest_a), ("B", rest_b)):
        out(f"{indent}  then {side}:" if k else f"{indent}  {side}:")
        for ln in _packed([_where(f) for f in rest]) or ["-"]:
            out(f"{indent}    {ln}")


def _region(out, reg: dict, indent: str) -> None:
    parts = []
    for side in ("a", "b"):
        r = reg[side]
        who = ", ".join(f"{c['function']} x{c['calls']}" for c in r["callees"])
        parts.append(f"{side.upper()} {_n(r['insns'])} instruction"
                     f"{'' if r['insns'] == 1 else 's'}, {_calls(r['calls'])}"
                     f"{' (' + who + ')' if who else ''}")
    out(f"{indent}apart: {'; '.join(parts)}")
    m = reg.get("meet")
    if m:
        out(f"{indent}in step again at {_where(m)} ({m['how']}): "
            f"A instruction {_n(m['a']['insn'])}, B instruction "
            f"{_n(m['b']['insn'])}")
    else:
        out(f"{indent}never in step again: {reg.get('end')}")


def _first(out, d: dict) -> None:
    ind = "    "
    fa = d.get("frames", {}).get("a", [])
    out(f"  #{d['number']} first divergence in {d.get('function')}"
        f"{' (' + _line(fa[-1]) + ')' if fa and _line(fa[-1]) else ''}, "
        f"{_deep(d['depth'])}")
    a, b = d["a"], d["b"]
    out(f"{ind}A: instruction {_n(a['insn'])}"
        f"{', trace offset ' + _n(a['offset']) if a.get('offset') is not None else ''}"
        f"    B: instruction {_n(b['insn'])}"
        f"{', trace offset ' + _n(b['offset']) if b.get('offset') is not None else ''}")
    br = d.get("branch")
    if br:
        out(f"{ind}decided by the {_branch_line(br)}")
        out(f"{ind}  A: {_went(br, 'a')}")
        out(f"{ind}  B: {_went(br, 'b')}")
    if d.get("reason"):
        out(f"{ind}{d['reason']}")
    if d.get("common"):
        out(f"{ind}last instructions both ran:")
        _insns(out, d["common"], ind + "  ")
    for side in ("a", "b"):
        nxt = d[side].get("next")
        if nxt:
            out(f"{ind}{side.upper()} then:")
            _insns(out, nxt, ind + "  ")
        elif d[side].get("ip") is None:
            out(f"{ind}{side.upper()} then: (its trace ends)")
    _stack(out, d.get("frames", {}), ind)
    if d.get("region"):
        _region(out, d["region"], ind)


def _later(out, d: dict) -> None:
    ind = "     "
    br = d.get("branch")
    if br:
        head = (f"{_branch_line(br)}: A {_went(br, 'a', False)}, "
                f"B {_went(br, 'b', False)}")
    else:
        head = f"{d.get('reason')}: A at {_at(d['a'])}, B at {_at(d['b'])}"
    out(f"  #{d['number']} in {d.get('function')}, {_deep(d['depth'])}, "
        f"A instruction {_n(d['a']['insn'])}, B instruction {_n(d['b']['insn'])}")
    out(f"{ind}{head}")
    if d.get("region"):
        _region(out, d["region"], ind)


def _who(w: dict) -> str:
    pid, tid = w.get("pid"), w.get("tid")
    ident = f"{pid}/{tid}" if pid is not None and tid is not None and \
        pid != tid else str(tid if tid is not None else pid)
    name = w.get("program") or w.get("comm")
    return f"{ident} ({name})" if name else ident


def _process(out, r: dict) -> None:
    out(f"process A {_who(r['a'])} = B {_who(r['b'])}: compared by "
        f"{r['compared_by']}")
    for m in r["modules"]:
        if m["how"] == "symbol+offset":
            bid = m.get("build_id", {})
            na, nb = os.path.basename(m["a"]), os.path.basename(m["b"])
            what = "different builds" if na == nb else \
                f"different executables ({na} | {nb})"
            out(f"  {nb}: {what} "
                f"(A {m['a']} build-id {str(bid.get('a'))[:12]}, "
                f"B {m['b']} build-id {str(bid.get('b'))[:12]}): compared "
                f"by symbol+offset, {m['functions']['matched']} functions "
                f"by name, {m['functions']['only_b']} only in B")
        elif m["how"] == "module+offset":
            out(f"  {os.path.basename(m['b'])}: same file at another "
                f"address (moved by {m['moved']:+#x}): compared by module offset")
        elif m["how"] == "only in B":
            out(f"  {m['b']}: only in B")


class TextWriter:
    """Renders records one by one (coverage rows are gathered and printed
    as tables at the summary)."""

    def __init__(self, stream: TextIO, names: tuple = ("A", "B")):
        self.f = stream
        self.cov: list = []

    def out(self, s: str = "") -> None:
        self.f.write(s + "\n")

    def write_all(self, records: Iterable[dict]) -> None:
        for r in records:
            self.write(r)

    def write(self, r: dict) -> None:
        t = r["type"]
        out = self.out
        if t == "diff":
            th = r["threads"]
            out(f"A: {r['a']}  ({th['a']} thread{'s' if th['a'] != 1 else ''})")
            out(f"B: {r['b']}  ({th['b']} thread{'s' if th['b'] != 1 else ''})")
        elif t == "process":
            out()
            _process(out, r)
        elif t == "pair":
            out()
            out(f"thread A {_who(r['a'])} = B {_who(r['b'])}"
                f"{' (as given)' if r.get('paired_by') == 'given' else ''}")
        elif t == "divergence":
            (_first if r["number"] == 1 else _later)(out, r)
        elif t == "pair_end":
            a, b = r["a"], r["b"]
            if r["same"]:
                out(f"  same flow: {_n(a['insns'])} instructions each"
                    if a["insns"] == b["insns"] else
                    f"  same flow ({_n(a['insns'])} | {_n(b['insns'])} instructions)")
            else:
                more = f"; more follow (--max {r['divergences']})" \
                    if r.get("more") else ""
                out(f"  A ran {_n(a['insns'])} instructions, B "
                    f"{_n(b['insns'])}; {r['divergences']} divergence"
                    f"{'s' if r['divergences'] != 1 else ''} shown{more}")
            for side in ("a", "b"):
                if r[side].get("wrapped"):
                    out(f"  {side.upper()}'s trace kept only the end of its "
                        f"run (its circular buffer wrapped)")
                if r[side].get("gaps"):
                    out(f"  {side.upper()}'s trace has {r[side]['gaps']} "
                        f"gap(s) (data lost)")
        elif t == "thread":
            out(f"thread {_who(r)} only in {r['only'].upper()}")
        elif t == "coverage":
            self.cov.append(r)
        elif t == "summary":
            self._coverage()
            out()
            if r["same"]:
                out("the runs are the same")
            else:
                n = r["divergences"]
                lost = r.get("at_lost_data", 0)
                out(f"the runs differ: {r['pairs']} thread pair"
                    f"{'s' if r['pairs'] != 1 else ''}, {n} divergence"
                    f"{'s' if n != 1 else ''} shown"
                    + ((" (where a trace lost data)" if lost == n == 1 else
                        " (all where a trace lost data)" if lost == n else
                        f" ({lost} where a trace lost data)") if lost else "")
                    + (f", {r['only_a']} thread(s) only in A" if r["only_a"] else "")
                    + (f", {r['only_b']} thread(s) only in B" if r["only_b"] else ""))

    def _coverage(self) -> None:
        rows = self.cov
        if not rows:
            return
        out = self.out
        out()
        out("coverage:")
        for side in ("a", "b"):
            fs = [r for r in rows if r["kind"] == "function" and r["only"] == side]
            if fs:
                out(f"  functions only in {side.upper()} ({len(fs)}):")
                w = max(len(r["function"]) for r in fs[:ROWS])
                for r in fs[:ROWS]:
                    out(f"    {r['function']:<{w}}  {_calls(r['calls']):>10}  "
                        f"{_n(r['insns']):>12} instructions")
                if len(fs) > ROWS:
                    out(f"    ... {len(fs) - ROWS} more")
        for side in ("a", "b"):
            es = [r for r in rows if r["kind"] == "edge" and r["only"] == side]
            if es:
                out(f"  edges only in {side.upper()} ({len(es)}):")
                w = max(len(r["from_at"]) for r in es[:ROWS])
                for r in es[:ROWS]:
                    out(f"    {r['from_at']:<{w}} -> {r['to_at']}  x{_n(r['count'])}")
                if len(es) > ROWS:
                    out(f"    ... {len(es) - ROWS} more (--format jsonl lists all)")
        cs = [r for r in rows if r["kind"] == "count"]
        if cs:
            out("  functions whose counts differ most:")
            w = max(len(r["function"]) for r in cs)
            out(f"    {'':<{w}}  {'calls A':>10} {'calls B':>10}  "
                f"{'insns A':>12} {'insns B':>12}")
            for r in cs:
                out(f"    {r['function']:<{w}}  {_n(r['calls']['a']):>10} "
                    f"{_n(r['calls']['b']):>10}  {_n(r['insns']['a']):>12} "
                    f"{_n(r['insns']['b']):>12}")
        for r in rows:
            if r["kind"] == "note":
                out(f"  ({r['text']})")

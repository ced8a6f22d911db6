"""Synthetic but well-formed instruction flows, for tests and benchmarks.

:class:`FlowSynth` plays a program whose functions sit at fixed addresses:
``body(k)`` executes k plain instructions, ``call(f)`` a 5-byte call and
the callee's entry, ``ret()`` a 1-byte return to the caller's fall-through,
``tail(f)`` a jump to another function's start.  Items are ``ptoracle
insn``-shaped dicts; events (``tick`` with a TSC, ``overflow``, ...) can be
interleaved.  ``lookup`` is a matching symbolizer callback.
"""

from __future__ import annotations

import bisect


class FlowSynth:
    FUNC_SIZE = 0x1000

    def __init__(self, names: list[str], base: int = 0x401000,
                 tsc_per_insn: int | None = None, tsc0: int = 1_000_000):
        self.addr = {n: base + i * self.FUNC_SIZE for i, n in enumerate(names)}
        self._starts = sorted((a, n) for n, a in self.addr.items())
        self._keys = [a for a, _ in self._starts]
        self.items: list = []
        self.ip = 0
        self.rets: list[int] = []
        self.tsc_per_insn = tsc_per_insn
        self.tsc = tsc0
        self.insns = 0

    def lookup(self, addr: int):
        i = bisect.bisect_right(self._keys, addr) - 1
        if i < 0 or addr >= self._keys[i] + self.FUNC_SIZE:
            return None
        return self._starts[i]

    def _insn(self, size: int, iclass: str) -> None:
        self.items.append({"ip": self.ip, "size": size, "iclass": iclass,
                           "mode": "64bit", "speculative": False})
        self.insns += 1
        if self.tsc_per_insn:
            self.tsc += self.tsc_per_insn

    def start(self, name: str, offset: int = 0, enabled: bool = True) -> None:
        self.ip = self.addr[name] + offset
        if enabled:
            self.event("enabled", ip=self.ip, resumed=False)

    def event(self, name: str, **fields) -> None:
        d = {"event": name, "offset": 0, "ip_suppressed": False}
        if self.tsc_per_insn:
            d["tsc"] = self.tsc
        d.update(fields)
        self.items.append(d)

    def tick(self) -> None:
        self.event("tick", ip=self.ip)

    def body(self, k: int) -> None:
        for _ in range(k):
            self._insn(4, "other")
            self.ip += 4

    def call(self, name: str) -> None:
        self._insn(5, "call")
        self.rets.append(self.ip + 5)
        self.ip = self.addr[name]

    def ret(self) -> None:
        self._insn(1, "return")
        self.ip = self.rets.pop()

    def tail(self, name: str) -> None:
        self._insn(5, "jump")
        self.ip = self.addr[name]

    def take(self) -> list:
        out, self.items = self.items, []
        return out


def fib_calls(n: int) -> int:
    """How many times fib(n) calls fib, counting itself."""
    return 1 if n < 2 else 1 + fib_calls(n - 1) + fib_calls(n - 2)


def play_fib(s: FlowSynth, n: int) -> None:
    """fib's body as compiled at -O0, roughly: prologue, compare, two
    recursive calls, add, epilogue."""
    s.body(5)
    if n < 2:
        s.body(2)
        s.ret()
        return
    s.body(2)
    s.call("fib")
    play_fib(s, n - 1)
    s.body(3)
    s.call("fib")
    play_fib(s, n - 2)
    s.body(3)
    s.ret()


def fib_flow(n: int, repeat: int = 1, tsc_per_insn: int | None = None,
             tick_every: int = 0):
    """(synth, items iterator): ``main`` calls ``fib(n)`` ``repeat`` times
    then returns into ``__libc_start_call_main`` (begun before the trace).
    With ``tsc_per_insn`` every ``tick_every`` instructions a tick event
    carries the TSC.  Items are generated lazily, one fib tree at a time."""
    s = FlowSynth(["__libc_start_call_main", "main", "fib"],
                  tsc_per_insn=tsc_per_insn)

    def gen():
        s.start("main")
        s.rets.append(s.addr["__libc_start_call_main"] + 0x20)
        s.body(4)
        yield from s.take()
        for _ in range(repeat):
            s.call("fib")
            play_fib(s, n)
            s.body(2)
            items = s.take()
            if tick_every and tsc_per_insn:
                yield from _with_ticks(s, items, tick_every)
            else:
                yield from items
        s.body(3)
        s.ret()
        s.body(2)
        yield from s.take()

    return s, gen()


def _with_ticks(s: FlowSynth, items: list, every: int):
    """Interleave tick events whose TSC matches the instruction count."""
    per = s.tsc_per_insn
    # the TSC after the last item is s.tsc: walk back to the first one
    ninsn = sum(1 for it in items if "iclass" in it)
    tsc = s.tsc - ninsn * per
    k = 0
    for it in items:
        if "iclass" in it:
            if k % every == 0:
                yield {"event": "tick", "offset": 0, "ip_suppressed": False,
                       "ip": it["ip"], "tsc": tsc}
            k += 1
            tsc += per
        yield it

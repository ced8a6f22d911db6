"""The instructions of a straight run of code, as text.

A step is straight-line code from its first instruction to its last, so
its instructions are found by decoding forward from the first.  Lengths
come from hwtrace's own x86 decoder (the one the flow decoder uses, so
the boundaries are the trace's); the text from capstone where it is
installed, else the bytes and the instruction class.

``read(addr, size) -> bytes | None`` is the process's memory image
(:meth:`hwtrace.flow.image.Image.read`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from hwtrace.x86.decoder import decode
from hwtrace.x86.insn import X86Error


class Line(NamedTuple):
    ip: int
    size: int
    text: str


_CS = None


def _capstone():
    global _CS      # noqa: PLW0603 - a cache of an optional import, not state
    if _CS is None:
        try:
            from hwtrace.listing import cslib
            _CS = cslib.engine(64)
        except Exception:   # noqa: BLE001 - not installed or unusable
            _CS = False
    return _CS or None


def text_of(code: bytes, ip: int, insn=None) -> str:
    cs = _capstone()
    if cs is not None:
        for _a, _s, mnemonic, operands in cs.disasm_lite(code, ip, 1):
            return f"{mnemonic} {operands}".strip()
    cls = insn.iclass.name.lower() if insn is not None else "?"
    return f"({code.hex(' ')}) {cls}"


def run(read: Callable, first: int, last: int, limit: int = 4096) -> list[Line]:
    """The instructions from ``first`` through the one at ``last`` (at
    most ``limit``); shorter if the code can't be read or decoded."""
    out: list[Line] = []
    ip = first
    while len(out) < limit:
        code = read(ip, 15)
        if not code:
            break
        try:
            insn = decode(code)
        except X86Error:
            break
        out.append(Line(ip, insn.size, text_of(code[:insn.size], ip, insn)))
        if ip >= last:
            break
        ip += insn.size
    return out


def head(read: Callable, first: int, last: int, k: int) -> list[Line]:
    """The first ``k`` instructions of the run."""
    return run(read, first, last, k)


def tail(read: Callable, first: int, last: int, k: int) -> list[Line]:
    """The last ``k`` instructions of the run."""
    return run(read, first, last)[-k:]

"""x86 disassembly text through capstone (a maintained disassembler:
https://www.capstone-engine.org, ``pip install capstone``; its library
called through :mod:`.cslib`, not its Python package's start-up).

:class:`Disassembler` turns many instructions at once into text: the
trace already says where every instruction starts and how long it is, so
runs of adjacent instructions are disassembled in one capstone call over
their bytes (capstone's per-call cost dominates for single instructions).
Bytes come from a ``read(addr, size)`` callable (an
:class:`hwtrace.flow.image.Image`'s ``read``: it may return fewer bytes at
a section end, so reads are continued across sections).
"""

from __future__ import annotations

import re
from typing import Callable

from hwtrace.listing import cslib

BAD = "(bad)"
_RIP_INTEL = re.compile(r"\[rip ([+-]) (0x[0-9a-f]+|\d+)\]")
_RIP_ATT = re.compile(r"(-?0x[0-9a-f]+|-?\d+)\(%rip\)")


class DisasmError(Exception):
    """No disassembler (capstone is not installed)."""


def available() -> bool:
    return cslib.available()


class Disassembler:
    """``syntax`` "intel" (as ptxed and XED print) or "att"."""

    def __init__(self, read: Callable, syntax: str = "intel"):
        if not cslib.available():
            raise DisasmError("disassembly needs capstone: pip install "
                              "capstone (or use --no-inst)")
        self.read = read
        self.att = syntax == "att"
        self._cs = {}

    def _engine(self, mode: int):
        cs = self._cs.get(mode)
        if cs is None:
            cs = self._cs[mode] = cslib.engine({1: 16, 2: 32}.get(mode, 64), self.att)
        return cs

    def bytes_at(self, addr: int, size: int) -> bytes:
        out = b""
        while len(out) < size:
            part = self.read(addr + len(out), size - len(out))
            if not part:
                break
            out += part
        return out

    def texts(self, ips: list, sizes: list, mode: int) -> dict:
        """{ip: (mnemonic, operands)} for the instructions (ip, size)."""
        cs = self._engine(mode)
        order = sorted(range(len(ips)), key=ips.__getitem__)
        out = {}
        i = 0
        n = len(order)
        while i < n:
            # a run of adjacent instructions: one read, one capstone call
            j = i + 1
            end = ips[order[i]] + sizes[order[i]]
            while j < n and ips[order[j]] == end and j - i < 512:
                end += sizes[order[j]]
                j += 1
            start = ips[order[i]]
            code = self.bytes_at(start, end - start)
            got = {a: (m, o) for a, s, m, o in
                   cs.disasm_lite(code, start, j - i)}
            for k in order[i:j]:
                ip = ips[k]
                r = got.get(ip)
                if r is None:
                    r = self._one(cs, ip, sizes[k])
                out[ip] = r
            i = j
        return out

    def _one(self, cs, ip: int, size: int) -> tuple:
        code = self.bytes_at(ip, size)
        for _a, _s, m, o in cs.disasm_lite(code, ip, 1):
            return m, o
        return BAD, ""

    def rip_target(self, ip: int, size: int, operands: str) -> int | None:
        """The address a RIP-relative operand refers to."""
        if "rip" not in operands:
            return None
        if self.att:
            m = _RIP_ATT.search(operands)
            if m is None:
                return None
            disp = int(m.group(1), 0)
        else:
            m = _RIP_INTEL.search(operands)
            if m is None:
                return None
            disp = int(m.group(2), 0)
            if m.group(1) == "-":
                disp = -disp
        return (ip + size + disp) & 0xFFFFFFFFFFFFFFFF

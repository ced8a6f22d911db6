"""Synthetic Intel PT traces of a small program with the packet patterns
real CPUs emit around VM exits and entries and at PSBs, together with the
instructions the program really executed while traced (ground truth).

The program (64-bit code at :data:`BASE`)::

    1000: nop                  1010: test al, 1
    1001: nop                  1012: je 1015
    1002: inc rax              1014: nop
    1005: jne 1000             1015: ret
    1007: call 1010
    100c: jmp 1000

A :class:`Gen` runs it, taking conditional branches as a seeded random
generator says, and writes the trace a CPU would: TNT bits (compressed
returns as a taken bit, a TIP where the call was before the last PSB),
at chosen instruction boundaries a PSB+ (with
MODE.TSX, PIP, VMCS, TSC, CBR as asked; pending TNT bits written before it
or after its PSBEND), or a VM exit and re-entry::

    fup X ; tip.pgd 0 ; psb ; [mode.tsx] ; mode.exec ; fup Y ; [pip] ;
    [vmcs] ; [cbr] ; psbend ; tip.pge Y

with Y = X (the guest resumes where it left) or X + the size of the
instruction at X (the hypervisor emulated it: CPUID, an I/O access).
Only the trace encoder (:mod:`hwtrace.pt.encoder`) writes packets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hwtrace.pt.encoder import Encoder

BASE = 0x1000
CODE = bytes.fromhex(
    "90" "90" "48ffc0" "75f9"          # 1000 nop; nop; inc rax; jne 1000
    "e804000000" "ebf2"                # 1007 call 1010; jmp 1000
    "9090"                             # 100e (padding)
    "a801" "7401" "90" "c3")           # 1010 test al,1; je 1015; nop; ret

# ip -> (size, kind, branch target)
PROGRAM = {
    0x1000: (1, "other", None), 0x1001: (1, "other", None),
    0x1002: (3, "other", None), 0x1005: (2, "jcc", 0x1000),
    0x1007: (5, "call", 0x1010), 0x100c: (2, "jmp", 0x1000),
    0x1010: (2, "other", None), 0x1012: (2, "jcc", 0x1015),
    0x1014: (1, "other", None), 0x1015: (1, "ret", None),
}
CR3 = 0x1234000
VMCS = 0xabc000


@dataclass
class PsbOpts:
    """What a PSB+ carries besides MODE.EXEC and FUP."""

    tsx: bool = True
    pip: bool = True
    vmcs: bool = True
    cbr: bool = True
    tsc: bool = False
    tma: bool = False       # with TSC: TMA (CTC, fast counter)
    # TNT bits pending at the PSB: written before it (True) or after its
    # PSBEND (False)
    flush_tnt: bool = True


@dataclass
class Gen:
    rng: random.Random
    enc: Encoder = field(default_factory=Encoder)
    ip: int = BASE
    bits: list = field(default_factory=list)
    stack: list = field(default_factory=list)
    insns: list = field(default_factory=list)    # ground truth
    tsc: int = 0x10000
    ctc: int = 0
    traced: int = 0     # instructions up to the last one that made trace
    # (index into insns, ip) of instructions the hypervisor emulated
    skipped: list = field(default_factory=list)

    def start(self, opts: PsbOpts | None = None) -> "Gen":
        self.psb(PsbOpts(tsx=False, pip=False, vmcs=False, cbr=True)
                 if opts is None else opts)
        return self

    # -- execution -----------------------------------------------------------
    def step(self, n: int = 1) -> "Gen":
        for _ in range(n):
            self._one()
        return self

    def _one(self) -> None:
        size, kind, target = PROGRAM[self.ip]
        self.insns.append(self.ip)
        nxt = self.ip + size
        if kind == "jcc":
            taken = self.rng.random() < 0.6
            self._bit(taken)
            self.ip = target if taken else nxt
        elif kind == "call":
            self.stack.append([nxt, True])
            self.ip = target
        elif kind == "jmp":
            self.ip = target
        elif kind == "ret":
            self.ip, compressed = self.stack.pop()
            if compressed:
                self._bit(True)
            else:
                self.flush()
                self.enc.tip(self.ip, ipc=3)
                self.traced = len(self.insns)
        else:
            self.ip = nxt

    def until(self, ip: int, limit: int = 200) -> "Gen":
        """Run until the next instruction is at ``ip``."""
        for _ in range(limit):
            if self.ip == ip and self.insns:
                return self
            self._one()
        raise AssertionError(f"{ip:#x} not reached")

    def _bit(self, taken: bool) -> None:
        self.traced = len(self.insns)
        self.bits.append(taken)
        if len(self.bits) == 6:
            self.flush()

    def timing(self, rng: random.Random) -> "Gen":
        """Timing packets as a CPU with CYC and MTC on writes them between
        branches: CYCs, an MTC (now and then after lost ones), a CBR."""
        e = self.enc
        for _ in range(rng.randrange(0, 3)):
            e.cyc(rng.randrange(1, 0x400))
        r = rng.random()
        if r < 0.5:
            self.ctc = (self.ctc + (1 if r < 0.4 else rng.randrange(2, 40))) \
                & 0xff
            e.mtc(self.ctc)
        elif r < 0.53:
            e.cbr(rng.choice((20, 24, 37)))
        return self

    def flush(self) -> None:
        if self.bits:
            self.enc.tnt8(self.bits)
            self.bits = []

    # -- packets -------------------------------------------------------------
    def _psb_plus(self, fup: int | None, o: PsbOpts) -> None:
        # Returns are compressed only to calls made since the last PSB.
        for frame in self.stack:
            frame[1] = False
        e = self.enc
        e.psb()
        if o.tsc:
            self.tsc += 0x1000
            e.tsc(self.tsc)
            if o.tma:
                e.tma((self.ctc << 3) & 0xffff, 0x12)
        if o.tsx:
            e.mode_tsx()
        if fup is not None:             # MODE.EXEC and FUP: if PacketEn
            e.mode_exec(csl=1)
            e.fup(fup, ipc=3)
        if o.pip:
            e.pip(CR3, nr=1)
        if o.vmcs:
            e.vmcs(VMCS)
        if o.cbr:
            e.cbr(20)
        e.psbend()

    def psb(self, opts: PsbOpts | None = None, fup: bool = True) -> "Gen":
        """A PSB+ at the current instruction boundary (without its FUP:
        a PSB+ that says tracing is off while the CPU goes on tracing)."""
        o = opts or PsbOpts()
        if o.flush_tnt:
            self.flush()
        if fup:
            self.traced = len(self.insns)   # its FUP says where we are
        self._psb_plus(self.ip if fup else None, o)
        return self

    def vm_exit_entry(self, skip: bool = False,
                      opts: PsbOpts | None = None) -> "Gen":
        """Tracing stops at the current IP X (a VM exit) and resumes with
        the VM-entry PSB+ and TIP.PGE at X, or after the instruction at X
        (``skip``: the hypervisor emulated it)."""
        o = opts or PsbOpts()
        self.flush()
        self.traced = len(self.insns)
        e = self.enc
        e.fup(self.ip)
        e.tip_pgd()
        if skip:
            size, kind, _ = PROGRAM[self.ip]
            assert kind == "other"
            self.skipped.append((len(self.insns), self.ip))
            self.ip += size
        self._psb_plus(self.ip, o)
        e.tip_pge(self.ip)
        return self

    def end(self) -> tuple[bytes, list[int]]:
        """The trace (pending TNT bits written) and the instructions
        executed while traced, up to the last one the trace tells of (a
        decoder stops at the last branch: past it, the trace ends)."""
        self.flush()
        return self.enc.getvalue(), self.insns[:self.traced]


def _opts_name(o: PsbOpts) -> str:
    return "-".join(k if getattr(o, k) else "no" + k
                    for k in ("tsx", "pip", "vmcs", "cbr"))


def vm_variants():
    """The VM exit/entry pattern with and without MODE.TSX, PIP, VMCS and
    CBR in the PSB+, the exit right after a conditional branch (its TNT
    bit pending until the FUP forces it out) or after plain instructions,
    the guest resuming at X or after the instruction at X."""
    out = []
    n = 0
    for flags in range(16):
        o = PsbOpts(*(bool(flags >> k & 1) for k in range(4)))
        for skip in (False, True):
            for at in (0x1000, 0x1001, 0x1002):
                n += 1
                g = Gen(random.Random(n)).start()
                g.step(9).until(at)
                g.vm_exit_entry(skip, o)
                g.step(23).psb().step(17)
                name = (f"vm-{_opts_name(o)}-{'skip' if skip else 'same'}"
                        f"-{at:x}")
                out.append((name, g))
    return out


def mixed_variants(seeds=range(24), late_tnt: bool = False,
                   nofup: bool = False):
    """Random runs with four PSB+s or VM exits/entries each.  With
    ``late_tnt`` the TNT bits pending at a PSB are written after its
    PSBEND (CPUs write them before: a PSB forces out a partial TNT); with
    ``nofup`` some PSB+s carry no FUP although the CPU goes on tracing."""
    out = []
    for seed in seeds:
        rng = random.Random(1000 * (1 + late_tnt + 2 * nofup) + seed)
        g = Gen(rng).start()
        for _ in range(4):
            g.step(rng.randrange(1, 30))
            o = PsbOpts(*(rng.random() < 0.5 for _ in range(5)),
                        flush_tnt=not late_tnt or rng.random() < 0.5)
            if rng.random() < 0.5 and PROGRAM[g.ip][1] == "other":
                g.vm_exit_entry(rng.random() < 0.5, o)
            else:
                g.psb(o, fup=not nofup or rng.random() < 0.5)
        g.step(rng.randrange(1, 30))
        kind = "late-tnt" if late_tnt else "nofup" if nofup else "mixed"
        out.append((f"{kind}-{seed}", g))
    return out

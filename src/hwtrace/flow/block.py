"""The block decoder: executed instructions grouped into blocks.

A block is a run of instructions executed in sequence that the decoder
can follow without trace except, possibly, at its last instruction:
it ends after a conditional branch, a return, an indirect or far
branch, a PTWRITE, before an event, at a change of section, and — with
``end_on_call`` / ``end_on_jump`` — after direct calls / jumps (libipt's
pt_block_decoder; ptxed's ``--block:*`` options).

Blocks are built from the instruction decoder's stream, so both decoders
agree by construction, with a **block cache**: per (exec mode, IP) the run
of plain instructions (class OTHER, all inside the mapping of the first)
up to the next decision point, decoded once.  Where the instruction
decoder would take its fast path anyway (tracing on, no event pending or
being processed, not resynchronizing, not at the end) the block decoder
takes a cached run in one step -- the same instructions, IPs and
instruction count the instruction decoder would have produced one by one
-- and lets the instruction decoder handle the instruction that ends it.
The cache is dropped when the image (its generation) or the instruction
cache changes.  The compiled core (:mod:`.fast`) has the same cache in C.
"""

from __future__ import annotations

from typing import NamedTuple

from hwtrace.x86.insn import IClass

from .insn import DecodeError, InsnDecoder
from .fetch import FetchError
from .status import EOS, EVENT_PENDING

MASK64 = 0xFFFFFFFFFFFFFFFF
_OTHER = 1      # IClass.OTHER

_CONTINUES = frozenset((int(IClass.OTHER),))
_CALL = int(IClass.CALL)
_JUMP = int(IClass.JUMP)

# libipt's struct pt_block counts instructions in a uint16_t: a block that
# reaches this many ends there (and the next block goes on), so a decode
# through straight-line code or a loop without trace (``jmp $``) still
# returns from every next().
MAX_BLOCK_INSNS = 0xFFFF


class Block(NamedTuple):
    """libipt's struct pt_block (with the instructions themselves)."""

    ip: int
    end_ip: int
    ninsn: int
    insns: tuple
    mode: str | None
    speculative: bool
    truncated: bool
    iclass: int


class BlockError(NamedTuple):
    """A block decode error; ``block`` holds what was decoded before."""

    code: str
    offset: int
    ip: int
    block: Block | None

    type = "error"


def _block(insns) -> Block | None:
    if not insns:
        return None
    first, last = insns[0], insns[-1]
    return Block(first.ip, last.ip, len(insns), tuple(insns), first.mode,
                 first.speculative, last.truncated, last.iclass)


class BlockDecoder:
    def __init__(self, data, image, config=None):
        self.insn = InsnDecoder(data, image, config)
        self.insn.disable_at_trace_branch = True
        self.config = self.insn.config
        # The block cache: (mode, ip) -> (insns, speculative insns,
        # next ip, mapping begin, mapping end) or None (no plain run there).
        self._runs = {}
        self._runs_key = None

    def _run(self, dec):
        """The cached run of plain instructions at the decoder's IP."""
        cache = dec.cache
        key = (cache, getattr(cache.image, "generation", 0))
        if key != self._runs_key:
            self._runs = {}
            self._runs_key = key
        k = (dec.mode, dec.ip)
        runs = self._runs
        if k in runs:
            return runs[k]
        run = runs[k] = self._fill(cache, dec.mode, dec.ip)
        return run

    @staticmethod
    def _fill(cache, mode, ip):
        if mode is None:
            return None
        m = cache.image.find(ip)
        if m is None:
            return None
        lo, hi = m.begin, m.end
        insns, spec = [], []
        while True:
            try:
                d = cache.decode(ip, mode)
            except FetchError:
                break
            if d.insn.iclass != _OTHER:
                break
            insns.append(d.insn)
            spec.append(d.spec)
            ip = (ip + d.insn.size) & MASK64
            if not lo <= ip < hi:
                break
        if not insns:
            return None
        return tuple(insns), tuple(spec), ip, lo, hi

    @property
    def offset(self) -> int:
        return self.insn.offset

    @property
    def sync_offset(self) -> int:
        return self.insn.sync_offset

    def sync_forward(self):
        return self.insn.sync_forward()

    def sync_backward(self):
        return self.insn.sync_backward()

    def sync_set(self, offset: int):
        return self.insn.sync_set(offset)

    def event(self):
        return self.insn.event()

    def resync(self):
        return self.insn.resync()

    def time(self):
        return self.insn.time()

    def _ends_block(self, insn, x) -> bool:
        c = insn.iclass
        if c in _CONTINUES:
            return False
        if c == _CALL and not x.is_indirect:
            return self.config.end_on_call
        if c == _JUMP and not x.is_indirect:
            return self.config.end_on_jump
        return True

    def next(self):
        """(status, Block) or BlockError (with the partial block)."""
        dec = self.insn
        tables = dec.cache.tables
        insns = []
        lo = hi = 0
        status = 0
        while True:
            room = MAX_BLOCK_INSNS - len(insns)
            if room <= 0:
                return status, _block(insns)
            if dec.enabled and not (dec.process_event or dec.resyncing or
                                    dec.status & (EVENT_PENDING | EOS)):
                run = self._run(dec)
                if run is not None:
                    # What dec.next() would return one by one (its fast
                    # path: status 0), all in this block's mapping.
                    status = 0
                    seq = run[1] if dec.speculative else run[0]
                    if len(seq) > room:
                        seq = seq[:room]
                        insns.extend(seq)
                        dec.icount += room
                        dec.ip = run[0][room].ip
                        return 0, _block(insns)
                    insns.extend(seq)
                    dec.icount += len(seq)
                    dec.ip = run[2]
                    if hi == 0:
                        lo, hi = run[3], run[4]
                    if not lo <= dec.ip < hi:
                        return 0, _block(insns)
                    continue
            r = dec.next()
            if r.__class__ is DecodeError:
                if r.insn is not None:
                    insns.append(r.insn)
                return BlockError(r.code, r.offset, r.ip, _block(insns))
            status, insn = r
            insns.append(insn)
            if status & (EVENT_PENDING | EOS):
                break
            if insn.iclass not in _CONTINUES:
                x = tables[insn.mode][insn.ip].x86
                if self._ends_block(insn, x):
                    break
            if not dec.enabled:
                break
            if hi == 0:
                # A block stays inside the section it started in.
                m = dec.cache.image.find(insn.ip)
                lo, hi = (m.begin, m.end) if m is not None else (0, 1 << 64)
            if not lo <= dec.ip < hi:
                break
        return status, _block(insns)

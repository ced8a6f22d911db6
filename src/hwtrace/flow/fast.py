"""Fast flow decoding: instruction/block counts and edge coverage.

Two questions that need the whole instruction flow but no instruction
records, answered by a compiled core (``_c_flow.c``) where it can and by the
Python decoders (the twin, and the reference) where it cannot::

    from hwtrace.flow import fast
    c = fast.count(data, image, config, decoder="block")   # Counts
    c.insns, c.blocks, c.errors, c.compiled
    e = fast.edges(data, image, config)                     # Edges
    e.counts            # {(from_ip, to_ip): times taken}
    fast.edge_bitmap(e.counts)                             # AFL-style map

**Edges.** For every executed branch instruction (any class but OTHER and
PTWRITE: conditional branches taken or not, direct and indirect jumps and
calls, returns, far transfers), the pair (IP of the branch, IP of the next
instruction the trace shows executing).  That next instruction may come
after a gap in tracing (a syscall disables tracing: its edge goes to where
tracing resumes).  A decode error ends the pair (no edge across an error).
It is the instruction decoder's flow (``--insn-decoder``).

**Bitmap.** :func:`edge_bitmap` folds the edge counts into a ``size``-byte
(default 64 KiB) map the way AFL does: ``h(x) = ((x * 0x9E3779B97F4A7C15)
mod 2**64) >> 48`` and ``index = (h(from) ^ (h(to) >> 1)) % size``; each
byte adds up the counts of the edges mapped there, saturating at 255.

**Which implementation.**  The compiled core decodes exactly like the
Python decoders for the packets of ordinary traces (PSB+, TNT, TIP,
TIP.PGE/PGD, MODE.exec, PAD, MNT and the timing packets TSC, CBR, MTC,
TMA, CYC -- whose only flow effect without tick events is an error, so the
core keeps the twin's time state to find those), FUP + TIP / FUP +
TIP.PGD (asynchronous branches and disables, bound where the flow reaches
the FUP's IP; likewise a PSB+ exec mode ahead of the flow) and bails out on
anything else (errors, OVF, MODE.EXEC + FUP, PIP, VMCS, TSX, STOP, power
packets, event trace, tick/iflags events, address filters, an event IP in
the middle of a cached run); the Python
decoder then decodes that trace, so results never depend on which one
ran.  ``impl="python"`` forces the twin, ``impl="compiled"`` requires the
core (None from :func:`compiled_count` if it bails).  :data:`CORE` is the
extension or None (``HWTRACE_NO_EXTENSIONS=1``; tests monkeypatch it).

Several cores: :mod:`.fast_parallel` runs :func:`compiled_segment` jobs
(the core synchronized at a PSB, recording checkpoints of its state) in a
process pool and stitches them into exactly these counts.

Block cache: the compiled core caches, per (exec mode, IP), the
straight-line run to the next decision point and asks :func:`_run_filler`'s
function -- the Python instruction cache, so x86 decoding is the twin's --
only on a miss; the cache lives for one decode (a changed image is never
stale).
"""

from __future__ import annotations

from typing import NamedTuple

from hwtrace import _ext
from hwtrace.x86.insn import IClass, Kind

from .config import FlowConfig
from .fetch import (FetchError, InsnCache, binds_to_pip, binds_to_vmcs,
                    changes_cpl, changes_cr3)

NAME = "hwtrace.flow._c_flow"
ABI = 4

#: how the selection went (see hwtrace._ext.Status)
STATUS = _ext.select(NAME, ABI)

#: the compiled core in use, or None (the Python twin)
CORE = STATUS.module

MASK64 = 0xFFFFFFFFFFFFFFFF
_MODES = ("16bit", "32bit", "64bit")
_OTHER = int(IClass.OTHER)
_PTWRITE = int(IClass.PTWRITE)
_VMENTRY = (Kind.VMLAUNCH, Kind.VMRESUME)

# flags of _c_flow.decode
_F_BLOCK, _F_END_ON_CALL, _F_END_ON_JUMP, _F_BDM70, _F_SKD022 = 1, 2, 4, 8, 16
_PT_FLAG_SKD007, _PT_FLAG_SKZ84 = 1, 2


class Counts(NamedTuple):
    insns: int
    blocks: int          # 0 for the instruction decoder
    errors: int
    compiled: bool


class Edges(NamedTuple):
    counts: dict         # {(from_ip, to_ip): n}
    insns: int
    errors: int
    compiled: bool


def _core(impl):
    return _ext.core_for(impl, CORE, NAME, ABI, "flow core")


def _run_filler(image):
    """The block-cache miss handler: ``fill(ip, mode)`` -> the run starting
    at ``ip`` (count, last IP, its size, class, indirect, displacement,
    special, mapping begin, mapping end, whether its first instruction is
    VMLAUNCH/VMRESUME -- for SKD022) or None if ``ip`` does not decode.

    A run goes on over plain OTHER instructions inside the mapping of its
    first one and ends with the first instruction that is not plain
    (a branch, PTWRITE, or one a disable event may bind to)."""
    cache = InsnCache(image)

    def fill(ip: int, mode: int):
        name = _MODES[mode]
        try:
            d = cache.decode(ip, name)
        except FetchError:
            return None
        vmentry = int(d.x86.kind in _VMENTRY)
        m = image.find(ip)
        lo, hi = m.begin, m.end
        if hi > MASK64:
            return None         # a mapping up to 2**64: the twin decodes
        n = 0
        cur = ip
        while True:
            x = d.x86
            n += 1
            c = d.insn.iclass
            special = bool(x.is_far or changes_cpl(x) or changes_cr3(x) or
                           binds_to_pip(x) or binds_to_vmcs(x))
            if c != _OTHER or special:
                break
            nip = (cur + x.size) & MASK64
            if not lo <= nip < hi:
                break
            try:
                d = cache.decode(nip, name)
            except FetchError:
                break
            cur = nip
        return (n, cur, x.size, c, int(bool(x.is_indirect)), x.rel,
                int(special), lo, hi, vmentry)
    return fill


_U32 = 0xFFFFFFFF


def _supported(cfg: FlowConfig) -> bool:
    """Configurations the compiled core decodes like the twin (timing
    parameters in the ranges its 64-bit arithmetic reproduces exactly)."""
    return not (cfg.enable_tick_events or cfg.enable_iflags_events or
                cfg.addr_filter.addr_cfg) and \
        0 <= cfg.mtc_freq <= 15 and 0 <= cfg.nom_freq <= _U32 and \
        0 <= cfg.cpuid_0x15_eax <= _U32 and 0 <= cfg.cpuid_0x15_ebx <= _U32


def _timing(cfg: FlowConfig) -> tuple[int, int, int, int]:
    return (cfg.mtc_freq, cfg.nom_freq, cfg.cpuid_0x15_eax,
            cfg.cpuid_0x15_ebx)


def _flags(cfg: FlowConfig, block: bool) -> tuple[int, int]:
    f = _F_BLOCK if block else 0
    if cfg.end_on_call:
        f |= _F_END_ON_CALL
    if cfg.end_on_jump:
        f |= _F_END_ON_JUMP
    if cfg.psb_fup_announces_pge():
        f |= _F_BDM70
    if cfg.errata.skd022:
        f |= _F_SKD022
    p = (_PT_FLAG_SKD007 if cfg.errata.skd007 else 0) | \
        (_PT_FLAG_SKZ84 if cfg.errata.skz84 else 0)
    return f, p


def compiled_decode(data, image, config=None, decoder="block",
                    want_edges=False, impl="compiled"):
    """The compiled core's (reason, insns, blocks, edges): reason None if it
    decoded the trace, else why it bailed out.  None if no core."""
    core = _core(impl)
    if core is None:
        return None
    cfg = config or FlowConfig()
    if not _supported(cfg):
        return ("configuration", 0, 0, None)
    flags, pflags = _flags(cfg, decoder == "block")
    # A file mapping's release_before (hwtrace.cli._tracemap) drops the
    # pages behind the decode, so resident memory stays bounded.
    return core.decode(data, _run_filler(image), flags, pflags, want_edges,
                       _timing(cfg), getattr(data, "release_before", None))


def compiled_segment(data, image, config, block: bool, start: int,
                     stop_at: int, tail: int, head: int, impl=None):
    """One job of the parallel counts path (:mod:`.fast_parallel`): the
    compiled core's ``decode_segment`` -- (reason|None, insns, blocks,
    [(psb, key, return stack, insns, blocks)], stopped) -- synchronized at
    the PSB at ``start`` (-1: the trace start), with checkpoints at its
    first ``head`` PSBs and at PSBs at/after ``stop_at`` (-1: none), up to
    ``tail`` of those.  None if there is no core or the configuration is
    one the core does not decode."""
    core = _core(impl)
    if core is None:
        return None
    cfg = config or FlowConfig()
    if not _supported(cfg):
        return None
    flags, pflags = _flags(cfg, block)
    return core.decode_segment(data, _run_filler(image), flags, pflags,
                               _timing(cfg), start, stop_at, tail, head)


def compiled_count(data, image, config=None, decoder="block",
                   impl=None) -> Counts | None:
    """Counts from the compiled core, or None (no core, or it bailed)."""
    r = compiled_decode(data, image, config, decoder, False,
                        impl if impl is not None else None)
    if r is None or r[0] is not None:
        return None
    return Counts(r[1], r[2] if decoder == "block" else 0, 0, True)


def count_into(sink, data, image, config, block: bool) -> bool:
    """For ``hwtrace decode --quiet --stat``: if the compiled core decodes
    the trace, add its counts to ``sink`` (a sinks.CountSink) and return
    True; else False (the caller runs the Python decoder)."""
    c = compiled_count(data, image, config, "block" if block else "insn")
    if c is None:
        return False
    sink.insns += c.insns
    sink.blocks += c.blocks
    return True


def count(data, image, config=None, decoder="block", impl=None) -> Counts:
    """Instructions (and blocks) ``hwtrace decode --quiet --stat`` counts."""
    if impl != "python":
        c = compiled_count(data, image, config, decoder, impl)
        if c is not None:
            return c
    from . import session
    from .sinks import CountSink
    sink = CountSink()
    if decoder == "block":
        from .block import BlockDecoder
        session.run_blocks(BlockDecoder(data, image, config), sink)
    else:
        from .insn import InsnDecoder
        session.run_insn(InsnDecoder(data, image, config), sink)
    return Counts(sink.insns, sink.blocks, sink.errors, False)


class EdgeSink:
    """A session sink that counts edges from the instruction stream."""

    needs_offset = False

    def __init__(self):
        self.counts = {}
        self.insns = 0
        self.errors = 0
        self._from = None

    def insn(self, insn, offset):
        self.insns += 1
        f = self._from
        if f is not None:
            key = (f, insn.ip)
            self.counts[key] = self.counts.get(key, 0) + 1
        c = insn.iclass
        self._from = insn.ip if (c != _OTHER and c != _PTWRITE) else None

    def event(self, ev, offset):
        pass

    def error(self, kind, offset, ip, code):
        self.errors += 1
        self._from = None

    def status(self, name, offset):
        pass


def edges(data, image, config=None, impl=None) -> Edges:
    """Exact edge counts of the trace (see the module docstring)."""
    if impl != "python":
        r = compiled_decode(data, image, config, "insn", True,
                            impl if impl is not None else None)
        if r is not None and r[0] is None:
            return Edges(r[3], r[1], 0, True)
    from . import session
    from .insn import InsnDecoder
    sink = EdgeSink()
    session.run_insn(InsnDecoder(data, image, config), sink)
    return Edges(sink.counts, sink.insns, sink.errors, False)


_GOLDEN = 0x9E3779B97F4A7C15


def edge_index(from_ip: int, to_ip: int, size: int = 1 << 16) -> int:
    """The bitmap index of an edge (see the module docstring)."""
    hf = ((from_ip * _GOLDEN) & MASK64) >> 48
    ht = ((to_ip * _GOLDEN) & MASK64) >> 48
    return (hf ^ (ht >> 1)) % size


def edge_bitmap(counts: dict, size: int = 1 << 16) -> bytearray:
    """An AFL-style hit-count map of ``size`` bytes from edge counts."""
    bm = bytearray(size)
    for (f, t), n in counts.items():
        i = edge_index(f, t, size)
        bm[i] = min(255, bm[i] + n)
    return bm

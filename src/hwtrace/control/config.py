"""Buffer configuration: the record, its type checks, and validation per the spec.

:class:`BufferConfig` checks *types* when constructed (a wrong type raises
``TraceError("INVALID_ARGS")`` at once); :func:`validate` checks *values*
against the limits and the tracer's :class:`Capabilities`, and is what
``alloc_buffer`` calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field as dc_field
from typing import Any, Mapping

from .capabilities import Capabilities
from .ctl import ADDR_CFG_FILTER, ADDR_CFG_STOP, Ctl, DEFINED_BITS, Mode, addr_cfg, field
from .errors import Status, TraceError, invalid

PAGE_SIZE = 4096
MAX_NUM_CHUNKS = 4096
MAX_CHUNK_ORDER = 8
MAX_BUFFER_BYTES = 256 << 20
MAX_ADDR_RANGES = 4

#: Bits the caller may always set.
ALWAYS_SETTABLE = Ctl.OS | Ctl.USER | Ctl.TSC_EN | Ctl.DIS_RETC | Ctl.BRANCH_EN
#: Bits that belong to the driver, never to the caller.
DRIVER_BITS = Ctl.TRACE_EN | Ctl.FABRIC_EN | Ctl.TOPA


def _int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid(f"BufferConfig.{name} must be an int, not {type(v).__name__}")
    return int(v)


@dataclass(frozen=True, slots=True)
class BufferConfig:
    """One trace buffer: ``num_chunks`` regions of ``2**chunk_order`` pages.

    ``ctl`` holds the caller's IA32_RTIT_CTL bits (:class:`Ctl`),
    ``cr3_match`` IA32_RTIT_CR3_MATCH, ``addr_ranges`` up to four
    ``(a, b)`` pairs for IA32_RTIT_ADDRn_A/B (inclusive bounds), used where
    ADDRn_CFG in ``ctl`` is non-zero.
    """

    num_chunks: int = 1
    chunk_order: int = 0
    is_circular: bool = False
    ctl: Ctl = Ctl.BRANCH_EN | Ctl.USER | Ctl.TSC_EN
    cr3_match: int = 0
    addr_ranges: tuple[tuple[int, int], ...] = dc_field(default=())

    def __post_init__(self):
        _int("num_chunks", self.num_chunks)
        _int("chunk_order", self.chunk_order)
        if not isinstance(self.is_circular, bool):
            raise invalid("BufferConfig.is_circular must be a bool")
        ctl = _int("ctl", self.ctl)
        if not 0 <= ctl < 1 << 64:
            raise invalid("BufferConfig.ctl must be a 64-bit unsigned value")
        object.__setattr__(self, "ctl", Ctl(ctl))
        _int("cr3_match", self.cr3_match)
        ranges = self.addr_ranges
        if isinstance(ranges, (str, bytes)) or not hasattr(ranges, "__iter__"):
            raise invalid("BufferConfig.addr_ranges must be a sequence of (a, b) pairs")
        out = []
        for i, pair in enumerate(ranges):
            if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
                raise invalid(f"BufferConfig.addr_ranges[{i}] must be an (a, b) pair")
            out.append((_int(f"addr_ranges[{i}][0]", pair[0]),
                        _int(f"addr_ranges[{i}][1]", pair[1])))
            if len(out) > 64:
                raise invalid("BufferConfig.addr_ranges: too many ranges")
        object.__setattr__(self, "addr_ranges", tuple(out))

    @property
    def chunk_size(self) -> int:
        return PAGE_SIZE << self.chunk_order

    @property
    def total_size(self) -> int:
        return self.num_chunks * self.chunk_size

    def to_dict(self) -> dict[str, Any]:
        return {"num_chunks": self.num_chunks, "chunk_order": self.chunk_order,
                "is_circular": self.is_circular, "ctl": int(self.ctl),
                "cr3_match": self.cr3_match,
                "addr_ranges": [list(p) for p in self.addr_ranges]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BufferConfig":
        """From :meth:`to_dict` output (e.g. a manifest); raises TraceError."""
        if not isinstance(d, Mapping):
            raise invalid("buffer config must be an object")
        known = {"num_chunks", "chunk_order", "is_circular", "ctl", "cr3_match", "addr_ranges"}
        kw = {k: d[k] for k in known if k in d}
        if "addr_ranges" in kw:
            r = kw["addr_ranges"]
            if not isinstance(r, (list, tuple)):
                raise invalid("addr_ranges must be a list")
            kw["addr_ranges"] = tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in r)
        return cls(**kw)


def validate(cfg: Any, caps: Capabilities, mode: Mode = Mode.CPU) -> BufferConfig:
    """Check ``cfg`` as ``alloc_buffer`` must; return it or raise TraceError.

    INVALID_ARGS for anything outside the spec's limits or the capabilities,
    NOT_SUPPORTED for more than one region without multi-entry ToPA.
    """
    if not isinstance(cfg, BufferConfig):
        raise invalid(f"expected a BufferConfig, not {type(cfg).__name__}")
    if not 1 <= cfg.num_chunks <= MAX_NUM_CHUNKS:
        raise invalid(f"num_chunks must be 1..{MAX_NUM_CHUNKS}")
    if not 0 <= cfg.chunk_order <= MAX_CHUNK_ORDER:
        raise invalid(f"chunk_order must be 0..{MAX_CHUNK_ORDER}")
    if cfg.total_size > MAX_BUFFER_BYTES:
        raise invalid("a buffer holds at most 256 MiB")
    ctl = int(cfg.ctl)
    if ctl & ~DEFINED_BITS:
        raise invalid(f"ctl sets reserved bits {ctl & ~DEFINED_BITS:#x}")
    if ctl & DRIVER_BITS:
        raise invalid("ctl: TraceEn, FabricEn and ToPA are the driver's bits")

    settable = int(ALWAYS_SETTABLE)
    if caps.ptwrite:
        settable |= Ctl.PTW_EN | Ctl.FUP_ON_PTW
    if caps.cr3_filtering and mode == Mode.CPU:
        settable |= Ctl.CR3_FILTER
    if caps.mtc:
        settable |= Ctl.MTC_EN | Ctl.MTC_FREQ
    if caps.power_event_trace:
        settable |= Ctl.PWR_EVT_EN
    if caps.psb_cyc:
        settable |= Ctl.CYC_EN | Ctl.CYC_THRESH | Ctl.PSB_FREQ
    nranges = min(caps.num_address_ranges, MAX_ADDR_RANGES) if caps.ip_filtering else 0
    for n in range(nranges):
        settable |= 0xF << (32 + 4 * n)
    if ctl & ~settable:
        bad = Ctl(ctl & ~settable)
        raise invalid(f"ctl bits not supported here: {bad!r}")

    for name, mask in (("mtc_freq", caps.mtc_period_mask),
                       ("cyc_thresh", caps.cyc_threshold_mask),
                       ("psb_freq", caps.psb_freq_mask)):
        v = field(ctl, name)
        if v and not mask >> v & 1:
            raise invalid(f"{name}={v} is not in the CPU's mask {mask:#x}")

    if mode == Mode.THREAD and cfg.cr3_match:
        raise invalid("thread mode has no CR3 filtering")
    if cfg.cr3_match & 0x1F:
        raise invalid("cr3_match: the low 5 bits are reserved")
    if not 0 <= cfg.cr3_match < 1 << 64:
        raise invalid("cr3_match must be a 64-bit unsigned value")

    if len(cfg.addr_ranges) > nranges:
        raise invalid(f"{len(cfg.addr_ranges)} address ranges; this tracer has {nranges}")
    for i, (a, b) in enumerate(cfg.addr_ranges):
        if not (0 <= a < 1 << 64 and 0 <= b < 1 << 64):
            raise invalid(f"addr_ranges[{i}] must be 64-bit unsigned addresses")
        if a > b:
            raise invalid(f"addr_ranges[{i}]: start {a:#x} is above end {b:#x}")
    for n in range(MAX_ADDR_RANGES):
        c = addr_cfg(ctl, n)
        if c and c not in (ADDR_CFG_FILTER, ADDR_CFG_STOP):
            raise invalid(f"addr{n}_cfg={c} is reserved (0 off, 1 filter, 2 stop)")
        if c and n >= len(cfg.addr_ranges):
            raise invalid(f"addr{n}_cfg is set but addr_ranges has no range {n}")

    if cfg.num_chunks > 1 and not caps.topa_multiple_entries:
        raise TraceError(Status.NOT_SUPPORTED,
                         "more than one region needs multi-entry ToPA")
    return cfg

"""What a tracer supports: the CPUID leaf 0x14 equivalent, and the CPU's identity.

:class:`Capabilities` holds sub-leaves 0 and 1 of CPUID leaf 0x14 (SDM Vol.
3C, "Enumeration and Configuration of Intel Processor Trace") as named
fields; :meth:`Capabilities.from_cpuid` / :meth:`Capabilities.to_cpuid` convert
from and to the raw register values. :class:`CpuInfo` is what a decoder needs
to know about the CPU that produced a trace (family/model/stepping for errata,
nominal frequency and the TSC/crystal ratio for timing).

Engines declare their capabilities; the perf engine reads them from the
hardware (PMU ``caps/`` or CPUID), the emulated engine says what it emulates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

# CPUID.(EAX=14H,ECX=0):EBX bit -> field
_EBX0 = (
    (0, "cr3_filtering"),
    (1, "psb_cyc"),              # configurable PSB and cycle-accurate mode
    (2, "ip_filtering"),         # IP filtering, TraceStop, PSB/PMI preservation of IP
    (3, "mtc"),
    (4, "ptwrite"),
    (5, "power_event_trace"),
    (6, "psb_pmi_preservation"),
    (7, "event_trace"),
    (8, "tnt_disable"),
)
# CPUID.(EAX=14H,ECX=0):ECX bit -> field
_ECX0 = (
    (0, "topa_output"),
    (1, "topa_multiple_entries"),
    (2, "single_range_output"),
    (3, "trace_transport_output"),
    (31, "lip"),                 # IP payloads carry LIP (CS base added)
)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """CPUID leaf 0x14, sub-leaves 0 and 1, as named fields.

    ``pt`` is False when the CPU has no Intel PT at all (CPUID.07H:EBX[25]).
    Masks are bitmaps of the supported encodings: bit *n* set means value *n*
    is allowed for MTCFreq / CycThresh / PSBFreq.
    """

    pt: bool = True
    max_subleaf: int = 1
    cr3_filtering: bool = False
    psb_cyc: bool = False
    ip_filtering: bool = False
    mtc: bool = False
    ptwrite: bool = False
    power_event_trace: bool = False
    psb_pmi_preservation: bool = False
    event_trace: bool = False
    tnt_disable: bool = False
    topa_output: bool = True
    topa_multiple_entries: bool = True
    single_range_output: bool = False
    trace_transport_output: bool = False
    lip: bool = False
    num_address_ranges: int = 0
    mtc_period_mask: int = 0
    cyc_threshold_mask: int = 0
    psb_freq_mask: int = 0

    @classmethod
    def from_cpuid(cls, eax0: int, ebx0: int, ecx0: int,
                   eax1: int = 0, ebx1: int = 0, *, pt: bool = True) -> "Capabilities":
        """From the register values of CPUID.(EAX=14H,ECX=0) and (ECX=1)."""
        kw: dict[str, Any] = {"pt": pt, "max_subleaf": eax0}
        for bit, name in _EBX0:
            kw[name] = bool(ebx0 >> bit & 1)
        for bit, name in _ECX0:
            kw[name] = bool(ecx0 >> bit & 1)
        if eax0 >= 1:
            kw["num_address_ranges"] = eax1 & 0x7
            kw["mtc_period_mask"] = eax1 >> 16 & 0xFFFF
            kw["cyc_threshold_mask"] = ebx1 & 0xFFFF
            kw["psb_freq_mask"] = ebx1 >> 16 & 0xFFFF
        return cls(**kw)

    def to_cpuid(self) -> tuple[int, int, int, int, int]:
        """(eax0, ebx0, ecx0, eax1, ebx1) of CPUID leaf 0x14."""
        ebx0 = sum(1 << bit for bit, name in _EBX0 if getattr(self, name))
        ecx0 = sum(1 << bit for bit, name in _ECX0 if getattr(self, name))
        eax1 = (self.num_address_ranges & 7) | (self.mtc_period_mask & 0xFFFF) << 16
        ebx1 = (self.cyc_threshold_mask & 0xFFFF) | (self.psb_freq_mask & 0xFFFF) << 16
        return self.max_subleaf, ebx0, ecx0, eax1, ebx1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Capabilities":
        """From :meth:`to_dict` output; unknown keys are ignored, types checked."""
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            want = bool if isinstance(f.default, bool) else int
            if want is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"capabilities.{f.name}: not an integer")
            if want is bool and not isinstance(v, bool):
                raise ValueError(f"capabilities.{f.name}: not a boolean")
            kw[f.name] = v
        return cls(**kw)

    def describe(self) -> list[tuple[str, str]]:
        """(name, value) rows for people (``hwtrace info``)."""
        rows = [(f.name, str(getattr(self, f.name)).lower()
                 if isinstance(getattr(self, f.name), bool) else
                 (f"{getattr(self, f.name):#06x}" if f.name.endswith("_mask")
                  else str(getattr(self, f.name))))
                for f in fields(self)]
        return rows


#: What a full-featured Skylake-class CPU reports (and what the emulated
#: engine can offer): every filter, 2 address ranges, the usual masks.
FULL = Capabilities(
    pt=True, max_subleaf=1, cr3_filtering=True, psb_cyc=True, ip_filtering=True,
    mtc=True, ptwrite=True, power_event_trace=True, psb_pmi_preservation=False,
    topa_output=True, topa_multiple_entries=True, single_range_output=True,
    num_address_ranges=2, mtc_period_mask=0x249, cyc_threshold_mask=0x3FFF,
    psb_freq_mask=0x3F)

#: A CPU without Intel PT.
NONE = Capabilities(pt=False, max_subleaf=0, topa_output=False,
                    topa_multiple_entries=False)


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """Identity and timing parameters of the CPU a trace comes from.

    ``nom_freq`` is the nominal (max non-turbo) ratio in units of 100 MHz, as
    CPUID 0x16 / MSR_PLATFORM_INFO give it and ptxed's ``--nom-freq`` takes it;
    ``cpuid_0x15_eax`` / ``cpuid_0x15_ebx`` are the TSC/crystal-clock ratio's
    denominator and numerator (ptxed ``--cpuid-0x15.eax/ebx``); 0 = unknown.
    ``timebase`` says in words what TSC counts (e.g. "host TSC",
    "instruction count"); ``tsc_hz`` its rate if known (0 = unknown).
    """

    vendor: str = "GenuineIntel"
    family: int = 6
    model: int = 0
    stepping: int = 0
    nom_freq: int = 0
    cpuid_0x15_eax: int = 0
    cpuid_0x15_ebx: int = 0
    timebase: str = ""
    tsc_hz: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CpuInfo":
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if isinstance(f.default, str):
                if not isinstance(v, str) or len(v) > 256:
                    raise ValueError(f"cpu.{f.name}: not a short string")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
                raise ValueError(f"cpu.{f.name}: not an unsigned integer")
            kw[f.name] = v
        return cls(**kw)

    @property
    def cpu_arg(self) -> str:
        """ptxed's ``--cpu f/m/s`` argument."""
        return f"{self.family}/{self.model}/{self.stepping}"

"""Decoder configuration: CPU errata, address filters, timing parameters
and decoder flags (libipt's struct pt_config, the parts flow uses)."""

from __future__ import annotations

from hwtrace._records import Fields
from hwtrace.pt.cpu import NO_ERRATA, Errata

#: the erratum names in :class:`hwtrace.pt.cpu.Errata`'s field order: the
#: compiled flow core's errata bits (hwtrace.flow.fast)
ERRATA = Errata._fields

# Plain classes, not dataclasses: every decoding command creates them at
# start-up (see hwtrace._records).


class AddrFilter(Fields):
    """IA32_RTIT_CTL.ADDRn_CFG and IA32_RTIT_ADDRn_A/B."""

    _fields = ("addr_cfg", "a", "b")

    def __init__(self, addr_cfg: int = 0, a: list | None = None,
                 b: list | None = None):
        self.addr_cfg = addr_cfg
        self.a = [0, 0, 0, 0] if a is None else a
        self.b = [0, 0, 0, 0] if b is None else b

    def cfg(self, n: int) -> int:
        return (self.addr_cfg >> (4 * n)) & 0xF

    def check(self, addr: int) -> bool:
        """libipt's pt_filter_addr_check: True if ``addr`` lies in a
        filter (cfg 1) range, or if no filter range is configured."""
        have_filter = False
        for n in range(4):
            if self.cfg(n) != 1:
                continue
            have_filter = True
            if self.a[n] <= addr <= self.b[n]:
                return True
        return not have_filter


class FlowConfig(Fields):
    _fields = ("errata", "addr_filter", "cpu", "mtc_freq", "nom_freq",
               "cpuid_0x15_eax", "cpuid_0x15_ebx", "enable_tick_events",
               "enable_iflags_events", "keep_tcal_on_ovf", "error_offsets",
               "strict", "end_on_call", "end_on_jump")

    def __init__(self, errata: Errata = NO_ERRATA,
                 addr_filter: AddrFilter | None = None, cpu: object = None,
                 mtc_freq: int = 0, nom_freq: int = 0,
                 cpuid_0x15_eax: int = 0, cpuid_0x15_ebx: int = 0,
                 enable_tick_events: bool = False,
                 enable_iflags_events: bool = False,
                 keep_tcal_on_ovf: bool = False, error_offsets: str = "2.3",
                 strict: bool = False, end_on_call: bool = False,
                 end_on_jump: bool = False):
        self.errata = errata        # frozen: replaced, never changed in place
        self.addr_filter = AddrFilter() if addr_filter is None \
            else addr_filter
        self.cpu = cpu              # hwtrace.pt.cpu.Cpu, if known
        self.mtc_freq = mtc_freq
        self.nom_freq = nom_freq
        self.cpuid_0x15_eax = cpuid_0x15_eax
        self.cpuid_0x15_ebx = cpuid_0x15_ebx
        self.enable_tick_events = enable_tick_events
        self.enable_iflags_events = enable_iflags_events
        self.keep_tcal_on_ovf = keep_tcal_on_ovf
        # the trace offset an error is reported at: "2.3" where libipt
        # 2.3's event decoder stands (one event fetched ahead, as the
        # corpus expects), "2.0" where libipt 2.0's query decoder stands
        # (Debian's libipt 2.0.5)
        self.error_offsets = error_offsets
        # libipt 2.3's strict reading of real-CPU quirks (see README,
        # "lossless by default"): False (the default) decodes what the
        # hardware reported where 2.3 stops with an error; True reports
        # 2.3's errors.
        self.strict = strict
        # block decoder
        self.end_on_call = end_on_call
        self.end_on_jump = end_on_jump

    def psb_fup_announces_pge(self) -> bool:
        """Is a FUP in a PSB+ that a TIP.PGE follows (after PSBEND and
        status packets only) where tracing *will* resume rather than
        proof that it is on?  BDM70's reading, which libipt applies on the
        CPUs in its errata table; every CPU writes this pattern at a VM
        entry, so hwtrace reads it so unless ``strict``."""
        return self.errata.bdm70 or not self.strict

    def set_cpu(self, cpu):
        """Decode as recorded on ``cpu`` (a :class:`hwtrace.pt.cpu.Cpu`;
        None: unknown), with its erratum workarounds.  For a CPU whose
        errata libipt does not know, returns that error (a
        :class:`hwtrace.pt.errors.PtError`, "unknown cpu") and leaves the
        workarounds as they were; else None."""
        from hwtrace.pt import cpu as cpumod
        from hwtrace.pt.errors import PtError
        self.cpu = cpu
        if cpu is None:
            return None
        errata = cpumod.errata(cpu)
        if isinstance(errata, PtError):
            return errata
        self.errata = errata
        return None

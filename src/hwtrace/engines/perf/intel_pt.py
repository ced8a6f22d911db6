"""Intel PT specifics of perf: AUXTRACE_INFO's private words, the
``intel_pt`` PMU's config terms, and address-filter strings.  No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .errors import PerfDataError

AUXTRACE_INTEL_PT = 1
AUXTRACE_INTEL_BTS = 2

# Order of the u64 words of perf's Intel PT AUXTRACE_INFO (older perf
# versions write only a prefix; newer ones add words after the filter).
PRIV_FIELDS = (
    "pmu_type", "time_shift", "time_mult", "time_zero", "cap_user_time_zero",
    "tsc_bit", "noretcomp_bit", "have_sched_switch", "snapshot_mode",
    "per_cpu_mmaps", "mtc_bit", "mtc_freq_bits", "tsc_ctc_ratio_n",
    "tsc_ctc_ratio_d", "cyc_bit", "max_non_turbo_ratio", "filter_str_len",
)


def _low_bit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1 if mask else 0


@dataclass(frozen=True, slots=True)
class PtInfo:
    """AUXTRACE_INFO type 1 (Intel PT), as perf record wrote it."""
    pmu_type: int
    time_shift: int
    time_mult: int
    time_zero: int
    cap_user_time_zero: bool
    tsc_bit: int
    noretcomp_bit: int
    have_sched_switch: int
    snapshot_mode: bool
    per_cpu_mmaps: bool
    mtc_bit: int = 0
    mtc_freq_bits: int = 0
    tsc_ctc_ratio_n: int = 0
    tsc_ctc_ratio_d: int = 0
    cyc_bit: int = 0
    max_non_turbo_ratio: int = 0
    filter: str = ""
    extra: tuple[int, ...] = ()

    @classmethod
    def from_priv(cls, priv: Sequence[int], offset: int = 0) -> "PtInfo":
        """Build from the priv words; ``offset`` locates errors."""
        if len(priv) < 10:
            raise PerfDataError(f"Intel PT AUXTRACE_INFO has {len(priv)} words, needs 10", offset)
        vals = dict(zip(PRIV_FIELDS, priv))
        filt = ""
        extra: tuple[int, ...] = ()
        n = len(PRIV_FIELDS)
        if len(priv) > n - 1:
            flen = vals["filter_str_len"]
            words = (flen + 8) // 8 if flen else 0     # NUL-terminated, padded
            if words > len(priv) - n:
                raise PerfDataError("Intel PT filter string overruns AUXTRACE_INFO", offset)
            raw = b"".join(w.to_bytes(8, "little") for w in priv[n:n + words])
            filt = raw[:flen].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            extra = tuple(priv[n + words:])
        vals.pop("filter_str_len", None)
        for k in ("cap_user_time_zero", "snapshot_mode", "per_cpu_mmaps"):
            vals[k] = bool(vals[k])
        return cls(**vals, filter=filt, extra=extra)

    # -- the attr config, read through these bit positions ---------------
    def tsc_enabled(self, config: int) -> bool:
        return bool(config & self.tsc_bit)

    def mtc_enabled(self, config: int) -> bool:
        return bool(config & self.mtc_bit)

    def cyc_enabled(self, config: int) -> bool:
        return bool(config & self.cyc_bit)

    def noretcomp(self, config: int) -> bool:
        return bool(config & self.noretcomp_bit)

    def mtc_freq(self, config: int) -> int:
        """The MTCFreq encoding (ptxed's --mtc-freq) of an attr config."""
        return (config & self.mtc_freq_bits) >> _low_bit(self.mtc_freq_bits)

    def decoder_params(self, config: int) -> dict[str, int]:
        """Manifest timing fields for a trace recorded with ``config``."""
        return {"mtc_freq": self.mtc_freq(config) if self.mtc_enabled(config) else 0,
                "nom_freq": self.max_non_turbo_ratio,
                "cpuid_0x15_eax": self.tsc_ctc_ratio_d,
                "cpuid_0x15_ebx": self.tsc_ctc_ratio_n}


# -- the intel_pt PMU's config terms --------------------------------------
# Documented defaults of /sys/bus/event_source/devices/intel_pt/format/*;
# the engine reads the real directory and falls back to these.
DEFAULT_FORMAT: dict[str, str] = {
    "pt": "config:0", "cyc": "config:1", "pwr_evt": "config:4",
    "fup_on_ptw": "config:5", "mtc": "config:9", "tsc": "config:10",
    "noretcomp": "config:11", "ptw": "config:12", "branch": "config:13",
    "mtc_period": "config:14-17", "cyc_thresh": "config:19-22",
    "psb_period": "config:24-27",
}

# RTIT_CTL field -> the term that programs it (same bit layout on Linux).
_CTL_TERMS = (
    (1, 1, "cyc"), (4, 1, "pwr_evt"), (5, 1, "fup_on_ptw"), (9, 1, "mtc"),
    (10, 1, "tsc"), (11, 1, "noretcomp"), (12, 1, "ptw"), (13, 1, "branch"),
    (14, 4, "mtc_period"), (19, 4, "cyc_thresh"), (24, 4, "psb_period"),
)


def parse_format(spec: str) -> tuple[str, list[tuple[int, int]]]:
    """``config:14-17`` -> ("config", [(14, 4)]); ``config:0,2`` allowed."""
    field, _, bits = spec.strip().partition(":")
    if field not in ("config", "config1", "config2", "config3") or not bits:
        raise ValueError(f"bad PMU format {spec!r}")
    parts = []
    for piece in bits.split(","):
        lo, _, hi = piece.partition("-")
        lo_i, hi_i = int(lo), int(hi or lo)
        if not 0 <= lo_i <= hi_i < 64:
            raise ValueError(f"bad PMU format {spec!r}")
        parts.append((lo_i, hi_i - lo_i + 1))
    return field, parts


def encode_terms(terms: Mapping[str, int], fmt: Mapping[str, str]) -> dict[str, int]:
    """PMU terms -> {"config": v, "config1": v, ...} through ``fmt``."""
    out: dict[str, int] = {}
    for name, value in terms.items():
        if name not in fmt:
            raise ValueError(f"the intel_pt PMU has no {name!r} term")
        field, parts = parse_format(fmt[name])
        width = sum(w for _lo, w in parts)
        if not 0 <= value < 1 << width:
            raise ValueError(f"{name}={value} does not fit in {width} bits")
        word = out.get(field, 0)
        shift = 0
        for lo, w in parts:
            word |= ((value >> shift) & ((1 << w) - 1)) << lo
            shift += w
        out[field] = word
    return out


def ctl_to_terms(ctl: int) -> dict[str, int]:
    """RTIT_CTL bits -> the intel_pt PMU terms that ask perf for them.

    TraceEn/ToPA/FabricEn are the driver's; OS/User become the attr's
    exclude_kernel/exclude_user (see :func:`ctl_exclusions`); CR3 and
    address filtering are per-event in perf (thread mode, filters).
    """
    terms = {"pt": 1}
    for lo, width, name in _CTL_TERMS:
        terms[name] = (ctl >> lo) & ((1 << width) - 1)
    return terms


def ctl_exclusions(ctl: int) -> dict[str, bool]:
    """OS/User -> the attr's exclude_kernel / exclude_user flags."""
    return {"exclude_kernel": not ctl & (1 << 2), "exclude_user": not ctl & (1 << 3),
            "exclude_hv": True}


def ctl_to_config(ctl: int, fmt: Mapping[str, str] | None = None) -> dict[str, int]:
    """RTIT_CTL -> {"config": ...} for the intel_pt PMU with format ``fmt``.

    A term absent from the PMU's format (an older kernel) must be zero.
    """
    fmt = DEFAULT_FORMAT if fmt is None else fmt
    terms = ctl_to_terms(ctl)
    missing = [n for n, v in terms.items() if v and n not in fmt]
    if missing:
        raise ValueError(f"the intel_pt PMU lacks term(s): {', '.join(missing)}")
    return encode_terms({n: v for n, v in terms.items() if n in fmt}, fmt)


# -- address filters (PERF_EVENT_IOC_SET_FILTER) ---------------------------
@dataclass(frozen=True, slots=True)
class AddrFilter:
    """One perf address filter: ``action`` is filter / start / stop.

    With ``file``, ``start`` is an offset in that file (the kernel relocates
    it through the file's mappings); without, a (kernel) address.
    """
    action: str
    start: int
    size: int = 0
    file: str | None = None

    def __str__(self) -> str:
        if self.action not in ("filter", "start", "stop", "tracefilter", "tracestart", "tracestop"):
            raise ValueError(f"bad filter action {self.action!r}")
        if self.file is not None and (not self.file or any(c in self.file for c in " ,\n\t@")):
            raise ValueError(f"file name {self.file!r} cannot appear in a perf filter")
        s = f"{self.action} {self.start:#x}"
        if self.size:
            s += f"/{self.size:#x}"
        if self.file is not None:
            s += f"@{self.file}"
        return s


def filter_string(filters: Sequence[AddrFilter]) -> str:
    """The string PERF_EVENT_IOC_SET_FILTER takes (comma-separated)."""
    return ",".join(str(f) for f in filters)


@dataclass(frozen=True, slots=True)
class FileMap:
    """[start, end) of an address space maps ``file`` from ``pgoff``."""
    start: int
    end: int
    pgoff: int
    file: str


KERNEL_START = 0xffff800000000000


def ranges_to_filters(ranges: Sequence[tuple[int, int]], addr_cfgs: Sequence[int],
                      maps: Sequence[FileMap]) -> list[AddrFilter]:
    """Address ranges + their ADDRn_CFG (1 filter, 2 stop) -> perf filters.

    Inclusive [a, b] virtual ranges inside one file mapping become file
    offsets; kernel ranges stay addresses; anything else is a ValueError.
    """
    out = []
    for n, ((a, b), cfg) in enumerate(zip(ranges, addr_cfgs)):
        if cfg == 0:
            continue
        if cfg not in (1, 2):
            raise ValueError(f"addr{n}_cfg={cfg} has no perf equivalent")
        action = "filter" if cfg == 1 else "stop"
        size = b - a + 1
        if a >= KERNEL_START:
            out.append(AddrFilter(action, a, size))
            continue
        m = next((m for m in maps if m.start <= a and b < m.end), None)
        if m is None:
            raise ValueError(f"address range {n} [{a:#x}, {b:#x}] is not inside one mapped file")
        out.append(AddrFilter(action, a - m.start + m.pgoff, size, m.file))
    return out

"""This machine's CPU: identity and Intel PT capabilities where it has them.

Sources, best first: the CPUID instruction through ``/dev/cpu/0/cpuid``
(Linux ``cpuid`` driver, root), the ``intel_pt`` PMU's ``caps/`` directory in
sysfs, and ``/proc/cpuinfo``. Every reader takes its paths as arguments so it
can be tested against fixtures.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from .capabilities import NONE, Capabilities, CpuInfo

INTEL_PT_SYSFS = Path("/sys/bus/event_source/devices/intel_pt")

# sysfs caps/ file -> Capabilities field (the kernel prints each with "%x")
_SYSFS_CAPS = {
    "cr3_filtering": "cr3_filtering", "psb_cyc": "psb_cyc", "ip_filtering": "ip_filtering",
    "mtc": "mtc", "ptwrite": "ptwrite", "power_event_trace": "power_event_trace",
    "event_trace": "event_trace", "tnt_disable": "tnt_disable",
    "topa_output": "topa_output", "topa_multiple_entries": "topa_multiple_entries",
    "single_range_output": "single_range_output", "output_subsys": "trace_transport_output",
    "payloads_lip": "lip", "num_address_ranges": "num_address_ranges",
    "mtc_periods": "mtc_period_mask", "cycle_thresholds": "cyc_threshold_mask",
    "psb_periods": "psb_freq_mask",
}


@dataclass(frozen=True, slots=True)
class HostCpu:
    """What we know about this machine's CPU, and where it came from."""
    cpu: CpuInfo
    capabilities: Capabilities
    source: str          # "cpuid", "sysfs", "cpuinfo"
    reason: str = ""     # why there is no Intel PT, if there is none


def cpuid(leaf: int, subleaf: int = 0, *, dev: str = "/dev/cpu/0/cpuid"):
    """(eax, ebx, ecx, edx) of CPUID through the Linux cpuid driver, or None."""
    try:
        fd = os.open(dev, os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.pread(fd, 16, (subleaf << 32) | leaf)
    except OSError:
        return None
    finally:
        os.close(fd)
    return struct.unpack("<4I", raw) if len(raw) == 16 else None


def caps_from_cpuid(dev: str = "/dev/cpu/0/cpuid") -> Capabilities | None:
    """Capabilities from CPUID leaf 0x14 (NONE if the CPU has no PT), or None
    if CPUID can't be read here."""
    l0 = cpuid(0, dev=dev)
    if l0 is None:
        return None
    if l0[0] < 0x14:
        return NONE
    l7 = cpuid(7, 0, dev=dev)
    if l7 is None or not l7[1] >> 25 & 1:
        return NONE
    s0, s1 = cpuid(0x14, 0, dev=dev), cpuid(0x14, 1, dev=dev)
    if s0 is None:
        return None
    eax1, ebx1 = (s1[0], s1[1]) if s1 and s0[0] >= 1 else (0, 0)
    return Capabilities.from_cpuid(s0[0], s0[1], s0[2], eax1, ebx1)


def caps_from_sysfs(pmu: Path = INTEL_PT_SYSFS) -> Capabilities | None:
    """Capabilities from the intel_pt PMU's caps/ directory, or None."""
    caps = pmu / "caps"
    if not caps.is_dir():
        return None
    kw: dict[str, object] = {"pt": True, "max_subleaf": 1}
    for fname, fieldname in _SYSFS_CAPS.items():
        try:
            text = (caps / fname).read_text().strip()
            v = int(text, 16)
        except (OSError, ValueError):
            continue
        kw[fieldname] = v if fieldname.endswith(("_mask", "_ranges")) else bool(v)
    return Capabilities(**kw)  # type: ignore[arg-type]


def cpu_from_cpuinfo(text: str) -> tuple[CpuInfo, set[str]]:
    """CpuInfo (identity only) and the flags of the first CPU of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        k, _, v = line.partition(":")
        fields[k.strip()] = v.strip()

    def num(k: str) -> int:
        try:
            return int(fields.get(k, "0"), 0)
        except ValueError:
            return 0
    info = CpuInfo(vendor=fields.get("vendor_id", "")[:64], family=num("cpu family"),
                   model=num("model"), stepping=num("stepping"))
    return info, set(fields.get("flags", "").split())


def host_cpu(*, cpuinfo: Path = Path("/proc/cpuinfo"), pmu: Path = INTEL_PT_SYSFS,
             cpuid_dev: str = "/dev/cpu/0/cpuid") -> HostCpu:
    """This machine's CPU and its Intel PT capabilities (never raises)."""
    try:
        info, flags = cpu_from_cpuinfo(cpuinfo.read_text())
    except OSError:
        info, flags = CpuInfo(vendor=""), set()
    caps = caps_from_cpuid(cpuid_dev)
    if caps is not None and caps.pt:
        return HostCpu(info, caps, "cpuid")
    sys_caps = caps_from_sysfs(pmu)
    if sys_caps is not None:
        return HostCpu(info, sys_caps, "sysfs")
    if caps is not None:
        return HostCpu(info, NONE, "cpuid", _why_no_pt(info, flags))
    return HostCpu(info, NONE, "cpuinfo", _why_no_pt(info, flags))


def _why_no_pt(info: CpuInfo, flags: set[str]) -> str:
    if info.vendor and info.vendor != "GenuineIntel":
        return f"{info.vendor} CPU: Intel PT exists only on Intel CPUs"
    if "hypervisor" in flags and "intel_pt" not in flags:
        return "virtual machine without Intel PT passed through"
    if "intel_pt" not in flags:
        return "CPU without Intel PT (no intel_pt flag in /proc/cpuinfo)"
    return "kernel has no intel_pt PMU"

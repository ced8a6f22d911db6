"""The intel_pt PMU as sysfs describes it, and why it may be unusable.

:func:`diagnose` is pure (facts in, verdict out) so every branch is
testable on any machine; :func:`probe` gathers the facts from ``/sys`` and
``/proc`` (roots are parameters, for tests) and calls it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .intel_pt import DEFAULT_FORMAT

PMU_DIR = "bus/event_source/devices/intel_pt"
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38


@dataclass(frozen=True, slots=True)
class PmuInfo:
    """``/sys/bus/event_source/devices/intel_pt``: type, format, caps."""
    type: int
    format: dict[str, str]
    caps: dict[str, int]
    max_nonturbo_ratio: int = 0
    tsc_art_ratio: tuple[int, int] = (0, 0)
    nr_addr_filters: int = 0

    def capabilities(self):
        """The CPUID 0x14 view (hwtrace.control Capabilities) of ``caps/``."""
        from hwtrace.control.capabilities import Capabilities
        c = self.caps.get
        return Capabilities(
            pt=True, max_subleaf=1,
            cr3_filtering=bool(c("cr3_filtering", 0)),
            psb_cyc=bool(c("psb_cyc", 0)), ip_filtering=bool(c("ip_filtering", 0)),
            mtc=bool(c("mtc", 0)), ptwrite=bool(c("ptwrite", 0)),
            power_event_trace=bool(c("power_event_trace", 0)),
            event_trace=bool(c("event_trace", 0)), tnt_disable=bool(c("tnt_disable", 0)),
            topa_output=bool(c("topa_output", 1)),
            topa_multiple_entries=bool(c("topa_multiple_entries", 0)),
            single_range_output=bool(c("single_range_output", 0)),
            trace_transport_output=bool(c("output_subsys", 0)),
            lip=bool(c("lip", 0)),
            num_address_ranges=c("num_address_ranges", 0),
            mtc_period_mask=c("mtc_periods", 0), cyc_threshold_mask=c("cycle_thresholds", 0),
            psb_freq_mask=c("psb_periods", 0))


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def _int(s: str | None, default: int = 0) -> int:
    if not s:
        return default
    for base in (10, 16):
        try:
            return int(s, base)
        except ValueError:
            pass
    return default


def read_pmu(sysfs: str | os.PathLike = "/sys") -> PmuInfo | None:
    """The intel_pt PMU's description, or None when there is none."""
    d = Path(sysfs) / PMU_DIR
    t = _read(d / "type")
    if t is None:
        return None
    fmt = dict(DEFAULT_FORMAT)
    if (d / "format").is_dir():
        fmt = {}
        for f in sorted((d / "format").iterdir()):
            v = _read(f)
            if v:
                fmt[f.name] = v
    caps = {}
    if (d / "caps").is_dir():
        for f in sorted((d / "caps").iterdir()):
            v = _read(f)
            if v is not None:
                # caps files hold decimal flags or hex masks (e.g. "249")
                caps[f.name] = int(v, 16) if f.name in ("mtc_periods", "cycle_thresholds",
                                                         "psb_periods") else _int(v)
    art = (_read(d / "tsc_art_ratio") or "0:0").split(":")
    try:
        ratio = (int(art[0]), int(art[1]))
    except (ValueError, IndexError):
        ratio = (0, 0)
    return PmuInfo(type=int(t), format=fmt, caps=caps,
                   max_nonturbo_ratio=_int(_read(d / "max_nonturbo_ratio")),
                   tsc_art_ratio=ratio,
                   nr_addr_filters=_int(_read(d / "nr_addr_filters")))


@dataclass(frozen=True, slots=True)
class CpuFacts:
    vendor: str = ""
    family: int = 0
    model: int = 0
    stepping: int = 0
    model_name: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)


def parse_cpuinfo(text: str) -> CpuFacts:
    """The first processor's identity and flags from /proc/cpuinfo."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if kv:
                break
            continue
        k, _, v = line.partition(":")
        kv.setdefault(k.strip(), v.strip())
    num = lambda k: int(kv[k]) if kv.get(k, "").isdigit() else 0  # noqa: E731
    return CpuFacts(kv.get("vendor_id", ""), num("cpu family"), num("model"),
                    num("stepping"), kv.get("model name", ""),
                    frozenset(kv.get("flags", "").split()))


def diagnose(pmu: PmuInfo | None, cpu: CpuFacts, paranoid: int | None,
             cap_eff: int, *, have_cpu_pmu: bool = True) -> tuple[bool, str]:
    """(usable, reason): why Intel PT via perf can or cannot be used here."""
    ident = f"{cpu.vendor or 'unknown vendor'} {cpu.family}/{cpu.model}/{cpu.stepping}"
    if cpu.model_name:
        ident += f" ({cpu.model_name})"
    if pmu is None:
        why = ["no intel_pt PMU (/sys/bus/event_source/devices/intel_pt is missing)"]
        if cpu.vendor == "AuthenticAMD" or cpu.vendor == "HygonGenuine":
            why.append(f"this is an AMD CPU, {ident}: Intel PT exists only on Intel CPUs")
        elif cpu.vendor and cpu.vendor != "GenuineIntel":
            why.append(f"CPU vendor is {cpu.vendor}, not Intel: {ident}")
        elif "hypervisor" in cpu.flags:
            why.append(f"running in a virtual machine (hypervisor flag) whose CPU, {ident}, "
                       "does not expose Intel PT: the VM needs PT passthrough "
                       "(e.g. KVM with kvm_intel pt_mode=1 and -cpu host,+intel-pt)")
            if not have_cpu_pmu:
                why.append("the VM exposes no hardware PMU at all (software events only)")
        elif "intel_pt" not in cpu.flags:
            why.append(f"the CPU, {ident}, does not report Intel PT (no intel_pt flag; "
                       "Broadwell or later is needed)")
        else:
            why.append("the CPU reports intel_pt but the kernel registered no PMU "
                       "(kernel built without CONFIG_PERF_EVENTS_INTEL_PT?)")
        return False, "; ".join(why)
    privileged = bool(cap_eff >> CAP_PERFMON & 1 or cap_eff >> CAP_SYS_ADMIN & 1)
    if paranoid is None:
        return True, f"intel_pt PMU type {pmu.type} on {ident}"
    if paranoid > 2 and not privileged:
        return False, (f"perf_event_paranoid is {paranoid}: perf_event_open is denied to "
                       "unprivileged users; set sysctl kernel.perf_event_paranoid=2 (or lower) "
                       "or run with CAP_PERFMON")
    note = ""
    if not privileged and paranoid == 1:
        note = (" (perf_event_paranoid is 1: thread mode only; cpu mode needs "
                "sysctl kernel.perf_event_paranoid=0 or CAP_PERFMON)")
    elif not privileged and paranoid >= 2:
        note = (f" (perf_event_paranoid is {paranoid}: thread mode and user space only; "
                "cpu mode needs sysctl kernel.perf_event_paranoid=0 or CAP_PERFMON, "
                "kernel tracing <= 1)")
    return True, f"intel_pt PMU type {pmu.type} on {ident}{note}"


def cpu_mode_allowed(paranoid: int | None, cap_eff: int) -> bool:
    privileged = bool(cap_eff >> CAP_PERFMON & 1 or cap_eff >> CAP_SYS_ADMIN & 1)
    return privileged or paranoid is None or paranoid <= 0


def kernel_allowed(paranoid: int | None, cap_eff: int) -> bool:
    privileged = bool(cap_eff >> CAP_PERFMON & 1 or cap_eff >> CAP_SYS_ADMIN & 1)
    return privileged or paranoid is None or paranoid <= 1


def read_facts(sysfs: str | os.PathLike = "/sys", proc: str | os.PathLike = "/proc"):
    """(pmu, cpu facts, paranoid, CapEff, have a hardware 'cpu' PMU)."""
    proc = Path(proc)
    cpu = parse_cpuinfo(_read(proc / "cpuinfo") or "")
    par = _read(proc / "sys/kernel/perf_event_paranoid")
    paranoid = int(par) if par and par.lstrip("-").isdigit() else None
    cap = 0
    for line in (_read(proc / "self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            cap = int(line.split()[1], 16)
    have_cpu = (Path(sysfs) / "bus/event_source/devices/cpu").exists() or \
        (Path(sysfs) / "bus/event_source/devices/cpu_core").exists()
    return read_pmu(sysfs), cpu, paranoid, cap, have_cpu


def probe(sysfs: str | os.PathLike = "/sys", proc: str | os.PathLike = "/proc") -> tuple[bool, str]:
    """(ok, reason): can this machine record Intel PT through perf?"""
    try:
        pmu, cpu, paranoid, cap, have_cpu = read_facts(sysfs, proc)
    except (OSError, ValueError) as e:
        return False, f"cannot inspect the system: {e}"
    return diagnose(pmu, cpu, paranoid, cap, have_cpu_pmu=have_cpu)

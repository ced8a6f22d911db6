"""The perf_event_attr values the engine opens (no I/O).

* the Intel PT event: the intel_pt PMU's type, the ctl bits as config
  terms, OS/User as exclusions, sample_id_all so AUX/ITRACE_START records
  carry cpu/tid/time;
* the sideband event: a software dummy counting nothing but delivering
  MMAP2, COMM(+exec), FORK/EXIT and context switches with sample ids.
"""

from __future__ import annotations

from typing import Mapping

from . import abi
from .intel_pt import ctl_exclusions, ctl_to_config

SAMPLE_TYPE = (abi.SAMPLE_IP | abi.SAMPLE_TID | abi.SAMPLE_TIME | abi.SAMPLE_CPU
               | abi.SAMPLE_IDENTIFIER)              # 0x10087, as perf record uses


def pt_attr(pmu_type: int, ctl: int, fmt: Mapping[str, str] | None = None, *,
            enable_on_exec: bool = True, inherit: bool = False,
            aux_watermark: int = 0) -> abi.PerfEventAttr:
    """The attr of the Intel PT event for RTIT_CTL-style ``ctl`` bits."""
    cfg = ctl_to_config(ctl, fmt)
    ex = ctl_exclusions(ctl)
    if ex["exclude_kernel"] and ex["exclude_user"]:
        raise ValueError("ctl traces neither OS nor User: nothing would be traced")
    flags = abi.attr_flags(disabled=True, enable_on_exec=enable_on_exec, inherit=inherit,
                           sample_id_all=True, exclude_guest=True, **ex)
    return abi.PerfEventAttr(
        type=pmu_type, size=abi.ATTR_SIZE_VER8, config=cfg.get("config", 0),
        config1=cfg.get("config1", 0), config2=cfg.get("config2", 0),
        sample_period=1, sample_type=SAMPLE_TYPE, flags=flags,
        aux_watermark=aux_watermark)


def sideband_attr(*, exclude_kernel: bool = True, enable_on_exec: bool = True,
                  inherit: bool = False, context_switch: bool = True) -> abi.PerfEventAttr:
    """The dummy event whose ring buffer carries the sideband records."""
    flags = abi.attr_flags(disabled=True, enable_on_exec=enable_on_exec, inherit=inherit,
                           mmap=True, mmap2=True, comm=True, comm_exec=True, task=True,
                           context_switch=context_switch, sample_id_all=True,
                           exclude_kernel=exclude_kernel, exclude_hv=True)
    return abi.PerfEventAttr(
        type=abi.PERF_TYPE_SOFTWARE, size=abi.ATTR_SIZE_VER8,
        config=abi.PERF_COUNT_SW_DUMMY, sample_period=1, sample_type=SAMPLE_TYPE,
        flags=flags)

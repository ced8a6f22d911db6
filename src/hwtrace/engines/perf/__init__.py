"""Intel PT on real hardware through Linux perf, and perf.data import.

- :mod:`.abi`       perf ABI constants, ``perf_event_attr`` pack/unpack
- :mod:`.records`   record types and their decoding (no I/O)
- :mod:`.perfdata`  perf.data reader, file and pipe layouts (no I/O)
- :mod:`.features`  perf.data feature sections
- :mod:`.intel_pt`  AUXTRACE_INFO for Intel PT, PMU config terms, filters
- :mod:`.sideband`  records -> processes, maps, switches, streams
- :mod:`.importer`  perf.data -> bundle
- :mod:`.ring`      perf mmap ring-buffer reading (no I/O)
- :mod:`.pmu`       sysfs PMU discovery and the availability probe
- :mod:`.kernel`    the kernel's code maps (kallsyms, notes, modules) as perf synthesizes them
- :mod:`.attrs`     the perf_event_attr values the engine opens
- :mod:`.sysops`    the syscalls (ctypes), replaceable for tests
- :mod:`.engine`    the perf engine (perf_event_open, AUX mmap)
"""

from .errors import PerfDataError


def probe():
    """Availability (truthy, with ``reason``) of Intel PT through perf here.

    The plain ``(ok, reason)`` tuple is :func:`hwtrace.engines.perf.pmu.probe`.
    """
    from .engine import probe_availability
    return probe_availability()


def create(**options):
    """A :class:`~.engine.PerfEngine`; TraceError NOT_SUPPORTED with the reason."""
    from .engine import create as _create
    return _create(**options)


__all__ = ["PerfDataError", "probe", "create"]

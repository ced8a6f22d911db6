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
- :mod:`.engine`    the perf engine (perf_event_open, AUX mmap)
"""

from .errors import PerfDataError

__all__ = ["PerfDataError"]

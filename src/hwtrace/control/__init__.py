"""The trace-control API (see ../shared/spec/trace-control.md).

- :mod:`.errors`        TraceError and the spec's status codes
- :mod:`.ctl`           IA32_RTIT_CTL (``Ctl``) and ``Mode``
- :mod:`.capabilities`  CPUID leaf 0x14 record and CPU identity
- :mod:`.config`        ``BufferConfig`` and its validation
- :mod:`.host`          this machine's CPU: CPUID / sysfs / cpuinfo readers
- :mod:`.states`        the legal state transitions: one table
- :mod:`.storage`       buffers as memory-mapped files with persisted registers
- :mod:`.device`        the device: ``open_device`` and its operations
- :mod:`.recover`       a trace directory (even of a crashed collector) -> bundle
"""

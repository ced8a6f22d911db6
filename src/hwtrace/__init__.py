"""hwtrace: hardware control-flow tracing.

Collect Intel Processor Trace (real hardware through Linux perf, or an
emulation of it that observes a real execution), decode it to packets and
instruction flow, and turn it into branch records, call histories, timelines
and coverage.
"""

__version__ = "0.1.0"

# Public trace-control API, imported lazily so `import hwtrace` stays cheap.
_LAZY = {
    "open_device": "hwtrace.control.device",
    "Device": "hwtrace.control.device",
    "BufferInfo": "hwtrace.control.device",
    "Mode": "hwtrace.control.ctl",
    "Ctl": "hwtrace.control.ctl",
    "BufferConfig": "hwtrace.control.config",
    "TraceError": "hwtrace.control.errors",
    "Status": "hwtrace.control.errors",
    "Capabilities": "hwtrace.control.capabilities",
    "CpuInfo": "hwtrace.control.capabilities",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'hwtrace' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_LAZY])

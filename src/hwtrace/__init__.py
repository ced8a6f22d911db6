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


def _lazy_exports(table, namespace):
    """Module ``__getattr__`` and ``__dir__`` for a package whose
    re-exports are imported when first asked for: *table* maps each name to
    the module holding it, *namespace* is the package's ``globals()``, where
    a name is cached once imported.  Every package's lazy re-exports use it
    (``from hwtrace import _lazy_exports``); it lives here, not in a module
    of its own, so that it costs no import on a command's start-up path."""
    package = namespace["__name__"]

    def __getattr__(name: str):
        module = table.get(name)
        if module is None:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r}")
        import importlib
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted({*namespace, *table})

    return __getattr__, __dir__


__getattr__, __dir__ = _lazy_exports(_LAZY, globals())

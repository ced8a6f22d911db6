"""What fills trace buffers: the engines, and the registry that finds them.

Each engine is a package ``hwtrace.engines.<name>`` exposing ``probe() ->
Availability`` and ``create(**options) -> Engine`` (see
:mod:`hwtrace.engines.base`). The registry imports them lazily, so a missing or
broken engine only makes that engine unavailable.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Engines in the order "auto" tries them.
ENGINE_NAMES = ("perf", "emulated")
#: Names that select an engine with an option (the emulated execution sources).
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qemu": ("emulated", {"source": "qemu"}),
    "ptrace": ("emulated", {"source": "ptrace"}),
}
_MODULES = {"perf": "hwtrace.engines.perf", "emulated": "hwtrace.engines.emulated",
            "testing": "hwtrace.engines.testing"}


def _module(name: str):
    return importlib.import_module(_MODULES[name])


def probe(name: str):
    """Availability of engine ``name`` here; never raises."""
    from .base import Availability
    real, _ = ALIASES.get(name, (name, {}))
    if real not in _MODULES:
        return Availability(False, f"unknown engine {name!r}")
    try:
        mod = _module(real)
    except ImportError as e:
        if real == "perf":
            return Availability(False, "no intel_pt PMU (perf engine not built)")
        return Availability(False, f"engine not installed ({e})")
    except Exception as e:  # a broken engine must not break `hwtrace info`
        return Availability(False, f"engine failed to load: {type(e).__name__}: {e}")
    fn = getattr(mod, "probe", None)
    if fn is None:
        if real == "perf":
            return Availability(False, _perf_fallback_reason())
        return Availability(False, "engine not implemented yet")
    try:
        a = fn()
    except Exception as e:
        return Availability(False, f"probe failed: {type(e).__name__}: {e}")
    return a if isinstance(a, Availability) else Availability(bool(a), "" if a else "unavailable")


def _perf_fallback_reason() -> str:
    import os
    if not os.path.isdir("/sys/bus/event_source/devices/intel_pt"):
        return "no intel_pt PMU (/sys/bus/event_source/devices/intel_pt is missing)"
    return "perf engine not implemented yet"


def create(name: str, **options: Any):
    """An engine instance; TraceError NOT_SUPPORTED (with the reason) if it
    can't run here, INVALID_ARGS for an unknown name. ``"auto"`` takes the
    first available of :data:`ENGINE_NAMES`."""
    from hwtrace.control.errors import Status, TraceError
    if name == "auto":
        reasons = []
        for n in ENGINE_NAMES:
            a = probe(n)
            if a.available:
                return create(n, **options)
            reasons.append(f"{n}: {a.reason}")
        raise TraceError(Status.NOT_SUPPORTED, "no engine available (" + "; ".join(reasons) + ")")
    real, extra = ALIASES.get(name, (name, {}))
    if real not in _MODULES:
        raise TraceError(Status.INVALID_ARGS,
                         f"unknown engine {name!r} (known: auto, {', '.join([*ENGINE_NAMES, *ALIASES])})")
    a = probe(name)
    if not a.available:
        raise TraceError(Status.NOT_SUPPORTED, f"engine {name}: {a.reason}")
    return _module(real).create(**{**extra, **options})

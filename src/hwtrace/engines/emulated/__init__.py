"""Emulated Intel PT: real executions observed by QEMU or ptrace, turned
into the byte stream Intel PT hardware would have written.

Registry entry points (see :mod:`hwtrace.engines`): :func:`probe` and
:func:`create` (``source="qemu"`` or ``"ptrace"``).

Modules:

* ``execlog``   the execution-log format (the sources' output; no I/O)
* ``qemu``, ``qemu_plugin.c``   QEMU user mode + TCG plugin (built at first use;
                ``qemu_plugin_elf.c`` finds --trigger functions in mapped ELF files)
* ``execution`` runs a source under the user's control (stop, snapshot);
                ``running`` waits on it and ends process trees
* ``stepper*``  the ptrace stepper (native single-stepping)
* ``flow``      log -> per-thread segments -> tracers (cpu / thread mode,
                kernel transitions, signal deliveries, faults)
* ``ptgen``     one emulated Intel PT tracer: packets exactly as the hardware
* ``fast``, ``ptgen_fast.c``   the compiled twin of flow+ptgen for the common
                case (byte-identical; ``HWTRACE_NO_EXTENSIONS=1`` disables it;
                ``ptgen_signals.c`` infers the signal deliveries)
* ``images``    sideband mappings, build-ids, ptxed/ptoracle image arguments
* ``engine``    the Engine the trace-control device drives
"""

from __future__ import annotations

import shutil
from typing import Any


def probe():
    from hwtrace.engines.base import Availability
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        return Availability(False, "needs gcc to build its QEMU plugin / ptrace stepper")
    return Availability(True)


def create(source: str = "qemu", **options: Any):
    from hwtrace.control.errors import Status, TraceError
    if source == "qemu" and shutil.which("qemu-x86_64") is None:
        raise TraceError(Status.NOT_SUPPORTED,
                         "the qemu engine needs qemu-x86_64 (apt-get install qemu-user)")
    from .engine import EmulatedEngine
    return EmulatedEngine(source=source, **options)

"""The engine interface: what fills trace buffers, as the device sees it.

The trace-control device (:mod:`hwtrace.control.device`) owns modes, buffers
and their ToPA output units; an *engine* runs or attaches to a workload and
writes Intel PT packet bytes into those buffers. The device never knows which
engine it drives; an engine never touches files of the trace directory.

Writing an engine
-----------------

Subclass :class:`Engine` and expose it from your package
(``hwtrace.engines.<name>``) through two module-level functions that the
registry (:mod:`hwtrace.engines`) calls::

    def probe() -> Availability          # cheap, no side effects, never raises
    def create(**options) -> Engine      # raises TraceError("NOT_SUPPORTED", why)

The device then calls, in this order::

    engine.capabilities, engine.cpu_info, engine.num_cpus, engine.modes
    engine.run(session, argv, env=..., cwd=...) -> exit status     # dev.run(...)
    engine.attach(session, pid, ...) -> status                     # dev.attach(...)
    engine.close()                                                 # dev.close()

The session
-----------

``run`` / ``attach`` get a :class:`Session` (implemented by the device):

* cpu mode (``session.mode == Mode.CPU``): ``session.cpu_output(cpu)`` is the
  :class:`Output` of logical CPU ``cpu`` (0 <= cpu < ``num_cpus``); write what
  that CPU's tracer emits into it. A thread's packets go to the CPU it ran on;
  log process switches as :class:`hwtrace.bundle.Switch` sideband.
* thread mode (``Mode.THREAD``): call ``session.thread_output(tid, pid,
  parent_tid)`` when a thread starts (or is first seen, for attach). It
  returns the thread's :class:`Output` — a buffer the user assigned, or one the
  device allocated because the run was asked to follow new threads — or
  ``None``: don't trace that thread (the device has recorded it as untraced).
  Call ``session.thread_exited(tid)`` when it ends.
* ``session.sideband`` takes :mod:`hwtrace.bundle` records (``Process`` with
  its CR3, ``Thread``, ``Mmap`` with file/offset/build-id, ``Switch``,
  ``Exit``) via ``.add(record)``; they are on disk as soon as added.
* ``session.should_stop()`` becomes true when the user asked to stop
  (``dev.request_stop(reason)``: Ctrl-C, SIGTERM, the end of a duration;
  ``session.stop_reason`` says which): end a launched workload (or detach
  from an attached one) and keep the trace so far. ``session.wake_fd``
  becomes readable on every request (wait on it with the workload's
  process; ``session.drain_wake()`` after waking), so no polling is needed.
* An engine whose workload takes a while to begin (QEMU loading the
  program) sets ``starts_duration_clock = True`` and calls
  ``session.program_started()`` when the first thread is traced (while
  ``session.awaits_program_start``): a run's duration counts from then,
  not from the engine's own start-up.
* ``session.snapshot_requested()`` returns the reason of a snapshot request
  (``dev.request_snapshot``: SIGUSR2, a trigger) once: an engine that can
  write the trace so far and stop tracing while the workload goes on does
  so, then calls ``session.snapshot_taken(reason)`` (the user's
  ``on_snapshot`` saves the bundle then) and writes nothing more.
* ``session.work_dir`` is a directory inside the trace directory for the
  engine's working files (an execution log to generate the streams from):
  a collector killed mid-run leaves them where ``hwtrace recover`` looks;
  remove them once the streams are written. ``session.recovery_settings()``
  is what to keep with them (mode, buffer configuration, CPU count, the
  collector's identity) so recover can make the streams the same way.

Each :class:`Output` carries its buffer's configuration — ``ctl`` (the
caller's bits plus ``TOPA | TRACE_EN``), ``cr3_match``, ``addr_ranges``,
``config`` — which the engine applies (filters, CYC/MTC/PSB settings, return
compression…). ``write(data)`` appends packet bytes at the ToPA output
pointer exactly as the CPU would (spanning regions, wrapping, or stopping
with STATUS.Stopped on a stop-on-full buffer; bytes beyond are dropped and
counted). ``overflow()`` says the tracer lost packets internally: the output
unit emits OVF before the next bytes. ``stopped`` tells the engine to stop
generating (it may keep counting instructions). ``add_instructions(n)``
counts instructions the execution source saw go into this stream (the
manifest's ``instructions_observed``). ``packet_byte_cnt`` /
``reset_packet_byte_cnt()`` are STATUS.PacketByteCnt for PSBFreq pacing.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from hwtrace.control.capabilities import Capabilities, CpuInfo
from hwtrace.control.ctl import Ctl, Mode
from hwtrace.control.errors import Status, TraceError

if TYPE_CHECKING:
    from hwtrace.control.config import BufferConfig


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether an engine can run here; if not, ``reason`` says why in one
    line, naming the setting to change where there is one."""

    available: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.available


class Output(Protocol):
    """One trace buffer's output unit as an engine writes to it."""

    config: "BufferConfig"
    ctl: Ctl
    cr3_match: int
    addr_ranges: tuple[tuple[int, int], ...]

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append packet bytes; returns how many were stored (fewer once stopped)."""

    def overflow(self) -> None:
        """The tracer lost packets: emit OVF before the next bytes written."""

    @property
    def stopped(self) -> bool:
        """STATUS.Stopped: a stop-on-full buffer filled; nothing more is stored."""

    @property
    def packet_byte_cnt(self) -> int:
        """STATUS.PacketByteCnt: bytes generated since the last reset."""

    def reset_packet_byte_cnt(self) -> None:
        """Clear PacketByteCnt (the tracer emitted a PSB)."""

    def add_instructions(self, n: int) -> None:
        """Count ``n`` instructions the execution source saw go into this stream."""


class SidebandSink(Protocol):
    def add(self, record: Any) -> None:
        """Store one :mod:`hwtrace.bundle` sideband record."""


class Session(Protocol):
    """What the device hands to :meth:`Engine.run` / :meth:`Engine.attach`."""

    mode: Mode
    num_cpus: int
    sideband: SidebandSink

    def cpu_output(self, cpu: int) -> Output:
        """cpu mode: the output of logical CPU ``cpu``."""

    def thread_output(self, tid: int, pid: int, parent_tid: int = 0) -> Output | None:
        """thread mode: the output for thread ``tid`` of process ``pid``, or
        None if that thread is not to be traced."""

    def thread_exited(self, tid: int) -> None:
        """thread mode: thread ``tid`` ended."""

    def should_stop(self) -> bool:
        """True once tracing should end early."""

    work_dir: "Any"
    wake_fd: int
    stop_reason: str | None

    def drain_wake(self) -> None:
        """Consume the wake-ups of :attr:`wake_fd`."""

    def snapshot_requested(self) -> str | None:
        """A pending snapshot request's reason (consumed), or None."""

    def snapshot_taken(self, reason: str) -> None:
        """The trace so far is in the outputs and nothing more will be."""

    def recovery_settings(self) -> dict:
        """How this run's streams are made, for ``hwtrace recover``."""


class Engine(abc.ABC):
    """Base class of engines. Subclasses set ``name`` and implement the
    abstract members; ``attach`` is optional (NOT_SUPPORTED by default)."""

    #: Registry name ("emulated", "perf", "testing").
    name: str = ""
    #: True if the engine drives a machine-wide resource (real PT hardware):
    #: then "one opener at a time" holds for the whole machine; otherwise per
    #: process.
    machine_wide: bool = False
    #: Modes this engine can trace in.
    modes: frozenset[Mode] = frozenset({Mode.CPU, Mode.THREAD})
    #: False: the engine sees user-mode execution only, and the device
    #: refuses the OS bit (NOT_SUPPORTED) when a buffer is allocated.
    kernel_tracing: bool = True
    #: True: the engine honours snapshot requests mid-run (see Session).
    can_snapshot: bool = False

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """The CPUID leaf 0x14 equivalent of what this engine can do."""

    @property
    @abc.abstractmethod
    def cpu_info(self) -> CpuInfo:
        """Identity and timing parameters of the (possibly emulated) CPU."""

    @property
    @abc.abstractmethod
    def num_cpus(self) -> int:
        """Logical CPUs traced in cpu mode."""

    @abc.abstractmethod
    def run(self, session: Session, argv: Sequence[str], *,
            env: Mapping[str, str] | None = None, cwd: str | None = None) -> int:
        """Run ``argv`` to completion while tracing into ``session``.

        Returns the workload's exit status (as ``subprocess`` does: negative
        for a signal). Raises TraceError (INVALID_ARGS for a program that
        can't be started, NOT_SUPPORTED for one it can't trace) with a
        one-line message; never leaves a traced process behind.
        """

    def attach(self, session: Session, pid: int, *, duration: float | None = None) -> int:
        """Trace the running process ``pid`` (all its threads) until it exits,
        ``duration`` seconds pass, or ``session.should_stop()``; then detach.
        Returns the exit status if it exited, else 0."""
        raise TraceError(Status.NOT_SUPPORTED, f"engine {self.name} cannot attach")

    def close(self) -> None:
        """Release what the engine holds (called once by the device)."""

    def describe(self) -> Mapping[str, Any]:
        """Extra facts for ``hwtrace info`` and the manifest (e.g. source)."""
        return {}

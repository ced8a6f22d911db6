"""What an engine sees while a workload runs, and how the user steers it.

:class:`Requests` holds the user's requests to a running ``run``/``attach``
(stop, snapshot), settable from any thread or a signal handler, and a pipe
an engine can wait on (``wake_fd``) so it reacts at once instead of
polling. :class:`Session` is the engine's view of the device during a run
(the protocol of :class:`hwtrace.engines.base.Session`).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Callable

from .ctl import Mode
from .errors import Status, TraceError, invalid
from .states import Op, check

if TYPE_CHECKING:
    from .config import BufferConfig
    from .device import Device


class Requests:
    """Stop and snapshot requests for the current run (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.stop_reason: str | None = None
        self._snapshot: str | None = None
        self.snapshot_taken: str | None = None
        self._stop_hooks: list = []

    @property
    def wake_fd(self) -> int:
        """Readable when a request arrived (drained by :meth:`drain`)."""
        return self._r

    def stop(self, reason: str) -> None:
        with self._lock:
            first = self.stop_reason is None
            if first:
                self.stop_reason = reason
            hooks = list(self._stop_hooks) if first else []
        for hook in hooks:
            try:
                hook()
            except Exception:
                pass        # a hook only hastens the stop; waking up does it anyway
        self._wake()

    def add_stop_hook(self, hook) -> None:
        """Call ``hook()`` the moment a stop is requested (in the requesting
        thread or signal handler: it must be quick and never block)."""
        with self._lock:
            self._stop_hooks.append(hook)

    def snapshot(self, reason: str) -> None:
        with self._lock:
            if self._snapshot is None and self.snapshot_taken is None:
                self._snapshot = reason
        self._wake()

    def take_snapshot_request(self) -> str | None:
        with self._lock:
            r, self._snapshot = self._snapshot, None
            return r

    def _wake(self) -> None:
        try:
            os.write(self._w, b"!")
        except OSError:
            pass            # full: a wake-up is pending anyway

    def drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except OSError:
            pass

    def reset(self) -> None:
        with self._lock:
            self.stop_reason = self._snapshot = self.snapshot_taken = None
            self._stop_hooks = []
        self.drain()

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class Session:
    """What the engine sees during run/attach (hwtrace.engines.base.Session)."""

    def __init__(self, dev: "Device", follow: "BufferConfig | None",
                 on_snapshot: Callable[[str], Any] | None = None,
                 on_program_start: Callable[[], Any] | None = None):
        self._dev = dev
        self._on_program_start = on_program_start
        self._follow = follow
        self._on_snapshot = on_snapshot
        self.mode = dev.mode
        self.num_cpus = dev.num_cpus
        self.sideband = dev._sideband
        self.work_dir = dev.directory
        self.enabled: list = []

    # ---- outputs
    def cpu_output(self, cpu: int):
        dev = self._dev
        if self.mode != Mode.CPU:
            raise TraceError(Status.BAD_STATE, "cpu_output in thread mode")
        if isinstance(cpu, bool) or not isinstance(cpu, int) or not 0 <= cpu < dev.num_cpus:
            raise invalid(f"no CPU {cpu!r}")
        return dev._buffers[dev._cpu_state[cpu]].store.output

    def thread_output(self, tid: int, pid: int, parent_tid: int = 0):
        dev = self._dev
        if self.mode != Mode.THREAD:
            raise TraceError(Status.BAD_STATE, "thread_output in cpu mode")
        d = dev._threads.get(tid)
        if d is None and self._follow is not None:
            try:
                d = dev.alloc_buffer(self._follow)
            except TraceError:
                d = None
            else:
                dev._bind_thread(dev._buffers[d], tid, pid)
        if d is None:
            dev.untraced_threads.append(tid)
            return None
        b = dev._buffers[d]
        if b.pid is None and pid:
            b.pid = pid
            b.store.set_binding(pid=pid)
        b.store.unit.enable()
        self.enabled.append(b)
        return b.store.output

    def thread_exited(self, tid: int) -> None:
        d = self._dev._threads.get(tid)
        if d is not None:
            self._dev._buffers[d].store.unit.disable()

    @property
    def awaits_program_start(self) -> bool:
        """Whether :meth:`program_started` is still awaited (a duration's
        clock waits for it): only then need an engine watch for it."""
        return self._on_program_start is not None

    def program_started(self) -> None:
        """The workload's first thread is being traced: the run's duration
        counts from now (for an engine with ``starts_duration_clock``).
        Only the first call counts."""
        start, self._on_program_start = self._on_program_start, None
        if start is not None:
            start()

    # ---- the user's requests
    def should_stop(self) -> bool:
        return self._dev.requests.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why the run is to stop (e.g. "SIGINT", "duration"), None: it isn't."""
        return self._dev.requests.stop_reason

    @property
    def wake_fd(self) -> int:
        """A descriptor that becomes readable when a stop or snapshot is
        requested (call :meth:`drain_wake` after waking)."""
        return self._dev.requests.wake_fd

    def drain_wake(self) -> None:
        self._dev.requests.drain()

    def request_stop(self, reason: str) -> None:
        """The engine learnt of a reason to stop (e.g. the terminal's Ctrl-C
        reached the workload): the same as the user's request."""
        self._dev.requests.stop(reason)

    def on_stop(self, hook) -> None:
        """Have ``hook()`` called the moment a stop is requested (from a
        signal handler, say: quick, non-blocking), before the engine wakes
        up -- e.g. to end the tracing before the workload reacts to the
        same Ctrl-C."""
        self._dev.requests.add_stop_hook(hook)

    def snapshot_requested(self) -> str | None:
        """The reason of a pending snapshot request (consumed), or None."""
        return self._dev.requests.take_snapshot_request()

    def snapshot_taken(self, reason: str) -> None:
        """The engine wrote the trace up to now into the outputs and traces
        no more in this run (the workload may go on): the outputs stop, and
        the caller's ``on_snapshot(reason)`` runs with the device in its
        snapshot state (buffers readable, ``save_bundle`` allowed)."""
        dev = self._dev
        req = dev.requests
        if req.snapshot_taken is not None:
            return
        req.snapshot_taken = reason
        for b in self.enabled:
            if b.store.unit is not None:
                b.store.unit.disable()
        if dev.mode == Mode.CPU:
            for c in dev._cpu_state or ():
                if c in dev._buffers and dev._buffers[c].store.unit is not None:
                    dev._buffers[c].store.unit.disable()
        if self._on_snapshot is None:
            return
        before = dev._state
        dev._state = check(before, Op.SNAPSHOT)
        try:
            self._on_snapshot(reason)
        finally:
            dev._state = check(dev._state, Op.SNAPSHOT_END)

    def recovery_settings(self) -> dict:
        """How the streams of this run are made (mode, buffer configuration,
        CPU count, the collecting process): what an engine that generates
        them after the workload ends keeps with its working files, so
        ``hwtrace recover`` can finish the job if the collector dies."""
        from .collector import identity
        dev = self._dev
        cfg = self._follow
        if cfg is None:
            bound = [b for b in dev._buffers.values() if b.cpu is not None or b.tid is not None]
            cfg = bound[0].store.config if bound else None
        return {"format": "hwtrace-recording", "version": 1,
                "mode": "cpu" if self.mode == Mode.CPU else "thread",
                "config": cfg.to_dict() if cfg is not None else None,
                "num_cpus": dev.num_cpus, "recorder": identity(os.getpid())}

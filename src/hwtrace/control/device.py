"""The trace-control device: ``open_device`` and the spec's operations.

::

    dev = hwtrace.open_device(engine="auto")      # or "emulated", "perf", an Engine
    dev.set_mode(hwtrace.Mode.CPU)
    for cpu in range(dev.num_cpus):
        dev.alloc_buffer(cfg)                     # descriptor n = CPU n's buffer
    dev.cpu_mode_alloc(); dev.cpu_mode_start()
    status = dev.run(["prog", "arg"])
    dev.cpu_mode_stop()
    info = dev.get_buffer_info(0)                 # capture_end, wrapped, stopped
    chunk = dev.get_buffer_handle(0, 0)           # read-only memoryview
    dev.save_bundle("out")                        # a decodable bundle
    dev.cpu_mode_free(); dev.free_buffer(0)

Every operation checks the state table of :mod:`.states` first; failures are
:class:`TraceError` with the spec's status, and leave the device as it was.
Buffers live in the trace directory (:mod:`.storage`); it is a temporary
directory removed by :meth:`Device.close` unless one was given. An engine
keeps its working files (e.g. an execution log) there too, so a collector
killed mid-run leaves what ``hwtrace recover`` needs.

A running ``run``/``attach`` can be asked to stop (:meth:`Device.request_stop`)
or to take a snapshot (:meth:`Device.request_snapshot`: the trace so far is
written to the buffers, ``on_snapshot`` runs -- typically ``save_bundle`` --
and the workload goes on untraced), from another thread or a signal handler.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hwtrace.topa import STATUS_ERROR, linearize

from .config import BufferConfig, validate
from .ctl import Ctl, Mode
from .errors import Status, TraceError, invalid, not_supported
from . import collector
from .session import Requests, Session
from .states import BufferState, Op, State, check, check_buffer, is_tracing
from .storage import BUFFER_PREFIX, DEVICE_FILE, SIDEBAND_FILE, BufferStore, write_json

DEFAULT_MAX_BUFFERS = 256


@dataclass(frozen=True, slots=True)
class BufferInfo:
    """What ``get_buffer_info`` reports about a buffer.

    ``capture_end`` counts all chunks as one buffer (the spec's sum rule);
    ``wrapped``: a circular buffer went round (the bytes after capture_end are
    the oldest); ``stopped``: STATUS.Stopped (a stop-on-full buffer filled);
    ``lost_bytes``: bytes the tracer produced that were not stored;
    ``error``: STATUS.Error (an operational error stopped output).
    """

    capture_end: int
    wrapped: bool
    stopped: bool
    lost_bytes: int
    stored_bytes: int
    instructions_observed: int
    status: int
    output_base: int
    output_mask_ptrs: int
    size: int
    error: bool = False



def open_device(engine: Any = "auto", *, directory: str | os.PathLike | None = None,
                max_buffers: int = DEFAULT_MAX_BUFFERS, memory_limit: int | None = None,
                lock_path: str | os.PathLike | None = None, **engine_options: Any) -> "Device":
    """Open the trace-control device driving ``engine``.

    ``engine``: "auto" (perf where Intel PT exists, else emulated), an engine
    name, or an :class:`hwtrace.engines.base.Engine` instance.
    ``directory``: the trace directory (kept after close; default: a
    temporary one, removed by close). One opener at a time: a second open
    while one is open fails with ALREADY_BOUND (machine-wide for hardware
    engines, per process otherwise; ``lock_path``: a lock file of your
    choice). No PT or no ToPA output: NOT_SUPPORTED.
    """
    from hwtrace.engines.base import Engine
    if isinstance(engine, Engine):
        if engine_options:
            raise invalid(f"engine options {sorted(engine_options)} need an engine name")
        eng = engine
    elif isinstance(engine, str):
        from hwtrace import engines
        eng = engines.create(engine, **engine_options)
    else:
        raise invalid(f"engine must be a name or an Engine, not {type(engine).__name__}")
    if isinstance(max_buffers, bool) or not isinstance(max_buffers, int) or max_buffers < 1:
        raise invalid("max_buffers must be a positive int")
    try:
        caps = eng.capabilities
        if not caps.pt:
            raise not_supported(f"engine {eng.name}: no Intel PT")
        if not caps.topa_output:
            raise not_supported(f"engine {eng.name}: no ToPA output")
        lock = collector.take(eng.name, eng.machine_wide, lock_path)
    except BaseException:
        eng.close()
        raise
    try:
        return Device(eng, lock, directory, max_buffers, memory_limit)
    except BaseException:
        lock.release()
        eng.close()
        raise



class _Buffer:
    __slots__ = ("d", "store", "state", "cpu", "tid", "pid", "stream_cpu", "stream_tid")

    def __init__(self, d: int, store: BufferStore):
        self.d, self.store = d, store
        self.state = BufferState.UNBOUND               # per the buffer table of .states
        self.cpu = self.tid = self.pid = None          # current binding
        self.stream_cpu = self.stream_tid = None       # what its bytes belong to

    def go(self, op: Op) -> BufferState:
        """The buffer's state after ``op`` (BAD_STATE from the table)."""
        whom = (f"(CPU {self.cpu})" if self.cpu is not None
                else f"(thread {self.tid})" if self.tid is not None else "")
        return check_buffer(self.state, op, self.d, whom)


class Device:
    """The opened device (see the module doc). Use :func:`open_device`."""

    def __init__(self, engine, lock: "collector.Lock", directory, max_buffers: int,
                 memory_limit: int | None):
        self.engine = engine
        self._lock = lock
        self._own_dir = directory is None
        if directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="hwtrace-trace-"))
        else:
            self.directory = Path(directory)
            if (self.directory / DEVICE_FILE).exists():
                raise invalid(f"{self.directory} already holds a trace directory "
                              "(turn it into a bundle with 'hwtrace recover', or remove it)")
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise invalid(f"{self.directory}: {e.strerror}") from None
        self.capabilities = engine.capabilities
        self.cpu_info = engine.cpu_info
        self.num_cpus = int(engine.num_cpus)
        self.max_buffers = max_buffers
        self.memory_limit = memory_limit
        self._state = State.CPU_IDLE
        self._buffers: dict[int, _Buffer] = {}
        self._threads: dict[int, int] = {}             # tid -> descriptor
        self._cpu_state: list[int] | None = None       # per-CPU: descriptor
        self.requests = Requests()
        self.untraced_threads: list[int] = []
        from hwtrace.bundle import SidebandWriter
        self._sideband = SidebandWriter(self.directory / SIDEBAND_FILE)
        self._write_device_file()

    def __repr__(self) -> str:
        return (f"<hwtrace.Device engine={self.engine.name} {self._state.value}, "
                f"{len(self._buffers)} buffer(s) in {self.directory}>")

    # ------------------------------------------------------------ basics
    @property
    def mode(self) -> Mode:
        return Mode.THREAD if self._state in (State.THREAD_IDLE, State.THREAD_TRACING,
                                              State.THREAD_SNAPSHOT) else Mode.CPU

    @property
    def state(self) -> State:
        return self._state

    @property
    def tracing(self) -> bool:
        return is_tracing(self._state)

    @property
    def thread_buffers(self) -> dict[int, int]:
        """Thread mode: tid -> descriptor of the buffers assigned now."""
        return dict(self._threads)

    def _go(self, op: Op) -> State:
        return check(self._state, op)

    def _write_device_file(self) -> None:
        write_json(self.directory / DEVICE_FILE, {
            "engine": self.engine.name, "mode": self.mode.name.lower(),
            "num_cpus": self.num_cpus, "capabilities": self.capabilities.to_dict(),
            "cpu": self.cpu_info.to_dict(), "engine_info": dict(self.engine.describe()),
            "collector": collector.identity(os.getpid()),
        })

    def _buffer(self, d: Any) -> _Buffer:
        if isinstance(d, bool) or not isinstance(d, int) or d not in self._buffers:
            raise invalid(f"no buffer with descriptor {d!r}")
        return self._buffers[d]

    # ------------------------------------------------------------ mode
    def set_mode(self, mode: Any) -> None:
        """Choose cpu or thread mode; the same mode is a no-op."""
        m = None
        if isinstance(mode, int) and not isinstance(mode, bool):
            try:
                m = Mode(mode)
            except ValueError:
                pass
        if m is None:
            raise invalid(f"unknown mode {mode!r}")
        op = Op.SET_MODE_CPU if m == Mode.CPU else Op.SET_MODE_THREAD
        nxt = self._go(op)
        for b in self._buffers.values():
            b.go(op)
        if m not in self.engine.modes:
            raise not_supported(f"engine {self.engine.name} has no {m.name.lower()} mode")
        changed = nxt != self._state
        self._state = nxt
        if changed:
            self._write_device_file()

    # ------------------------------------------------------------ buffers
    def alloc_buffer(self, config: Any) -> int:
        """Validate ``config``, build its ToPA and files; the lowest free descriptor."""
        self._go(Op.ALLOC_BUFFER)
        cfg = self._validate(config)
        if self.mode == Mode.CPU:
            sizes = {b.store.config.total_size for b in self._buffers.values()}
            if sizes and cfg.total_size not in sizes:
                raise invalid("in cpu mode every CPU's buffer has the same size")
        d = next((i for i in range(self.max_buffers) if i not in self._buffers), None)
        if d is None:
            raise TraceError(Status.NO_RESOURCES, f"all {self.max_buffers} buffers in use")
        if self.memory_limit is not None:
            used = sum(b.store.config.total_size for b in self._buffers.values())
            if used + cfg.total_size > self.memory_limit:
                raise TraceError(Status.NO_MEMORY, "buffer memory limit reached")
        self._buffers[d] = _Buffer(d, BufferStore.create(self.directory, d, cfg))
        return d

    def _validate(self, config: Any) -> BufferConfig:
        """The spec's checks, then what this engine can't do: an engine that
        sees user-mode execution only refuses the OS bit here, not when
        the workload starts."""
        cfg = validate(config, self.capabilities, self.mode)
        if cfg.ctl & Ctl.OS and not self.engine.kernel_tracing:
            raise not_supported(f"engine {self.engine.name} sees user-mode execution "
                                "only: no OS (kernel) tracing")
        return cfg

    def get_buffer_config(self, d: int) -> BufferConfig:
        self._go(Op.GET_BUFFER_CONFIG)
        return self._buffer(d).store.config

    def get_buffer_info(self, d: int) -> BufferInfo:
        """Where output stopped (capture_end), wrapped, stopped, lost bytes."""
        self._go(Op.GET_BUFFER_INFO)
        st = self._buffer(d).store
        r = st.registers()
        return BufferInfo(capture_end=st.topa.capture_end(r.output_base, r.output_mask_ptrs),
                          wrapped=r.wrapped, stopped=r.stopped, lost_bytes=r.lost,
                          stored_bytes=r.stored, instructions_observed=r.instructions,
                          status=r.status, output_base=r.output_base,
                          output_mask_ptrs=r.output_mask_ptrs, size=st.config.total_size,
                          error=bool(r.status & STATUS_ERROR))

    def get_buffer_handle(self, d: int, chunk: int) -> memoryview:
        """A read-only buffer-protocol view of chunk ``chunk``'s memory (works
        while tracing: it shows what has been written so far)."""
        self._go(Op.GET_BUFFER_HANDLE)
        st = self._buffer(d).store
        if isinstance(chunk, bool) or not isinstance(chunk, int) \
                or not 0 <= chunk < st.config.num_chunks:
            raise invalid(f"buffer {d} has no chunk {chunk!r}")
        return st.chunk(chunk)

    def read_buffer(self, d: int, into: Any = None, *, start_at_psb: bool = True):
        """The buffer's captured bytes, oldest first (a wrapped circular buffer
        from its first PSB). With ``into`` (a writable buffer) copies them
        there and returns the count; BUFFER_TOO_SMALL if they don't fit."""
        self._go(Op.READ_BUFFER)
        st = self._buffer(d).store
        r = st.registers()
        data = linearize(st.chunks(), st.topa.capture_end(r.output_base, r.output_mask_ptrs),
                         r.wrapped, start_at_psb=start_at_psb)
        if into is None:
            return data
        try:
            out = memoryview(into).cast("B")
        except TypeError:
            raise invalid("into must be a writable buffer") from None
        if out.readonly:
            raise invalid("into must be a writable buffer")
        if len(out) < len(data):
            raise TraceError(Status.BUFFER_TOO_SMALL,
                             f"{len(data)} bytes captured, room for {len(out)}")
        out[:len(data)] = data
        return len(data)

    def free_buffer(self, d: int) -> None:
        """Free a buffer and its files; BAD_STATE while tracing, bound to a
        CPU (until cpu_mode_free) or assigned to a thread."""
        self._go(Op.FREE_BUFFER)
        b = self._buffer(d)
        b.go(Op.FREE_BUFFER)
        try:
            b.store.remove()
        except OSError as e:
            raise TraceError(Status.BAD_STATE, f"buffer {d} could not be freed "
                             f"({e.strerror or e}); it stays allocated") from None
        del self._buffers[d]

    # ------------------------------------------------------------ cpu mode
    def cpu_mode_alloc(self) -> None:
        self._state, self._cpu_state = self._go(Op.CPU_MODE_ALLOC), [-1] * self.num_cpus

    def cpu_mode_start(self) -> None:
        """CPU n gets buffer n; tracing begins."""
        nxt = self._go(Op.CPU_MODE_START)
        missing = [c for c in range(self.num_cpus) if c not in self._buffers]
        if missing:
            raise TraceError(Status.BAD_STATE, f"CPU {missing[0]} has no buffer")
        bound = [self._buffers[c].go(Op.CPU_MODE_START) for c in range(self.num_cpus)]
        for c in range(self.num_cpus):
            b = self._buffers[c]
            b.state = bound[c]
            b.cpu = b.stream_cpu = c
            b.store.set_binding(cpu=c, tid=None, pid=None)
            b.store.unit.enable()
        self._cpu_state = list(range(self.num_cpus))
        self._state = nxt

    def cpu_mode_stop(self) -> None:
        """Stop; the STATUS and output pointers of each CPU stay readable."""
        nxt = self._go(Op.CPU_MODE_STOP)
        for c in self._cpu_state or ():
            if c in self._buffers:
                self._buffers[c].store.unit.disable()
        self._state = nxt

    def cpu_mode_free(self) -> None:
        """Free per-CPU state only; buffers stay until free_buffer."""
        nxt = self._go(Op.CPU_MODE_FREE)
        for b in self._buffers.values():
            if b.state == BufferState.CPU_BOUND:
                b.state = b.go(Op.CPU_MODE_FREE)
            b.cpu = None
        self._cpu_state = None
        self._state = nxt

    # ------------------------------------------------------------ thread mode
    def assign_thread_buffer(self, d: int, tid: int) -> None:
        """Thread mode: trace thread ``tid`` into buffer ``d``."""
        self._go(Op.ASSIGN_THREAD_BUFFER)
        b = self._buffer(d)
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 < tid < 1 << 32:
            raise invalid(f"bad thread id {tid!r}")
        b.go(Op.ASSIGN_THREAD_BUFFER)
        if tid in self._threads:
            raise TraceError(Status.BAD_STATE,
                             f"thread {tid} already has buffer {self._threads[tid]}")
        self._bind_thread(b, tid, None)

    def _bind_thread(self, b: _Buffer, tid: int, pid: int | None) -> None:
        b.state = b.go(Op.ASSIGN_THREAD_BUFFER)
        b.tid = b.stream_tid = tid
        b.pid = pid
        self._threads[tid] = b.d
        b.store.set_binding(cpu=None, tid=tid, pid=pid)

    def release_thread_buffer(self, d: int, tid: int) -> None:
        """Thread mode: stop tracing ``tid`` into ``d``; the data stays."""
        self._go(Op.RELEASE_THREAD_BUFFER)
        b = self._buffer(d)
        if b.tid != tid or isinstance(tid, bool):
            raise invalid(f"buffer {d} is not assigned to thread {tid!r}")
        b.state = b.go(Op.RELEASE_THREAD_BUFFER)
        del self._threads[tid]
        b.tid = None

    # ------------------------------------------------------------ running
    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: str | None = None, follow_threads: BufferConfig | None = None,
            duration: float | None = None, on_snapshot=None) -> int:
        """Run a workload while tracing; returns its exit status.

        cpu mode: between cpu_mode_start and cpu_mode_stop. thread mode: the
        threads with assigned buffers are traced; with ``follow_threads`` a
        BufferConfig, every other thread that appears gets a buffer of that
        config (``thread_buffers`` tells which); untraced threads are listed
        in ``untraced_threads``. ``duration``: stop after that many seconds
        (as :meth:`request_stop` does). ``on_snapshot(reason)``: called when
        the engine took a snapshot (see :meth:`request_snapshot`), with the
        buffers readable and ``save_bundle`` allowed.
        """
        if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)) or not argv \
                or not all(isinstance(a, (str, bytes, os.PathLike)) for a in argv):
            raise invalid("argv must be a non-empty list of strings")
        args = [os.fsdecode(a) for a in argv]
        return self._traced(lambda s: self.engine.run(s, args, env=env, cwd=cwd),
                            follow_threads, duration, on_snapshot)

    def attach(self, pid: int, *, duration: float | None = None,
               follow_threads: BufferConfig | None = None, on_snapshot=None) -> int:
        """Trace the running process ``pid`` (see :meth:`run`); at the end
        (it exits, ``duration`` passes, a stop is requested) the engine
        detaches and the process runs on."""
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise invalid(f"bad pid {pid!r}")
        return self._traced(lambda s: self.engine.attach(s, pid, duration=duration),
                            follow_threads, duration, on_snapshot)

    def request_stop(self, reason: str = "requested") -> None:
        """Ask a running ``run``/``attach`` to end tracing now (thread-safe,
        fine from a signal handler): a launched workload is ended, an
        attached one detached, and the trace so far kept. ``reason`` is
        what ``stop_reason`` then says."""
        self.requests.stop(reason)

    @property
    def stop_reason(self) -> str | None:
        """Why the last run was asked to stop (None: it wasn't)."""
        return self.requests.stop_reason

    def request_snapshot(self, reason: str = "requested") -> None:
        """Ask a running ``run`` to take a snapshot now: the engine writes
        the trace so far into the buffers and stops tracing, the run's
        ``on_snapshot`` is called, and the workload goes on untraced.
        Engines that can't do this mid-run ignore it."""
        self.requests.snapshot(reason)

    @property
    def snapshot_taken(self) -> str | None:
        """The reason of the snapshot the last run took (None: none)."""
        return self.requests.snapshot_taken

    def _traced(self, body, follow_threads, duration=None, on_snapshot=None) -> int:
        nxt = self._go(Op.RUN)
        if follow_threads is not None:
            self._validate(follow_threads)
        if duration is not None and not (isinstance(duration, (int, float))
                                         and not isinstance(duration, bool) and duration >= 0):
            raise invalid(f"bad duration {duration!r}")
        self.requests.reset()
        self.untraced_threads = []
        before = self._state
        self._state = nxt
        timer = None
        if duration is not None:
            timer = threading.Timer(duration, self.requests.stop, ("duration",))
            timer.daemon = True
        # the duration is the program's traced run: an engine whose program
        # takes a while to start (QEMU loading it) starts the clock itself
        # (session.program_started()) when the first thread is traced
        deferred = timer is not None and getattr(self.engine, "starts_duration_clock", False)
        session = Session(self, follow_threads, on_snapshot,
                          on_program_start=timer.start if deferred else None)
        if timer is not None and not deferred:
            timer.start()
        try:
            return body(session)
        finally:
            if timer is not None:
                timer.cancel()
            for b in session.enabled:
                if b.store.unit is not None:
                    b.store.unit.disable()
            self._state = check(self._state, Op.RUN_END) if self._state == nxt else before

    # ------------------------------------------------------------ output
    def save_bundle(self, out: str | os.PathLike, *, copy_images: bool = False,
                    overwrite: bool = False, **meta: Any) -> Path:
        """Write the streams of the buffers bound to CPUs or threads (oldest
        byte first; a wrapped buffer from its first PSB), the sideband and the
        manifest as a bundle at ``out``; ``copy_images`` stores the mapped
        executables in it. ``meta`` adds manifest fields."""
        self._go(Op.SAVE)
        from .recover import RecoverError, write_bundle
        try:
            return write_bundle(self.directory, out, copy_images=copy_images,
                                overwrite=overwrite, **meta)
        except RecoverError as e:
            raise invalid(str(e)) from None

    def close(self, *, discard: bool = False) -> None:
        """Stop tracing if needed, release everything, drop the lock.
        ``discard``: also remove the trace directory's own files (device
        file, buffers, and the sideband unless a bundle saved in place
        uses it) from a directory given at open (a temporary one always
        goes)."""
        if self._state == State.CLOSED:
            return
        self._state = State.CLOSED
        try:
            self.engine.close()
        finally:
            self._sideband.close()
            for b in self._buffers.values():
                b.store.close()
            self._buffers.clear()
            self.requests.close()
            if self._own_dir:
                shutil.rmtree(self.directory, ignore_errors=True)
            elif discard:
                _discard(self.directory)
            self._lock.release()

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_state", State.CLOSED) != State.CLOSED:
            try:
                self.close()
            except Exception:
                pass


def _discard(directory: Path) -> None:
    """Remove a trace directory's own files, leaving anything else."""
    from hwtrace.bundle import MANIFEST
    for p in directory.glob(BUFFER_PREFIX + "*"):
        if p.is_dir() and not p.is_symlink() and p.name[len(BUFFER_PREFIX):].isdigit():
            shutil.rmtree(p, ignore_errors=True)
    names = [DEVICE_FILE, DEVICE_FILE + ".tmp"]
    if not (directory / MANIFEST).exists():
        names.append(SIDEBAND_FILE)
    for name in names:
        try:
            (directory / name).unlink()
        except OSError:
            pass

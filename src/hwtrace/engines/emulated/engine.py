"""The emulated engine: a real execution (QEMU user mode or the ptrace
stepper) turned into the Intel PT streams the hardware would have written,
delivered into the trace-control device's buffers.

The execution source writes an execution log into a temporary directory
while the program runs; then :mod:`.flow` / :mod:`.ptgen` generate each
stream into the session's outputs (the ToPA output units) and the sideband
gets processes (with the CR3 value the emulation gives each), threads,
executable mappings (with build-ids), exits and, in cpu mode, switches.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from typing import Any, Mapping, Sequence

from hwtrace.bundle import INSN_CLOCK, Exit, Mmap, Process, Switch, Thread
from hwtrace.control.capabilities import Capabilities, CpuInfo
from hwtrace.control.ctl import Mode
from hwtrace.control.errors import Status, TraceError
from hwtrace.engines.base import Engine

from . import execlog as xl, execution, fast, flow, ptgen

LOG_DIR_PREFIX = "hwtrace-xlog-"
LOG_NAME = "exec.xlog"
META_NAME = "recording.json"

#: What the emulation offers (CPUID leaf 0x14): no PTWRITE / power events,
#: two address ranges, the usual Skylake-class masks.
EMULATED_CAPS = Capabilities(
    pt=True, max_subleaf=1, cr3_filtering=True, psb_cyc=True, ip_filtering=True,
    mtc=True, ptwrite=False, power_event_trace=False, topa_output=True,
    topa_multiple_entries=True, single_range_output=False, num_address_ranges=2,
    mtc_period_mask=0x249, cyc_threshold_mask=0x3FFF, psb_freq_mask=0x3F)

_TIMING = ptgen.Timing()
#: The CPU the emulation claims to be: an Ice Lake server model (no libipt
#: erratum applies to it), clocks as in ptgen.Timing.
EMULATED_CPU = CpuInfo(
    vendor="GenuineIntel", family=6, model=0x6A, stepping=6,
    nom_freq=_TIMING.nom_freq, cpuid_0x15_eax=_TIMING.cpuid_15_eax,
    cpuid_0x15_ebx=_TIMING.cpuid_15_ebx,
    timebase=f"{INSN_CLOCK}: TSC starts at the host TSC when the program "
             "started and advances 1 tick per retired user instruction, all threads "
             "on one clock (an idle stream jumps ahead: TSC+TMA+CBR); "
             "core clock = TSC clock; ART = TSC * eax / ebx",
    tsc_hz=0)


class _Sink:
    """Adapts a device Output to what a Tracer writes into."""

    def __init__(self, out):
        self.out = out

    def write(self, data: bytes) -> int:
        return self.out.write(data)

    @property
    def stopped(self) -> bool:
        return bool(self.out.stopped)


def _config(out, ranges=None) -> ptgen.TraceConfig:
    return ptgen.TraceConfig(ctl=int(out.ctl), cr3_match=int(out.cr3_match),
                             addr_ranges=tuple(ranges if ranges is not None else out.addr_ranges),
                             timing=_TIMING)


def _storable(outs) -> int | None:
    """The most bytes any of ``outs`` can store if every one stops when
    full (None: some wraps, or says nothing): the compiled generator need
    keep no more of a stream."""
    sizes = []
    for out in outs:
        cfg = getattr(out, "config", None)
        if cfg is None or cfg.is_circular:
            return None
        sizes.append(cfg.total_size)
    return max(sizes, default=None)


def _discard(out, n: int) -> None:
    """The ``n`` bytes of a stream generated after the ``_storable`` bytes
    that filled ``out``: written as any bytes (a stopped output stores
    none, and counts them lost), never held whole."""
    if n <= 0:
        return
    if not out.stopped:
        raise RuntimeError("emulated engine: a buffer that can store no more did not stop")
    filler = memoryview(bytes(min(n, 1 << 20)))
    while n:
        k = min(n, len(filler))
        out.write(filler[:k])
        n -= k


def _load_base(trace, path: str) -> int | None:
    from .images import load_base
    return load_base(trace.mmaps, path)


class EmulatedEngine(Engine):
    name = "emulated"
    machine_wide = False
    modes = frozenset({Mode.CPU, Mode.THREAD})
    kernel_tracing = False      # QEMU user mode and ptrace see user code only

    def __init__(self, source: str = "qemu", num_cpus: int | None = None,
                 triggers: Sequence[str] = (), **_: Any):
        if source not in ("qemu", "ptrace"):
            raise TraceError(Status.INVALID_ARGS, f"unknown execution source {source!r}")
        self.source = source
        #: function symbols whose first entry takes a snapshot (QEMU source):
        #: the trace ends at that entry and the program runs on untraced
        self.triggers: tuple[str, ...] = tuple(triggers)
        self._num_cpus = num_cpus or os.cpu_count() or 1
        self.last_trace: flow.ExecTrace | None = None
        #: n -> (ELF path, begin, end): ADDRn ranges given relative to a
        #: position-independent ELF, resolved at its load address once the
        #: execution shows it (``resolved_ranges`` then holds all ranges).
        self.elf_ranges: dict[int, tuple[str, int, int]] = {}
        self.resolved_ranges: list[tuple[int, int]] | None = None
        #: which generator produced the last streams: "compiled" or "python"
        self.generator = ""
        #: the ``[vdso]`` bytes the last run's processes had mapped (the
        #: stepper saves them; no file holds them), its build-id, and the
        #: first process that mapped it: ``hwtrace record`` stores them in
        #: the bundle as the image of the sideband's ``[vdso]`` maps.
        self.vdso: bytes | None = None
        self.vdso_build_id = ""
        self.vdso_pid: int | None = None
        #: where the temporary execution-log directory is made (None: the
        #: system's temporary directory); ``hwtrace record`` sets its -o
        self.log_dir: str | None = None
        #: how the recorder would turn the log into a bundle (JSON-able),
        #: kept next to it as ``recording.json`` while the program runs, so
        #: ``hwtrace recover`` (:mod:`.salvage`) can finish the job if the
        #: recorder is killed; None: not kept
        self.log_meta: dict | None = None
        #: the wait() status of the program the last run started (None:
        #: not known, e.g. ``hwtrace recover``): the exit of a process the
        #: log has none for
        self._run_status: int | None = None
        #: how the processes the program left running ended (pid -> exit
        #: code, or -signal): execution.Outcome.orphans
        self._orphans: dict = {}
        self._session = None

    @property
    def capabilities(self) -> Capabilities:
        return EMULATED_CAPS

    @property
    def cpu_info(self) -> CpuInfo:
        return EMULATED_CPU

    @property
    def num_cpus(self) -> int:
        return self._num_cpus

    def describe(self) -> Mapping[str, Any]:
        return {"source": self.source}

    @property
    def can_snapshot(self) -> bool:
        """Whether a snapshot can be taken mid-run (the QEMU source)."""
        return self.source == "qemu"

    # ------------------------------------------------------------------
    @property
    def starts_duration_clock(self) -> bool:
        """A run's duration counts from the program's first traced thread
        (QEMU's own start-up under load can take longer than a short
        duration); the stepper starts the program at once."""
        return self.source == "qemu"

    def run(self, session, argv: Sequence[str], *, env=None, cwd=None) -> int:
        self._session = session
        try:
            return self._traced(session, lambda log: self._execute(list(argv), log, env, cwd))
        finally:
            self._session = None

    def attach(self, session, pid: int, *, duration: float | None = None) -> int:
        """Attach with the ptrace stepper; it detaches at the end (the
        device's timer or a stop request), and the process runs on."""
        if self.source != "ptrace":
            raise TraceError(Status.NOT_SUPPORTED,
                             "the qemu engine cannot attach to a running process "
                             "(it runs programs it starts; use --engine ptrace)")
        return self._traced(session, lambda log: execution.stepper_run(self, session, pid, log))

    def _traced(self, session, execute) -> int:
        """Execute into a log in a working directory of the trace directory,
        generate the streams from it, and remove it -- unless interrupted
        (then it stays for ``hwtrace recover``)."""
        work = self._work_dir(session)
        log = os.path.join(work, LOG_NAME)
        done = False
        try:
            out = execute(log)
            if isinstance(out, int):      # an _execute that just ran the program
                out = execution.Outcome(out)
            if out.snapshot is None:
                self._run_status = out.status
                self._orphans = out.orphans or {}
                self._generate(session, log, cut=out.cut, scratch=work)
                if out.fired is not None:     # the program ended before we saw it
                    session.snapshot_taken(out.fired)
            done = True
            return out.status
        except TraceError:
            done = True
            raise
        finally:
            if done:
                shutil.rmtree(work, ignore_errors=True)

    def _work_dir(self, session) -> str:
        where = getattr(session, "work_dir", None) or self.log_dir
        try:
            return tempfile.mkdtemp(prefix=LOG_DIR_PREFIX, dir=where)
        except OSError as e:
            raise TraceError(Status.NO_RESOURCES,
                             f"cannot make a working directory in {where}: {e.strerror}") from None

    def _execute(self, argv, log, env, cwd):
        """Run ``argv`` under the source into ``log``: an execution.Outcome."""
        session = self._session
        if self.source == "qemu":
            from . import qemu
            try:
                prog = qemu.resolve_program(argv)
                self._exe = os.path.realpath(prog.elf)
            except qemu.QemuError as e:
                raise TraceError(Status.INVALID_ARGS, str(e)) from None
            self._keep_meta(log, session)
            return execution.qemu_run(self, session, prog, log, env, cwd)
        found = argv[0] if "/" in argv[0] else shutil.which(argv[0])
        self._exe = os.path.realpath(found) if found else ""
        self._keep_meta(log, session)
        return execution.stepper_run(self, session, argv, log)

    def _keep_meta(self, log: str, session=None) -> None:
        """Write how the streams are made (the session's recovery settings,
        ``log_meta``, the source and executable) next to ``log``."""
        import json
        base = session.recovery_settings() if hasattr(session, "recovery_settings") else {}
        if not base and self.log_meta is None:
            return
        meta = {**base, **(self.log_meta or {}), "source": self.source,
                "exe": getattr(self, "_exe", "")}
        with open(os.path.join(os.path.dirname(log), META_NAME), "w") as f:
            json.dump(meta, f)

    def snapshot_now(self, session, log: str, reason: str) -> None:
        """Mid-run: generate the streams from the log as it is now (the
        plugin's buffer files read live), then tell the session."""
        self._generate(session, log, cut=True, scratch=os.path.dirname(log), live=True)
        session.snapshot_taken(reason)

    def _generate(self, session, log: str, *, cut: bool = False, scratch: str | None = None,
                  live: bool = False) -> None:
        """The streams and sideband from the log. ``cut``: the log just
        stops (the program was killed, or tracing stopped mid-run): first
        cut it to whole records and end each thread before a transfer whose
        outcome it doesn't show (salvage.prepare, into ``scratch``);
        ``live``: the source still runs (read its buffer files as they are)."""
        if cut and os.path.isfile(log) and os.path.getsize(log):
            from .salvage import SalvageError, prepare
            where = tempfile.mkdtemp(prefix="cut-", dir=scratch or os.path.dirname(log))
            try:
                # the recorder's own log, about to be removed: edit it
                # where it is rather than copy gigabytes
                log = str(prepare(log, where, live=live, in_place=True).path)
            except SalvageError as e:
                raise TraceError(Status.NOT_SUPPORTED, f"{self.source} engine: {e}") from None
        # mapped, not read: a long run's log is gigabytes, and the compiled
        # generator (which maps it too) needs only its index from Python
        try:
            with open(log, "rb") as f:
                if not os.fstat(f.fileno()).st_size:
                    return
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            return      # the program never started under the source
        self._load_vdso(log)
        try:
            self._generate_from(session, log, data)
        except xl.ExecLogError as e:
            raise TraceError(Status.NOT_SUPPORTED, f"{self.source} engine: {e}") from None

    def _load_vdso(self, log: str) -> None:
        from hwtrace.buildid import build_id_of
        self.vdso, self.vdso_build_id, self.vdso_pid = None, "", None
        try:
            with open(log + ".vdso", "rb") as f:
                vdso = f.read(1 << 24)
        except OSError:
            return
        if vdso:
            self.vdso = vdso
            self.vdso_build_id = build_id_of(vdso)

    def _generate_from(self, session, log: str, data: bytes) -> None:
        index = flow.load(data, index_only=True)
        cr3 = flow.assign_cr3(index.processes)

        def resolve(out_ranges):
            if not self.elf_ranges:
                return None
            ranges = list(out_ranges)
            for n, (path, b, e) in self.elf_ranges.items():
                base = _load_base(index, path)
                if base is None:
                    raise TraceError(Status.INVALID_ARGS,
                                     f"address range {n}: {path} was never mapped")
                while len(ranges) <= n:
                    ranges.append((0, 0))
                ranges[n] = (base + b, base + e)
            self.resolved_ranges = ranges
            return ranges

        if session.mode == Mode.CPU:
            outs = {c: session.cpu_output(c) for c in range(session.num_cpus)}
            cfg = _config(outs[0], resolve(outs[0].addr_ranges))
            keyed = {("cpu", c): o for c, o in outs.items()}
        else:
            keyed = {}
            cfgs = set()
            for tid, th in index.threads.items():
                out = session.thread_output(tid, th.pid, th.parent_tid)
                if out is not None:
                    keyed[("tid", tid)] = out
                    cfgs.add(_config(out, resolve(out.addr_ranges)))
            if not keyed:
                self._sideband(session, index, cr3, {}, {})
                return
            cfg = cfgs.pop() if len(cfgs) == 1 else None
        mode = "cpu" if session.mode == Mode.CPU else "thread"
        switches: list = []
        exits: dict = {}
        starts: dict = {}           # tid -> emulated time it began
        execs: dict = {}            # tid -> time of each of its PROC_EXEC records
        if cfg is not None and fast.eligible(index, cfg):
            generated: dict = {}
            try:
                streams, switches, exits = fast.generate(log, index, cfg, mode,
                                                         session.num_cpus, cr3,
                                                         starts=starts, execs=execs,
                                                         keep=_storable(keyed.values()),
                                                         generated=generated)
            except fast.FastUnavailable:
                streams = None
            if streams is not None:
                self.generator = "compiled"
                for key, out in keyed.items():
                    data_, insns = streams.get(key, (b"", 0))
                    out.write(data_)
                    _discard(out, generated.get(key, len(data_)) - len(data_))
                    out.add_instructions(insns)
                self._finish(session, index, cr3, keyed, switches, exits, starts, execs)
                return
        self.generator = "python"
        trace = flow.load(data)
        self.last_trace = trace
        if mode == "cpu":
            results = flow.generate(trace, cfg, mode="cpu", num_cpus=session.num_cpus,
                                    sink_for=lambda key, pid: _Sink(keyed[key]), cr3=cr3,
                                    switches=switches, exits=exits, starts=starts,
                                    execs=execs)
            for r in results:
                keyed[r.key].add_instructions(r.tracer.insns)
        else:
            from . import schedule
            cfgs_by_tid = {key[1]: _config(out, resolve(out.addr_ranges))
                           for key, out in keyed.items()}
            tracers = schedule.run_threads(trace, cfgs_by_tid.get,
                                           lambda tid: _Sink(keyed[("tid", tid)]), cr3,
                                           exits=exits, starts=starts, execs=execs)
            for key, out in keyed.items():
                out.add_instructions(tracers[key[1]].insns)
        self._finish(session, index, cr3, keyed, switches, exits, starts, execs)

    def _finish(self, session, index, cr3, keyed, switches, exits, starts, execs) -> None:
        """Sideband, on the streams' clock: processes, execs, threads and
        mappings as of when they began, context switches, and exits (a
        process's -- its main thread's record -- after every thread's)."""
        self._sideband(session, index, cr3, starts, execs)
        for sw in switches:
            session.sideband.add(Switch(*sw))
        ends: dict = {}
        for tid, th in index.threads.items():
            t = exits.get(tid, starts.get(tid, index.t0))
            ends[th.pid] = max(ends.get(th.pid, t), t)
        # QEMU logs no exit for a process a signal killed: the one it ran
        # (no parent in the log) has the status its wait() gave, a child
        # the status its parent's wait saw (REAPED), or, if its parent
        # never waited, the status our wait saw (it was handed to us:
        # execution.Outcome.orphans)
        died = self._run_status
        if died is not None and died >= 0:
            died = None
        reaped = index.reaped
        for tid, th in index.threads.items():
            st = th.exit_status
            if st is None:
                root = died is not None and index.processes.get(th.pid, {}).get("ppid") \
                    not in index.processes
                st = died if root else reaped.get(th.pid, self._orphans.get(th.pid, 0))
            t = ends[th.pid] if tid == th.pid else exits.get(tid, starts.get(tid, index.t0))
            session.sideband.add(Exit(pid=th.pid, tid=tid, time=t, status=st))
        if session.mode == Mode.THREAD:
            for key in keyed:
                session.thread_exited(key[1])

    def _sideband(self, session, trace: flow.ExecTrace, cr3: dict, starts: dict,
                  execs: dict) -> None:
        from . import images
        sb = session.sideband
        lives = images.lives(trace, starts, execs, getattr(self, "_exe", ""))
        for life in lives:
            sb.add(Process(pid=life.pid, cr3=cr3[life.pid], comm=life.comm, exe=life.exe,
                           ppid=life.ppid, time=life.time))
        for tid, th in trace.threads.items():
            sb.add(Thread(tid=tid, pid=th.pid, time=starts.get(tid, trace.t0),
                          parent_tid=th.parent_tid))
        vdso_bid = self.vdso_build_id if self.vdso is not None else None
        for m in images.file_mappings(trace, vdso_bid, lives):
            if m.file == images.VDSO:
                m = Mmap(pid=m.pid, start=m.start, size=min(m.size, len(self.vdso)),
                         offset=0, file=m.file, build_id=m.build_id, prot=m.prot,
                         time=m.time)
                if self.vdso_pid is None:
                    self.vdso_pid = m.pid
            sb.add(m)

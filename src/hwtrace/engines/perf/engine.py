"""The perf engine: real Intel PT through Linux perf (perf_event_open on
the ``intel_pt`` PMU, AUX area mapped), behind :class:`hwtrace.engines.base.Engine`.

cpu mode: one Intel PT event and one sideband event per CPU, system-wide
(pid -1).  thread mode: per-thread events (pid = tid, cpu -1); threads and
child processes the workload creates are followed by opening events for
them when their FORK arrives in the sideband (the kernel refuses
``inherit`` on mmapped per-thread events), so each new thread's first
instructions before that are not traced.  A circular buffer is a snapshot
(overwrite) AUX area read once at the end; a stop-on-full buffer is a
full-trace AUX area drained while the workload runs, whose TRUNCATED /
COLLISION flags become lost-data (OVF) marks in the stream.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hwtrace.control.capabilities import Capabilities, CpuInfo
from hwtrace.control.ctl import Mode, addr_cfg
from hwtrace.control.errors import Status, TraceError

from ..base import Engine, Session
from . import abi
from .attrs import SAMPLE_TYPE, pt_attr, sideband_attr
from .errors import PerfDataError
from .intel_pt import FileMap, filter_string, ranges_to_filters
from .kernel import kernel_maps
from .perfdata import iter_records
from .pmu import PmuInfo, cpu_mode_allowed, kernel_allowed, read_facts, diagnose
from .ring import (OFF_AUX_OFFSET, OFF_AUX_TAIL, OFF_DATA_TAIL, MmapPage,
                   aux_read, aux_snapshot, read_records)
from .sideband import convert
from .sysops import PAGE_SIZE, SysOps

DATA_PAGES = 64                 # sideband / AUX-record ring, per event (power of 2)
MIN_AUX_PAGES = 16
POLL_SECONDS = 0.05


def aux_pages_for(nbytes: int) -> int:
    """The power-of-two page count perf needs, at least ``nbytes``."""
    pages = max(MIN_AUX_PAGES, -(-nbytes // PAGE_SIZE))
    return 1 << (pages - 1).bit_length()


@dataclass
class _Event:
    fd: int
    cpu: int
    tid: int | None
    base: Any
    aux: Any = None
    aux_size: int = 0
    aux_head: int = 0
    data_size: int = DATA_PAGES * PAGE_SIZE
    raw: list[bytes] = field(default_factory=list)
    output: Any = None
    snapshot: bool = False

    def page(self) -> MmapPage:
        return MmapPage.unpack(self.base[:PAGE_SIZE])

    def drain_records(self) -> list[bytes]:
        pg = self.page()
        area = memoryview(self.base)[PAGE_SIZE:PAGE_SIZE + self.data_size]
        try:
            data, tail = read_records(area, self.data_size, pg.data_tail, pg.data_head)
        finally:
            area.release()
        struct.pack_into("<Q", self.base, OFF_DATA_TAIL, tail)
        if data:
            self.raw.append(data)
        return [data] if data else []

    def drain_aux(self, upto: int | None = None) -> bytes:
        """Full-trace AUX bytes from where we were to ``upto`` (an AUX
        record's end) or the current head; the tail is published."""
        if self.aux is None or self.snapshot:
            return b""
        head = self.page().aux_head
        end = head if upto is None else min(max(upto, self.aux_head), head)
        chunk = aux_read(self.aux, self.aux_size, self.aux_head, end)
        self.aux_head = end
        struct.pack_into("<Q", self.base, OFF_AUX_TAIL, end)
        return chunk.data

    def snapshot_aux(self) -> bytes:
        if self.aux is None:
            return b""
        return aux_snapshot(self.aux, self.aux_size, self.page().aux_head).data


def exe_maps(path: str) -> list[FileMap]:
    """Executable PT_LOAD segments of a non-PIE ELF as file mappings."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        elf = ELFFile(f)
        if elf.header.e_type != "ET_EXEC":
            raise ValueError(f"{path} is position-independent: its load address is only "
                             "known after exec, so address filters can't be placed")
        out = []
        for s in elf.iter_segments():
            h = s.header
            if h.p_type != "PT_LOAD" or not h.p_flags & 1:
                continue
            # the kernel maps whole pages: so does the filter's file mapping
            start = h.p_vaddr & ~(PAGE_SIZE - 1)
            end = (h.p_vaddr + h.p_memsz + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)
            out.append(FileMap(start, end, h.p_offset - (h.p_vaddr - start),
                               os.path.realpath(path)))
        return out


def parse_cpu_list(text: str) -> frozenset[int]:
    """``0-3,5`` (sysfs cpu list) -> {0, 1, 2, 3, 5}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def online_cpus(sysfs: str = "/sys") -> frozenset[int]:
    """The online CPUs (events on offline ones fail with ENODEV)."""
    try:
        with open(os.path.join(sysfs, "devices/system/cpu/online")) as f:
            cpus = parse_cpu_list(f.read())
        if cpus:
            return cpus
    except (OSError, ValueError):
        pass
    return frozenset(range(os.cpu_count() or 1))


def _which(prog: str, env: Mapping[str, str] | None) -> str | None:
    if "/" in prog:
        return prog if os.path.isfile(prog) else None
    for d in ((env or os.environ).get("PATH", "")).split(os.pathsep):
        p = os.path.join(d or ".", prog)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


class PerfEngine(Engine):
    name = "perf"
    machine_wide = True

    def __init__(self, *, ops: Any = None, pmu: PmuInfo | None = None,
                 cpu: CpuInfo | None = None, num_cpus: int | None = None,
                 paranoid: int | None = 0, cap_eff: int = 0, sysfs: str = "/sys",
                 proc: str = "/proc", **_ignored: Any):
        if pmu is None:
            pmu_f, facts, paranoid, cap_eff, have_cpu = read_facts(sysfs, proc)
            ok, why = diagnose(pmu_f, facts, paranoid, cap_eff, have_cpu_pmu=have_cpu)
            if not ok or pmu_f is None:
                raise TraceError(Status.NOT_SUPPORTED, why)
            pmu = pmu_f
            cpu = cpu or CpuInfo(vendor=facts.vendor, family=facts.family, model=facts.model,
                                 stepping=facts.stepping, nom_freq=pmu.max_nonturbo_ratio,
                                 cpuid_0x15_eax=pmu.tsc_art_ratio[1],
                                 cpuid_0x15_ebx=pmu.tsc_art_ratio[0], timebase="host TSC")
        self.pmu = pmu
        self._proc, self._sysfs = proc, sysfs
        self._cpu = cpu or CpuInfo()
        if num_cpus is None:
            self._online = online_cpus(sysfs)
            self._num_cpus = max(self._online) + 1
        else:
            self._num_cpus = num_cpus
            self._online = frozenset(range(num_cpus))
        self.ops = ops or SysOps()
        self.paranoid, self.cap_eff = paranoid, cap_eff
        modes = {Mode.THREAD}
        if cpu_mode_allowed(paranoid, cap_eff):
            modes.add(Mode.CPU)
        self.modes = frozenset(modes)

    @property
    def capabilities(self) -> Capabilities:
        return self.pmu.capabilities()

    @property
    def cpu_info(self) -> CpuInfo:
        return self._cpu

    @property
    def num_cpus(self) -> int:
        return self._num_cpus

    # -- opening ---------------------------------------------------------
    def _check(self, out) -> None:
        if out.cr3_match:
            raise TraceError(Status.NOT_SUPPORTED, "perf programs CR3 filtering itself; "
                             "use thread mode instead of cr3_match")
        ctl = int(out.ctl)
        if ctl & (1 << 2) and not kernel_allowed(self.paranoid, self.cap_eff):
            raise TraceError(Status.NOT_SUPPORTED,
                             f"kernel tracing needs perf_event_paranoid <= 1 (it is "
                             f"{self.paranoid}) or CAP_PERFMON")

    def _filters(self, out, maps: Sequence[FileMap]) -> str:
        ctl = int(out.ctl)
        cfgs = [addr_cfg(ctl, n) for n in range(len(out.addr_ranges))]
        if not any(cfgs):
            return ""
        try:
            return filter_string(ranges_to_filters(out.addr_ranges, cfgs, maps))
        except ValueError as e:
            raise TraceError(Status.NOT_SUPPORTED, str(e)) from None

    def _open_pair(self, out, pid: int, cpu: int, tid: int | None, *, enable_on_exec: bool,
                   filters: str) -> list[_Event]:
        ctl = int(out.ctl)
        snapshot = bool(out.config.is_circular)
        size = aux_pages_for(out.config.total_size) * PAGE_SIZE
        attr = pt_attr(self.pmu.type, ctl, self.pmu.format, enable_on_exec=enable_on_exec,
                       aux_watermark=0 if snapshot else size // 2)
        try:
            fd = self.ops.perf_event_open(attr, pid, cpu)
        except OSError as e:
            raise TraceError(Status.NOT_SUPPORTED, f"intel_pt event (pid {pid}, cpu {cpu}): "
                             f"{e.strerror or e}") from None
        events = []
        try:
            base = self.ops.mmap(fd, (1 + DATA_PAGES) * PAGE_SIZE, 0, True)
            ev = _Event(fd, cpu, tid, base, output=out, snapshot=snapshot)
            events.append(ev)
            struct.pack_into("<QQ", base, OFF_AUX_OFFSET, (1 + DATA_PAGES) * PAGE_SIZE, size)
            ev.aux = self.ops.mmap(fd, size, (1 + DATA_PAGES) * PAGE_SIZE, not snapshot)
            ev.aux_size = size
            if filters:
                self.ops.set_filter(fd, filters)
            sb = sideband_attr(exclude_kernel=not ctl & (1 << 2), enable_on_exec=enable_on_exec)
            sfd = self.ops.perf_event_open(sb, pid, cpu)
            sbase = self.ops.mmap(sfd, (1 + DATA_PAGES) * PAGE_SIZE, 0, True)
            events.append(_Event(sfd, cpu, tid, sbase))
        except OSError as e:
            self._close(events or [_Event(fd, cpu, tid, None)])
            raise TraceError(Status.NOT_SUPPORTED, f"perf setup (pid {pid}, cpu {cpu}): "
                             f"{e.strerror or e}") from None
        return events

    def _close(self, events: Sequence[_Event]) -> None:
        for ev in events:
            for m in (ev.aux, ev.base):
                if m is not None:
                    try:
                        m.close()
                    except (BufferError, ValueError, AttributeError):
                        pass
            try:
                self.ops.close(ev.fd)
            except OSError:
                pass

    # -- running ---------------------------------------------------------
    def run(self, session: Session, argv: Sequence[str], *,
            env: Mapping[str, str] | None = None, cwd: str | None = None) -> int:
        if not argv:
            raise TraceError(Status.INVALID_ARGS, "no program to run")
        exe = _which(argv[0], env)
        if exe is None:
            raise TraceError(Status.INVALID_ARGS, f"{argv[0]}: program not found")
        if session.mode not in self.modes:
            raise TraceError(Status.NOT_SUPPORTED,
                             f"cpu mode needs perf_event_paranoid <= 0 (it is {self.paranoid}) "
                             "or CAP_PERFMON; set sysctl kernel.perf_event_paranoid=0")
        pid, handle = self.ops.spawn_held(argv, env, cwd)
        events: list[_Event] = []
        status: int | None = None
        try:
            events = self._setup(session, pid, exe)
            if session.mode == Mode.CPU:
                for ev in events:
                    self.ops.ioctl(ev.fd, abi.PERF_EVENT_IOC_ENABLE)
            self.ops.release(handle)
            handle = None
            while status is None:
                self.ops.poll([e.fd for e in events], POLL_SECONDS)
                self._drain(session, events, pid)
                if session.should_stop():
                    self.ops.kill(pid)
                status = self.ops.wait(pid, False)
            self._stop(session, events, pid)
            return status
        except BaseException:
            if status is None:
                self.ops.kill(pid)                 # never let it run untraced
                if handle is not None:
                    self.ops.discard(handle)
                self.ops.wait(pid, True)
            raise
        finally:
            self._close(events)

    def attach(self, session: Session, pid: int, *, duration: float | None = None) -> int:
        """Trace running process ``pid`` (its threads from /proc) until it
        exits, ``duration`` passes or the session asks to stop."""
        import time
        tids = self.ops.threads_of(pid)
        if not tids:
            raise TraceError(Status.INVALID_ARGS, f"no process {pid}")
        if session.mode not in self.modes:
            raise TraceError(Status.NOT_SUPPORTED,
                             f"cpu mode needs perf_event_paranoid <= 0 (it is {self.paranoid}) "
                             "or CAP_PERFMON; set sysctl kernel.perf_event_paranoid=0")
        events: list[_Event] = []
        try:
            if session.mode == Mode.CPU:
                for cpu in sorted(self._online):
                    out = session.cpu_output(cpu)
                    self._check(out)
                    events += self._open_pair(out, -1, cpu, None, enable_on_exec=False,
                                              filters=self._filters(out, []))
            else:
                for tid in tids:
                    out = session.thread_output(tid, pid, 0)
                    if out is None:
                        continue
                    self._check(out)
                    events += self._open_pair(out, tid, -1, tid, enable_on_exec=False,
                                              filters=self._filters(out, []))
            # what happened before we came: perf synthesizes these too
            for r in self.ops.process_sideband(pid):
                session.sideband.add(r)
            for ev in events:
                self.ops.ioctl(ev.fd, abi.PERF_EVENT_IOC_ENABLE)
            end = None if duration is None else time.monotonic() + duration
            while self.ops.threads_of(pid) and not session.should_stop() and \
                    (end is None or time.monotonic() < end):
                self.ops.poll([e.fd for e in events], POLL_SECONDS)
                self._drain(session, events, pid)
            self._stop(session, events, pid)
            return 0
        finally:
            self._close(events)

    def _setup(self, session: Session, pid: int, exe: str) -> list[_Event]:
        events: list[_Event] = []
        maps: list[FileMap] | None = None
        try:
            if session.mode == Mode.CPU:
                for cpu in sorted(self._online):
                    out = session.cpu_output(cpu)
                    self._check(out)
                    if maps is None and out.addr_ranges:
                        maps = self._maps(exe)
                    events += self._open_pair(out, -1, cpu, None, enable_on_exec=False,
                                              filters=self._filters(out, maps or []))
            else:
                out = session.thread_output(pid, pid, 0)
                if out is not None:
                    self._check(out)
                    maps = self._maps(exe) if out.addr_ranges else []
                    events += self._open_pair(out, pid, -1, pid, enable_on_exec=True,
                                              filters=self._filters(out, maps))
        except BaseException:
            self._close(events)
            raise
        return events

    def _maps(self, exe: str) -> list[FileMap]:
        try:
            return exe_maps(exe)
        except (OSError, ValueError) as e:
            raise TraceError(Status.NOT_SUPPORTED, f"address filters: {e}") from None
        except Exception as e:       # pyelftools on a non-ELF
            raise TraceError(Status.NOT_SUPPORTED, f"address filters: {exe}: not ELF ({e})") from None

    def _stop(self, session: Session, events: list[_Event], root_pid: int) -> None:
        """The end of a trace (a run's or an attachment's): disable the
        events, take what their buffers still hold, a snapshot buffer's
        whole AUX area, and the sideband."""
        for ev in events:
            self.ops.ioctl(ev.fd, abi.PERF_EVENT_IOC_DISABLE)
        self._drain(session, events, root_pid)
        for ev in events:
            if ev.snapshot and ev.output is not None:
                ev.output.write(ev.snapshot_aux())
        self._sideband(session, events)

    def _drain(self, session: Session, events: list[_Event], root_pid: int) -> None:
        new_threads = []
        for ev in list(events):
            for chunk in ev.drain_records():
                for rec in self._parse(chunk):
                    if rec.type == abi.AUX and ev.output is not None and \
                            (rec.body.truncated or rec.body.collision):
                        # the bytes this record reports, then the gap
                        data = ev.drain_aux(rec.body.aux_offset + rec.body.aux_size)
                        if data:
                            ev.output.write(data)
                        ev.output.overflow()
                    elif rec.type == abi.FORK and session.mode == Mode.THREAD \
                            and ev.output is None and rec.body.tid != rec.body.ptid:
                        new_threads.append(rec.body)
            if ev.output is not None:
                data = ev.drain_aux()
                if data:
                    ev.output.write(data)
        for t in new_threads:
            if any(e.tid == t.tid for e in events):
                continue
            out = session.thread_output(t.tid, t.pid, t.ptid)
            if out is None:
                continue
            try:
                events += self._open_pair(out, t.tid, -1, t.tid, enable_on_exec=False,
                                          filters="")
                for e in events[-2:]:
                    self.ops.ioctl(e.fd, abi.PERF_EVENT_IOC_ENABLE)
            except TraceError:
                out.overflow()          # the thread ran untraced: mark the gap

    @staticmethod
    def _parse(chunk: bytes):
        try:
            return list(iter_records(chunk, sample_type=SAMPLE_TYPE))
        except PerfDataError:
            return []

    def _sideband(self, session: Session, events: list[_Event]) -> None:
        recs = []
        tc = None
        for ev in events:
            if tc is None:
                try:
                    tc = ev.page().time_conv()
                except (PerfDataError, ValueError):
                    tc = None
            for chunk in ev.raw:
                recs += self._parse(chunk)
        recs.sort(key=lambda r: r.sample_id.time if r.sample_id and r.sample_id.time else 0)
        conv = convert(recs, lambda r: b"", time_conv=tc)
        if any(ev.output is not None and int(ev.output.ctl) & (1 << 2) for ev in events):
            for m in kernel_maps(self._proc, self._sysfs):      # as perf record does
                session.sideband.add(m)
        for r in conv.sideband:
            session.sideband.add(r)

    def describe(self) -> Mapping[str, Any]:
        return {"pmu_type": self.pmu.type, "pmu_format": dict(self.pmu.format),
                "perf_event_paranoid": self.paranoid}


def probe_availability():
    """The registry's probe: Availability with the reason."""
    from ..base import Availability
    from .pmu import probe
    ok, why = probe()
    return Availability(ok, why)


def create(**options: Any) -> PerfEngine:
    return PerfEngine(**options)

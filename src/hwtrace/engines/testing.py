"""A test engine: writes given packet bytes, as scripted, into the device's buffers.

Used by the trace-control tests (and handy for anyone testing a reader)::

    eng = TestEngine(writes={0: [psb, b"\\x00" * 10], 1: [psb]})
    dev = hwtrace.open_device(engine=eng)

``writes`` maps a CPU number (cpu mode) or a thread id (thread mode) to the
items to deliver in order: ``bytes`` are written, the string ``"overflow"``
calls ``Output.overflow()``, an ``int`` adds that many observed instructions.
In thread mode each scripted tid is announced with ``session.thread_output(tid,
pids.get(tid, tid))``; ``None`` back means it isn't traced. ``sideband``
records are added first. ``run`` returns ``exit_status``; it records what it
saw in ``runs`` (argv, mode, and per target the ctl/cr3_match/addr_ranges and
bytes accepted).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from hwtrace.control.capabilities import FULL, Capabilities, CpuInfo
from hwtrace.control.ctl import Mode
from .base import Availability, Engine, Session

#: What the test engine pretends to be: a Skylake client CPU, 2.8 GHz.
TEST_CPU = CpuInfo(vendor="GenuineIntel", family=6, model=0x4E, stepping=3,
                   nom_freq=28, cpuid_0x15_eax=2, cpuid_0x15_ebx=188,
                   timebase="scripted", tsc_hz=0)


class TestEngine(Engine):
    __test__ = False  # not a pytest class
    name = "testing"

    def __init__(self, writes: Mapping[int, bytes | Iterable[Any]] | None = None, *,
                 sideband: Sequence[Any] = (), capabilities: Capabilities = FULL,
                 cpu_info: CpuInfo = TEST_CPU, num_cpus: int = 2,
                 pids: Mapping[int, int] | None = None, exit_status: int = 0,
                 modes: Iterable[Mode] = (Mode.CPU, Mode.THREAD), **_ignored: Any):
        self.writes = dict(writes or {})
        self.sideband = list(sideband)
        self._caps = capabilities
        self._cpu = cpu_info
        self._num_cpus = num_cpus
        self.pids = dict(pids or {})
        self.exit_status = exit_status
        self.modes = frozenset(modes)
        self.runs: list[dict[str, Any]] = []
        self.closed = False

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def cpu_info(self) -> CpuInfo:
        return self._cpu

    @property
    def num_cpus(self) -> int:
        return self._num_cpus

    def run(self, session: Session, argv: Sequence[str], *, env=None, cwd=None) -> int:
        seen: dict[str, Any] = {"argv": list(argv), "mode": session.mode, "targets": {}}
        self.runs.append(seen)
        for rec in self.sideband:
            session.sideband.add(rec)
        for target, items in self.writes.items():
            if session.mode == Mode.CPU:
                out = session.cpu_output(target)
            else:
                out = session.thread_output(target, self.pids.get(target, target))
            if out is None:
                seen["targets"][target] = None
                continue
            t = seen["targets"][target] = {"ctl": out.ctl, "cr3_match": out.cr3_match,
                                           "addr_ranges": out.addr_ranges, "stored": 0}
            if isinstance(items, (bytes, bytearray, memoryview)):
                items = [items]
            for item in items:
                if session.should_stop():
                    break
                if item == "overflow":
                    out.overflow()
                elif isinstance(item, int):
                    out.add_instructions(item)
                else:
                    t["stored"] += out.write(item)
            if session.mode == Mode.THREAD:
                session.thread_exited(target)
        return self.exit_status

    def attach(self, session: Session, pid: int, *, duration=None) -> int:
        return self.run(session, [f"<pid {pid}>"])

    def close(self) -> None:
        self.closed = True


def probe() -> Availability:
    return Availability(True)


def create(**options: Any) -> TestEngine:
    return TestEngine(**options)

"""LLDB's trace bundle description (``trace.json``), checked.

LLDB's ``trace save`` writes a directory with a ``trace.json`` that says
what the trace files are (LLDB's TraceIntelPTJSONStructs)::

    {"type": "intel-pt",
     "cpuInfo": {"vendor": "GenuineIntel", "family": 6, "model": 85,
                 "stepping": 4},
     "processes": [{"pid": 1234, "triple": "x86_64-*-linux",
                    "threads": [{"tid": 1234, "iptTrace": "1234.trace"}],
                    "modules": [{"systemPath": "/tmp/a.out",
                                 "file": "modules/a.out",
                                 "loadAddress": "0x400000",
                                 "uuid": "6AA9A4E2-..."}]}],
     "cpus": [{"id": 45, "iptTrace": "cores/45.intelpt_trace",
               "contextSwitchTrace": "cores/45.perf_context_switch_trace"}],
     "tscPerfZeroConversion": {"timeMult": 1076264588, "timeShift": 31,
                               "timeZero": 18433473881008870804},
     "kernel": {"file": "vmlinux", "loadAddress": "0xffffffff81000000"}}

Per-thread traces (``threads[].iptTrace``; ``traceBuffer`` in LLDB's
format before 2022) or per-CPU traces (``cpus``,
which need ``tscPerfZeroConversion``); ``kernel`` for kernel-only tracing
(then no processes).  Numbers may be JSON integers or strings in C syntax
(LLDB writes load addresses as hex strings).  Paths are relative to the
directory of ``trace.json``.

:func:`parse` takes the decoded JSON value and returns a
:class:`Description` or raises :class:`DescriptionError` with one line
naming the JSON path of the problem.  No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

U64 = (1 << 64) - 1
U32 = (1 << 32) - 1
MAX_ITEMS = 1 << 16           # processes, threads, modules, cpus
MAX_PATH = 4096
# LLVM's StringRef::getAsInteger with radix 0 (auto-sensed), at most
# 64 digits (a bigger number is out of range anyway)
_NUMBER = re.compile(r"0[xX]([0-9a-fA-F]{1,64})\Z|0[bB]([01]{1,64})\Z|"
                     r"0[oO]?([0-7]{1,64})\Z|([1-9][0-9]{0,63}|0)\Z")


class DescriptionError(ValueError):
    """A trace.json that is not a valid LLDB Intel PT description."""


@dataclass(frozen=True, slots=True)
class Module:
    system_path: str           # where it was loaded from on the traced host
    file: str | None           # its copy in the trace directory, if saved
    load_address: int
    uuid: str | None


@dataclass(frozen=True, slots=True)
class Thread:
    tid: int
    ipt_trace: str | None      # per-thread trace file


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    triple: str | None
    threads: tuple[Thread, ...]
    modules: tuple[Module, ...]


@dataclass(frozen=True, slots=True)
class Cpu:
    id: int
    ipt_trace: str
    context_switch_trace: str


@dataclass(frozen=True, slots=True)
class TscConversion:
    """perf's TSC <-> perf-clock conversion (perf_event_mmap_page)."""
    time_mult: int
    time_shift: int
    time_zero: int


@dataclass(frozen=True, slots=True)
class Kernel:
    file: str
    load_address: int | None


@dataclass(frozen=True, slots=True)
class Description:
    vendor: str
    family: int
    model: int
    stepping: int
    processes: tuple[Process, ...]
    cpus: tuple[Cpu, ...] | None
    tsc_conversion: TscConversion | None
    kernel: Kernel | None

    @property
    def per_cpu(self) -> bool:
        return self.cpus is not None


def _fail(path: str, what: str):
    raise DescriptionError(f"{path}: {what}")


def _object(v, path: str) -> dict:
    if not isinstance(v, dict):
        _fail(path, "not an object")
    return v


def _list(v, path: str) -> list:
    if not isinstance(v, list):
        _fail(path, "not a list")
    if len(v) > MAX_ITEMS:
        _fail(path, f"more than {MAX_ITEMS} entries")
    return v


def _number(v, path: str, limit: int = U64) -> int:
    """LLDB's JSONUINT64: an integer, or a string C's strtoull reads."""
    if isinstance(v, bool):
        _fail(path, "not a number")
    if isinstance(v, str):
        m = _NUMBER.match(v)
        if m is None:
            _fail(path, f"not a number: {v[:40]!r}")
        hx, bn, oc, dec = m.groups()
        n = int(hx, 16) if hx else int(bn, 2) if bn else \
            int(oc, 8) if oc else int(dec, 10)
    elif isinstance(v, int):
        n = v
    else:
        _fail(path, "not a number")
    if not 0 <= n <= limit:
        _fail(path, f"out of range: {n}" if n.bit_length() < 80 else
              "out of range")
    return n


def _int(v, path: str, limit: int) -> int:
    """A plain JSON integer (LLDB maps these to C integers)."""
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(path, "not an integer")
    if not 0 <= v <= limit:
        _fail(path, f"out of range: {v}" if v.bit_length() < 80 else
              "out of range")
    return v


def _string(v, path: str, limit: int = MAX_PATH) -> str:
    if not isinstance(v, str):
        _fail(path, "not a string")
    if not v or len(v) > limit or "\0" in v:
        _fail(path, "empty, too long or holds a NUL")
    return v


def _opt(obj: dict, key: str, conv, path: str):
    v = obj.get(key)
    return None if v is None else conv(v, f"{path}.{key}")


def _need(obj: dict, key: str, path: str):
    if key not in obj or obj[key] is None:
        _fail(f"{path}.{key}", "missing")
    return obj[key]


def _module(v, path: str) -> Module:
    o = _object(v, path)
    return Module(system_path=_string(_need(o, "systemPath", path),
                                      f"{path}.systemPath"),
                  file=_opt(o, "file", _string, path),
                  load_address=_number(_need(o, "loadAddress", path),
                                       f"{path}.loadAddress"),
                  uuid=_opt(o, "uuid", lambda x, p: _string(x, p, 256), path))


def _thread(v, path: str) -> Thread:
    o = _object(v, path)
    # "traceBuffer": what LLDB called the per-thread trace before 2022
    key = "iptTrace" if o.get("iptTrace") is not None or \
        o.get("traceBuffer") is None else "traceBuffer"
    return Thread(tid=_number(_need(o, "tid", path), f"{path}.tid", U32),
                  ipt_trace=_opt(o, key, _string, path))


def _process(v, path: str) -> Process:
    o = _object(v, path)
    threads = tuple(_thread(t, f"{path}.threads[{i}]") for i, t in
                    enumerate(_list(_need(o, "threads", path),
                                    f"{path}.threads")))
    raw = o.get("modules")
    modules = tuple(_module(m, f"{path}.modules[{i}]") for i, m in
                    enumerate(_list([] if raw is None else raw,
                                    f"{path}.modules")))
    return Process(pid=_number(_need(o, "pid", path), f"{path}.pid", U32),
                   triple=_opt(o, "triple", lambda x, p: _string(x, p, 256),
                               path),
                   threads=threads, modules=modules)


def _cpu(v, path: str) -> Cpu:
    o = _object(v, path)
    # a bundle stream's cpu number is below 2**20
    return Cpu(id=_number(_need(o, "id", path), f"{path}.id", (1 << 20) - 1),
               ipt_trace=_string(_need(o, "iptTrace", path),
                                 f"{path}.iptTrace"),
               context_switch_trace=_string(
                   _need(o, "contextSwitchTrace", path),
                   f"{path}.contextSwitchTrace"))


def _conversion(v, path: str) -> TscConversion:
    o = _object(v, path)
    mult = _number(_need(o, "timeMult", path), f"{path}.timeMult", U32)
    shift = _number(_need(o, "timeShift", path), f"{path}.timeShift", 63)
    if not mult:
        _fail(f"{path}.timeMult", "zero")
    return TscConversion(mult, shift,
                         _number(_need(o, "timeZero", path),
                                 f"{path}.timeZero"))


def parse(value) -> Description:
    """Check a decoded trace.json; DescriptionError if it is not one."""
    top = _object(value, "trace.json")
    kind = top.get("type")
    if kind != "intel-pt":
        _fail("trace.json.type", "not \"intel-pt\"" if kind is not None
              else "missing")
    info = _object(_need(top, "cpuInfo", "trace.json"), "trace.json.cpuInfo")
    p = "trace.json.cpuInfo"
    vendor = _string(_need(info, "vendor", p), f"{p}.vendor", 64)
    family = _number(_need(info, "family", p), f"{p}.family", 0xff)
    model = _number(_need(info, "model", p), f"{p}.model", 0xff)
    stepping = _number(_need(info, "stepping", p), f"{p}.stepping", 0xff)
    cpus = None
    if top.get("cpus") is not None:
        cpus = tuple(_cpu(c, f"trace.json.cpus[{i}]") for i, c in
                     enumerate(_list(top["cpus"], "trace.json.cpus")))
    conv = _opt(top, "tscPerfZeroConversion", _conversion, "trace.json")
    kernel = None
    if top.get("kernel") is not None:
        k = _object(top["kernel"], "trace.json.kernel")
        kernel = Kernel(_string(_need(k, "file", "trace.json.kernel"),
                                "trace.json.kernel.file"),
                        _opt(k, "loadAddress", _number, "trace.json.kernel"))
    raw = top.get("processes")
    procs = tuple(_process(x, f"trace.json.processes[{i}]") for i, x in
                  enumerate(_list([] if raw is None else raw,
                                  "trace.json.processes")))
    if cpus is not None and conv is None:
        _fail("trace.json", "\"tscPerfZeroConversion\" is required with "
              "\"cpus\"")
    if kernel is not None:
        if procs:
            _fail("trace.json", "\"processes\" must be empty with \"kernel\"")
        if cpus is None:
            _fail("trace.json", "\"cpus\" is required with \"kernel\"")
    elif top.get("processes") is None:
        _fail("trace.json.processes", "missing")
    _unique([c.id for c in cpus or ()], "trace.json.cpus", "cpu id")
    _unique([x.pid for x in procs], "trace.json.processes", "pid")
    _unique([t.tid for x in procs for t in x.threads],
            "trace.json.processes", "tid")
    if cpus is None and not any(t.ipt_trace for x in procs
                                for t in x.threads):
        _fail("trace.json", "no trace: no \"cpus\" and no thread with an "
              "\"iptTrace\"")
    return Description(vendor, family, model, stepping, procs, cpus, conv,
                       kernel)


def _unique(values: list, path: str, what: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            _fail(path, f"{what} {v} twice")
        seen.add(v)

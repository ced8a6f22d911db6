"""LLDB ``trace save`` directory -> trace bundle (``hwtrace import``).

What the bundle gets:

- a stream per CPU (``cpuN.pt``, per-CPU traces) or per traced thread
  (``tidN.pt`` with its pid), the Intel PT bytes as LLDB saved them;
- sideband: a ``Process`` per process (its first module as the
  executable), a ``Thread`` per thread, an ``Mmap`` per loadable segment
  of every module (relocated the way LLDB loads it: the module's first
  segment at ``loadAddress``) and of the kernel (pid -1), and per CPU the
  context switches of its ``contextSwitchTrace`` with their times
  converted to TSC (:mod:`.switches`), so cpu-mode records carry the
  right pid and tid;
- copies of the modules' files (``images/``), with their GNU build-ids;
- the CPU (vendor, family, model, stepping) and the TSC rate
  (``tscPerfZeroConversion``) in the manifest, LLDB's description under
  ``lldb``.

trace.json and the files it names are read as hostile input: JSON size
limited, every path relative to trace.json's directory and inside it (no
``..`` out, no absolute paths, no symbolic links), every file a regular
file opened without blocking (a FIFO or device fails).  Every problem is a
:class:`LldbTraceError` with one line.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from hwtrace import bundle as B
from hwtrace.engines.perf.records import TimeConv

from . import description as D
from .switches import SwitchTraceError, switches

MAX_JSON = 16 << 20
MAX_SWITCH_TRACE = 256 << 20
_CHUNK = 1 << 20
_PT_LOAD = 1
_PF_X, _PF_W, _PF_R = 1, 2, 4


class LldbTraceError(ValueError):
    """A trace.json (or a file it names) that can't be imported."""


@dataclass
class ImportResult:
    path: Path
    streams: list[tuple[str, int]]              # (file, size)
    sideband_records: int
    images: list[tuple[str, str]]               # (system path, source used)
    missing_images: list[str] = field(default_factory=list)
    mode: str = ""


def is_trace_json(path: str | os.PathLike) -> bool:
    """Whether ``path`` is meant as an LLDB trace description: a directory
    holding trace.json, a file named *.json, or a file whose first
    non-blank byte opens JSON (a perf.data starts with PERFILE2)."""
    p = Path(path)
    if p.is_dir():
        return (p / "trace.json").is_file()
    if p.name.endswith(".json"):
        return True
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.pread(fd, 64, 0)
    except OSError:
        return False
    finally:
        os.close(fd)
    return head.lstrip()[:1] in (b"{", b"[")


def _open_regular(path: Path, what: str) -> int:
    """A read-only fd for a regular file (no final symlink, no blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LldbTraceError(f"{what}: {path}: is a symbolic link") \
                from None
        raise LldbTraceError(f"{what}: {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LldbTraceError(f"{what}: {path}: not a regular file")
    return fd


class _Dir:
    """The trace directory: paths in trace.json resolve inside it only."""

    def __init__(self, base: Path):
        self.base = base.resolve()

    def path(self, rel: str, what: str) -> Path:
        if os.path.isabs(rel):
            raise LldbTraceError(f"{what}: {rel}: an absolute path (only "
                                 f"files inside the trace directory are read)")
        p = Path(os.path.normpath(self.base / rel))
        if p != self.base and self.base not in p.parents:
            raise LldbTraceError(f"{what}: {rel}: outside the trace directory")
        # No symbolic link on the way (a link could lead out).
        q = self.base
        for part in p.relative_to(self.base).parts:
            q = q / part
            if q.is_symlink():
                raise LldbTraceError(f"{what}: {rel}: is (or goes through) a "
                                     f"symbolic link")
        return p

    def open(self, rel: str, what: str) -> int:
        return _open_regular(self.path(rel, what), what)


def _chunks(fd: int):
    with os.fdopen(fd, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                return
            yield b


def _read_all(fd: int, limit: int, what: str) -> bytes:
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise LldbTraceError(f"{what}: more than {limit} bytes")
    return data


def read_description(path: str | os.PathLike) -> tuple[D.Description, Path]:
    """(the checked description, the trace directory) for a trace.json or
    a directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "trace.json"
    text = _read_all(_open_regular(p, "trace.json"), MAX_JSON, str(p))
    try:
        value = json.loads(text)
    except RecursionError:
        raise LldbTraceError(f"{p}: JSON nested too deeply") from None
    except ValueError as e:
        raise LldbTraceError(f"{p}: not JSON: {e}") from None
    try:
        return D.parse(value), p.parent
    except D.DescriptionError as e:
        raise LldbTraceError(f"{p}: {e}") from None


def _segments(fd: int, what: str):
    """(offset, filesz, vaddr, prot) of an ELF file's PT_LOAD segments with
    file bytes, from its program headers (all a loader needs: truncated or
    odd section headers don't matter)."""
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF":
            raise LldbTraceError(f"{what}: not an ELF file")
        cls, order = head[4], head[5]
        if cls not in (1, 2) or order not in (1, 2):
            raise LldbTraceError(f"{what}: not a readable ELF file "
                                 f"(class {cls}, data {order})")
        e = "<" if order == 1 else ">"
        if cls == 2:
            if len(head) < 64:
                raise LldbTraceError(f"{what}: truncated ELF header")
            phoff, = struct.unpack_from(e + "Q", head, 32)
            phentsize, phnum = struct.unpack_from(e + "HH", head, 54)
            ph, need = e + "IIQQQQQQ", 56
        else:
            phoff, = struct.unpack_from(e + "I", head, 28)
            phentsize, phnum = struct.unpack_from(e + "HH", head, 42)
            ph, need = e + "IIIIIIII", 32
        if phentsize < need or phoff + phnum * phentsize > size:
            raise LldbTraceError(f"{what}: not a readable ELF file (program "
                                 f"headers past its end)")
        f.seek(phoff)
        table = f.read(phnum * phentsize)
    out = []
    for i in range(phnum):
        v = struct.unpack_from(ph, table, i * phentsize)
        if cls == 2:
            typ, flags, off, vaddr, _pa, filesz = v[:6]
        else:
            typ, off, vaddr, _pa, filesz, _mem, flags = v[:7]
        if typ != _PT_LOAD or not filesz:
            continue
        if off + filesz > size:
            raise LldbTraceError(f"{what}: a segment runs past the end of "
                                 f"the file")
        prot = ("r" if flags & _PF_R else "-") + \
            ("w" if flags & _PF_W else "-") + ("x" if flags & _PF_X else "-")
        out.append((off, filesz, vaddr, prot))
    if not out:
        raise LldbTraceError(f"{what}: no loadable segment")
    return out


def _module_maps(d: _Dir, pid: int, file: str, system_path: str,
                 load_address: int | None, what: str):
    """(source path, build-id, [Mmap]) for one module file."""
    from hwtrace.buildid import build_id
    src = d.path(file, what)
    segs = _segments(d.open(file, what), what)
    low = min(v for _, _, v, _ in segs)
    bias = 0 if load_address is None else load_address - low
    bid = build_id(src)
    maps = [B.Mmap(pid=pid, start=(v + bias) & D.U64, size=size, offset=off,
                   file=system_path, build_id=bid, prot=prot)
            for off, size, v, prot in segs]
    return src, bid, maps


def import_lldb_trace(path: str | os.PathLike, out_dir: str | os.PathLike, *,
                      exist_ok: bool = False) -> ImportResult:
    """Write the bundle for LLDB trace ``path`` (trace.json or its
    directory) into ``out_dir``."""
    desc, base = read_description(path)
    d = _Dir(base)
    conv = None
    if desc.tsc_conversion is not None:
        c = desc.tsc_conversion
        conv = TimeConv(time_shift=c.time_shift, time_mult=c.time_mult,
                        time_zero=c.time_zero)

    # Everything is read and checked before the bundle is written.
    sideband: list = []
    images: dict[str, tuple[Path, str]] = {}
    missing: list[str] = []
    for i, proc in enumerate(desc.processes):
        exe = proc.modules[0].system_path if proc.modules else ""
        sideband.append(B.Process(pid=proc.pid, cr3=0,
                                  comm=os.path.basename(exe)[:16], exe=exe))
        for t in proc.threads:
            sideband.append(B.Thread(tid=t.tid, pid=proc.pid))
        for j, m in enumerate(proc.modules):
            what = f"processes[{i}].modules[{j}]"
            if m.file is None:
                missing.append(m.system_path)
                continue
            src, bid, maps = _module_maps(d, proc.pid, m.file, m.system_path,
                                          m.load_address, what)
            sideband.extend(maps)
            images.setdefault(m.system_path, (src, bid))
    if desc.kernel is not None:
        k = desc.kernel
        src, bid, maps = _module_maps(d, -1, k.file, k.file, k.load_address,
                                      "kernel")
        sideband.extend(maps)
        images.setdefault(k.file, (src, bid))

    stream_fds = []
    try:
        if desc.per_cpu:
            for i, cpu in enumerate(desc.cpus):
                what = f"cpus[{i}]"
                data = _read_all(d.open(cpu.context_switch_trace, what),
                                 MAX_SWITCH_TRACE,
                                 f"{what}.contextSwitchTrace")
                try:
                    sideband.extend(switches(data, cpu.id, conv))
                except SwitchTraceError as e:
                    raise LldbTraceError(
                        f"{what}.contextSwitchTrace: {e}") from None
                stream_fds.append((d.open(cpu.ipt_trace, f"{what}.iptTrace"),
                                   {"cpu": cpu.id}))
        else:
            for i, proc in enumerate(desc.processes):
                for j, t in enumerate(proc.threads):
                    if t.ipt_trace is None:
                        continue
                    what = f"processes[{i}].threads[{j}].iptTrace"
                    stream_fds.append((d.open(t.ipt_trace, what),
                                       {"tid": t.tid, "pid": proc.pid}))
        sideband.sort(key=lambda r: r.time)

        cpu = {"vendor": desc.vendor, "family": desc.family,
               "model": desc.model, "stepping": desc.stepping}
        if conv is not None:
            cpu["timebase"] = "host TSC"
            cpu["tsc_hz"] = (10**9 << conv.time_shift) // conv.time_mult
        meta = {"engine": "lldb", "mode": "cpu" if desc.per_cpu else "thread",
                "cpu": cpu, "mtc_freq": 0,
                "lldb": {"source": str(base / "trace.json"),
                         "tscPerfZeroConversion": None if conv is None else
                         {"timeMult": conv.time_mult,
                          "timeShift": conv.time_shift,
                          "timeZero": conv.time_zero},
                         "kernel": desc.kernel is not None}}
        with B.BundleWriter(out_dir, exist_ok=exist_ok, **meta) as w:
            streams = []
            while stream_fds:
                fd, where = stream_fds.pop(0)
                st = w.add_stream(_chunks(fd), **where)
                streams.append((st.file, st.size))
            w.sideband.extend(sideband)
            used = []
            for system_path, (src, bid) in images.items():
                w.add_image(src, path=system_path, build_id=bid)
                used.append((system_path, str(src)))
    finally:
        for fd, _ in stream_fds:
            os.close(fd)
    return ImportResult(Path(out_dir), streams, len(sideband), used, missing,
                        meta["mode"])

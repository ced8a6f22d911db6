"""What a killed recorder leaves behind, made usable again.

``hwtrace record`` with an emulated engine keeps the execution log in its
output directory while the program runs (``DIR/hwtrace-xlog-*/exec.xlog``,
next to it ``recording.json``: the mode, buffer configuration and CPU count
the recorder would have generated the streams with, written by the engine
before the program starts).  If the recorder is killed, the traced QEMU or
stepper dies with it and the log stays there, cut wherever the kill fell.

This module finds such logs (:func:`find_logs`), reads their settings
(:func:`read_settings`), finds the longest prefix made of whole records
(:func:`complete_prefix`: a truncated last record is dropped, never
misread) and offers :class:`ReplayEngine`, the emulated engine with the
execution already done: its ``run`` generates the streams and sideband from
the log with the engine's own code, so a recovered bundle is what the
recorder would have written had it been stopped at that point.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import execlog as xl
from .engine import EmulatedEngine

LOG_DIR_PREFIX = "hwtrace-xlog-"
LOG_NAME = "exec.xlog"
META_NAME = "recording.json"
MAX_META = 1 << 16

# Record payload sizes (without the type byte), execlog format version 1.
_FIXED = {
    xl.T_CTX: 12, xl.T_TIME: 8, xl.T_EXEC_PART: 6, xl.T_THREAD_START: 4,
    xl.T_THREAD_EXIT: 4, xl.T_PROC_START: 4, xl.T_PROC_EXIT: 4, xl.T_SYSCALL: 8,
    xl.T_SYSRET: 16, xl.T_SIGNAL: 21, xl.T_SIGACTION: 20, xl.T_MUNMAP: 20,
}
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_BLOCK_HEAD = struct.Struct("<IIQHH")     # pid, id, pc, ninsn, nbytes
_MMAP_HEAD = struct.Struct("<IQQQIH")     # pid, addr, size, offset, prot, len
_SOURCES = {xl.SOURCE_QEMU: "qemu", xl.SOURCE_PTRACE: "ptrace"}


class SalvageError(ValueError):
    """Nothing usable in the log (one-line message)."""


def find_logs(directory: str | os.PathLike) -> list[Path]:
    """The execution logs a recorder left in ``directory``, oldest first
    (``hwtrace-xlog-*/exec.xlog``; symlinks are not followed)."""
    d = Path(directory)
    out = []
    try:
        entries = list(d.iterdir())
    except OSError:
        return []
    for p in entries:
        if not p.name.startswith(LOG_DIR_PREFIX) or p.is_symlink() or not p.is_dir():
            continue
        log = p / LOG_NAME
        if log.is_file() and not log.is_symlink():
            out.append(log)
    return sorted(out, key=lambda q: (q.stat().st_mtime_ns, q.parent.name))


def complete_prefix(data) -> int:
    """The length of the longest prefix of ``data`` (a whole log, header
    included) that is the header and whole records: where a record is cut
    short, or where the bytes stop being records (a zero type byte, as in a
    file extended but never written, or an unknown type), the log ends.
    0: not even a whole header."""
    try:
        _, off = xl.parse_header(data)
    except xl.ExecLogError:
        return 0
    end = len(data)
    while off < end:
        n = record_size(data, off)
        if n is None or off + n > end:
            break
        off += n
    return off


def record_size(data, off: int) -> int | None:
    """The size (type byte included) of the record at ``off``, as far as the
    bytes present tell; None if its type is not a record type or its
    length fields are cut off or inconsistent."""
    end = len(data)
    t = data[off]
    p = off + 1
    fixed = _FIXED.get(t)
    if fixed is not None:
        return 1 + fixed
    try:
        if t == xl.T_EXEC:
            (n,) = _U32.unpack_from(data, p)
            return 1 + 4 + 4 * n
        if t == xl.T_BLOCK:
            _pid, _id, _pc, ninsn, nbytes = _BLOCK_HEAD.unpack_from(data, p)
            q = p + _BLOCK_HEAD.size
            if q + ninsn > end:
                return None
            if sum(data[q:q + ninsn]) != nbytes:
                return None         # sizes that don't add up: not a record
            return 1 + _BLOCK_HEAD.size + ninsn + nbytes
        if t == xl.T_INSN:
            return 1 + 9 + data[p + 8]
        if t == xl.T_PROC_EXEC:
            (n,) = _U16.unpack_from(data, p + 1)
            return 1 + 3 + n
        if t == xl.T_MMAP:
            *_, n = _MMAP_HEAD.unpack_from(data, p)
            q = p + _MMAP_HEAD.size + n
            return q + 1 + data[q] - off
    except (struct.error, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Settings:
    """How the recorder would have made the bundle (``recording.json``);
    ``recorded`` False: the file was missing or unreadable and these are
    ``hwtrace record``'s defaults."""
    mode: str = "cpu"
    config: dict = field(default_factory=dict)
    num_cpus: int = 0
    copy_images: bool = False
    elf_ranges: dict = field(default_factory=dict)    # n -> (path, begin, end)
    exe: str = ""
    recorded: bool = False


def read_settings(log: str | os.PathLike) -> Settings:
    """The settings kept next to ``log`` (defaults when there are none or
    they don't make sense; never raises)."""
    p = Path(log).with_name(META_NAME)
    try:
        if p.is_symlink() or not p.is_file() or p.stat().st_size > MAX_META:
            return Settings()
        m = json.loads(p.read_text())
        if not isinstance(m, dict) or m.get("format") != "hwtrace-recording":
            return Settings()
        mode = m.get("mode")
        cfg = m.get("config")
        ncpu = m.get("num_cpus")
        ranges = {}
        for k, v in (m.get("elf_ranges") or {}).items():
            path, b, e = v
            if not (isinstance(path, str) and isinstance(b, int) and isinstance(e, int)):
                raise ValueError("bad elf range")
            ranges[int(k)] = (path, b, e)
        if mode not in ("cpu", "thread") or not isinstance(cfg, dict) \
                or isinstance(ncpu, bool) or not isinstance(ncpu, int) or not 0 < ncpu <= 4096:
            return Settings()
        exe = m.get("exe")
        return Settings(mode=mode, config=cfg, num_cpus=ncpu,
                        copy_images=bool(m.get("copy_images")), elf_ranges=ranges,
                        exe=exe if isinstance(exe, str) else "", recorded=True)
    except (OSError, ValueError, TypeError, AttributeError):
        return Settings()


@dataclass(frozen=True)
class Prepared:
    """A log cut to its whole records: ``path`` is the log to generate from
    (the original when nothing was cut), ``used``/``size`` its bytes."""
    path: Path
    source: str
    used: int
    size: int

    @property
    def dropped(self) -> int:
        return self.size - self.used


def prepare(log: str | os.PathLike, scratch: str | os.PathLike) -> Prepared:
    """Check ``log`` and, if its end is not a record boundary, write its
    whole-record prefix (and the ``.vdso`` next to it) into ``scratch``."""
    log = Path(log)
    with open(log, "rb") as f:
        data = f.read()
    used = complete_prefix(data)
    if used == 0:
        raise SalvageError(f"{log}: not an execution log (no complete header)")
    header, _ = xl.parse_header(data[:used])
    source = _SOURCES.get(header.source)
    if source is None:
        raise SalvageError(f"{log}: unknown execution source {header.source}")
    if used == len(data):
        return Prepared(log, source, used, len(data))
    out = Path(scratch) / LOG_NAME
    with open(out, "wb") as f:
        f.write(memoryview(data)[:used])
    vdso = log.with_name(LOG_NAME + ".vdso")
    if vdso.is_file() and not vdso.is_symlink():
        shutil.copyfile(vdso, out.with_name(LOG_NAME + ".vdso"))
    return Prepared(out, source, used, len(data))


class ReplayEngine(EmulatedEngine):
    """The emulated engine whose program already ran: ``run`` generates the
    streams and sideband of the session from the finished log ``log``
    (ignoring argv) exactly as the engine does after an execution."""

    def __init__(self, log: str | os.PathLike, source: str = "qemu",
                 num_cpus: int | None = None, exe: str = "", **kw: Any):
        super().__init__(source, num_cpus, **kw)
        self.log = os.fspath(log)
        if exe:
            self._exe = exe

    def run(self, session, argv, *, env=None, cwd=None) -> int:
        self._check_session(session)
        self._generate(session, self.log)
        return 0

    def attach(self, session, pid: int, *, duration: float | None = None) -> int:
        return self.run(session, [])

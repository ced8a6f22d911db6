"""Executable mappings of an execution log as bundle sideband (build-ids:
:mod:`hwtrace.buildid`), and the ptxed / ptoracle image arguments that
decode a stream."""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from hwtrace.buildid import build_id
from hwtrace.bundle import Mmap


def load_segments(path: str) -> list[tuple[int, int, int]]:
    """(file offset, file size, virtual address) of each PT_LOAD segment of
    an ELF64 file ([] if unreadable)."""
    out = []
    try:
        with open(path, "rb") as f:
            ehdr = f.read(64)
            if len(ehdr) < 64 or ehdr[:4] != b"\x7fELF" or ehdr[4] != 2 or ehdr[5] != 1:
                return []
            phoff, = struct.unpack_from("<Q", ehdr, 32)
            phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
            f.seek(phoff)
            phdrs = f.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _flags, off, va, _pa, filesz = struct.unpack_from(
                    "<IIQQQQ", phdrs, i * phentsize)
                if p_type == 1:
                    out.append((off, filesz, va))
    except (OSError, struct.error):
        return []
    return out


def interpreter(path: str) -> str:
    """The dynamic loader an ELF64 program names (PT_INTERP; "" if none)."""
    try:
        with open(path, "rb") as f:
            ehdr = f.read(64)
            if len(ehdr) < 64 or ehdr[:4] != b"\x7fELF" or ehdr[4] != 2 or ehdr[5] != 1:
                return ""
            phoff, = struct.unpack_from("<Q", ehdr, 32)
            phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
            f.seek(phoff)
            phdrs = f.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _flags, off, _va, _pa, filesz = struct.unpack_from(
                    "<IIQQQQ", phdrs, i * phentsize)
                if p_type == 3 and filesz < 4096:
                    f.seek(off)
                    return f.read(filesz).split(b"\0", 1)[0].decode("utf-8", "replace")
    except (OSError, struct.error):
        return ""
    return ""


def load_base(mmaps, path: str) -> int | None:
    """Where ELF virtual address 0 of ``path`` is loaded, from any of its
    mappings (QEMU reports every segment, the stepper only executable ones,
    whose file offset is not 0): the lowest such base, None if unmapped."""
    segs = None
    bases = []
    for m in mmaps:
        if not m.path or os.path.realpath(m.path) != path:
            continue
        if m.offset == 0:
            bases.append(m.addr)
            continue
        if segs is None:
            segs = load_segments(path)
        for off, size, va in segs:
            if off <= m.offset < off + max(size, 1):
                bases.append(m.addr - (va + m.offset - off))
                break
    return min(bases) if bases else None


def _prot(p: int) -> str:
    return ("r" if p & 1 else "-") + ("w" if p & 2 else "-") + ("x" if p & 4 else "-")


VDSO = "[vdso]"


class Life(NamedTuple):
    """A process's image from ``time`` on: its start (epoch 0) or an
    execve (epoch n: the n-th one the source followed; ``traced`` False:
    an execve into the untraced world, the process's trace ends there)."""
    pid: int
    epoch: int
    time: int
    comm: str
    exe: str
    ppid: int
    traced: bool = True


def lives(trace, starts: dict, exec_times: dict, root_exe: str = "") -> list[Life]:
    """The images each process of an execution log ran, in time order:
    ``starts`` (tid -> when it began) and ``exec_times`` (tid -> the time
    of each of its PROC_EXEC records) are the generator's clock.  A fork
    child runs its parent's image as of the fork until it execs;
    ``root_exe`` is the program the first process ran (default: its first
    mapped file)."""
    t0 = trace.t0
    begin: dict[int, int] = {}
    events: dict[int, list] = {}
    for tid, th in trace.threads.items():
        if tid in starts:
            begin[th.pid] = min(begin.get(th.pid, starts[tid]), starts[tid])
        times = exec_times.get(tid, ())
        for i, (rec, void) in enumerate(th.execs):
            if not void:
                t = times[i] if i < len(times) else starts.get(tid, t0)
                events.setdefault(th.pid, []).append((t, rec))
    out: dict[int, list[Life]] = {}

    def of(pid: int, depth: int = 0) -> list[Life]:
        if pid in out:
            return out[pid]
        ppid = trace.processes.get(pid, {}).get("ppid", 0)
        t = begin.get(pid, t0)
        parent = of(ppid, depth + 1) if ppid in trace.processes and depth < 64 else []
        at = [x for x in parent if x.time <= t]
        if at:
            comm, exe = at[-1].comm, at[-1].exe
        else:
            exe = root_exe if not parent else ""
            exe = exe or main_executable(trace, pid)
            comm = os.path.basename(exe)[:15]
        lst = out[pid] = [Life(pid, 0, t, comm, exe, ppid)]
        epoch = 0
        for when, rec in sorted(events.get(pid, ()), key=lambda e: e[0]):
            epoch += 1 if rec.followed else 0
            lst.append(Life(pid, epoch, when, os.path.basename(rec.path)[:15], rec.path, ppid,
                            rec.followed))
        return lst

    for pid in trace.processes:
        of(pid)
    return sorted((x for lst in out.values() for x in lst), key=lambda x: x.time)


def file_mappings(trace, vdso_build_id: str | None = None, lives_=None) -> list[Mmap]:
    """One sideband Mmap per file-backed mapping the execution ran code in,
    with the time its image began (``lives_``, from :func:`lives`; without
    them, the log's start).  A fork child inherits its parent's mappings
    (those of the parent's image at the fork), so they are listed per pid.
    With ``vdso_build_id`` (the vDSO's bytes were saved: the bundle stores
    them as an image whose path is ``[vdso]``) each ``[vdso]`` mapping is
    listed too, with file ``[vdso]`` and that build-id."""
    out: list[Mmap] = []
    seen = set()
    ids: dict[str, str] = {}
    t0 = trace.t0
    epochs = trace.mmap_epochs or [0] * len(trace.mmaps)
    by_key: dict[tuple, list] = {}          # (pid, epoch) -> its mmaps
    for m, e in zip(trace.mmaps, epochs):
        if not m.path.startswith("/") and not (vdso_build_id is not None and m.path == VDSO):
            continue
        by_key.setdefault((m.pid, e), []).append(m)
    life_of: dict[tuple, Life] = {}
    for x in lives_ or ():
        if x.traced:
            life_of[(x.pid, x.epoch)] = x

    def epoch_at(pid: int, t: int) -> int:
        e = 0
        for (p, k), x in life_of.items():
            if p == pid and x.time <= t and k > e:
                e = k
        return e

    for pid in trace.processes:
        for e in sorted({k for (p, k) in by_key if p == pid} | {0}):
            life = life_of.get((pid, e))
            when = life.time if life is not None else t0
            chain = [(pid, e)]
            if e == 0:
                p = pid
                for _ in range(64):
                    q = trace.processes.get(p, {}).get("ppid", 0)
                    if not q or q not in trace.processes:
                        break
                    eq = epoch_at(q, when)
                    chain.append((q, eq))
                    if eq:
                        # the parent had exec'd by the fork: its image is its
                        # own program's, nothing of its ancestors' is mapped
                        break
                    p = q
            for key in chain:
                for m in by_key.get(key, ()):
                    k = (pid, e, m.addr, m.size, m.offset, m.path)
                    if k in seen:
                        continue
                    seen.add(k)
                    if m.path == VDSO:
                        ids[m.path] = vdso_build_id or ""
                    elif m.path not in ids:
                        ids[m.path] = m.build_id.hex() if m.build_id else build_id(m.path)
                    out.append(Mmap(pid=pid, start=m.addr, size=m.size, offset=m.offset,
                                    file=m.path, build_id=ids[m.path], prot=_prot(m.prot),
                                    time=when))
    return out


def main_executable(trace, pid: int) -> str:
    """The program a process started with (its first non-loader file
    mapping, or its parent's)."""
    p = pid
    for _ in range(64):
        for m in trace.mmaps:
            if m.pid == p and m.path.startswith("/") and "/ld-linux" not in m.path:
                return m.path
        p = trace.processes.get(p, {}).get("ppid", 0)
        if not p:
            break
    return ""


def raw_image_args(mmaps, resolve=None) -> list[str]:
    """``--raw FILE:FROM-TO:ADDR`` arguments (ptxed/ptoracle syntax) loading
    each mapping's file bytes at its address.  ``resolve(file, build_id)``
    gives the local path of a recorded file (None: skip it)."""
    args: list[str] = []
    seen = set()
    for m in mmaps:
        path = resolve(m.file, m.build_id) if resolve else m.file
        if path is None:
            continue
        path = os.fspath(path)
        key = (path, m.offset, m.start)
        if key in seen:
            continue
        seen.add(key)
        try:
            fsize = os.path.getsize(path)
        except OSError:
            continue
        end = min(m.offset + m.size, fsize)
        if end <= m.offset:
            continue
        args += ["--raw", f"{path}:{m.offset:#x}-{end:#x}:{m.start:#x}"]
    return args

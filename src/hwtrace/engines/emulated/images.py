"""Executable mappings of an execution log as bundle sideband, build-ids,
and the ptxed / ptoracle image arguments that decode a stream."""

from __future__ import annotations

import os
import struct

from hwtrace.bundle import Mmap

_PT_NOTE = 4
_NT_GNU_BUILD_ID = 3


def build_id(path: str) -> str:
    """The GNU build-id of an ELF file as hex ("" if none or unreadable)."""
    try:
        with open(path, "rb") as f:
            return _build_id(f.read, f.seek)
    except OSError:
        return ""


def build_id_of(data: bytes) -> str:
    """The GNU build-id of an ELF image held in memory (e.g. the vDSO,
    whose file offsets are its offsets from the mapping start)."""
    pos = [0]

    def read(n: int) -> bytes:
        out = data[pos[0]:pos[0] + n]
        pos[0] += len(out)
        return out

    def seek(off: int) -> None:
        pos[0] = off
    return _build_id(read, seek)


def _build_id(read, seek) -> str:
    try:
        ehdr = read(64)
        if len(ehdr) < 64 or ehdr[:4] != b"\x7fELF" or ehdr[4] != 2 or ehdr[5] != 1:
            return ""
        phoff, = struct.unpack_from("<Q", ehdr, 32)
        phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
        seek(phoff)
        phdrs = read(phentsize * phnum)
        for i in range(phnum):
            p_type, _flags, off, _va, _pa, filesz = struct.unpack_from(
                "<IIQQQQ", phdrs, i * phentsize)
            if p_type != _PT_NOTE or filesz > 1 << 16:
                continue
            seek(off)
            notes = read(filesz)
            pos = 0
            while pos + 12 <= len(notes):
                namesz, descsz, ntype = struct.unpack_from("<III", notes, pos)
                pos += 12
                name = notes[pos:pos + namesz]
                pos += (namesz + 3) & ~3
                desc = notes[pos:pos + descsz]
                pos += (descsz + 3) & ~3
                if ntype == _NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU":
                    return desc.hex()
    except (OSError, struct.error):
        return ""
    return ""


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


def file_mappings(trace, vdso_build_id: str | None = None) -> list[Mmap]:
    """One sideband Mmap per file-backed mapping the execution ran code in
    (fork children inherit their parent's, so they are listed per pid).
    With ``vdso_build_id`` (the vDSO's bytes were saved: the bundle stores
    them as an image whose path is ``[vdso]``) each ``[vdso]`` mapping is
    listed too, with file ``[vdso]`` and that build-id."""
    out: list[Mmap] = []
    seen = set()
    ids: dict[str, str] = {}
    t0 = trace.t0
    by_pid: dict[int, list] = {}
    for m in trace.mmaps:
        if not m.path.startswith("/") and not (vdso_build_id is not None and m.path == VDSO):
            continue
        by_pid.setdefault(m.pid, []).append(m)
    pids = list(trace.processes)
    for pid in pids:
        chain = []
        p = pid
        while p and p not in chain:
            chain.append(p)
            p = trace.processes.get(p, {}).get("ppid", 0)
        for q in chain:
            for m in by_pid.get(q, ()):
                key = (pid, m.addr, m.size, m.offset, m.path)
                if key in seen:
                    continue
                seen.add(key)
                if m.path == VDSO:
                    ids[m.path] = vdso_build_id or ""
                elif m.path not in ids:
                    ids[m.path] = m.build_id.hex() if m.build_id else build_id(m.path)
                out.append(Mmap(pid=pid, start=m.addr, size=m.size, offset=m.offset,
                                file=m.path, build_id=ids[m.path], prot=_prot(m.prot), time=t0))
    return out


def main_executable(trace, pid: int) -> str:
    """The program a process runs (its first non-loader file mapping)."""
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

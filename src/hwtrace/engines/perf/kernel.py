"""The running kernel's code mappings, as perf record synthesizes them.

perf writes MMAP records for ``[kernel.kallsyms]_text`` (pid -1, from the
``_text``/``_etext`` symbols) and for each module, with the kernel's
build-id from ``/sys/kernel/notes``; the live engine adds the same to a
bundle when the kernel is traced.  Parsers are pure; :func:`kernel_maps`
reads the files (roots are parameters, for tests).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from hwtrace import bundle as B

NT_GNU_BUILD_ID = 3


def parse_kallsyms(text: str) -> tuple[int, int] | None:
    """(_text, _etext) addresses; None if hidden (kptr_restrict) or absent."""
    start = end = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        if parts[2] == "_text":
            start = int(parts[0], 16)
        elif parts[2] == "_etext":
            end = int(parts[0], 16)
        if start is not None and end is not None:
            break
    if not start or not end or end <= start:       # all zeros when restricted
        return None
    return start, end


def parse_notes(data: bytes) -> str:
    """The GNU build-id in an ELF note section (e.g. /sys/kernel/notes)."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        name_end = pos + 12 + ((namesz + 3) & ~3)
        desc_end = name_end + ((descsz + 3) & ~3)
        if desc_end > len(data):
            break
        name = data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
        if ntype == NT_GNU_BUILD_ID and name == b"GNU":
            return data[name_end:name_end + descsz].hex()
        pos = desc_end
    return ""


def parse_modules(text: str) -> list[tuple[str, int, int]]:
    """(name, address, size) of loaded modules from /proc/modules."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6:
            try:
                addr = int(parts[5], 16)
                size = int(parts[1])
            except ValueError:
                continue
            if addr:
                out.append((parts[0], addr, size))
    return out


def _read(p: Path, binary: bool = False):
    try:
        return p.read_bytes() if binary else p.read_text()
    except OSError:
        return b"" if binary else ""


def kernel_maps(proc: str | os.PathLike = "/proc",
                sysfs: str | os.PathLike = "/sys") -> list[B.Mmap]:
    """Mmap sideband records for the kernel image and its modules."""
    out = []
    span = parse_kallsyms(_read(Path(proc) / "kallsyms"))
    if span is not None:
        start, end = span
        out.append(B.Mmap(pid=-1, start=start, size=end - start, offset=start,
                          file="[kernel.kallsyms]_text",
                          build_id=parse_notes(_read(Path(sysfs) / "kernel/notes", True))))
    for name, addr, size in parse_modules(_read(Path(proc) / "modules")):
        out.append(B.Mmap(pid=-1, start=addr, size=size, offset=0, file=f"[{name}]"))
    return out


def parse_proc_maps(text: str, pid: int) -> list[B.Mmap]:
    """Executable mappings of /proc/PID/maps as Mmap records (what perf
    synthesizes for a process that was running before tracing began)."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        rng, perms, off = parts[0], parts[1], parts[2]
        if len(perms) < 3 or perms[2] != "x":
            continue
        try:
            lo, hi = (int(x, 16) for x in rng.split("-"))
            offset = int(off, 16)
        except ValueError:
            continue
        name = parts[5].strip() if len(parts) > 5 else "//anon"
        if name.endswith(" (deleted)"):
            name = name[:-len(" (deleted)")]
        out.append(B.Mmap(pid=pid, start=lo, size=hi - lo, offset=offset, file=name,
                          prot=perms[:3]))
    return out


def process_sideband(pid: int, proc: str | os.PathLike = "/proc") -> list:
    """Process + executable maps of a running process (for attach)."""
    p = Path(proc) / str(pid)
    comm = _read(p / "comm").strip()
    exe = ""
    try:
        exe = os.readlink(p / "exe")
    except OSError:
        pass
    return [B.Process(pid=pid, cr3=0, comm=comm, exe=exe),
            *parse_proc_maps(_read(p / "maps"), pid)]

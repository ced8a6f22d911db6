"""Fill an :class:`~hwtrace.flow.image.Image` from files, as ptxed does.

* ``--raw FILE[:FROM[-TO]]:ADDR`` — bytes ``[FROM, TO)`` of FILE (default:
  the whole file) at virtual address ADDR;
* ``--elf FILE[:BASE]`` — the file bytes of every PT_LOAD segment, shifted
  so that the lowest segment starts at BASE when BASE is given;
* page dumps — a file of little-endian u64 page addresses and a file of
  4 KiB pages in the same order (what Intel-PT fuzzers save).

Numbers follow C's ``strtoull(s, 0)``: ``0x`` hex, leading ``0`` octal,
else decimal.

Every loader checks its files first, so that a wrong one is an
:class:`ImageError` naming it instead of a decode full of "no memory
mapped" errors: a directory where a file belongs, a file that is not ELF,
an ELF file for another machine than x86.
"""

from __future__ import annotations

import os
import stat

from .image import Image, ImageError, Section

PAGE_SIZE = 4096

#: ELF e_machine values the decoders can decode, and names for the others
#: (for the message)
X86_MACHINES = {3: "i386", 62: "x86-64"}
_MACHINES = {2: "SPARC", 8: "MIPS", 20: "PowerPC", 21: "PowerPC64",
             22: "S/390", 40: "ARM", 43: "SPARC V9", 50: "IA-64",
             183: "AArch64", 243: "RISC-V", 258: "LoongArch"}


def check_file(path: str) -> None:
    """An ImageError unless ``path`` can be read as a file (not a
    directory)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ImageError(f"cannot open {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ImageError(f"{path}: is a directory, not a file")


def parse_c_number(text: str) -> int | None:
    """C ``strtoull(text, &end, 0)`` accepting only a complete number."""
    s = text.strip() if text is not None else ""
    if not s or s != text:
        return None
    try:
        if s[:2].lower() == "0x":
            return int(s[2:], 16) if s[2:] else None
        if len(s) > 1 and s[0] == "0":
            return int(s[1:], 8)
        if not s.isdigit():
            return None
        return int(s, 10)
    except ValueError:
        return None


def split_base(arg: str) -> tuple[str, int | None]:
    """``NAME:NUM`` -> (NAME, NUM) if the part after the last ':' is a
    number; else (arg, None)."""
    head, sep, tail = arg.rpartition(":")
    if sep and tail:
        n = parse_c_number(tail)
        if n is not None:
            return head, n
    return arg, None


def split_range(arg: str) -> tuple[str, int, int | None]:
    """``FILE[:FROM[-TO]]`` -> (FILE, FROM, SIZE or None).

    As ptxed: if the part after the last ':' does not parse as an offset
    or range it is part of the file name."""
    head, sep, tail = arg.rpartition(":")
    if not sep:
        return arg, 0, None
    lo, dash, hi = tail.partition("-")
    begin = parse_c_number(lo)
    if begin is None:
        return arg, 0, None
    if not dash:
        return head, begin, None
    end = parse_c_number(hi)
    if end is None:
        return arg, 0, None
    if end <= begin:
        raise ImageError(f"bad range in {arg}")
    return head, begin, end - begin


def load_raw(image: Image, arg: str) -> int:
    """ptxed's ``--raw FILE[:FROM[-TO]]:ADDR``; returns the isid."""
    rest, vaddr = split_base(arg)
    if vaddr is None:
        raise ImageError(f"failed to parse base address from '{arg}'")
    path, offset, size = split_range(rest)
    check_file(path)
    return image.add(Section.from_file(path, offset, size), vaddr)


def _le(data: bytes, off: int, size: int, path: str) -> int:
    """The little-endian unsigned integer of ``size`` bytes at ``off``
    (what struct.unpack_from reads, without importing struct: an
    extension module to load, ~0.5 ms of every bundle command's start-up);
    past the end of ``data``: an ImageError."""
    if off + size > len(data):
        raise ImageError(f"truncated ELF headers: {path}")
    return int.from_bytes(data[off:off + size], "little")


def elf_segments(path: str) -> list[tuple[int, int, int]]:
    """(file offset, file size, vaddr) of each PT_LOAD segment, in order,
    including zero-sized ones (they count for the lowest address).  Only
    x86 ELF files (i386, x86-64): anything else is an ImageError."""
    check_file(path)
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                raise ImageError(f"not an ELF file: {path}")
            if head[5] != 1:
                raise ImageError(f"only little-endian ELF is supported: {path}")
            machine = _le(head, 18, 2, path)
            if machine not in X86_MACHINES:
                name = _MACHINES.get(machine, f"e_machine {machine}")
                raise ImageError(f"{path}: an ELF file for {name}, not x86: "
                                 f"Intel PT traces x86 code only")
            cls = head[4]
            if cls == 2:
                if len(head) < 64:
                    raise ImageError(f"truncated ELF header: {path}")
                phoff = _le(head, 32, 8, path)
                phentsize = _le(head, 54, 2, path)
                phnum = _le(head, 56, 2, path)
            elif cls == 1:
                phoff = _le(head, 28, 4, path)
                phentsize = _le(head, 42, 2, path)
                phnum = _le(head, 44, 2, path)
            else:
                raise ImageError(f"bad ELF class: {path}")
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError as e:
        raise ImageError(f"cannot open {path}: {e.strerror}") from None
    if len(table) < phentsize * phnum:
        raise ImageError(f"truncated program header table: {path}")
    segs = []
    for k in range(phnum):
        ph = k * phentsize
        ptype = _le(table, ph, 4, path)
        if ptype != 1:
            continue
        if cls == 2:
            off = _le(table, ph + 8, 8, path)
            vaddr = _le(table, ph + 16, 8, path)
            filesz = _le(table, ph + 32, 8, path)
        else:
            off = _le(table, ph + 4, 4, path)
            vaddr = _le(table, ph + 8, 4, path)
            filesz = _le(table, ph + 16, 4, path)
        segs.append((off, filesz, vaddr))
    return segs


def split_elf_arg(arg: str) -> tuple[str, int | None]:
    """``FILE[:BASE]`` -> (FILE, BASE or None); a FILE whose name ends in
    ``:NUMBER`` is taken whole when it exists and the shorter name doesn't."""
    path, base = split_base(arg)
    if base is not None and not os.path.exists(path) and os.path.exists(arg):
        return arg, None
    return path, base


def load_elf(image: Image, arg: str) -> list[int]:
    """ptxed's ``--elf FILE[:BASE]``; returns the isids added."""
    path, base = split_elf_arg(arg)
    segs = elf_segments(path)
    bias = 0
    if base is not None and segs:
        bias = base - min(v for _, _, v in segs)
    out = []
    for off, filesz, vaddr in segs:
        if filesz:
            out.append(image.add(Section.from_file(path, off, filesz),
                                 (vaddr + bias) & 0xFFFFFFFFFFFFFFFF))
    return out


def load_pagedump(image: Image, addr_file: str, page_file: str) -> int:
    """Map page ``i`` of ``page_file`` at the ``i``-th little-endian u64 of
    ``addr_file``.  Returns the number of pages mapped."""
    check_file(addr_file)
    check_file(page_file)
    try:
        with open(addr_file, "rb") as f:
            addrs = f.read()
        psize = os.path.getsize(page_file)
    except OSError as e:
        raise ImageError(f"cannot open {e.filename}: {e.strerror}") from None
    n = len(addrs) // 8
    if len(addrs) % 8:
        raise ImageError(f"{addr_file}: size is not a multiple of 8")
    if psize < n * PAGE_SIZE:
        raise ImageError(f"{page_file}: {psize} bytes for {n} pages")
    import struct
    for i, (addr,) in enumerate(struct.iter_unpack("<Q", addrs)):
        image.add(Section.from_file(page_file, i * PAGE_SIZE, PAGE_SIZE), addr)
    return n

"""The GNU build-id of an ELF file: the one reader of it in the package.

The build-id is the descriptor of the ``NT_GNU_BUILD_ID`` note (name
"GNU").  The linker puts it in a ``PT_NOTE`` segment, which is where it is
looked for first (that works for a memory image such as the vDSO, and for
a file with no section headers); then in the ``SHT_NOTE`` sections (a
separate debug file, an object file).  Both ELF classes, both byte orders.
It never raises: "" for no build-id, not ELF, unreadable or damaged.

No I/O but the reads of the file it is given; no third-party imports (the
recorders, the bundle checks and the importers all use it).
"""

from __future__ import annotations

import struct

_PT_NOTE = 4
_SHT_NOTE = 7
_NT_GNU_BUILD_ID = 3
_MAX_NOTES = 1 << 16        # bytes of one note segment/section read at most


def build_id(path) -> str:
    """The build-id of the ELF file at ``path`` as hex ("" if none)."""
    try:
        with open(path, "rb") as f:
            def read(off: int, n: int) -> bytes:
                f.seek(off)
                return f.read(n)
            return _build_id(read)
    except OSError:
        return ""


def build_id_of(data: bytes) -> str:
    """The build-id of an ELF image held in memory (file offsets are its
    offsets: the vDSO from its mapping start) as hex ("" if none)."""
    return _build_id(lambda off, n: bytes(data[off:off + n]))


def _build_id(read) -> str:
    try:
        return _find(read)
    except (struct.error, ValueError, OSError):
        return ""


def _find(read) -> str:
    eh = read(0, 64)
    if len(eh) < 52 or eh[:4] != b"\x7fELF" or eh[4] not in (1, 2) or eh[5] not in (1, 2):
        return ""
    e = "<" if eh[5] == 1 else ">"
    if eh[4] == 2:
        phoff, shoff = struct.unpack_from(e + "QQ", eh, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", eh, 54)
        ph = e + "I4xQ16xQ"         # (p_type, p_offset, p_filesz)
        sh = e + "4xI16xQQ"         # (sh_type, sh_offset, sh_size)
    else:
        phoff, shoff = struct.unpack_from(e + "II", eh, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", eh, 42)
        ph = e + "II8xI"
        sh = e + "4xI8xII"
    for table, off, entsize, num, want in ((ph, phoff, phentsize, phnum, _PT_NOTE),
                                           (sh, shoff, shentsize, shnum, _SHT_NOTE)):
        if not off or not num or entsize < struct.calcsize(table):
            continue
        rows = read(off, entsize * num)
        for i in range(min(num, len(rows) // entsize)):
            typ, at, size = struct.unpack_from(table, rows, i * entsize)
            if typ != want or size > _MAX_NOTES:
                continue
            bid = _in_notes(read(at, size), e)
            if bid:
                return bid
    return ""


def _in_notes(notes: bytes, e: str) -> str:
    """The GNU build-id among notes (4-byte aligned name and descriptor)."""
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, ntype = struct.unpack_from(e + "III", notes, pos)
        pos += 12
        name = notes[pos:pos + namesz]
        pos += (namesz + 3) & ~3
        desc = notes[pos:pos + descsz]
        pos += (descsz + 3) & ~3
        if ntype == _NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU" and \
                0 < len(desc) == descsz:        # a cut note names nothing
            return desc.hex()
    return ""

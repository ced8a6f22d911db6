"""drcov basic-block coverage files (what Lighthouse, Cutter, Ghidra's
Dragon Dance and bncov load).

Layout (format version 2, module table version 2; described from
DynamoRIO's drcov tool output and documented in "DrCov File Format",
ayrx.me, and DynamoRIO's drcovlib ``modules.c``)::

    DRCOV VERSION: 2
    DRCOV FLAVOR: drcov
    Module Table: version 2, count N
    Columns: id, base, end, entry, checksum, timestamp, path
     0, 0x0000555555554000, 0x0000555555558000, 0x0000000000000000, 0x00000000, 0x00000000, /path/to/exe
    BB Table: M bbs
    <M binary records, little-endian: uint32 start (offset from the
     module base), uint16 size, uint16 module id>

Blocks outside every module are not written (counted in the result).
drcov has no hit counts: each distinct block is listed once.
"""

from __future__ import annotations

import struct
from typing import Iterable

_BB = struct.Struct("<IHH")


def write_drcov(fp, blocks: Iterable[tuple[int, int]],
                modules: list[tuple[str, int, int]]) -> tuple[int, int]:
    """Write blocks ((start, size) runtime addresses) against modules
    ((path, base, end)).  ``fp`` is binary.  Returns (written, skipped)."""
    return write_drcov_parts(fp, [(blocks, modules)])


def write_drcov_parts(fp, parts) -> tuple[int, int]:
    """:func:`write_drcov` of the blocks of several address spaces, each
    against its own modules (``parts``: (blocks, modules) per space):
    processes running different programs at the same addresses.  The
    module table lists each (path, base, end) once."""
    modules: list[tuple[str, int, int]] = []
    ids: dict[tuple, int] = {}
    out: list[bytes] = []
    skipped = 0
    for blocks, mods in parts:
        own = []
        for m in mods:
            m = tuple(m)
            if m not in ids:
                ids[m] = len(modules)
                modules.append(m)
            own.append((ids[m], m))
        skipped += _records(out, blocks, sorted(own, key=lambda m: m[1][1]))
    head = ["DRCOV VERSION: 2", "DRCOV FLAVOR: drcov",
            f"Module Table: version 2, count {len(modules)}",
            "Columns: id, base, end, entry, checksum, timestamp, path"]
    for mid, (path, base, end) in enumerate(modules):
        head.append(f"{mid:2d}, 0x{base:016x}, 0x{end:016x}, 0x{0:016x}, "
                    f"0x{0:08x}, 0x{0:08x}, {path}")
    head.append(f"BB Table: {len(out)} bbs")
    fp.write(("\n".join(head) + "\n").encode())
    fp.write(b"".join(out))
    return len(out), skipped


def _records(out: list, blocks, mods) -> int:
    """The BB records of ``blocks`` against ``mods`` ((id, (path, base,
    end)) by base) appended to ``out``; returns how many fell outside."""
    skipped = 0
    for start, size in sorted(set(blocks)):
        for mid, (_path, base, end) in mods:
            if base <= start < end:
                off = start - base
                while size > 0xFFFF:
                    out.append(_BB.pack(off, 0xFFFF, mid))
                    off += 0xFFFF
                    size -= 0xFFFF
                out.append(_BB.pack(off, size, mid))
                break
        else:
            skipped += 1
    return skipped


def read_drcov(data: bytes):
    """Parse a drcov file: (modules [(id, base, end, path)], blocks
    [(module id, offset, size)]).  Accepts module tables of version 2-4
    (columns named in the ``Columns:`` line)."""
    pos = 0

    def line():
        nonlocal pos
        e = data.index(b"\n", pos)
        s = data[pos:e].decode()
        pos = e + 1
        return s

    if not line().startswith("DRCOV VERSION: 2"):
        raise ValueError("not a drcov version 2 file")
    ln = line()
    if ln.startswith("DRCOV FLAVOR"):
        ln = line()
    count = int(ln.rsplit("count", 1)[1])
    cols = [c.strip() for c in line().split(":", 1)[1].split(",")]
    modules = []
    for _ in range(count):
        parts = [p.strip() for p in line().split(",", len(cols) - 1)]
        row = dict(zip(cols, parts))
        modules.append((int(row["id"]), int(row["base"], 16),
                        int(row["end"], 16), row["path"]))
    n = int(line().split(":")[1].split()[0])
    blocks = [(mid, off, size) for off, size, mid in
              _BB.iter_unpack(data[pos:pos + n * _BB.size])]
    if len(blocks) != n:
        raise ValueError("truncated BB table")
    return modules, blocks

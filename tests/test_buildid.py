"""hwtrace.buildid: the package's one reader of GNU build-ids."""

from __future__ import annotations

import os
import struct
import sys

from hwtrace.buildid import build_id, build_id_of

DESC = bytes(range(1, 21))


def _note(e: str) -> bytes:
    return struct.pack(e + "III", 4, len(DESC), 3) + b"GNU\0" + DESC


def _elf32(e: str, in_segment: bool) -> bytes:
    """An ELF32 image (byte order ``e``) whose only note is the build-id,
    found through a PT_NOTE program header or through an SHT_NOTE section."""
    note = _note(e)
    ident = b"\x7fELF" + bytes([1, 1 if e == "<" else 2, 1]) + bytes(9)
    ph_at, note_at = 52, 52 + 32
    sh_at = note_at + len(note)
    hdr = ident + struct.pack(e + "HHIIIIIHHHHHH", 3, 3, 1, 0,
                              ph_at if in_segment else 0, 0 if in_segment else sh_at,
                              0, 52, 32, 1 if in_segment else 0, 40,
                              0 if in_segment else 2, 0)
    ph = struct.pack(e + "IIIIIIII", 4, note_at, 0, 0, len(note), len(note), 4, 4)
    sh = bytes(40) + struct.pack(e + "IIIIIIIIII", 0, 7, 2, 0, note_at, len(note), 0, 0, 4, 0)
    return hdr + ph + note + (b"" if in_segment else sh)


def test_both_classes_byte_orders_and_places():
    for e in "<>":
        for seg in (True, False):
            assert build_id_of(_elf32(e, seg)) == DESC.hex(), (e, seg)


def test_a_file_as_pyelftools_reads_it(tmp_path):
    from elftools.elf.elffile import ELFFile
    exe = os.path.realpath(sys.executable)
    with open(exe, "rb") as f:
        want = next(str(n["n_desc"]) for s in ELFFile(f).iter_sections()
                    if s.header.sh_type == "SHT_NOTE" for n in s.iter_notes()
                    if n["n_type"] == "NT_GNU_BUILD_ID")
    assert build_id(exe) == want
    with open(exe, "rb") as f:
        assert build_id_of(f.read()) == want


def test_never_raises(tmp_path):
    assert build_id(tmp_path / "missing") == ""
    assert build_id(tmp_path) == ""                 # a directory
    good = _elf32("<", True)
    for junk in (b"", b"\x7fELF", good[:60], good[:-5], good[:52] + b"\xff" * 40,
                 b"\x7fELF\x02\x01" + b"\xff" * 100):
        assert build_id_of(junk) in ("", DESC.hex())

"""Differential test against libipt itself (through the ptoracle witness).

libipt's instruction decoder walks straight-line code without needing trace
packets, so a synthetic trace (PSB, PSBEND, MODE.Exec, TIP.PGE at the image
start, enough not-taken TNT bits) makes it report (ip, size, iclass) for
every instruction of an image. The image is real code (libc's .text, also
reinterpreted as 32- and 16-bit code) or seeded random bytes, from which the instructions that need
a TIP (indirect and far branches, returns, ptwrite) are dropped and whose
direct branches get displacement 0, so that control always falls through.

Debian's libipt is 2.0.5; this package follows current libipt. Opcodes
whose decoding changed between the two (all undefined or removed opcodes)
and our deliberate differences (3DNow!, XOP) are left out of the image:
see _version_dependent.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from hwtrace.x86 import IClass, Kind, Mode, X86Error, decoder_for
from hwtrace.x86.tables import MODRM1

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
BASE = 0x100000
_DIRECT = {Kind.CALL_REL, Kind.JMP_REL, Kind.JCC, Kind.JRCXZ, Kind.LOOP,
           Kind.LOOPE, Kind.LOOPNE}
_LEGACY = bytes([0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x3E, 0x26, 0x36, 0x64,
                 0x65, 0xF0])
# 0F xx whose length libipt 2.0.5 decodes differently from current libipt:
# 0F 0F (3DNow!, ours differs from both), 0F 7A/7B, 0F A6/A7, 0F B9, 0F FF.
_MAP1_CHANGED = {0x0F, 0x7A, 0x7B, 0xA6, 0xA7, 0xB9, 0xFF}
# VEX map 1: 2.0.5 applied the legacy map's displacement/immediate rules.
_VEX1_CHANGED = _MAP1_CHANGED | set(range(0x80, 0x90)) | {0x78, 0xA4, 0xAC, 0xBA}


def _version_dependent(raw: bytes, mode: Mode) -> bool:
    strip = _LEGACY + (bytes(range(0x40, 0x50)) if mode == Mode.BIT64 else b"")
    body = raw.lstrip(strip)
    if not body:
        return False
    op, nx = body[0], body[1] if len(body) > 1 else 0
    if mode == Mode.BIT64 and op in (0xD5, 0x9A, 0xEA, 0xCE):
        return True          # REX2 (APX) and 64-bit-invalid far branches
    if op == 0x8F and nx & 0x18:
        return True          # XOP: libipt decodes pop r/m
    if op == 0x0F and nx in _MAP1_CHANGED:
        return True
    if op in (0xC4, 0xC5, 0x62) and (mode == Mode.BIT64 or nx >= 0xC0):
        if op == 0xC5:
            vmap, vop = 1, body[2]
        elif op == 0xC4:
            vmap, vop = nx & 0x1F, body[3]
        else:
            vmap, vop = nx & 7, body[4]
        if vmap not in (1, 2, 3):
            return True
        if vmap == 1 and vop in _VEX1_CHANGED:
            return True
        # EVEX map 1: 2.0.5 used the legacy map's "no ModRM" entries
        return op == 0x62 and vmap == 1 and MODRM1[vop] != 1
    return False


def straight_line_image(code: bytes, mode: Mode):
    """(image, expected [(offset, size, iclass)], number of cond branches)."""
    dec = decoder_for(mode)
    img = bytearray()
    expected = []
    conds = 0
    off = 0
    while off < len(code):
        try:
            insn = dec(code, off)
        except X86Error:
            off += 1
            continue
        raw = bytearray(code[off:off + insn.size])
        off += insn.size
        if insn.iclass != IClass.OTHER and insn.kind not in _DIRECT:
            continue
        if _version_dependent(bytes(raw), mode):
            continue
        if insn.kind in _DIRECT:
            for w in (4, 2, 1):     # the displacement ends the instruction
                if w < insn.size and int.from_bytes(
                        raw[-w:], "little", signed=True) == insn.rel:
                    raw[-w:] = bytes(w)
                    break
            conds += insn.is_cond
        expected.append((len(img), insn.size, insn.iclass.oracle_name))
        img += raw
    return bytes(img), expected, conds


def synthetic_trace(mode: Mode, conds: int) -> bytes:
    mode_exec = {Mode.BIT64: 1, Mode.BIT32: 2, Mode.BIT16: 0}[mode]
    return (b"\x02\x82" * 8 + b"\x02\x23"             # PSB, PSBEND
            + bytes([0x99, mode_exec])                 # MODE.Exec
            + b"\xd1" + struct.pack("<Q", BASE)        # TIP.PGE, full IP
            + b"\x80" * (conds // 6 + 2))              # TNT: 6 x not taken


def _libc_text() -> bytes:
    if not LIBC.exists():
        pytest.skip("libc not present")
    from elftools.elf.elffile import ELFFile
    with LIBC.open("rb") as f:
        return ELFFile(f).get_section_by_name(".text").data()[:400_000]


def _random_code() -> bytes:
    from test_x86_objdump import _random_stream
    return _random_stream(seed=11, chunks=12_000)


@pytest.mark.parametrize("source", ["libc", "random"])
@pytest.mark.parametrize("mode", [Mode.BIT64, Mode.BIT32, Mode.BIT16],
                         ids=lambda m: m.oracle_name)
def test_straight_line_code_matches_libipt(mode, source, ptoracle, tmp_path):
    """libc: real code (and its reinterpretation in 32/16-bit mode);
    random: seeded random bytes dense in prefixes, escapes and the opcodes
    whose length depends on prefixes or ModRM."""
    code = _libc_text() if source == "libc" else _random_code()
    img, expected, conds = straight_line_image(code, mode)
    (tmp_path / "img.bin").write_bytes(img)
    (tmp_path / "t.pt").write_bytes(synthetic_trace(mode, conds))
    r = subprocess.run([str(ptoracle), "insn", str(tmp_path / "t.pt"),
                        "--raw", f"{tmp_path / 'img.bin'}:{BASE:#x}"],
                       capture_output=True, text=True, check=True)
    got = []
    errors = []
    for line in r.stdout.splitlines():
        rec = json.loads(line)
        if "error" in rec:
            errors.append(rec)
        elif "iclass" in rec:
            got.append((rec["ip"] - BASE, rec["size"], rec["iclass"]))
    first_diff = next((i for i, (a, b) in enumerate(zip(expected, got))
                       if a != b), None)
    if first_diff is not None:
        o = expected[first_diff][0]
        pytest.fail(f"first difference at image offset {o:#x} "
                    f"({img[o:o + 15].hex()}): ours {expected[first_diff]}, "
                    f"libipt {got[first_diff]}")
    assert len(got) == len(expected) > 30_000
    # the walk ends by running off the image, nowhere else
    assert [e["error"] for e in errors] == ["no memory mapped at this address"]
    assert errors[0]["ip"] == BASE + len(img)


# Kinds that libipt 2.0.5 predates (it classifies them as other).
_NEWER_THAN_205 = {Kind.ERETU, Kind.ERETS, Kind.UIRET, Kind.JMPABS}


def _classify_with_libipt(ptoracle, tmp_path, code: bytes, mode: Mode,
                          insn) -> tuple[int, str]:
    """libipt's (size, iclass) of the instruction at the image start.

    The trace gives whatever the instruction needs to proceed: a TNT bit
    for a conditional branch, a TIP to the next instruction for one whose
    target the trace carries, nothing otherwise.
    """
    img = code + b"\xf4" * 16
    (tmp_path / "img.bin").write_bytes(img)
    trace = synthetic_trace(mode, 0)[:-2]
    if insn.is_indirect:
        trace += b"\xcd" + struct.pack("<Q", BASE + len(code))   # TIP, full IP
    trace += b"\x80" * 2          # TNT bits (and no end of trace too early)
    (tmp_path / "t.pt").write_bytes(trace)
    r = subprocess.run([str(ptoracle), "insn", str(tmp_path / "t.pt"),
                        "--raw", f"{tmp_path / 'img.bin'}:{BASE:#x}",
                        "--max-insns", "1"],
                       capture_output=True, text=True, check=True)
    for line in r.stdout.splitlines():
        rec = json.loads(line)
        if "iclass" in rec and rec.get("ip") == BASE:
            return rec["size"], rec["iclass"]
    raise AssertionError(f"libipt reported no instruction: {r.stdout}")


def test_control_flow_table_matches_libipt(ptoracle, tmp_path):
    """Every known control-flow encoding of test_x86 gets libipt's class."""
    from test_x86 import CONTROL_FLOW
    bad = []
    checked = 0
    for hexs, mode, size, iclass, kind, rel in CONTROL_FLOW:
        code = bytes.fromhex(hexs)
        if kind in _NEWER_THAN_205 or _version_dependent(code, mode) or (
                mode == Mode.BIT64 and code[0] == 0xD5):
            continue
        insn = decoder_for(mode)(code)
        got = _classify_with_libipt(ptoracle, tmp_path, code, mode, insn)
        checked += 1
        if got != (insn.size, insn.iclass.oracle_name):
            bad.append((hexs, mode.oracle_name, got,
                        (insn.size, insn.iclass.oracle_name)))
    assert not bad, bad
    assert checked > 80

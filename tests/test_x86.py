"""Known encodings: lengths, classes, kinds, displacements, errors.

Expectations are from the Intel SDM (Vol. 2 opcode maps), AMD's APM for
XOP/3DNow!, and libipt's instruction length decoder where the architecture
leaves a choice (see hwtrace.x86's docstring).
"""

from __future__ import annotations

import pickle

import pytest

from hwtrace.x86 import IClass, Insn, Kind, Mode, X86Error, decode, decoder_for

B16, B32, B64 = Mode.BIT16, Mode.BIT32, Mode.BIT64
C = IClass
K = Kind

# (hex bytes, mode, size, iclass, kind, rel)
CONTROL_FLOW = [
    # near relative
    ("e8 00 00 00 00", B64, 5, C.CALL, K.CALL_REL, 0),
    ("e8 fb ff ff ff", B64, 5, C.CALL, K.CALL_REL, -5),
    ("66 e8 10 00 00 00", B64, 6, C.CALL, K.CALL_REL, 16),   # 66 ignored
    ("e8 34 12", B16, 3, C.CALL, K.CALL_REL, 0x1234),
    ("66 e8 78 56 34 12", B16, 6, C.CALL, K.CALL_REL, 0x12345678),
    ("66 e8 34 12", B32, 4, C.CALL, K.CALL_REL, 0x1234),
    ("e9 00 01 00 00", B64, 5, C.JUMP, K.JMP_REL, 256),
    ("eb fe", B64, 2, C.JUMP, K.JMP_REL, -2),
    ("eb 7f", B32, 2, C.JUMP, K.JMP_REL, 127),
    ("74 80", B64, 2, C.COND_JUMP, K.JCC, -128),
    ("7f 05", B16, 2, C.COND_JUMP, K.JCC, 5),
    ("0f 84 fa ff ff ff", B64, 6, C.COND_JUMP, K.JCC, -6),
    ("66 0f 85 00 10 00 00", B64, 7, C.COND_JUMP, K.JCC, 0x1000),
    ("0f 8c 00 80", B16, 4, C.COND_JUMP, K.JCC, -0x8000),
    ("3e 74 02", B64, 3, C.COND_JUMP, K.JCC, 2),             # branch hint
    ("e3 10", B64, 2, C.COND_JUMP, K.JRCXZ, 16),
    ("67 e3 10", B64, 3, C.COND_JUMP, K.JRCXZ, 16),          # jecxz
    ("e2 f0", B32, 2, C.COND_JUMP, K.LOOP, -16),
    ("e1 00", B64, 2, C.COND_JUMP, K.LOOPE, 0),
    ("e0 01", B16, 2, C.COND_JUMP, K.LOOPNE, 1),
    # near indirect
    ("ff d0", B64, 2, C.CALL, K.CALL_IND, 0),
    ("41 ff d3", B64, 3, C.CALL, K.CALL_IND, 0),
    ("ff 15 00 00 00 00", B64, 6, C.CALL, K.CALL_IND, 0),
    ("ff 14 c5 00 00 00 00", B64, 7, C.CALL, K.CALL_IND, 0),
    ("ff 16 34 12", B16, 4, C.CALL, K.CALL_IND, 0),
    ("ff e0", B64, 2, C.JUMP, K.JMP_IND, 0),
    ("3e ff e0", B64, 3, C.JUMP, K.JMP_IND, 0),               # notrack
    ("ff 24 25 00 10 00 00", B64, 7, C.JUMP, K.JMP_IND, 0),
    ("f2 ff e1", B64, 3, C.JUMP, K.JMP_IND, 0),               # bnd jmp
    ("c3", B64, 1, C.RETURN, K.RET, 0),
    ("f3 c3", B64, 2, C.RETURN, K.RET, 0),                    # rep ret
    ("c2 08 00", B64, 3, C.RETURN, K.RET_IMM, 0),
    ("66 c2 04 00", B32, 4, C.RETURN, K.RET_IMM, 0),
    # far transfers
    ("9a 00 10 00 00 08 00", B32, 7, C.FAR_CALL, K.CALL_FAR, 0),
    ("9a 00 10 08 00", B16, 5, C.FAR_CALL, K.CALL_FAR, 0),
    ("66 9a 00 10 00 00 08 00", B16, 8, C.FAR_CALL, K.CALL_FAR, 0),
    ("ff 18", B64, 2, C.FAR_CALL, K.CALL_FAR_IND, 0),
    ("ea 00 10 00 00 08 00", B32, 7, C.FAR_JUMP, K.JMP_FAR, 0),
    ("ea 00 10 08 00", B16, 5, C.FAR_JUMP, K.JMP_FAR, 0),
    ("ff 28", B64, 2, C.FAR_JUMP, K.JMP_FAR_IND, 0),
    ("48 ff 2c 24", B64, 4, C.FAR_JUMP, K.JMP_FAR_IND, 0),
    ("cb", B64, 1, C.FAR_RETURN, K.RETF, 0),
    ("48 cb", B64, 2, C.FAR_RETURN, K.RETF, 0),
    ("ca 10 00", B32, 3, C.FAR_RETURN, K.RETF_IMM, 0),
    ("cf", B64, 1, C.FAR_RETURN, K.IRET, 0),
    ("48 cf", B64, 2, C.FAR_RETURN, K.IRET, 0),
    ("66 cf", B16, 2, C.FAR_RETURN, K.IRET, 0),
    ("0f 05", B64, 2, C.FAR_CALL, K.SYSCALL, 0),
    ("0f 07", B64, 2, C.FAR_RETURN, K.SYSRET, 0),
    ("48 0f 07", B64, 3, C.FAR_RETURN, K.SYSRET, 0),
    ("0f 34", B32, 2, C.FAR_CALL, K.SYSENTER, 0),
    ("0f 35", B32, 2, C.FAR_RETURN, K.SYSEXIT, 0),
    ("48 0f 35", B64, 3, C.FAR_RETURN, K.SYSEXIT, 0),
    ("cd 80", B32, 2, C.FAR_CALL, K.INT, 0),
    ("cd 21", B16, 2, C.FAR_CALL, K.INT, 0),
    ("cc", B64, 1, C.FAR_CALL, K.INT3, 0),
    ("ce", B32, 1, C.FAR_CALL, K.INTO, 0),
    ("f1", B64, 1, C.FAR_CALL, K.INT1, 0),
    ("0f 01 c1", B64, 3, C.FAR_CALL, K.VMCALL, 0),
    ("0f 01 c2", B64, 3, C.FAR_RETURN, K.VMLAUNCH, 0),
    ("0f 01 c3", B64, 3, C.FAR_RETURN, K.VMRESUME, 0),
    ("f3 0f 01 ca", B64, 4, C.FAR_RETURN, K.ERETU, 0),
    ("f2 0f 01 ca", B64, 4, C.FAR_RETURN, K.ERETS, 0),
    ("f3 0f 01 ec", B64, 4, C.FAR_RETURN, K.UIRET, 0),
    # APX JMPABS: REX2 (D5, M0=0, W=0) A1 imm64 -> absolute target
    ("d5 00 a1 10 10 00 00 00 00 00 00", B64, 11, C.JUMP, K.JMPABS, 0x1010),
    # not branches but interesting
    ("f3 0f ae e0", B64, 4, C.PTWRITE, K.PTWRITE, 0),
    ("f3 48 0f ae e0", B64, 5, C.PTWRITE, K.PTWRITE, 0),
    ("f3 0f ae 20", B64, 4, C.PTWRITE, K.PTWRITE, 0),
    ("0f 22 d8", B64, 3, C.OTHER, K.MOV_CR3, 0),
    ("0f 22 18", B64, 3, C.OTHER, K.MOV_CR3, 0),   # mod ignored: no disp
    ("44 0f 22 d8", B64, 4, C.OTHER, K.OTHER, 0),  # cr11, not cr3
    ("0f c7 30", B64, 3, C.OTHER, K.VMPTRLD, 0),
    ("66 0f c7 30", B64, 4, C.OTHER, K.VMCLEAR, 0),
    ("f3 0f c7 30", B64, 4, C.OTHER, K.VMXON, 0),
    ("0f c7 f0", B64, 3, C.OTHER, K.OTHER, 0),     # rdrand eax
    ("0f 01 c4", B64, 3, C.OTHER, K.VMXOFF, 0),
    ("0f 01 d4", B64, 3, C.OTHER, K.VMFUNC, 0),
    ("0f 01 d5", B64, 3, C.OTHER, K.XEND, 0),
    ("0f 01 ca", B64, 3, C.OTHER, K.OTHER, 0),     # clac
    ("0f 0b", B64, 2, C.OTHER, K.UD, 0),
    ("0f b9 00", B64, 3, C.OTHER, K.UD, 0),
    ("0f ff c0", B64, 3, C.OTHER, K.UD, 0),
    ("f4", B64, 1, C.OTHER, K.HLT, 0),
    ("0f aa", B32, 2, C.OTHER, K.RSM, 0),
    ("c7 f8 00 01 00 00", B64, 6, C.OTHER, K.XBEGIN, 0x100),
    ("66 c7 f8 00 01", B64, 5, C.OTHER, K.XBEGIN, 0x100),
    ("c6 f8 ff", B64, 3, C.OTHER, K.XABORT, 0),
    # invalid in 64-bit mode: decoded, but not branches
    ("9a 00 10 00 00 08 00", B64, 7, C.OTHER, K.OTHER, 0),
    ("ea 00 10 00 00 08 00", B64, 7, C.OTHER, K.OTHER, 0),
    ("ce", B64, 1, C.OTHER, K.OTHER, 0),
    # VEX/EVEX/REX2 encodings are never branches
    ("d5 10 e8 00 00 00 00", B64, 7, C.OTHER, K.OTHER, 0),
    ("d5 00 74 05", B64, 4, C.OTHER, K.OTHER, 0),
    ("d5 10 ff d0", B64, 4, C.CALL, K.CALL_IND, 0),  # call r16 (REX2.B4)
]


@pytest.mark.parametrize("hexs,mode,size,iclass,kind,rel", CONTROL_FLOW,
                         ids=[f"{h.replace(' ', '')}-{m.oracle_name}"
                              for h, m, *_ in CONTROL_FLOW])
def test_control_flow_encodings(hexs, mode, size, iclass, kind, rel):
    code = bytes.fromhex(hexs)
    insn = decode(code + b"\x90" * 4, mode)     # trailing bytes ignored
    assert (insn.size, insn.iclass, insn.kind, insn.rel) == (size, iclass, kind, rel)
    assert insn.is_branch == (iclass not in (C.OTHER, C.PTWRITE))
    assert insn.is_cond == (iclass == C.COND_JUMP)
    assert insn.is_far == (iclass in (C.FAR_CALL, C.FAR_RETURN, C.FAR_JUMP))
    direct = kind in (K.CALL_REL, K.JMP_REL, K.JCC, K.JRCXZ, K.LOOP,
                      K.LOOPE, K.LOOPNE)
    assert insn.is_indirect == (insn.is_branch and not direct)
    # exactly the bytes: decodes; one byte less: truncated
    assert decode(code, mode) == insn
    with pytest.raises(X86Error) as e:
        decode(code[:-1], mode)
    assert e.value.reason == "truncated"


# (hex bytes, mode, size): lengths that depend on prefixes, modes, ModRM
LENGTHS = [
    # ModRM / SIB / displacement, 32/64-bit addressing
    ("89 c0", B64, 2), ("89 00", B64, 2), ("89 05 00 00 00 00", B64, 6),
    ("89 04 24", B64, 3), ("89 04 25 00 00 00 00", B64, 7),
    ("89 44 24 08", B64, 4), ("89 84 24 00 01 00 00", B64, 7),
    ("89 45 00", B64, 3), ("89 85 00 01 00 00", B64, 6),
    ("89 04 05 00 00 00 00", B64, 7),          # SIB base=5, mod 0 -> disp32
    ("89 44 05 00", B64, 4),                   # SIB base=5, mod 1 -> disp8
    # 16-bit addressing (16-bit mode, or 67 in 32-bit mode)
    ("89 06 34 12", B16, 4), ("89 46 00", B16, 3), ("89 86 00 01", B16, 4),
    ("89 04", B16, 2), ("89 07", B16, 2), ("67 89 06 34 12", B32, 5),
    ("67 89 04 24", B16, 4), ("67 89 05 00 00 00 00", B16, 7),
    ("67 89 05 00 00 00 00", B64, 7),          # 67 in 64-bit: 32-bit addr
    # immediates by operand size
    ("05 00 00 00 00", B64, 5), ("66 05 00 00", B64, 4),
    ("48 05 00 00 00 00", B64, 6), ("66 48 05 00 00 00 00", B64, 7),  # W wins
    ("05 00 00", B16, 3), ("66 05 00 00 00 00", B16, 6),
    ("66 05 00 00", B32, 4),
    ("b8 00 00 00 00", B64, 5), ("48 b8 00 00 00 00 00 00 00 00", B64, 10),
    ("66 b8 00 00", B64, 4), ("b8 00 00", B16, 3), ("66 b8 00 00 00 00", B16, 6),
    ("68 00 00 00 00", B64, 5), ("66 68 00 00", B64, 4), ("6a 00", B64, 2),
    ("69 c0 00 00 00 00", B64, 6), ("6b c0 00", B64, 3),
    ("81 c0 00 00 00 00", B64, 6), ("83 c0 00", B64, 3), ("80 c0 00", B64, 3),
    ("66 81 c0 00 00", B64, 5), ("81 c0 00 00", B16, 4),
    ("c7 00 00 00 00 00", B64, 6), ("66 c7 00 00 00", B64, 5),
    ("c7 c0 00 00", B16, 4), ("c6 00 00", B64, 3),
    ("c8 10 00 01", B64, 4), ("c8 10 00 01", B16, 4),   # enter iw, ib
    ("f6 c0 01", B64, 3), ("f6 c8 01", B64, 3),          # test /0, /1
    ("f6 d0", B64, 2), ("f6 e0", B64, 2),                # not, mul: no imm
    ("f7 c0 00 00 00 00", B64, 6), ("66 f7 c0 00 00", B64, 5),
    ("f7 d0", B64, 2), ("f7 c0 00 00", B16, 4), ("f7 40 08 00 00 00 00", B64, 7),
    ("d4 0a", B32, 2), ("d5 0a", B32, 2), ("d5 0a", B16, 2),   # aam/aad
    # moffs: address size
    ("a1 00 00 00 00 00 00 00 00", B64, 9), ("67 a1 00 00 00 00", B64, 6),
    ("48 a3 00 00 00 00 00 00 00 00", B64, 10),
    ("a0 00 00 00 00", B32, 5), ("67 a0 00 00", B32, 4),
    ("a1 00 00", B16, 3), ("67 a1 00 00 00 00", B16, 6),
    ("66 a1 00 00", B16, 4),                   # 66 is operand size only
    # legacy prefix after REX: REX ignored
    ("48 66 b8 00 00", B64, 5), ("66 48 b8 00 00 00 00 00 00 00 00", B64, 11),
    ("48 f3 b8 00 00 00 00", B64, 7),
    # 40-4F are inc/dec outside 64-bit mode
    ("48", B32, 1), ("40", B16, 1), ("48 b8 00 00 00 00", B32, 1),
    # redundant / repeated prefixes
    ("66 66 66 66 2e 0f 1f 84 00 00 00 00 00", B64, 13),
    ("f0 f0 f0 83 00 01", B64, 6), ("26 2e 36 3e 64 65 90", B32, 7),
    ("f2 f3 f2 0f 10 c0", B64, 6),
    # 0F maps
    ("0f 1f 00", B64, 3), ("0f 1f 44 00 00", B64, 5), ("0f 31", B64, 2),
    ("0f a2", B64, 2), ("0f af c0", B64, 3), ("0f ba e0 05", B64, 4),
    ("0f a4 c0 05", B64, 4), ("0f ac c0 05", B64, 4), ("0f c2 c1 00", B64, 4),
    ("0f 70 c1 00", B64, 4), ("66 0f 73 d0 04", B64, 5), ("0f c6 c1 00", B64, 4),
    ("0f 20 c0", B64, 3), ("0f 20 00", B64, 3), ("0f 23 05", B64, 3),
    ("0f 78 c0", B64, 3), ("66 0f 78 c0 01 02", B64, 6),   # vmread/extrq
    ("f2 0f 78 c1 01 02", B64, 6),                           # insertq
    ("0f 38 00 c1", B64, 4), ("66 0f 38 00 04 24", B64, 6),
    ("0f 3a 0f c1 08", B64, 5), ("66 0f 3a 0f 44 24 08 08", B64, 8),
    ("f3 0f 1e fa", B64, 4), ("f3 0f b8 c0", B64, 4),        # endbr64, popcnt
    ("0f 0f c1 b4", B64, 4), ("0f 0f 44 24 08 9e", B64, 6),  # 3DNow!
    ("0f 04", B64, 2), ("0f 0a", B64, 2),                    # undefined
    ("0f 24 c0", B32, 2), ("0f a6 c0", B32, 3),              # libipt choices
    # VEX / EVEX
    ("c5 f8 77", B64, 3),                                    # vzeroupper
    ("c5 fd 6f 04 24", B64, 5), ("c5 f9 70 c1 01", B64, 5),
    ("c4 e2 7d 18 c0", B64, 5), ("c4 e3 7d 04 c1 01", B64, 6),
    ("c4 e2 79 18 44 24 08", B64, 7),
    ("c4 e3 79 16 c0 01", B64, 6), ("c5 fd 6f 80 00 01 00 00", B64, 8),
    ("62 f1 7c 48 10 00", B64, 6), ("62 f1 7c 48 10 40 01", B64, 7),
    ("62 f3 7d 48 0f c1 01", B64, 7), ("62 f2 7d 48 18 c0", B64, 6),
    ("c5 f8 77", B32, 3), ("c4 e2 7d 18 c0", B32, 5), ("62 f1 7c 48 10 c0", B32, 6),
    ("c4 00", B32, 2), ("c5 06 34 12", B16, 4),              # les/lds
    ("62 00", B32, 2), ("62 05 00 00 00 00", B32, 6),        # bound
    ("c4 e1 fb 2a 04", B16, 5), ("67 c4 e1 fb 2a 04 24", B16, 7),  # VEX, 16-bit
    # XOP (AMD) vs pop r/m
    ("8f c0", B64, 2), ("8f 00", B64, 2), ("8f 40 08", B64, 3),
    ("8f e8 78 a2 c0 00", B64, 6), ("8f e9 78 80 c1", B64, 5),
    ("8f ea 78 10 c0 00 00 00 00", B64, 9), ("8f e8 78 a2 c0 00", B32, 6),
    # REX2 (APX)
    ("d5 18 8b 00", B64, 4), ("d5 98 af c0", B64, 4),        # map 1 (imul)
    ("d5 08 b8 00 00 00 00 00 00 00 00", B64, 11),           # W: iv = 8
    ("d5 00 a1 00 00 00 00 00 00 00 00", B64, 11),
    ("67 d5 00 a1 00 00 00 00", B64, 8),                     # not JMPABS
]


@pytest.mark.parametrize("hexs,mode,size", LENGTHS,
                         ids=[f"{h.replace(' ', '')}-{m.oracle_name}"
                              for h, m, _ in LENGTHS])
def test_lengths(hexs, mode, size):
    code = bytes.fromhex(hexs)
    assert decode(code + bytes(16), mode).size == size
    if size < len(code):
        return
    assert decode(code, mode).size == size
    with pytest.raises(X86Error) as e:
        decode(code[:-1], mode)
    assert e.value.reason == "truncated"
    assert e.value.needed <= size


def test_rex2_is_not_a_prefix_outside_64bit_mode():
    assert decode(bytes.fromhex("d5 00 a1 00 00"), B32).size == 2
    assert decode(bytes.fromhex("d5 00 a1 00 00"), B32).iclass == C.OTHER


def test_jmpabs_needs_w0_and_no_size_prefixes():
    for hexs in ("d5 08 a1" + " 00" * 8, "66 d5 00 a1" + " 00" * 8):
        insn = decode(bytes.fromhex(hexs), B64)
        assert insn.kind == K.OTHER and insn.iclass == C.OTHER


def test_fifteen_byte_limit():
    ok = bytes.fromhex("66" * 4 + "2e" * 3 + "48 c7 84 24 00 00 00 00 00 00 00 00")
    assert len(ok) == 19
    with pytest.raises(X86Error) as e:
        decode(ok, B64)
    assert e.value.reason == "invalid"
    sixteen = bytes.fromhex("2e" * 14 + "90 90")
    assert decode(sixteen[1:], B64).size == 14
    with pytest.raises(X86Error) as e:
        decode(bytes.fromhex("2e" * 15 + "90"), B64)
    assert e.value.reason == "invalid"
    with pytest.raises(X86Error) as e:   # could still be valid: truncated
        decode(bytes.fromhex("2e" * 10), B64)
    assert e.value.reason == "truncated"


def test_exactly_fifteen_bytes_is_fine():
    code = bytes.fromhex("2e" * 4 + "48 c7 84 24 00 00 00 00 00 00 00 00")
    assert len(code) == 16
    with pytest.raises(X86Error):
        decode(code, B64)
    code = code[1:]
    assert decode(code, B64).size == 15


def test_invalid_maps():
    for hexs, mode in (("0f 39 00", B64), ("0f 3b 00", B32),
                       ("c4 e0 78 00 c0", B64),      # VEX map 0
                       ("c4 e8 78 00 c0", B64),      # VEX map 8
                       ("62 f0 7c 48 10 c0", B64),   # EVEX map 0
                       ("8f eb 78 00 c0", B64)):     # XOP map 11
        with pytest.raises(X86Error) as e:
            decode(bytes.fromhex(hexs) + bytes(10), mode)
        assert e.value.reason == "invalid", hexs


def test_truncated_reports_offset_and_a_lower_bound():
    code = bytes.fromhex("90 90 e8 00 00")
    with pytest.raises(X86Error) as e:
        decode(code, B64, offset=2)
    err = e.value
    assert (err.reason, err.offset, err.needed, err.truncated) == ("truncated", 2, 5, True)
    with pytest.raises(X86Error) as e:
        decode(b"", B64)
    assert e.value.reason == "truncated" and e.value.needed == 1
    with pytest.raises(X86Error) as e:
        decode(b"\x0f", B64)
    assert e.value.truncated
    assert pickle.loads(pickle.dumps(err)).needed == 5


def test_offset_and_memoryview():
    code = bytes.fromhex("48 89 e5 e8 10 00 00 00 c3")
    mv = memoryview(code)
    assert decode(mv, B64, 3) == decode(code, B64, 3)
    assert decode(mv, B64, 3).rel == 16
    assert decode(bytearray(code), B64, 8).kind == K.RET
    fn = decoder_for(B64)
    assert fn(code, 0).size == 3 and fn(code).size == 3


def test_targets_wrap_to_the_mode():
    jmp = decode(bytes.fromhex("e9 00 00 00 80"), B64)   # rel -2^31
    assert jmp.target(0x1000) == 0xFFFFFFFF80001005
    assert jmp.target(0x1000, B32) == 0x80001005
    back = decode(bytes.fromhex("eb 80"), B16)
    assert back.target(0x10, B16) == (0x10 + 2 - 128) & 0xFFFF
    assert decode(b"\xc3", B64).target(0x1000) is None
    assert decode(b"\x90", B64).target(0x1000) is None
    abs_ = decode(bytes.fromhex("d5 00 a1 00 10 00 00 00 00 00 80"), B64)
    assert abs_.target(0x1234) == 0x8000000000001000
    xb = decode(bytes.fromhex("c7 f8 10 00 00 00"), B64)
    assert xb.target(0x100) == 0x116


def test_insn_is_immutable_and_compact():
    insn = decode(b"\x90", B64)
    with pytest.raises(AttributeError):
        insn.size = 2
    assert not hasattr(insn, "__dict__")
    assert isinstance(insn, Insn)


def test_mode_and_class_names():
    assert [m.oracle_name for m in Mode] == ["16bit", "32bit", "64bit"]
    assert Mode.from_name("32bit") is B32 and Mode.from_name(64) is B64
    assert Mode.from_name("BIT16") is B16
    with pytest.raises(ValueError):
        Mode.from_name("8bit")
    assert C.COND_JUMP.oracle_name == "cond_jump"
    assert C.FAR_RETURN.oracle_name == "far_return"
    with pytest.raises(ValueError):
        decoder_for(7)


def test_mode_may_be_given_by_name():
    assert decode(bytes.fromhex("e8 00 00"), "16bit").size == 3
    assert decode(bytes.fromhex("e8 00 00 00 00"), "32bit").size == 5
    assert decoder_for("64bit") is decoder_for(B64)
    for bad in (0, 4, "8bit", None, 2.5):
        with pytest.raises(ValueError):
            decode(b"\x90", bad)

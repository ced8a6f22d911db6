"""Per-opcode tables of the x86 length decoder, built once at import.

Every table is an immutable ``bytes`` (or tuple) of 256 entries indexed by
the opcode byte. The facts come from the Intel SDM opcode maps (Vol. 2,
appendix A) and AMD's APM (XOP, 3DNow!), with libipt's choices where the
architecture leaves room (undefined opcodes decode as "no ModRM, no
immediate" instead of failing, like libipt's instruction length decoder,
because a trace decoder must follow what the CPU executed, not judge it).

Codes:
  MODRM_*   0 none, 1 ModRM (+SIB/displacement), 2 ModRM whose mod field is
            ignored (mov to/from control/debug registers: no SIB/disp)
  IMM_*     0..8: that many constant bytes; >= 16: a rule in decoder.py
  BR_*      0: not interesting; else how decoder.py classifies it
"""

from __future__ import annotations

from .insn import IClass, Insn, Kind

# --- immediate rules (>= 16) ------------------------------------------------
IMM_Z = 16        # 2 or 4 bytes by effective operand size (iz)
IMM_V = 17        # 2, 4 or 8 bytes by effective operand size (iv: mov r, imm)
IMM_F6 = 18       # F6 group: ib only for /0 and /1 (test)
IMM_F7 = 19       # F7 group: iz only for /0 and /1 (test)
IMM_C7 = 20       # C7 group: iz for /0 (mov), rel z for /7 (xbegin)
IMM_0F78 = 21     # 0F 78: vmread (none) or extrq/insertq (ib ib with 66/F2)
IMM_MOFFS = 22    # A0-A3: address-size offset (2, 4 or 8)
IMM_RELZ = 23     # E8/E9/0F 8x: rel32 in 64-bit mode, else rel16/32 by osz
IMM_FAR = 24      # 9A/EA: ptr16:16 or ptr16:32 (offset by osz, then selector)

# --- branch classification codes ---------------------------------------------
BR_JCC8 = 1       # 70-7F
BR_JCCZ = 2       # 0F 80-8F
BR_JMP8 = 3       # EB
BR_CALLZ = 4      # E8
BR_JMPZ = 5       # E9
BR_FF = 8         # FF group by ModRM.reg
BR_0F01 = 9       # 0F 01 group by the whole ModRM byte
BR_CR = 10        # 0F 22: mov to cr3?
BR_0FC7 = 11      # 0F C7: vmptrld/vmclear/vmxon?
BR_0FAE = 12      # 0F AE: ptwrite?
BR_C7 = 13        # C7 F8: xbegin
BR_C6 = 14        # C6 F8: xabort
BR_JMPABS = 15    # REX2 A1: jmpabs (set by decoder.py)
BR_KIND = 32      # >= 32: the kind is (code - 32); loop*/jrcxz (kinds
                  # below JMPABS) read their rel8, the others need nothing


def _set(t: list[int], value: int, *ops) -> None:
    for op in ops:
        if isinstance(op, range):
            for o in op:
                t[o] = value
        else:
            t[op] = value


# =============================================================================
# Map 0: one-byte opcodes
# =============================================================================
_m0 = [0] * 256
_i0 = [0] * 256
for _row in range(0x00, 0x40, 8):
    # ALU block: op r/m,r ; op r,r/m ; op al,ib ; op eax,iz (+ 2 misc)
    _set(_m0, 1, range(_row, _row + 4))
    _i0[_row + 4] = 1
    _i0[_row + 5] = IMM_Z
_set(_m0, 1, 0x62, 0x63, 0x69, 0x6B, range(0x80, 0x90), 0xC0, 0xC1, 0xC4,
     0xC5, 0xC6, 0xC7, range(0xD0, 0xD4), range(0xD8, 0xE0), 0xF6, 0xF7,
     0xFE, 0xFF)
_i0[0x68] = IMM_Z          # push iz (df64: still 4 bytes in 64-bit mode)
_i0[0x69] = IMM_Z
_i0[0x6A] = 1
_i0[0x6B] = 1
_set(_i0, 1, range(0x70, 0x80))   # jcc rel8
_i0[0x80] = 1
_i0[0x81] = IMM_Z
_i0[0x82] = 1
_i0[0x83] = 1
_i0[0x9A] = IMM_FAR
_set(_i0, IMM_MOFFS, range(0xA0, 0xA4))
_i0[0xA8] = 1
_i0[0xA9] = IMM_Z
_set(_i0, 1, range(0xB0, 0xB8))
_set(_i0, IMM_V, range(0xB8, 0xC0))
_i0[0xC0] = 1
_i0[0xC1] = 1
_i0[0xC2] = 2
_i0[0xC6] = 1
_i0[0xC7] = IMM_C7
_i0[0xC8] = 3              # enter iw, ib
_i0[0xCA] = 2
_i0[0xCD] = 1
_i0[0xD4] = 1              # aam ib
_i0[0xD5] = 1              # aad ib (REX2 in 64-bit mode: decoder.py)
_set(_i0, 1, range(0xE0, 0xE8))   # loop*/jrcxz rel8, in/out ib
_i0[0xE8] = IMM_RELZ
_i0[0xE9] = IMM_RELZ
_i0[0xEA] = IMM_FAR
_i0[0xEB] = 1
_i0[0xF6] = IMM_F6
_i0[0xF7] = IMM_F7

_b0 = [0] * 256
_set(_b0, BR_JCC8, range(0x70, 0x80))
_b0[0xEB] = BR_JMP8
_b0[0xE8] = BR_CALLZ
_b0[0xE9] = BR_JMPZ
for _op, _kind in ((0xE0, Kind.LOOPNE), (0xE1, Kind.LOOPE), (0xE2, Kind.LOOP),
                   (0xE3, Kind.JRCXZ)):
    _b0[_op] = BR_KIND + _kind
for _op, _kind in ((0xC2, Kind.RET_IMM), (0xC3, Kind.RET),
                   (0xCA, Kind.RETF_IMM), (0xCB, Kind.RETF),
                   (0xCC, Kind.INT3), (0xCD, Kind.INT), (0xCE, Kind.INTO),
                   (0xCF, Kind.IRET), (0xF1, Kind.INT1), (0xF4, Kind.HLT),
                   (0x9A, Kind.CALL_FAR), (0xEA, Kind.JMP_FAR)):
    _b0[_op] = BR_KIND + _kind
_b0[0xFF] = BR_FF
_b0[0xC7] = BR_C7
_b0[0xC6] = BR_C6

# =============================================================================
# Map 1: 0F xx
# =============================================================================
_m1 = [1] * 256
_set(_m1, 0, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0E,
     range(0x24, 0x28), range(0x30, 0x40), 0x77, 0x7A, 0x7B,
     range(0x80, 0x90), 0xA0, 0xA1, 0xA2, 0xA8, 0xA9, 0xAA,
     range(0xC8, 0xD0))
_set(_m1, 2, range(0x20, 0x24), 0xA6, 0xA7)
_i1 = [0] * 256
_set(_i1, 1, range(0x70, 0x74), 0xA4, 0xAC, 0xBA, 0xC2, 0xC4, 0xC5, 0xC6)
_i1[0x78] = IMM_0F78
_set(_i1, IMM_RELZ, range(0x80, 0x90))

# VEX map 1 shares the ModRM table with the legacy map (libipt does too);
# its immediates are the legacy ones without the 0F 78 and jcc rules.
_vm1 = list(_m1)
_vm1[0x0F] = 0
_vi1 = [0] * 256
_set(_vi1, 1, range(0x70, 0x74), 0xC2, 0xC4, 0xC5, 0xC6)

# 3DNow! (AMD): 0F 0F ModRM [SIB] [disp] ib. libipt decodes 0F 0F as a
# two-byte instruction; the architecture says otherwise.
_m1[0x0F] = 1
_i1[0x0F] = 1

_b1 = [0] * 256
_set(_b1, BR_JCCZ, range(0x80, 0x90))
for _op, _kind in ((0x05, Kind.SYSCALL), (0x07, Kind.SYSRET),
                   (0x34, Kind.SYSENTER), (0x35, Kind.SYSEXIT),
                   (0x0B, Kind.UD), (0xB9, Kind.UD), (0xFF, Kind.UD),
                   (0xAA, Kind.RSM)):
    _b1[_op] = BR_KIND + _kind
_b1[0x01] = BR_0F01
_b1[0x22] = BR_CR
_b1[0xC7] = BR_0FC7
_b1[0xAE] = BR_0FAE

# EVEX map 4 (APX promoted legacy instructions): all have ModRM.
_ei4 = [0] * 256
_set(_ei4, 1, 0x24, 0x2C, 0x6B, 0x80, 0x83, 0xC0, 0xC1, 0xD4)
_set(_ei4, IMM_Z, 0x69, 0x81)
_ei4[0xF6] = IMM_F6
_ei4[0xF7] = IMM_F7

ALL_MODRM = bytes([1] * 256)
NO_MODRM = bytes(256)
NO_IMM = bytes(256)
IMM8_ALL = bytes([1] * 256)
IMM32_ALL = bytes([4] * 256)
NO_BRANCH = bytes(256)

MODRM0 = bytes(_m0)
IMM0 = bytes(_i0)
BR0 = bytes(_b0)
MODRM1 = bytes(_m1)
IMM1 = bytes(_i1)
BR1 = bytes(_b1)
VEX_MODRM1 = bytes(_vm1)
VEX_IMM1 = bytes(_vi1)
EVEX_IMM4 = bytes(_ei4)

# 64-bit mode: 9A, EA and CE are invalid there, so not far branches
# (libipt agrees); their lengths still decode.
BR0_64 = bytearray(BR0)
for _op in (0x9A, 0xEA, 0xCE):
    BR0_64[_op] = 0
BR0_64 = bytes(BR0_64)

# (modrm, imm) tables per VEX map (None: invalid map).
VEX_MAPS = (None, (VEX_MODRM1, VEX_IMM1), (ALL_MODRM, NO_IMM),
            (ALL_MODRM, IMM8_ALL), (NO_MODRM, NO_IMM), (NO_MODRM, NO_IMM),
            (NO_MODRM, NO_IMM), (ALL_MODRM, IMM32_ALL)) + (None,) * 24
EVEX_MAPS = (None, (ALL_MODRM, VEX_IMM1), (ALL_MODRM, NO_IMM),
             (ALL_MODRM, IMM8_ALL), (ALL_MODRM, EVEX_IMM4),
             (ALL_MODRM, NO_IMM), (ALL_MODRM, NO_IMM), (ALL_MODRM, IMM32_ALL))
# AMD XOP (8F with map_select >= 8): map 8 ib, map 9 none, map 10 id.
XOP_MAPS = (None,) * 8 + ((ALL_MODRM, IMM8_ALL), (ALL_MODRM, NO_IMM),
                          (ALL_MODRM, IMM32_ALL)) + (None,) * 21

# =============================================================================
# ModRM displacement tables
# =============================================================================
# 32/64-bit addressing: displacement bytes; >= 8 means a SIB byte follows:
# 8 = SIB with mod 0 (disp32 iff SIB.base == 5), 9 = SIB + disp8,
# 12 = SIB + disp32.
_d32 = [0] * 256
_d16 = [0] * 256
for _m in range(256):
    _mod, _rm = _m >> 6, _m & 7
    if _mod == 3:
        continue
    if _mod == 0:
        _d32[_m] = 8 if _rm == 4 else (4 if _rm == 5 else 0)
        _d16[_m] = 2 if _rm == 6 else 0
    elif _mod == 1:
        _d32[_m] = 9 if _rm == 4 else 1
        _d16[_m] = 1
    else:
        _d32[_m] = 12 if _rm == 4 else 4
        _d16[_m] = 2
DISP32 = bytes(_d32)
DISP16 = bytes(_d16)

# =============================================================================
# Prefix table: 0 not a prefix, 1 = 66, 2 = 67, 3 = segment/lock (no effect
# on length), 4 = F2, 5 = F3, 6 = REX (64-bit mode only).
# =============================================================================
_p = [0] * 256
_p[0x66] = 1
_p[0x67] = 2
_set(_p, 3, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0xF0)
_p[0xF2] = 4
_p[0xF3] = 5
PREFIX32 = bytes(_p)
_set(_p, 6, range(0x40, 0x50))
PREFIX64 = bytes(_p)

# =============================================================================
# Kind -> class and flags; prebuilt Insn objects by (kind, size)
# =============================================================================
_CLASS = {
    Kind.CALL_REL: IClass.CALL, Kind.CALL_IND: IClass.CALL,
    Kind.JMP_REL: IClass.JUMP, Kind.JMP_IND: IClass.JUMP,
    Kind.JMPABS: IClass.JUMP,
    Kind.JCC: IClass.COND_JUMP, Kind.JRCXZ: IClass.COND_JUMP,
    Kind.LOOP: IClass.COND_JUMP, Kind.LOOPE: IClass.COND_JUMP,
    Kind.LOOPNE: IClass.COND_JUMP,
    Kind.RET: IClass.RETURN, Kind.RET_IMM: IClass.RETURN,
    Kind.CALL_FAR: IClass.FAR_CALL, Kind.CALL_FAR_IND: IClass.FAR_CALL,
    Kind.SYSCALL: IClass.FAR_CALL, Kind.SYSENTER: IClass.FAR_CALL,
    Kind.INT: IClass.FAR_CALL, Kind.INT3: IClass.FAR_CALL,
    Kind.INTO: IClass.FAR_CALL, Kind.INT1: IClass.FAR_CALL,
    Kind.VMCALL: IClass.FAR_CALL,
    Kind.JMP_FAR: IClass.FAR_JUMP, Kind.JMP_FAR_IND: IClass.FAR_JUMP,
    Kind.RETF: IClass.FAR_RETURN, Kind.RETF_IMM: IClass.FAR_RETURN,
    Kind.IRET: IClass.FAR_RETURN, Kind.SYSRET: IClass.FAR_RETURN,
    Kind.SYSEXIT: IClass.FAR_RETURN, Kind.VMLAUNCH: IClass.FAR_RETURN,
    Kind.VMRESUME: IClass.FAR_RETURN, Kind.ERETU: IClass.FAR_RETURN,
    Kind.ERETS: IClass.FAR_RETURN, Kind.UIRET: IClass.FAR_RETURN,
    Kind.PTWRITE: IClass.PTWRITE,
}
_BRANCH_CLASSES = {IClass.CALL, IClass.RETURN, IClass.JUMP, IClass.COND_JUMP,
                   IClass.FAR_CALL, IClass.FAR_RETURN, IClass.FAR_JUMP}
_FAR_CLASSES = {IClass.FAR_CALL, IClass.FAR_RETURN, IClass.FAR_JUMP}
# Branches whose target the trace does not carry (no TIP). JMPABS is not
# one of them: it encodes its target, yet Intel PT reports it with a TIP like
# an indirect jump and libipt follows the TIP (corpus test tip-jmpabs).
DIRECT_KINDS = frozenset({Kind.CALL_REL, Kind.JMP_REL, Kind.JCC, Kind.JRCXZ,
                          Kind.LOOP, Kind.LOOPE, Kind.LOOPNE})


def kind_class(kind: Kind) -> IClass:
    """libipt's class of an instruction of this kind."""
    return _CLASS.get(kind, IClass.OTHER)


def kind_template(kind: Kind) -> tuple:
    """(iclass, kind) + the four flags, in Insn field order (minus size/rel)."""
    c = kind_class(kind)
    br = c in _BRANCH_CLASSES
    return (c, kind, br, c == IClass.COND_JUMP,
            br and kind not in DIRECT_KINDS, c in _FAR_CLASSES)


def _prebuild() -> tuple:
    out = []
    for kind in Kind:
        c, k, br, cond, ind, far = kind_template(kind)
        out.append(tuple(Insn(size, c, k, 0, br, cond, ind, far)
                         for size in range(16)))
    return tuple(out)


#: BY_KIND[kind][size] -> a shared Insn with rel 0 (for non-relative kinds).
BY_KIND = _prebuild()
OTHER_BY_SIZE = BY_KIND[Kind.OTHER]

"""The length and class decoder: one specialised closure per execution mode.

Hot-path notes: every lookup is a ``bytes`` index; instructions that are
not branches come back as shared, prebuilt Insn objects (one per size);
relative branches build one tuple. Reads past the end of the buffer raise
IndexError, which is turned into X86Error("truncated") once, outside the
per-byte logic.
"""

from __future__ import annotations

from struct import Struct
from typing import Callable

from . import tables as T
from .insn import Insn, Kind, Mode, X86Error

_tnew = tuple.__new__
_I32 = Struct("<i").unpack_from
_I16 = Struct("<h").unpack_from
_U64 = Struct("<Q").unpack_from
DecodeFn = Callable[..., Insn]


def _fail(code, offset: int) -> X86Error:
    """The error for a read past the end of ``code``."""
    have = len(code) - offset
    if have >= 15:
        return X86Error("invalid", offset, 0, "longer than 15 bytes")
    return X86Error("truncated", offset, max(1, have + 1),
                    f"{max(have, 0)} byte(s) available")


def _build(mode: Mode) -> DecodeFn:
    is64 = mode == Mode.BIT64
    d16 = 1 if mode == Mode.BIT16 else 0
    PFX = T.PREFIX64 if is64 else T.PREFIX32
    M0, I0 = T.MODRM0, T.IMM0
    B0 = T.BR0_64 if is64 else T.BR0
    M1, I1, B1 = T.MODRM1, T.IMM1, T.BR1
    ALL_MODRM, NO_IMM, IMM8 = T.ALL_MODRM, T.NO_IMM, T.IMM8_ALL
    NO_BR = T.NO_BRANCH
    VEX_MODRM1, VEX_IMM1 = T.VEX_MODRM1, T.VEX_IMM1
    VEX_MAPS, EVEX_MAPS, XOP_MAPS = T.VEX_MAPS, T.EVEX_MAPS, T.XOP_MAPS
    D16, D32 = T.DISP16, T.DISP32
    OTHER = T.OTHER_BY_SIZE
    BYK = T.BY_KIND
    # Extension escapes in map 0: C5 VEX2, C4 VEX3, 62 EVEX, 8F XOP, D5 REX2.
    sp = [0] * 256
    sp[0xC5], sp[0xC4], sp[0x62], sp[0x8F] = 1, 2, 3, 4
    if is64:
        sp[0xD5] = 5
    SP = bytes(sp)
    # REX2: no relative branches (those opcodes are #UD with REX2), and A1
    # becomes JMPABS when W, 66 and 67 are all clear.
    b0x = bytearray(B0)
    for op in (*range(0x70, 0x80), 0xE0, 0xE1, 0xE2, 0xE3, 0xE8, 0xE9, 0xEA,
               0xEB):
        b0x[op] = 0
    b0x[0xA1] = T.BR_JMPABS
    B0X2 = bytes(b0x)
    b1x = bytearray(B1)
    for op in (*range(0x80, 0x90), 0x34, 0x35):
        b1x[op] = 0
    B1X2 = bytes(b1x)
    IMM_Z, IMM_V, IMM_F6, IMM_F7, IMM_C7 = (T.IMM_Z, T.IMM_V, T.IMM_F6,
                                            T.IMM_F7, T.IMM_C7)
    IMM_0F78, IMM_MOFFS, IMM_RELZ, IMM_FAR = (T.IMM_0F78, T.IMM_MOFFS,
                                              T.IMM_RELZ, T.IMM_FAR)
    t_jcc = T.kind_template(Kind.JCC)
    t_call = T.kind_template(Kind.CALL_REL)
    t_jmp = T.kind_template(Kind.JMP_REL)
    t_rel8 = tuple(T.kind_template(Kind(k))[:2] if k <= Kind.LOOPNE else None
                   for k in range(Kind.JMPABS))
    JMPABS = int(Kind.JMPABS)
    t_xbegin = T.kind_template(Kind.XBEGIN)
    t_jmpabs = T.kind_template(Kind.JMPABS)
    C_JCC, K_JCC = t_jcc[0], t_jcc[1]
    C_CALL, K_CALL = t_call[0], t_call[1]
    C_JMP, K_JMP = t_jmp[0], t_jmp[1]
    ONE_CLASS = {op: BYK[k] for op, k in (
        (0xC1, Kind.VMCALL), (0xC2, Kind.VMLAUNCH), (0xC3, Kind.VMRESUME),
        (0xC4, Kind.VMXOFF), (0xD4, Kind.VMFUNC), (0xD5, Kind.XEND),
        (0xEC, Kind.UIRET))}
    FF_KIND = (None, None, BYK[Kind.CALL_IND], BYK[Kind.CALL_FAR_IND],
               BYK[Kind.JMP_IND], BYK[Kind.JMP_FAR_IND], None, None)
    I32, I16 = _I32, _I16

    def decode(code, offset: int = 0) -> Insn:
        i = offset
        osz = asz = rex = last = f3 = 0
        try:
            b = code[i]
            p = PFX[b]
            while p:
                if p == 6:
                    rex = b
                else:
                    rex = 0
                    if p == 1:
                        osz = 1
                    elif p == 2:
                        asz = 1
                    elif p == 4:
                        last = 2
                    elif p == 5:
                        last = 3
                        f3 = 1
                i += 1
                if i - offset >= 15:
                    raise X86Error("invalid", offset, 0, "too many prefixes")
                b = code[i]
                p = PFX[b]
            i += 1
            if b == 0x0F:
                b = code[i]
                i += 1
                if b == 0x38:
                    M, I, B = ALL_MODRM, NO_IMM, NO_BR
                    b = code[i]
                    i += 1
                elif b == 0x3A:
                    M, I, B = ALL_MODRM, IMM8, NO_BR
                    b = code[i]
                    i += 1
                elif (b & 0xF8) == 0x38:
                    raise X86Error("invalid", offset, 0,
                                   f"no opcode map 0F {b:02X}")
                else:
                    M, I, B = M1, I1, B1
            elif SP[b]:
                s = SP[b]
                if s == 5:                          # REX2 (64-bit mode)
                    pl = code[i]
                    rex = (pl & 8) | (4 if pl & 0x44 else 0)
                    b = code[i + 1]
                    i += 2
                    if pl & 0x80:
                        M, I, B = M1, I1, B1X2
                    else:
                        M, I, B = M0, I0, B0X2
                else:
                    p1 = code[i]
                    if s == 4 and not (p1 & 0x18):  # 8F /0: pop r/m
                        M, I, B = M0, I0, B0
                    elif s != 4 and not is64 and p1 < 0xC0:
                        M, I, B = M0, I0, B0        # LES / LDS / BOUND
                    else:
                        B = NO_BR
                        if s == 1:                  # VEX2
                            b = code[i + 1]
                            i += 2
                            M, I = VEX_MODRM1, VEX_IMM1
                        else:
                            p2 = code[i + 1]
                            if s == 3:              # EVEX
                                code[i + 2]
                                b = code[i + 3]
                                i += 4
                                t = EVEX_MAPS[p1 & 7]
                                if (p2 & 3) == 1:
                                    osz = 1
                            else:                   # VEX3 / XOP
                                b = code[i + 2]
                                i += 3
                                t = (VEX_MAPS if s == 2 else XOP_MAPS)[p1 & 0x1F]
                            if t is None:
                                raise X86Error("invalid", offset, 0,
                                               "invalid VEX/EVEX/XOP map")
                            M, I = t
                            rex = (p2 >> 4) & 8
            else:
                M, I, B = M0, I0, B0

            mr = M[b]
            d = 0
            modrm = 0
            if mr:
                modrm = code[i]
                i += 1
                if modrm < 0xC0 and mr == 1:
                    if not is64 and asz != d16:
                        d = D16[modrm]
                    else:
                        d = D32[modrm]
                        if d >= 8:
                            if d == 8:
                                d = 4 if (code[i] & 7) == 5 else 0
                            else:
                                d -= 8
                            i += 1
                    i += d
            im = I[b]
            if im:
                if im < 16:
                    i += im
                else:
                    if is64:
                        z = 2 if osz and not rex & 8 else 4
                    else:
                        z = 2 if osz != d16 else 4
                    if im == IMM_RELZ:
                        i += 4 if is64 else z
                    elif im == IMM_Z:
                        i += z
                    elif im == IMM_V:
                        i += 8 if is64 and rex & 8 else z
                    elif im == IMM_F6:
                        if (modrm & 0x38) < 0x10:
                            i += 1
                    elif im == IMM_F7:
                        if (modrm & 0x38) < 0x10:
                            i += z
                    elif im == IMM_C7:
                        r = modrm & 0x38
                        if r == 0 or (r == 0x38 and d == 0):
                            i += z
                    elif im == IMM_MOFFS:
                        if is64:
                            i += 4 if asz else 8
                        else:
                            i += 2 if asz != d16 else 4
                    elif im == IMM_FAR:
                        i += z + 2
                    elif im == IMM_0F78:
                        if osz or last == 2:
                            i += 2
            sz = i - offset
            if sz > 15:
                raise X86Error("invalid", offset, 0, "longer than 15 bytes")
            if i > len(code):
                raise X86Error("truncated", offset, sz,
                               f"{len(code) - offset} of {sz} bytes available")
            br = B[b]
            if not br:
                return OTHER[sz]
            # --- classification (branches and other interesting kinds) ---
            if br == 1:                                     # jcc rel8
                r = code[i - 1]
                return _tnew(Insn, (sz, C_JCC, K_JCC,
                                    r - 256 if r > 127 else r,
                                    True, True, False, False))
            if br >= 32:                                    # kind coded
                k = br - 32
                if k >= JMPABS:
                    return BYK[k][sz]
                r = code[i - 1]                             # loop*/jrcxz
                return _tnew(Insn, (sz,) + t_rel8[k]
                             + (r - 256 if r > 127 else r, True, True,
                                False, False))
            if br == 4 or br == 5 or br == 2:               # rel16/32
                if is64 or osz == d16:
                    r = I32(code, i - 4)[0]
                else:
                    r = I16(code, i - 2)[0]
                if br == 4:
                    return _tnew(Insn, (sz, C_CALL, K_CALL, r,
                                        True, False, False, False))
                if br == 5:
                    return _tnew(Insn, (sz, C_JMP, K_JMP, r,
                                        True, False, False, False))
                return _tnew(Insn, (sz, C_JCC, K_JCC, r,
                                    True, True, False, False))
            if br == 3:                                     # jmp rel8
                r = code[i - 1]
                return _tnew(Insn, (sz, C_JMP, K_JMP,
                                    r - 256 if r > 127 else r,
                                    True, False, False, False))
            if br == 8:                                     # FF group
                t = FF_KIND[(modrm >> 3) & 7]
                return t[sz] if t else OTHER[sz]
            return _special(br, code, i, sz, modrm, d, osz, asz, rex, last,
                            f3)
        except IndexError:
            raise _fail(code, offset) from None

    def _special(br, code, i, sz, modrm, d, osz, asz, rex, last, f3):
        if br == 9:                                         # 0F 01 group
            t = ONE_CLASS.get(modrm)
            if t:
                return t[sz]
            if modrm == 0xCA and last:
                return BYK[Kind.ERETS if last == 2 else Kind.ERETU][sz]
            return OTHER[sz]
        if br == 10:                                        # 0F 22
            if (modrm & 0x38) == 0x18 and not rex & 4:
                return BYK[Kind.MOV_CR3][sz]
            return OTHER[sz]
        if br == 11:                                        # 0F C7
            if modrm < 0xC0 and (modrm & 0x38) == 0x30:
                if osz:
                    return BYK[Kind.VMCLEAR][sz]
                return BYK[Kind.VMXON if f3 else Kind.VMPTRLD][sz]
            return OTHER[sz]
        if br == 12:                                        # 0F AE
            if f3 and not osz and (modrm & 0x38) == 0x20:
                return BYK[Kind.PTWRITE][sz]
            return OTHER[sz]
        if br == 13:                                        # C7 F8 xbegin
            if modrm == 0xF8:
                if (osz and not rex & 8) if is64 else osz != d16:
                    r = _I16(code, i - 2)[0]
                else:
                    r = _I32(code, i - 4)[0]
                return _tnew(Insn, (sz,) + t_xbegin[:2] + (r,)
                             + t_xbegin[2:])
            return OTHER[sz]
        if br == 14:                                        # C6 F8 xabort
            return BYK[Kind.XABORT if modrm == 0xF8 else Kind.OTHER][sz]
        if br == 15:                                        # REX2 A1
            if not rex & 8 and not asz and not osz:
                r = _U64(code, i - 8)[0]
                return _tnew(Insn, (sz,) + t_jmpabs[:2] + (r,)
                             + t_jmpabs[2:])
            return OTHER[sz]
        return OTHER[sz]

    decode.__doc__ = (f"Decode one instruction in {mode.oracle_name} mode at "
                      "code[offset]; see hwtrace.x86.decode.")
    decode.__name__ = f"decode_{mode.oracle_name}"
    return decode


#: Index by Mode (1, 2, 3): the specialised decoder of that mode.
_DECODERS = (None, _build(Mode.BIT16), _build(Mode.BIT32), _build(Mode.BIT64))


def decoder_for(mode: Mode | str) -> DecodeFn:
    """The decode function specialised for ``mode``: ``fn(code, offset=0)``.

    ``mode`` is a Mode or a name Mode.from_name accepts ("64bit", ...).
    Saves one call level per instruction in hot loops.
    """
    fn = None
    if isinstance(mode, int) and 0 < mode < len(_DECODERS):
        fn = _DECODERS[mode]
    elif isinstance(mode, str):
        fn = _DECODERS[Mode.from_name(mode)]
    if fn is None:
        raise ValueError(f"unknown x86 execution mode: {mode!r}")
    return fn


def decode(code, mode: Mode = Mode.BIT64, offset: int = 0) -> Insn:
    """Decode the instruction at ``code[offset]`` in execution mode ``mode``.

    ``code`` is bytes, bytearray or a memoryview of unsigned bytes (it may
    hold more than the instruction); ``offset`` >= 0. Returns an Insn;
    raises X86Error (reason "truncated" or "invalid"). ``mode`` may also
    be a ptoracle name ("64bit").
    """
    try:
        fn = _DECODERS[mode]
    except (IndexError, TypeError):
        fn = None
    if fn is None:
        fn = decoder_for(mode)
    return fn(code, offset)

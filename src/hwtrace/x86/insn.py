"""Result types of the x86 decoder: execution modes, classes, kinds, Insn.

Names follow libipt (``pt_exec_mode``, ``pt_insn_class``) so ptoracle's JSON
strings map one to one: ``Mode.BIT64.oracle_name == "64bit"``,
``IClass.COND_JUMP.oracle_name == "cond_jump"``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class Mode(IntEnum):
    """Execution mode (libipt's ``pt_exec_mode`` numbering)."""

    BIT16 = 1
    BIT32 = 2
    BIT64 = 3

    @property
    def oracle_name(self) -> str:
        """"16bit" / "32bit" / "64bit", as ptoracle and ptxed print it."""
        return _MODE_NAMES[self]

    @property
    def bits(self) -> int:
        return _MODE_BITS[self]

    @classmethod
    def from_name(cls, name: str | int) -> "Mode":
        """Accept "64bit", "64", 64, "BIT64" (and the 16/32-bit spellings)."""
        key = str(name).strip().lower().removeprefix("bit").removesuffix("bit")
        try:
            return {"16": cls.BIT16, "32": cls.BIT32, "64": cls.BIT64}[key]
        except KeyError:
            raise ValueError(f"unknown x86 execution mode: {name!r}") from None


_MODE_NAMES = {Mode.BIT16: "16bit", Mode.BIT32: "32bit", Mode.BIT64: "64bit"}
_MODE_BITS = {Mode.BIT16: 16, Mode.BIT32: 32, Mode.BIT64: 64}


class IClass(IntEnum):
    """libipt's ``pt_insn_class`` (values as in libipt 2.1+)."""

    UNKNOWN = 0
    OTHER = 1
    CALL = 2
    RETURN = 3
    JUMP = 4
    COND_JUMP = 5
    FAR_CALL = 6
    FAR_RETURN = 7
    FAR_JUMP = 8
    PTWRITE = 9
    INDIRECT = 10   # exists in libipt >= 2.1; its ILD never produces it

    @property
    def oracle_name(self) -> str:
        return self.name.lower()


class Kind(IntEnum):
    """Finer instruction kind, enough for flow decoding and branch tracing.

    Mirrors libipt's internal ``PTI_INST_*`` where one exists.
    """

    OTHER = 0
    # near, relative (target = ip + size + rel)
    CALL_REL = 1        # E8
    JMP_REL = 2         # E9, EB
    JCC = 3             # 70-7F, 0F 80-8F
    JRCXZ = 4           # E3: jcxz/jecxz/jrcxz
    LOOP = 5            # E2
    LOOPE = 6           # E1
    LOOPNE = 7          # E0
    JMPABS = 8          # REX2 (D5 00) A1 imm64: absolute target in `rel`
    # near, indirect
    CALL_IND = 9        # FF /2
    JMP_IND = 10        # FF /4
    RET = 11            # C3
    RET_IMM = 12        # C2 iw
    # far
    CALL_FAR = 13       # 9A ptr16:16/32 (not in 64-bit mode)
    CALL_FAR_IND = 14   # FF /3
    JMP_FAR = 15        # EA ptr16:16/32 (not in 64-bit mode)
    JMP_FAR_IND = 16    # FF /5
    RETF = 17           # CB
    RETF_IMM = 18       # CA iw
    IRET = 19           # CF: iret/iretd/iretq
    SYSCALL = 20        # 0F 05
    SYSRET = 21         # 0F 07
    SYSENTER = 22       # 0F 34
    SYSEXIT = 23        # 0F 35
    INT = 24            # CD ib
    INT3 = 25           # CC
    INTO = 26           # CE (not in 64-bit mode)
    INT1 = 27           # F1
    VMCALL = 28         # 0F 01 C1
    VMLAUNCH = 29       # 0F 01 C2
    VMRESUME = 30       # 0F 01 C3
    ERETU = 31          # F3 0F 01 CA
    ERETS = 32          # F2 0F 01 CA
    UIRET = 33          # (F3) 0F 01 EC
    # not branches, but interesting to a trace decoder
    PTWRITE = 34        # F3 0F AE /4
    MOV_CR3 = 35        # 0F 22 /3 (mov cr3, reg)
    VMPTRLD = 36        # 0F C7 /6, memory operand, no 66/F3 prefix
    VMCLEAR = 37        # 66 0F C7 /6 mem (libipt calls this VMPTRLD too)
    VMXON = 38          # F3 0F C7 /6 mem (libipt calls this VMPTRLD too)
    VMXOFF = 39         # 0F 01 C4
    VMFUNC = 40         # 0F 01 D4
    UD = 41             # 0F 0B ud2, 0F B9 ud1, 0F FF ud0
    HLT = 42            # F4
    RSM = 43            # 0F AA
    XBEGIN = 44         # C7 F8 rel16/32 (libipt class "other"; `rel` set)
    XEND = 45           # 0F 01 D5
    XABORT = 46         # C6 F8 ib


class Insn(NamedTuple):
    """One decoded instruction (immutable, slot-less tuple: cheap to build).

    size:        length in bytes (1..15)
    iclass:      libipt's class (IClass)
    kind:        finer kind (Kind)
    rel:         displacement of relative branches (signed); the absolute
                 target for Kind.JMPABS; 0 otherwise
    is_branch:   changes control flow (every class except other/ptwrite)
    is_cond:     conditional (iclass COND_JUMP: jcc, jrcxz, loop*)
    is_indirect: a branch whose target comes from the trace (a TIP): near
                 indirect call/jmp, returns, every far transfer (direct far
                 ones included) and JMPABS (its encoded target is in `rel`,
                 but Intel PT reports it with a TIP and libipt follows that)
    is_far:      far transfer (far call/return/jump classes)
    """

    size: int
    iclass: IClass
    kind: Kind
    rel: int = 0
    is_branch: bool = False
    is_cond: bool = False
    is_indirect: bool = False
    is_far: bool = False

    def target(self, ip: int, mode: Mode = Mode.BIT64) -> int | None:
        """Target of a direct near branch (or XBEGIN's abort handler)
        executed at ``ip``, else None.

        Wrapped to the width of ``mode`` (64, 32 or 16 bits; the 16-bit
        wrap ignores a 66 operand-size override). libipt itself only wraps
        at 64 bits in every mode: pass ``Mode.BIT64`` to reproduce it.
        """
        k = self.kind
        if k == Kind.JMPABS:
            return self.rel & 0xFFFFFFFFFFFFFFFF
        if (k > Kind.LOOPNE and k != Kind.XBEGIN) or k == Kind.OTHER:
            return None
        t = ip + self.size + self.rel
        if mode == Mode.BIT64:
            return t & 0xFFFFFFFFFFFFFFFF
        if mode == Mode.BIT32:
            return t & 0xFFFFFFFF
        return t & 0xFFFF


class X86Error(Exception):
    """An instruction could not be decoded.

    reason:  "truncated" (the bytes given end inside the instruction: more
             bytes could make it decodable — e.g. it crosses a section
             boundary) or "invalid" (no continuation helps: longer than 15
             bytes, invalid opcode map, VEX/EVEX map 0, ...)
    offset:  offset of the instruction in the buffer
    needed:  for "truncated", a lower bound of the bytes needed from offset
    Both map to libipt's -pte_bad_insn ("bad instruction").
    """

    def __init__(self, reason: str, offset: int = 0, needed: int = 0,
                 detail: str = ""):
        self.reason = reason
        self.offset = offset
        self.needed = needed
        self.detail = detail
        msg = f"{reason} instruction at offset {offset}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)

    @property
    def truncated(self) -> bool:
        return self.reason == "truncated"

    def __reduce__(self):
        return (type(self), (self.reason, self.offset, self.needed, self.detail))

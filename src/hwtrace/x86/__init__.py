"""x86 instruction length and control-flow class decoding (16/32/64-bit).

API::

    from hwtrace.x86 import decode, decoder_for, Insn, IClass, Kind, Mode, X86Error

    insn = decode(code, mode=Mode.BIT64, offset=0)   # -> Insn
    fn = decoder_for(Mode.BIT64); insn = fn(code, offset)   # hot loops

``code`` is bytes / bytearray / memoryview (it may extend past the
instruction; at most 15 bytes are looked at). ``Insn`` is an immutable
NamedTuple: ``size``, ``iclass`` (libipt's pt_insn_class: IClass.OTHER,
CALL, RETURN, JUMP, COND_JUMP, FAR_CALL, FAR_RETURN, FAR_JUMP, PTWRITE;
``iclass.oracle_name`` is ptoracle's string), ``kind`` (Kind: CALL_REL,
JMP_REL, JCC, JRCXZ, LOOP*, JMPABS, CALL_IND, JMP_IND, RET, RET_IMM,
CALL_FAR(_IND), JMP_FAR(_IND), RETF(_IMM), IRET, SYSCALL, SYSRET, SYSENTER,
SYSEXIT, INT, INT3, INTO, INT1, VMCALL, VMLAUNCH, VMRESUME, ERETU, ERETS,
UIRET, PTWRITE, MOV_CR3, VMPTRLD, VMCLEAR, VMXON, VMXOFF, VMFUNC, UD, HLT,
RSM, XBEGIN, XEND, XABORT, OTHER), ``rel`` (signed displacement of relative
branches and XBEGIN: target = ip + size + rel; the absolute target for
JMPABS), and the flags ``is_branch``, ``is_cond``, ``is_indirect``
(target comes from a TIP: indirect near branches, returns, far transfers,
and JMPABS, which Intel PT reports with a TIP), ``is_far``.
``insn.target(ip, mode)`` computes a direct target (None otherwise).
Non-branch results are shared objects: compare with ==, never mutate.

Errors raise ``X86Error`` with ``reason``:
  "truncated"  the buffer ends inside the instruction; more bytes may make
               it decodable (``needed`` is a lower bound of its length). A
               flow decoder reading up to a section end retries with the
               bytes of the next section, as libipt's pt_insn_decode does.
  "invalid"    no continuation helps: more than 15 bytes, invalid opcode
               map (0F 39, 0F 3B-3F), VEX/EVEX/XOP map 0 or unassigned.
Both are libipt's -pte_bad_insn ("bad instruction").

Semantics follow libipt's instruction length decoder (the reference for
ptxed-identical flow decoding), which follows the Intel SDM:
  * undefined opcodes decode (no ModRM, no immediate) instead of failing;
  * 64-bit mode: near relative branches always take rel32 (66 ignored, as
    on Intel CPUs); REX is ignored unless it is the last prefix; C4/C5/62
    are always VEX/EVEX; D5 is REX2 (APX), with D5 00 A1 imm64 = JMPABS;
  * 16/32-bit mode: C4/C5/62 are LES/LDS/BOUND unless the next byte has
    mod == 11b; 66/67 toggle operand/address size (moffs, iz, iv, rel);
  * classes as libipt 2.1+ gives them: syscall/sysenter/int*/vmcall are
    far calls, sysret/sysexit/iret/retf/vmlaunch/vmresume/ERETU/ERETS/
    UIRET far returns; 9A/EA/CE are not branches in 64-bit mode; VEX/EVEX/
    XOP-encoded instructions are never branches; REX2 disables jcc/jmp/call
    rel forms. libipt 2.0.5 (the ptoracle witness) predates ERETU/ERETS/
    UIRET/JMPABS/REX2 and classifies those as other.
Deliberate differences from libipt, where the architecture is clear and
libipt is not: 3DNow! (0F 0F /r ib) and AMD XOP (8F with map_select >= 8,
e.g. 8F E8 ...) decode to their real lengths (libipt: 2 bytes / pop r/m).
Kind.VMPTRLD is 0F C7 /6 without prefix; libipt also binds VMCS events
to VMCLEAR (66) and VMXON (F3): treat those three kinds alike to mimic it.

Why an own table-driven decoder and not a library: the flow decoder needs
libipt's exact length *and* classification semantics (undefined opcodes,
REX2/JMPABS, the far-branch classes, truncated-vs-invalid for section
crossings), which general disassemblers (capstone, iced, zydis) do not
give directly: they stop at undefined opcodes, follow AMD in places, and
spend most of their time formatting operands we never use. A length
decoder is a few 256-entry tables plus ~200 lines; in pure Python it is
more than 10x faster than capstone called once per instruction with the
detail a branch class needs (the flow decoder's access pattern) and still
faster than capstone's own C-driven sweep (bench/bench_x86.py measures
both when capstone is importable); it has no native dependency, and a
compiled twin can reuse the same tables.
"""

from hwtrace import _lazy_exports

# The re-exports are imported when first asked for: importing
# hwtrace.x86.insn (the classes: what the compiled flow path needs) runs
# this file, and does not build the decoder's tables.
_LAZY = {"decode": "hwtrace.x86.decoder", "decoder_for": "hwtrace.x86.decoder",
         **{n: "hwtrace.x86.insn"
            for n in ("IClass", "Insn", "Kind", "Mode", "X86Error")}}

__getattr__, __dir__ = _lazy_exports(_LAZY, globals())

__all__ = ["decode", "decoder_for", "IClass", "Insn", "Kind", "Mode",
           "X86Error"]

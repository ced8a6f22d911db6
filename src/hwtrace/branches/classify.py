"""Which kind of transfer an executed instruction made: from its x86 class
(``hwtrace.x86``) and where execution went next.  Shared by every source."""

from __future__ import annotations

from hwtrace.x86 import Kind

_BY_KIND = {
    Kind.CALL_REL: "call",
    Kind.CALL_IND: "indirect_call",
    Kind.JMP_REL: "jump",
    Kind.JMPABS: "jump",
    Kind.JMP_IND: "indirect_jump",
    Kind.RET: "return",
    Kind.RET_IMM: "return",
    Kind.CALL_FAR: "far",
    Kind.CALL_FAR_IND: "far",
    Kind.JMP_FAR: "far",
    Kind.JMP_FAR_IND: "far",
    Kind.RETF: "far",
    Kind.RETF_IMM: "far",
    Kind.VMCALL: "far",
    Kind.VMLAUNCH: "far",
    Kind.VMRESUME: "far",
    Kind.SYSCALL: "syscall",
    Kind.SYSENTER: "syscall",
    Kind.SYSRET: "sysret",
    Kind.SYSEXIT: "sysret",
    Kind.INT: "interrupt",
    Kind.INT3: "interrupt",
    Kind.INTO: "interrupt",
    Kind.INT1: "interrupt",
    Kind.IRET: "iret",
    Kind.ERETU: "iret",
    Kind.ERETS: "iret",
    Kind.UIRET: "iret",
}
_COND = frozenset({Kind.JCC, Kind.JRCXZ, Kind.LOOP, Kind.LOOPE, Kind.LOOPNE})
#: instructions whose target is the kernel (``syscall``/``interrupt`` records)
TO_KERNEL = frozenset(k for k, v in _BY_KIND.items() if v in ("syscall", "interrupt"))


def is_transfer(x) -> bool:
    """Whether an instruction (``hwtrace.x86.Insn``) makes a branch record."""
    k = x.kind
    return k in _BY_KIND or k in _COND


def classify(x, frm: int, to: int) -> str | None:
    """The record kind of instruction ``x`` executed at ``frm`` that was
    followed by ``to``; None if it is not a control transfer.  A
    conditional branch is ``cond`` when taken (``to`` is not its
    fall-through) and ``cond_not_taken`` otherwise."""
    k = x.kind
    if k in _COND:
        return "cond_not_taken" if to == frm + x.size else "cond"
    return _BY_KIND.get(k)

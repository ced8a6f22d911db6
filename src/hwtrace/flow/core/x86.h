/* The x86 instruction length and class decoder: a port of hwtrace.x86
 * (decoder.py, tables.py, insn.py -- the twin and reference), with the
 * same semantics for 16/32/64-bit code: libipt's instruction length
 * decoder (undefined opcodes decode, REX2/JMPABS, the far-branch classes,
 * truncated vs invalid).  No Python here.
 *
 * x86_decode(code, n, mode, &insn, &needed) decodes the instruction at
 * code[0] with n bytes available (decoder.py's decode(code[:n], mode)):
 *   X86_OK       insn filled (size, iclass, kind, rel)
 *   X86_TRUNC    the bytes end inside the instruction; *needed is a
 *                lower bound of its length (X86Error "truncated")
 *   X86_INVALID  X86Error "invalid"
 * mode: hwtrace.x86.Mode (1 16-bit, 2 32-bit, 3 64-bit).
 *
 * x86_flags(insn) -> the IF_* flags (icache.h) hwtrace.flow.fast._flags_of
 * computes for the instruction cache's record of insn (without IF_TRUNC).
 */
#ifndef HWTRACE_CORE_X86_H
#define HWTRACE_CORE_X86_H

#include <stddef.h>
#include <stdint.h>

enum { X86_OK = 0, X86_TRUNC = 1, X86_INVALID = 2 };

/* hwtrace.x86.insn.Kind */
enum x86_kind {
    K_OTHER = 0, K_CALL_REL, K_JMP_REL, K_JCC, K_JRCXZ, K_LOOP, K_LOOPE,
    K_LOOPNE, K_JMPABS, K_CALL_IND, K_JMP_IND, K_RET, K_RET_IMM,
    K_CALL_FAR, K_CALL_FAR_IND, K_JMP_FAR, K_JMP_FAR_IND, K_RETF,
    K_RETF_IMM, K_IRET, K_SYSCALL, K_SYSRET, K_SYSENTER, K_SYSEXIT, K_INT,
    K_INT3, K_INTO, K_INT1, K_VMCALL, K_VMLAUNCH, K_VMRESUME, K_ERETU,
    K_ERETS, K_UIRET, K_PTWRITE, K_MOV_CR3, K_VMPTRLD, K_VMCLEAR, K_VMXON,
    K_VMXOFF, K_VMFUNC, K_UD, K_HLT, K_RSM, K_XBEGIN, K_XEND, K_XABORT,
    K_NKINDS
};

struct x86_insn {
    int64_t rel;        /* signed displacement; JMPABS: the target (u64) */
    uint8_t size;
    uint8_t iclass;     /* hwtrace.x86.insn.IClass */
    uint8_t kind;       /* enum x86_kind */
};

int x86_decode(const uint8_t *code, size_t n, int mode,
               struct x86_insn *out, int *needed);
int x86_flags(const struct x86_insn *x);

#endif

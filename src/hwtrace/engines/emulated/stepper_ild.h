/* x86-64 instruction length / class decoder used by the ptrace stepper. */
#ifndef HWTRACE_STEPPER_ILD_H
#define HWTRACE_STEPPER_ILD_H
#include <stdint.h>

enum ild_kind {
    K_OTHER = 0,   /* falls through to the next instruction */
    K_JCC,         /* conditional near branch (incl. loop/jrcxz) */
    K_JMP,         /* direct near jump */
    K_CALL,        /* direct near call */
    K_JMP_IND,     /* indirect near jump */
    K_CALL_IND,    /* indirect near call */
    K_RET,         /* near return */
    K_FAR,         /* far call/jump/return, iret, sysret */
    K_SYSCALL,     /* syscall / sysenter */
    K_INT,         /* int3 / int1 / int n */
    K_REPSTR,      /* rep-prefixed string instruction: traps per iteration */
};

struct ild {
    int len;
    int kind;
};

int ild_decode(const uint8_t *bytes, int avail, struct ild *out);

#endif

/* hwtrace QEMU plugin: what it needs to know of one x86-64 instruction
 * (qemu_plugin_insn.h).  No QEMU API here: tests build it on its own. */
#include <stdbool.h>
#include <string.h>
#include "qemu_plugin_insn.h"

/* What the plugin needs to know of one instruction: whether it can fault
 * (raise a synchronous exception, which QEMU turns into a signal, in the
 * middle of a block), and whether it is a branch (with its direct target).
 * Can fault: every memory access (explicit, or push/pop/call/ret/string
 * ops/enter/leave/xlat), divide, x87, I/O, privileged and system
 * instructions, lock prefixes, anything not known; the register forms of
 * ALU, shift, move, bit, multiply and SSE/AVX instructions can't. */
static bool modrm_reg_form(const uint8_t *b, size_t i, size_t n)
{
    return i < n && (b[i] >> 6) == 3;
}

int insn_info(const uint8_t *b, size_t n, uint64_t pc, uint64_t *target)
{
    size_t i = 0;
    *target = 0;
    for (; i < n; i++) {
        uint8_t c = b[i];
        if (c == 0xf0)
            return II_FAULT;                 /* lock: a memory operand, or #UD */
        if (!(c == 0x66 || c == 0x67 || c == 0xf2 || c == 0xf3 || c == 0x2e ||
              c == 0x36 || c == 0x3e || c == 0x26 || c == 0x64 || c == 0x65))
            break;
    }
    if (i < n && (b[i] & 0xf0) == 0x40)
        i++;                                /* REX */
    if (i >= n)
        return II_FAULT;
    uint8_t op = b[i++];
    if (op == 0xc4 || op == 0xc5 || op == 0x62) {   /* VEX, EVEX */
        size_t plen = op == 0xc5 ? 1 : op == 0xc4 ? 2 : 3;
        if (i + plen >= n)
            return II_FAULT;
        int map = op == 0xc5 ? 1 : (b[i] & (op == 0x62 ? 7 : 0x1f));
        uint8_t vop = b[i + plen];
        if (op != 0x62 && map == 1 && vop == 0x77)
            return 0;                        /* vzeroupper / vzeroall */
        return modrm_reg_form(b, i + plen + 1, n) ? 0 : II_FAULT;
    }
    if (op == 0x0f) {
        if (i >= n)
            return II_FAULT;
        uint8_t o2 = b[i++];
        if (o2 >= 0x80 && o2 <= 0x8f) {     /* jcc rel32 */
            if (n >= 4) {
                int32_t rel;
                memcpy(&rel, b + n - 4, 4);
                *target = pc + n + (int64_t)rel;
            }
            return II_BRANCH | II_DIRECT;
        }
        if (o2 == 0x38 || o2 == 0x3a) {     /* SSSE3/SSE4/AES..., reg forms */
            if (i >= n)
                return II_FAULT;
            uint8_t o3 = b[i++];
            if (o2 == 0x38 && o3 >= 0xf0)
                return II_FAULT;             /* movbe, crc32, ADX, ...: be safe */
            return modrm_reg_form(b, i, n) ? 0 : II_FAULT;
        }
        if (o2 == 0x1f || o2 == 0x0d || (o2 >= 0x18 && o2 <= 0x1e))
            return 0;                        /* nop, prefetch, hint nops, endbr */
        if (o2 == 0x31 || o2 == 0xa2 || o2 == 0x77 || (o2 >= 0xc8 && o2 <= 0xcf))
            return 0;                        /* rdtsc, cpuid, emms, bswap */
        if (o2 == 0xae && i < n && (b[i] == 0xe8 || b[i] == 0xf0 || b[i] == 0xf8))
            return 0;                        /* lfence, mfence, sfence */
        if ((o2 >= 0x10 && o2 <= 0x17) || (o2 >= 0x28 && o2 <= 0x2f) ||
            (o2 >= 0x40 && o2 <= 0x7f) || (o2 >= 0x90 && o2 <= 0x9f) ||
            o2 == 0xa3 || o2 == 0xa4 || o2 == 0xa5 || o2 == 0xab || o2 == 0xac ||
            o2 == 0xad || o2 == 0xaf || o2 == 0xb0 || o2 == 0xb1 || o2 == 0xb3 ||
            (o2 >= 0xb6 && o2 <= 0xb8) || (o2 >= 0xba && o2 <= 0xbf) || o2 == 0xc0 ||
            o2 == 0xc1 || o2 == 0xc2 || (o2 >= 0xc4 && o2 <= 0xc6) ||
            (o2 >= 0xd0 && o2 <= 0xfe))
            return modrm_reg_form(b, i, n) ? 0 : II_FAULT;
        return II_FAULT;
    }
    if ((op >= 0x70 && op <= 0x7f) || (op >= 0xe0 && op <= 0xe3) || op == 0xeb) {
        *target = pc + n + (int8_t)b[n - 1];
        return II_BRANCH | II_DIRECT;
    }
    if (op == 0xe9 || op == 0xe8) {
        if (n >= 5) {
            int32_t rel;
            memcpy(&rel, b + n - 4, 4);
            *target = pc + n + (int64_t)rel;
        }
        return op == 0xe9 ? II_BRANCH | II_DIRECT : II_BRANCH | II_DIRECT | II_FAULT;
    }
    if (op == 0xc3 || op == 0xc2)
        return II_BRANCH | II_FAULT;         /* ret: pops */
    if (op == 0xff && i < n) {
        int reg = (b[i] >> 3) & 7;
        if (reg == 2 || reg == 3 || reg == 5)
            return II_BRANCH | II_FAULT;     /* call pushes; far forms read memory */
        if (reg == 4)
            return II_BRANCH | (modrm_reg_form(b, i, n) ? 0 : II_FAULT);
        if (reg == 6 || reg == 7)
            return II_FAULT;                 /* push r/m */
        return modrm_reg_form(b, i, n) ? 0 : II_FAULT;   /* inc, dec */
    }
    if (op == 0x8d)
        return 0;                            /* lea: no access */
    if ((op == 0xf6 || op == 0xf7) && i < n && ((b[i] >> 3) & 7) >= 6)
        return II_FAULT;                     /* div, idiv: #DE */
    if ((op < 0x40 && (op & 7) < 4) || op == 0x63 || op == 0x69 || op == 0x6b ||
        (op >= 0x80 && op <= 0x8b) || op == 0xc0 || op == 0xc1 || op == 0xc6 ||
        op == 0xc7 || (op >= 0xd0 && op <= 0xd3) || op == 0xf6 || op == 0xf7 || op == 0xfe)
        return modrm_reg_form(b, i, n) ? 0 : II_FAULT;   /* ModRM: memory unless mod 3 */
    if ((op < 0x40 && ((op & 7) == 4 || (op & 7) == 5)) || (op >= 0x90 && op <= 0x99) ||
        op == 0x9e || op == 0x9f || op == 0xa8 || op == 0xa9 || (op >= 0xb0 && op <= 0xbf) ||
        op == 0xf5 || op == 0xf8 || op == 0xf9 || op == 0xfc || op == 0xfd)
        return 0;                            /* immediates, xchg/nop, flags, mov imm */
    return II_FAULT;
}

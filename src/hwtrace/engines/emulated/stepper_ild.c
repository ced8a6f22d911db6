/* x86-64 instruction length and control-flow class decoder for the stepper.
 *
 * The ptrace stepper only sees the pc after each trap; to coalesce steps into
 * straight-line runs, to recognise a `rep` string instruction that traps once
 * per iteration, and to spot `syscall`, it must know each instruction's length
 * and class.  This is a 64-bit-mode decoder from the opcode maps of the Intel
 * SDM vol. 2 (appendix A) and AMD's APM vol. 3 (XOP); it decodes lengths, not
 * operands.  Returns the length (1..15) or 0 if the bytes are not a valid
 * 64-bit-mode instruction.
 */
#include <stdint.h>
#include <string.h>
#include "stepper_ild.h"

/* One bit per opcode: does the one-byte-map opcode take a ModRM byte? */
static int has_modrm_1(unsigned op)
{
    if (op < 0x40)
        return (op & 7) < 4;
    switch (op) {
    case 0x62: case 0x63: case 0x69: case 0x6b:
    case 0xc0: case 0xc1: case 0xc6: case 0xc7:
    case 0xd0: case 0xd1: case 0xd2: case 0xd3:
    case 0xf6: case 0xf7: case 0xfe: case 0xff:
        return 1;
    }
    if (op >= 0x80 && op <= 0x8f)
        return 1;
    if (op >= 0xd8 && op <= 0xdf)
        return 1;
    return 0;
}

static int has_modrm_0f(unsigned op)
{
    switch (op) {
    case 0x04: case 0x05: case 0x06: case 0x07: case 0x08: case 0x09:
    case 0x0a: case 0x0b: case 0x0c: case 0x0e:
    case 0x30: case 0x31: case 0x32: case 0x33: case 0x34: case 0x35:
    case 0x36: case 0x37: case 0x77:
    case 0xa0: case 0xa1: case 0xa2: case 0xa8: case 0xa9: case 0xaa:
        return 0;
    }
    if (op >= 0x80 && op <= 0x8f)
        return 0;
    if (op >= 0xc8 && op <= 0xcf)
        return 0;
    return 1;
}

/* Size in bytes of the ModRM/SIB/displacement part starting at p[0]=ModRM
 * (address size 64 or 32: same layout; 16-bit addressing is not available in
 * 64-bit mode). */
static int modrm_len(const uint8_t *p, int avail)
{
    if (avail < 1)
        return -1;
    unsigned modrm = p[0], mod = modrm >> 6, rm = modrm & 7;
    int n = 1;
    if (mod == 3)
        return 1;
    if (rm == 4) {
        if (avail < 2)
            return -1;
        unsigned base = p[1] & 7;
        n = 2;
        if (mod == 0 && base == 5)
            n += 4;
    } else if (mod == 0 && rm == 5) {
        n += 4; /* rip-relative */
    }
    if (mod == 1)
        n += 1;
    else if (mod == 2)
        n += 4;
    return n;
}

int ild_decode(const uint8_t *b, int avail, struct ild *out)
{
    int i = 0, opsz16 = 0, adsz32 = 0, rexw = 0, rep = 0;
    int max = avail < 15 ? avail : 15;
    memset(out, 0, sizeof *out);
    out->kind = K_OTHER;

    for (; i < max; i++) {
        unsigned c = b[i];
        if (c == 0x66) opsz16 = 1;
        else if (c == 0x67) adsz32 = 1;
        else if (c == 0xf2 || c == 0xf3) rep = 1;
        else if (c == 0x26 || c == 0x2e || c == 0x36 || c == 0x3e ||
                 c == 0x64 || c == 0x65 || c == 0xf0) ;
        else if ((c & 0xf0) == 0x40) { rexw = (c & 8) != 0;
            /* REX counts only immediately before the opcode */
            if (i + 1 < max) { unsigned d = b[i + 1];
                if (d == 0x66 || d == 0x67 || d == 0xf2 || d == 0xf3 ||
                    d == 0x26 || d == 0x2e || d == 0x36 || d == 0x3e ||
                    d == 0x64 || d == 0x65 || d == 0xf0 || (d & 0xf0) == 0x40)
                    rexw = 0;
            }
        }
        else break;
    }
    if (i >= max)
        return 0;
    unsigned op = b[i++];
    int modrm = 0, imm = 0, map = 0, n;

    if (op == 0xc4 || op == 0xc5 || op == 0x62 ||
        (op == 0x8f && i < max && ((b[i] >> 3) & 7) != 0)) {
        /* VEX3, VEX2, EVEX, XOP: all take ModRM; imm8 in map 3 (0F3A) */
        int vmap, plen = op == 0xc5 ? 1 : op == 0x62 ? 3 : 2;
        if (i + plen >= max)
            return 0;
        if (op == 0xc5) vmap = 1;
        else if (op == 0x62) vmap = b[i] & 7;
        else vmap = b[i] & 0x1f;
        i += plen;
        unsigned vop = b[i++];
        modrm = 1;
        if (op == 0x8f) { /* XOP maps 8, 9, A */
            if (vmap == 8) imm = 1;
            else if (vmap == 0xa) imm = 4;
        } else {
            if (vmap == 3) imm = 1;
            if (vmap == 1 && ((vop >= 0x70 && vop <= 0x73) || vop == 0xc2 ||
                              (vop >= 0xc4 && vop <= 0xc6)))
                imm = 1;
            if (vmap == 1 && vop == 0x77 && op != 0x62) modrm = 0; /* vzeroupper/all */
        }
        goto operands;
    }

    if (op == 0x0f) {
        if (i >= max)
            return 0;
        unsigned op2 = b[i++];
        if (op2 == 0x38) {
            if (i >= max) return 0;
            i++; modrm = 1;
        } else if (op2 == 0x3a) {
            if (i >= max) return 0;
            i++; modrm = 1; imm = 1;
        } else if (op2 == 0x0f) { /* 3DNow!: ModRM then an opcode byte */
            modrm = 1; imm = 1;
        } else {
            map = 1;
            modrm = has_modrm_0f(op2);
            if (op2 >= 0x80 && op2 <= 0x8f) { imm = 4; out->kind = K_JCC; }
            else if ((op2 >= 0x70 && op2 <= 0x73) || op2 == 0xa4 || op2 == 0xac ||
                     op2 == 0xba || op2 == 0xc2 || (op2 >= 0xc4 && op2 <= 0xc6))
                imm = 1;
            else if (op2 == 0x05 || op2 == 0x34) out->kind = K_SYSCALL;
            else if (op2 == 0x07 || op2 == 0x35) out->kind = K_FAR;
            else if (op2 == 0x0b) out->kind = K_OTHER; /* ud2 faults */
            op = op2;
        }
        goto operands;
    }

    modrm = has_modrm_1(op);
    switch (op) {
    case 0x04: case 0x0c: case 0x14: case 0x1c: case 0x24: case 0x2c:
    case 0x34: case 0x3c: case 0x6a: case 0x6b: case 0x80: case 0x83:
    case 0xa8: case 0xc0: case 0xc1: case 0xc6: case 0xcd:
    case 0xe4: case 0xe5: case 0xe6: case 0xe7:
        imm = 1; break;
    case 0x05: case 0x0d: case 0x15: case 0x1d: case 0x25: case 0x2d:
    case 0x35: case 0x3d: case 0x68: case 0x69: case 0x81: case 0xa9:
    case 0xc7:
        imm = opsz16 ? 2 : 4; break;
    case 0xc2: case 0xca: imm = 2; break;
    case 0xc8: imm = 3; break;
    case 0xa0: case 0xa1: case 0xa2: case 0xa3: imm = adsz32 ? 4 : 8; break;
    case 0xe8: imm = 4; out->kind = K_CALL; break;
    case 0xe9: imm = 4; out->kind = K_JMP; break;
    case 0xeb: imm = 1; out->kind = K_JMP; break;
    case 0xe0: case 0xe1: case 0xe2: case 0xe3: imm = 1; out->kind = K_JCC; break;
    case 0xc3: out->kind = K_RET; break;
    case 0xcb: case 0xcf: out->kind = K_FAR; break;
    case 0xcc: case 0xf1: out->kind = K_INT; break;
    case 0x06: case 0x07: case 0x0e: case 0x16: case 0x17: case 0x1e:
    case 0x1f: case 0x27: case 0x2f: case 0x37: case 0x3f: case 0x60:
    case 0x61: case 0x82: case 0x9a: case 0xce: case 0xd4: case 0xd5:
    case 0xd6: case 0xea:
        return 0; /* invalid in 64-bit mode */
    }
    if (op >= 0x70 && op <= 0x7f) { imm = 1; out->kind = K_JCC; }
    if (op >= 0xb0 && op <= 0xb7) imm = 1;
    if (op >= 0xb8 && op <= 0xbf) imm = rexw ? 8 : opsz16 ? 2 : 4;
    if (op == 0xcd) out->kind = K_INT;
    if (op == 0xca) out->kind = K_FAR;
    if (op == 0xc2) out->kind = K_RET;
    if (rep && ((op >= 0xa4 && op <= 0xa7) || (op >= 0xaa && op <= 0xaf) ||
                (op >= 0x6c && op <= 0x6f)))
        out->kind = K_REPSTR;
    if ((op == 0xf6 || op == 0xf7) && i < max && ((b[i] >> 3) & 7) < 2)
        imm = op == 0xf6 ? 1 : (opsz16 ? 2 : 4);
    if (op == 0xff && i < max) {
        unsigned reg = (b[i] >> 3) & 7;
        if (reg == 2) out->kind = K_CALL_IND;
        else if (reg == 4) out->kind = K_JMP_IND;
        else if (reg == 3 || reg == 5) out->kind = K_FAR;
        else if (reg == 7) return 0;
    }
    (void)map;

operands:
    if (modrm) {
        n = modrm_len(b + i, max - i);
        if (n < 0)
            return 0;
        i += n;
    }
    i += imm;
    if (i > max)
        return 0;
    out->len = i;
    return i;
}

/* The x86 length and class decoder (x86.h): hwtrace.x86's decoder.py
 * and tables.py ported line by line; the comments name the Python
 * they follow.  The tables are built once, the way tables.py builds them. */
#include <string.h>

#include "icache.h"
#include "x86.h"

/* IClass */
enum { XC_OTHER = 1, XC_CALL, XC_RETURN, XC_JUMP, XC_COND_JUMP, XC_FAR_CALL,
       XC_FAR_RETURN, XC_FAR_JUMP, XC_PTWRITE };

/* tables.py's immediate rules and branch codes */
enum { IMM_Z = 16, IMM_V, IMM_F6, IMM_F7, IMM_C7, IMM_0F78, IMM_MOFFS,
       IMM_RELZ, IMM_FAR };
enum { BR_JCC8 = 1, BR_JCCZ = 2, BR_JMP8 = 3, BR_CALLZ = 4, BR_JMPZ = 5,
       BR_FF = 8, BR_0F01 = 9, BR_CR = 10, BR_0FC7 = 11, BR_0FAE = 12,
       BR_C7 = 13, BR_C6 = 14, BR_JMPABS = 15, BR_KIND = 32 };

static uint8_t m0[256], i0[256], b0[256], b0_64[256], b0x2[256];
static uint8_t m1[256], i1[256], b1[256], b1x2[256];
static uint8_t vm1[256], vi1[256], ei4[256];
static uint8_t all1[256], zeros[256], imm32[256];
static uint8_t disp32[256], disp16[256], pfx32[256], pfx64[256];
static uint8_t kclass[K_NKINDS];

struct maptab {
    const uint8_t *m, *i;       /* NULL: invalid map */
};
static struct maptab vex_maps[32], evex_maps[8], xop_maps[32];
static int inited;

static void set_range(uint8_t *t, int lo, int hi, uint8_t v)
{
    for (int o = lo; o < hi; o++)
        t[o] = v;
}

static void set_list(uint8_t *t, uint8_t v, const int *ops, int n)
{
    for (int k = 0; k < n; k++)
        t[ops[k]] = v;
}

#define LIST(t, v, ...) do { \
        static const int ops_[] = {__VA_ARGS__}; \
        set_list(t, v, ops_, (int)(sizeof ops_ / sizeof ops_[0])); \
    } while (0)

static void init(void)
{
    /* map 0 */
    for (int row = 0; row < 0x40; row += 8) {
        set_range(m0, row, row + 4, 1);
        i0[row + 4] = 1;
        i0[row + 5] = IMM_Z;
    }
    LIST(m0, 1, 0x62, 0x63, 0x69, 0x6B, 0xC0, 0xC1, 0xC4, 0xC5, 0xC6, 0xC7,
         0xF6, 0xF7, 0xFE, 0xFF);
    set_range(m0, 0x80, 0x90, 1);
    set_range(m0, 0xD0, 0xD4, 1);
    set_range(m0, 0xD8, 0xE0, 1);
    i0[0x68] = IMM_Z;
    i0[0x69] = IMM_Z;
    i0[0x6A] = 1;
    i0[0x6B] = 1;
    set_range(i0, 0x70, 0x80, 1);
    i0[0x80] = 1;
    i0[0x81] = IMM_Z;
    i0[0x82] = 1;
    i0[0x83] = 1;
    i0[0x9A] = IMM_FAR;
    set_range(i0, 0xA0, 0xA4, IMM_MOFFS);
    i0[0xA8] = 1;
    i0[0xA9] = IMM_Z;
    set_range(i0, 0xB0, 0xB8, 1);
    set_range(i0, 0xB8, 0xC0, IMM_V);
    i0[0xC0] = 1;
    i0[0xC1] = 1;
    i0[0xC2] = 2;
    i0[0xC6] = 1;
    i0[0xC7] = IMM_C7;
    i0[0xC8] = 3;
    i0[0xCA] = 2;
    i0[0xCD] = 1;
    i0[0xD4] = 1;
    i0[0xD5] = 1;
    set_range(i0, 0xE0, 0xE8, 1);
    i0[0xE8] = IMM_RELZ;
    i0[0xE9] = IMM_RELZ;
    i0[0xEA] = IMM_FAR;
    i0[0xEB] = 1;
    i0[0xF6] = IMM_F6;
    i0[0xF7] = IMM_F7;

    set_range(b0, 0x70, 0x80, BR_JCC8);
    b0[0xEB] = BR_JMP8;
    b0[0xE8] = BR_CALLZ;
    b0[0xE9] = BR_JMPZ;
    b0[0xE0] = BR_KIND + K_LOOPNE;
    b0[0xE1] = BR_KIND + K_LOOPE;
    b0[0xE2] = BR_KIND + K_LOOP;
    b0[0xE3] = BR_KIND + K_JRCXZ;
    b0[0xC2] = BR_KIND + K_RET_IMM;
    b0[0xC3] = BR_KIND + K_RET;
    b0[0xCA] = BR_KIND + K_RETF_IMM;
    b0[0xCB] = BR_KIND + K_RETF;
    b0[0xCC] = BR_KIND + K_INT3;
    b0[0xCD] = BR_KIND + K_INT;
    b0[0xCE] = BR_KIND + K_INTO;
    b0[0xCF] = BR_KIND + K_IRET;
    b0[0xF1] = BR_KIND + K_INT1;
    b0[0xF4] = BR_KIND + K_HLT;
    b0[0x9A] = BR_KIND + K_CALL_FAR;
    b0[0xEA] = BR_KIND + K_JMP_FAR;
    b0[0xFF] = BR_FF;
    b0[0xC7] = BR_C7;
    b0[0xC6] = BR_C6;

    /* map 1 */
    memset(m1, 1, sizeof m1);
    LIST(m1, 0, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0E,
         0x77, 0x7A, 0x7B, 0xA0, 0xA1, 0xA2, 0xA8, 0xA9, 0xAA);
    set_range(m1, 0x24, 0x28, 0);
    set_range(m1, 0x30, 0x40, 0);
    set_range(m1, 0x80, 0x90, 0);
    set_range(m1, 0xC8, 0xD0, 0);
    set_range(m1, 0x20, 0x24, 2);
    m1[0xA6] = 2;
    m1[0xA7] = 2;
    set_range(i1, 0x70, 0x74, 1);
    LIST(i1, 1, 0xA4, 0xAC, 0xBA, 0xC2, 0xC4, 0xC5, 0xC6);
    i1[0x78] = IMM_0F78;
    set_range(i1, 0x80, 0x90, IMM_RELZ);

    memcpy(vm1, m1, sizeof vm1);
    vm1[0x0F] = 0;
    set_range(vi1, 0x70, 0x74, 1);
    LIST(vi1, 1, 0xC2, 0xC4, 0xC5, 0xC6);

    m1[0x0F] = 1;               /* 3DNow! */
    i1[0x0F] = 1;

    set_range(b1, 0x80, 0x90, BR_JCCZ);
    b1[0x05] = BR_KIND + K_SYSCALL;
    b1[0x07] = BR_KIND + K_SYSRET;
    b1[0x34] = BR_KIND + K_SYSENTER;
    b1[0x35] = BR_KIND + K_SYSEXIT;
    b1[0x0B] = BR_KIND + K_UD;
    b1[0xB9] = BR_KIND + K_UD;
    b1[0xFF] = BR_KIND + K_UD;
    b1[0xAA] = BR_KIND + K_RSM;
    b1[0x01] = BR_0F01;
    b1[0x22] = BR_CR;
    b1[0xC7] = BR_0FC7;
    b1[0xAE] = BR_0FAE;

    LIST(ei4, 1, 0x24, 0x2C, 0x6B, 0x80, 0x83, 0xC0, 0xC1, 0xD4);
    ei4[0x69] = IMM_Z;
    ei4[0x81] = IMM_Z;
    ei4[0xF6] = IMM_F6;
    ei4[0xF7] = IMM_F7;

    memset(all1, 1, sizeof all1);
    memset(imm32, 4, sizeof imm32);

    memcpy(b0_64, b0, sizeof b0);
    b0_64[0x9A] = b0_64[0xEA] = b0_64[0xCE] = 0;

    /* REX2 (decoder.py's B0X2 / B1X2; 64-bit mode only) */
    memcpy(b0x2, b0_64, sizeof b0x2);
    set_range(b0x2, 0x70, 0x80, 0);
    LIST(b0x2, 0, 0xE0, 0xE1, 0xE2, 0xE3, 0xE8, 0xE9, 0xEA, 0xEB);
    b0x2[0xA1] = BR_JMPABS;
    memcpy(b1x2, b1, sizeof b1x2);
    set_range(b1x2, 0x80, 0x90, 0);
    b1x2[0x34] = b1x2[0x35] = 0;

    vex_maps[1] = (struct maptab){vm1, vi1};
    vex_maps[2] = (struct maptab){all1, zeros};
    vex_maps[3] = (struct maptab){all1, all1};
    vex_maps[4] = vex_maps[5] = vex_maps[6] = (struct maptab){zeros, zeros};
    vex_maps[7] = (struct maptab){all1, imm32};
    evex_maps[1] = (struct maptab){all1, vi1};
    evex_maps[2] = (struct maptab){all1, zeros};
    evex_maps[3] = (struct maptab){all1, all1};
    evex_maps[4] = (struct maptab){all1, ei4};
    evex_maps[5] = evex_maps[6] = (struct maptab){all1, zeros};
    evex_maps[7] = (struct maptab){all1, imm32};
    xop_maps[8] = (struct maptab){all1, all1};
    xop_maps[9] = (struct maptab){all1, zeros};
    xop_maps[10] = (struct maptab){all1, imm32};

    for (int m = 0; m < 256; m++) {
        int mod = m >> 6, rm = m & 7;
        if (mod == 3)
            continue;
        if (mod == 0) {
            disp32[m] = rm == 4 ? 8 : (rm == 5 ? 4 : 0);
            disp16[m] = rm == 6 ? 2 : 0;
        } else if (mod == 1) {
            disp32[m] = rm == 4 ? 9 : 1;
            disp16[m] = 1;
        } else {
            disp32[m] = rm == 4 ? 12 : 4;
            disp16[m] = 2;
        }
    }

    pfx32[0x66] = 1;
    pfx32[0x67] = 2;
    LIST(pfx32, 3, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0xF0);
    pfx32[0xF2] = 4;
    pfx32[0xF3] = 5;
    memcpy(pfx64, pfx32, sizeof pfx64);
    set_range(pfx64, 0x40, 0x50, 6);

    /* tables.py _CLASS */
    for (int k = 0; k < K_NKINDS; k++)
        kclass[k] = XC_OTHER;
    kclass[K_CALL_REL] = kclass[K_CALL_IND] = XC_CALL;
    kclass[K_JMP_REL] = kclass[K_JMP_IND] = kclass[K_JMPABS] = XC_JUMP;
    kclass[K_JCC] = kclass[K_JRCXZ] = kclass[K_LOOP] = kclass[K_LOOPE] =
        kclass[K_LOOPNE] = XC_COND_JUMP;
    kclass[K_RET] = kclass[K_RET_IMM] = XC_RETURN;
    kclass[K_CALL_FAR] = kclass[K_CALL_FAR_IND] = kclass[K_SYSCALL] =
        kclass[K_SYSENTER] = kclass[K_INT] = kclass[K_INT3] =
        kclass[K_INTO] = kclass[K_INT1] = kclass[K_VMCALL] = XC_FAR_CALL;
    kclass[K_JMP_FAR] = kclass[K_JMP_FAR_IND] = XC_FAR_JUMP;
    kclass[K_RETF] = kclass[K_RETF_IMM] = kclass[K_IRET] =
        kclass[K_SYSRET] = kclass[K_SYSEXIT] = kclass[K_VMLAUNCH] =
        kclass[K_VMRESUME] = kclass[K_ERETU] = kclass[K_ERETS] =
        kclass[K_UIRET] = XC_FAR_RETURN;
    kclass[K_PTWRITE] = XC_PTWRITE;
    inited = 1;
}

static inline int32_t rd_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);           /* little-endian hosts only (x86-64) */
    return v;
}

static inline int16_t rd_i16(const uint8_t *p)
{
    int16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* a read of code[k] (decoder.py: an IndexError past the end) */
#define X_NEED(k) do { if ((size_t)(k) >= n) goto short_read; } while (0)

int x86_decode(const uint8_t *c, size_t n, int mode, struct x86_insn *o,
               int *needed)
{
    if (!inited)
        init();
    const int is64 = mode == 3, d16 = mode == 1;
    const uint8_t *PFX = is64 ? pfx64 : pfx32;
    const uint8_t *B0 = is64 ? b0_64 : b0;
    const uint8_t *M, *I, *B;
    size_t i = 0;
    int osz = 0, asz = 0, rex = 0, last = 0, f3 = 0;
    unsigned b, p;

    X_NEED(i);
    b = c[i];
    p = PFX[b];
    while (p) {
        if (p == 6) {
            rex = (int)b;
        } else {
            rex = 0;
            if (p == 1)
                osz = 1;
            else if (p == 2)
                asz = 1;
            else if (p == 4)
                last = 2;
            else if (p == 5) {
                last = 3;
                f3 = 1;
            }
        }
        i++;
        if (i >= 15)
            return X86_INVALID;         /* too many prefixes */
        X_NEED(i);
        b = c[i];
        p = PFX[b];
    }
    i++;
    int s = 0;
    if (b == 0xC5)
        s = 1;
    else if (b == 0xC4)
        s = 2;
    else if (b == 0x62)
        s = 3;
    else if (b == 0x8F)
        s = 4;
    else if (b == 0xD5 && is64)
        s = 5;
    if (b == 0x0F) {
        X_NEED(i);
        b = c[i++];
        if (b == 0x38) {
            M = all1, I = zeros, B = zeros;
            X_NEED(i);
            b = c[i++];
        } else if (b == 0x3A) {
            M = all1, I = all1, B = zeros;
            X_NEED(i);
            b = c[i++];
        } else if ((b & 0xF8) == 0x38) {
            return X86_INVALID;         /* no opcode map 0F 39, 0F 3B-3F */
        } else {
            M = m1, I = i1, B = b1;
        }
    } else if (s == 5) {                /* REX2 (64-bit mode) */
        X_NEED(i);
        unsigned pl = c[i];
        rex = (int)((pl & 8) | ((pl & 0x44) ? 4 : 0));
        X_NEED(i + 1);
        b = c[i + 1];
        i += 2;
        if (pl & 0x80)
            M = m1, I = i1, B = b1x2;
        else
            M = m0, I = i0, B = b0x2;
    } else if (s) {
        X_NEED(i);
        unsigned p1 = c[i];
        if (s == 4 && !(p1 & 0x18)) {
            M = m0, I = i0, B = B0;     /* 8F /0: pop r/m */
        } else if (s != 4 && !is64 && p1 < 0xC0) {
            M = m0, I = i0, B = B0;     /* LES / LDS / BOUND */
        } else {
            B = zeros;
            if (s == 1) {               /* VEX2 */
                X_NEED(i + 1);
                b = c[i + 1];
                i += 2;
                M = vm1, I = vi1;
            } else {
                X_NEED(i + 1);
                unsigned p2 = c[i + 1];
                const struct maptab *t;
                if (s == 3) {           /* EVEX */
                    X_NEED(i + 2);
                    X_NEED(i + 3);
                    b = c[i + 3];
                    i += 4;
                    t = &evex_maps[p1 & 7];
                    if ((p2 & 3) == 1)
                        osz = 1;
                } else {                /* VEX3 / XOP */
                    X_NEED(i + 2);
                    b = c[i + 2];
                    i += 3;
                    t = &(s == 2 ? vex_maps : xop_maps)[p1 & 0x1F];
                }
                if (!t->m)
                    return X86_INVALID; /* invalid VEX/EVEX/XOP map */
                M = t->m, I = t->i;
                rex = (int)((p2 >> 4) & 8);
            }
        }
    } else {
        M = m0, I = i0, B = B0;
    }

    int mr = M[b];
    int d = 0;
    unsigned modrm = 0;
    if (mr) {
        X_NEED(i);
        modrm = c[i++];
        if (modrm < 0xC0 && mr == 1) {
            if (!is64 && asz != d16) {
                d = disp16[modrm];
            } else {
                d = disp32[modrm];
                if (d >= 8) {
                    if (d == 8) {
                        X_NEED(i);
                        d = (c[i] & 7) == 5 ? 4 : 0;
                    } else {
                        d -= 8;
                    }
                    i++;
                }
            }
            i += (size_t)d;
        }
    }
    int im = I[b];
    if (im) {
        if (im < 16) {
            i += (size_t)im;
        } else {
            int z;
            if (is64)
                z = (osz && !(rex & 8)) ? 2 : 4;
            else
                z = osz != d16 ? 2 : 4;
            switch (im) {
            case IMM_RELZ:
                i += is64 ? 4 : (size_t)z;
                break;
            case IMM_Z:
                i += (size_t)z;
                break;
            case IMM_V:
                i += (is64 && (rex & 8)) ? 8 : (size_t)z;
                break;
            case IMM_F6:
                if ((modrm & 0x38) < 0x10)
                    i += 1;
                break;
            case IMM_F7:
                if ((modrm & 0x38) < 0x10)
                    i += (size_t)z;
                break;
            case IMM_C7: {
                unsigned r = modrm & 0x38;
                if (r == 0 || (r == 0x38 && d == 0))
                    i += (size_t)z;
                break;
            }
            case IMM_MOFFS:
                if (is64)
                    i += asz ? 4 : 8;
                else
                    i += asz != d16 ? 2 : 4;
                break;
            case IMM_FAR:
                i += (size_t)z + 2;
                break;
            case IMM_0F78:
                if (osz || last == 2)
                    i += 2;
                break;
            }
        }
    }
    size_t sz = i;
    if (sz > 15)
        return X86_INVALID;             /* longer than 15 bytes */
    if (i > n) {
        *needed = (int)sz;
        return X86_TRUNC;
    }
    o->size = (uint8_t)sz;
    o->rel = 0;
    int k = K_OTHER;
    int br = B[b];
    if (!br) {
        k = K_OTHER;
    } else if (br == BR_JCC8) {
        k = K_JCC;
        o->rel = (int8_t)c[i - 1];
    } else if (br >= BR_KIND) {
        k = br - BR_KIND;
        if (k < K_JMPABS)               /* loop* / jrcxz */
            o->rel = (int8_t)c[i - 1];
    } else if (br == BR_CALLZ || br == BR_JMPZ || br == BR_JCCZ) {
        if (is64 || osz == d16)
            o->rel = rd_i32(c + i - 4);
        else
            o->rel = rd_i16(c + i - 2);
        k = br == BR_CALLZ ? K_CALL_REL : br == BR_JMPZ ? K_JMP_REL : K_JCC;
    } else if (br == BR_JMP8) {
        k = K_JMP_REL;
        o->rel = (int8_t)c[i - 1];
    } else if (br == BR_FF) {
        static const uint8_t ff[8] = {K_OTHER, K_OTHER, K_CALL_IND,
                                      K_CALL_FAR_IND, K_JMP_IND,
                                      K_JMP_FAR_IND, K_OTHER, K_OTHER};
        k = ff[(modrm >> 3) & 7];
    } else if (br == BR_0F01) {
        switch (modrm) {
        case 0xC1: k = K_VMCALL; break;
        case 0xC2: k = K_VMLAUNCH; break;
        case 0xC3: k = K_VMRESUME; break;
        case 0xC4: k = K_VMXOFF; break;
        case 0xD4: k = K_VMFUNC; break;
        case 0xD5: k = K_XEND; break;
        case 0xEC: k = K_UIRET; break;
        case 0xCA:
            if (last)
                k = last == 2 ? K_ERETS : K_ERETU;
            break;
        }
    } else if (br == BR_CR) {
        if ((modrm & 0x38) == 0x18 && !(rex & 4))
            k = K_MOV_CR3;
    } else if (br == BR_0FC7) {
        if (modrm < 0xC0 && (modrm & 0x38) == 0x30)
            k = osz ? K_VMCLEAR : (f3 ? K_VMXON : K_VMPTRLD);
    } else if (br == BR_0FAE) {
        if (f3 && !osz && (modrm & 0x38) == 0x20)
            k = K_PTWRITE;
    } else if (br == BR_C7) {
        if (modrm == 0xF8) {
            int w16 = is64 ? (osz && !(rex & 8)) : (osz != d16);
            k = K_XBEGIN;
            o->rel = w16 ? rd_i16(c + i - 2) : rd_i32(c + i - 4);
        }
    } else if (br == BR_C6) {
        if (modrm == 0xF8)
            k = K_XABORT;
    } else if (br == BR_JMPABS) {
        if (!(rex & 8) && !asz && !osz) {
            uint64_t t;
            memcpy(&t, c + i - 8, 8);
            o->rel = (int64_t)t;
            k = K_JMPABS;
        }
    }
    o->kind = (uint8_t)k;
    o->iclass = kclass[k];
    return X86_OK;

short_read:
    if (n >= 15)
        return X86_INVALID;
    *needed = (int)n + 1;
    return X86_TRUNC;
}

int x86_flags(const struct x86_insn *x)
{
    int c = x->iclass, k = x->kind, f = 0;
    int branch = c >= XC_CALL && c <= XC_FAR_JUMP;
    int direct = k >= K_CALL_REL && k <= K_LOOPNE;
    if (branch && !direct)      /* tables.kind_template; JMPABS included */
        f |= IF_INDIRECT;
    if (c >= XC_FAR_CALL && c <= XC_FAR_JUMP)
        f |= IF_FAR;
    switch (k) {                /* fetch.changes_cpl */
    case K_INT: case K_INT3: case K_INT1: case K_INTO: case K_IRET:
    case K_SYSCALL: case K_SYSENTER: case K_SYSEXIT: case K_SYSRET:
    case K_ERETU: case K_ERETS:
        f |= IF_CPL;
        break;
    case K_MOV_CR3:
        f |= IF_CR3;
        break;
    case K_VMPTRLD: case K_VMCLEAR: case K_VMXON:
        f |= IF_VMPTRLD;
        break;
    case K_VMLAUNCH: case K_VMRESUME:
        f |= IF_VMENTRY;
        break;
    }
    return f;
}

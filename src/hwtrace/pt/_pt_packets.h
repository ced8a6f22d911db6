/* Intel PT packet scanning in plain C (no Python): the decoding rules of
 * hwtrace/pt/decoder.py, shared by the compiled cores.
 *
 *   int r = pt_pt_decode_at(buf, pos, end, flags, &pkt);
 *       r > 0: a packet of kind pkt.kind; the record's size is pkt.size and
 *              the next packet starts at pos + r (they differ only for the
 *              SKD007 CYC+OVF, 2 vs 3); payload fields in pkt.f[] in the
 *              order of the record's fields (hwtrace.pt.packets)
 *       r < 0: PT_EOS (cut off by the end: the normal end of a stream),
 *              PT_BAD_OPC, PT_BAD_PACKET
 *   pt_pt_find_psb(buf, end, start)     libipt's aligned PSB search, or -1
 *   pt_pt_resync_start(pos, sync)       where sync_forward() searches from
 *
 * Positions are byte offsets into buf[0:end).  This header is part of the
 * fingerprint of every _c_*.c next to it (see hwtrace/_ext).
 */
#ifndef HWTRACE_PT_PACKETS_H
#define HWTRACE_PT_PACKETS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    PT_FLAG_SKD007 = 1,   /* CYC + 0xf3 decodes as OVF (3 bytes consumed) */
    PT_FLAG_SKZ84 = 2,    /* a TMA with reserved bits is an 8-byte Invalid */
    PT_FLAG_NO_CFE = 4,   /* packet types decoded as unknown opcodes */
    PT_FLAG_NO_EVD = 8,
    PT_FLAG_NO_TRIG = 16,
};

/* Results of pt_decode_at(): > 0 bytes consumed, or one of these. */
enum { PT_EOS = -1, PT_BAD_OPC = -2, PT_BAD_PACKET = -3 };

enum pt_kind {
    PT_K_PAD, PT_K_PSB, PT_K_PSBEND, PT_K_OVF, PT_K_STOP, PT_K_TNT8, PT_K_TNT64, PT_K_TIP,
    PT_K_TIP_PGE, PT_K_TIP_PGD, PT_K_FUP, PT_K_MODE_EXEC, PT_K_MODE_TSX, PT_K_PIP, PT_K_TSC,
    PT_K_CBR, PT_K_TMA, PT_K_MTC, PT_K_CYC, PT_K_VMCS, PT_K_MNT, PT_K_EXSTOP, PT_K_MWAIT, PT_K_PWRE,
    PT_K_PWRX, PT_K_PTW, PT_K_CFE, PT_K_EVD, PT_K_TRIG, PT_K_INVALID, PT_K_COUNT
};

/* payload fields per kind (records have offset, size, then these) */
static const unsigned char pt_kind_nfields[PT_K_COUNT] = {
    0, 0, 0, 0, 0, 2, 2, 2,
    2, 2, 2, 3, 2, 2, 1,
    1, 2, 1, 1, 1, 1, 1, 2, 3,
    5, 3, 3, 2, 5, 1};

struct pt_pkt {
    int kind;
    int size;           /* the record's size (SKD007: 2, consumes 3) */
    uint64_t f[5];
};

static const uint8_t pt_psb_bytes[16] = {
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82};

static inline uint64_t pt_le(const uint8_t *s, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | s[i];
    return v;
}

static inline int pt_bitlen(uint64_t v)
{
    return v ? 64 - __builtin_clzll(v) : 0;
}

#define NEED(n) do { if (p + (n) > e) return PT_EOS; } while (0)
#define OUT(k, sz) (out->kind = (k), out->size = (sz))

static inline int pt_decode_cyc(const uint8_t *b, ptrdiff_t p, ptrdiff_t e,
                      struct pt_pkt *out)
{
    uint8_t v = b[p];
    uint64_t value = v >> 3;
    if (!(v & 4)) {
        OUT(PT_K_CYC, 1);
        out->f[0] = value;
        return 1;
    }
    ptrdiff_t q = p + 1;
    int shl = 5;
    for (;;) {
        if (q >= e)
            return PT_EOS;
        uint8_t x = b[q++];
        if (shl < 64)
            value |= (uint64_t)(x >> 1) << shl;
        shl += 7;
        if (shl > 64)
            return PT_BAD_PACKET;
        if (!(x & 1)) {
            OUT(PT_K_CYC, (int)(q - p));
            out->f[0] = value;
            return (int)(q - p);
        }
    }
}

static inline int pt_decode_ext(const uint8_t *b, ptrdiff_t p, ptrdiff_t e,
                      unsigned flags, struct pt_pkt *out)
{
    if (p + 1 >= e)
        return PT_EOS;
    uint8_t x = b[p + 1];
    uint64_t *f = out->f;
    if ((x & 0x1f) == 0x12) {           /* PTW */
        int plc = (x >> 5) & 3, n;
        if (plc == 0)
            n = 4;
        else if (plc == 1)
            n = 8;
        else
            return PT_BAD_PACKET;
        NEED(2 + n);
        OUT(PT_K_PTW, 2 + n);
        f[0] = plc; f[1] = pt_le(b + p + 2, n); f[2] = x >> 7;
        return 2 + n;
    }
    switch (x) {
    case 0x82:
        NEED(16);
        if (memcmp(b + p, pt_psb_bytes, 16))
            return PT_BAD_PACKET;
        OUT(PT_K_PSB, 16);
        return 16;
    case 0x23: OUT(PT_K_PSBEND, 2); return 2;
    case 0xf3: OUT(PT_K_OVF, 2); return 2;
    case 0x83: OUT(PT_K_STOP, 2); return 2;
    case 0xa3: {
        NEED(8);
        uint64_t v = pt_le(b + p + 2, 6);
        int n = pt_bitlen(v) - 1;
        if (n <= 0)
            return PT_BAD_PACKET;
        OUT(PT_K_TNT64, 8);
        f[0] = n; f[1] = v ^ ((uint64_t)1 << n);
        return 8;
    }
    case 0x43: {
        NEED(8);
        uint64_t v = pt_le(b + p + 2, 6);
        OUT(PT_K_PIP, 8);
        f[0] = (v >> 1) << 5; f[1] = v & 1;
        return 8;
    }
    case 0x03:
        NEED(4);
        OUT(PT_K_CBR, 4);
        f[0] = b[p + 2];
        return 4;
    case 0x73: {
        NEED(7);
        unsigned fc = b[p + 5] | (unsigned)b[p + 6] << 8;
        if ((fc & ~0x1ffu) || b[p + 4]) {
            if (!(flags & PT_FLAG_SKZ84))
                return PT_BAD_PACKET;
            OUT(PT_K_INVALID, 8);
            f[0] = 0;
            return 8;       /* may run past the end, like the twin */
        }
        OUT(PT_K_TMA, 7);
        f[0] = b[p + 2] | (unsigned)b[p + 3] << 8; f[1] = fc;
        return 7;
    }
    case 0xc8:
        NEED(7);
        OUT(PT_K_VMCS, 7);
        f[0] = pt_le(b + p + 2, 5) << 12;
        return 7;
    case 0xc3:
        if (p + 2 >= e)
            return PT_EOS;
        if (b[p + 2] != 0x88)
            return PT_BAD_OPC;
        NEED(11);
        OUT(PT_K_MNT, 11);
        f[0] = pt_le(b + p + 3, 8);
        return 11;
    case 0x62:
    case 0xe2:
        OUT(PT_K_EXSTOP, 2);
        f[0] = x >> 7;
        return 2;
    case 0xc2:
        NEED(10);
        OUT(PT_K_MWAIT, 10);
        f[0] = pt_le(b + p + 2, 4); f[1] = pt_le(b + p + 6, 4);
        return 10;
    case 0x22: {
        NEED(4);
        uint8_t v = b[p + 3];
        OUT(PT_K_PWRE, 4);
        f[0] = v >> 4; f[1] = v & 0xf; f[2] = (b[p + 2] >> 3) & 1;
        return 4;
    }
    case 0xa2: {
        NEED(7);
        uint8_t v = b[p + 2], w = b[p + 3];
        OUT(PT_K_PWRX, 7);
        f[0] = v >> 4; f[1] = v & 0xf; f[2] = w & 1;
        f[3] = (w >> 2) & 1; f[4] = (w >> 3) & 1;
        return 7;
    }
    case 0x13:
        if (flags & PT_FLAG_NO_CFE)
            return PT_BAD_OPC;
        NEED(4);
        OUT(PT_K_CFE, 4);
        f[0] = b[p + 2] & 0x1f; f[1] = b[p + 3]; f[2] = b[p + 2] >> 7;
        return 4;
    case 0x53:
        if (flags & PT_FLAG_NO_EVD)
            return PT_BAD_OPC;
        NEED(11);
        OUT(PT_K_EVD, 11);
        f[0] = b[p + 2] & 0x1f; f[1] = pt_le(b + p + 3, 8);
        return 11;
    default:
        return PT_BAD_OPC;
    }
}

/* payload bytes per IP compression; -1: reserved (unknown packet) */
static const signed char pt_ipc_size[8] = {0, 2, 4, 6, 6, -1, 8, -1};

/* Decode the packet at b[p] (p < e).  Returns the bytes consumed (> 0)
 * with *out filled in, or an R_* error. */
static inline int pt_decode_at(const uint8_t *b, ptrdiff_t p, ptrdiff_t e,
                            unsigned flags, struct pt_pkt *out)
{
    uint8_t x = b[p];
    uint64_t *f = out->f;
    if (!(x & 1)) {
        if (x >= 4) {                   /* TNT-8 */
            unsigned v = x >> 1;
            int n = pt_bitlen(v) - 1;
            OUT(PT_K_TNT8, 1);
            f[0] = n; f[1] = v ^ (1u << n);
            return 1;
        }
        if (x == 0) {
            OUT(PT_K_PAD, 1);
            return 1;
        }
        return pt_decode_ext(b, p, e, flags, out);
    }
    if ((x & 3) == 3) {
        int r = pt_decode_cyc(b, p, e, out);
        if ((flags & PT_FLAG_SKD007) && r == 2 && (f[0] & ~(uint64_t)0x1f) == 0x20
                && p + 2 < e && b[p + 2] == 0xf3) {
            OUT(PT_K_OVF, 2);
            return 3;
        }
        return r;
    }
    int k;
    switch (x & 0x1f) {
    case 0x0d: k = PT_K_TIP; break;
    case 0x11: k = PT_K_TIP_PGE; break;
    case 0x01: k = PT_K_TIP_PGD; break;
    case 0x1d: k = PT_K_FUP; break;
    default:
        switch (x) {
        case 0x99:
            NEED(2);
            {
                uint8_t v = b[p + 1];
                if ((v & 0xe0) == 0) {
                    OUT(PT_K_MODE_EXEC, 2);
                    f[0] = v & 1; f[1] = (v >> 1) & 1; f[2] = (v >> 2) & 1;
                    return 2;
                }
                if ((v & 0xe0) == 0x20) {
                    OUT(PT_K_MODE_TSX, 2);
                    f[0] = v & 1; f[1] = (v >> 1) & 1;
                    return 2;
                }
                return PT_BAD_PACKET;
            }
        case 0x19:
            NEED(8);
            OUT(PT_K_TSC, 8);
            f[0] = pt_le(b + p + 1, 7);
            return 8;
        case 0x59:
            NEED(2);
            OUT(PT_K_MTC, 2);
            f[0] = b[p + 1];
            return 2;
        case 0xd9:
            if (flags & PT_FLAG_NO_TRIG)
                return PT_BAD_OPC;
            NEED(3);
            {
                uint8_t fl = b[p + 1];
                int n = (fl & 0x40) ? 5 : 3;
                NEED(n);
                OUT(PT_K_TRIG, n);
                f[0] = b[p + 2];
                f[1] = n == 5 ? (b[p + 3] | (unsigned)b[p + 4] << 8) : 0;
                f[2] = fl >> 7; f[3] = n == 5; f[4] = (fl >> 5) & 1;
                return n;
            }
        default:
            return PT_BAD_OPC;
        }
    }
    int ipc = x >> 5, n = pt_ipc_size[ipc];
    if (n < 0)
        return PT_BAD_PACKET;
    NEED(n + 1);
    OUT(k, n + 1);
    f[0] = ipc; f[1] = n ? pt_le(b + p + 1, n) : 0;
    return n + 1;
}

/* libipt's pt_find_psb around an aligned PSB-pattern word at pos. */
static inline ptrdiff_t pt_psb_around_word(const uint8_t *b, ptrdiff_t end,
                                  ptrdiff_t pos)
{
    if (b[pos] != 0x02)
        pos++;
    while (pos + 1 < end && b[pos] == 0x02 && b[pos + 1] == 0x82)
        pos += 2;
    pos -= 16;
    if (pos < 0 || memcmp(b + pos, pt_psb_bytes, 16))
        return -1;
    return pos;
}

static inline ptrdiff_t pt_find_psb(const uint8_t *b, ptrdiff_t end, ptrdiff_t start)
{
    static const uint8_t w1[8] = {2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82};
    static const uint8_t w2[8] = {0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2};
    for (ptrdiff_t i = (start + 7) & ~(ptrdiff_t)7; i + 8 <= end; i += 8) {
        if (b[i] != 2 && b[i] != 0x82)
            continue;
        if (memcmp(b + i, w1, 8) && memcmp(b + i, w2, 8))
            continue;
        ptrdiff_t found = pt_psb_around_word(b, end, i);
        if (found >= start)
            return found;
    }
    return -1;
}

/* Where the twin's sync_forward() searches from, given (pos, sync). */
static inline ptrdiff_t pt_resync_start(ptrdiff_t pos, ptrdiff_t sync)
{
    if (pos == sync)
        pos += 16;
    return pos - (pos < 15 ? pos : 15);
}

#endif

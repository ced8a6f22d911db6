/* Shared definitions of the compiled flow core (no Python here).
 *
 * The core is a port of the Python flow decoders, layer by layer, with the
 * same state and the same decisions:
 *
 *   timing.h   hwtrace.pt.timing + hwtrace.flow.timing   (time, calibration)
 *   event.h    hwtrace.flow.events                       (events, queues)
 *   query.h    hwtrace.flow.query, psb, overflow, power, evtrace, evtpos
 *   icache.h   hwtrace.flow.fetch (the instruction cache, filled by a callback)
 *   insn.h     hwtrace.flow.insn + evtrace_insn          (instruction decoder)
 *   block.h    hwtrace.flow.block                        (block decoder, runs)
 *   session.h  hwtrace.flow.session                      (the drive loop, sinks)
 *   segment.h  checkpoints of the parallel counts path   (fast_parallel)
 *
 * Errors: functions return 0 (or a value >= 0) on success and -E_* on
 * failure, where the Python twin raises Fail / _Err or returns a PtError /
 * DecodeError with that libipt message.  E_PYERR means a callback into
 * Python failed (an exception is set): the decode stops and it propagates.
 */
#ifndef HWTRACE_CORE_COMMON_H
#define HWTRACE_CORE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../../pt/_pt_packets.h"

/* libipt's error strings (hwtrace.pt.errors), by number */
enum {
    E_OK = 0, E_INTERNAL, E_INVALID, E_NOSYNC, E_BAD_OPC, E_BAD_PACKET,
    E_BAD_CONTEXT, E_EOS, E_BAD_QUERY, E_NOMEM, E_BAD_CONFIG, E_NOIP,
    E_IP_SUPPRESSED, E_NOMAP, E_BAD_INSN, E_NO_TIME, E_NO_CBR, E_BAD_IMAGE,
    E_BAD_LOCK, E_NOT_SUPPORTED, E_RETSTACK_EMPTY, E_BAD_RETCOMP,
    E_BAD_STATUS_UPDATE, E_NO_ENABLE, E_EVENT_IGNORED, E_OVERFLOW,
    E_BAD_FILE, E_BAD_CPU, E_TRACELESS_LOOP,
    E_NCODES,
    /* not decode results: the decode stops */
    E_PYERR = 100,          /* a Python callback raised */
    E_STOP = 101,           /* a sink asked to stop (segment jobs) */
};

const char *core_errstr(int code);

#define TRY(x) do { int r_ = (x); if (r_ < 0) return r_; } while (0)

/* status flags (hwtrace.flow.status) */
enum { ST_IP_SUPPRESSED = 1, ST_EVENT_PENDING = 2, ST_EOS = 4,
       ST_DEFERRED = 0x80 };

/* IClass (hwtrace.x86.insn.IClass) */
enum { C_UNKNOWN = 0, C_OTHER = 1, C_CALL = 2, C_RETURN = 3, C_JUMP = 4,
       C_COND = 5, C_FAR_CALL = 6, C_FAR_RETURN = 7, C_FAR_JUMP = 8,
       C_PTWRITE = 9 };

/* execution modes: -1 None (unknown, or MODE.EXEC's reserved value, which
 * the twin also calls None), 0 16-bit, 1 32-bit, 2 64-bit */
#define MODE_NONE (-1)

/* FlowConfig */
struct core_config {
    /* errata */
    unsigned bdm70 : 1, bdm64 : 1, skd007 : 1, skd022 : 1, skd010 : 1,
             skl014 : 1, apl12 : 1, apl11 : 1, skl168 : 1, skz84 : 1;
    unsigned tick : 1, iflags : 1, keep_tcal : 1, offsets20 : 1,
             end_on_call : 1, end_on_jump : 1;
    unsigned strict : 1;        /* libipt 2.3's strict reading (issue 16) */
    unsigned pflags;            /* packet decoder flags (SKD007, SKZ84) */
    uint64_t addr_cfg;
    uint64_t addr_a[4], addr_b[4];
    uint64_t mtc_freq, nom_freq, eax, ebx;
};

/* FlowConfig.psb_fup_announces_pge: a PSB+ FUP that a TIP.PGE follows
 * announces where tracing will resume (BDM70's reading, and hwtrace's
 * unless strict) */
static inline int psb_fup_announces_pge(const struct core_config *c)
{
    return c->bdm70 || !c->strict;
}

/* AddrFilter.check */
static inline int addr_filter_check(const struct core_config *c,
                                    uint64_t addr)
{
    int have = 0;
    for (int n = 0; n < 4; n++) {
        if (((c->addr_cfg >> (4 * n)) & 0xf) != 1)
            continue;
        have = 1;
        if (c->addr_a[n] <= addr && addr <= c->addr_b[n])
            return 1;
    }
    return !have;
}

/* x << n with Python's arbitrary precision reduced mod 2**64 */
static inline uint64_t shl64(uint64_t x, uint64_t n)
{
    return n >= 64 ? 0 : x << n;
}

#endif

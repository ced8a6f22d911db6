/* Decoder events (hwtrace.flow.events.Event) and the event queue.
 *
 * An event is a value here (copied where the twin passes the object on;
 * no event is referenced from two places while it can still change).
 * ``set`` records which of the optional attributes the twin has set on
 * its object (``EA_*``), so the Python Event built from it carries exactly
 * the same attributes. */
#ifndef HWTRACE_CORE_EVENT_H
#define HWTRACE_CORE_EVENT_H

#include "common.h"

enum ev_type {
    EV_ENABLED, EV_DISABLED, EV_ASYNC_DISABLED, EV_ASYNC_BRANCH, EV_PAGING,
    EV_ASYNC_PAGING, EV_OVERFLOW, EV_EXEC_MODE, EV_TSX, EV_STOP, EV_VMCS,
    EV_ASYNC_VMCS, EV_EXSTOP, EV_MWAIT, EV_PWRE, EV_PWRX, EV_PTWRITE,
    EV_TICK, EV_CBR, EV_MNT, EV_IFLAGS,
    /* event trace (CFE): evtrace.TYPES */
    EV_INTERRUPT, EV_IRET, EV_SMI, EV_RSM, EV_SIPI, EV_INIT, EV_VMENTRY,
    EV_VMEXIT, EV_SHUTDOWN, EV_UINTR, EV_UIRET, EV_SWINTR, EV_SYSCALL,
    EV_TRIG,
    EV_NTYPES
};

extern const char *const EV_NAMES[EV_NTYPES];

static inline int ev_is_cfe(int t)     /* t in evtrace.TYPES */
{
    return t >= EV_INTERRUPT && t <= EV_SYSCALL;
}

/* optional attributes (set bits) */
enum {
    EA_CR3, EA_NON_ROOT, EA_MODE, EA_SPECULATIVE, EA_ABORTED, EA_BASE,
    EA_HINTS, EA_EXT, EA_STATE, EA_SUB_STATE, EA_HW, EA_LAST, EA_DEEPEST,
    EA_INTERRUPT, EA_STORE, EA_AUTONOMOUS, EA_SIZE, EA_PAYLOAD, EA_RATIO,
    EA_RESUMED, EA_IFLAG, EA_VECTOR, EA_HAS_CR2, EA_CR2, EA_HAS_VECTOR,
    EA_VMXR, EA_HAS_VMXR, EA_VMXQ, EA_HAS_VMXQ, EA_TRBV, EA_ICNT, EA_ICNTV,
    EA_MULT, EA_BIND, EA_FOLLOWS,
    EA_COUNT
};

enum { BIND_NONE = 0, BIND_IP = 1, BIND_INSN = 2 };   /* ev.bind */

struct event {
    uint8_t type;
    uint8_t ip_suppressed, status_update, has_tsc, stamped;
    int8_t mode;                /* MODE_NONE or 0..2 */
    uint8_t non_root, speculative, aborted, hw, interrupt, store,
            autonomous, resumed, iflag, has_cr2, has_vector, has_vmxr,
            has_vmxq, icntv, mult, bind;
    int8_t follows;             /* a packet kind (PT_K_*), -1: None */
    uint64_t set;               /* EA_* bits */
    uint64_t tsc, lost_mtc, lost_cyc;
    uint64_t ip, at, from, to;
    uint64_t cr3, base, hints, ext, state, sub_state, last, deepest, size,
             payload, ratio, vector, cr2, vmxr, vmxq, trbv, icnt;
};

#define EV_SET(ev, attr, val) \
    ((ev)->set |= (uint64_t)1 << EA_##attr, (val))
#define EV_HAS(ev, attr) (((ev)->set >> EA_##attr) & 1)

static inline void ev_init(struct event *ev, int type)
{
    memset(ev, 0, sizeof *ev);
    ev->type = (uint8_t)type;
}

/* bindings (events.BIND_*) */
enum { BIND_PSBEND = 0, BIND_TIP = 1, BIND_FUP = 2, BIND_CFE = 3,
       BIND_EXSTOP = 4, NBIND = 5 };

struct evlist {                 /* a growable deque of events */
    struct event *ev;
    uint32_t head, n, cap;
};

struct evq {
    struct evlist q[NBIND];
};

int evl_push(struct evlist *l, const struct event *ev);      /* -E_NOMEM */
int evl_insert(struct evlist *l, uint32_t i, const struct event *ev);
void evl_remove(struct evlist *l, uint32_t i);
static inline struct event *evl_at(struct evlist *l, uint32_t i)
{
    return &l->ev[l->head + i];
}
int evl_copy(struct evlist *dst, const struct evlist *src);
void evl_free(struct evlist *l);

void evq_clear(struct evq *q, int binding);          /* -1: all */
static inline int evq_pending(const struct evq *q, int b)
{
    return q->q[b].n != 0;
}
int evq_dequeue(struct evq *q, int b, struct event *out);    /* 1 if any */
int evq_take(struct evq *q, int b, int type, struct event *out);
int evq_find(struct evq *q, int b, int type);                /* index or -1 */
static inline int evq_enqueue(struct evq *q, int b, const struct event *ev)
{
    return evl_push(&q->q[b], ev);
}
int evq_enqueue_before(struct evq *q, int b, const struct event *ev,
                       int type);
int evq_copy(struct evq *dst, const struct evq *src);
void evq_free(struct evq *q);

#endif

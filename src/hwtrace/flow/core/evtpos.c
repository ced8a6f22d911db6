/* Trace offsets as libipt 2.3 reports them with an error
 * (hwtrace.flow.evtpos): where its event decoder, one event ahead, stands. */
#include "query.h"

ptrdiff_t q_skip_pads(const struct query *q, ptrdiff_t pos)
{
    struct pt_pkt p;
    for (;;) {
        if (q_peek(q, pos, &p) || p.kind != PT_K_PAD)
            return pos;
        pos += p.size;
    }
}

int q_stays(int kind, const struct event *ev)
{
    if (kind == PT_K_PSBEND || kind == PT_K_FUP || kind == PT_K_TIP ||
        kind == PT_K_TIP_PGE || ev->status_update)
        return 1;
    int t = ev->type;
    if (kind == PT_K_TIP_PGD && t != EV_DISABLED)
        return 1;
    if (kind == PT_K_EXSTOP && t == EV_MWAIT)
        return 1;
    if (kind == PT_K_PWRX && t != EV_PWRX)
        return 1;
    return 0;
}

ptrdiff_t q_after_event(const struct query *q, int stay, ptrdiff_t pos,
                        ptrdiff_t end)
{
    return stay ? pos : q_skip_pads(q, end);
}

static ptrdiff_t lookahead(struct query *c)
{
    for (;;) {
        if (c->nxt_err)
            return c->pos;
        int k = c->nxt.kind;
        int size = c->nxt.size;
        if (k == PT_K_TNT8 || k == PT_K_TNT64)
            return q_skip_pads(c, c->pos + size);
        if (k == PT_K_TIP)
            return c->pos;
        ptrdiff_t start = c->pos;
        uint64_t fetches = c->fetches;
        c->has_published = 0;
        if (q_decode(c) < 0)
            return c->pos;
        if (c->has_published) {
            ptrdiff_t end = c->pos > start + size ? c->pos : start + size;
            return q_after_event(c, q_stays(k, &c->published), start, end);
        }
        if (c->pos == start && c->fetches == fetches)
            return start;
    }
}

ptrdiff_t q_lookahead(const struct query *q)
{
    if (q->pos < 0)
        return 0;
    struct query c;
    if (q_clone(&c, q) < 0)
        return -E_NOMEM;
    ptrdiff_t r = lookahead(&c);
    q_free(&c);
    return r;
}

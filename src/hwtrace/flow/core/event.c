/* Events and event queues: see event.h. */
#include <stdlib.h>

#include "event.h"

const char *const EV_NAMES[EV_NTYPES] = {
    "enabled", "disabled", "async_disabled", "async_branch", "paging",
    "async_paging", "overflow", "exec_mode", "tsx", "stop", "vmcs",
    "async_vmcs", "exstop", "mwait", "pwre", "pwrx", "ptwrite", "tick",
    "cbr", "mnt", "iflags", "interrupt", "iret", "smi", "rsm", "sipi",
    "init", "vmentry", "vmexit", "shutdown", "uintr", "uiret", "swintr",
    "syscall", "trig"};

static int evl_grow(struct evlist *l)
{
    if (l->head) {                      /* compact first */
        memmove(l->ev, l->ev + l->head, l->n * sizeof *l->ev);
        l->head = 0;
        if (l->n < l->cap)
            return 0;
    }
    uint32_t cap = l->cap ? l->cap * 2 : 4;
    struct event *ne = realloc(l->ev, (size_t)cap * sizeof *ne);
    if (!ne)
        return -E_NOMEM;
    l->ev = ne;
    l->cap = cap;
    return 0;
}

int evl_push(struct evlist *l, const struct event *ev)
{
    if (l->head + l->n >= l->cap)
        TRY(evl_grow(l));
    l->ev[l->head + l->n++] = *ev;
    return 0;
}

int evl_insert(struct evlist *l, uint32_t i, const struct event *ev)
{
    if (l->head + l->n >= l->cap)
        TRY(evl_grow(l));
    struct event *base = l->ev + l->head;
    memmove(base + i + 1, base + i, (l->n - i) * sizeof *base);
    base[i] = *ev;
    l->n++;
    return 0;
}

void evl_remove(struct evlist *l, uint32_t i)
{
    if (i == 0) {
        l->head++;
        l->n--;
    } else {
        struct event *base = l->ev + l->head;
        memmove(base + i, base + i + 1, (l->n - i - 1) * sizeof *base);
        l->n--;
    }
    if (!l->n)
        l->head = 0;
}

int evl_copy(struct evlist *dst, const struct evlist *src)
{
    dst->ev = NULL;
    dst->head = dst->n = dst->cap = 0;
    if (!src->n)
        return 0;
    dst->ev = malloc((size_t)src->n * sizeof *dst->ev);
    if (!dst->ev)
        return -E_NOMEM;
    memcpy(dst->ev, src->ev + src->head, (size_t)src->n * sizeof *dst->ev);
    dst->n = dst->cap = src->n;
    return 0;
}

void evl_free(struct evlist *l)
{
    free(l->ev);
    l->ev = NULL;
    l->head = l->n = l->cap = 0;
}

void evq_clear(struct evq *q, int binding)
{
    for (int b = 0; b < NBIND; b++)
        if (binding < 0 || b == binding)
            q->q[b].head = q->q[b].n = 0;
}

int evq_dequeue(struct evq *q, int b, struct event *out)
{
    struct evlist *l = &q->q[b];
    if (!l->n)
        return 0;
    *out = *evl_at(l, 0);
    evl_remove(l, 0);
    return 1;
}

int evq_find(struct evq *q, int b, int type)
{
    struct evlist *l = &q->q[b];
    for (uint32_t i = 0; i < l->n; i++)
        if (evl_at(l, i)->type == type)
            return (int)i;
    return -1;
}

int evq_take(struct evq *q, int b, int type, struct event *out)
{
    int i = evq_find(q, b, type);
    if (i < 0)
        return 0;
    *out = *evl_at(&q->q[b], (uint32_t)i);
    evl_remove(&q->q[b], (uint32_t)i);
    return 1;
}

int evq_enqueue_before(struct evq *q, int b, const struct event *ev, int type)
{
    int i = evq_find(q, b, type);
    if (i < 0)
        return evl_push(&q->q[b], ev);
    return evl_insert(&q->q[b], (uint32_t)i, ev);
}

int evq_copy(struct evq *dst, const struct evq *src)
{
    for (int b = 0; b < NBIND; b++) {
        if (evl_copy(&dst->q[b], &src->q[b]) < 0) {
            for (int j = 0; j < b; j++)
                evl_free(&dst->q[j]);
            return -E_NOMEM;
        }
    }
    return 0;
}

void evq_free(struct evq *q)
{
    for (int b = 0; b < NBIND; b++)
        evl_free(&q->q[b]);
}

/* The ptrace stepper's execution-log writer (format: execlog.py v1) and
 * its lookup tables: decoded instructions by pc, blocks by (pc, length). */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <x86intrin.h>
#include <time.h>
#include "stepper.h"

FILE *out;
uint64_t tsc0, ns0;
uint32_t next_block_id = 1;
pid_t ctx_tid = -1;
static int ctx_cpu = -2;
static uint32_t exec_ids[64];
static int nexec;
struct thread *exec_owner;

void w8(unsigned v) { putc_unlocked((int)v, out); }

void w16(unsigned v) { fwrite(&(uint16_t){ (uint16_t)v }, 2, 1, out); }

void w32(uint32_t v) { fwrite(&v, 4, 1, out); }

void w64(uint64_t v) { fwrite(&v, 8, 1, out); }

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void write_header(uint64_t hz)
{
    fwrite("HWXL", 4, 1, out);
    w16(1); w16(32);
    w8(2);                               /* source: ptrace stepper */
    w8(opt.clock_insn ? 2 : 1);          /* clock */
    w16(0); w32(0);
    w64(hz); w64(0);
}

struct insn_info *pc_find(struct pctab *t, uint64_t pc)
{
    if (!t->cap)
        return NULL;
    size_t m = t->cap - 1, i = (size_t)(pc * 0x9E3779B97F4A7C15ull >> 20) & m;
    for (;; i = (i + 1) & m) {
        if (t->e[i].pc == pc && t->e[i].len)
            return &t->e[i];
        if (!t->e[i].len)
            return NULL;
    }
}

struct insn_info *pc_add(struct pctab *t, const struct insn_info *v)
{
    if ((t->n + 1) * 2 > t->cap) {
        struct pctab nt = { calloc(t->cap ? t->cap * 2 : 4096, sizeof *nt.e), t->cap ? t->cap * 2 : 4096, 0 };
        if (!nt.e) fail("out of memory");
        for (size_t i = 0; i < t->cap; i++)
            if (t->e[i].len) pc_add(&nt, &t->e[i]);
        free(t->e);
        *t = nt;
    }
    size_t m = t->cap - 1, i = (size_t)(v->pc * 0x9E3779B97F4A7C15ull >> 20) & m;
    while (t->e[i].len)
        i = (i + 1) & m;
    t->e[i] = *v;
    t->n++;
    return &t->e[i];
}

void pc_clear(struct pctab *t) { free(t->e); t->e = NULL; t->cap = t->n = 0; }

uint32_t *blk_find(struct blktab *t, uint64_t pc, uint32_t n)
{
    if (!t->cap) return NULL;
    size_t m = t->cap - 1, i = (size_t)((pc ^ (uint64_t)n << 48) * 0x9E3779B97F4A7C15ull >> 20) & m;
    for (;; i = (i + 1) & m) {
        if (!t->e[i].n) return NULL;
        if (t->e[i].pc == pc && t->e[i].n == n) return &t->e[i].id;
    }
}

void blk_add(struct blktab *t, uint64_t pc, uint32_t n, uint32_t id)
{
    if ((t->n + 1) * 2 > t->cap) {
        struct blktab nt = { calloc(t->cap ? t->cap * 2 : 1024, sizeof *nt.e), t->cap ? t->cap * 2 : 1024, 0 };
        if (!nt.e) fail("out of memory");
        for (size_t i = 0; i < t->cap; i++)
            if (t->e[i].n) blk_add(&nt, t->e[i].pc, t->e[i].n, t->e[i].id);
        free(t->e);
        *t = nt;
    }
    size_t m = t->cap - 1, i = (size_t)((pc ^ (uint64_t)n << 48) * 0x9E3779B97F4A7C15ull >> 20) & m;
    while (t->e[i].n) i = (i + 1) & m;
    t->e[i] = (struct blk){ pc, n, id };
    t->n++;
}

void flush_exec(void)
{
    if (!nexec) return;
    w8(0x04); w32((uint32_t)nexec);
    fwrite(exec_ids, 4, (size_t)nexec, out);
    nexec = 0;
}

uint64_t clock_value(struct thread *t)
{
    return opt.clock_insn ? t->ninsn : __rdtsc();
}

/* Make t the log's current thread (CTX), flushing what belongs to another. */
void ctx(struct thread *t)
{
    if (exec_owner != t) flush_exec();
    if (ctx_tid != t->tid || ctx_cpu != t->cpu) {
        flush_exec();
        w8(0x01); w32((uint32_t)t->pid); w32((uint32_t)t->tid); w32((uint32_t)t->cpu);
        ctx_tid = t->tid; ctx_cpu = t->cpu;
    }
    exec_owner = t;
}

/* A thread record (anything but EXEC) for t: context, then a TIME. */
void rec(struct thread *t)
{
    ctx(t);
    flush_exec();
    w8(0x02); w64(clock_value(t));
}

void end_run(struct thread *t)
{
    if (!t->run_n) return;
    uint32_t *id = blk_find(&t->p->blocks, t->run_start, t->run_n);
    uint32_t bid;
    if (id) {
        bid = *id;
    } else {
        bid = next_block_id++;
        blk_add(&t->p->blocks, t->run_start, t->run_n, bid);
        unsigned nbytes = 0;
        for (uint32_t i = 0; i < t->run_n; i++) nbytes += t->run_sizes[i];
        w8(0x03); w32((uint32_t)t->pid); w32(bid); w64(t->run_start);
        w16(t->run_n); w16(nbytes);
        fwrite(t->run_sizes, 1, t->run_n, out);
        uint64_t pc = t->run_start;
        for (uint32_t i = 0; i < t->run_n; i++) {
            struct insn_info *ii = insn_at(t, pc);
            fwrite(ii->code, 1, t->run_sizes[i], out);
            pc += t->run_sizes[i];
        }
    }
    ctx(t);
    if (nexec == 0) { w8(0x02); w64(clock_value(t) - (opt.clock_insn ? t->run_n : 0)); }
    exec_ids[nexec++] = bid;
    if (nexec == 64) flush_exec();
    t->run_n = 0;
}

void write_sysret(struct thread *t)
{
    end_run(t);
    rec(t);
    w8(0x21); w64(t->sys_nr); w64((uint64_t)t->sys_ret);
    if (t->sys_nr == 13 && t->sys_ret == 0 && t->sys_rsi) {  /* rt_sigaction */
        w8(0x23); w32((uint32_t)t->sys_rdi); w64(t->sig_act[0]); w64(t->sig_act[1]);
    }
    t->in_sys = 0;
}

/* The instruction ii of t retired. */
void retire(struct thread *t, struct insn_info *ii)
{
    if (t->in_sys) write_sysret(t);
    if (t->run_n && (ii->pc != t->run_next || t->run_n == RUNMAX)) end_run(t);
    if (!t->run_n) t->run_start = ii->pc;
    t->run_sizes[t->run_n++] = ii->len;
    t->run_next = ii->pc + ii->len;
    t->ninsn++;
}

int read_mem(pid_t tid, uint64_t addr, void *buf, size_t len)
{
    struct iovec l = { buf, len }, r = { (void *)addr, len };
    ssize_t n = process_vm_readv(tid, &l, 1, &r, 1, 0);
    if (n > 0) return (int)n;
    /* fall back to PTRACE_PEEKTEXT, word by word */
    size_t got = 0;
    while (got < len) {
        errno = 0;
        long w = ptrace(PTRACE_PEEKTEXT, tid, (void *)(addr + got), 0);
        if (errno) break;
        size_t k = len - got < 8 ? len - got : 8;
        memcpy((char *)buf + got, &w, k);
        got += k;
    }
    return (int)got;
}

struct insn_info *insn_at(struct thread *t, uint64_t pc)
{
    struct insn_info *ii = pc_find(&t->p->pcs, pc);
    if (ii) return ii;
    uint8_t buf[16];
    int n = read_mem(t->tid, pc, buf, 16);
    struct insn_info v = { .pc = pc };
    struct ild d;
    if (n <= 0 || !ild_decode(buf, n, &d)) {
        /* unreadable or undecodable: it will fault; keep one byte */
        d.len = 1; d.kind = K_OTHER;
        if (n <= 0) buf[0] = 0;
    }
    v.len = (uint8_t)d.len; v.kind = (uint8_t)d.kind;
    memcpy(v.code, buf, (size_t)d.len);
    return pc_add(&t->p->pcs, &v);
}

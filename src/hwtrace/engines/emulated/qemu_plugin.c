/*
 * hwtrace QEMU TCG plugin: writes the hwtrace execution log (see execlog.py
 * for the format) of a program run under qemu-user (qemu-x86_64 >= 7.2).
 *
 *   qemu-x86_64 -plugin hwtrace_plugin.so,out=LOG PROGRAM ARGS...
 *
 * Per translation block: a BLOCK record at translation time (address, size
 * and bytes of each instruction), written to LOG at once, and a callback at
 * execution time that appends the block id to the executing guest thread's
 * buffer.  QEMU reports execution per block, at its start; so that a block
 * left in the middle (an instruction faulted: a divide error, a bad load;
 * the process died) is traced only as far as it ran, the block being run
 * stays an EXEC_PART record (count = the instructions before the last one
 * that started) until the next block starts, and a callback before each
 * instruction that can fault keeps the count (see on_exec).
 *
 * Buffers are per host thread (qemu-user runs one host thread per
 * guest thread), flushed to LOG (O_APPEND) when full, at syscalls that end,
 * signal or replace a thread or process, and at exit.  Nothing on the
 * execution hot path takes a lock or makes a system call.
 *
 * TIME records (the host TSC) say how threads' work interleaved: one
 * starts every chunk, one follows every kernel entry and exit, and a
 * thread writes one before the first block it starts after another thread
 * of its process entered or left the kernel (time_epoch).  So no thread's
 * stretch between two TIMEs spans another thread's system call, except for
 * the block it was running then: without that, a thread that was slow or
 * descheduled (translating new code, a loaded host) between two of its own
 * system calls was one slice reaching back before everything another
 * thread did meanwhile (a worker's whole life, up to its exit), and work
 * that followed from it -- pthread_join seeing the worker gone without a
 * futex wait -- was scheduled before it (schedule.py).
 *
 * A thread's buffer is a MAP_SHARED mapping of its own file next to LOG,
 * LOG.buf.PID.TID (layout: struct shdr, then the records), whose header
 * says after every record how many bytes are whole records not yet in LOG.
 * So when QEMU dies without running the plugin's exit callback (an
 * uncaught guest SIGSEGV/SIGFPE/SIGILL/SIGABRT ends in QEMU killing itself
 * with the signal; SIGKILL from outside), what the thread recorded is in
 * the page cache, and the recorder appends it to LOG afterwards (qemu.py,
 * merge_buffers).  The files of threads and processes that end normally
 * are removed, their contents being in LOG.
 *
 * Stopping mid-run (ctl=CTL, fifo=FIFO, trigger=NAME...): CTL is a page
 * shared with the recorder (struct hwctl; inherited by forked guest
 * processes, which map the same file).  Once its stop word is set -- by the
 * recorder (a snapshot on request) or by this plugin when a trigger
 * function is first entered -- no callback of any process writes anything
 * more: the log and the buffer files hold the trace up to that point, and
 * the program runs on untraced.  A trigger NAME is a function symbol
 * (.symtab or .dynsym, STT_FUNC) of any ELF file the program maps, resolved
 * when code of that mapping is first translated; its entry instruction is
 * logged as a one-instruction block, then the stop word is set and a byte
 * written to FIFO (the recorder waits on it).  A SIGINT or SIGHUP the
 * terminal sends (si_code SI_KERNEL: Ctrl-C, hangup) goes to the recorder
 * too, which stops the recording, and so does one kill(2) sends from
 * outside the program (a sender that isn't the recorder's descendant:
 * `timeout -s INT` signals the recorder's whole process group); the
 * plugin sets the stop word in QEMU's own host signal handler (wrapped),
 * before the guest sees the signal, so the trace ends where the user
 * stopped it and not in the program's handler, and tells the recorder
 * (tty_signal).
 *
 * Debian ships no qemu-plugin.h: the part of the plugin API used here is
 * declared in qemu_plugin_api.h.  Beside this file: qemu_plugin_ctl.c
 * (stopping mid-run: the control page, triggers, host signals),
 * qemu_plugin_exec.c (following execve), qemu_plugin_guest.c (reading guest
 * memory), qemu_plugin_insn.c (which instructions can fault),
 * qemu_plugin_elf.c (trigger functions' addresses).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "qemu_plugin_api.h"
#include "qemu_plugin_ctl.h"
#include "qemu_plugin_exec.h"
#include "qemu_plugin_guest.h"
#include "qemu_plugin_insn.h"

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

/* ---- execution log records (execlog.py is the specification) ---- */
enum {
    T_CTX = 0x01, T_TIME = 0x02, T_BLOCK = 0x03, T_EXEC = 0x04, T_EXEC_PART = 0x05,
    T_THREAD_START = 0x10, T_THREAD_EXIT = 0x11, T_PROC_START = 0x12,
    T_PROC_EXEC = 0x13, T_PROC_EXIT = 0x14, T_REAPED = 0x15, T_SYSCALL = 0x20,
    T_SYSRET = 0x21,
    T_SIGACTION = 0x23, T_MMAP = 0x30,
};

#define TBUF_SIZE (256 * 1024)
#define TBUF_SLACK 256          /* room for any event record */
#define SHDR_SIZE 4096          /* the buffer file's header page */

/* The header of a buffer file (LOG.buf.PID.TID), read by qemu.py after
 * QEMU died: data[0:valid] (data at SHDR_SIZE) are whole records, a chunk
 * starting with its CTX+TIME header (hdr_end bytes), not yet in LOG.
 * flushing=1: data[0:valid] were being appended to LOG, whose size was
 * flush_at just before (the append may be whole, partial or not done). */
struct shdr {
    char magic[4];              /* "HWXB" */
    uint32_t version;           /* 1 */
    uint64_t valid;
    uint64_t hdr_end;
    uint64_t flush_at;
    uint32_t flushing;
    uint32_t pid, tid;
};

struct tbuf {
    unsigned char *data;
    struct shdr *sh;            /* the file's header (or private memory) */
    size_t pos;
    size_t run_at;              /* offset of the open EXEC record's count */
    uint32_t run_n;             /* ids in it (0: no open EXEC record) */
    size_t part_at;             /* the EXEC_PART record of the block being run (0: none) */
    struct tbinfo *part;        /* that block */
    uint16_t *part_cnt;         /* where its count is kept (a dummy when none) */
    uint32_t tid;
    size_t hdr_end;             /* end of the chunk's CTX+TIME header */
    uint64_t seen;              /* time_epoch when this thread's last TIME was read */
    bool started;               /* THREAD_START written */
    struct tbuf *next;          /* all live buffers of this process */
};

/* A block of the log: its id, where it starts and ends, the direct target
 * of its last instruction (0: none), its instruction count, whether the
 * last one is a branch (it retired if it started: a fault that follows is
 * at its target), and the trigger it is the entry of (on_trigger's). */
struct tbinfo { uint32_t id; int trigger; uint16_t n; uint8_t last_branch; uint64_t pc, end, target; };

struct span { uint64_t lo, hi; };

static int out_fd = -1;
static char *out_path;                  /* LOG */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct tbuf *all_bufs;           /* guarded by lock */
static unsigned char *defs;             /* scratch for BLOCK/MMAP records */
static size_t defs_pos, defs_cap;
static uint32_t next_id = 1;
static uint32_t pid;
static uint32_t parent_pid;
static uint32_t cloning_tid;            /* last thread that called clone(CLONE_VM) */
static bool proc_started;
static bool cont_thread;                /* an exec'd image: its first thread is the one that exec'd */
static struct span *spans;              /* mappings already reported */
static size_t nspans, capspans;
static __thread struct tbuf *tls_buf __attribute__((tls_model("initial-exec")));
/* a wait4's status pointer, or a waitid's siginfo pointer, from the
 * syscall's entry to its return (0: none) */
static __thread uint64_t tls_wait_ptr __attribute__((tls_model("initial-exec")));
static uint16_t no_part;                /* part_cnt when no block is being run */
/* Bumped after every TIME at a kernel entry or exit (of any thread of this
 * process); a thread that finds it changed at a block start writes a TIME
 * there (on_exec).  Those TIMEs don't bump it: two threads running side by
 * side would otherwise stamp every block of each other. */
static uint64_t time_epoch;
static uint64_t fault_handler[5];       /* handlers of SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV */
static bool any_fault_handler;          /* one of them is set */
static const int fault_signo[5] = {4, 5, 7, 8, 11};

static uint32_t my_tid(void) { return (uint32_t)syscall(SYS_gettid); }

static void put(unsigned char **p, const void *v, size_t n) { memcpy(*p, v, n); *p += n; }

static void write_all(const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(out_fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Publish data[0:pos] as whole records (plain stores: x86 keeps their
 * order, the barrier keeps the compiler's). */
static inline void commit(struct tbuf *b)
{
    __atomic_store_n(&b->sh->valid, (uint64_t)b->pos, __ATOMIC_RELEASE);
}

/* The block being run finished: its EXEC_PART record becomes an id of
 * the open EXEC record (or of a new one). */
static void complete_part(struct tbuf *b)
{
    size_t at = b->part_at;
    uint32_t id = b->part->id;
    /* what is published must stay whole records while the tail changes
     * (the caller publishes the new end) */
    __atomic_store_n(&b->sh->valid, (uint64_t)at, __ATOMIC_RELEASE);
    if (b->run_n) {
        memcpy(b->data + at, &id, 4);
        b->pos = at + 4;
    } else {
        b->data[at] = T_EXEC;
        b->run_at = at + 1;
        memcpy(b->data + at + 5, &id, 4);
        b->pos = at + 9;
    }
    b->run_n++;
    memcpy(b->data + b->run_at, &b->run_n, 4);
    b->part_at = 0;
    b->part_cnt = &no_part;
}

/* The block being run (if any) stays an EXEC_PART record: it was left
 * before instruction *part_cnt (which faulted) or the thread stops here. */
static void keep_part(struct tbuf *b)
{
    b->part_at = 0;
    b->part_cnt = &no_part;
    b->run_n = 0;
}

/* An event record follows: the block being run finished (it ended with
 * the system call) and the EXEC record is closed. */
static void close_run(struct tbuf *b)
{
    if (b->part_at)
        complete_part(b);
    b->run_n = 0;               /* its count is kept up to date in on_exec */
}

/* The host TSC, read after time_epoch (*epoch): a TIME that follows any
 * TIME whose bump the load saw.  (The first fence keeps rdtsc from running
 * ahead of the load; the second keeps a writer's bump, which follows, from
 * becoming visible before its TSC was read -- rdtsc is not ordered with
 * later instructions, SDM RDTSC.) */
static inline uint64_t read_time(uint64_t *epoch)
{
    *epoch = __atomic_load_n(&time_epoch, __ATOMIC_ACQUIRE);
    _mm_lfence();
    uint64_t now = __rdtsc();
    _mm_lfence();
    return now;
}

static void begin_chunk(struct tbuf *b)
{
    unsigned char *p = b->data;
    int32_t cpu = sched_getcpu();
    uint64_t now = read_time(&b->seen);
    __atomic_store_n(&b->sh->valid, 0, __ATOMIC_RELEASE);
    *p++ = T_CTX;
    put(&p, &pid, 4);
    put(&p, &b->tid, 4);
    put(&p, &cpu, 4);
    *p++ = T_TIME;
    put(&p, &now, 8);
    b->pos = (size_t)(p - b->data);
    b->hdr_end = b->pos;
    b->run_n = 0;
    b->part_at = 0;
    b->part_cnt = &no_part;
    b->sh->hdr_end = b->hdr_end;
    commit(b);
}

/* Append this buffer's chunk to LOG and start a new one; caller holds lock.
 * The calling thread's block is done with (it flushes between blocks, or
 * logs the one it is at); another thread's, still being run (at exit),
 * goes as EXEC_PART. */
static void flush_locked(struct tbuf *b)
{
    if (b == tls_buf)
        close_run(b);
    else
        keep_part(b);
    if (b->pos > b->hdr_end) {
        /* data[0:pos] is whole records (on_exec may have left valid short
         * of the id it just added): what merge_buffers reads back is what
         * goes to LOG */
        commit(b);
        off_t end = lseek(out_fd, 0, SEEK_END);
        b->sh->flush_at = end < 0 ? 0 : (uint64_t)end;
        __atomic_store_n(&b->sh->flushing, 1, __ATOMIC_RELEASE);
        write_all(b->data, b->pos);
        __atomic_store_n(&b->sh->valid, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&b->sh->flushing, 0, __ATOMIC_RELEASE);
    }
    begin_chunk(b);
}

static void buf_file_name(char *name, size_t n, uint32_t p, uint32_t t)
{
    snprintf(name, n, "%s.buf.%" PRIu32 ".%" PRIu32, out_path, p, t);
}

/* Map a new buffer for b (in its file; in private memory if the file
 * can't be made, as a last resort that only loses the crash guarantee). */
static void map_buf(struct tbuf *b)
{
    size_t size = SHDR_SIZE + TBUF_SIZE + TBUF_SLACK;
    void *m = MAP_FAILED;
    char name[4200];
    buf_file_name(name, sizeof name, pid, b->tid);
    int fd = open(name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)size) == 0)
            m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            unlink(name);
    }
    if (m == MAP_FAILED)
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        abort();
    b->sh = m;
    b->data = (unsigned char *)m + SHDR_SIZE;
    memcpy(b->sh->magic, "HWXB", 4);
    b->sh->version = 1;
    b->sh->pid = pid;
    b->sh->tid = b->tid;
}

/* The thread's records are all in LOG: its file goes (the mapping stays,
 * so a stray later callback writes into memory, not into nothing). */
static void drop_buf_file(struct tbuf *b)
{
    char name[4200];
    __atomic_store_n(&b->sh->valid, 0, __ATOMIC_RELEASE);
    buf_file_name(name, sizeof name, pid, b->tid);
    unlink(name);
}

static void put_event_header(struct tbuf *b)
{
    if (!b->started) {
        unsigned char *p = b->data + b->pos;
        if (!proc_started) {
            proc_started = true;
            *p++ = T_PROC_START;
            put(&p, &parent_pid, 4);
        }
        uint32_t parent = (b->tid == pid) ? 0 : cloning_tid;
        *p++ = T_THREAD_START;
        put(&p, &parent, 4);
        b->pos = (size_t)(p - b->data);
        b->started = true;
        commit(b);
    }
}

static struct tbuf *new_buf(void)
{
    struct tbuf *b = calloc(1, sizeof(*b));
    b->tid = my_tid();
    map_buf(b);
    begin_chunk(b);
    pthread_mutex_lock(&lock);
    if (cont_thread && b->tid == pid) {
        cont_thread = false;
        b->started = true;      /* the thread that exec'd goes on */
    }
    put_event_header(b);
    b->next = all_bufs;
    all_bufs = b;
    pthread_mutex_unlock(&lock);
    tls_buf = b;
    return b;
}

static struct tbuf *cur_buf(void)
{
    struct tbuf *b = tls_buf;
    return b ? b : new_buf();
}

/* Room for an event record in the current buffer (flushing if needed). */
static struct tbuf *event_buf(void)
{
    struct tbuf *b = cur_buf();
    close_run(b);
    if (b->pos + TBUF_SLACK > TBUF_SIZE) {
        pthread_mutex_lock(&lock);
        flush_locked(b);
        pthread_mutex_unlock(&lock);
    }
    return b;
}

/* A TIME record; ``kernel``: at a kernel entry or exit, which the other
 * threads then stamp their next block after.  If another thread bumped
 * between our read and our bump, seen stays behind time_epoch and our next
 * block gets a TIME of its own. */
static void put_time(struct tbuf *b, bool kernel)
{
    uint64_t e;
    uint64_t now = read_time(&e);
    b->data[b->pos++] = T_TIME;
    memcpy(b->data + b->pos, &now, 8);
    b->pos += 8;
    if (kernel) {
        __atomic_fetch_add(&time_epoch, 1, __ATOMIC_RELEASE);
        e++;
    }
    b->seen = e;
}

/* ---- the hot path ---- */
static bool is_fault_handler(uint64_t pc)
{
    for (int i = 0; i < 5; i++)
        if (fault_handler[i] == pc)
            return true;
    return false;
}

/* Whether the block before, whose last started instruction with a
 * callback is *cnt, was left early: a fault handler runs next and the
 * block's own way out (its end, its direct target) was not taken, and
 * it did not get to a last branch (which retires: a fault after it is at
 * its target, as with a NULL function pointer). */
static bool left_early(const struct tbinfo *prev, uint16_t cnt, uint64_t pc)
{
    if (pc == prev->end || pc == prev->target)
        return false;
    return !(cnt + 1 == prev->n && prev->last_branch);
}

/* A block starts.  The one before it finished (its EXEC_PART record becomes
 * an EXEC id), unless it was left early for a fault handler; this one is
 * an EXEC_PART record with count 0 until the next one starts, the
 * callbacks of its instructions that can fault updating the count. */
static void on_exec(unsigned int vcpu, void *udata)
{
    struct tbuf *b = tls_buf;
    struct tbinfo *info = udata;
    (void)vcpu;
    if (__builtin_expect(stopped(), 0)) {
        if (b)
            b->part_cnt = &no_part;     /* its EXEC_PART record stays as it is */
        return;
    }
    if (__builtin_expect(b == NULL, 0))
        b = cur_buf();
    size_t at = b->part_at;
    if (__builtin_expect(at && b->run_n && !any_fault_handler, 1)) {
        /* the common case, complete_part inline: the id of the block that
         * finished replaces its EXEC_PART record */
        uint32_t id;
        memcpy(&id, b->data + at + 1, 4);
        __atomic_store_n(&b->sh->valid, (uint64_t)at, __ATOMIC_RELEASE);
        memcpy(b->data + at, &id, 4);
        b->run_n++;
        memcpy(b->data + b->run_at, &b->run_n, 4);
        b->pos = at + 4;
        b->part_at = 0;
    } else if (at) {
        if (__builtin_expect(any_fault_handler, 0) && is_fault_handler(info->pc) &&
            left_early(b->part, *b->part_cnt, info->pc))
            keep_part(b);
        else
            complete_part(b);
    }
    if (__builtin_expect(b->pos + 32 > TBUF_SIZE, 0)) {
        pthread_mutex_lock(&lock);
        flush_locked(b);
        pthread_mutex_unlock(&lock);
    }
    if (__builtin_expect(__atomic_load_n(&time_epoch, __ATOMIC_RELAXED) != b->seen, 0)) {
        /* another thread entered or left the kernel since our last TIME:
         * this block starts after that (the EXEC record before is closed) */
        put_time(b, false);
        b->run_n = 0;
    }
    unsigned char *p = b->data + b->pos;
    b->part_at = b->pos;
    b->part = info;
    p[0] = T_EXEC_PART;
    memcpy(p + 1, &info->id, 4);
    p[5] = p[6] = 0;
    b->part_cnt = (uint16_t *)(p + 5);
    b->pos += 7;
    commit(b);
}

/* Before an instruction that can fault: the ones before it retired. */
static void on_insn(unsigned int vcpu, void *udata)
{
    (void)vcpu;
    *tls_buf->part_cnt = (uint16_t)(uintptr_t)udata;
}

/* ---- translation time ---- */
static void defs_reserve(size_t n)
{
    if (defs_pos + n > defs_cap) {
        size_t cap = defs_cap ? defs_cap : 65536;
        while (cap < defs_pos + n)
            cap *= 2;
        defs = realloc(defs, cap);
        defs_cap = cap;
    }
}

/* Report the mapping (from the host's view, which is the guest's: qemu-user
 * maps x86-64 guests at their own addresses) that holds pc, into defs.
 * Caller holds lock. */
static void report_mapping(uint64_t pc)
{
    for (size_t i = 0; i < nspans; i++)
        if (pc >= spans[i].lo && pc < spans[i].hi)
            return;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return;
    char line[4096 + 128];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off;
        char perms[8];
        int n = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s%n", &lo, &hi, perms, &off, &n) < 4)
            continue;
        if (pc < lo || pc >= hi)
            continue;
        char *path = line + n;
        while (*path == ' ')
            path++;
        size_t len = strcspn(path, "\n");
        if (len > 4000)
            len = 4000;
        uint32_t prot = (perms[0] == 'r' ? 1 : 0) | (perms[1] == 'w' ? 2 : 0) | (perms[2] == 'x' ? 4 : 0);
        uint64_t a = lo, s = hi - lo, o = off;
        uint16_t l16 = (uint16_t)len;
        defs_reserve(64 + len);
        unsigned char *p = defs + defs_pos;
        *p++ = T_MMAP;
        put(&p, &pid, 4);
        put(&p, &a, 8);
        put(&p, &s, 8);
        put(&p, &o, 8);
        put(&p, &prot, 4);
        put(&p, &l16, 2);
        put(&p, path, len);
        *p++ = 0;
        defs_pos = (size_t)(p - defs);
        if (nspans == capspans) {
            capspans = capspans ? capspans * 2 : 64;
            spans = realloc(spans, capspans * sizeof *spans);
        }
        spans[nspans].lo = lo;
        spans[nspans].hi = hi;
        nspans++;
        char saved = path[len];
        path[len] = 0;
        resolve_triggers(path, lo, hi, off);     /* pc is code here (host perms may differ) */
        path[len] = saved;
        break;
    }
    fclose(f);
}

/* info describes instructions [from, to) of tb (a block of the log): where
 * it ends, its last instruction, and a callback before each instruction
 * that can fault (the first one's count, 0, is on_exec's) and before a
 * last one that is not a direct jump (so a last branch that started is
 * known to have retired, and a last instruction QEMU ends the block at
 * because it raises, like ud2, is known to have started). */
static void watch_block(struct qemu_plugin_tb *tb, size_t from, size_t to, struct tbinfo *info)
{
    uint64_t ip = qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, from));
    info->pc = ip;
    info->n = (uint16_t)(to - from);
    for (size_t i = from; i < to; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        size_t sz = qemu_plugin_insn_size(insn);
        uint64_t target;
        int f = insn_info(qemu_plugin_insn_data(insn), sz, ip, &target);
        if (i + 1 == to) {
            info->last_branch = (f & II_BRANCH) != 0;
            info->target = (f & II_DIRECT) ? target : 0;
            if (!(f & II_DIRECT))
                f |= II_FAULT;
        }
        if (i > from && (f & II_FAULT))
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_insn, QEMU_PLUGIN_CB_NO_REGS,
                                                   (void *)(uintptr_t)(i - from));
        ip += sz;
    }
    info->end = ip;
}

/* A BLOCK record for instructions [from, to) of tb, in defs; caller holds lock. */
static uint32_t define_block(struct qemu_plugin_tb *tb, size_t from, size_t to)
{
    uint64_t pc = qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, from));
    size_t nbytes = 0;
    for (size_t i = from; i < to; i++)
        nbytes += qemu_plugin_insn_size(qemu_plugin_tb_get_insn(tb, i));
    uint32_t id = next_id++;
    defs_reserve(1 + 20 + (to - from) + nbytes);
    unsigned char *p = defs + defs_pos;
    uint16_t n16 = (uint16_t)(to - from), b16 = (uint16_t)nbytes;
    *p++ = T_BLOCK;
    put(&p, &pid, 4);
    put(&p, &id, 4);
    put(&p, &pc, 8);
    put(&p, &n16, 2);
    put(&p, &b16, 2);
    for (size_t i = from; i < to; i++)
        *p++ = (unsigned char)qemu_plugin_insn_size(qemu_plugin_tb_get_insn(tb, i));
    for (size_t i = from; i < to; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        put(&p, qemu_plugin_insn_data(insn), qemu_plugin_insn_size(insn));
    }
    defs_pos = (size_t)(p - defs);
    return id;
}

/* Before the first instruction of a trigger function: it is logged (the
 * trace ends with it), then every process stops logging and the recorder
 * is told.  Only the first entry (of any thread or process) counts. */
static void on_trigger(unsigned int vcpu, void *udata)
{
    struct tbinfo *info = udata;
    if (stopped())
        return;
    uint32_t zero = 0;
    if (!__atomic_compare_exchange_n(&ctl->fired, &zero, 1, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE))
        return;                 /* another thread fired first: it stops us all */
    on_exec(vcpu, udata);
    struct tbuf *b = tls_buf;
    ctl->fired_pid = pid;
    ctl->fired_tid = b ? b->tid : my_tid();
    ctl->fired_pc = info->pc;
    snprintf(ctl->fired_name, sizeof ctl->fired_name, "%s", trig_names[info->trigger]);
    pthread_mutex_lock(&lock);
    if (b)
        flush_locked(b);
    __atomic_store_n(&ctl->stop, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    notify_recorder();
}

static void on_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    if (n == 0 || stopped())
        return;
    uint64_t pc = qemu_plugin_tb_vaddr(tb);
    static bool wrapped;
    if (!wrapped) {             /* QEMU's handlers are in place once guest code runs */
        wrapped = true;
        wrap_signal(SIGINT);
        wrap_signal(SIGHUP);
    }

    pthread_mutex_lock(&lock);
    report_mapping(pc);
    /* a trigger inside: the instructions before it are one block, its
     * first instruction another, watched by its own callback */
    size_t k = n;
    int trig = -1;
    for (size_t i = 0; ntaddr && i < n; i++) {
        trig = trigger_at(qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, i)));
        if (trig >= 0) {
            k = i;
            break;
        }
    }
    struct tbinfo *info = NULL, *tinfo = NULL;
    if (k > 0) {
        info = malloc(sizeof *info);
        info->id = define_block(tb, 0, k);
    }
    if (k < n) {
        tinfo = malloc(sizeof *tinfo);
        tinfo->id = define_block(tb, k, k + 1);
        tinfo->pc = qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, k));
        tinfo->trigger = trig;
    }
    /* Straight to LOG: before any EXEC naming the block, and never left
     * behind in memory by a death or in a fork child. */
    write_all(defs, defs_pos);
    defs_pos = 0;
    pthread_mutex_unlock(&lock);

    if (info) {
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, QEMU_PLUGIN_CB_NO_REGS, info);
        watch_block(tb, 0, k, info);
    }
    if (tinfo) {
        watch_block(tb, k, k + 1, tinfo);
        qemu_plugin_register_vcpu_insn_exec_cb(qemu_plugin_tb_get_insn(tb, k), on_trigger,
                                               QEMU_PLUGIN_CB_NO_REGS, tinfo);
    }
}

/* ---- syscalls: kernel transitions, threads, processes ---- */
enum { NR_KILL = 62, NR_TKILL = 200, NR_TGKILL = 234, NR_RT_SIGQUEUEINFO = 129,
       NR_RT_TGSIGQUEUEINFO = 297 };
enum { NR_RT_SIGACTION = 13, NR_CLONE = 56, NR_FORK = 57, NR_VFORK = 58,
       NR_EXECVE = 59, NR_EXIT = 60, NR_WAIT4 = 61, NR_EXIT_GROUP = 231,
       NR_WAITID = 247, NR_EXECVEAT = 322, NR_CLONE3 = 435 };
#define CLONE_VM_FLAG 0x100

static bool clone_is_thread(int64_t num, uint64_t a1)
{
    if (num == NR_CLONE)
        return (a1 & CLONE_VM_FLAG) != 0;
    if (num == NR_CLONE3) {
        uint64_t flags = 0;
        if (read_guest(a1, &flags, 8) == 8)
            return (flags & CLONE_VM_FLAG) != 0;
    }
    return false;
}

/* ---- following execve (qemu_plugin_exec.c says how) ---- */
/* At an execve entry: log it, and (if the target can run under QEMU)
 * become QEMU running it; back here only if that can't be done. */
static void follow_exec(struct tbuf *b, int64_t num, uint64_t a1, uint64_t a2, uint64_t a3,
                        uint64_t a4, uint64_t a5)
{
    char logged[PATH_MAX];
    char **qenv = NULL;
    char **cmd = exec_follow(num, a1, a2, a3, a4, a5, next_id, logged, &qenv);
    uint16_t len = (uint16_t)strnlen(logged, 4000);
    if (b->pos + 4 + len > TBUF_SIZE + TBUF_SLACK) {
        pthread_mutex_lock(&lock);
        flush_locked(b);
        pthread_mutex_unlock(&lock);
    }
    unsigned char *p = b->data + b->pos;
    *p++ = T_PROC_EXEC;
    *p++ = cmd ? 1 : 0;
    put(&p, &len, 2);
    put(&p, logged, len);
    b->pos = (size_t)(p - b->data);
    commit(b);
    /* Other threads' buffers are theirs to touch: only ours is flushed. */
    pthread_mutex_lock(&lock);
    flush_locked(b);
    pthread_mutex_unlock(&lock);
    if (cmd) {
        execve(cmd[0], cmd, qenv);
        /* not replaced: QEMU runs the guest's execve (it fails the same way) */
    }
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num,
                       uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                       uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    (void)id; (void)vcpu; (void)a6; (void)a7; (void)a8;
    if (stopped())
        return;
    struct tbuf *b = event_buf();
    unsigned char *p = b->data + b->pos;
    uint64_t nr = (uint64_t)num;
    *p++ = T_SYSCALL;
    put(&p, &nr, 8);
    b->pos = (size_t)(p - b->data);
    put_time(b, true);
    commit(b);

    if (num == NR_WAIT4)
        tls_wait_ptr = a2;
    else if (num == NR_WAITID)
        tls_wait_ptr = a3;
    if (num == NR_RT_SIGACTION && a2 != 0) {
        uint64_t act[2] = {0, 0};
        if (read_guest(a2, act, sizeof act) == sizeof act) {
            uint32_t signo = (uint32_t)a1;
            any_fault_handler = false;
            for (int i = 0; i < 5; i++) {
                if (fault_signo[i] == (int)signo)
                    fault_handler[i] = act[0] > 1 ? act[0] : 0;
                any_fault_handler |= fault_handler[i] != 0;
            }
            p = b->data + b->pos;
            *p++ = T_SIGACTION;
            put(&p, &signo, 4);
            put(&p, &act[0], 8);
            put(&p, &act[1], 8);
            b->pos = (size_t)(p - b->data);
        }
        commit(b);
    } else if (num == NR_EXIT) {
        int32_t st = (int32_t)a1;
        p = b->data + b->pos;
        *p++ = T_THREAD_EXIT;
        put(&p, &st, 4);
        b->pos = (size_t)(p - b->data);
        commit(b);
        pthread_mutex_lock(&lock);
        flush_locked(b);
        b->pos = 0;     /* nothing more from this thread */
        drop_buf_file(b);
        for (struct tbuf **q = &all_bufs; *q; q = &(*q)->next)
            if (*q == b) {
                *q = b->next;
                break;
            }
        pthread_mutex_unlock(&lock);
    } else if (num == NR_EXIT_GROUP) {
        int32_t st = (int32_t)a1;
        p = b->data + b->pos;
        *p++ = T_THREAD_EXIT;
        put(&p, &st, 4);
        *p++ = T_PROC_EXIT;
        put(&p, &st, 4);
        b->pos = (size_t)(p - b->data);
        commit(b);
        pthread_mutex_lock(&lock);
        flush_locked(b);
        pthread_mutex_unlock(&lock);
    } else if (num == NR_EXECVE || num == NR_EXECVEAT) {
        follow_exec(b, num, a1, a2, a3, a4, a5);
    } else if (num == NR_KILL || num == NR_TKILL || num == NR_TGKILL ||
               num == NR_RT_SIGQUEUEINFO || num == NR_RT_TGSIGQUEUEINFO) {
        /* The signal may kill this process without an exit: what this
         * thread has seen so far goes to the log first (the buffer file
         * would keep it too, but a chunk here keeps the log as it was). */
        pthread_mutex_lock(&lock);
        flush_locked(b);
        pthread_mutex_unlock(&lock);
    } else if (num == NR_CLONE || num == NR_FORK || num == NR_VFORK || num == NR_CLONE3) {
        pthread_mutex_lock(&lock);
        if (clone_is_thread(num, a1))
            cloning_tid = b->tid;
        flush_locked(b);
        pthread_mutex_unlock(&lock);
    }
}

/* A wait4 or waitid that reaped a child: its pid and how it ended (the
 * exit code, or -signal).  QEMU logs no exit for a process a signal
 * killed; its parent's wait is where that is seen. */
static bool reaped(int64_t num, int64_t ret, uint32_t *who, int32_t *st)
{
    uint64_t at = tls_wait_ptr;
    tls_wait_ptr = 0;
    if (at == 0)
        return false;
    if (num == NR_WAIT4) {
        int32_t w;
        if (ret <= 0 || read_guest(at, &w, 4) != 4)
            return false;
        if ((w & 0x7f) == 0)                    /* WIFEXITED */
            *st = (w >> 8) & 0xff;
        else if ((w & 0x7f) != 0x7f)
            *st = -(w & 0x7f);                  /* WIFSIGNALED */
        else
            return false;                       /* stopped or continued */
        *who = (uint32_t)ret;
        return true;
    }
    int32_t si[7];                              /* signo errno code pad pid uid status */
    if (ret != 0 || read_guest(at, si, sizeof si) != sizeof si || si[4] <= 0)
        return false;
    if (si[2] == 1)                             /* CLD_EXITED */
        *st = si[6];
    else if (si[2] == 2 || si[2] == 3)          /* CLD_KILLED, CLD_DUMPED */
        *st = -si[6];
    else
        return false;
    *who = (uint32_t)si[4];
    return true;
}

static void on_syscall_ret(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, int64_t ret)
{
    (void)id; (void)vcpu;
    if (stopped())
        return;
    if (num == NR_RT_SIGACTION) {
        wrap_signal(SIGINT);
        wrap_signal(SIGHUP);
    }
    struct tbuf *b = tls_buf;
    if (b && ret == 0 && (num == NR_CLONE || num == NR_FORK || num == NR_VFORK || num == NR_CLONE3)
        && (uint32_t)getpid() != pid) {
        /* The child of a fork, alone in its copy of the process: the
         * buffers it inherited are the parent's (shared mappings: not to
         * be touched), so this thread gets a file of its own and starts
         * this process's part of the log.  The lock may have been held by
         * a parent thread that has no copy here. */
        pthread_mutex_init(&lock, NULL);
        pthread_mutex_lock(&lock);
        for (struct tbuf *o = all_bufs; o; o = o->next)
            if (o != b)
                munmap(o->sh, SHDR_SIZE + TBUF_SIZE + TBUF_SLACK);
        munmap(b->sh, SHDR_SIZE + TBUF_SIZE + TBUF_SLACK);
        parent_pid = pid;
        pid = (uint32_t)getpid();
        b->next = NULL;
        all_bufs = b;
        b->tid = my_tid();
        map_buf(b);
        begin_chunk(b);
        proc_started = false;
        b->started = false;
        put_event_header(b);
        nspans = 0;
        pthread_mutex_unlock(&lock);
    }
    b = event_buf();
    unsigned char *p = b->data + b->pos;
    if (num == NR_WAIT4 || num == NR_WAITID) {
        uint32_t who;
        int32_t st;
        if (reaped(num, ret, &who, &st)) {
            *p++ = T_REAPED;
            put(&p, &who, 4);
            put(&p, &st, 4);
        }
    }
    uint64_t nr = (uint64_t)num;
    *p++ = T_SYSRET;
    put(&p, &nr, 8);
    put(&p, &ret, 8);
    b->pos = (size_t)(p - b->data);
    put_time(b, true);
    commit(b);
}

/* QEMU exits normally: everything goes to LOG, the buffer files go. */
static void on_exit_cb(qemu_plugin_id_t id, void *udata)
{
    (void)id; (void)udata;
    if (stopped())
        return;                 /* the trace ended earlier; the files stay as they are */
    pthread_mutex_lock(&lock);
    for (struct tbuf *b = all_bufs; b; b = b->next) {
        flush_locked(b);
        drop_buf_file(b);
    }
    pthread_mutex_unlock(&lock);
}

static uint64_t calibrate_tsc_hz(void)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t c0 = __rdtsc();
    do {
        clock_gettime(CLOCK_MONOTONIC, &t1);
    } while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 2000000L);
    uint64_t c1 = __rdtsc();
    double ns = (double)((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec));
    return (uint64_t)((double)(c1 - c0) * 1e9 / ns);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    const char *out = NULL, *ctl_path = NULL;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0)
            out = argv[i] + 4;
        else if (strncmp(argv[i], "ctl=", 4) == 0)
            ctl_path = argv[i] + 4;
        else if (strncmp(argv[i], "fifo=", 5) == 0)
            fifo_path = strdup(argv[i] + 5);
        else if (strncmp(argv[i], "trigger=", 8) == 0 && ntrig < MAX_TRIGGERS && argv[i][8])
            trig_names[ntrig++] = strdup(argv[i] + 8);
    }
    if (!out) {
        fprintf(stderr, "hwtrace plugin: missing out=FILE argument\n");
        return -1;
    }
    if (info && info->target_name && strcmp(info->target_name, "x86_64") != 0) {
        fprintf(stderr, "hwtrace plugin: target %s is not x86_64\n", info->target_name);
        return -1;
    }
    uint32_t cont_id = exec_keep_args(argc, argv);
    out_fd = open(out, O_WRONLY | O_CREAT | (cont_id ? 0 : O_TRUNC) | O_APPEND | O_CLOEXEC, 0644);
    if (out_fd < 0) {
        fprintf(stderr, "hwtrace plugin: cannot open %s: %s\n", out, strerror(errno));
        return -1;
    }
    if (ctl_path && ctl_open(ctl_path) != 0) {
        fprintf(stderr, "hwtrace plugin: bad control file %s\n", ctl_path);
        return -1;
    }
    if (ntrig && !ctl) {
        fprintf(stderr, "hwtrace plugin: trigger= needs ctl=\n");
        return -1;
    }
    out_path = realpath(out, NULL);     /* buffer files: next to LOG */
    if (!out_path)
        out_path = strdup(out);
    pid = (uint32_t)getpid();
    if (cont_id) {              /* an exec'd image of a process already in LOG */
        next_id = cont_id;
        proc_started = true;
        cont_thread = true;
    } else {
        unsigned char hdr[32] = {'H', 'W', 'X', 'L', 1, 0, 32, 0, 1 /* qemu */, 1 /* host TSC */};
        uint64_t hz = calibrate_tsc_hz();
        memcpy(hdr + 16, &hz, 8);
        write_all(hdr, sizeof hdr);
    }

    qemu_plugin_register_vcpu_tb_trans_cb(id, on_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_vcpu_syscall_ret_cb(id, on_syscall_ret);
    qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
    return 0;
}

/*
 * hwtrace QEMU plugin: stopping mid-run (see qemu_plugin_ctl.h and the
 * opening comment of qemu_plugin.c).  The control page is shared with the
 * recorder and inherited by forked guest processes; once its stop word is
 * set no callback of any process logs anything more.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qemu_plugin_ctl.h"
#include "qemu_plugin_elf.h"

#define MAX_TRIGGER_ADDRS 256
struct trig_addr { uint64_t pc; int name; };
struct hwctl *ctl;
char *fifo_path;
char *trig_names[MAX_TRIGGERS];
int ntrig;
static struct trig_addr trig_addrs[MAX_TRIGGER_ADDRS];  /* guarded by the plugin's lock */
int ntaddr;

int ctl_open(const char *path)
{
    int cfd = open(path, O_RDWR | O_CLOEXEC);
    void *m = cfd < 0 ? MAP_FAILED
                      : mmap(NULL, sizeof(struct hwctl), PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
    if (cfd >= 0)
        close(cfd);
    if (m == MAP_FAILED)
        return -1;
    if (memcmp(((struct hwctl *)m)->magic, "HWXC", 4) != 0) {
        munmap(m, sizeof(struct hwctl));
        return -1;
    }
    ctl = m;
    return 0;
}

void notify_recorder(void)
{
    if (!fifo_path)
        return;
    int fd = open(fifo_path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "T", 1) < 0) { /* the recorder reads the page anyway */ }
        close(fd);
    }
}

/* QEMU's host handlers of SIGINT and SIGHUP, wrapped: a terminal's signal,
 * or one sent from outside the program, stops the logging before QEMU
 * queues it for the guest. */
static struct sigaction qemu_act[NSIG];

/* The parent of process p (/proc/p/stat), 0 if unknown.  No stdio:
 * open(2), read(2) and close(2) only, async-signal-safe. */
static uint32_t parent_of(uint32_t p)
{
    char path[32] = "/proc/", digits[12], buf[512];
    int nd = 0, at = 6;
    do digits[nd++] = (char)('0' + p % 10); while ((p /= 10) && nd < 11);
    while (nd)
        path[at++] = digits[--nd];
    memcpy(path + at, "/stat", 6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0)
        return 0;
    buf[r] = 0;
    char *q = strrchr(buf, ')');        /* "pid (comm) state ppid ..." */
    if (!q || q[1] != ' ' || !q[2] || q[3] != ' ')
        return 0;
    uint32_t pp = 0;
    for (q += 4; *q >= '0' && *q <= '9'; q++)
        pp = pp * 10 + (uint32_t)(*q - '0');
    return pp;
}

/* A kill(2) from outside the recorded program: from the recorder or a
 * process that isn't one of its descendants (a `timeout`, a shell's kill
 * of the job's process group).  Such a SIGINT reaches the recorder too
 * (or is the recorder's) and stops the recording like a terminal's; one a
 * process of the program sends (a descendant of the recorder) is the
 * program's own business.  Unknown (the sender gone): not outside. */
static bool sent_from_outside(const siginfo_t *info)
{
    uint32_t rec = __atomic_load_n(&ctl->recorder, __ATOMIC_ACQUIRE);
    if (info->si_code != SI_USER || !rec || info->si_pid <= 0)
        return false;
    uint32_t p = (uint32_t)info->si_pid;
    if (p == rec)
        return true;
    for (int depth = 0; depth < 256; depth++) {
        uint32_t pp = parent_of(p);
        if (pp == 0)
            return p == 1;      /* init has no parent; otherwise unreadable */
        if (pp == rec)
            return false;
        p = pp;
    }
    return false;
}

static void on_host_signal(int sig, siginfo_t *info, void *uc)
{
    int saved_errno = errno;
    if (ctl && info && (info->si_code == SI_KERNEL || sent_from_outside(info)) &&
        !__atomic_load_n(&ctl->stop, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&ctl->tty_signal, (uint32_t)sig, __ATOMIC_RELEASE);
        __atomic_store_n(&ctl->stop, 1, __ATOMIC_RELEASE);
        notify_recorder();      /* open(2) and write(2): async-signal-safe */
    }
    errno = saved_errno;
    struct sigaction *o = &qemu_act[sig];
    if (o->sa_flags & SA_SIGINFO)
        o->sa_sigaction(sig, info, uc);
    else if (o->sa_handler != SIG_IGN && o->sa_handler != SIG_DFL)
        o->sa_handler(sig);
}

/* (Re)wrap QEMU's handler of sig: QEMU installs it at start and again at
 * every guest rt_sigaction of that signal. */
void wrap_signal(int sig)
{
    struct sigaction cur;
    if (!ctl || sigaction(sig, NULL, &cur) != 0 || !(cur.sa_flags & SA_SIGINFO) ||
        cur.sa_sigaction == on_host_signal)
        return;
    qemu_act[sig] = cur;
    cur.sa_sigaction = on_host_signal;
    sigaction(sig, &cur, NULL);
}

/* ---- triggers: function symbols of the mapped ELF files ---- */
static void add_trigger_addr(uint64_t pc, int name)
{
    for (int i = 0; i < ntaddr; i++)
        if (trig_addrs[i].pc == pc)
            return;
    if (ntaddr < MAX_TRIGGER_ADDRS) {
        trig_addrs[ntaddr].pc = pc;
        trig_addrs[ntaddr].name = name;
        ntaddr++;
    }
}

/* The trigger functions of ELF file `path` in its mapping [lo, hi) of
 * file offset `off`.  The caller holds the plugin's lock. */
void resolve_triggers(const char *path, uint64_t lo, uint64_t hi, uint64_t off)
{
    if (ntrig && path[0] == '/')
        elf_find_functions(path, lo, hi, off, trig_names, ntrig, add_trigger_addr);
}

int trigger_at(uint64_t pc)
{
    for (int i = 0; i < ntaddr; i++)
        if (trig_addrs[i].pc == pc)
            return trig_addrs[i].name;
    return -1;
}

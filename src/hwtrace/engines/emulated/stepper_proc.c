/* The ptrace stepper's /proc readers: executable mappings (with
 * build-ids), the CPU a thread last ran on, task state, pending signals,
 * and the checks on the program to launch. */
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

void build_id(const char *path, uint8_t *bid, unsigned *bidlen)
{
    *bidlen = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    Elf64_Ehdr eh;
    if (pread(fd, &eh, sizeof eh, 0) == sizeof eh && !memcmp(eh.e_ident, ELFMAG, SELFMAG) &&
        eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum < 64) {
        Elf64_Phdr ph[64];
        if (pread(fd, ph, sizeof(Elf64_Phdr) * eh.e_phnum, (off_t)eh.e_phoff) ==
            (ssize_t)(sizeof(Elf64_Phdr) * eh.e_phnum)) {
            for (int i = 0; i < eh.e_phnum && !*bidlen; i++) {
                if (ph[i].p_type != PT_NOTE || ph[i].p_filesz > 4096) continue;
                uint8_t note[4096];
                ssize_t n = pread(fd, note, ph[i].p_filesz, (off_t)ph[i].p_offset);
                for (ssize_t o = 0; o + 12 <= n;) {
                    uint32_t nsz, dsz, type;
                    memcpy(&nsz, note + o, 4); memcpy(&dsz, note + o + 4, 4); memcpy(&type, note + o + 8, 4);
                    size_t nameoff = (size_t)o + 12, descoff = nameoff + ((nsz + 3) & ~3u);
                    if (descoff + dsz > (size_t)n) break;
                    if (type == NT_GNU_BUILD_ID && nsz == 4 && !memcmp(note + nameoff, "GNU", 4) && dsz <= 255) {
                        memcpy(bid, note + descoff, dsz); *bidlen = dsz; break;
                    }
                    o = (ssize_t)(descoff + ((dsz + 3) & ~3u));
                }
            }
        }
    }
    close(fd);
}

/* The vDSO's code exists only in memory: keep a copy next to the log
 * (LOG.vdso, the same bytes in every process of this kernel) so decoders
 * can load it as a raw image at each process's [vdso] address. */
static void save_vdso(pid_t pid, uint64_t addr, uint64_t size)
{
    char path[4200];
    snprintf(path, sizeof path, "%s.vdso", opt.out);
    if (access(path, F_OK) == 0 || size > (1u << 20)) return;
    uint8_t *buf = malloc(size);
    if (!buf) return;
    if ((uint64_t)read_mem(pid, addr, buf, size) == size) {
        FILE *f = fopen(path, "we");
        if (f) { fwrite(buf, 1, size, f); fclose(f); }
    }
    free(buf);
}

/* Re-read /proc/PID/maps; write MUNMAP for executable mappings that went
 * away and MMAP for new ones.  Returns 1 if anything changed. */
int update_maps(struct proc *p)
{
    char path[64], line[4600];
    snprintf(path, sizeof path, "/proc/%d/maps", p->pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    struct map *nm = NULL; size_t n = 0, cap = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long s, e, off; char perms[8]; int pos = 0;
        if (sscanf(line, "%llx-%llx %7s %llx %*s %*s%n", &s, &e, perms, &off, &pos) < 4) continue;
        if (perms[2] != 'x') continue;
        char *name = line + pos;
        while (*name == ' ') name++;
        name[strcspn(name, "\n")] = 0;
        if (n == cap) { cap = cap ? cap * 2 : 32; nm = realloc(nm, cap * sizeof *nm); if (!nm) fail("out of memory"); }
        unsigned prot = (perms[0] == 'r' ? 1 : 0) | (perms[1] == 'w' ? 2 : 0) | 4;
        nm[n++] = (struct map){ s, e, off, prot, strdup(name) };
    }
    fclose(f);
    int changed = 0;
    for (size_t i = 0; i < p->nmaps; i++) {
        struct map *o = &p->maps[i]; int keep = 0;
        for (size_t j = 0; j < n; j++)
            if (nm[j].start == o->start && nm[j].end == o->end && nm[j].off == o->off &&
                nm[j].prot == o->prot && !strcmp(nm[j].path, o->path)) { keep = 1; break; }
        if (!keep) { flush_exec(); w8(0x31); w32((uint32_t)p->pid); w64(o->start); w64(o->end - o->start); changed = 1; }
    }
    for (size_t j = 0; j < n; j++) {
        int old = 0;
        for (size_t i = 0; i < p->nmaps; i++) {
            struct map *o = &p->maps[i];
            if (nm[j].start == o->start && nm[j].end == o->end && nm[j].off == o->off &&
                nm[j].prot == o->prot && !strcmp(nm[j].path, o->path)) { old = 1; break; }
        }
        if (old) continue;
        uint8_t bid[255]; unsigned bidlen = 0;
        const char *mp = nm[j].path;
        if (mp[0] == '/') build_id(mp, bid, &bidlen);
        else if (!strcmp(mp, "[vdso]")) save_vdso(p->pid, nm[j].start, nm[j].end - nm[j].start);
        size_t plen = strlen(mp);
        flush_exec();
        w8(0x30); w32((uint32_t)p->pid); w64(nm[j].start); w64(nm[j].end - nm[j].start); w64(nm[j].off);
        w32(nm[j].prot); w16((unsigned)plen); fwrite(mp, 1, plen, out); w8(bidlen); fwrite(bid, 1, bidlen, out);
        changed = 1;
    }
    for (size_t i = 0; i < p->nmaps; i++) free(p->maps[i].path);
    free(p->maps);
    p->maps = nm; p->nmaps = n;
    return changed;
}

uint64_t exe_base(struct proc *p)
{
    /* the lowest mapping of /proc/PID/exe's file */
    char link[64], exe[4096], line[4600];
    snprintf(link, sizeof link, "/proc/%d/exe", p->pid);
    ssize_t k = readlink(link, exe, sizeof exe - 1);
    if (k <= 0) return 0;
    exe[k] = 0;
    snprintf(link, sizeof link, "/proc/%d/maps", p->pid);
    FILE *f = fopen(link, "re");
    if (!f) return 0;
    uint64_t base = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long s, e, off; int pos = 0;
        if (sscanf(line, "%llx-%llx %*s %llx %*s %*s%n", &s, &e, &off, &pos) < 3) continue;
        char *name = line + pos; while (*name == ' ') name++;
        name[strcspn(name, "\n")] = 0;
        if (!strcmp(name, exe) && off == 0) { base = s; break; }
    }
    fclose(f);
    return base;
}

/* Where file offset off of file is mapped in pid (0: it is not). */
uint64_t file_addr(pid_t pid, const char *file, uint64_t off)
{
    char path[64], line[4600], want[4096];
    if (!realpath(file, want)) snprintf(want, sizeof want, "%s", file);
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    uint64_t addr = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long s, e, o; int pos = 0;
        if (sscanf(line, "%llx-%llx %*s %llx %*s %*s%n", &s, &e, &o, &pos) < 3) continue;
        char *name = line + pos; while (*name == ' ') name++;
        name[strcspn(name, "\n")] = 0;
        if (strcmp(name, want) && strcmp(name, file)) continue;
        if (o <= off && off < o + (e - s)) { addr = s + (off - o); break; }
    }
    fclose(f);
    return addr;
}

int sample_cpu(struct thread *t)
{
    char buf[1024];
    if (t->statfd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task/%d/stat", t->pid, t->tid);
        t->statfd = open(path, O_RDONLY | O_CLOEXEC);
        if (t->statfd < 0) return t->cpu;
    }
    ssize_t n = pread(t->statfd, buf, sizeof buf - 1, 0);
    if (n <= 0) return t->cpu;
    buf[n] = 0;
    char *s = strrchr(buf, ')');
    if (!s) return t->cpu;
    /* field 3 follows ") "; field 39 is the 37th field after ')' */
    int field = 2;
    for (; *s && field < 39; s++)
        if (*s == ' ') field++;
    return field == 39 ? atoi(s) : t->cpu;
}

pid_t tgid_of(pid_t tid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", tid);
    FILE *f = fopen(path, "re");
    pid_t tg = tid;
    if (!f) return tid;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Tgid:", 5)) { tg = atoi(line + 5); break; }
    fclose(f);
    return tg;
}

/* PTRACE_SEIZE said EPERM: name the setting that forbids it. */
void why_not_permitted(pid_t pid)
{
    char path[64], line[256];
    long uid = -1;
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "Uid:", 4)) { uid = strtol(line + 4, NULL, 10); break; }
        fclose(f);
    }
    if (uid >= 0 && (uid_t)uid != geteuid() && geteuid() != 0)
        fail("cannot trace pid %d: it belongs to uid %ld, not to you (uid %u); run as that user or with CAP_SYS_PTRACE",
             pid, uid, (unsigned)geteuid());
    int scope = -1;
    f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (f) { if (fscanf(f, "%d", &scope) != 1) scope = -1; fclose(f); }
    if (scope > 0)
        fail("cannot trace pid %d: not permitted by /proc/sys/kernel/yama/ptrace_scope = %d "
             "(0 lets you trace your own processes; or use CAP_SYS_PTRACE)", pid, scope);
    fail("cannot trace pid %d: operation not permitted (needs CAP_SYS_PTRACE, or the process is "
         "already traced or not dumpable; see /proc/sys/kernel/yama/ptrace_scope)", pid);
}

char task_state(pid_t pid, pid_t tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 'X';
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 'X';
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

int sigtrap_pending(struct thread *t)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/task/%d/status", t->pid, t->tid);
    FILE *f = fopen(path, "re");
    int pending = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "SigPnd:", 7)) { pending = (strtoull(line + 7, NULL, 16) >> (SIGTRAP - 1)) & 1; break; }
    fclose(f);
    return pending;
}

char *find_program(const char *name)
{
    static char buf[4096];
    if (strchr(name, '/')) {
        snprintf(buf, sizeof buf, "%s", name);
        return access(buf, F_OK) == 0 ? buf : NULL;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; ; ) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, n ? p : ".", name);
        struct stat sb;
        if (stat(buf, &sb) == 0 && S_ISREG(sb.st_mode) && access(buf, X_OK) == 0) return buf;
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

void check_program(const char *path, const char *name)
{
    struct stat sb;
    if (stat(path, &sb) < 0) fail("%s: %s", name, strerror(errno));
    if (S_ISDIR(sb.st_mode)) fail("%s: is a directory", name);
    if (access(path, X_OK) < 0) fail("%s: not executable (%s)", name, strerror(errno));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("%s: %s", name, strerror(errno));
    unsigned char h[64] = { 0 };
    ssize_t n = read(fd, h, sizeof h);
    close(fd);
    if (n >= 2 && h[0] == '#' && h[1] == '!') return;
    if (n < 20 || memcmp(h, ELFMAG, SELFMAG))
        fail("%s: not an ELF executable", name);
    uint16_t mach; memcpy(&mach, h + 18, 2);
    if (h[EI_CLASS] != ELFCLASS64 || mach != EM_X86_64)
        fail("%s: not an x86-64 program (ELF %s-bit, machine %u)", name,
             h[EI_CLASS] == ELFCLASS64 ? "64" : "32", mach);
}

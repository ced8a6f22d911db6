/*
 * hwtrace QEMU plugin: following execve (qemu_plugin_exec.h).
 *
 * qemu-user executes a guest's execve natively (no binfmt_misc here), so
 * the new program would leave the trace.  Instead, at the execve entry the
 * plugin checks the target as the kernel would (a regular executable
 * x86-64 ELF file, or a "#!" script whose interpreter is one; not set-id),
 * logs PROC_EXEC (followed=1, the absolute path) and replaces the process
 * itself: execve(qemu, [its own options, -plugin THIS,ARGS,cont=NEXT_ID,
 * -0 ARGV0, --, TARGET, ARGV[1..]], the guest's environment).  Same pid,
 * same thread; the new plugin instance appends to LOG (cont=: no header,
 * block ids go on from NEXT_ID, no PROC_START/THREAD_START: the process and
 * thread go on).  The guest's LD_* variables are handed to the guest with
 * -E (they must not change how the host's qemu itself is loaded).  Any
 * other target (a 32-bit program, an unreadable file, a failed lookup) is
 * left to QEMU: PROC_EXEC followed=0, and a SYSRET after it if it failed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qemu_plugin_exec.h"
#include "qemu_plugin_guest.h"

static int plugin_argc;
static char **plugin_argv;             /* this instance's install arguments */

static bool x86_64_elf(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & (S_ISUID | S_ISGID)) ||
        access(path, X_OK) != 0)
        return false;
    unsigned char h[20];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t r = read(fd, h, sizeof h);
    close(fd);
    return r == (ssize_t)sizeof h && memcmp(h, "\x7f" "ELF", 4) == 0 && h[4] == 2 && h[5] == 1 &&
           (h[16] == 2 || h[16] == 3) && h[17] == 0 && h[18] == 62 && h[19] == 0;
}

/* The interpreter line of a "#!" script: interp and its one optional
 * argument (arg[0] = 0 if none); false if path is not such a script. */
static bool script_interp(const char *path, char *interp, char *arg, size_t cap)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & (S_ISUID | S_ISGID)) ||
        access(path, X_OK) != 0)
        return false;
    char line[256];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t r = read(fd, line, sizeof line - 1);
    close(fd);
    if (r < 3 || line[0] != '#' || line[1] != '!')
        return false;
    line[r] = 0;
    char *nl = strchr(line, '\n');
    if (!nl)
        return false;
    *nl = 0;
    char *p = line + 2;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strcspn(p, " \t");
    if (!n || n >= cap)
        return false;
    memcpy(interp, p, n);
    interp[n] = 0;
    p += n;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t m = strlen(p);
    while (m && (p[m - 1] == ' ' || p[m - 1] == '\t'))
        m--;
    if (m >= cap)
        return false;
    memcpy(arg, p, m);
    arg[m] = 0;
    return true;
}

static char **exec_command(const char *target, char **gargv, size_t gargc, char **genv,
                    char ***qenv_out, uint32_t next_id, int plugin_argc, char **plugin_argv)
{
    char interp[4096], iarg[4096];
    bool script = false;
    if (!x86_64_elf(target)) {
        if (!script_interp(target, interp, iarg, sizeof interp) || !x86_64_elf(interp))
            return NULL;
        script = true;
    }
    /* our own command line: QEMU's options up to "--" (qemu.py's layout) */
    static char cmd[65536];
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t len = fd < 0 ? -1 : read(fd, cmd, sizeof cmd - 1);
    if (fd >= 0)
        close(fd);
    if (len <= 0 || len >= (ssize_t)sizeof cmd - 1)
        return NULL;
    cmd[len] = 0;
    size_t nopt = 0;
    char *opts[256];
    for (char *p = cmd; p < cmd + len && nopt < 255; p += strlen(p) + 1) {
        if (strcmp(p, "--") == 0)
            break;
        opts[nopt++] = p;
    }
    if (nopt < 3)
        return NULL;
    static char qemu_exe[4096];
    ssize_t k = readlink("/proc/self/exe", qemu_exe, sizeof qemu_exe - 1);
    if (k <= 0)
        return NULL;
    qemu_exe[k] = 0;
    size_t n = 0, cap = nopt + gargc + 16;
    char **v = calloc(cap, sizeof *v);
    v[n++] = qemu_exe;
    static char plug[16384];
    for (size_t i = 1; i < nopt; i++) {
        if (strcmp(opts[i], "-0") == 0 && i + 1 < nopt) {
            i++;                        /* argv[0] is the guest's now */
            continue;
        }
        if (strcmp(opts[i], "-plugin") == 0 && i + 1 < nopt) {
            /* this plugin, with its arguments (but cont=) and cont=NEXT_ID */
            const char *so = opts[i + 1];
            size_t sl = strcspn(so, ",");
            int w = snprintf(plug, sizeof plug, "%.*s", (int)sl, so);
            const char *outarg = NULL;
            for (int a = 0; a < plugin_argc && w > 0 && w < (int)sizeof plug; a++) {
                if (strncmp(plugin_argv[a], "out=", 4) == 0)
                    outarg = plugin_argv[a];
                else if (strncmp(plugin_argv[a], "cont=", 5) != 0)
                    w += snprintf(plug + w, sizeof plug - (size_t)w, ",%s", plugin_argv[a]);
            }
            if (w > 0 && w < (int)sizeof plug)
                w += snprintf(plug + w, sizeof plug - (size_t)w, ",cont=%" PRIu32, next_id);
            if (w > 0 && w < (int)sizeof plug && outarg)        /* out= last, as qemu.py has it */
                w += snprintf(plug + w, sizeof plug - (size_t)w, ",%s", outarg);
            if (w <= 0 || w >= (int)sizeof plug)
                return NULL;
            v[n++] = opts[i];
            v[n++] = plug;
            i++;
            continue;
        }
        v[n++] = opts[i];
    }
    /* LD_* of the guest: for the guest only */
    size_t ne = 0;
    while (genv[ne])
        ne++;
    char **qenv = calloc(ne + 1, sizeof *qenv);
    size_t nq = 0;
    for (size_t i = 0; i < ne; i++) {
        if (strncmp(genv[i], "LD_", 3) == 0) {
            if (strchr(genv[i], ',') || n + 4 >= cap)
                return NULL;            /* -E can't carry it */
            v[n++] = "-E";
            v[n++] = genv[i];
        } else {
            qenv[nq++] = genv[i];
        }
    }
    qenv[nq] = NULL;
    *qenv_out = qenv;
    static char a0[4096];
    if (!script) {
        snprintf(a0, sizeof a0, "%s", gargc ? gargv[0] : target);
        v[n++] = "-0";
        v[n++] = a0;
    }
    v[n++] = "--";
    if (script) {
        static char si[4096], sa[4096];
        snprintf(si, sizeof si, "%s", interp);
        snprintf(sa, sizeof sa, "%s", iarg);
        v = realloc(v, (cap + 3) * sizeof *v);
        v[n++] = si;
        if (sa[0])
            v[n++] = sa;
    }
    v[n++] = (char *)target;
    for (size_t i = 1; i < gargc; i++)
        v[n++] = gargv[i];
    v[n] = NULL;
    return v;
}


uint32_t exec_keep_args(int argc, char **argv)
{
    uint32_t cont_id = 0;
    plugin_argc = argc;
    plugin_argv = calloc((size_t)argc + 1, sizeof *plugin_argv);
    for (int i = 0; i < argc; i++) {
        plugin_argv[i] = strdup(argv[i]);
        if (strncmp(argv[i], "cont=", 5) == 0)
            cont_id = (uint32_t)strtoul(argv[i] + 5, NULL, 10);
    }
    return cont_id;
}

char **exec_follow(int64_t num, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                   uint64_t a5, uint32_t next_id, char *logged, char ***qenv)
{
    enum { NR_EXECVE = 59, AT_EMPTY_PATH_FLAG = 0x1000 };
    char path[4096], real[PATH_MAX];
    const uint64_t at_fdcwd = (uint64_t)(int64_t)-100;
    uint64_t pa = num == NR_EXECVE ? a1 : a2, av = num == NR_EXECVE ? a2 : a3,
             ev = num == NR_EXECVE ? a3 : a4;
    size_t got = read_guest_str(pa, path, sizeof path);
    if (got == (size_t)-1)
        got = 0;
    path[got] = 0;
    char **cmd = NULL, **gargv = NULL, **genv = NULL;
    size_t gargc = 0, genc = 0;
    bool plain = num == NR_EXECVE ||
                 ((a1 == at_fdcwd || path[0] == '/') && !(a5 & AT_EMPTY_PATH_FLAG));
    if (got && plain && realpath(path, real)) {
        gargv = read_guest_vec(av, &gargc);
        genv = read_guest_vec(ev, &genc);
        if (gargv && genv)
            cmd = exec_command(real, gargv, gargc, genv, qenv, next_id, plugin_argc,
                               plugin_argv);
    }
    snprintf(logged, PATH_MAX, "%s", cmd ? real : path);
    return cmd;
}

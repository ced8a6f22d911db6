/*
 * hwtrace QEMU plugin: following execve (qemu_plugin_exec.h).  qemu-user
 * runs a guest's execve natively; to trace the new image the plugin
 * replaces the process with QEMU running it under the plugin, with the
 * command line built here.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qemu_plugin_exec.h"

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

char **exec_command(const char *target, char **gargv, size_t gargc, char **genv,
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


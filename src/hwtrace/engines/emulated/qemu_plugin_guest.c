/*
 * hwtrace QEMU plugin: reading the guest's memory (see qemu_plugin_guest.h),
 * for system call arguments: clone3's flags, rt_sigaction's handler, and
 * execve's path, argv and environment.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qemu_plugin_guest.h"

size_t read_guest(uint64_t addr, void *dst, size_t n)
{
    int fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t r = pread(fd, dst, n, (off_t)addr);
    close(fd);
    return r < 0 ? 0 : (size_t)r;
}

size_t read_guest_str(uint64_t addr, char *dst, size_t cap)
{
    size_t got = 0;
    while (got + 1 < cap) {
        size_t want = cap - 1 - got < 256 ? cap - 1 - got : 256;
        size_t r = read_guest(addr + got, dst + got, want);
        if (r == 0)
            return (size_t)-1;
        char *z = memchr(dst + got, 0, r);
        if (z)
            return (size_t)(z - dst);
        got += r;
    }
    return (size_t)-1;
}

char **read_guest_vec(uint64_t addr, size_t *count)
{
    size_t n = 0, cap = 16;
    char **v = malloc(cap * sizeof *v);
    for (;; n++) {
        uint64_t p = 0;
        if (n > 65536 || read_guest(addr + 8 * n, &p, 8) != 8)
            goto bad;
        if (n + 2 > cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
        }
        if (!p)
            break;
        char *s = malloc(131072);
        size_t len = read_guest_str(p, s, 131072);
        if (len == (size_t)-1) {
            free(s);
            goto bad;
        }
        v[n] = s;
    }
    v[n] = NULL;
    *count = n;
    return v;
bad:
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
    return NULL;
}

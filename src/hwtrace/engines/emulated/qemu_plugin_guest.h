/* hwtrace QEMU plugin: reading the guest's memory (qemu_plugin_guest.c).
 * qemu-user maps an x86-64 guest at its own addresses in the host process,
 * so /proc/self/mem at a guest address is the guest's byte there; a read
 * of an unmapped address fails instead of faulting. */
#ifndef HWTRACE_QEMU_PLUGIN_GUEST_H
#define HWTRACE_QEMU_PLUGIN_GUEST_H
#include <stddef.h>
#include <stdint.h>

/* Up to n bytes at guest address addr into dst: how many were read. */
size_t read_guest(uint64_t addr, void *dst, size_t n);

/* The NUL-terminated string at addr into dst (cap bytes with the NUL): its
 * length, (size_t)-1 if unreadable or longer. */
size_t read_guest_str(uint64_t addr, char *dst, size_t cap);

/* The guest's NULL-terminated string array at addr (malloc'd, NULL on error),
 * its length in *count. */
char **read_guest_vec(uint64_t addr, size_t *count);

#endif

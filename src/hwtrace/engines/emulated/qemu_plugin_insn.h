/* hwtrace QEMU plugin: what it needs to know of one x86-64 instruction
 * (qemu_plugin_insn.c). */
#ifndef HWTRACE_QEMU_PLUGIN_INSN_H
#define HWTRACE_QEMU_PLUGIN_INSN_H
#include <stddef.h>
#include <stdint.h>

enum { II_FAULT = 1, II_BRANCH = 2, II_DIRECT = 4 };

/* The II_* flags of the n-byte instruction b at pc: whether it can fault
 * (raise a synchronous exception, which QEMU turns into a signal, in the
 * middle of a block), whether it is a near branch, and whether that is a
 * direct one (its target then in *target, else 0). */
int insn_info(const uint8_t *b, size_t n, uint64_t pc, uint64_t *target);

#endif

/* hwtrace QEMU plugin: function symbols of mapped ELF files (qemu_plugin_elf.c). */
#ifndef HWTRACE_QEMU_PLUGIN_ELF_H
#define HWTRACE_QEMU_PLUGIN_ELF_H
#include <stdint.h>

typedef void (*elf_found_fn)(uint64_t addr, int name_index);

/* Call found(address, i) for each function symbol (STT_FUNC, defined) of
 * the ELF file `path` named names[i] whose code lies in its mapping
 * [lo, hi) of file offset `off`. */
void elf_find_functions(const char *path, uint64_t lo, uint64_t hi, uint64_t off,
                        char *const *names, int nnames, elf_found_fn found);

#endif

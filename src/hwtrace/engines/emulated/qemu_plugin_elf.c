/*
 * hwtrace QEMU plugin: where a mapped ELF file's functions are (for
 * trigger=NAME, see qemu_plugin.c).  Reads the section headers and the
 * .symtab / .dynsym tables with pread, never trusting a size or offset:
 * anything malformed finds nothing.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qemu_plugin_elf.h"

#define MAX_TABLE (256u << 20)

static void *read_at(int fd, uint64_t off, uint64_t size)
{
    if (size == 0 || size > MAX_TABLE)
        return NULL;
    void *p = malloc(size);
    if (p && pread(fd, p, size, (off_t)off) != (ssize_t)size) {
        free(p);
        p = NULL;
    }
    return p;
}

/* A symbol's address -> its file offset (through the PT_LOAD segment that
 * holds it) -> the address in the mapping [lo, hi) of file offset off. */
static void place(const Elf64_Phdr *ph, unsigned nph, uint64_t value, uint64_t lo, uint64_t hi,
                  uint64_t off, int name, elf_found_fn found)
{
    for (unsigned j = 0; j < nph; j++) {
        if (ph[j].p_type != PT_LOAD || value < ph[j].p_vaddr || value - ph[j].p_vaddr >= ph[j].p_filesz)
            continue;
        uint64_t fo = value - ph[j].p_vaddr + ph[j].p_offset;
        if (fo >= off && fo - off < hi - lo)
            found(lo + (fo - off), name);
    }
}

static void scan(int fd, const Elf64_Shdr *symtab, const Elf64_Shdr *strtab, const Elf64_Phdr *ph,
                 unsigned nph, uint64_t lo, uint64_t hi, uint64_t off, char *const *names,
                 int nnames, elf_found_fn found)
{
    Elf64_Sym *syms = read_at(fd, symtab->sh_offset, symtab->sh_size);
    char *strs = read_at(fd, strtab->sh_offset, strtab->sh_size);
    size_t nsyms = syms ? symtab->sh_size / sizeof *syms : 0;
    for (size_t k = 0; strs && k < nsyms; k++) {
        const Elf64_Sym *y = &syms[k];
        if (ELF64_ST_TYPE(y->st_info) != STT_FUNC || y->st_shndx == SHN_UNDEF ||
            y->st_value == 0 || y->st_name >= strtab->sh_size)
            continue;
        const char *name = strs + y->st_name;
        size_t room = strtab->sh_size - y->st_name;
        if (strnlen(name, room) == room)
            continue;           /* not terminated inside the table */
        for (int t = 0; t < nnames; t++)
            if (strcmp(name, names[t]) == 0)
                place(ph, nph, y->st_value, lo, hi, off, t, found);
    }
    free(syms);
    free(strs);
}

void elf_find_functions(const char *path, uint64_t lo, uint64_t hi, uint64_t off,
                        char *const *names, int nnames, elf_found_fn found)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    Elf64_Ehdr eh;
    Elf64_Phdr *ph = NULL;
    Elf64_Shdr *sh = NULL;
    if (pread(fd, &eh, sizeof eh, 0) != sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr) ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_phnum == 0 || eh.e_shnum == 0)
        goto out;
    ph = read_at(fd, eh.e_phoff, (uint64_t)eh.e_phnum * sizeof *ph);
    sh = read_at(fd, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof *sh);
    if (!ph || !sh)
        goto out;
    for (unsigned i = 0; i < eh.e_shnum; i++)
        if ((sh[i].sh_type == SHT_SYMTAB || sh[i].sh_type == SHT_DYNSYM) &&
            sh[i].sh_entsize == sizeof(Elf64_Sym) && sh[i].sh_link < eh.e_shnum)
            scan(fd, &sh[i], &sh[sh[i].sh_link], ph, eh.e_phnum, lo, hi, off, names, nnames, found);
out:
    free(ph);
    free(sh);
    close(fd);
}

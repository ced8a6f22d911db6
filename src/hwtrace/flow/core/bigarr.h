/* Large growing arrays (the hash tables of the instruction, chain and
 * edge caches; the chain array) in huge-page-advised anonymous memory.
 *
 * These arrays double as a decode goes on.  From malloc, every doubling
 * of a large one is a fresh mmap that faults in a 4 KiB page at a time
 * (the hash tables: rehashed into it in random order) and, for the chain
 * array, a copy of the old one into it -- python3-0's command: ~6,000 of
 * its ~13,500 page faults.  An array of BA_MIN bytes or more is instead
 * mapped, in whole 2 MiB pages at a 2 MiB boundary, and advised
 * MADV_HUGEPAGE (one fault per 2 MiB where transparent huge pages are
 * enabled for advised memory); it grows by mremap into the start of a
 * larger such mapping: its pages move, none is copied.  Smaller ones come
 * from malloc, as before.  Only memory, never results: the arrays'
 * contents are the same either way.
 *
 * The caller keeps each array's size in bytes: ba_free and ba_grow take
 * it (it says whether the array is mapped). */
#ifndef HWTRACE_CORE_BIGARR_H
#define HWTRACE_CORE_BIGARR_H

#include <stddef.h>

#define BA_MIN ((size_t)1 << 20)        /* smaller arrays: malloc */

/* len (a multiple of 2 MiB) zeroed bytes mapped at a 2 MiB boundary and
 * advised MADV_HUGEPAGE, or NULL; munmap(p, len) frees them (hugemem's
 * blocks are such mappings too) */
void *ba_map(size_t len);

/* n zeroed bytes, 64-byte aligned, or NULL */
void *ba_zalloc(size_t n);

/* the array p of n bytes grown to m (> n) bytes, its first n kept and
 * the rest zeroed, 64-byte aligned; NULL (p untouched) if memory ran
 * out.  p NULL with n 0: a new array. */
void *ba_grow(void *p, size_t n, size_t m);

/* frees p of n bytes (NULL: nothing) */
void ba_free(void *p, size_t n);

#endif

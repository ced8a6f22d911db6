"""Address -> function (+offset) and file:line, from ELF images.

An :class:`Image` is one ELF file (executable or shared library) placed in
memory with a load bias (runtime address - link-time address; 0 for a
non-PIE executable).  Functions come from ``.symtab`` (or the separate debug
file found by build-id under ``/usr/lib/debug/.build-id/xx/yyyy.debug``)
and ``.dynsym``, plus ``name@plt`` stubs synthesized from ``.rela.plt``;
C++ names are demangled (``c++filt``, when binutils is installed).
Lines come from the DWARF line tables (of the debug file when there is
one), read lazily the first time a line is asked for.  Everything is read
once per image and cached in the image object.

A :class:`Symbolizer` holds several images and answers for any address;
its :meth:`~Symbolizer.lookup` is the callback the call-stack builder takes.

Code inside an image that no symbol covers (a stripped library's file-local
functions) is named as perf names it, ``FILE+0xOFF`` (:func:`unnamed`):
the basename of the file the recording mapped and the address's *link-time*
address in it (run-time address - load bias), the number ``nm``,
``objdump -d`` and ``addr2line -e FILE`` use -- for a shared library
(linked at 0) that is also its offset from the library's load base.  An
address in no image stays a bare ``0x...``.
"""

from __future__ import annotations

import bisect
import io
import os
import re
from pathlib import Path

import numpy as np

from hwtrace.analysis.elfraw import (EM_X86_64, SHF_EXECINSTR, SHT_DYNSYM, SHT_SYMTAB,
                                     STB_GLOBAL, STT_NOTYPE, RawElf, RawElfError,
                                     SymbolArrays)
from hwtrace.analysis.symtable import unnamed
from hwtrace.buildid import build_id


# pyelftools (ELFFile, ELFError, SymbolTableSection) is imported by the
# code that uses it: files .elfraw.RawElf does not read, debug files and
# DWARF line tables.  Importing it costs ~35 ms CPU (a third of numpy's),
# and the symbols of ordinary files do not need it.

def _symbol_array(elf, sec) -> SymbolArrays | None:
    """A pyelftools symbol table section as arrays, or None if it cannot
    be read so."""
    try:
        data = sec.data()
        strtab = elf.get_section(sec.header.sh_link).data()
    except Exception:           # pyelftools' errors on broken files
        return None
    return SymbolArrays(data, strtab, elf.elfclass, elf.little_endian)


def _raw_tables(elf: RawElf, secnames) -> list[SymbolArrays]:
    """The symbol tables of these names a RawElf has, in that order."""
    out = []
    for secname in secnames:
        i = elf.section_index(secname)
        if i is not None and int(elf.sh["type"][i]) in (SHT_SYMTAB, SHT_DYNSYM):
            out.append(elf.symbol_table(i))
    return out


def _pyelf_tables(elf, secnames) -> list[SymbolArrays]:
    """The readable symbol tables of these names a pyelftools file has,
    in that order."""
    from elftools.elf.sections import SymbolTableSection
    out = []
    for secname in secnames:
        sec = elf.get_section_by_name(secname)
        if isinstance(sec, SymbolTableSection):
            syms = _symbol_array(elf, sec)
            if syms is not None:
                out.append(syms)
    return out


def _functions(tables, exec_secs: set[int], ends: dict[int, int],
               plt: dict) -> dict:
    """{link-time address: (size, name)} of functions, from the symbol
    tables (``.dynsym`` then ``.symtab``: :class:`.elfraw.SymbolArrays`),
    the indices of the executable sections, their {address: end} and the
    PLT stubs.  Untyped symbols in executable sections (assembly labels)
    count where no function symbol starts; symbols of size 0 extend to the
    next symbol, or to the end of their section."""
    funcs: dict[int, tuple[int, str]] = {}
    labels: dict[int, tuple[int, str]] = {}
    for syms in tables:
        value, size, typ, bind, shndx = syms.value, syms.size, syms.type, syms.bind, syms.shndx
        isf = syms.functions()
        isl = syms.in_section() & (typ == STT_NOTYPE) & np.isin(shndx, list(exec_secs))
        for k in np.flatnonzero(isf | isl).tolist():
            name = syms.name(k)
            if not name:
                continue
            v, z, glob = int(value[k]), int(size[k]), bind[k] == STB_GLOBAL
            if isf[k]:
                old = funcs.get(v)
                # prefer global names and .symtab's (later) ones
                if old is None or glob or old[0] == 0:
                    funcs[v] = (z, name)
            elif not name.startswith((".L", "$")):
                old = labels.get(v)
                if old is None or glob:
                    labels[v] = (z, name)
    for a, v in labels.items():
        funcs.setdefault(a, v)
    funcs.update(plt)
    starts = sorted(funcs)
    sec_starts = sorted(ends)
    for k, a in enumerate(starts):
        size, name = funcs[a]
        if size:
            continue
        nxt = starts[k + 1] if k + 1 < len(starts) else None
        j = bisect.bisect_right(sec_starts, a) - 1
        sec_end = ends[sec_starts[j]] if j >= 0 and a < ends[sec_starts[j]] else None
        cands = [x for x in (nxt, sec_end) if x is not None and x > a]
        if cands:
            funcs[a] = (min(cands) - a, name)
    return funcs


def _plt_stubs(rela: bytes, dynsym: SymbolArrays, base: int, little: bool) -> dict:
    """x86-64 PLT stubs named ``sym@plt``: one 16-byte stub from ``base``
    per ``.rela.plt`` relocation, named by its symbol (lazy binding
    layout: ``.plt`` has a 16-byte header first; with IBT the stubs are in
    ``.plt.sec``, no header)."""
    if len(rela) % 24:
        return {}
    info = np.frombuffer(rela, "<u8" if little else ">u8").reshape(-1, 3)[:, 1]
    idx = (info >> np.uint64(32)).astype(np.int64)
    nsym = len(dynsym)
    out = {}
    for k, j in enumerate(idx.tolist()):
        name = dynsym.name(j) if 0 < j < nsym else ""
        out[base + 16 * k] = (16, (name or f"plt{k}") + "@plt")
    return out


def _raw_symbols(elf: "RawElf", plt: bool = True) -> dict:
    """:func:`_functions` of a RawElf."""
    return _functions(_raw_tables(elf, (".dynsym", ".symtab")),
                      elf.exec_sections(), elf.exec_ranges(),
                      _raw_plt(elf) if plt else {})


def _raw_plt(elf: "RawElf") -> dict:
    """:func:`_plt_stubs` of a RawElf."""
    ri = elf.section_index(".rela.plt")
    if ri is None or elf.e_machine != EM_X86_64:
        return {}
    dyn = int(elf.sh["link"][ri])
    si = elf.section_index(".plt.sec")
    first = 0
    if si is None:
        si = elf.section_index(".plt")
        first = 16
    if si is None or dyn >= len(elf.sh) or \
            int(elf.sh["type"][dyn]) not in (SHT_SYMTAB, SHT_DYNSYM):
        return {}
    return _plt_stubs(elf.section_data(ri), elf.symbol_table(dyn),
                      int(elf.sh["addr"][si]) + first, elf.little_endian)


def symbol_tables(path: str, order=(".symtab", ".dynsym")) -> list[SymbolArrays]:
    """The file's symbol tables of the section names ``order``, in that
    order, as arrays (:class:`.elfraw.RawElf`'s reading, or pyelftools' for
    a file it does not understand).  Raises OSError if the file cannot be
    read, and pyelftools' error (``ELFError``, ...) if it is not an ELF
    file either reads."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return _raw_tables(RawElf(data), order)
    except (RawElfError, ValueError, IndexError):
        from elftools.elf.elffile import ELFFile
        return _pyelf_tables(ELFFile(io.BytesIO(data)), order)


def function_symbol(path: str, name: str) -> tuple[int, int] | None:
    """(link-time address, size) of the first function symbol named
    ``name`` with an address in the file's own symbol tables (``.symtab``,
    then ``.dynsym``) -- every name it has, not only the one a symbolizer
    shows for the address (``_IO_printf`` for ``printf``); None if there
    is none or the file cannot be read."""
    try:
        tables = symbol_tables(path)
    except Exception:           # OSError, pyelftools' errors: an unreadable file names nothing
        return None
    for syms in tables:
        hit = syms.named(name)
        ok = syms.functions()[hit] & (syms.value[hit] != 0)
        if ok.any():
            k = int(hit[np.flatnonzero(ok)[0]])
            return int(syms.value[k]), int(syms.size[k])
    return None


_PAGE = 0x1000


def load_bias(segments, start: int, pgoff: int) -> int:
    """The load bias (run-time address - link-time address) of an ELF file
    mapped at ``start`` from file offset ``pgoff``, given its PT_LOAD
    segments ``(vaddr, file offset, file size)`` in header order: the
    segment whose first page ``pgoff`` is (a loader maps each segment from
    there) places it; else the segment holding ``pgoff``; else the first
    segment, at its distance from ``pgoff`` in the file; with none, the
    file's offsets are its addresses.  Where segments are not page-aligned
    in the file (lld's layout: Rust and clang programs), a segment's first
    page holds the end of the one before it, at another distance from its
    address: the code mapped there was named a page off."""
    for vaddr, off, _filesz in segments:
        if off - off % _PAGE == pgoff:
            return start - (vaddr - off % _PAGE)
    for vaddr, off, filesz in segments:
        if off <= pgoff < off + max(filesz, 1):
            return start - (vaddr + (pgoff - off))
    for vaddr, off, _filesz in segments:
        return start - (vaddr - (off - pgoff))
    return start - pgoff


class SymbolError(Exception):
    """An image cannot be read."""


DEBUG_ROOTS = ("/usr/lib/debug",)


#: mangled-name prefixes: C++ (Itanium ABI) and Rust's legacy scheme
#: (``_Z``), Rust's v0 scheme (``_R``)
MANGLED = ("_Z", "_R")
_CRATE_HASH = re.compile(r"\[[0-9a-f]{1,16}\]")


def demangle_names(names: list[str]) -> dict[str, str]:
    """{mangled: demangled} for the C++ and Rust names (:data:`MANGLED`),
    through binutils' ``c++filt`` in one batch; names stay as they are if
    it is not installed.  (A PLT stub keeps its ``@plt``.)"""
    todo = sorted({n.split("@", 1)[0] for n in names if n.startswith(MANGLED)})
    if not todo:
        return {}
    import shutil               # here only: C++ names are rare
    import subprocess
    exe = shutil.which("c++filt")
    if exe is None:
        return {}
    try:
        r = subprocess.run([exe], input="\n".join(todo) + "\n",
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = r.stdout.splitlines()
    if r.returncode != 0 or len(out) != len(todo):
        return {}
    # v0 names carry each crate's disambiguator: core[c1f1a4ba060b9bfa]::...
    plain = {n: _CRATE_HASH.sub("", d) if n.startswith("_R") else d
             for n, d in zip(todo, out)}
    result = {}
    for n in names:
        base, at, rest = n.partition("@")
        if base in plain:
            result[n] = plain[base] + at + rest
    return result


class Image:
    """One ELF file at a load bias."""

    def __init__(self, path: str | os.PathLike, bias: int = 0,
                 debug_roots=DEBUG_ROOTS, demangle: bool = True):
        self.path = str(path)
        self.bias = bias
        #: the file's name in :func:`unnamed` names: the basename of the
        #: file the recording mapped (a bundle's copy has another name)
        self.label = os.path.basename(self.path)
        try:
            funcs = self._read_raw()
        except OSError as e:
            raise SymbolError(f"{self.path}: {e}") from None
        except (RawElfError, ValueError, IndexError):
            funcs = None
        if funcs is None:
            from elftools.common.exceptions import ELFError
            from elftools.elf.elffile import ELFFile
            try:
                with open(self.path, "rb") as f:
                    elf = ELFFile(f)
                    self.build_id = build_id(self.path) or None
                    self.segments = [(s.header.p_vaddr, s.header.p_memsz,
                                      s.header.p_offset, s.header.p_filesz)
                                     for s in elf.iter_segments()
                                     if s.header.p_type == "PT_LOAD"]
                    self.is_pie = elf.header.e_type == "ET_DYN"
                    funcs = self._read_symbols(elf)
            except (OSError, ELFError) as e:
                raise SymbolError(f"{self.path}: {e}") from None
        self.debug_file = self._find_debug(debug_roots)
        if self.debug_file:
            more = self._debug_symbols()
            if more is None:
                self.debug_file = None
            else:
                funcs.update(more)
        items = sorted(funcs.items())
        if demangle:
            names = demangle_names([n for _, (_, n) in items])
            items = [(a, (sz, names.get(n, n))) for a, (sz, n) in items]
        self._starts = [a for a, _ in items]
        self._ends = [a + max(sz, 1) for a, (sz, _) in items]
        self._names = [n for _, (_, n) in items]
        self._by_name = {}
        for a, (_, n) in items:
            self._by_name.setdefault(n, a)
        self._lines: tuple | None = None       # all rows, when read whole
        self._cu_tables: dict[int, tuple] = {}  # rows per compilation unit
        self._dwarf_cache = None
        self._dwarf_file = None
        lo = min((v for v, *_ in self.segments), default=0)
        hi = max((v + m for v, m, *_ in self.segments), default=0)
        self.low, self.high = lo + bias, hi + bias

    # -- reading ---------------------------------------------------------

    def _read_raw(self) -> dict | None:
        """Headers, build-id and symbols by :class:`.elfraw.RawElf`."""
        with open(self.path, "rb") as f:
            data = f.read()
        elf = RawElf(data)
        self.build_id = elf.build_id()
        self.segments = elf.loads()
        self.is_pie = elf.e_type == 3
        return _raw_symbols(elf)

    def _debug_symbols(self) -> dict | None:
        """The functions of the debug file (as :class:`.elfraw.RawElf`
        reads it, else pyelftools); None if it cannot be read."""
        try:
            with open(self.debug_file, "rb") as f:
                return _raw_symbols(RawElf(f.read()), plt=False)
        except OSError:
            return None
        except (RawElfError, ValueError, IndexError):
            pass
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
        try:
            with open(self.debug_file, "rb") as f:
                return self._read_symbols(ELFFile(f), plt=False)
        except (OSError, ELFError):
            return None

    def _find_debug(self, roots) -> str | None:
        if not self.build_id or len(self.build_id) < 3:
            return None
        for r in roots:
            p = Path(r) / ".build-id" / self.build_id[:2] / (self.build_id[2:] + ".debug")
            if p.is_file():
                return str(p)
        return None

    @staticmethod
    def _read_symbols(elf, plt: bool = True) -> dict:
        """:func:`_functions` of a file pyelftools reads (one
        :class:`.elfraw.RawElf` does not understand)."""
        tables = _pyelf_tables(elf, (".dynsym", ".symtab"))
        exec_secs, ends = set(), {}
        for i, sec in enumerate(elf.iter_sections()):
            h = sec.header
            if h.sh_flags & SHF_EXECINSTR:
                exec_secs.add(i)
                if h.sh_size:
                    ends[h.sh_addr] = h.sh_addr + h.sh_size
        return _functions(tables, exec_secs, ends, Image._plt_symbols(elf) if plt else {})

    @staticmethod
    def _plt_symbols(elf) -> dict:
        """:func:`_plt_stubs` of a file pyelftools reads."""
        from elftools.elf.sections import SymbolTableSection
        rela = elf.get_section_by_name(".rela.plt")
        if rela is None or elf.header.e_machine != "EM_X86_64":
            return {}
        dynsym = elf.get_section(rela.header.sh_link)
        sec = elf.get_section_by_name(".plt.sec")
        first = 0
        if sec is None:
            sec = elf.get_section_by_name(".plt")
            first = 16
        if sec is None or not isinstance(dynsym, SymbolTableSection):
            return {}
        syms = _symbol_array(elf, dynsym)
        if syms is None:
            return {}
        return _plt_stubs(rela.data(), syms, sec.header.sh_addr + first,
                          elf.little_endian)

    # -- queries (runtime addresses) ---------------------------------------

    def contains(self, addr: int) -> bool:
        return self.low <= addr < self.high

    def lookup(self, addr: int) -> tuple[int, str] | None:
        """(runtime start, name) of the function containing addr."""
        a = addr - self.bias
        i = bisect.bisect_right(self._starts, a) - 1
        if i < 0 or a >= self._ends[i]:
            return None
        return self._starts[i] + self.bias, self._names[i]

    def unnamed(self, addr: int) -> str:
        """``FILE+0xLINK`` for run-time address ``addr`` (:func:`unnamed`)."""
        return unnamed(self.label, addr - self.bias)

    def address_of(self, name: str) -> int | None:
        a = self._by_name.get(name)
        return None if a is None else a + self.bias

    def functions(self):
        """(runtime start, size, name) of every function."""
        for s, e, n in zip(self._starts, self._ends, self._names):
            yield s + self.bias, e - s, n

    def line(self, addr: int, load: bool = True) -> tuple[str, int] | None:
        """(file, line) of the instruction at addr, from DWARF; with
        ``load=False`` only from line tables already read."""
        a = addr - self.bias
        table = self._table_for(a, load)
        if table is None:
            return None
        addrs, ends, rows = table
        i = bisect.bisect_right(addrs, a) - 1
        if i < 0 or a >= ends[i]:
            return None
        return rows[i]

    def line_rows(self, addresses=None):
        """(runtime address, end, file, line) rows of the line tables: of
        the compilation units holding ``addresses`` (runtime), or of all."""
        if addresses is None:
            tables = [self._all_table()]
        else:
            tables, seen = [], set()
            for addr in addresses:
                t = self._table_for(addr - self.bias, True)
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    tables.append(t)
        for addrs, ends, rows in tables:
            for a, e, (f, ln) in zip(addrs, ends, rows):
                yield a + self.bias, e + self.bias, f, ln

    @staticmethod
    def _table(spans) -> tuple:
        spans.sort()
        return ([x[0] for x in spans], [x[1] for x in spans],
                [(x[2], x[3]) for x in spans])

    def _all_table(self) -> tuple:
        """Every line row of the image in one table (read once)."""
        if self._lines is None:
            from elftools.common.exceptions import ELFError
            dwarf, _ar = self._dwarf()
            spans = []
            if dwarf is not None:
                try:
                    for cu in dwarf.iter_CUs():
                        spans.extend(_cu_rows(dwarf, cu))
                except (ELFError, KeyError, ValueError, AttributeError, IndexError):
                    pass
            self._lines = self._table(spans)
        return self._lines

    def _table_for(self, a: int, load: bool):
        """The line table holding link-time address ``a``: its compilation
        unit's (found through .debug_aranges), or the whole image's."""
        if self._lines is not None:
            return self._lines
        from elftools.common.exceptions import ELFError
        dwarf, ar = self._dwarf()
        if dwarf is None:
            return None
        if ar is None:
            return self._all_table() if load else None
        try:
            off = ar.cu_offset_at_addr(a)
        except (ELFError, KeyError, ValueError, AttributeError, IndexError):
            off = None
        if off is None:
            return None
        t = self._cu_tables.get(off)
        if t is None and load:
            try:
                t = self._table(_cu_rows(dwarf, dwarf.get_CU_at(off)))
            except (ELFError, KeyError, ValueError, AttributeError, IndexError):
                t = ([], [], [])
            self._cu_tables[off] = t
        return t

    def _dwarf(self):
        """(DWARFInfo, aranges or None) of the debug file or the image,
        opened once (the file stays open while the image lives)."""
        if self._dwarf_cache is None:
            from elftools.common.exceptions import ELFError
            from elftools.elf.elffile import ELFFile
            self._dwarf_cache = (None, None)
            for p in filter(None, (self.debug_file, self.path)):
                try:
                    f = open(p, "rb")
                    elf = ELFFile(f)
                    if not elf.has_dwarf_info():
                        f.close()
                        continue
                    dwarf = elf.get_dwarf_info()
                    if not dwarf.has_debug_info:
                        f.close()
                        continue
                    try:
                        ar = dwarf.get_aranges()
                    except (ELFError, KeyError, ValueError, AttributeError):
                        ar = None
                    self._dwarf_file = f
                    self._dwarf_cache = (dwarf, ar)
                    break
                except (OSError, ELFError, KeyError, ValueError, AttributeError):
                    continue
        return self._dwarf_cache


def _cu_rows(dwarf, cu):
    lp = dwarf.line_program_for_CU(cu)
    if lp is None:
        return []
    hdr = lp.header
    version = hdr["version"]
    dirs = [d.decode(errors="replace") if isinstance(d, bytes) else str(d)
            for d in hdr["include_directory"]]
    comp_dir = ""
    top = cu.get_top_DIE()
    if "DW_AT_comp_dir" in top.attributes:
        v = top.attributes["DW_AT_comp_dir"].value
        comp_dir = v.decode(errors="replace") if isinstance(v, bytes) else str(v)

    def fname(idx):
        fes = hdr["file_entry"]
        i = idx if version >= 5 else idx - 1
        if not 0 <= i < len(fes):
            return "?"
        fe = fes[i]
        n = fe.name.decode(errors="replace") if isinstance(fe.name, bytes) else str(fe.name)
        di = fe.dir_index if version >= 5 else fe.dir_index - 1
        d = dirs[di] if 0 <= di < len(dirs) else (comp_dir if fe.dir_index == 0 else "")
        path = os.path.join(d, n) if d else n
        # DWARF 5's directory 0 is the compilation directory itself (glibc's
        # "./elf"): only the others are relative to it
        if not os.path.isabs(path) and comp_dir and not (version >= 5 and di == 0):
            path = os.path.join(comp_dir, path)
        return os.path.normpath(path)

    rows = []
    prev = None
    names: dict[int, str] = {}
    for entry in lp.get_entries():
        st = entry.state
        if st is None:
            continue
        if prev is not None and st.address > prev.address:
            f = names.get(prev.file)
            if f is None:
                f = names[prev.file] = fname(prev.file)
            rows.append((prev.address, st.address, f, prev.line))
        prev = None if st.end_sequence else st
    return rows


class ImageLookup:
    """The answers for any address, from :meth:`image_for` (the image
    holding it): shared by :class:`Symbolizer` and the live runs' lazy one
    (:class:`hwtrace.branches.livesyms.LazySymbolizer`)."""

    def image_for(self, addr: int) -> Image | None:
        raise NotImplementedError

    def lookup(self, addr: int) -> tuple[int, str] | None:
        img = self.image_for(addr)
        return img.lookup(addr) if img else None

    __call__ = lookup

    def describe(self, addr: int) -> str:
        """``function+0xOFF``; ``FILE+0xLINK`` in an image but no function
        (:func:`unnamed`); ``0x...`` outside every image."""
        img = self.image_for(addr)
        r = img.lookup(addr) if img else None
        if r is None:
            return img.unnamed(addr) if img else f"0x{addr:x}"
        start, name = r
        return name if start == addr else f"{name}+0x{addr - start:x}"

    def line(self, addr: int) -> tuple[str, int] | None:
        img = self.image_for(addr)
        return img.line(addr) if img else None


class Symbolizer(ImageLookup):
    """Images of one address space; answers for any address."""

    def __init__(self, debug_roots=DEBUG_ROOTS):
        self.images: list[Image] = []
        self._debug_roots = debug_roots
        self._cache: dict[int, Image] = {}

    def add_image(self, path, bias: int = 0) -> Image:
        img = Image(path, bias, self._debug_roots)
        self.images.append(img)
        return img

    def add_mapping(self, path, start: int, pgoff: int = 0,
                    name: str | None = None) -> Image:
        """An image mapped (mmap) at ``start`` from file offset ``pgoff``:
        the load bias follows from the PT_LOAD segment at that offset
        (:func:`load_bias`).  ``name``: the file the recording mapped,
        where ``path`` is a copy of it (its basename is the image's
        :attr:`Image.label`)."""
        probe = Image(path, 0, self._debug_roots)
        if name:
            probe.label = os.path.basename(name)
        bias = load_bias([(v, off, fsz) for v, _m, off, fsz in probe.segments],
                         start, pgoff)
        probe.bias = bias
        lo = min((v for v, *_ in probe.segments), default=0)
        hi = max((v + m for v, m, *_ in probe.segments), default=0)
        probe.low, probe.high = lo + bias, hi + bias
        self.images.append(probe)
        return probe

    def image_for(self, addr: int) -> Image | None:
        for img in self.images:
            if img.contains(addr):
                return img
        return None

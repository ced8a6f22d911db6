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
"""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection


class SymbolError(Exception):
    """An image cannot be read."""


DEBUG_ROOTS = ("/usr/lib/debug",)


def _build_id(elf: ELFFile) -> str | None:
    for sec in elf.iter_sections():
        if sec.header.sh_type == "SHT_NOTE":
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    return note["n_desc"]
    return None


def demangle_names(names: list[str]) -> dict[str, str]:
    """{mangled: demangled} for the C++ (Itanium ABI, ``_Z...``) names,
    through binutils' ``c++filt`` in one batch; names stay as they are if
    it is not installed.  (A PLT stub keeps its ``@plt``.)"""
    todo = sorted({n.split("@", 1)[0] for n in names if n.startswith("_Z")})
    exe = shutil.which("c++filt")
    if not todo or exe is None:
        return {}
    try:
        r = subprocess.run([exe], input="\n".join(todo) + "\n",
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = r.stdout.splitlines()
    if r.returncode != 0 or len(out) != len(todo):
        return {}
    plain = dict(zip(todo, out))
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
        try:
            with open(self.path, "rb") as f:
                elf = ELFFile(f)
                self.build_id = _build_id(elf)
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
            try:
                with open(self.debug_file, "rb") as f:
                    funcs.update(self._read_symbols(ELFFile(f), plt=False))
            except (OSError, ELFError):
                self.debug_file = None
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

    def _find_debug(self, roots) -> str | None:
        if not self.build_id or len(self.build_id) < 3:
            return None
        for r in roots:
            p = Path(r) / ".build-id" / self.build_id[:2] / (self.build_id[2:] + ".debug")
            if p.is_file():
                return str(p)
        return None

    @staticmethod
    def _read_symbols(elf: ELFFile, plt: bool = True) -> dict:
        """{link-time address: (size, name)} of functions.  Untyped symbols
        in executable sections (assembly labels) count where no function
        symbol starts; symbols of size 0 extend to the next symbol."""
        funcs: dict[int, tuple[int, str]] = {}
        labels: dict[int, tuple[int, str]] = {}
        exec_secs = {i for i, sec in enumerate(elf.iter_sections())
                     if sec.header.sh_flags & 0x4}          # SHF_EXECINSTR
        for secname in (".dynsym", ".symtab"):
            sec = elf.get_section_by_name(secname)
            if not isinstance(sec, SymbolTableSection):
                continue
            for name, value, size, typ, is_global, shndx in \
                    _code_symbols(elf, sec):
                if typ in ("STT_FUNC", "STT_GNU_IFUNC"):
                    old = funcs.get(value)
                    # prefer global names and .symtab's (later) ones
                    if old is None or is_global or old[0] == 0:
                        funcs[value] = (size, name)
                elif typ == "STT_NOTYPE" and shndx in exec_secs \
                        and not name.startswith((".L", "$")):
                    old = labels.get(value)
                    if old is None or is_global:
                        labels[value] = (size, name)
        for a, v in labels.items():
            funcs.setdefault(a, v)
        if plt:
            funcs.update(Image._plt_symbols(elf))
        # size 0 (assembly): up to the next symbol, or to the section end
        ends = {}
        for sec in elf.iter_sections():
            if sec.header.sh_flags & 0x4 and sec.header.sh_size:
                ends[sec.header.sh_addr] = sec.header.sh_addr + sec.header.sh_size
        starts = sorted(funcs)
        sec_starts = sorted(ends)
        for i, a in enumerate(starts):
            size, name = funcs[a]
            if size:
                continue
            nxt = starts[i + 1] if i + 1 < len(starts) else None
            j = bisect.bisect_right(sec_starts, a) - 1
            sec_end = ends[sec_starts[j]] if j >= 0 and a < ends[sec_starts[j]] else None
            cands = [x for x in (nxt, sec_end) if x is not None and x > a]
            if cands:
                funcs[a] = (min(cands) - a, name)
        return funcs

    @staticmethod
    def _plt_symbols(elf: ELFFile) -> dict:
        """x86-64 PLT stubs named ``sym@plt`` (lazy binding layout: .plt has
        a 16-byte header then one 16-byte entry per .rela.plt relocation;
        with IBT the per-symbol stubs are in .plt.sec, no header)."""
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
        out = {}
        for i, rel in enumerate(rela.iter_relocations()):
            sym = dynsym.get_symbol(rel["r_info_sym"])
            name = sym.name if sym is not None and sym.name else f"plt{i}"
            out[sec.header.sh_addr + first + 16 * i] = (16, name + "@plt")
        return out

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


_SYM64 = [("name", "<u4"), ("info", "u1"), ("other", "u1"),
          ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]
_SYM32 = [("name", "<u4"), ("value", "<u4"), ("size", "<u4"),
          ("info", "u1"), ("other", "u1"), ("shndx", "<u2")]
# pyelftools' names (it calls STT_GNU_IFUNC by the range's first, STT_LOOS)
_TYPES = {0: "STT_NOTYPE", 2: "STT_FUNC", 10: "STT_LOOS"}
_SHN_LORESERVE = 0xFF00


def _code_symbols(elf: ELFFile, sec):
    """(name, value, size, type, is_global, shndx) of the named symbols
    of ``sec`` defined in a section (st_shndx a section index) whose type
    is STT_FUNC, STT_GNU_IFUNC or STT_NOTYPE, in table order.  The table
    is read at once with numpy (a large .symtab is ~100x faster than
    symbol by symbol); big-endian files go through pyelftools."""
    import numpy as np
    h = sec.header
    entsize = 24 if elf.elfclass == 64 else 16
    if not elf.little_endian or h.sh_entsize != entsize or \
            h.sh_type == "SHT_NOBITS":
        yield from _code_symbols_slow(sec)
        return
    strtab = elf.get_section(h.sh_link)
    st = elf.stream
    st.seek(h.sh_offset)
    raw = st.read(h.sh_size - h.sh_size % entsize)
    st.seek(strtab.header.sh_offset)
    names = st.read(strtab.header.sh_size)
    syms = np.frombuffer(raw, dtype=_SYM64 if entsize == 24 else _SYM32)
    typ = syms["info"] & 0xF
    keep = ((typ == 0) | (typ == 2) | (typ == 10)) & (syms["name"] != 0) & \
        (syms["shndx"] != 0) & (syms["shndx"] < _SHN_LORESERVE)
    for off, value, size, t, info, shndx in zip(
            syms["name"][keep].tolist(), syms["value"][keep].tolist(),
            syms["size"][keep].tolist(), typ[keep].tolist(),
            syms["info"][keep].tolist(), syms["shndx"][keep].tolist()):
        end = names.find(b"\0", off)
        raw_name = names[off:end if end >= 0 else len(names)]
        if not raw_name:
            continue
        yield (raw_name.decode("utf-8", errors="replace"), value, size,
               _TYPES[t], info >> 4 == 1, shndx)


def _code_symbols_slow(sec):
    for sym in sec.iter_symbols():
        e = sym.entry
        if not sym.name or not isinstance(e.st_shndx, int):
            continue
        yield (sym.name, e.st_value, e.st_size, e.st_info.type,
               e.st_info.bind == "STB_GLOBAL", e.st_shndx)


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
        if not os.path.isabs(path) and comp_dir:
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


class Symbolizer:
    """Images of one address space; answers for any address."""

    def __init__(self, debug_roots=DEBUG_ROOTS):
        self.images: list[Image] = []
        self._debug_roots = debug_roots
        self._cache: dict[int, Image] = {}

    def add_image(self, path, bias: int = 0) -> Image:
        img = Image(path, bias, self._debug_roots)
        self.images.append(img)
        return img

    def add_mapping(self, path, start: int, pgoff: int = 0) -> Image:
        """An image mapped (mmap) at ``start`` from file offset ``pgoff``:
        the load bias follows from the PT_LOAD segment at that offset."""
        probe = Image(path, 0, self._debug_roots)
        bias = start - pgoff
        for vaddr, _memsz, off, filesz in probe.segments:
            if off <= pgoff < off + max(filesz, 1):
                bias = start - (vaddr + (pgoff - off))
                break
        else:
            if probe.segments:
                vaddr, _m, off, _f = probe.segments[0]
                bias = start - (vaddr - (off - pgoff))
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

    def lookup(self, addr: int) -> tuple[int, str] | None:
        img = self.image_for(addr)
        return img.lookup(addr) if img else None

    __call__ = lookup

    def describe(self, addr: int) -> str:
        r = self.lookup(addr)
        if r is None:
            return f"0x{addr:x}"
        start, name = r
        return name if start == addr else f"{name}+0x{addr - start:x}"

    def line(self, addr: int) -> tuple[str, int] | None:
        img = self.image_for(addr)
        return img.line(addr) if img else None

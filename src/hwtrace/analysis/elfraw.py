"""The few parts of an ELF file the symbolizer needs, read straight from
the file's bytes with numpy (no I/O but the read it is given).

pyelftools parses every header field through construct, one object at a
time: loading the symbols of a python3 process's eighteen images took
over a second that way.  :class:`RawElf` reads the ELF header, the program
headers and the section header table as numpy arrays, and hands out
section bytes by name.  :class:`SymbolArrays` is one symbol table
(``.symtab``, ``.dynsym``) as arrays -- the one reader of symbol entries,
whether the table's bytes come from here or, for a file this reader does
not understand, from pyelftools (:mod:`.symbols` falls back to it).
"""

from __future__ import annotations

import numpy as np

from hwtrace.buildid import build_id_of

PT_LOAD = 1
SHF_EXECINSTR = 4
ET_DYN = 3
EM_X86_64 = 62


SHT_SYMTAB = 2
SHT_DYNSYM = 11
STT_NOTYPE = 0
STT_FUNC = 2
STT_GNU_IFUNC = 10
STB_GLOBAL = 1
SHN_LORESERVE = 0xFF00


class RawElfError(ValueError):
    pass


class SymbolArrays:
    """One ELF symbol table as numpy arrays: ``value``, ``size`` (uint64),
    ``type``, ``bind`` (the two halves of ``st_info``), ``shndx`` (int64);
    :meth:`name` reads entry ``i``'s name from the table's string table
    ``strtab`` (the section its ``sh_link`` names)."""

    __slots__ = ("value", "size", "type", "bind", "shndx", "_off", "_strtab")

    def __init__(self, data: bytes, strtab: bytes, elfclass: int, little: bool):
        e = "<" if little else ">"
        if elfclass == 64:
            dt = np.dtype([("name", e + "u4"), ("info", "u1"), ("other", "u1"),
                           ("shndx", e + "u2"), ("value", e + "u8"), ("size", e + "u8")])
        else:
            dt = np.dtype([("name", e + "u4"), ("value", e + "u4"), ("size", e + "u4"),
                           ("info", "u1"), ("other", "u1"), ("shndx", e + "u2")])
        a = np.frombuffer(data, dt, len(data) // dt.itemsize)
        self._off = a["name"].astype(np.int64)
        self._strtab = strtab
        self.value = a["value"].astype(np.uint64)
        self.size = a["size"].astype(np.uint64)
        self.type = a["info"] & 0xF
        self.bind = a["info"] >> 4
        self.shndx = a["shndx"].astype(np.int64)

    def __len__(self) -> int:
        return len(self.value)

    def name(self, i: int) -> str:
        tab = self._strtab
        o = int(self._off[i])
        end = tab.find(b"\0", o)
        return tab[o:end if end >= 0 else len(tab)].decode("utf-8", "replace")

    def in_section(self) -> np.ndarray:
        """Entries defined in a section (not SHN_UNDEF, not a reserved
        index such as SHN_ABS)."""
        return (self.shndx != 0) & (self.shndx < SHN_LORESERVE)

    def functions(self) -> np.ndarray:
        """Entries that are functions (STT_FUNC, STT_GNU_IFUNC) defined in
        a section."""
        return self.in_section() & ((self.type == STT_FUNC) | (self.type == STT_GNU_IFUNC))

    def named(self, name: str) -> np.ndarray:
        """Indices of the entries named ``name``, in table order."""
        key = name.encode("utf-8", "surrogateescape") + b"\0"
        tab = self._strtab
        offs = []
        o = tab.find(key)
        while o >= 0:               # any occurrence: string tables share tails
            offs.append(o)
            o = tab.find(key, o + 1)
        if not offs:
            return np.zeros(0, np.int64)
        return np.flatnonzero(np.isin(self._off, offs))


def _dt(fields, e):
    return np.dtype([(n, e + t if t not in ("u1",) else t) for n, t in fields])


class RawElf:
    def __init__(self, data: bytes):
        if len(data) < 52 or data[:4] != b"\x7fELF":
            raise RawElfError("not an ELF file")
        cls, enc = data[4], data[5]
        if cls not in (1, 2) or enc not in (1, 2):
            raise RawElfError("unknown ELF class or data encoding")
        self.data = data
        self.elfclass = 64 if cls == 2 else 32
        self.little_endian = enc == 1
        e = "<" if enc == 1 else ">"
        if cls == 2:
            hdr = np.frombuffer(data, _dt([
                ("ident", "u1"), ("type", "u2"), ("machine", "u2"), ("version", "u4"),
                ("entry", "u8"), ("phoff", "u8"), ("shoff", "u8"), ("flags", "u4"),
                ("ehsize", "u2"), ("phentsize", "u2"), ("phnum", "u2"),
                ("shentsize", "u2"), ("shnum", "u2"), ("shstrndx", "u2")], e),
                1, 15)[0]
            ph = _dt([("type", "u4"), ("flags", "u4"), ("offset", "u8"), ("vaddr", "u8"),
                      ("paddr", "u8"), ("filesz", "u8"), ("memsz", "u8"), ("align", "u8")], e)
            sh = _dt([("name", "u4"), ("type", "u4"), ("flags", "u8"), ("addr", "u8"),
                      ("offset", "u8"), ("size", "u8"), ("link", "u4"), ("info", "u4"),
                      ("addralign", "u8"), ("entsize", "u8")], e)
        else:
            hdr = np.frombuffer(data, _dt([
                ("ident", "u1"), ("type", "u2"), ("machine", "u2"), ("version", "u4"),
                ("entry", "u4"), ("phoff", "u4"), ("shoff", "u4"), ("flags", "u4"),
                ("ehsize", "u2"), ("phentsize", "u2"), ("phnum", "u2"),
                ("shentsize", "u2"), ("shnum", "u2"), ("shstrndx", "u2")], e),
                1, 15)[0]
            ph = _dt([("type", "u4"), ("offset", "u4"), ("vaddr", "u4"), ("paddr", "u4"),
                      ("filesz", "u4"), ("memsz", "u4"), ("flags", "u4"), ("align", "u4")], e)
            sh = _dt([("name", "u4"), ("type", "u4"), ("flags", "u4"), ("addr", "u4"),
                      ("offset", "u4"), ("size", "u4"), ("link", "u4"), ("info", "u4"),
                      ("addralign", "u4"), ("entsize", "u4")], e)
        self.e_type = int(hdr["type"])
        self.e_machine = int(hdr["machine"])
        phoff, phnum = int(hdr["phoff"]), int(hdr["phnum"])
        shoff, shnum = int(hdr["shoff"]), int(hdr["shnum"])
        if phnum and (int(hdr["phentsize"]) != ph.itemsize or
                      phoff + phnum * ph.itemsize > len(data)):
            raise RawElfError("bad program header table")
        if shnum and (int(hdr["shentsize"]) != sh.itemsize or
                      shoff + shnum * sh.itemsize > len(data)):
            raise RawElfError("bad section header table")
        self.ph = np.frombuffer(data, ph, phnum, phoff) if phnum else np.zeros(0, ph)
        self.sh = np.frombuffer(data, sh, shnum, shoff) if shnum else np.zeros(0, sh)
        self._names: list[str] = []
        strndx = int(hdr["shstrndx"])
        if 0 < strndx < shnum:
            tab = self.section_data(strndx)
            for off in self.sh["name"].tolist():
                end = tab.find(b"\0", off)
                self._names.append(tab[off:end if end >= 0 else len(tab)].decode(
                    "utf-8", "replace"))
        else:
            self._names = [""] * shnum
        self._by_name = {}
        for i, n in enumerate(self._names):
            self._by_name.setdefault(n, i)

    # -- sections -------------------------------------------------------------
    def section_index(self, name: str) -> int | None:
        return self._by_name.get(name)

    def section_data(self, i: int) -> bytes:
        s = self.sh[i]
        if int(s["type"]) == 8:            # SHT_NOBITS
            return b""
        off, size = int(s["offset"]), int(s["size"])
        if off + size > len(self.data):
            raise RawElfError("section past the end of the file")
        return self.data[off:off + size]

    def symbol_table(self, i: int) -> SymbolArrays:
        """Section ``i`` (a symbol table) as arrays, its names from the
        string table it links to."""
        return SymbolArrays(self.section_data(i), self.section_data(int(self.sh["link"][i])),
                            self.elfclass, self.little_endian)

    def exec_sections(self) -> set[int]:
        return set(np.flatnonzero((self.sh["flags"] & SHF_EXECINSTR) != 0).tolist())

    def exec_ranges(self) -> dict[int, int]:
        """{address: end} of executable sections with a size."""
        sel = ((self.sh["flags"] & SHF_EXECINSTR) != 0) & (self.sh["size"] > 0)
        return {int(a): int(a) + int(z) for a, z in
                zip(self.sh["addr"][sel].tolist(), self.sh["size"][sel].tolist())}

    # -- program headers, notes -----------------------------------------------------
    def loads(self) -> list[tuple[int, int, int, int]]:
        """(vaddr, memsz, offset, filesz) of the PT_LOAD segments."""
        p = self.ph[self.ph["type"] == PT_LOAD]
        return [tuple(int(x) for x in r) for r in
                zip(p["vaddr"].tolist(), p["memsz"].tolist(), p["offset"].tolist(),
                    p["filesz"].tolist())]

    def build_id(self) -> str | None:
        """The GNU build-id as hex (:mod:`hwtrace.buildid`), None if none."""
        return build_id_of(self.data) or None

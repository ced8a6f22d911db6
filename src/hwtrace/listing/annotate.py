"""What a listing says about an instruction besides its address: the
function it is in (``fib+0x12``), its disassembly, and its source line.

An :class:`Annotator` answers for one address space: its code bytes
(the flow :class:`~hwtrace.flow.image.Image` the decoder ran on) and its
symbols (an :class:`hwtrace.analysis.symbols.Symbolizer` over the ELF
files mapped there).  :class:`SymbolFiles` reads each ELF file's symbols
once and places it at every address it is mapped at (a library mapped by
several processes, each space of a bundle).
"""

from __future__ import annotations

import copy
import os
from typing import NamedTuple

from hwtrace.analysis.symbols import Image as SymImage
from hwtrace.analysis.symbols import MANGLED, SymbolError, Symbolizer, demangle_names, load_bias

from .disasm import Disassembler

# hwtrace.x86.insn.IClass values with a direct target worth naming
_BRANCHES = (2, 4, 5)       # CALL, JUMP, COND_JUMP


class Note(NamedTuple):
    """The annotation of one instruction (empty strings: unknown)."""

    function: str           # name of the function holding it
    function_offset: int    # its offset in that function
    where: str              # "fib+0x12", or "FILE+0xLINK" without symbol
    disasm: str             # "mov rdi, rsp" (with "<target>" for branches)
    file: str               # source file (full path), "" if unknown
    line: int               # source line, 0 if unknown


class SymbolFiles:
    """ELF symbol tables by path, each file read once."""

    def __init__(self):
        self._read: dict[str, SymImage | None] = {}

    def _load(self, path: str) -> SymImage | None:
        if path not in self._read:
            img = None
            try:
                with open(path, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        # C++ names are demangled as the listing meets them
                        img = SymImage(path, 0, demangle=False)
            except (OSError, SymbolError):
                img = None
            except Exception:           # pyelftools on a damaged file
                img = None
            self._read[path] = img
        return self._read[path]

    def at_bias(self, path: str, bias: int) -> SymImage | None:
        """``path`` placed with load bias ``bias`` (runtime - link-time)."""
        base = self._load(path)
        if base is None:
            return None
        img = copy.copy(base)
        img.bias = bias
        lo = min((v for v, *_ in base.segments), default=0)
        hi = max((v + m for v, m, *_ in base.segments), default=0)
        img.low, img.high = lo + bias, hi + bias
        img._dwarf_cache = None
        img._dwarf_file = None
        return img

    def mapped(self, path: str, start: int, pgoff: int = 0,
               name: str | None = None) -> SymImage | None:
        """``path`` mapped (mmap) at ``start`` from file offset ``pgoff``
        (``name``: the file the recording mapped, where ``path`` is a copy
        of it -- the image's label)."""
        base = self._load(path)
        if base is None:
            return None
        img = self.at_bias(path, load_bias(
            [(v, off, fsz) for v, _m, off, fsz in base.segments], start, pgoff))
        if name:
            img.label = os.path.basename(name)
        return img

    def symbolizer(self, images) -> Symbolizer:
        """A Symbolizer over ``images`` (None entries and repeats of the
        same file at the same bias dropped; the first one wins where they
        overlap)."""
        sym = Symbolizer()
        seen = set()
        for img in images:
            if img is None or (img.path, img.bias) in seen:
                continue
            seen.add((img.path, img.bias))
            sym.images.append(img)
        return sym


def image_arg_symbols(files: SymbolFiles, kind: str, arg: str):
    """The symbols of a ``--elf``/``--raw`` argument (as ptxed loads it),
    or None (not an ELF file, a page dump)."""
    from hwtrace.flow.image import ImageError
    from hwtrace.flow.loaders import elf_segments, split_base, split_range
    try:
        if kind == "elf":
            path, base = split_base(arg)
            if base is not None and not os.path.exists(path) and \
                    os.path.exists(arg):
                path, base = arg, None
            bias = 0
            if base is not None:
                segs = elf_segments(path)
                if segs:
                    bias = base - min(v for _, _, v in segs)
            return files.at_bias(path, bias)
        if kind == "raw":
            rest, vaddr = split_base(arg)
            if vaddr is None:
                return None
            path, offset, _size = split_range(rest)
            return files.mapped(path, vaddr, offset)
    except (ImageError, OSError):
        return None
    return None


class Annotator:
    """Notes for the instructions of one address space.

    ``read(addr, size)`` gives code bytes, ``symbolizer`` names (may be
    None); ``lines`` also looks up source lines (DWARF)."""

    def __init__(self, read, symbolizer: Symbolizer | None, *,
                 lines: bool = False, syntax: str = "intel"):
        self.dis = Disassembler(read, syntax)
        self.sym = symbolizer
        self.lines = lines
        self._names: dict[int, str] = {}
        self._plain: dict[str, str] = {}     # C++ names demangled so far

    def _where(self, addr: int) -> tuple[str, int, str]:
        """(function, offset, "function+0xOFF", or "FILE+0xLINK" where
        no symbol covers the address: :func:`.symtable.unnamed`)."""
        sym = self.sym
        if sym is None:
            return "", 0, ""
        img = sym.image_for(addr)
        if img is None:
            return "", 0, ""
        r = img.lookup(addr)
        if r is None:
            return "", 0, img.unnamed(addr)
        start, name = r
        name = self._plain.get(name, name)
        off = addr - start
        return name, off, name if not off else f"{name}+0x{off:x}"

    def _demangle(self, addrs) -> None:
        """Demangle the C++ and Rust names of the functions at ``addrs`` that are
        new (one c++filt run for all, not one per file read)."""
        sym = self.sym
        if sym is None:
            return
        todo = set()
        for a in addrs:
            r = sym.lookup(a)
            if r is not None and r[1].startswith(MANGLED) and \
                    r[1] not in self._plain:
                todo.add(r[1])
        if todo:
            names = sorted(todo)
            self._plain.update(dict(zip(names, names)))
            self._plain.update(demangle_names(names))

    def name(self, addr: int) -> str:
        """``<function+0xOFF>`` for a branch or memory target ("" if none)."""
        s = self._names.get(addr)
        if s is None:
            fn, _off, w = self._where(addr)
            s = self._names[addr] = f" <{w}>" if fn else ""
        return s

    def notes(self, ips: list, sizes: list, iclasses: list, mode: int) -> list:
        """A :class:`Note` per instruction."""
        texts = self.dis.texts(ips, sizes, mode)
        out = []
        dis = self.dis
        targets = []
        for ip, size, ic in zip(ips, sizes, iclasses):
            ops = texts[ip][1]
            if ic in _BRANCHES and ops.startswith("0x"):
                try:
                    targets.append(int(ops, 16))
                except ValueError:
                    pass
        self._demangle(ips + targets)
        for ip, size, ic in zip(ips, sizes, iclasses):
            mnem, ops = texts[ip]
            text = f"{mnem} {ops}" if ops else mnem
            if ic in _BRANCHES and ops.startswith("0x"):
                try:
                    text += self.name(int(ops, 16))
                except ValueError:
                    pass
            else:
                t = dis.rip_target(ip, size, ops)
                if t is not None:
                    text += f"  # 0x{t:x}{self.name(t)}"
            fn, off, where = self._where(ip)
            src, line = "", 0
            if self.lines and self.sym is not None:
                img = self.sym.image_for(ip)
                r = img.line(ip) if img is not None else None
                if r is not None:
                    src, line = r
            out.append(Note(fn, off, where, text, src, line))
        return out

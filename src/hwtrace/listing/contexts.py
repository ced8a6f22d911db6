"""One line cache per address space: each space has its own code (the
same address holds other instructions in another process) and symbols.

:class:`Contexts` hands the :class:`~.walk.Walker` the cache of the space
a stream is in, building its :class:`~.annotate.Annotator` on first use:
code bytes from the space's flow image, symbols from the ELF files the
space maps (a bundle's sideband) or that the command line loaded
(``--elf``, ``--raw`` of an ELF file), the latter first.
"""

from __future__ import annotations

from .annotate import Annotator, SymbolFiles, image_arg_symbols
from .cache import LineCache


class Contexts:
    """``fmt``: the listing format (its ``make`` fills the caches).
    ``annotate``: symbolize and disassemble (else ptxed's lines).
    ``images``: the command line's ``[(kind, arg)]`` images (their
    symbols come first in every space)."""

    def __init__(self, fmt, *, annotate: bool, lines: bool = False,
                 syntax: str = "intel", images=()):
        self.fmt = fmt
        self.annotate = annotate
        self.lines = lines
        self.syntax = syntax
        self.files = SymbolFiles()
        self._images = list(images)
        self._extra = None
        self._caches: dict[int, tuple] = {}

    def _extra_symbols(self) -> list:
        if self._extra is None:
            self._extra = [image_arg_symbols(self.files, kind, arg)
                           for kind, arg in self._images]
        return self._extra

    def _cache(self, key, owner, image, sym_images) -> LineCache:
        got = self._caches.get(key)
        if got is not None:
            return got[1]
        annot = None
        if self.annotate:
            sym = self.files.symbolizer(list(self._extra_symbols()) +
                                        list(sym_images()))
            annot = Annotator(image.read, sym, lines=self.lines,
                              syntax=self.syntax)
        fmt = self.fmt

        def make(ips, sizes, iclasses, mode):
            return fmt.make(annot, ips, sizes, iclasses, mode)
        cache = LineCache(make, columns=fmt.columns)
        self._caches[key] = (owner, cache)      # owner: keeps the key's id
        return cache

    def for_image(self, image) -> LineCache:
        """A raw trace's image (symbols from the command line only)."""
        return self._cache(id(image), image, image, lambda: ())

    def for_space(self, space, image=None) -> LineCache:
        """An :class:`~hwtrace.flow.spaces.AddressSpace` (or, for None,
        ``image`` alone)."""
        if space is None:
            return self.for_image(image)
        files = self.files

        def syms():
            return [files.mapped(m.path, m.start, m.offset, m.file)
                    for m in space.mappings]
        return self._cache(id(space), space, space.image, syms)

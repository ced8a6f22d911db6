"""Memory images: what code lives at which virtual address.

An :class:`Image` is an ordered collection of sections (a byte range of a
file, or an in-memory buffer, mapped at a virtual address).  As in libipt,
a section added later overwrites earlier ones where they overlap: the older
section is cut so that every address maps to at most one section.

Sections are lazy: a file section remembers path, offset and size and only
reads its bytes (once, then cached) when an address inside it is first
fetched.  Reads are bounded: :meth:`Image.read` never returns more than
asked and never crosses a section boundary (that is what makes an
instruction that straddles two sections "truncated", libipt's term).

Loaders for the formats ptxed and fuzzers use live in :mod:`.loaders`.
"""

from __future__ import annotations

import bisect
from collections import namedtuple

from hwtrace._records import Fields


class ImageError(Exception):
    """A section could not be created (bad file, bad range)."""


# Plain classes and a NamedTuple, not dataclasses: every decoding command
# creates them at start-up (see hwtrace._records).


class Section:
    """A contiguous run of bytes that can be mapped into an image.

    ``loader`` is called at most once, on first access, and must return
    exactly ``size`` bytes (or fewer if the file shrank; the section then
    ends early).  ``isid`` identifies the section (libipt's image section
    identifier: positive, unique within its image).  Sections are equal
    only to themselves.
    """

    def __init__(self, name: str, size: int, loader: object = None,
                 data: bytes | None = None, isid: int = 0,
                 mapper: object = None):
        self.name = name
        self.size = size
        self.loader = loader
        self.data = data
        self.isid = isid
        # a file section's read-only mapping (buffer()): made at most once
        self.mapper = mapper
        self.view = None

    def __repr__(self) -> str:
        return (f"Section(name={self.name!r}, size={self.size!r}, "
                f"loader={self.loader!r}, data={self.data!r}, "
                f"isid={self.isid!r})")

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<memory>") -> "Section":
        return cls(name=name, size=len(data), data=bytes(data))

    @classmethod
    def from_file(cls, path: str, offset: int = 0, size: int | None = None,
                  ) -> "Section":
        """A lazy section over ``[offset, offset+size)`` of ``path``.

        ``size`` None means "to the end of the file".  The file is checked
        now (so a missing file is an error at load time, as in ptxed) but
        read only on first use.
        """
        import os
        try:
            fsize = os.path.getsize(path)
        except OSError as e:
            raise ImageError(f"cannot open {path}: {e.strerror}") from None
        if offset < 0 or offset >= fsize:
            raise ImageError(f"bad offset {offset:#x} into {path}")
        if size is None:
            size = fsize - offset
        elif offset + size > fsize:
            raise ImageError(f"bad range {offset + size:#x} in {path}")

        def load(path=path, offset=offset, size=size):
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(size)

        def mapped(path=path, offset=offset, size=size):
            return _map_file(path, offset, size)
        return cls(name=path, size=size, loader=load, mapper=mapped)

    def bytes(self) -> bytes:
        data = self.data
        if data is None:
            loader = self.loader
            data = loader() if loader is not None else b""
            self.data = data
            self.loader = None
        return data

    def buffer(self):
        """The section's bytes as a buffer (what the compiled core's
        instruction fill reads): :meth:`bytes` once they are read; a file
        section not yet read is mapped read-only instead (:func:`_map_file`:
        the same bytes; only the pages decoded are ever read, and nothing
        is copied -- reading a large library's code segment whole costs a
        page fault per 4 KiB of it and the copy).  Like a mapped trace
        (hwtrace.cli._tracemap), the file must not be truncated while it
        is decoded."""
        data = self.data
        if data is not None:
            return data
        view = self.view
        if view is None:
            mapper = self.mapper
            view = mapper() if mapper is not None else None
            if view is None:
                return self.bytes()
            self.view = view
        return view


def _map_file(path: str, offset: int, size: int):
    """``size`` bytes of ``path`` from ``offset`` (fewer if the file is now
    shorter), mapped read-only: an mmap or a memoryview of one; ``b""``
    for none; None where the file cannot be mapped (the caller reads it)."""
    import mmap
    import os
    import stat
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None
            n = min(size, st.st_size - offset)
            if n <= 0:
                return b""
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            m = mmap.mmap(f.fileno(), offset - start + n,
                          access=mmap.ACCESS_READ, offset=start)
    except (OSError, ValueError):
        return None
    return memoryview(m)[offset - start:] if offset != start else m


class Mapping(namedtuple("Mapping", "begin end section offset")):
    """Part of a section mapped at ``[begin, end)``; ``offset`` is where
    ``begin`` lies inside the section."""

    __slots__ = ()


class Image(Fields):
    """Non-overlapping mappings sorted by address (later adds win)."""

    _fields = ("name", "_maps", "_starts", "_next_isid", "generation",
               "decoded", "decoded_generation")

    def __init__(self, name: str = "", _maps: list | None = None,
                 _starts: list | None = None, _next_isid: int = 1,
                 generation: int = 0, decoded: dict | None = None,
                 decoded_generation: int = 0):
        self.name = name
        self._maps = [] if _maps is None else _maps
        self._starts = [] if _starts is None else _starts
        self._next_isid = _next_isid
        self.generation = generation
        # Decoded instructions of this image (hwtrace.flow.fetch.InsnCache
        # keeps them here, so a decoder that switches between images keeps
        # each image's decodes; dropped when the generation changes).
        self.decoded = {} if decoded is None else decoded
        self.decoded_generation = decoded_generation

    def add(self, section: Section, vaddr: int) -> int:
        """Map ``section`` at ``vaddr``, cutting what it overlaps.

        Returns the section's isid."""
        if not section.isid:
            section.isid = self._next_isid
            self._next_isid += 1
        begin, end = vaddr, vaddr + section.size
        if end <= begin:
            return section.isid
        out = []
        for m in self._maps:
            if m.end <= begin or m.begin >= end:
                out.append(m)
                continue
            if m.begin < begin:
                out.append(Mapping(m.begin, begin, m.section, m.offset))
            if m.end > end:
                out.append(Mapping(end, m.end, m.section,
                                   m.offset + (end - m.begin)))
        out.append(Mapping(begin, end, section, 0))
        out.sort(key=lambda m: m.begin)
        self._maps = out
        self._starts = [m.begin for m in out]
        self.generation += 1
        return section.isid

    def add_bytes(self, data: bytes, vaddr: int, name: str = "<memory>") -> int:
        return self.add(Section.from_bytes(data, name), vaddr)

    def add_file(self, path: str, vaddr: int, offset: int = 0,
                 size: int | None = None) -> int:
        return self.add(Section.from_file(path, offset, size), vaddr)

    def mappings(self) -> list:
        return list(self._maps)

    def __len__(self) -> int:
        return len(self._maps)

    def find(self, addr: int) -> Mapping | None:
        """The mapping containing ``addr``, or None."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        m = self._maps[i]
        if addr < m.end:
            return m
        return None

    def read(self, addr: int, size: int) -> bytes | None:
        """Up to ``size`` bytes at ``addr`` from the one section that maps
        it (fewer at that mapping's end); None if nothing is mapped."""
        m = self.find(addr)
        if m is None:
            return None
        n = min(size, m.end - addr)
        start = m.offset + (addr - m.begin)
        return m.section.bytes()[start:start + n]

    def isid(self, addr: int) -> int:
        m = self.find(addr)
        return m.section.isid if m is not None else 0

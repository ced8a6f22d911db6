"""Symbols of a live process, read once and lazily.

A live run knows its process's executable mappings early (``/proc/PID/maps``
of a process attached to, the execution log's MMAP records of one
launched), long before it needs any symbol: trigger names are resolved
before the run, record ends after it.  :class:`LazySymbolizer` keeps the
mappings (no file read but the ELF program headers) and reads an image's
symbol tables the first time an address in it, or a name not found in the
images before it (the main executable first), is asked for -- once per
file, shared by every mapping and load bias of that file (:class:`ImageCache`).

It answers what :class:`hwtrace.analysis.symbols.Symbolizer` does for the
branch records (``lookup``, ``line``, ``images``, ``iter_images``).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

from hwtrace.analysis.symbols import DEBUG_ROOTS, Image, ImageLookup, SymbolError, load_bias


class ImageCache:
    """One parsed :class:`Image` per file (at bias 0); biased views of it."""

    def __init__(self, debug_roots=DEBUG_ROOTS):
        self.debug_roots = debug_roots
        self._base: dict[str, Image | None] = {}

    def get(self, path: str, bias: int) -> Image | None:
        if path not in self._base:
            try:
                self._base[path] = Image(path, 0, self.debug_roots)
            except (SymbolError, OSError):
                self._base[path] = None
        base = self._base[path]
        if base is None:
            return None
        if bias == 0:
            return base
        img = copy.copy(base)           # the tables are shared; only the bias differs
        img.bias = bias
        img.low, img.high = base.low + bias, base.high + bias
        return img


@dataclass
class _Mapping:
    lo: int
    hi: int
    path: str
    bias: int
    pgoff: int = 0
    image: Image | None = None
    loaded: bool = False


def mapping_bias(path: str, start: int, pgoff: int) -> int | None:
    """Load bias of ``path`` mapped at ``start`` from file offset ``pgoff``
    (from its PT_LOAD headers; None if it is not an ELF file)."""
    from hwtrace.engines.emulated.images import load_segments
    segs = load_segments(path)
    if not segs:
        return None
    return load_bias([(va, off, size) for off, size, va in segs], start, pgoff)


class LazySymbolizer(ImageLookup):
    def __init__(self, cache: ImageCache | None = None):
        self.cache = cache or ImageCache()
        self._maps: list[_Mapping] = []
        self._keys: set = set()

    def add_mapping(self, path: str, start: int, pgoff: int = 0, size: int = 1) -> None:
        """An executable mapping of ``path`` at [start, start+size) from
        file offset ``pgoff`` (repeats are ignored)."""
        key = (path, start, pgoff)
        if key in self._keys or not path.startswith("/"):
            return
        self._keys.add(key)
        bias = mapping_bias(path, start, pgoff)
        if bias is None:
            return
        self._maps.append(_Mapping(start, start + max(size, 1), path, bias, pgoff))

    def add_image(self, path: str, bias: int = 0) -> Image:
        """The whole of ``path`` at ``bias`` (read now: its symbols are asked for)."""
        img = self.cache.get(path, bias)
        if img is None:
            raise SymbolError(f"{path}: not a readable ELF file")
        m = _Mapping(img.low, img.high, path, bias, 0, img, True)
        self._keys.add((path, bias, None))
        self._maps.append(m)
        return img

    def add_file(self, path: str, bias: int = 0) -> None:
        """``path`` for names only (not mapped yet: no address is in it),
        read when a name is looked for past the images before it."""
        self._maps.append(_Mapping(0, 0, path, bias))

    def _load(self, m: _Mapping) -> Image | None:
        if not m.loaded:
            m.loaded = True
            for o in self._maps:        # another mapping of the same file and bias
                if o.loaded and o.image is not None and o.path == m.path and o.bias == m.bias:
                    m.image = o.image
                    break
            else:
                m.image = self.cache.get(m.path, m.bias)
        return m.image

    def iter_images(self):
        """The images, the main executable first, each read when reached."""
        seen = set()
        for m in self._maps:
            if (m.path, m.bias) in seen:
                continue
            seen.add((m.path, m.bias))
            img = self._load(m)
            if img is not None:
                yield img

    @property
    def images(self) -> list[Image]:
        return list(self.iter_images())

    def image_for(self, addr: int) -> Image | None:
        for m in self._maps:
            if m.lo <= addr < m.hi:
                img = self._load(m)
                if img is not None and img.contains(addr):
                    return img
        return None

    def mappings(self):
        """(path, start, file offset, size) of the mappings added."""
        for m in self._maps:
            yield m.path, m.lo, m.pgoff, m.hi - m.lo


def proc_mappings(pid: int):
    """(start, end, file offset, path) of the executable file mappings of
    a process, from /proc/PID/maps."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        path = parts[5].strip()
        if not path.startswith("/") or path.endswith(" (deleted)") or not os.path.isfile(path):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        yield lo, hi, int(parts[2], 16), path

"""Symbols and addresses as the user writes them, resolved against a
:class:`hwtrace.analysis.symbols.Symbolizer` (images with their load bias).

Accepted forms: ``0x401000`` / ``4198400`` (absolute), ``+0x1139`` (offset
from the main executable's load base, for PIE), ``NAME`` or ``NAME+0x10``
(a function symbol of any image).  Ranges: ``A-B`` (addresses, B
exclusive) or a symbol (the whole function).
"""

from __future__ import annotations

import difflib


class SymbolNotFound(ValueError):
    """A name no image defines (the message lists close matches)."""

    def __init__(self, name: str, candidates=(), note: str = ""):
        close = difflib.get_close_matches(name, sorted(set(candidates)), n=5,
                                          cutoff=0.6)
        hint = (f"close matches: {', '.join(close)}" if close
                else "no close matches")
        super().__init__(f"unknown symbol {name!r} ({hint}){note}")
        self.name = name
        self.close = close
        self.candidates = candidates


def parse_number(text: str) -> int | None:
    try:
        v = int(text, 0)
    except ValueError:
        return None
    return v if v >= 0 else None


def _images(symbolizer):
    """The symbolizer's images in order, read one at a time where it can."""
    it = getattr(symbolizer, "iter_images", None)
    return it() if it is not None else iter(symbolizer.images)


def _names(symbolizer):
    for img in _images(symbolizer):
        for _s, _n, name in img.functions():
            yield name


def function(symbolizer, name: str) -> tuple[int, int]:
    """(runtime start, size) of function ``name`` (first image defining it;
    images after it are not read)."""
    for img in _images(symbolizer):
        for start, size, n in img.functions():
            if n == name:
                return start, size
        hit = _alias(img, name)
        if hit is not None:
            return hit
    raise SymbolNotFound(name, _names(symbolizer))


def _alias(img, name: str):
    """A function the symbolizer knows under another name at the same
    address (``printf`` = ``_IO_printf``): look the name up in the image's
    own symbol tables."""
    path = getattr(img, "path", None)
    if not path:
        return None
    from hwtrace.analysis.symbols import function_symbol
    hit = function_symbol(path, name)
    return None if hit is None else (hit[0] + img.bias, hit[1])


def address(symbolizer, text: str, base: int | None = None) -> int:
    """The runtime address ``text`` denotes (see the module doc).  ``base``:
    the main executable's load base, for ``+OFF``."""
    s = text.strip()
    if not s:
        raise ValueError("empty address")
    v = None if s.startswith("+") else parse_number(s)
    if v is not None:
        return v
    if s.startswith("+"):
        off = parse_number(s[1:])
        if off is None:
            raise ValueError(f"bad address {text!r}")
        if base is None:
            raise ValueError(f"{text!r}: the main executable's load base is unknown")
        return base + off
    name, plus, off = s.partition("+")
    extra = 0
    if plus:
        o = parse_number(off)
        if o is None:
            raise ValueError(f"bad offset in {text!r}")
        extra = o
    start, _size = function(symbolizer, name)
    return start + extra


def address_range(symbolizer, text: str, base: int | None = None) -> tuple[int, int]:
    """[lo, hi) of ``A-B`` or of the function named ``text``."""
    s = text.strip()
    lo, dash, hi = s.partition("-")
    if dash:
        a, b = parse_number(lo.strip()), parse_number(hi.strip())
        if a is not None and b is not None:
            if b <= a:
                raise ValueError(f"empty range {text!r}")
            return a, b
    v = parse_number(s)
    if v is not None:
        return v, v + 1
    start, size = function(symbolizer, s)
    return start, start + max(size, 1)


def main_base(symbolizer) -> int | None:
    """Load base of the first image (the main executable, by convention)."""
    img = next(_images(symbolizer), None)
    if img is None:
        return None
    return img.low if img.is_pie else 0

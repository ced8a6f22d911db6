"""The filter mask: which records to keep (kinds, pids/tids, ranges of
``from``).  A :class:`MaskSpec` holds what the user wrote; ``bind`` it to
a symbolizer to get a :class:`Mask` with addresses."""

from __future__ import annotations

from dataclasses import dataclass

from . import resolve
from .records import ALL_KINDS, KINDS


def parse_kinds(text: str | None) -> frozenset[str]:
    """``call,return``; ``all`` (every kind but cond_not_taken); None: all."""
    if text is None:
        return ALL_KINDS
    out: set[str] = set()
    for part in text.split(","):
        k = part.strip().lower()
        if not k:
            continue
        if k == "all":
            out |= ALL_KINDS
        elif k in KINDS:
            out.add(k)
        else:
            raise ValueError(f"unknown branch kind {k!r} (kinds: all, {', '.join(KINDS)})")
    if not out:
        raise ValueError("no branch kinds given")
    return frozenset(out)


@dataclass(frozen=True)
class MaskSpec:
    kinds: frozenset[str] = ALL_KINDS
    pids: frozenset[int] = frozenset()       # empty: any
    tids: frozenset[int] = frozenset()
    ranges: tuple[str, ...] = ()             # "A-B" or a symbol; empty: any

    def bind(self, symbolizer, base: int | None = None) -> "Mask":
        rs = tuple(resolve.address_range(symbolizer, r, base) for r in self.ranges)
        return Mask(self.kinds, self.pids, self.tids, rs)


@dataclass(frozen=True)
class Mask:
    kinds: frozenset[str] = ALL_KINDS
    pids: frozenset[int] = frozenset()
    tids: frozenset[int] = frozenset()
    ranges: tuple[tuple[int, int], ...] = ()

    def wants_thread(self, pid, tid) -> bool:
        if self.pids and pid not in self.pids:
            return False
        if self.tids and tid not in self.tids:
            return False
        return True

    def accepts(self, kind: str, frm: int | None, to: int | None = None) -> bool:
        """Ranges select by ``from``; a record coming back from untraced
        code (``from`` unknown) by ``to``, the code it resumes."""
        if kind not in self.kinds:
            return False
        if self.ranges:
            a = frm if frm is not None else to
            return a is not None and any(lo <= a < hi for lo, hi in self.ranges)
        return True

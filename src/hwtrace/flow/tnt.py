"""The TNT cache: taken/not-taken bits of the last TNT packet, oldest
first (libipt's pt_tnt_cache)."""

from __future__ import annotations


class TntCache:
    __slots__ = ("bits", "index")

    def __init__(self):
        self.bits = 0
        self.index = 0     # mask of the next bit to hand out; 0: empty

    def clear(self) -> None:
        self.bits = 0
        self.index = 0

    def empty(self) -> bool:
        return not self.index

    def fill(self, payload: int, bit_size: int) -> bool:
        """Cache a TNT packet's bits; False if bits were still cached."""
        if self.index:
            return False
        self.bits = payload
        self.index = (1 << (bit_size - 1)) if bit_size > 0 else 0
        return True

    def take(self) -> int:
        """1 taken, 0 not taken, -1 if empty."""
        index = self.index
        if not index:
            return -1
        self.index = index >> 1
        return 1 if self.bits & index else 0

"""The return-address stack used to resolve compressed returns
(libipt's pt_retstack: 64 entries, the oldest overwritten when full)."""

from __future__ import annotations

CAPACITY = 64


class RetStack:
    __slots__ = ("_stack",)

    def __init__(self):
        self._stack = []

    def clear(self) -> None:
        self._stack.clear()

    def push(self, ip: int) -> None:
        stack = self._stack
        if len(stack) >= CAPACITY:
            del stack[0]
        stack.append(ip)

    def pop(self) -> int | None:
        """The most recent return address, or None if empty."""
        stack = self._stack
        return stack.pop() if stack else None

    def __len__(self) -> int:
        return len(self._stack)

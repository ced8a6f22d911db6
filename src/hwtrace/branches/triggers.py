"""Triggers: when tracing is on.  The same model for every source.

* ``start``/``stop`` (either or both): on when execution reaches ``start``
  (the instruction there is inside), off when it reaches ``stop`` (the
  instruction there is outside); with only ``stop``, on from the beginning;
  a later ``start`` reopens the window.
* ``within``: on when a thread reaches the function's entry while off; off
  when that activation returns.  A decoded trace has no stack pointer, so
  the activation's return is found by call depth (calls +1, returns -1:
  the return executed at depth 0 closes the window); a live source closes
  the window where the stepper's debug-register trigger saw the return
  address and stack pointer match (it tells the tracker).  Each activation
  opens a window; recursion inside one does not close it.
* none: on everywhere.

``TriggerSpec`` is what the user wrote; ``bind`` resolves it to a
:class:`Trigger` of addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import resolve


@dataclass(frozen=True)
class TriggerSpec:
    start: str | None = None
    stop: str | None = None
    within: str | None = None

    def __post_init__(self):
        if self.within is not None and (self.start is not None or self.stop is not None):
            raise ValueError("--within excludes --start/--stop")

    @property
    def any(self) -> bool:
        return self.start is not None or self.stop is not None or self.within is not None

    def bind(self, symbolizer, base: int | None = None) -> "Trigger":
        def a(v):
            return None if v is None else resolve.address(symbolizer, v, base)
        return Trigger(a(self.start), a(self.stop), a(self.within))


@dataclass(frozen=True)
class Trigger:
    start: int | None = None
    stop: int | None = None
    within: int | None = None

    @property
    def initially_on(self) -> bool:
        return self.start is None and self.within is None

    @property
    def watch(self) -> frozenset[int]:
        """Addresses whose execution can change the window state."""
        return frozenset(a for a in (self.start, self.stop, self.within) if a is not None)

"""Progress on stderr: a bar (or a counter when the total is unknown) that
redraws at most every 0.2 s, only when stderr is a terminal; always one
summary line at the end.

The bar is a line without its newline: anything else written to stderr
while it shows (a warning, an error) first calls :func:`clear_line`, so
that it starts on a clean line; the bar comes back at its next redraw."""

from __future__ import annotations

import sys
import time


_WIDTH = 100
_shown = None       # the Progress whose bar is on the terminal now


def clear_line() -> None:
    """Erase the progress bar now on the terminal, if one is: the next
    text written to stderr starts at column 0 of an empty line."""
    p = _shown
    if p is not None:
        p._clear()


class Progress:
    def __init__(self, label: str = "", total: int | None = None,
                 stream=None, enabled: bool | None = None, unit: str = "items"):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty()
            except (AttributeError, ValueError):
                enabled = False
        self.enabled = enabled
        self.label = label
        self.total = total
        self.unit = unit
        self.count = 0
        self._start = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def __call__(self, n: int) -> None:
        self.count += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        self._draw(now)

    def set_label(self, label: str, total: int | None = None) -> None:
        self.label = label
        if total is not None:
            self.total = total

    def _draw(self, now: float) -> None:
        rate = self.count / max(now - self._start, 1e-9)
        if self.total:
            frac = min(self.count / self.total, 1.0)
            width = 30
            bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
            text = f"{self.label} [{bar}] {frac:4.0%} {rate:,.0f} {self.unit}/s"
        else:
            text = f"{self.label} {self.count:,} {self.unit} ({rate:,.0f}/s)"
        global _shown
        self.stream.write("\r" + text[:_WIDTH].ljust(_WIDTH))
        self.stream.flush()
        self._drawn = True
        _shown = self

    def _clear(self) -> None:
        global _shown
        if self._drawn:
            self.stream.write("\r" + " " * _WIDTH + "\r")
            self.stream.flush()
            self._drawn = False
        if _shown is self:
            _shown = None

    def done(self, summary: str) -> None:
        self._clear()
        elapsed = time.monotonic() - self._start
        self.stream.write(f"{summary} ({elapsed:.1f} s)\n")
        self.stream.flush()

"""The one error type of the perf.data / ring-buffer readers."""

from __future__ import annotations


class PerfDataError(Exception):
    """Malformed perf data: ``offset`` is where in the input it was found."""

    def __init__(self, message: str, offset: int):
        super().__init__(f"{message} at offset {offset:#x}")
        self.reason = message
        self.offset = offset

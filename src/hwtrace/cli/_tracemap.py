"""Trace files for the decoders without reading them into memory.

    buf = map_trace(path, offset=0, size=None)   # TraceMap, memoryview or bytes

:func:`map_trace` maps a trace file read-only (``mmap``) and hands the
decoders the mapping itself (or a memoryview of it for a range that does
not start on a page boundary): no copy of the trace is ever made, and
:class:`hwtrace.pt.decoder.PacketDecoder` and the decoders built on it read
it in place.

**Bounded resident memory.**  Pages of a file mapping are reclaimable, but
they count in the process's RSS while mapped.  :class:`TraceMap` offers
the decoders' ``release_before(offset)`` hook: each time a decoder's
position passes the next :data:`WINDOW` bytes, the pages more than
:data:`KEEP` bytes behind it are dropped from the mapping
(``madvise(MADV_DONTNEED)``).  On a read-only file mapping this never
changes what the decoder reads -- a dropped page that is read again (a
backward sync, a second decoder over the same buffer starting over) is
faulted back in from the page cache -- so the hook affects memory only,
never results.  What stays resident of the trace is then about
``WINDOW + KEEP`` plus what a decoder reads outside its forward pass (a
``sync_backward`` from the end, a long search for a PSB), up to the
trace's size.  The compiled flow core (``decode --quiet --stat``,
``coverage``) calls the hook at the first PSB past each returned offset.

Files that cannot be mapped (pipes, empty files, ``/proc`` files) are read
into bytes as before.  A trace file must not be truncated while it is
decoded (reading a mapped page past the new end is a SIGBUS).
"""

from __future__ import annotations

import mmap
import os
import stat

#: the decoders call release_before() every WINDOW bytes of progress
WINDOW = 8 << 20
#: bytes behind the decoder's position that stay mapped (peeks behind it)
KEEP = 1 << 20

_PAGE = mmap.PAGESIZE
_GRAIN = mmap.ALLOCATIONGRANULARITY


class TraceMap(mmap.mmap):
    """A read-only shared mapping of (part of) a trace file whose pages
    behind the decode are dropped as it moves on (see the module doc).
    ``view_base``: where the decoders' offset 0 lies in the mapping."""

    view_base = 0
    window = WINDOW
    keep = KEEP

    def release_before(self, offset: int) -> int:
        """Drop the pages more than :attr:`keep` bytes before ``offset``
        (an offset in the decoders' buffer); return the offset to be
        called at next."""
        upto = (self.view_base + offset - self.keep) & ~(_PAGE - 1)
        if upto > 0:
            self.madvise(mmap.MADV_DONTNEED, 0, min(upto, len(self)))
        return offset + self.window


def map_trace(path, offset: int = 0, size: int | None = None):
    """The bytes of ``path`` from ``offset``, ``size`` of them (all to the
    end with None; fewer if the file is shorter), without copying them:
    a :class:`TraceMap`, a memoryview of one, or ``bytes`` for a file that
    cannot be mapped.  Raises OSError for a file that cannot be read."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            f.seek(offset)
            return f.read() if size is None else f.read(size)
        avail = max(0, st.st_size - offset)
        n = avail if size is None else min(size, avail)
        if n <= 0:
            return b""
        start = offset - offset % _GRAIN
        delta = offset - start
        m = TraceMap(f.fileno(), delta + n, access=mmap.ACCESS_READ,
                     offset=start)
    m.view_base = delta
    if delta:
        return memoryview(m)[delta:]
    return m

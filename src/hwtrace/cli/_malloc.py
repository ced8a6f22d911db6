"""glibc's allocator keeping freed memory for the next chunk, for the
command line's views.

A view allocates its batches' and chunks' columns a few MB at a time,
frees them, and allocates the next ones: ~1.6 GB of activation rows on a
system-call-dense recording (yes in cpu mode).  glibc serves an
allocation that large from a fresh ``mmap`` until the first one is
freed, and gives the top of its heap back to the system whenever more
than twice the largest freed block lies free there; the next chunk's
pages are then faulted in and zeroed by the kernel again: ~130,000 page
faults, ~0.2 s of system time of ``summary`` on yes (~4.3 s in all).

:func:`keep_freed` sets what glibc's own adjustment reaches at its
limit from the start -- blocks below 32 MB come from the heap -- and
keeps up to 128 MB free at the heap's top before trimming it: ~58,000
page faults, the peak RSS the same within a few MB.  It is called once
a view's input is open, inside a command only (:mod:`._gc`'s), and does
nothing where the C library has no ``mallopt`` (not glibc).
"""

from __future__ import annotations

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: allocations at least this large come from mmap (glibc's dynamic maximum)
MMAP_THRESHOLD = 32 << 20
#: free memory kept at the heap's top before it is given back
TRIM_THRESHOLD = 128 << 20

_done = False


def keep_freed() -> bool:
    """Set the thresholds once (see the module doc); whether they are."""
    global _done
    if _done:
        return True
    import sys
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes           # (numpy has imported it already)
        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done

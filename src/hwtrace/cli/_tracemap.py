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

**Input checks.**  :func:`check_trace` is what every command checks on a
trace it was given (``dump FILE``, ``decode --pt``, ``coverage --pt``),
a one-line :class:`~hwtrace.cli.CliError` naming the file: an empty trace,
a trace without a PSB (nothing a decoder can synchronize on: random bytes,
not Intel PT).  A damaged trace that has a PSB is not refused: the decoders
decode its good parts and report the rest as errors at their offsets.
(A bundle's streams are not checked one by one: an idle CPU's may be
empty.)  :func:`check_view_input` does the same for the views' input (a
bundle directory or a ``.jsonl`` file).
"""

from __future__ import annotations

import mmap
import os
import stat

from hwtrace.cli import CliError

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
            if offset:          # a pipe cannot seek: read up to the offset
                f.read(offset)
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


#: a PSB packet: the pattern the decoders synchronize on (libipt's
#: pt_sync_forward looks for the whole of it)
PSB = b"\x02\x82" * 8


def _find(data, pattern: bytes) -> int:
    """``data.find(pattern)`` for what :func:`map_trace` returns (a
    memoryview has no find: search the mapping under it)."""
    if isinstance(data, memoryview):
        i = data.obj.find(pattern, data.obj.view_base)
        return i - data.obj.view_base if i >= 0 else -1
    return data.find(pattern)


def trace_problem(data, sync: bool = True) -> str | None:
    """Why ``data`` holds nothing a decoder can decode, or None: empty, or
    (``sync``) no PSB in it."""
    if len(data) == 0:
        return "empty file (0 bytes): nothing to decode"
    if sync and _find(data, PSB) < 0:
        return (f"no PSB packet (sync point) in its {len(data):,} bytes: not "
                f"an Intel PT trace, or damaged beyond decoding")
    return None


def check_trace(data, name: str, sync: bool = True, hint: str = "") -> None:
    """A one-line CliError ``NAME: why`` if :func:`trace_problem` finds
    nothing to decode in ``data`` (``hint`` appended when there are bytes
    but no PSB)."""
    problem = trace_problem(data, sync)
    if problem:
        raise CliError(f"{name}: {problem}{hint if len(data) else ''}")


def check_view_input(path, elf=(), raw_trace: bool = False) -> None:
    """The views' INPUT (``summary``, ``calls``, ``export``, ``branches``)
    is a bundle directory or a ``.jsonl`` file of flow items or branch
    records (``raw_trace``: or a raw ``.pt`` trace): name anything else (an
    empty file, a raw trace where none is read, random bytes) in one line,
    and any ``--elf FILE[:BIAS]`` that is not an x86 ELF file.  A directory
    or a missing path is left to the bundle reader, whose messages say
    what is wrong with it."""
    from hwtrace.flow.image import ImageError
    from hwtrace.flow.loaders import elf_segments, split_elf_arg
    for arg in elf:
        try:
            elf_segments(split_elf_arg(arg)[0])
        except ImageError as e:
            raise CliError(f"--elf: {e}") from None
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return
            head = f.read(4096)
    except (IsADirectoryError, FileNotFoundError):
        return
    except OSError as e:
        raise CliError(f"cannot read {p}: {e.strerror or e}") from None
    if head.lstrip()[:1] == b"{":
        return
    if raw_trace:
        check_trace(map_trace(p), p)
        return
    if not head.strip():
        raise CliError(f"{p}: empty file: give a trace bundle directory "
                       f"(hwtrace record -o DIR) or a .jsonl file of flow "
                       f"items")
    if _find(map_trace(p), PSB) >= 0:
        raise CliError(
            f"{p}: a raw Intel PT trace: give its bundle directory instead, "
            f"or decode it to flow items first: hwtrace decode --pt {p} "
            f"--elf PROG --format jsonl > items.jsonl")
    raise CliError(f"{p}: not a trace bundle directory nor a .jsonl file of "
                   f"flow items or branch records (nor an Intel PT trace: no "
                   f"PSB in it)")

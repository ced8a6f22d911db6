"""Branch records from a decoded trace: a bundle (decoded by the
instruction-flow decoder through ``hwtrace.export.source``), a raw ``.pt``
stream with ``--elf`` images, or a ``.jsonl`` file of flow items
(``ptoracle insn`` / ``hwtrace decode --format jsonl`` lines) with
``--elf`` images.

The instruction flow gives each executed instruction's address and class;
the instruction bytes (needed to tell a direct from an indirect call, a
syscall from a far call) are read from the same images the decoder used
(the bundle's memory maps, or the ELF files).  Everything then goes
through the shared :class:`~hwtrace.branches.tracker.Tracker`, so the
trigger windows and the mask are applied exactly as for a live process.

Where tracing stops and starts again (TIP.PGD / TIP.PGE, and the
asynchronous FUP+TIP.PGD of an interrupt into an untraced kernel), the
records have a None end (see :mod:`.records`): a synchronous disable
ends the pending transfer with ``to`` None (a ``syscall``), an
asynchronous one is an ``interrupt`` from the interrupted IP, and each
enable is a ``sysret``/``iret`` from None to its IP.  Status updates
(a PSB+ restating the state: its FUP while tracing is on, or no FUP
while it is off) are neither exits nor resumes, wherever the PSB+ falls
-- even between a branch and its target.

Per-CPU bundles (``hwtrace record --mode cpu``) interleave threads in one
stream and the sideband's switch times are not on the trace's clock here:
their records have no pid/tid, and an enable elsewhere than where tracing
stopped may be another thread, so it is not taken for a signal handler
(no depth change).  Record with ``--mode thread`` for per-thread records.

    trace = decoded_records("bundle/", TriggerSpec(within="fib"))
    trace.symbolizer ; for rec in trace.records(): ...
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Iterator

from hwtrace.x86 import Mode, X86Error, decoder_for

from . import resolve
from .classify import is_transfer
from .mask import MaskSpec
from .records import Branch
from .tracker import Tracker
from .triggers import TriggerSpec


class DecodedError(Exception):
    """The trace cannot be decoded (one line, for the user)."""


class CodeReader:
    """Instruction bytes at runtime addresses, from mapped files (the
    source's ``code``: the same files its decoder read)."""

    def __init__(self):
        self._maps: list[tuple[int, int, str, int]] = []   # (start, end, path, off)
        self._files: dict[str, bytes] = {}
        self._starts: list[int] = []

    def add(self, start: int, size: int, path: str, offset: int) -> None:
        self._maps.append((start, start + size, path, offset))
        self._maps.sort()
        self._starts = [m[0] for m in self._maps]

    def read(self, addr: int, n: int = 15) -> bytes:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return b""
        start, end, path, off = self._maps[i]
        if addr >= end:
            return b""
        data = self._files.get(path)
        if data is None:
            try:
                data = self._files[path] = Path(path).read_bytes()
            except OSError:
                data = self._files[path] = b""
        o = off + addr - start
        return data[o:o + min(n, end - addr)]


_NOT_BRANCH = frozenset({"other", "ptwrite", "unknown", "error"})


class _Consumer:
    """One stream's items (the export pipeline's consumer protocol:
    ``insn(ip, size, iclass)`` and ``feed(item)``) into the tracker."""

    def __init__(self, tracker: Tracker, th, reader: CodeReader, per_cpu: bool = False):
        # the trace's enable/disable events say where tracing stopped and
        # resumed (with the OS bit, a syscall goes on into the kernel)
        tracker.kernel_untraced = False
        self.tracker = tracker
        self.th = th
        self.reader = reader
        # a per-CPU stream interleaves threads: tracing disabled and enabled
        # elsewhere may be a context switch, not the same thread going on
        self.per_cpu = per_cpu
        self.time = None
        # is tracing on as far as the events said (None: unknown -- the
        # stream's start, or after an overflow or a decode error)
        self.enabled: bool | None = None
        self._decode = decoder_for(Mode.BIT64)
        self._cache: dict[int, object] = {}

    def _insn_at(self, ip: int):
        c = self._cache
        if ip in c:
            return c[ip]
        x = None
        code = self.reader.read(ip)
        if code:
            try:
                d = self._decode(code, 0)
                if is_transfer(d):
                    x = d
            except X86Error:
                pass
        c[ip] = x
        return x

    flush_at = 1 << 62
    flush = None

    def insn(self, ip: int, size: int, iclass) -> None:
        x = None if iclass in _NOT_BRANCH else self._insn_at(ip)
        t = self.tracker
        t.step(self.th, ip, x, self.time)
        if len(t.out) >= self.flush_at:
            self.flush()

    def feed(self, item) -> None:
        if not isinstance(item, dict):
            return
        if "error" in item:
            self.tracker.gap(self.th)
            self.enabled = None
            return
        ev = item.get("event")
        if ev is None:
            if "iclass" in item and "ip" in item:
                self.insn(item["ip"], item.get("size", 0), item["iclass"])
            return
        tsc = item.get("tsc")
        if tsc is not None:
            self.time = tsc
        th = self.th
        t = self.tracker
        if ev == "async_disabled":
            # interrupted at `at` (user-only trace: the kernel is not traced)
            self.enabled = False
            at = item.get("at")
            if at is not None:
                t.async_exit(th, at, self.time)
            else:
                t.gap(th)
        elif ev == "disabled":
            self.enabled = False
            if not item.get("status_update"):
                # the pending transfer went into untraced code (a syscall
                # into the kernel, or out of the filtered ranges)
                t.leave(th, None if item.get("ip_suppressed") else item.get("ip"), self.time)
        elif ev == "enabled":
            if item.get("status_update") and self.enabled:
                # a PSB+ restating where tracing already is (its FUP): no
                # transfer happened -- the pending branch goes on to the
                # next instruction as usual
                return
            self.enabled = True
            ip = item.get("ip")
            if ip is None:
                t.gap(th)
            else:
                # per-CPU: tracing turned on again may be another thread
                t.resume(th, ip, self.time, handlers=not self.per_cpu)
        elif ev == "overflow":
            self.enabled = None
            t.gap(th)


class DecodedTrace:
    def __init__(self, source, reader: CodeReader, trigger: TriggerSpec, mask: MaskSpec):
        self.source = source
        self.symbolizer = source.symbolizer
        self.reader = reader
        self.base = resolve.main_base(self.symbolizer)
        # bind now: unknown symbols fail before any decoding
        self.trigger = trigger.bind(self.symbolizer, self.base)
        self.mask = mask.bind(self.symbolizer, self.base)

    def records(self) -> Iterator[Branch]:
        """Every stream's records in turn.  The decoder pushes; it runs in a
        helper thread handing over batches through a bounded queue, so a
        long trace is never held whole (closing the iterator stops it)."""
        for job in self.source.jobs:
            info = job.info
            tracker = Tracker(self.trigger, self.mask, kernel_untraced=False)
            th = tracker.thread(info.pid, info.tid)
            if not th.wanted:
                continue
            yield from _pull(job, _Consumer(tracker, th, self.reader,
                                            per_cpu=info.tid is None and info.cpu is not None))


class _Stop(BaseException):
    """Unwinds the decoder when the reader went away."""


_END = object()
BATCH = 4096


def _pull(job, consumer: "_Consumer") -> Iterator[Branch]:
    import queue
    import threading

    from hwtrace.export.source import SourceError

    q: queue.Queue = queue.Queue(maxsize=16)
    stop = threading.Event()
    out = consumer.tracker.out

    def put(item):
        while True:
            if stop.is_set():
                raise _Stop
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def flush():
        if out:
            batch = out[:]
            out.clear()
            put(batch)
    consumer.flush_at = BATCH
    consumer.flush = flush

    def work():
        try:
            job.run(consumer)
            flush()
            put(_END)
        except _Stop:
            pass
        except SourceError as e:
            _try_put(q, stop, DecodedError(str(e)))
        except Exception as e:          # the flow decoder is another team's
            _try_put(q, stop, DecodedError(f"{job.info.label()}: decoding failed: "
                                           f"{type(e).__name__}: {e}"))
        except BaseException as e:      # MemoryError, KeyboardInterrupt...
            _try_put(q, stop, e)

    t = threading.Thread(target=work, name="hwtrace-branches-decode", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            yield from item
    finally:
        stop.set()
        t.join()


def _try_put(q, stop, item) -> None:
    import queue
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def decoded_records(path: str | os.PathLike, trigger: TriggerSpec = TriggerSpec(),
                    mask: MaskSpec = MaskSpec(), elf=(), image_path=()) -> DecodedTrace:
    """Open a bundle (or a flow-items ``.jsonl`` with ``elf`` images); raises
    DecodedError, resolve.SymbolNotFound or ValueError (bad trigger/range)."""
    from hwtrace.export.source import SourceError, open_source, pt_source
    p = Path(path)
    try:
        if p.is_file() and p.suffix != ".jsonl":
            src = pt_source(p, list(elf))
        else:
            src = open_source(p, list(elf), list(image_path))
    except SourceError as e:
        raise DecodedError(str(e)) from None
    reader = CodeReader()
    for m in src.code:              # the files the decoder read its code from
        reader.add(m.start, m.size, m.path, m.offset)
    return DecodedTrace(src, reader, trigger, mask)

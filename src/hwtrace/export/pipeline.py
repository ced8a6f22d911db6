"""Drive decoded streams through the call-stack builder into writers.

A :class:`StreamExporter` is the one consumer every output shares: it takes
one stream's items (pushed: :meth:`~StreamExporter.insn` for instructions,
:meth:`~StreamExporter.feed` for anything else), runs them once through the
builder (and the coverage collector when coverage is wanted), and hands
every record to every writer.  :func:`export_streams` does the same for
pull-style iterables.  No file I/O here: writers own their files;
``progress`` (optional) is told how many items went by.
"""

from __future__ import annotations

from typing import Callable, Iterable

from hwtrace.analysis.callstack import CallStackBuilder
from hwtrace.analysis.coverage import CoverageCollector
from hwtrace.analysis.records import StreamInfo


class Stream:
    """One decoded stream: who it belongs to, its items, its timing."""

    def __init__(self, info: StreamInfo, items: Iterable, tsc_hz=None,
                 clock: str = "auto"):
        self.info = info
        self.items = items
        self.tsc_hz = tsc_hz
        self.clock = clock


class StreamExporter:
    def __init__(self, info: StreamInfo, writers: list, lookup=None,
                 coverage: CoverageCollector | None = None,
                 progress: Callable[[int], None] | None = None,
                 tsc_hz=None, clock: str = "auto", max_pending: int = 1 << 16):
        self.info = info
        self.writers = writers
        self.builder = b = CallStackBuilder(info, lookup, clock, tsc_hz,
                                            max_pending)
        self.coverage = coverage
        self.progress = progress
        self._started = False
        self._n = 0
        self._b_insn = b.insn
        self._b_feed = b.feed
        self._c_insn = coverage.insn if coverage else None
        self._c_feed = coverage.feed if coverage else None

    def _deliver(self, recs) -> None:
        if not self._started:
            self._started = True
            for w in self.writers:
                w.begin_stream(self.info, self.builder.clock.unit)
        ws = self.writers
        for r in recs:
            for w in ws:
                w.add(r)

    def insn(self, ip: int, size: int, iclass) -> None:
        self._b_insn(ip, size, iclass)
        if self._c_insn:
            self._c_insn(ip, size, iclass)
        self._tick()

    def feed(self, item) -> None:
        if type(item) is dict and "iclass" in item and "error" not in item \
                and "event" not in item:
            self.insn(item["ip"], item.get("size", 0), item["iclass"])
            return
        self.feed_other(item)
        self._tick()

    def branch(self, kind: str, frm: int, to: int, time=None) -> None:
        """One branch record (spec/branch-trace.md) of this stream's thread."""
        self.builder.branch(kind, frm, to, time)
        self._tick()

    def feed_other(self, item) -> None:
        """An item that is not a dict instruction (object items welcome)."""
        self._b_feed(item)
        if self._c_feed:
            self._c_feed(item)

    def _tick(self) -> None:
        self._n += 1
        b = self.builder
        if b._out:
            self._deliver(b.take())
        if self.progress and not self._n & 0xFFFF:
            self.progress(0x10000)

    def finish(self) -> None:
        b = self.builder
        b.finish()
        self._deliver(b.take())
        if self.progress and self._n & 0xFFFF:
            self.progress(self._n & 0xFFFF)
        if self.coverage:
            self.coverage.gap()


def new_totals() -> dict:
    return {"streams": 0, "insns": 0, "activations": 0, "markers": {}}


def add_totals(totals: dict, ex: StreamExporter) -> dict:
    b = ex.builder
    totals["streams"] += 1
    totals["insns"] += b.n
    totals["activations"] += b.calls
    for k, v in b.markers.items():
        totals["markers"][k] = totals["markers"].get(k, 0) + v
    return totals


def export_streams(streams: Iterable[Stream], writers: list, lookup=None,
                   coverage: CoverageCollector | None = None,
                   progress: Callable[[int], None] | None = None,
                   max_pending: int = 1 << 16) -> dict:
    """Returns totals: streams, insns, activations, markers (by kind)."""
    totals = new_totals()
    for st in streams:
        ex = StreamExporter(st.info, writers, lookup, coverage, None,
                            st.tsc_hz, st.clock, max_pending)
        b = ex.builder
        b_insn, c_insn = b.insn, ex._c_insn
        other = ex.feed_other
        deliver = ex._deliver
        n = 0
        for item in st.items:
            # the hot path, inlined: a dict instruction
            if type(item) is dict and "iclass" in item and "error" not in item \
                    and "event" not in item:
                ip, size, ic = item["ip"], item.get("size", 0), item["iclass"]
                b_insn(ip, size, ic)
                if c_insn is not None:
                    c_insn(ip, size, ic)
            else:
                other(item)
            if b._out:
                deliver(b.take())
            n += 1
            if progress is not None and not n & 0xFFFF:
                progress(0x10000)
        if progress is not None:
            progress(n & 0xFFFF)
        ex.finish()
        add_totals(totals, ex)
    return totals

"""Drive decoded streams through the call-stack builder into writers.

``export_streams`` is the one loop every output shares: each stream's
items go once through the builder (and the coverage collector when
coverage is wanted), and every record goes to every writer.  No file I/O
here: writers own their files; ``progress`` (optional) is told how many
items went by.
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


def export_streams(streams: Iterable[Stream], writers: list, lookup=None,
                   coverage: CoverageCollector | None = None,
                   progress: Callable[[int], None] | None = None,
                   max_pending: int = 1 << 16) -> dict:
    """Returns totals: streams, insns, activations, markers (by kind)."""
    totals = {"streams": 0, "insns": 0, "activations": 0, "markers": {}}
    for st in streams:
        b = CallStackBuilder(st.info, lookup, st.clock, st.tsc_hz, max_pending)
        started = False
        cov_insn = coverage.insn if coverage else None
        cov_feed = coverage.feed if coverage else None
        n = 0

        def deliver(recs):
            nonlocal started
            if not started:
                started = True
                for w in writers:
                    w.begin_stream(st.info, b.clock.unit)
            for r in recs:
                for w in writers:
                    w.add(r)

        insn, feed = b.insn, b.feed
        for item in st.items:
            if type(item) is dict and "iclass" in item and "error" not in item \
                    and "event" not in item:
                insn(item["ip"], item.get("size", 0), item["iclass"])
                if cov_insn:
                    cov_insn(item["ip"], item.get("size", 0), item["iclass"])
            else:
                feed(item)
                if cov_feed:
                    cov_feed(item)
            n += 1
            if b._out:
                deliver(b.take())
            if progress and not n & 0xFFFF:
                progress(0x10000)
        b.finish()
        deliver(b.take())
        if progress:
            progress(n & 0xFFFF)
        if coverage:
            coverage.gap()
        totals["streams"] += 1
        totals["insns"] += b.n
        totals["activations"] += b.calls
        for k, v in b.markers.items():
            totals["markers"][k] = totals["markers"].get(k, 0) + v
    return totals

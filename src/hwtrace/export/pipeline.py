"""Drive decoded streams through the call-stack builder into writers.

:class:`ViewRun` is the one driver every view shares: per stream it feeds
the stream's batches (or flow items, or branch records) once through a
:class:`~hwtrace.analysis.callstack.CallStackBuilder` (and the coverage
collector when coverage is wanted) and hands every chunk of activations
to every writer (``begin_stream(info, unit)``, ``add_slices(chunk,
builder)``, ``close()``).  What the recorder said was lost (a buffer that
filled and stopped, a ring buffer that wrapped) becomes a ``lost`` marker
where the data is missing -- at the stream's end, or its start -- so
every view shows it where it happened.  No file I/O here: writers own
their files; ``progress`` (optional) is told how many bytes of trace went
by.  :func:`export_streams` is the same for streams of flow items.
"""

from __future__ import annotations

from typing import Callable, Iterable

from hwtrace.analysis.callstack import CallStackBuilder
from hwtrace.analysis.coverage import CoverageCollector
from hwtrace.analysis.records import StreamInfo
from hwtrace.flow import plain

#: a view's batches: small first (output at once), then large
MAX_RECORDS = 1 << 18


class Stream:
    """One stream of flow items: who it belongs to, its items, its timing."""

    def __init__(self, info: StreamInfo, items: Iterable, tsc_hz=None,
                 clock: str = "auto"):
        self.info = info
        self.items = items
        self.tsc_hz = tsc_hz
        self.clock = clock


def new_totals() -> dict:
    return {"streams": 0, "insns": 0, "activations": 0, "markers": {},
            "errors": [], "lost": [], "bytes": 0, "events": 0}


class ViewRun:
    def __init__(self, writers: list, lookup=None, clock: str = "auto",
                 tsc_hz=None, coverage: CoverageCollector | None = None,
                 progress: Callable[[int], None] | None = None,
                 max_pending: int = 1 << 16, window=None, space_lookup=None):
        self.writers = writers
        self.lookup = lookup
        self.space_lookup = space_lookup    # CallStackBuilder's
        self.clock = clock
        self.tsc_hz = tsc_hz
        self.coverage = coverage
        self.progress = progress
        self.max_pending = max_pending
        self.window = window             # a hwtrace.analysis.window filter factory
        self.totals = new_totals()

    def _builder(self, info, tsc_hz, clock=None, threads=None) -> CallStackBuilder:
        paths = any(getattr(w, "needs_paths", False) for w in self.writers)
        return CallStackBuilder(info, self.lookup, clock or self.clock,
                                self.tsc_hz or tsc_hz, self.max_pending,
                                paths=paths, space_lookup=self.space_lookup,
                                threads=threads)

    def _taken(self, b: CallStackBuilder, state: dict) -> list:
        """The builder's finished chunks (within the window, if any)."""
        chunks = b.take_slices()
        if self.window is not None:
            chunks = state["window"].filter(chunks, b)
        return chunks

    def _emit(self, b: CallStackBuilder, state: dict, chunks) -> None:
        """Chunks of ``b``'s stream to the writers (its stream begun
        with the first)."""
        for ch in chunks:
            if not state["started"]:
                state["started"] = True
                for w in self.writers:
                    w.begin_stream(b.stream, b.time.unit)
            for w in self.writers:
                w.add_slices(ch, b)

    def _deliver(self, b: CallStackBuilder, state: dict) -> None:
        self._emit(b, state, self._taken(b, state))

    @staticmethod
    def _wrapped(b: CallStackBuilder, entry) -> None:
        """The marker at a stream's start where its ring buffer wrapped."""
        if entry is not None and entry.wrapped:
            b._marker("lost", None, "the ring buffer wrapped: the trace "
                      "before this point was overwritten")

    @staticmethod
    def _ended(b: CallStackBuilder, entry) -> None:
        """The marker at a stream's end where the recorder lost data."""
        if entry is not None and (entry.stopped or entry.lost_bytes):
            why = "the buffer filled and tracing stopped" if entry.stopped \
                else "trace data was lost"
            lost = f": {entry.lost_bytes:,} bytes lost" if entry.lost_bytes else ""
            b._marker("lost", entry.size, f"{why}{lost}")

    def _state(self, b):
        st = {"started": False}
        if self.window is not None:
            st["window"] = self.window(b)
        return st

    # -- one stream -------------------------------------------------------------------
    def batches(self, info: StreamInfo, batches: Iterable, *, entry=None,
                tsc_hz=None) -> CallStackBuilder:
        b = self._builder(info, tsc_hz)
        state = self._state(b)
        cov = self.coverage
        done = 0
        self._wrapped(b, entry)
        win = state.get("window")
        for batch in batches:
            b.feed_batch(batch)
            self.totals["events"] += plain.count(batch)
            if cov is not None:
                cov.add_batch(batch)
            self._deliver(b, state)
            if win is not None and win.past():
                break           # past the window: nothing more to see
            if self.progress is not None and len(batch.blocks):
                at = int(batch.blocks["offset"][-1])
                if at > done:
                    self.progress(at - done)
                    done = at
        self._ended(b, entry)
        b.finish()
        self._deliver(b, state)
        if cov is not None:
            cov.gap()
        self._add_totals(b, entry)
        return b

    def interleaved(self, sources: list, hold=None, at=None) -> list:
        """A recording's CPU streams (:class:`.interleave.Source` s) in
        time order, their threads followed from CPU to CPU (see
        :mod:`.interleave`); ``hold()``: where the later streams' chunks
        wait for their turn.  Returns the builders."""
        from hwtrace.export.interleave import _Held, run_interleaved
        return run_interleaved(self, sources, hold or _Held, at)

    def items(self, info: StreamInfo, items: Iterable, *, tsc_hz=None,
              clock=None) -> CallStackBuilder:
        b = self._builder(info, tsc_hz, clock)
        state = self._state(b)
        g = b._grouper()
        cov = self.coverage
        n = 0
        for item in items:
            g.feed(item)
            if cov is not None:
                cov.feed(item)
            if g.full:
                g.flush()
                self._deliver(b, state)
            n += 1
            if self.progress is not None and not n & 0xFFFF:
                self.progress(0x10000)
        b.finish()
        self._deliver(b, state)
        if cov is not None:
            cov.gap()
        self._add_totals(b, None)
        return b

    def branches(self, info: StreamInfo, records: Iterable) -> CallStackBuilder:
        """Branch records (kind, from, to, time) of one thread."""
        b = self._builder(info, None)
        state = self._state(b)
        for kind, frm, to, time in records:
            b.branch(kind, frm, to, time)
            if b.pending.count > 4096:
                self._deliver(b, state)
        b.finish()
        self._deliver(b, state)
        self._add_totals(b, None)
        return b

    def _add_totals(self, b: CallStackBuilder, entry) -> None:
        t = self.totals
        t["streams"] += 1
        t["insns"] += b.n
        t["activations"] += b.calls
        for k, v in b.markers.items():
            t["markers"][k] = t["markers"].get(k, 0) + v
        t["errors"] += b.loss_samples
        if entry is not None and entry.lossy:
            t["lost"].append(entry)


def export_streams(streams: Iterable[Stream], writers: list, lookup=None,
                   coverage: CoverageCollector | None = None,
                   progress: Callable[[int], None] | None = None,
                   max_pending: int = 1 << 16) -> dict:
    """Flow-item streams into writers.  Returns totals: streams, insns,
    activations, markers (by kind)."""
    run = ViewRun(writers, lookup, coverage=coverage, progress=progress,
                  max_pending=max_pending)
    for st in streams:
        run.items(st.info, st.items, tsc_hz=st.tsc_hz, clock=st.clock)
    return run.totals

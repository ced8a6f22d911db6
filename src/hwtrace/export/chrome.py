"""Chrome trace-event JSON, written as the activations come.

One ``"X"`` (complete) event per activation on the track of its thread
(``pid``/``tid``; a CPU's stream whose thread is not known: one process
"CPUs" with a track per CPU), ``"i"`` instant events for markers (gaps,
overflows, decode errors), and ``"M"`` metadata naming processes and
threads.  All streams share one timeline: ``ts``/``dur`` are
microseconds from the start of the first stream written, on a 2**-10 us
grid (exact in binary floating point, so nesting survives ``ts + dur``);
instruction-count clocks show one instruction as one nanosecond
(``otherData.clock`` says which).  Format: the Trace Event Format
document (Google, "JSON Object Format").  Lines are formatted a chunk of
activations at a time (:mod:`.textcols`).
"""

from __future__ import annotations

import json

import numpy as np

from hwtrace._unique import unique
from hwtrace.analysis.records import StreamInfo
from hwtrace.analysis.slices import RecordChunker
from hwtrace.export import UNITS_PER_US, flag_names, process_name, track_of
from hwtrace.export import _textcols_impl
from hwtrace.export.textcols import Lines, small_ids

#: the made-up process that holds one track per CPU in cpu mode (same as
#: the Perfetto writer's)
CPU_PID = 0x7FFF0000
#: the constant pieces of an "X" event (the compiled core's chrome_slices)
_PARTS = (b'{"ph":"X","name":', b',"cat":"call","ts":', b',"dur":', b',"pid":',
          b',"tid":', b"},\n")


class ChromeTraceWriter:
    """``args=True`` adds per-slice args (instructions, address, flags);
    off by default because speedscope makes every distinct args object a
    distinct frame (``fib {"insns":8}``), which splits its aggregate views.
    Activations with flags (truncated, unwound, ...) always carry them."""

    def __init__(self, fp, origin: float | None = None, args: bool = False,
                 impl: str | None = None):
        self._fp = fp
        #: the line formatter: None (the compiled core where it loaded),
        #: "python" (the twin) or "compiled"
        self.impl = impl
        self._args = args
        self._origin = origin
        self._first = True
        self._div = 1000.0
        self._units: set[str] = set()
        self.slices = 0
        self.instants = 0
        self._seen_pids: set = set()
        self._seen_tracks: set = set()
        self._info = StreamInfo()
        self._default = (0, 0)
        self._default_names = ("process 0", "trace")
        self._legacy: RecordChunker | None = None
        self._flags: dict[int, bytes] = {}
        self._jnames = None                 # the name table _jtab holds
        self._jtab: list[bytes] = []        # its names as JSON, by id
        fp.write('{"traceEvents":[\n')

    def _event(self, s: str) -> None:
        if self._first:
            self._first = False
            self._fp.write(s)
        else:
            self._fp.write(",\n" + s)

    def _track(self, pid: int, tid: int, pname: str, tname: str) -> None:
        if pid not in self._seen_pids:
            self._seen_pids.add(pid)
            self._event(json.dumps({"ph": "M", "name": "process_name", "pid": pid,
                                    "tid": tid, "args": {"name": pname}}))
        if (pid, tid) not in self._seen_tracks:
            self._seen_tracks.add((pid, tid))
            self._event(json.dumps({"ph": "M", "name": "thread_name", "pid": pid,
                                    "tid": tid, "args": {"name": tname}}))

    def begin_stream(self, info: StreamInfo, unit: str | None = "insns") -> None:
        self._flush_legacy()
        self._info = info
        pid, tid, pname, tname = track_of(info, CPU_PID)
        self._default = (pid, tid)
        self._default_names = (pname, tname)
        self._div = UNITS_PER_US.get(unit, 1000.0)
        self._units.add(unit or "insns")

    def _use_default(self) -> None:
        """The stream's own track, named where first used (a CPU's stream
        that follows its threads may never use it)."""
        self._track(*self._default, *self._default_names)

    def _k(self, t: np.ndarray) -> np.ndarray:
        """Times -> 2**-10 us grid units from the origin."""
        return np.round((t - self._origin) / self._div * 1024).astype(np.int64)

    def add_slices(self, chunk, ctx) -> None:
        """A chunk of activations (``ctx``: its builder's ``names``)."""
        names = ctx.names
        X = chunk.exits
        if self._origin is None:
            firsts = [a["begin"].min() for a in (chunk.enters, X) if len(a)]
            if firsts:
                self._origin = float(min(firsts))
            elif chunk.markers:
                self._origin = chunk.markers[0][1].time
        if len(X):
            self._write_slices(X, names)
        for _seq, m in chunk.markers:
            self._marker(m)

    def _write_slices(self, X: np.ndarray, names) -> None:
        n = len(X)
        b = self._k(X["begin"])
        e = self._k(X["end"])
        pid, tid = self._tracks(X)
        # every name of the builder's table as JSON, kept across chunks
        # (the ids a chunk uses index it; a new table starts a new list)
        if self._jnames is not names:
            self._jnames, self._jtab = names, []
        table = self._jtab
        if len(table) < len(names):
            table.extend(names.json_bytes(i) for i in range(len(table), len(names)))
        flags = X["flags"]
        core = None if self._args else _textcols_impl.core_for(self.impl)
        if self._first:
            self._first = False
        else:
            self._fp.write(",\n")
        if core is not None:
            ftab = self._flag_table(flags, b',"args":{"flags":"', b'"}')
            c64 = np.ascontiguousarray
            cols = (c64(X["name"], np.int64), c64(b, np.int64), c64(e - b, np.int64),
                    c64(pid, np.int64), c64(tid, np.int64),
                    c64(self._flag_ids, np.int64), table, ftab, _PARTS)
            raw = _byte_layer(self._fp)
            if raw is not None:
                # a megabyte at a time from the core's buffer, less the
                # last ",\n" (written while still in the cache)
                self._fp.flush()            # what the text layer holds goes first
                core.chrome_slices(*cols, raw.write, 2)
                self.slices += n
                return
            text = core.chrome_slices(*cols)
        else:
            text = self._lines(X, table, b, e, pid, tid, flags)
        _write_ascii(self._fp, memoryview(text)[:-2])
        self.slices += n

    def _lines(self, X, table, b, e, pid, tid, flags) -> bytes:
        """The events' lines, each ending ",\n" (the twin of the compiled
        ``chrome_slices``, and the writer of ``args``)."""
        n = len(X)
        t = Lines(n)
        t.lit(b'{"ph":"X","name":').strs(table, X["name"])
        t.lit(b',"cat":"call","ts":').frac(b).lit(b',"dur":').frac(e - b)
        t.lit(b',"pid":').int(pid).lit(b',"tid":').int(tid)
        if self._args:
            t.lit(b',"args":{"insns":').int(X["end_idx"] - X["begin_idx"])
            t.lit(b',"self_insns":').int(X["end_idx"] - X["begin_idx"]
                                         - X["child_insns"])
            known = X["func"] != np.uint64(0xFFFFFFFFFFFFFFFF)
            if known.all():
                t.lit(b',"addr":"').hex(X["func"]).lit(b'"')
            else:
                t.strs([b"", b',"addr":"'], known.astype(np.int64))
                t.hex(X["func"], b"")
                t.strs([b"", b'"'], known.astype(np.int64))
            t.strs(self._flag_table(flags, b',"flags":"', b'"'), self._flag_ids)
            t.lit(b"}}")
        else:
            t.strs(self._flag_table(flags, b',"args":{"flags":"', b'"}'),
                   self._flag_ids)
            t.lit(b"}")
        t.lit(b",\n")
        return t.text(self.impl)

    def _flag_table(self, flags: np.ndarray, head: bytes, tail: bytes) -> list:
        """Strings per distinct flags value (ids in self._flag_ids)."""
        from hwtrace.analysis.records import Flag
        u, inv = small_ids(flags)
        table = []
        for f in u.tolist():
            table.append(head + flag_names(Flag(f)).encode() + tail if f else b"")
        self._flag_ids = inv
        return table

    def _tracks(self, X: np.ndarray):
        """pid and tid of every row: its thread's, or the stream's track."""
        dp, dt = self._default
        has = X["tid"] >= 0
        info = self._info
        cpu_stream = info.tid is None and info.cpu is not None
        if not cpu_stream or not has.all():
            self._use_default()
        if not cpu_stream:
            return (np.full(len(X), dp, np.int64), np.full(len(X), dt, np.int64))
        pid = np.where(has, np.maximum(X["pid"], 0), dp)
        tid = np.where(has, X["tid"], dt)
        if has.any():
            for k in unique((pid[has] << 32) | tid[has]).tolist():
                p, t = k >> 32, k & 0xFFFFFFFF
                self._track(p, t, process_name(info, p), f"thread {t}")
        return pid, tid

    def _marker(self, m) -> None:
        args = {"detail": m.detail, "insn": m.idx}
        if m.offset is not None:
            args["offset"] = m.offset
        self._use_default()
        pid, tid = self._default
        k = self._k(np.array([m.time], np.float64))[0]
        self._event(json.dumps({"ph": "i", "s": "t", "name": m.kind,
                                "cat": "trace", "ts": int(k) / 1024,
                                "pid": pid, "tid": tid, "args": args}))
        self.instants += 1

    # -- records one at a time (tests, old callers) ---------------------------------------
    def add(self, rec) -> None:
        if self._legacy is None:
            self._legacy = RecordChunker()
        self._legacy.add(rec)

    def _flush_legacy(self) -> None:
        if self._legacy is not None:
            self.add_slices(self._legacy.take(), self._legacy)

    def close(self, other: dict | None = None) -> None:
        self._flush_legacy()
        units = sorted(self._units)
        data = {"producer": "hwtrace", "clock": units[0] if len(units) == 1 else units}
        if other:
            data.update(other)
        self._fp.write('\n],"displayTimeUnit":"ns","otherData":'
                       + json.dumps(data) + "}\n")


def _byte_layer(fp):
    """The byte buffer under a text file whose encoding writes ASCII as
    itself, or None."""
    buf = getattr(fp, "buffer", None)
    if buf is not None and _ascii_encoding(getattr(fp, "encoding", None)):
        return buf
    return None


def _write_ascii(fp, data) -> None:
    """ASCII bytes to a text file: straight to its byte buffer when the
    file's encoding writes ASCII as itself (no decoding and encoding again
    of megabytes per chunk), else decoded."""
    buf = _byte_layer(fp)
    if buf is not None:
        fp.flush()                  # what the text layer holds goes first
        buf.write(data)
    else:
        fp.write(bytes(data).decode())


def _ascii_encoding(enc) -> bool:
    import codecs
    try:
        return enc is not None and codecs.lookup(enc).name in (
            "utf-8", "ascii", "iso8859-1", "cp1252")
    except LookupError:
        return False

"""The indented function-call history (``hwtrace calls``), like a
debugger's function-call history: one line per activation in the order
they began, indented by call depth, with the activation's instruction
count and duration.

A writer for the views' pipeline (``begin_stream`` / ``add_slices`` /
``close``) fed with the call-stack builder's chunks
(:mod:`hwtrace.analysis.slices`).  Lines stream out: a line is written as
soon as its activation has ended and every line before it is written;
lines formatted a chunk at a time (:mod:`hwtrace.export.textcols`).  So
that the output starts at once (``calls | head``: the first screenful
once 256 K instructions have gone by), an activation that holds back more than ``hold``
lines (``main`` holds back everything) is written early, ``(open)``, and
gets a line of its own where it ends::

      main                                         (open: totals where it ends)
        fib                                             8 insns
      ...
      end of main                               1,234,567 insns
"""

from __future__ import annotations

import numpy as np

from hwtrace._unique import unique
from hwtrace.analysis import _runs_impl
from hwtrace.analysis.records import Activation, Enter, Flag, Marker
from hwtrace.analysis.slices import Cols, RecordChunker, id_positions
from hwtrace.export import track_label
from hwtrace.export.textcols import Lines, small_ids


def fmt_duration(t: float, unit: str | None) -> str:
    if unit == "ns":
        for scale, u in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if t >= scale:
                return f"{t / scale:.2f}{u}"
        return f"{t:.0f}ns"
    if unit == "insns":
        return f"{t:,.0f} insns"
    return f"{t:,.0f} {unit or 'ticks'}"


#: what a line notes about its activation, in this order
_NOTES = ((Flag.BEGIN_UNKNOWN, "began before the trace"), (Flag.TRUNCATED, "truncated"),
          (Flag.TAIL_CALL, "tail call"), (Flag.UNWOUND, "unwound"),
          (Flag.SWITCHED_IN, "goes on after a switch"), (Flag.SWITCHED_OUT, "switched out"),
          (Flag.CLIPPED, "cut at the window's edge"))

_HEAD = 48
#: instructions after which the first lines come out, complete or not
EARLY = 1 << 18
_OPEN = b"(open)"
_EARLY = b"(open: totals where it ends)"


class CallHistory:
    """``out``: a text file to write to as lines are ready (None: keep
    them for :meth:`lines`).  ``early``: the first screenful comes out
    early (no use where the text waits for its turn anyway)."""

    def __init__(self, max_depth: int | None = None, out=None,
                 hold: int = 1 << 14, show_time: bool = True, early: bool = True):
        self.max_depth = max_depth
        self.early = early
        self.show_time = show_time
        self._last_tid = -1
        self.out = out
        self.hold = hold
        self._kept: list[str] = []
        self._info = None
        self._unit = None
        self._q = Cols.zeros()               # enters waiting for their end, in order
        self._done = np.zeros(0, bool)
        self._early: set[int] = set()        # ids written early
        self._marks: list = []               # (seq, Marker) waiting
        self._legacy: RecordChunker | None = None
        self._ctx = None
        self._heads: dict = {}
        self._notes: dict = {}
        self._raw_of = self._raw_buf = None  # out's binary buffer (see _raw)
        self._text_written = False
        self._htab = _StrTable()             # the compiled core's heads,
        self._etab = _StrTable()             # "end of" heads ...
        self._ntab = _StrTable()             # ... and notes, made once
        self._whos: list[str] = []           # "tid T (program)" by id - 1
        self._who_index: dict = {}           # (pid << 32 | tid) -> its id
        self.lines_written = 0
        #: the counts-only formatter: None the selector's choice, "python"
        #: or "compiled" (hwtrace.branches._c_format)
        self.impl: str | None = None

    # -- output ------------------------------------------------------------------
    def _write(self, text) -> None:
        """Text (str), or UTF-8 bytes: those go to a UTF-8 text stream's
        binary buffer as they are (after any text written before them)
        when they hold no surrogate (nor any \\xed lead byte, to be quick
        about it), so every line is not decoded and encoded again."""
        if not text:
            return
        out = self.out
        if isinstance(text, bytes):
            raw = self._raw
            if raw is None or b"\xed" in text:
                text = text.decode("utf-8", "surrogatepass")
            else:
                if self._text_written:
                    out.flush()
                    self._text_written = False
                raw.write(text)
                return
        if out is not None:
            out.write(text)
            self._text_written = True
        else:
            self._kept.extend(text.splitlines())

    @property
    def _raw(self):
        """The binary buffer under ``out`` if bytes may be written there
        as they are (a UTF-8 text stream on a system writing "\\n"), else
        None."""
        if self._raw_of is not self.out:
            import codecs
            import os
            raw = getattr(self.out, "buffer", None)
            enc = getattr(self.out, "encoding", None)
            try:
                utf8 = enc is not None and codecs.lookup(enc).name == "utf-8"
            except LookupError:
                utf8 = False
            self._raw_buf = raw if (raw is not None and utf8 and os.linesep == "\n") \
                else None
            self._raw_of = self.out
        return self._raw_buf

    def begin_stream(self, info, unit=None) -> None:
        self._end_stream()
        self._info = info
        self._last_tid = -1
        self._heads = {}
        self._htab = _StrTable()
        self._etab = _StrTable()
        self._unit = unit
        self._write(f"{section_label(info)}:\n")

    def _end_stream(self) -> None:
        if self._legacy is not None:
            self.add_slices(self._legacy.take(), self._legacy)
        if len(self._q) or self._marks:
            self._emit(final=True)

    def add_slices(self, chunk, ctx) -> None:
        self._ctx = ctx
        E, X = chunk.enters, chunk.exits
        md = self.max_depth
        if md is not None:
            E = E[E["depth"] <= md]
            X = X[X["depth"] <= md]
        if len(E):
            self._q = Cols.concat([self._q, E])
            self._done = np.concatenate((self._done, np.zeros(len(E), bool)))
        if len(X):
            self._ends(X)
        for seq, m in chunk.markers:
            if m.kind != "end":
                self._marks.append((seq, m))
        self._emit()

    def open_ids(self) -> set:
        """The activations whose lines wait for their ends (written early
        or not)."""
        q = self._q
        return set(q["id"][~self._done].tolist()) | self._early

    def drop(self, ids) -> None:
        """Activations not to print after all (their lines not written
        yet: a line written early keeps its ``(open)`` line)."""
        q = self._q
        keep = ~np.isin(q["id"], np.asarray(ids, np.int64))
        if not keep.all():
            self._q, self._done = q[keep], self._done[keep]
        self._early.difference_update(ids)
        self._emit()

    def _ends(self, X: np.ndarray) -> None:
        q = self._q
        jj, here = id_positions(q["id"], X["id"])
        if here.any():
            k = jj[here]
            for f in ("end_idx", "end", "begin", "flags", "child_insns", "xseq"):
                q[f][k] = X[f][here]
            self._done[k] = True
        if self._early and (~here).any():
            late = X[~here]
            mine = np.isin(late["id"], np.fromiter(self._early, np.int64,
                                                   len(self._early)))
            if mine.any():
                for i in late["id"][mine].tolist():
                    self._early.discard(i)
                # their totals go where they end, after the lines before
                L = late[mine]
                for k in np.argsort(L["xseq"], kind="stable").tolist():
                    self._marks.append((int(L["xseq"][k]), L[k:k + 1]))
                self._marks.sort(key=lambda m: m[0])

    def _emit(self, final: bool = False) -> None:
        q, done = self._q, self._done
        n = len(q)
        upto = n if final else (int(np.argmin(done)) if not done.all() else n)
        # a screenful comes out early (once 256 K instructions have
        # gone by with nothing written), then lines wait for their totals
        # unless something long-lived holds back too many
        hold = self.hold
        if self.early and not self.lines_written and n and \
                int(q["begin_idx"][-1]) >= EARLY:
            hold = min(hold, 64)
        if not final and n - upto > hold:
            # write what began long enough ago, the open ones early
            upto = n - hold // 2
        if not upto and not self._marks:
            return
        rows = q[:upto]
        ok = done[:upto]
        self._q, self._done = q[upto:], done[upto:]
        # markers and late totals go out once every line begun before
        # them is out: before the first line still waiting
        marks = []
        if self._marks:
            if final or not len(self._q):
                marks, self._marks = self._marks, []
            else:
                head = int(self._q["eseq"][0])
                k = 0
                while k < len(self._marks) and self._marks[k][0] < head:
                    k += 1
                marks, self._marks = self._marks[:k], self._marks[k:]
        if not upto and not marks:
            return
        if (~ok).any():
            if not final:
                self._early.update(rows["id"][~ok].tolist())
        self._render(rows, ok, marks, final)

    def _render(self, rows, ok, marks, final) -> None:
        if not marks:
            self._write(self._format(rows, ok, final))
            return
        seqs = rows["eseq"]
        cut = np.searchsorted(seqs, [s for s, _m in marks])
        prev = 0
        for c, (_s, m) in zip(cut.tolist(), marks):
            self._write(self._format(rows[prev:c], ok[prev:c], final))
            if isinstance(m, Marker):
                self._write(f"  -- {m.kind} at insn {m.idx:,}: {m.detail}\n")
            else:
                self._write(self._format(m, np.ones(1, bool), False, end_of=True))
            prev = c
        self._write(self._format(rows[prev:], ok[prev:], final))

    def _format(self, rows, ok, final, end_of: bool = False) -> str:
        n = len(rows)
        if not n:
            return ""
        if self._unit == "insns" or not self.show_time:
            return self._format_counts(rows, ok, final, end_of)
        names = self._ctx.names
        t = Lines(n)
        depth = rows["depth"].astype(np.int64)
        t.spaces(2 * (depth + 1))
        if end_of:
            t.lit(b"end of ")
        u = unique(rows["name"])
        table = [b""] * (int(u.max()) + 1)
        for i in u.tolist():
            table[i] = names[i].encode("utf-8", "replace")
        t.strs(table, rows["name"])
        lens = np.array([len(x) for x in table], np.int64)
        hl = 2 * (depth + 1) + lens[rows["name"]] + (7 if end_of else 0)
        t.spaces(_HEAD - hl)
        t.lit(b" ")
        insns = rows["end_idx"] - rows["begin_idx"]
        t.int(insns, 10, commas=True).only(ok).when(ok, b" insns")
        unit = self._unit
        if unit != "insns" and self.show_time:
            t.when(ok, b"  ")
            _durations(t, rows["end"] - rows["begin"], unit, ok)
        t.when(~ok, _OPEN if final else _EARLY)
        self._last_tid = _notes(t, rows, self._info, self._last_tid)
        t.lit(b"\n")
        self.lines_written += n
        return t.text().decode("utf-8", "replace")

    def _format_counts(self, rows, ok, final, end_of: bool) -> str:
        """Lines with instruction counts only, by %-formatting over the
        columns: deep stacks make the indented head hundreds of bytes wide
        in places, which column assembly pays on every line; each
        (depth, function) head is made once."""
        from hwtrace.branches import _impl
        core = _impl.core_for(self.impl)
        if core is not None and len(rows):
            return self._format_counts_compiled(core, rows, ok, final, end_of)
        n = len(rows)
        names = self._ctx.names.names
        heads = self._heads
        depth = rows["depth"].tolist()
        nid = rows["name"].tolist()
        insns = (rows["end_idx"] - rows["begin_idx"]).tolist()
        flags = rows["flags"].tolist()
        tids = rows["tid"].tolist()
        pids = rows["pid"].tolist()
        threads = bool(getattr(self._info, "switches", ()))
        last = self._last_tid
        notes = self._notes
        opened = (_OPEN if final else _EARLY).decode()
        out = []
        add = out.append
        for d, i, c, f, tid, pid, done in zip(depth, nid, insns, flags, tids, pids,
                                              ok.tolist()):
            key = (d, i, end_of)
            h = heads.get(key)
            if h is None:
                text = "  " * (d + 1) + ("end of " if end_of else "") + names[i]
                h = heads[key] = f"{text:<48} "
            note = notes.get(f)
            if note is None:
                note = notes[f] = ", ".join(t for fl, t in _NOTES if f & fl)
            if threads and tid >= 0 and tid != last:
                who = _who(self._info, pid, tid)
                note = f"{note}, {who}" if note else who
            last = tid
            tail = f"{c:>10,} insns" if done else opened
            add(f"{h}{tail}  [{note}]\n" if note else f"{h}{tail}\n")
        self._last_tid = last
        self.lines_written += n
        return "".join(out)

    def _format_counts_compiled(self, core, rows, ok, final, end_of: bool) -> str:
        """_format_counts by the compiled core: each distinct (depth,
        function) head and each distinct flags' note made once (kept, by
        key, in tables the core reads), as above; the lines in C."""
        names = self._ctx.names.names
        notes = self._notes
        pre = "end of " if end_of else ""

        def head(keys: list) -> list:
            # as _format_counts makes them (a head depends on its key only)
            return [("  " * ((k >> 32) + 1) + pre + names[k & 0xFFFFFFFF]).ljust(48)
                    .encode("utf-8", "surrogatepass") + b" " for k in keys]

        whos = self._whos

        def note(keys: list) -> list:
            out = []
            for k in keys:
                f = k & 0xFFFFFFFF
                t = notes.get(f)
                if t is None:
                    t = notes[f] = ", ".join(t for fl, t in _NOTES if f & fl)
                if k >> 32:
                    who = whos[(k >> 32) - 1]
                    t = f"{t}, {who}" if t else who
                out.append(t.encode("utf-8", "surrogatepass"))
            return out

        htab = self._etab if end_of else self._htab
        hinv = htab.index(rows["depth"], rows["name"], head)
        flags = rows["flags"]
        tids = rows["tid"].astype(np.int64)
        show = _shown_threads(tids, self._info, self._last_tid)
        finv = self._ntab.index(self._who_ids(rows, show), flags, note)
        opened = (_OPEN if final else _EARLY)
        text, last = core.calls_counts(
            hinv, *htab.blob(),
            (rows["end_idx"] - rows["begin_idx"]).astype(np.int64),
            np.ascontiguousarray(ok, np.uint8),
            finv, *self._ntab.blob(), tids, False, int(self._last_tid), opened)
        self._last_tid = int(tids[-1])
        self.lines_written += len(rows)
        return text          # UTF-8 bytes (surrogates passed): see _write

    def _who_ids(self, rows, show: np.ndarray) -> np.ndarray:
        """Per row, 1 + the index in ``_whos`` of its thread's words where
        ``show``, else 0 (the high half of its note's key)."""
        ids = np.zeros(len(rows), np.int64)
        if show.any():
            at = np.flatnonzero(show)
            keys = (rows["pid"][at].astype(np.int64) << 32) | \
                (rows["tid"][at].astype(np.int64) & 0xFFFFFFFF)
            index = self._who_index
            for j, k in zip(at.tolist(), keys.tolist()):
                w = index.get(k)
                if w is None:
                    self._whos.append(_who(self._info, k >> 32, k & 0xFFFFFFFF))
                    w = index[k] = len(self._whos)
                ids[j] = w
        return ids

    # -- records one at a time (tests, old callers) ---------------------------------------
    def add(self, rec) -> None:
        if self._legacy is None:
            self._legacy = RecordChunker()
        if type(rec) in (Enter, Activation, Marker):
            self._legacy.add(rec)

    def close(self) -> None:
        self._end_stream()
        if self.out is not None:
            self.out.flush()

    def lines(self):
        """The rendered history, line by line (``out`` None)."""
        self._end_stream()
        kept, self._kept = self._kept, []
        return iter(kept)


class _StrTable:
    """Byte strings made once per int64 key (>= 0), in one growing blob
    with int64 offsets (what the compiled core reads): a chunk's keys are
    looked up in a dense table by (key >> 32, key & 0xFFFFFFFF) -- (depth,
    name id) of a head -- while it stays under ``DENSE_MAX`` entries, else
    among the sorted known ones; only new keys are made."""

    DENSE_MAX = 1 << 22

    def __init__(self):
        self._keys = np.zeros(0, np.int64)      # known keys, sorted
        self._rows = np.zeros(0, np.int64)      # ... their strings' rows
        self._dense = np.zeros((0, 0), np.int32)   # [hi, lo] -> row (-1: none)
        self._blob = bytearray()
        self._offs = np.zeros(256, np.int64)
        self._n = 0

    def index(self, hi: np.ndarray, lo: np.ndarray, make) -> np.ndarray:
        """The row of the string of every key (hi << 32) | lo (integer
        arrays, 0 <= lo < 2**32), made where new (``make(list of keys)``
        -> a list of bytes, keys in ascending order).  The dense table is read by the compiled
        core where it is in use (hwtrace.analysis._c_runs.dense_rows),
        else by numpy."""
        core = _runs_impl.CORE
        if core is None or not len(hi):
            key = (np.asarray(hi, np.int64) << 32) | \
                (np.asarray(lo, np.int64) & 0xFFFFFFFF)
            return self._index(key, make)
        c32 = np.ascontiguousarray
        h32, l32 = c32(hi, np.int32), c32(lo, np.int32)
        out = np.empty(len(hi), np.int64)
        m = core.dense_rows(self._dense, h32, l32, out)
        if m < 0:
            key = (np.asarray(hi, np.int64) << 32) | np.asarray(lo, np.int64)
            if int(hi.max()) >> 31 or int(lo.max()) >> 31 or not self._fits(key):
                return self._sorted_index(key, make)
            m = core.dense_rows(self._dense, h32, l32, out)
        if m:
            key = (np.asarray(hi, np.int64) << 32) | np.asarray(lo, np.int64)
            self._index(key[out < 0], make)
            m = core.dense_rows(self._dense, h32, l32, out)
        if m:
            raise RuntimeError("calls: a head not in the dense table")
        return out

    def _index(self, key: np.ndarray, make) -> np.ndarray:
        if len(key) and self._fits(key):
            d = self._dense
            flat = (key >> 32) * d.shape[1] + (key & 0xFFFFFFFF)
            r = d.ravel().take(flat)
            miss = r < 0
            if miss.any():
                new = unique(key[miss])
                d[new >> 32, new & 0xFFFFFFFF] = np.arange(self._n, self._n + len(new))
                self._add_many(make(new.tolist()))
                r = d.ravel().take(flat)
            return r.astype(np.int64)
        return self._sorted_index(key, make)

    def _fits(self, key: np.ndarray) -> bool:
        """Whether the dense table covers the keys (grown if it may)."""
        if int(key.min()) < 0:
            return False
        h, w = int(key.max() >> 32) + 1, int((key & 0xFFFFFFFF).max()) + 1
        H, W = self._dense.shape
        if h <= H and w <= W:
            return True
        nh, nw = max(H, 1), max(W, 1)
        while nh < h:
            nh *= 2
        while nw < w:
            nw *= 2
        if nh * nw > self.DENSE_MAX:
            return False
        d = np.full((nh, nw), -1, np.int32)
        d[:H, :W] = self._dense
        self._dense = d
        return True

    def _sorted_index(self, key: np.ndarray, make) -> np.ndarray:
        known = self._keys
        if len(known):
            pos = np.minimum(np.searchsorted(known, key), len(known) - 1)
            hit = known[pos] == key
            if hit.all():
                return self._rows[pos]
            new = unique(key[~hit])
        else:
            new = unique(key)
        rows = np.arange(self._n, self._n + len(new), dtype=np.int64)
        self._add_many(make(new.tolist()))
        k = np.concatenate((known, new))
        o = np.argsort(k, kind="stable")
        self._keys = k[o]
        self._rows = np.concatenate((self._rows, rows))[o]
        pos = np.searchsorted(self._keys, key)
        return self._rows[pos]

    def _add_many(self, bs: list) -> None:
        if not bs:
            return
        n = self._n + len(bs)
        if n >= len(self._offs):
            grow = np.zeros(max(2 * len(self._offs), n + 1), np.int64)
            grow[:len(self._offs)] = self._offs
            self._offs = grow
        ends = np.cumsum([len(b) for b in bs], dtype=np.int64)
        self._offs[self._n + 1:n + 1] = ends + len(self._blob)
        self._blob += b"".join(bs)
        self._n = n

    def blob(self) -> tuple:
        """(blob, offsets one longer than the strings)."""
        return self._blob, self._offs[:self._n + 1]


def _durations(t: Lines, d: np.ndarray, unit: str | None, show: np.ndarray) -> None:
    """``fmt_duration`` of every row, right-aligned in 10 (``show``: rows
    that have one)."""
    n = len(d)
    if unit != "ns":
        v = np.round(d).astype(np.int64)
        t.int(v, 0, commas=True).only(show)
        t.when(show, b" " + (unit or "ticks").encode())
        return
    scale = np.select([d >= 1e9, d >= 1e6, d >= 1e3], [1e9, 1e6, 1e3], 1.0)
    suffix = np.select([d >= 1e9, d >= 1e6, d >= 1e3], [0, 1, 2], 3)
    tab = [b"s", b"ms", b"us", b"ns"]
    plain = suffix == 3
    cents = np.round(d / scale * 100).astype(np.int64)
    whole = np.where(plain, np.round(d).astype(np.int64), cents // 100)
    frac = cents % 100
    ln = (np.searchsorted(np.array([10 ** k for k in range(19)]), np.abs(whole),
                          side="right").clip(1)
          + np.where(plain, 0, 3) + np.array([len(x) for x in tab])[suffix])
    t.spaces(np.where(show, 10 - ln, 0))
    t.int(whole).only(show)
    t.when(show & ~plain, b".")
    t.zeros(frac, 2).only(show & ~plain)
    t.strs(tab, suffix).only(show)


def _notes(t: Lines, rows: np.ndarray, info, last_tid: int) -> int:
    """Flags in words; in a CPU's stream following its threads, the
    thread where it changes.  Returns the last line's thread."""
    flags = rows["flags"]
    u, inv = small_ids(flags)
    texts = []
    for f in u.tolist():
        notes = [text for flag, text in _NOTES if f & flag]
        texts.append(", ".join(notes).encode())
    has = np.array([bool(x) for x in texts])[inv]
    tid = rows["tid"].astype(np.int64)
    show_tid = _shown_threads(tid, info, last_tid)
    t.when(has | show_tid, b"  [")
    t.strs(texts, inv)
    t.when(has & show_tid, b", ")
    if show_tid.any():
        at = np.flatnonzero(show_tid)
        words = [_who(info, p, k).encode("utf-8", "replace")
                 for p, k in zip(rows["pid"][at].tolist(), tid[at].tolist())]
        ids = np.zeros(len(tid), np.int64)
        ids[at] = np.arange(1, len(at) + 1)
        t.strs([b""] + words, ids)
    t.when(has | show_tid, b"]")
    return int(tid[-1]) if len(tid) else last_tid


def _shown_threads(tid: np.ndarray, info, last_tid: int) -> np.ndarray:
    """The rows that name their thread: in a CPU's stream following its
    threads, where the thread changes (from ``last_tid``, the row before
    the first's)."""
    if not len(tid) or not getattr(info, "switches", ()):
        return np.zeros(len(tid), bool)
    prev = np.concatenate(([last_tid], tid[:-1]))
    return (tid >= 0) & (tid != prev)


def section_label(info) -> str:
    """A stream's (or a thread's) heading: a thread and its program,
    ``thread T (program)``, as in a CPU's stream's notes; else its CPU or
    name."""
    tid = getattr(info, "tid", None)
    if tid is None:
        return track_label(info)
    program = getattr(info, "program", None)
    pid = getattr(info, "pid", None)
    name = program(pid) if program is not None and pid is not None else ""
    return f"thread {tid} ({name})" if name else f"thread {tid}"


def _who(info, pid: int, tid: int) -> str:
    """A thread in words: ``tid T (program)``, the program its process ran
    where the recording says."""
    program = getattr(info, "program", None)
    name = program(pid) if program is not None and pid >= 0 else ""
    return f"tid {tid} ({name})" if name else f"tid {tid}"

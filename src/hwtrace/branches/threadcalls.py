"""``hwtrace calls`` arranged by thread: one section per thread, in the
order the threads first appear, each thread's activations whole across
its switches and its moves from CPU to CPU -- what a ``--mode thread``
recording of the same run prints.

A writer for the views' pipeline.  Fed one stream at a time (a thread's
stream, or a CPU's that cannot be followed across CPUs) it is a
:class:`~.calls.CallHistory`.  Fed a recording's CPU streams in time
order (:mod:`hwtrace.export.interleave` calls :meth:`threads_followed`),
every builder's chunks as they come, it takes the builders' slices of
one activation -- ``SWITCHED_OUT`` where its thread left a CPU,
``SWITCHED_IN`` where it went on (the registry's ``links`` say which
goes on which, its ``ends`` which go on nowhere) -- as one line, with
the instructions of all of them, and hands each thread's rows to its own
:class:`~.calls.CallHistory`.  The first thread's section is written as
it goes; the others' wait in ``hold()`` sinks (memory, then a file: the
caller's, see ``hwtrace.cli._spool``) and follow it, in order: each when
the one before it is done -- its thread ran for the last time
(:meth:`ThreadCalls.threads_gone`), or the run ended.  An ``[untraced]``
frame that only stood for its thread's move to another CPU (no time
passed for it: its own stream has no pause there) is no line; a line whose thread was switched out for good ends ``TRUNCATED``,
as its own stream would end it.  No I/O here beyond writing to ``out``
and the sinks.
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis.records import Flag, StreamInfo
from hwtrace.analysis.slices import UNKNOWN_FUNC, Cols, NameTable, Slices
from hwtrace.branches.calls import CallHistory

_ASYNC = int(Flag.ASYNC)
_IN = int(Flag.SWITCHED_IN)
_OUT = int(Flag.SWITCHED_OUT)
_SWITCHED = _IN | _OUT


class _Kept:
    """The default ``hold``: text kept in memory."""

    encoding = "utf-8"

    def __init__(self):
        self._parts: list = []
        self.buffer = self

    def write(self, text) -> None:
        self._parts.append(text)

    def flush(self) -> None:
        pass

    def __iter__(self):
        return iter(self._parts)

    def close(self) -> None:
        self._parts = []


class _Ctx:
    """What a section's CallHistory reads of a chunk's builder: the names
    (one table for every builder's)."""

    def __init__(self, names: NameTable):
        self.names = names


class _Section:
    """A thread's section: its history, the sink it waits in (None: it
    is written out as it goes), whether its thread has ended."""

    __slots__ = ("h", "sink", "ended")

    def __init__(self, h: CallHistory, sink):
        self.h = h
        self.sink = sink
        self.ended = False


class _Line:
    """An activation in slices: where it began (its first slice's row),
    its instructions so far, the slices begun and ended, how it ends."""

    __slots__ = ("root", "insns", "begun", "ended", "last", "final", "dropped",
                 "child", "ids")

    def __init__(self):
        self.root = None            # the first slice's exit row (a Cols row)
        self.insns = 0
        self.child = 0
        self.begun = 1              # the first slice
        self.ended = 0
        self.last = None            # the latest slice's exit row
        self.final = None           # the row of the slice that really ended it
        self.dropped = False        # nothing goes on from its last slice
        self.ids: list = []         # its later slices' ids


class ThreadCalls:
    """``hold()``: a sink (``write(str | bytes)``, iteration, ``close()``)
    where a later thread's section waits for its turn."""

    def __init__(self, max_depth: int | None = None, out=None, hold=None,
                 show_time: bool = True):
        self.max_depth = max_depth
        self.out = out
        self.hold = hold or _Kept
        self._show_time = show_time
        self._one = CallHistory(max_depth, out=out, show_time=show_time)
        self._by_thread = False
        self._cur: dict = {}                # key -> its thread's _Section
        self._order: list = []              # the _Sections, first seen first
        self._live = 0                      # ... the one written as it goes
        self._names = NameTable()
        self._ctx = _Ctx(self._names)
        self._maps: dict = {}               # id(builder) -> local -> global name ids
        self._alias: dict = {}              # a going-on slice's id -> its line's
        self._lines: dict = {}              # line id -> _Line (switched lines)
        self._last_key: dict = {}           # id(builder) -> the key it fed last
        self._unit = None
        self._tables = None                 # the sections' shared head tables
        self._cut: set = set()              # lines cut short where their thread ended
        self._moves = False                 # tid -> its switches in (see _learn_moves)

    @property
    def show_time(self) -> bool:
        return self._show_time

    @show_time.setter
    def show_time(self, v: bool) -> None:
        self._show_time = v
        self._one.show_time = v
        for sec in self._order:
            sec.h.show_time = v

    @property
    def lines_written(self) -> int:
        return self._one.lines_written + sum(sec.h.lines_written
                                             for sec in self._order)

    # -- the pipeline's writer protocol ----------------------------------------------
    def threads_followed(self) -> None:
        """The streams come as one, in time order: sections by thread."""
        self._by_thread = True

    def begin_stream(self, info, unit=None) -> None:
        if not self._by_thread:
            self._one.begin_stream(info, unit)
        elif self._unit is None:
            self._unit = unit

    def add_slices(self, chunk, ctx) -> None:
        if not self._by_thread:
            self._one.add_slices(chunk, ctx)
            return
        if self._moves is False:
            self._learn_moves(ctx)
        reg = ctx._threads
        E = self._named(chunk.enters, ctx)
        X = self._named(chunk.exits, ctx)
        done: list = []
        if len(E):
            sw = (E["flags"] & _IN) != 0
            if sw.any():
                at = np.flatnonzero(sw)
                sw[at[~self._going_on(E, at, reg.links)]] = False
                E = E[~sw]
        if reg.ends:
            for i in reg.ends:
                line = self._line(self._alias.get(i, i))
                line.dropped = True
                if self._complete(line):
                    done.append(line)
            reg.ends.clear()
        if len(X):
            sw = (X["flags"] & _SWITCHED) != 0
            if sw.any():
                done += self._slices_end(X[sw])
                X = X[~sw]
        if done:
            W, pauses = self._pauses(self._whole(done))
            X = Cols.concat([X, W])
            if pauses is not None:
                # (before the rows come: more than ``hold`` lines behind
                # one waiting would write it early, ``(open)``, for good;
                # one begun in this chunk never comes)
                if len(E):
                    E = E[~np.isin(E["id"], pauses["id"])]
                self._drop(pauses)
        self._route(E, X, chunk.markers, ctx)

    def close(self) -> None:
        if not self._by_thread:
            self._one.close()
            return
        # the lines whose thread was switched out for good: cut short
        # where the trace ended for it
        rest = [ln for ln in self._lines.values() if ln.root is not None]
        self._lines = {}
        if rest:
            X, pauses = self._pauses(self._whole(rest, end=True))
            if pauses is not None:
                self._drop(pauses)
            self._route(Cols.zeros(), X, [], None)
        for sec in self._order:
            if not sec.ended:
                sec.ended = True
                sec.h.close()
        self._cur = {}
        self._advance()
        if self.out is not None:
            self.out.flush()

    def threads_gone(self, tids) -> None:
        """These threads ran for the last time (their last switch out, or
        their exit, is behind, and their rows delivered): their lines
        still open are cut short there, their sections complete -- the
        live one hands over to the next."""
        gone = set(tids)
        lines: dict = {}
        for i, ln in self._lines.items():
            if ln.root is not None:
                lines.setdefault(int(ln.root["tid"][0]), {})[i] = ln
        for t in list(gone):
            # (not if it runs yet: a slice of a line goes on, or a line
            # never switched out waits for its end -- the sideband was
            # wrong; its section goes on)
            sec = self._cur.get(t)
            mine = lines.get(t, {})
            if any(ln.ended < ln.begun for ln in mine.values()) or (
                    sec is not None and not sec.h.open_ids() <= set(mine)):
                gone.discard(t)
        mine = [ln for t in gone for ln in lines.get(t, {}).values()]
        for ln in mine:
            self._forget(ln)
            self._cut.add(int(ln.root["id"][0]))
            self._cut.update(ln.ids)
        if mine:
            X, pauses = self._pauses(self._whole(mine, end=True))
            if pauses is not None:
                self._drop(pauses)
            self._route(Cols.zeros(), X, [], None)
        for t in gone:
            sec = self._cur.pop(t, None)
            if sec is not None:
                sec.ended = True
                sec.h.close()
        self._advance()

    def _advance(self) -> None:
        """The live section ended: the next one's turn (what it holds
        written now, the rest as it goes)."""
        order, out = self._order, self.out
        while self._live < len(order) and order[self._live].ended:
            self._live += 1
            if self._live < len(order):
                sec = order[self._live]
                if sec.sink is not None:
                    if out is not None:
                        out.flush()
                    for part in sec.sink:
                        _put(out, part)
                    sec.sink.close()
                    sec.sink = None
                    sec.h.out = out

    # -- slices of one activation ----------------------------------------------------
    def _named(self, rows: Cols, ctx) -> Cols:
        """Rows with their names in the one table of every builder's."""
        if not len(rows):
            return rows
        m = self._maps.get(id(ctx))
        names = ctx.names
        if m is None or len(m) < len(names):
            have = 0 if m is None else len(m)
            add = np.array([self._names.id(n) for n in names.names[have:]], np.int32)
            m = add if m is None else np.concatenate((m, add))
            self._maps[id(ctx)] = m
        d = dict(rows.d)
        d["name"] = m[rows["name"]]
        return Cols(d, rows.n)

    def _line(self, i: int) -> _Line:
        line = self._lines.get(i)
        if line is None:
            line = self._lines[i] = _Line()
        return line

    def _going_on(self, E: Cols, at: np.ndarray, links: dict) -> np.ndarray:
        """Slices that go on from others: the same lines.  Returns which
        do (one whose link is unknown is a line of its own)."""
        alias = self._alias
        ok = np.ones(len(at), bool)
        for k, i in enumerate(E["id"][at].tolist()):
            prev = links.pop(i, None)
            if prev is None:
                ok[k] = False
                continue
            root = alias.get(prev, prev)
            if root in self._cut:
                # (its thread went on after all: a line of its own, in
                # the thread's new section)
                ok[k] = False
                continue
            alias[i] = root
            line = self._line(root)
            line.begun += 1
            line.ids.append(i)
        return ok

    def _slices_end(self, X: Cols) -> list:
        """Slices of switched lines end: their instructions counted; the
        lines whose every slice has ended and that ended for real."""
        alias = self._alias
        out = []
        ids = X["id"].tolist()
        flags = X["flags"].tolist()
        n = (X["end_idx"] - X["begin_idx"]).tolist()
        child = X["child_insns"].tolist()
        for k, (i, f) in enumerate(zip(ids, flags)):
            root = alias.get(i, i)
            line = self._line(root)
            row = X[k:k + 1]
            if root == i:
                line.root = row
            line.ended += 1
            line.insns += n[k]
            line.child += child[k]
            if f & _OUT:
                if line.last is None or int(row["xseq"][0]) > int(line.last["xseq"][0]):
                    line.last = row
            else:
                line.final = row
            if self._complete(line):
                out.append(line)
        return out

    def _complete(self, line: _Line) -> bool:
        if line.ended < line.begun or line.root is None:
            return False
        if line.final is None and not line.dropped:
            return False
        self._forget(line)
        return True

    def _forget(self, line: _Line) -> None:
        del self._lines[int(line.root["id"][0])]
        alias = self._alias
        for i in line.ids:
            alias.pop(i, None)

    def _whole(self, lines: list, end: bool = False) -> Cols:
        """Each line's row as one activation: from its first slice's
        begin, with every slice's instructions, ending where its last did
        (``end``: the trace ended with its thread switched out: cut short
        there, as a thread's own stream would be)."""
        rows = []
        for ln in lines:
            r = ln.root.copy()
            last = ln.final if ln.final is not None else ln.last
            if last is None:
                last = ln.root
            r["end_idx"] = r["begin_idx"] + ln.insns
            r["end"] = last["end"]
            r["xseq"] = last["xseq"]
            r["child_insns"] = ln.child
            f = int(ln.root["flags"][0]) | int(last["flags"][0])
            f &= ~_SWITCHED
            if ln.final is None:
                f |= int(Flag.TRUNCATED) if end and not ln.dropped else _OUT
            r["flags"] = f
            rows.append(r)
        X = Cols.concat(rows)
        return X[np.argsort(X["xseq"], kind="stable")] if len(X) > 1 else X

    def _pauses(self, W: Cols) -> tuple:
        """Whole lines that only stand for a move of their thread from CPU
        to CPU -- an ``[untraced]`` frame where it was interrupted, no
        instruction in it, and it went on elsewhere at the very time it
        left (the sideband's switches: nothing else ran for it
        meanwhile) -- are no calls (its own stream has none): (the other
        lines, those (None: none)).  One where time passed for it (it was
        preempted: another thread ran) stays, ``[untraced]``, as its own
        stream shows it."""
        pause = ((W["flags"] & _ASYNC) != 0) & (W["func"] == UNKNOWN_FUNC) & \
            (W["end_idx"] == W["begin_idx"])
        if not pause.any():
            return W, None
        at = np.flatnonzero(pause)
        pause[at[~self._moved(W["tid"][at], W["end"][at])]] = False
        if not pause.any():
            return W, None
        return W[~pause], W[pause]

    def _moved(self, tids: np.ndarray, when: np.ndarray) -> np.ndarray:
        """Whether each thread, going on at about time ``when``, went on
        at the time it was switched out (the switch in nearest ``when``
        is at the time of its last switch out: a move), by the
        recording's switches (none known: every one a move)."""
        moves = self._moves
        if moves is None:
            return np.ones(len(tids), bool)
        out = np.ones(len(tids), bool)
        for k, (t, w) in enumerate(zip(tids.tolist(), when.tolist())):
            m = moves.get(t)
            if m is None:
                continue
            ins, gaps = m
            j = int(np.searchsorted(ins, w))
            near = [i for i in (j - 1, j) if 0 <= i < len(ins)]
            if near:
                i = min(near, key=lambda i: abs(ins[i] - w))
                out[k] = gaps[i] == 0
        return out

    def _learn_moves(self, ctx) -> None:
        """Each thread's switches in, by time, and the time since its
        switch out before each (0: a move from CPU to CPU)."""
        self._moves = None
        switches = getattr(getattr(ctx, "stream", None), "switches", ())
        if not switches:
            return
        last_out: dict = {}
        per: dict = {}
        for s in sorted(switches, key=lambda s: s.time):
            if s.prev_tid is not None and s.prev_tid > 0:
                last_out[s.prev_tid] = s.time
            t = s.next_tid
            if t is not None and t > 0 and t in last_out:
                per.setdefault(t, []).append((s.time, s.time - last_out[t]))
        self._moves = {t: (np.array([a for a, _g in v], np.float64),
                           np.array([g for _a, g in v], np.float64))
                       for t, v in per.items()}

    def _drop(self, P: Cols) -> None:
        for t in np.unique(P["tid"]).tolist():
            sec = self._cur.get(t if t >= 0 else -1)
            if sec is not None:
                sec.h.drop(P["id"][P["tid"] == t].tolist())

    # -- sections --------------------------------------------------------------------
    def _section(self, key: int, pid: int, ctx) -> CallHistory:
        sec = self._cur.get(key)
        if sec is not None:
            return sec.h
        live = self._live == len(self._order)       # (every one before ended)
        sink = None if live else self.hold()
        h = CallHistory(self.max_depth, out=self.out if live else sink,
                        show_time=self._show_time, early=live)
        stream = getattr(ctx, "stream", None)
        programs = getattr(stream, "programs", ())
        if key >= 0:
            info = StreamInfo(pid=pid if pid >= 0 else None, tid=key,
                              programs=programs)
        else:
            info = StreamInfo(name="thread unknown")
        h.begin_stream(info, self._unit)
        # every section's lines are made of the same names (one table):
        # the heads and notes made once for all of them
        if self._tables is None:
            self._tables = (h._heads, h._htab, h._etab, h._ntab, h._notes)
        else:
            h._heads, h._htab, h._etab, h._ntab, h._notes = self._tables
        sec = self._cur[key] = _Section(h, sink)
        self._order.append(sec)
        return h

    def _route(self, E: Cols, X: Cols, markers: list, ctx) -> None:
        """Each thread's rows (and markers) to its section."""
        parts: dict = {}
        for rows, side in ((E, 0), (X, 1)):
            if not len(rows):
                continue
            tids = rows["tid"]
            t0 = int(tids[0])
            if (tids == t0).all():
                parts.setdefault(t0, [None, None, [], int(rows["pid"][0])])[side] = rows
                continue
            for t in np.unique(tids).tolist():
                sel = rows[tids == t]
                parts.setdefault(t, [None, None, [], int(sel["pid"][0])])[side] = sel
        bkey = id(ctx)
        for seq, m in markers:
            if m.kind == "end":
                continue
            if m.tid is not None and m.tid >= 0:
                t = m.tid
            else:
                t = self._last_key.get(bkey, -1)
            parts.setdefault(t, [None, None, [], -1])[2].append((seq, m))
        if not parts:
            return
        # sections open in the order their threads' first rows began
        order = sorted(parts, key=lambda t: _first_seq(parts[t]))
        for t in order:
            e, x, ms, pid = parts[t]
            h = self._section(t if t >= 0 else -1, pid,
                              ctx if ctx is not None else self._ctx)
            h.add_slices(Slices(e if e is not None else Cols.zeros(),
                                x if x is not None else Cols.zeros(), ms), self._ctx)
        if ctx is not None:
            self._last_key[bkey] = order[-1]


def _first_seq(part) -> int:
    e, x, ms, _pid = part
    seqs = []
    if e is not None:
        seqs.append(int(e["eseq"][0]))
    if x is not None:
        seqs.append(int(x["xseq"].min()))
    if ms:
        seqs.append(ms[0][0])
    return min(seqs)


def _put(out, part) -> None:
    """A held section's text (str, or UTF-8 bytes) to ``out``."""
    if isinstance(part, bytes):
        raw = getattr(out, "buffer", None)
        if raw is None:
            out.write(part.decode("utf-8", "surrogatepass"))
        else:
            out.flush()
            raw.write(part)
    else:
        out.write(part)

"""Where two step streams part, and where they meet again (no I/O).

:func:`compare` walks two threads' steps (:mod:`.steps`, B's addresses
already in A's terms) side by side:

* **in step**: the longest common run is found a chunk at a time with one
  vectorized comparison (address of the first and last instruction,
  instruction count, gap), so identical stretches cost a few numpy
  operations per 64 Ki steps;
* **a divergence**: the first step that differs.  The step before it is
  the last one both ran; it ended in the branch that decided (a
  conditional that went two ways, an indirect branch or return with two
  targets) -- or the difference is in the step itself (one run's trace
  ends or loses data there);
* **meeting again**: the runs are back in step where both are at the same
  code at the same call depth in a frame that was open when they parted
  (the divergent function itself -- back in the same function at the
  same depth -- or a caller both returned to).  Both sides are scanned
  in lockstep from the divergence; each step that runs in such a frame
  (its depth is the lowest the side has been at since) is hashed with its
  depth, and the first pair of equal steps, lowest ``max`` of the two
  distances, is where the runs meet.  Steps inside calls made after the
  divergence never match: they run in frames the other side never had.
  A side that ends keeps the steps it had; the other side is scanned on
  alone.  Up to ``window`` steps per side are held; past that the rest
  is reported as one region.
* **after lost data** (one side's step follows a gap) its depth is
  unknown, so the runs meet where the other side runs the step the
  damaged trace resumes with -- of all the places it does, the one from
  which the two stay in step longest -- and the damaged side's depths are
  re-based there.  Two traces that **begin at different places** (one
  kept only the newest part of its run) meet likewise, at the
  instruction index the recordings' counts give when they do.  A trace
  resumes (or begins) at a PSB+, which hardware -- and the recorder --
  writes at the first instruction boundary past its byte threshold, in
  the middle of a basic block as often as not: the step it resumes with
  is then the *tail* of a step the other run ran whole, so it is looked
  up as a suffix too, and that step is split where the damaged trace
  picks up (what came before is the other run's share of the region).

Results are :class:`Divergence` records with both sides'
:class:`Point` s (own addresses, for symbols) and, once known, the
:class:`Region` until the runs meet again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .stack import ShadowStack
from .steps import KEY_WORDS, OTHER, STEP, concat

#: steps per side held while looking for the meeting point
WINDOW = 1 << 20
_ROUND = 1 << 12

_P = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F),
      np.uint64(0x165667B19E3779F9), np.uint64(0xD6E8FEB86659FD93))


@dataclass
class Point:
    """One side where the runs part (or meet)."""

    idx: int                    # instruction index (of the thread) of the step
    off: int | None             # its trace offset
    ip: int | None              # its first instruction (None: the trace ended)
    end: int | None
    n: int = 0
    gap: bool = False
    depth: int = 0
    stack: list = field(default_factory=list)   # call sites, outermost first
    before: list = field(default_factory=list)  # ... as they were at the
                                                # last instruction of ``prev``
    prev: tuple | None = None   # the step before: (ip, end, n, cls, size, off)
    tip: int | None = None      # ip and end as compared (in A's terms)
    tend: int | None = None
    stop: tuple | None = None   # the trace ends (after this step): how its
                                # last stretch stopped


@dataclass
class Region:
    """What each side did from the divergence until the runs meet."""

    a_insns: int = 0
    b_insns: int = 0
    a_calls: int = 0
    b_calls: int = 0
    a_callees: dict = field(default_factory=dict)   # entry address -> calls
    b_callees: dict = field(default_factory=dict)
    meet: tuple | None = None   # (Point A, Point B) where they are in step again
    depth: int | None = None    # depth at the meeting
    how: str | None = None      # "same function, same depth", "returned to
                                # a common frame", "after lost data"
    why: str | None = None      # no meeting: "a-ended", "b-ended", "ended", "window"


@dataclass
class Divergence:
    number: int                 # 1 for the first
    a: Point
    b: Point
    region: Region | None = None


class _Side:
    """One run's steps read ahead of the comparison: a queue of chunks as
    the reader made them (views into them cost nothing; a range across
    chunks is copied, which only the search for a meeting point needs)."""

    def __init__(self, reader):
        self.reader = reader
        self.chunks: deque = deque()
        self.pos = 0                # into chunks[0]
        self.avail = 0
        self.stack = ShadowStack()
        self.before: list = []      # the stack before the last consumed step
        self.prev = None            # the last consumed step (a STEP record)
        self.insns = 0              # instructions consumed

    @property
    def ended(self) -> bool:
        return self.reader.done and self.avail == 0

    def more(self) -> bool:
        """Read one more chunk; False at the end."""
        try:
            chunk = next(self.reader)
        except StopIteration:
            return False
        self.chunks.append(chunk)
        self.avail += len(chunk)
        return True

    def fill(self, k: int) -> None:
        """At least ``k`` steps ahead, unless the stream ends first."""
        while self.avail < k and self.more():
            pass

    def head(self) -> np.ndarray:
        """The unconsumed part of the first chunk (no copy)."""
        while self.chunks and self.pos >= len(self.chunks[0]):
            self.chunks.popleft()
            self.pos = 0
        return self.chunks[0][self.pos:] if self.chunks else _EMPTY

    def view(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        stop = self.avail if stop is None else min(stop, self.avail)
        if stop <= start:
            return _EMPTY
        h = self.head()
        if stop <= len(h):
            return h[start:stop]
        parts, at = [], 0
        for c in self.chunks:
            c = c[self.pos:] if c is self.chunks[0] else c
            lo, hi = max(start - at, 0), min(stop - at, len(c))
            if lo < hi:
                parts.append(c[lo:hi])
            at += len(c)
            if at >= stop:
                break
        return concat(parts)

    def consume(self, k: int) -> None:
        if k <= 0:
            return
        last = None
        left = k
        while left:
            h = self.head()
            take = min(left, len(h))
            part = h[:take]
            if take == left:
                self.stack.advance(part[:-1])
                self.before = self.stack.snapshot()
                self.stack.advance(part[-1:])
            else:
                self.stack.advance(part)
            last = part[-1]
            self.pos += take
            self.avail -= take
            left -= take
        self.prev = last.copy()
        self.insns = int(last["idx"]) + int(last["n"])

    def split(self, t: int, k: int, ip: int) -> None:
        """Cut the unconsumed step ``t`` after its first ``k``
        instructions (``0 < k < n``) into two steps, the second beginning
        at ``ip`` (in the compared terms): where a trace that resumed (or
        began) inside a step the other ran whole picks up.  The second
        keeps the step's end and last instruction (its call or return);
        the first is plain straight-line code whose last instruction's
        address is not known here (no code is read): its ``end`` is where
        the second begins, with ``size`` 0."""
        at = 0
        for i, c in enumerate(self.chunks):
            base = self.pos if i == 0 else 0
            if t < at + len(c) - base:
                j = base + t - at
                break
            at += len(c) - base
        else:
            raise IndexError(t)
        head = c[j:j + 1].copy()
        tail = c[j:j + 1].copy()
        shift = ip - int(head["ip"][0])         # raw addresses move alike
        tail["ip"] = ip
        tail["rip"] = int(head["rip"][0]) + shift
        tail["n"] = int(head["n"][0]) - k
        tail["idx"] = int(head["idx"][0]) + k
        tail["gap"] = 0
        head["n"] = k
        head["end"], head["rend"] = tail["ip"], tail["rip"]
        head["cls"], head["size"], head["delta"] = OTHER, 0, 0
        self.chunks[i] = concat([c[:j], head, tail, c[j + 1:]])
        self.avail += 1

    def rebase(self, shift: int, sites: list) -> None:
        """After lost data: this side's depths move by ``shift``, its next
        step no longer counts as after a gap (the meeting accounted for
        it), and its open frames are taken to be ``sites``."""
        for i, c in enumerate(self.chunks):
            part = c[self.pos:] if i == 0 else c
            part["depth"] += shift
        self.reader.depth += shift
        self.head()[0:1]["gap"] = 0
        self.stack.sites = list(sites)

    def point(self) -> Point:
        """Where this side stands: its next step (or its end)."""
        prev = None
        if self.prev is not None:
            p = self.prev
            prev = (int(p["rip"]), int(p["rend"]), int(p["n"]), int(p["cls"]),
                    int(p["size"]), int(p["off"]))
        if self.avail:
            s = self.head()[0]
            return Point(int(s["idx"]), int(s["off"]), int(s["rip"]),
                         int(s["rend"]), int(s["n"]), bool(s["gap"]),
                         int(s["depth"]), self.stack.snapshot(), self.before,
                         prev, int(s["ip"]), int(s["end"]),
                         self.reader.last_stop if self.reader.done and
                         self.avail == 1 else None)
        depth = int(self.prev["depth"]) + int(self.prev["delta"]) \
            if self.prev is not None else 0
        return Point(self.insns, None, None, None, 0, False, depth,
                     self.stack.snapshot(), self.before, prev,
                     stop=self.reader.last_stop if self.reader.done else None)

    def drain(self) -> tuple[int, int]:
        """Read to the end without comparing: (instructions, calls)."""
        insns = calls = 0
        for c in list(self.chunks):
            c = c[self.pos:] if c is self.chunks[0] else c
            insns += int(c["n"].sum())
            calls += int(np.count_nonzero(c["delta"] > 0))
        self.chunks.clear()
        self.pos = self.avail = 0
        for chunk in self.reader:
            insns += int(chunk["n"].sum())
            calls += int(np.count_nonzero(chunk["delta"] > 0))
        return insns, calls


_EMPTY = np.zeros(0, STEP)


def _words(steps: np.ndarray) -> np.ndarray:
    """The compared part of each step as KEY_WORDS 64-bit words."""
    return steps.view(np.uint64).reshape(len(steps), -1)[:, :KEY_WORDS]


def _differ(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first step that differs (len if none)."""
    wa, wb = _words(a), _words(b)
    neq = wa[:, 0] != wb[:, 0]
    for k in range(1, KEY_WORDS):
        neq |= wa[:, k] != wb[:, k]
    hit = np.flatnonzero(neq)
    return int(hit[0]) if len(hit) else len(a)


def _keys(steps: np.ndarray, loose: bool = False) -> np.ndarray:
    """Hash of each step and its depth (``loose``: of its first address
    and depth only)."""
    with np.errstate(over="ignore"):
        k = steps["ip"] * _P[0] + \
            steps["depth"].astype(np.int64).view(np.uint64) * _P[3]
        if not loose:
            k = k + steps["end"] * _P[1] + steps["n"].astype(np.uint64) * _P[2]
        return k


class _KeySet:
    """Sorted keys with the first position each was seen at."""

    def __init__(self):
        self.keys = np.zeros(0, np.uint64)
        self.pos = np.zeros(0, np.int64)

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices into keys, first positions here) of the keys seen."""
        if not len(self.keys) or not len(keys):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        k = np.searchsorted(self.keys, keys)
        k = np.minimum(k, len(self.keys) - 1)
        hit = self.keys[k] == keys
        return np.flatnonzero(hit), self.pos[k[hit]]

    def add(self, keys: np.ndarray, pos: np.ndarray) -> None:
        if not len(keys):
            return
        allk = np.concatenate([self.keys, keys])
        allp = np.concatenate([self.pos, pos])
        order = np.argsort(allp, kind="stable")
        allk, allp = allk[order], allp[order]
        self.keys, first = np.unique(allk, return_index=True)
        self.pos = allp[first]


class _Seen:
    """One side's steps scanned since the divergence: those that run in a
    frame open at the divergence, by full key and by loose key."""

    def __init__(self, depth: int):
        self.full = _KeySet()
        self.loose = _KeySet()
        self.low = depth                        # lowest depth so far
        self.scanned = 0
        self.last = None        # (loose key, position) of the last step scanned

    def scan(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Full keys and positions of the eligible steps among ``steps``
        (the next ones after those scanned); remembers them."""
        d = steps["depth"].astype(np.int64)
        low = np.minimum.accumulate(np.minimum(d, self.low))
        self.low = int(low[-1]) if len(low) else self.low
        ok = d == low
        pos = np.flatnonzero(ok) + self.scanned
        self.scanned += len(steps)
        el = steps[ok]
        full, loose = _keys(el), _keys(el, loose=True)
        if len(steps):
            self.last = (loose[-1], pos[-1]) if ok[-1] else None
        return full, loose, pos


def compare(reader_a, reader_b, *, max_divergences: int | None = None,
            window: int = WINDOW, status: dict | None = None,
            same_space: bool = True, begins: tuple = (None, None)
            ) -> Iterator[Divergence]:
    """Yield the divergences of two step streams in order (see the module
    doc); a divergence is yielded once its region is known.  After
    ``max_divergences`` the rest is read without comparing (coverage
    taps still see it; ``status["more"]`` is then set).  The readers'
    ``insns`` hold the totals after.  ``same_space``: the runs' raw
    addresses are alike (no relocation), so after lost data one side's
    call stack can stand in for the other's.  ``begins``: where in its run
    each trace begins (instruction index; None unknown), for traces that
    kept only the newest part of a run."""
    a, b = _Side(reader_a), _Side(reader_b)
    number = 0
    while True:
        # -- in step --------------------------------------------------------
        while True:
            a.fill(1)
            b.fill(1)
            ha, hb = a.head(), b.head()
            m = min(len(ha), len(hb))
            if m == 0:
                break
            j = _differ(ha[:m], hb[:m])
            a.consume(j)
            b.consume(j)
            if j < m:
                break
        if a.ended and b.ended:
            return
        number += 1
        if max_divergences is not None and number > max_divergences:
            if status is not None:
                status["more"] = True
            a.drain()
            b.drain()
            return
        div = Divergence(number, a.point(), b.point())
        div.region = _meet(a, b, window, same_space, begins)
        yield div
        if div.region.meet is None:
            return


def _meet(a: _Side, b: _Side, window: int, same_space: bool = True,
          begins: tuple = (None, None)) -> Region:
    """Find where the runs are in step again; consume both up to there.

    A side whose trace has ended may also meet the other at its very
    last step when that starts at the same code and depth, however short
    it was cut (a fault inside it): the next divergence then shows it."""
    ga = bool(a.avail and a.head()[0]["gap"])
    gb = bool(b.avail and b.head()[0]["gap"])
    if ga != gb:
        return _after_gap(a, b, window, same_space) if ga else \
            _flip(_after_gap(b, a, window, same_space))
    if a.prev is None and b.prev is None and a.avail and b.avail:
        reg = _late_start(a, b, window, same_space, begins)
        if reg is not None:
            return reg
    depth = int(a.view(0, 1)["depth"][0]) if a.avail else \
        int(b.view(0, 1)["depth"][0])
    sa, sb = _Seen(depth), _Seen(depth)
    r = _ROUND
    best = None
    while best is None:
        a.fill(sa.scanned + r)
        b.fill(sb.scanned + r)
        na = a.view(sa.scanned, sa.scanned + r)
        nb = b.view(sb.scanned, sb.scanned + r)
        if not len(na) and not len(nb):
            break
        ka, la, pa = sa.scan(na)
        kb, lb, pb = sb.scan(nb)
        cands = []
        i, q = sb.full.find(ka)             # A's new steps B had before
        cands.extend(zip(pa[i].tolist(), q.tolist()))
        i, q = sa.full.find(kb)             # B's new steps A had before
        cands.extend(zip(q.tolist(), pb[i].tolist()))
        if len(ka) and len(kb):             # new on both sides
            _k, ia, ib = np.intersect1d(ka, kb, return_indices=True)
            cands.extend(zip(pa[ia].tolist(), pb[ib].tolist()))
        sa.full.add(ka, pa)
        sb.full.add(kb, pb)
        sa.loose.add(la, pa)
        sb.loose.add(lb, pb)
        for side, mine, other, flip in ((a, sa, sb, False), (b, sb, sa, True)):
            if side.ended or side.reader.done and mine.scanned >= side.avail:
                if mine.last is not None:
                    _i, q = other.loose.find(np.array([mine.last[0]], np.uint64))
                    for t in q.tolist():
                        c = (t, int(mine.last[1])) if flip else \
                            (int(mine.last[1]), t)
                        cands.append(c)
        cands.sort(key=lambda c: (max(c), c[0] + c[1]))
        for ta, tb in cands:
            if ta == 0 and tb == 0:
                continue
            x, y = a.view(ta, ta + 1)[0], b.view(tb, tb + 1)[0]
            if x["ip"] != y["ip"] or x["depth"] != y["depth"]:
                continue                    # a hash collision
            last_a = a.reader.done and ta == a.avail - 1
            last_b = b.reader.done and tb == b.avail - 1
            if (x["end"] == y["end"] and x["n"] == y["n"] and
                    x["gap"] == y["gap"]) or last_a or last_b:
                best = (ta, tb)
                break
        if sa.scanned > window or sb.scanned > window:
            break
        r = min(r * 2, 1 << 16)
    reg = Region()
    if best is not None:
        ta, tb = best
        _count(reg, a.view(0, ta + 1), b.view(0, tb + 1), ta, tb)
        reg.depth = int(a.view(ta, ta + 1)["depth"][0])
        reg.how = "same function, same depth" if reg.depth == depth else \
            "returned to a common frame"
        a.consume(ta)
        b.consume(tb)
        reg.meet = (a.point(), b.point())
        return reg
    if sa.scanned > window or sb.scanned > window:
        reg.why = "window"
    elif a.ended and b.ended:
        reg.why = "ended"
    reg.why = reg.why or ("a-ended" if a.ended else "b-ended")
    _count(reg, a.view(), b.view(), a.avail, b.avail)
    ia, ca = a.drain()
    ib, cb = b.drain()
    reg.a_insns, reg.a_calls = ia, ca
    reg.b_insns, reg.b_calls = ib, cb
    return reg


def _find(o: _Side, x, window: int, g: _Side | None = None
          ) -> tuple[int, int] | None:
    """Where ``o`` runs step ``x`` (any depth), reading ahead at most
    ``window`` steps: ``(t, k)``, ``o``'s step ``t`` and the instructions
    it runs before ``x`` begins -- 0 for a step with ``x``'s addresses
    and length, else (``x`` is the step a trace resumed or began with at
    a PSB+ inside a basic block) ``t`` is a longer step ending where
    ``x`` ends, with ``x`` its tail.  The first such place; with ``g``
    (the side whose next step ``x`` is): of all of them, the one from
    which ``o`` and ``g`` stay in step longest (up to :data:`_AGREE_MAX`
    steps; the first among equals) -- code that repeats (a loop, a
    recursion) runs the same step many times."""
    scanned = 0
    found: list = []
    skip: list = []
    xn = int(x["n"])
    while scanned <= window and (g is not None or not found):
        if o.avail <= scanned and not o.more():
            break
        v = o.view(scanned, o.avail)
        n = v["n"].astype(np.int64)
        whole = (v["ip"] == x["ip"]) & (n == xn)
        tail = (v["ip"] < x["ip"]) & (n > xn)
        hit = np.flatnonzero((v["end"] == x["end"]) & (whole | tail))
        found.extend((scanned + hit).tolist())
        skip.extend((n[hit] - xn).tolist())
        scanned += len(v)
    if g is None or len(found) <= 1:
        return (found[0], skip[0]) if found else None
    alive = np.arange(len(found))
    at = np.array(found, np.int64)
    length = _AGREE
    while len(alive) > 1 and length <= _AGREE_MAX:
        g.fill(length)
        o.fill(int(at[alive[-1]]) + length)
        # from the step after: the first one matched already (and one
        # side may mark it as following lost data)
        ref = _words(g.view(1, length))
        mine = _words(o.view(0, o.avail))
        score = np.zeros(len(alive), np.int64)
        for k in range(0, len(alive), _BLOCK):      # bounded memory
            c = at[alive[k:k + _BLOCK]] + 1
            pos = c[:, None] + np.arange(len(ref))[None, :]
            inside = pos < len(mine)
            same = (mine[np.minimum(pos, len(mine) - 1)] == ref[None]).all(2)
            same &= inside
            score[k:k + _BLOCK] = np.where(same.all(1), len(ref),
                                           np.argmin(same, axis=1))
        top = int(score.max())
        alive = alive[score == top]
        if top < len(ref):
            break                       # all part before the end of ref
        length *= 4
    return found[int(alive[0])], skip[int(alive[0])]


def _skip_to(o: _Side, idx: int) -> tuple[int, int]:
    """Consume ``o``'s steps that end at or before instruction index
    ``idx`` (without holding them), so the next one is the step that holds
    ``idx`` (a trace may begin inside a step): (instructions, calls)
    consumed."""
    insns = calls = 0
    while True:
        if not o.avail and not o.more():
            break
        h = o.head()
        k = int(np.searchsorted(h["idx"] + h["n"], np.uint64(idx),
                                side="right"))
        if k:
            insns += int(h["n"][:k].sum())
            calls += int(np.count_nonzero(h["delta"][:k] > 0))
            o.consume(k)
        if k < len(h):
            break
    return insns, calls


def _after_gap(g: _Side, o: _Side, window: int, same_space: bool,
               found: tuple | None = None, how: str = "after lost data",
               skipped: tuple = (0, 0)) -> Region:
    """``g``'s trace lost data (or began) right before its next step: what
    ran before it there, and so its call depth, is unknown.  The runs meet
    where ``o`` runs the step ``g`` resumes with (same addresses and
    length, or its tail: :func:`_find`; any depth), ``found`` if given;
    ``o``'s step is split there when ``g`` resumed inside it.  ``g``'s
    depths from there on are re-based on ``o``'s and its call stack taken
    to be ``o``'s where the runs share addresses, else left empty (the
    frames lost with the data are not known)."""
    x = g.head()[0].copy()
    if found is None:
        found = _find(o, x, window, g)
    reg = Region()
    if found is None:
        reg.why = "gap"
        _count(reg, g.view(), o.view(), g.avail, o.avail)
        reg.a_insns, reg.a_calls = g.drain()
        reg.b_insns, reg.b_calls = o.drain()
        return reg
    t, k = found
    if k:
        o.split(t, k, int(x["ip"]))
        t += 1
    _count(reg, g.view(0, 1), o.view(0, t + 1), 0, t)
    reg.b_insns += skipped[0]
    reg.b_calls += skipped[1]
    o.consume(t)
    # where ``o`` lost data too, right before the step they meet at, the
    # meeting accounts for both losses
    o.head()[0:1]["gap"] = 0
    shift = int(o.head()[0]["depth"]) - int(x["depth"])
    g.rebase(shift, o.stack.sites if same_space else [])
    reg.depth = int(o.head()[0]["depth"])
    reg.how = how
    reg.meet = (g.point(), o.point())
    return reg


def _late_start(a: _Side, b: _Side, window: int, same_space: bool,
                begins: tuple = (None, None)):
    """Both traces begin here, at different places: if one begins at a
    step the other runs later (a circular buffer kept only the newest
    trace), they meet there -- at the instruction index the recordings
    say (``begins``) when they do, else where the two stay in step longer
    when either could be the later one -- else None."""
    xa, xb = a.head()[0].copy(), b.head()[0].copy()
    ba, bb = begins
    if ba is not None and bb is not None and ba != bb:
        # the later trace begins that many instructions into the other
        g, o, first, who = (b, a, bb - ba, "B") if bb > ba else \
            (a, b, ba - bb, "A")
        skipped = _skip_to(o, o.insns + first)
        found = _find(o, g.head()[0], window)
        if found is None:
            return None
        reg = _after_gap(g, o, window, same_space, found,
                         f"where {who}'s trace begins", skipped)
        return _flip(reg) if g is b else reg
    tb = _find(b, xa, window)           # A begins at B's step tb
    ta = _find(a, xb, window)           # B begins at A's step ta
    if ta is None and tb is None:
        return None

    def agree(g, o, found):
        # from the step after: the first one matched already (perhaps as
        # the tail of the other's)
        t = found[0]
        o.fill(t + _AGREE)
        g.fill(_AGREE)
        x, y = g.view(1, _AGREE), o.view(t + 1, t + _AGREE)
        m = min(len(x), len(y))
        return _differ(x[:m], y[:m])
    if ta is None or (tb is not None and (agree(a, b, tb), -tb[0]) >=
                      (agree(b, a, ta), -ta[0])):
        return _after_gap(a, b, window, same_space, tb, "where A's trace begins")
    return _flip(_after_gap(b, a, window, same_space, ta,
                            "where B's trace begins"))


#: steps compared to choose which trace began later; re-alignment after
#: lost data compares up to _AGREE_MAX steps from each place the other run
#: runs the step the damaged trace resumes with (_BLOCK places at a time)
_AGREE = 256
_AGREE_MAX = 1 << 16
_BLOCK = 1024


def _flip(reg: Region) -> Region:
    """A region found with the sides swapped, put back as (A, B)."""
    reg.a_insns, reg.b_insns = reg.b_insns, reg.a_insns
    reg.a_calls, reg.b_calls = reg.b_calls, reg.a_calls
    reg.a_callees, reg.b_callees = reg.b_callees, reg.a_callees
    if reg.meet is not None:
        reg.meet = (reg.meet[1], reg.meet[0])
    return reg


def _count(reg: Region, va: np.ndarray, vb: np.ndarray, ta: int, tb: int) -> None:
    """Instructions, calls and callees of the first ``ta`` / ``tb`` steps
    (the views hold one more step where there is one: the callees of a
    last call)."""
    for side, v, t in (("a", va, ta), ("b", vb, tb)):
        body = v[:t]
        setattr(reg, f"{side}_insns", int(body["n"].sum()))
        calls = np.flatnonzero(body["delta"] > 0)
        setattr(reg, f"{side}_calls", len(calls))
        calls = calls[calls + 1 < len(v)]
        if len(calls):
            u, c = np.unique(v["rip"][calls + 1], return_counts=True)
            setattr(reg, f"{side}_callees", dict(zip(u.tolist(), c.tolist())))

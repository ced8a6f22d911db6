"""Flame-graph folded stacks (Brendan Gregg's ``stackcollapse`` format).

One line per distinct stack: frame names from the bottom up joined by
``;``, a space, and the weight of the time spent in exactly that stack
(exclusive weight of its top frame): instructions (``weight="insns"``) or
time in the clock's unit (``"time"``, rounded to integers).  Weights are
summed per call path (the builder's path hashes: memory grows with the
program's distinct call paths, not the trace length) a chunk of
activations at a time, and written at ``close``, each stack's text built
from its caller's as the paths are walked (never all in memory at once;
a stack seen in two streams is written once per stream -- folded-stack
tools add duplicates up).  Frame names have ``;``
replaced (it is the separator).  ``root``: stacks start at the first
frame of that name (``--function``).
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis.records import StreamInfo
from hwtrace.analysis.slices import RecordChunker
from hwtrace.export import track_label


class FoldedWriter:
    #: the builder must hash call paths for this writer
    needs_paths = True

    def __init__(self, fp, weight: str = "insns", per_thread: bool = False,
                 root: str | None = None):
        if weight not in ("insns", "time"):
            raise ValueError(f"bad weight {weight!r}")
        self._fp = fp
        self._weight = weight
        self._per_thread = per_thread
        self._root = root
        # per builder: its (names, paths) and {(thread, path hash): weight}
        self._groups: list[tuple[object, str, dict]] = []
        self._cur: dict | None = None
        self._ctx = None
        self._info = StreamInfo()
        self._legacy: RecordChunker | None = None

    def begin_stream(self, info: StreamInfo, unit: str | None = None) -> None:
        self._flush_legacy()
        self._info = info
        self._ctx = None

    def add_slices(self, chunk, ctx) -> None:
        """A chunk of activations (``ctx``: its builder's ``names`` and
        ``paths``)."""
        X = chunk.exits
        if not len(X):
            return
        if ctx is not self._ctx:
            self._ctx = ctx
            self._cur = {}
            self._groups.append((ctx, track_label(self._info).replace(";", ":"),
                                 self._cur))
        if self._weight == "insns":
            w = (X["end_idx"] - X["begin_idx"] - X["child_insns"]).astype(np.float64)
        else:
            w = X["end"] - X["begin"] - X["child_time"]
        keep = w != 0
        if not keep.any():
            return
        X, w = X[keep], w[keep]
        if self._per_thread:
            info = self._info
            follows = info.tid is None and info.cpu is not None
            thr = np.where(X["tid"] >= 0, X["tid"], -1) if follows \
                else np.full(len(X), -1, np.int64)
            key = (X["path"].view(np.int64) * 1000003) ^ thr
        else:
            thr = None
            key = X["path"].view(np.int64)
        u, first, inv = np.unique(key, return_index=True, return_inverse=True)
        sums = np.bincount(np.asarray(inv).reshape(-1), w, len(u))
        paths = X["path"][first].tolist()
        ts = thr[first].tolist() if thr is not None else [-2] * len(u)
        cur = self._cur
        for p, t, s in zip(paths, ts, sums.tolist()):
            k = (t, p)
            cur[k] = cur.get(k, 0) + s

    def _lines(self):
        """(stack, weight) of every stack, walking each builder's call
        paths once (a path's text is built from its parent's)."""
        for ctx, label, weights in self._groups:
            nodes = ctx.paths.nodes
            names = ctx.names.names
            by_thread: dict = {}
            for (t, p), w in weights.items():
                by_thread.setdefault(t, {})[p] = w
            for t, ws in by_thread.items():
                # the nodes needed: every weighted path and its ancestors
                children: dict[int, list[int]] = {}
                need = set()
                for p in ws:
                    q = p
                    while q and q not in need:
                        need.add(q)
                        parent = nodes[q][0]
                        children.setdefault(parent, []).append(q)
                        q = parent
                head = [label] if t == -1 else [f"thread {t}"] if t >= 0 else []
                stack = [(0, head, self._root is None)]
                while stack:
                    node, prefix, rooted = stack.pop()
                    for c in children.get(node, ()):
                        name = names[nodes[c][1]].replace(";", ":")
                        r = rooted or name == self._root
                        frames = prefix + [name] if rooted or r else prefix
                        w = ws.get(c)
                        if w and r:
                            yield ";".join(frames), w
                        stack.append((c, frames, r))

    @property
    def stacks(self) -> dict[str, float]:
        """{"a;b;c": weight}."""
        self._flush_legacy()
        out: dict[str, float] = {}
        for k, w in self._lines():
            out[k] = out.get(k, 0) + w
        return out

    def add(self, rec) -> None:
        if self._legacy is None:
            self._legacy = RecordChunker()
        self._legacy.add(rec)

    def _flush_legacy(self) -> None:
        if self._legacy is not None:
            lg, self._legacy = self._legacy, None
            self._ctx = None
            self.add_slices(lg.take(), lg)

    def close(self) -> None:
        self._flush_legacy()
        w = self._fp.write
        for key, v in self._lines():
            v = int(round(v))
            if v > 0:
                w(f"{key} {v}\n")

"""Flame-graph folded stacks (Brendan Gregg's ``stackcollapse`` format).

One line per distinct stack: frame names from the bottom up joined by
``;``, a space, and the weight of the time spent in exactly that stack
(exclusive weight of its top frame): instructions (``weight="insns"``) or
time in the clock's unit (``"time"``, rounded to integers).  Weights are
summed per call path (the builder's path hashes: memory grows with the
program's distinct call paths, not the trace length) a chunk of
activations at a time, and written at ``close``.  Frame names have ``;``
replaced (it is the separator).  ``root``: stacks start at the first
frame of that name (``--function``).
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis.records import StreamInfo
from hwtrace.analysis.slices import RecordChunker
from hwtrace.export import track_label


class FoldedWriter:
    def __init__(self, fp, weight: str = "insns", per_thread: bool = False,
                 root: str | None = None):
        if weight not in ("insns", "time"):
            raise ValueError(f"bad weight {weight!r}")
        self._fp = fp
        self._weight = weight
        self._per_thread = per_thread
        self._root = root
        self._weights: dict[str, float] = {}
        self._keys: dict = {}                 # (names id, prefix, path) -> str
        self._info = StreamInfo()
        self._legacy: RecordChunker | None = None

    def begin_stream(self, info: StreamInfo, unit: str | None = None) -> None:
        self._flush_legacy()
        self._info = info

    def add_slices(self, chunk, ctx) -> None:
        """A chunk of activations (``ctx``: its builder's ``names`` and
        ``paths``)."""
        X = chunk.exits
        if not len(X):
            return
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
        else:
            thr = np.full(len(X), -2, np.int64)
        key = np.stack((X["path"].view(np.int64), thr), 1)
        u, inv = np.unique(key, axis=0, return_inverse=True)
        sums = np.bincount(np.asarray(inv).reshape(-1), w, len(u))
        paths = ctx.paths
        tab = ctx.names.names
        label = track_label(self._info).replace(";", ":")
        ws = self._weights
        for (p, t), s in zip(u.tolist(), sums.tolist()):
            ck = (id(ctx), t, p)
            k = self._keys.get(ck)
            if k is None:
                frames = [tab[i].replace(";", ":")
                          for i in paths.names(p & 0xFFFFFFFFFFFFFFFF)]
                if self._root is not None:
                    if self._root not in frames:
                        self._keys[ck] = k = ""
                        continue
                    frames = frames[frames.index(self._root):]
                if t == -1:
                    frames.insert(0, label)
                elif t >= 0:
                    frames.insert(0, f"thread {t}")
                k = self._keys[ck] = ";".join(frames)
            if k:
                ws[k] = ws.get(k, 0) + s

    @property
    def stacks(self) -> dict[str, float]:
        """{"a;b;c": weight}."""
        self._flush_legacy()
        return dict(self._weights)

    def add(self, rec) -> None:
        if self._legacy is None:
            self._legacy = RecordChunker()
        self._legacy.add(rec)

    def _flush_legacy(self) -> None:
        if self._legacy is not None:
            self.add_slices(self._legacy.take(), self._legacy)

    def close(self) -> None:
        self._flush_legacy()
        for key, w in self._weights.items():
            w = int(round(w))
            if w > 0:
                self._fp.write(f"{key} {w}\n")

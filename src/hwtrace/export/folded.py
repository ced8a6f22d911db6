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

import codecs

import numpy as np

from hwtrace._unique import unique
from hwtrace.analysis.records import StreamInfo
from hwtrace.analysis.slices import RecordChunker
from hwtrace.export import track_label


class FoldedWriter:
    #: the builder must hash call paths for this writer
    needs_paths = True

    def __init__(self, fp, weight: str = "insns", per_thread: bool = False,
                 root: str | None = None, impl: str | None = None):
        if weight not in ("insns", "time"):
            raise ValueError(f"bad weight {weight!r}")
        self._fp = fp
        #: the weights' table: the analysis core's hash table (None: where
        #: it loaded) or the twin's sorted arrays ("python"); instruction
        #: weights only -- whole numbers, whose float sums are exact in any
        #: order, where times' sums would round by the order of adding
        from hwtrace.analysis import _runs_impl
        self._keys_core = _runs_impl.core_for(impl) if weight == "insns" else None
        self._weight = weight
        self._per_thread = per_thread
        self._root = root
        # per builder: its (names, paths) and weights per (thread, path)
        self._groups: list[tuple[object, str, "_Weights"]] = []
        self._cur: "_Weights | None" = None
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
            self._cur = _Weights(self._keys_core)
            self._groups.append((ctx, track_label(self._info).replace(";", ":"),
                                 self._cur))
        if self._weight == "insns":
            w = (X["end_idx"] - X["begin_idx"] - X["child_insns"]).astype(np.float64)
        else:
            w = X["end"] - X["begin"] - X["child_time"]
        keep = w != 0
        if not keep.any():
            return
        # (the two columns read, not every one of the rows kept)
        tid, path = X["tid"], X["path"]
        if not keep.all():
            tid, path, w = tid[keep], path[keep], w[keep]
        if self._per_thread:
            info = self._info
            follows = info.tid is None and info.cpu is not None
            thr = np.where(tid >= 0, tid, -1) if follows \
                else np.full(len(w), -1, np.int64)
        else:
            thr = np.full(len(w), -2, np.int64)
        self._cur.add(thr, path, w)

    def _trees(self):
        """Per builder and thread: (head frame or None, the call-path tree
        of every weighted path and its callers) -- node arrays ``nid``
        (name ids) and ``wnode`` (each node's own weight, 0: a caller
        only), every node's children ``order[lo[k]:hi[k]]`` and the
        root's (path 0) ``order[lo0:hi0]`` -- and the builder's names."""
        for ctx, label, weights in self._groups:
            paths = ctx.paths
            names = ctx.names.names
            # sorted by (thread, path), one row each: a thread's paths are
            # a run, ascending and unique
            th, ph, wt = weights.arrays()
            if not len(th):
                continue
            cut = np.flatnonzero(th[1:] != th[:-1]) + 1
            for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(th)]):
                t = int(th[a])
                wp, ww = ph[a:b], wt[a:b]
                # every weighted path and its ancestors, with their parents
                nodes, parents, nids = [], [], []
                frontier = wp
                # the paths met so far: by the table's numbers where it
                # has them, else a set (merging sorted arrays again at
                # every level was most of this walk on deep stacks)
                if paths.numbered:
                    met = np.zeros(len(paths), bool)
                    met[paths.numbers(frontier)] = True
                else:
                    seen = set(frontier.tolist())
                while len(frontier):
                    par, nid = paths.lookup(frontier)
                    nodes.append(frontier)
                    parents.append(par)
                    nids.append(nid)
                    nxt = unique(par[par != 0])
                    if paths.numbered:
                        num = paths.numbers(nxt)
                        new = ~met[num]
                        frontier = nxt[new]
                        met[num[new]] = True
                        continue
                    nl = nxt.tolist()
                    frontier = nxt[np.fromiter((x not in seen for x in nl), bool, len(nl))]
                    seen.update(frontier.tolist())
                node = np.concatenate(nodes)
                parent = np.concatenate(parents)
                nid = np.concatenate(nids)
                order = np.argsort(parent, kind="stable")
                sp = parent[order]
                # each node's own weight (0: a caller only)
                j = np.minimum(np.searchsorted(wp, node), len(wp) - 1)
                wnode = np.where(wp[j] == node, ww[j], 0.0)
                del nodes, parents, nids
                seen = met = None
                head = label if t == -1 else f"thread {t}" if t >= 0 else None
                # every node's children: order[lo[k]:hi[k]] (all at once;
                # the root's, path 0, apart)
                lo = np.searchsorted(sp, node, "left")
                hi = np.searchsorted(sp, node, "right")
                lo0 = int(np.searchsorted(sp, np.uint64(0), "left"))
                hi0 = int(np.searchsorted(sp, np.uint64(0), "right"))
                yield head, (order, lo, hi, nid, wnode, lo0, hi0), names

    def _lines(self):
        """(stack, weight) of every stack, walking each builder's call
        paths once (a path's text is built from its parent's)."""
        for head, (order, lo, hi, nid, wnode, lo0, hi0), names in self._trees():
            head = [] if head is None else [head]
            # a node's frames are a string (and how many frames it
            # holds): a child's line is its parent's plus its name
            lo_l, hi_l = lo.tolist(), hi.tolist()
            order_l = order.tolist()
            nid_l = nid.tolist()
            wnode_l = wnode.tolist()
            cname: dict[int, str] = {}
            root = self._root
            stack = [(-1, ";".join(head), len(head), root is None)]
            while stack:
                q, frames, nf, rooted = stack.pop()
                lo, hi = (lo0, hi0) if q < 0 else (lo_l[q], hi_l[q])
                for k in order_l[lo:hi]:
                    i = nid_l[k]
                    cn = cname.get(i)
                    if cn is None:
                        cn = cname[i] = names[i].replace(";", ":")
                    r = rooted or cn == root
                    line = frames + ";" + cn if nf else cn
                    w = wnode_l[k]
                    if w and r:
                        yield line, w
                    if r:
                        stack.append((k, line, nf + 1, True))
                    else:
                        stack.append((k, frames, nf, False))

    def _write_compiled(self, core, errors: str, write) -> None:
        """The lines of every tree as UTF-8 bytes to ``write``, by the
        compiled core (the same lines, in the same order, as
        :meth:`_lines` and :meth:`close`)."""
        for head, (order, lo, hi, nid, wnode, lo0, hi0), names in self._trees():
            u, inv = np.unique(nid, return_inverse=True)
            texts = [names[i].replace(";", ":") for i in u.tolist()]
            root = self._root
            isroot = np.array([root is None or x == root for x in texts], np.uint8) \
                if len(texts) else np.zeros(0, np.uint8)
            core.folded(
                np.ascontiguousarray(order, np.int64), np.ascontiguousarray(lo, np.int64),
                np.ascontiguousarray(hi, np.int64),
                np.ascontiguousarray(np.asarray(inv).reshape(-1), np.int64),
                np.ascontiguousarray(wnode, np.float64),
                [x.encode("utf-8", errors) for x in texts], isroot,
                (head or "").encode("utf-8", errors), lo0, hi0, write)

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

    def close(self, impl: str | None = None) -> None:
        self._flush_legacy()
        from hwtrace.export import _textcols_impl
        core = _textcols_impl.core_for(impl)
        buf = getattr(self._fp, "buffer", None)
        enc = getattr(self._fp, "encoding", None)
        if core is not None and buf is not None and enc is not None \
                and codecs.lookup(enc).name == "utf-8":
            # straight to the byte buffer, encoded as the text layer would
            errors = getattr(self._fp, "errors", None) or "strict"
            self._fp.flush()
            self._write_compiled(core, errors, buf.write)
            return
        w = self._fp.write
        out = []
        for key, v in self._lines():
            v = int(round(v))
            if v > 0:
                out.append(f"{key} {v}\n")
                if len(out) >= 4096:
                    w("".join(out))
                    out = []
        if out:
            w("".join(out))


class _Weights:
    """Weights summed per (thread, call path).  Compiled (``core``): a
    :class:`~hwtrace.analysis.slices.KeyIndex` per thread sums each row
    as it comes, sorted once at the end.  The twin: numpy arrays merged a
    few hundred thousand rows at a time (each merge sorts the table and
    the new rows).  The same sums for whole-number weights."""

    def __init__(self, core=None):
        self._core = core
        self._ix: dict = {}                 # compiled: thread -> KeyIndex
        self._t = np.zeros(0, np.int64)
        self._p = np.zeros(0, np.uint64)
        self._w = np.zeros(0, np.float64)
        self._buf: list = []
        self._n = 0

    def add(self, t, p, w) -> None:
        if self._core is not None:
            t = np.asarray(t, np.int64)
            if not len(t):
                return
            t0 = int(t[0])
            if (t == t0).all():
                self._table(t0).add(p, w)
                return
            for v in unique(t).tolist():
                m = t == v
                self._table(v).add(np.asarray(p)[m], np.asarray(w)[m])
            return
        self._buf.append((np.asarray(t, np.int64), np.asarray(p, np.uint64),
                          np.asarray(w, np.float64)))
        self._n += len(w)
        if self._n >= 1 << 19:
            self._merge()

    def _table(self, t: int):
        ix = self._ix.get(t)
        if ix is None:
            from hwtrace.analysis.slices import KeyIndex
            ix = self._ix[t] = KeyIndex(self._core, sums=True)
        return ix

    def _merge(self) -> None:
        if not self._buf:
            return
        t = np.concatenate([self._t] + [b[0] for b in self._buf])
        p = np.concatenate([self._p] + [b[1] for b in self._buf])
        w = np.concatenate([self._w] + [b[2] for b in self._buf])
        if len(t) and t[0] == t.min() == t.max():
            order = np.argsort(p, kind="stable")     # one thread: lexsort's order
        else:
            order = np.lexsort((p, t))
        t, p, w = t[order], p[order], w[order]
        new = np.ones(len(t), bool)
        new[1:] = (t[1:] != t[:-1]) | (p[1:] != p[:-1])
        starts = np.flatnonzero(new)
        self._t, self._p = t[starts], p[starts]
        self._w = np.add.reduceat(w, starts) if len(w) else w
        self._buf, self._n = [], 0

    def arrays(self):
        """(thread, path, weight) sorted by thread and path, one row each."""
        if self._core is not None:
            ts, ps, ws = [self._t], [self._p], [self._w]
            for t in sorted(self._ix):
                ix = self._ix[t]
                keys = ix.keys[:ix.n]
                order = np.argsort(keys)
                ts.append(np.full(ix.n, t, np.int64))
                ps.append(keys[order])
                ws.append(ix.sums[:ix.n][order])
            return np.concatenate(ts), np.concatenate(ps), np.concatenate(ws)
        self._merge()
        return self._t, self._p, self._w

"""Flame-graph folded stacks (Brendan Gregg's ``stackcollapse`` format).

One line per distinct stack: frame names from the bottom up joined by
``;``, a space, and the weight of the time spent in exactly that stack
(exclusive weight of its top frame): instructions (``weight="insns"``) or
time in the clock's unit (``"time"``, rounded to integers).  Stacks are
accumulated in a dict keyed by the stack (bounded by the program's
distinct call paths, not the trace length) and written at ``close``.
Frame names have ``;`` replaced (it is the separator) and no spaces
problems (the last space separates the weight).
"""

from __future__ import annotations

from hwtrace.analysis.records import Activation, Enter, StreamInfo


class FoldedWriter:
    """Stacks are kept as a trie (node = (parent node, frame name)), so
    memory grows with the distinct call paths, not with their length
    squared; the text is built only at :meth:`close`."""

    def __init__(self, fp, weight: str = "insns", per_thread: bool = False):
        if weight not in ("insns", "time"):
            raise ValueError(f"bad weight {weight!r}")
        self._fp = fp
        self._weight = weight
        self._per_thread = per_thread
        self._nodes: dict[tuple[int, str], int] = {}
        self._parent: list[int] = [-1]          # node 0: the root
        self._name: list[str] = [""]
        self._weights: dict[int, float] = {}
        self._path: list[int] = []               # node per depth
        self._root = 0

    def _node(self, parent: int, name: str) -> int:
        key = (parent, name)
        n = self._nodes.get(key)
        if n is None:
            n = self._nodes[key] = len(self._parent)
            self._parent.append(parent)
            self._name.append(name)
        return n

    def begin_stream(self, info: StreamInfo, unit: str | None = None) -> None:
        self._path = []
        self._root = (self._node(0, info.label().replace(";", ":"))
                      if self._per_thread else 0)

    def add(self, rec) -> None:
        t = type(rec)
        if t is Enter:
            del self._path[rec.depth:]
            parent = self._path[-1] if self._path else self._root
            self._path.append(self._node(parent, rec.name.replace(";", ":")))
        elif t is Activation:
            if len(self._path) > rec.depth:
                node = self._path[rec.depth]
            else:
                node = self._node(self._root, rec.name.replace(";", ":"))
            w = rec.self_insns if self._weight == "insns" else rec.self_time
            if w:
                self._weights[node] = self._weights.get(node, 0) + w
            del self._path[rec.depth:]

    @property
    def stacks(self) -> dict[str, float]:
        """{"a;b;c": weight} (built on demand)."""
        out = {}
        for node, w in self._weights.items():
            names = []
            while node > 0:
                names.append(self._name[node])
                node = self._parent[node]
            out[";".join(reversed(names))] = w
        return out

    def close(self) -> None:
        for key, w in self.stacks.items():
            w = int(round(w))
            if w > 0:
                self._fp.write(f"{key} {w}\n")

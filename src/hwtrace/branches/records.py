"""The branch record (spec/branch-trace.md): one control transfer.

``Branch`` is frozen and slotted; ``from`` is a Python keyword, so the field
is ``from_`` (the JSON key is ``from``).  :func:`to_array` packs many
records into a numpy structured array when numpy is importable (it is not
a dependency: without it the function raises ImportError).
"""

from __future__ import annotations

from dataclasses import dataclass

#: every kind of the spec's table, in its order
KINDS = ("call", "return", "jump", "cond", "cond_not_taken", "indirect_call",
         "indirect_jump", "far", "syscall", "sysret", "interrupt", "iret")
KIND_CODE = {k: i for i, k in enumerate(KINDS)}
#: what "all" means: every kind but cond_not_taken (only if asked)
ALL_KINDS = frozenset(KINDS) - {"cond_not_taken"}


@dataclass(frozen=True, slots=True)
class Branch:
    pid: int | None
    tid: int | None
    kind: str
    from_: int            # address of the branch instruction
    to: int               # address execution continued at
    # the source's latest timestamp at the branch: the stepper's TIME record
    # for the run it is in (host TSC or instruction count), or the decoded
    # trace's latest TSC; None when the source has none
    time: int | None = None
    # call depth of the code executing the branch, 0 where tracing turned
    # on (calls +1, returns -1, a signal handler +1 until its sigreturn)
    depth: int | None = None

    def key(self) -> tuple[str, int, int]:
        """(kind, from, to): what two sources of one execution agree on."""
        return (self.kind, self.from_, self.to)

    def to_json(self, lookup=None) -> dict:
        """The jsonl object: pid, tid, kind, from, to; time and depth where
        known; from_sym/to_sym when ``lookup(addr) -> str | None`` names them."""
        d = {"pid": self.pid, "tid": self.tid, "kind": self.kind,
             "from": self.from_, "to": self.to}
        if self.time is not None:
            d["time"] = self.time
        if self.depth is not None:
            d["depth"] = self.depth
        if lookup is not None:
            s = lookup(self.from_)
            if s is not None:
                d["from_sym"] = s
            s = lookup(self.to)
            if s is not None:
                d["to_sym"] = s
        return d


def dtype():
    """The numpy dtype of :func:`to_array` (unknown pid/tid/time: -1;
    unknown depth: INT32_MIN; kind: index into KINDS)."""
    import numpy as np
    return np.dtype([("pid", "<i8"), ("tid", "<i8"), ("kind", "u1"),
                     ("from", "<u8"), ("to", "<u8"), ("time", "<i8"),
                     ("depth", "<i4")])


def iter_arrays(records, chunk: int = 1 << 16):
    """Records (any iterable) -> numpy structured arrays of up to ``chunk``
    records each: a long trace in bounded memory."""
    import numpy as np
    dt = dtype()
    buf = []
    for r in records:
        buf.append((-1 if r.pid is None else r.pid, -1 if r.tid is None else r.tid,
                    KIND_CODE[r.kind], r.from_, r.to,
                    -1 if r.time is None else r.time,
                    -(1 << 31) if r.depth is None else r.depth))
        if len(buf) >= chunk:
            yield np.array(buf, dtype=dt)
            buf = []
    if buf:
        yield np.array(buf, dtype=dt)


def to_array(records, chunk: int = 1 << 16):
    """Records (any iterable) -> one numpy structured array (built in
    chunks, so the records are never all Python objects at once)."""
    import numpy as np
    parts = list(iter_arrays(records, chunk))
    if not parts:
        return np.array([], dtype=dtype())
    return parts[0] if len(parts) == 1 else np.concatenate(parts)

"""The columns of a batch's block records, as the views walk them.

A :class:`hwtrace.flow.batches.Batch` holds its blocks as structured rows.
The call-stack builder (:mod:`.batchfeed`) and the decoded branch source
(:mod:`hwtrace.branches.decoded`) both read them as the same contiguous
columns -- start and end address, the transfer class of the last
instruction, the fall-through address, the time, and each record's first
instruction index -- differing only in the table that names the classes.
:func:`columns` makes them, with the compiled core's ``records`` (one pass
over the rows, ``analysis/core/rows.c``) where it is in use, else numpy:
the same arrays.
"""

from __future__ import annotations

import numpy as np

from hwtrace.analysis import _runs_impl

#: the row fields the compiled pass reads, with the types it reads them as
_FIELDS = (("ip", "<u8"), ("end_ip", "<u8"), ("tsc", "<u8"),
           ("ninsn", "<u4"), ("iclass", "u1"), ("size", "u1"))


def columns(blocks: np.ndarray, base: int, code_of: np.ndarray):
    """``(ip, end_ip, code, fall, tsc, start)`` of ``blocks``: the first and
    last instruction's addresses, ``code_of[iclass]`` (``code_of``: 256
    int8, the caller's classes), the fall-through address ``end_ip +
    size``, the TSC, and ``start[r]`` = ``base`` + the instructions before
    record ``r`` (``len(blocks) + 1`` of them)."""
    m = len(blocks)
    start = np.empty(m + 1, np.int64)
    core = _runs_impl.CORE
    if core is None:
        start[0] = base
        np.cumsum(blocks["ninsn"].astype(np.int64), out=start[1:])
        start[1:] += base
        # contiguous columns: the walks read slices of them many times
        end = np.ascontiguousarray(blocks["end_ip"])
        return (np.ascontiguousarray(blocks["ip"]), end, code_of[blocks["iclass"]],
                end + blocks["size"].astype(np.uint64),
                np.ascontiguousarray(blocks["tsc"]), start)
    blocks = np.ascontiguousarray(blocks)
    f = blocks.dtype.fields
    for name, t in _FIELDS:
        if f[name][0] != np.dtype(t):
            raise TypeError(f"records: field {name} is {f[name][0]}, not {t}")
    ip = np.empty(m, np.uint64)
    end = np.empty(m, np.uint64)
    code = np.empty(m, np.int8)
    fall = np.empty(m, np.uint64)
    tsc = np.empty(m, np.uint64)
    core.records(blocks, blocks.dtype.itemsize, f["ip"][1], f["end_ip"][1],
                 f["tsc"][1], f["ninsn"][1], f["iclass"][1], f["size"][1],
                 code_of, int(base), ip, end, code, fall, tsc, start)
    return ip, end, code, fall, tsc, start

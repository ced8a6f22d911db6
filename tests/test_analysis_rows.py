"""The pending rows' columns (analysis.rows._Parts): rows placed in order
come out in order, as views that stay valid when the columns fill and
are replaced, mixed with one-at-a-time rows, and a finished stream's
columns are dropped."""

import numpy as np

from hwtrace.analysis.rows import _Parts
from hwtrace.analysis.slices import SLICE, Cols


def _row(seq):
    # a SLICE tuple: eseq (field 10) orders the enters
    r = [0] * len(SLICE.names)
    r[0] = seq                  # id
    r[10] = seq                 # eseq
    return tuple(r)


def test_place_take_in_order_across_full_columns(monkeypatch):
    monkeypatch.setattr(_Parts, "_CAP", 8)
    p = _Parts("eseq")
    seq = 0
    taken = []
    for step in range(40):
        k = step % 7
        c = p.place(k)
        c["eseq"][:] = np.arange(seq, seq + k)
        c["id"][:] = np.arange(seq, seq + k)
        for f in SLICE.names:
            if f not in ("eseq", "id"):
                c[f][:] = 0
        seq += k
        if step % 3 == 0:
            p.add_row(_row(seq))        # one at a time, in between
            seq += 1
        if step % 5 == 4:
            # hand out all but the last two (some stay across a refill)
            lim = seq - 2
            out = p.take(lambda s: int(np.searchsorted(s, lim)))
            taken.append(out)
    taken.append(p.take(lambda s: len(s)))
    got = np.concatenate([t["eseq"] for t in taken])
    # views handed out early are unchanged by later refills
    assert got.tolist() == list(range(seq))
    assert np.concatenate([t["id"] for t in taken]).tolist() == list(range(seq))
    assert p.n == 0


def test_add_array_copies_and_release_drops_empty_columns():
    p = _Parts("xseq")
    a = Cols.zeros(5)
    a["xseq"] = np.arange(5)
    p.add_array(a)
    a["xseq"] = 99                      # the caller's array is not kept
    out = p.take(lambda s: len(s))
    assert out["xseq"].tolist() == [0, 1, 2, 3, 4]
    p.release()
    assert p.cols is None and p.n == 0
    # rows after a release get new columns
    b = Cols.zeros(2)
    b["xseq"] = [5, 6]
    p.add_array(b)
    p.release()                         # not all handed out: kept
    assert p.cols is not None
    assert p.take(lambda s: len(s))["xseq"].tolist() == [5, 6]

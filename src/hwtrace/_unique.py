"""``np.unique`` for the views, without its import of numpy.ma.

numpy 2.4's ``np.unique`` (no index, inverse or count asked) imports
numpy.ma on first use to ask whether its argument is a masked array:
~0.015 s of a view's start for a module no view uses.  :func:`unique`
gives the same result -- the sorted distinct values of the flattened
array -- for integer and boolean arrays by sorting and comparing
neighbours; anything else (floats, whose NaNs np.unique folds into one,
objects, masked arrays) goes to ``np.unique``.
"""

from __future__ import annotations

import numpy as np


def unique(a) -> np.ndarray:
    a = np.asarray(a)
    if type(a) is not np.ndarray or a.dtype.kind not in "iub":
        return np.unique(a)
    s = np.sort(a, axis=None)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]

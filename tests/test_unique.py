"""hwtrace._unique.unique: np.unique's result (the sorted distinct values
of the flattened array) without importing numpy.ma."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hwtrace._unique import unique

CASES = [
    np.zeros(0, np.uint64),
    np.array([7], np.int64),
    np.array([3, 1, 3, 2**64 - 1, 0, 1], np.uint64),
    np.array([-5, 2, -5, 0, 2], np.int32),
    np.array([[4, 1], [1, 9]], np.int64),          # flattened, as np.unique
    np.array([True, False, True]),
    np.random.default_rng(7).integers(0, 50, 1000).astype(np.uint8),
    np.array([np.nan, 1.0, np.nan, 0.5]),            # floats: np.unique's own
    [3, 3, 1],                                       # a list
]


@pytest.mark.parametrize("a", CASES, ids=range(len(CASES)))
def test_same_as_numpy(a):
    got, want = unique(a), np.unique(a)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f")


def test_integers_do_not_import_numpy_ma():
    code = ("import sys, numpy as np\n"
            "from hwtrace._unique import unique\n"
            "unique(np.array([3, 1, 3], np.uint64))\n"
            "print('numpy.ma' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"

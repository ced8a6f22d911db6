"""hwtrace._pathstr: each function against the pathlib expression it
stands for, on awkward path texts and on real files, links and loops."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hwtrace import _pathstr as P

PATHS = ["", ".", "./", "a", "a/", "./a", "a/./b", "a//b", "a/../b", "..",
         "../a/", "/", "//", "///", "////a", "/a/b/", "//a/b", "///a",
         "/./a/.", "a/b/c/", "/..", "x.pt", "images/f-1.so"]


@pytest.mark.parametrize("s", PATHS)
def test_texts_are_pathlibs(s):
    assert P.norm(s) == str(Path(s))
    assert P.norm(Path(s)) == str(Path(s))
    n = P.norm(s)
    assert P.parts(n) == list(Path(s).parts)
    assert P.parent(n) == str(Path(s).parent)
    for name in ("manifest.json", "images/x.so", "f", ".", "/abs"):
        assert P.join(n, name) == str(Path(s) / name)
    for other in PATHS:
        if Path(s).is_absolute() == Path(other).is_absolute():
            assert P.is_relative_to(n, P.norm(other)) == \
                Path(s).is_relative_to(other), (s, other)


def test_rejects_what_pathlib_rejects():
    for bad in (b"a", 5, None):
        with pytest.raises(TypeError):
            Path(bad)
        with pytest.raises(TypeError):
            P.norm(bad)


def test_file_tests_answer_as_pathlib(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "d").mkdir()
    os.symlink("f", tmp_path / "lf")
    os.symlink("d", tmp_path / "ld")
    os.symlink("nowhere", tmp_path / "broken")
    os.symlink("loop", tmp_path / "loop")
    names = ["f", "d", "lf", "ld", "broken", "loop", "missing", "f/below",
             "d/missing", "nul\0name", ".", "ld/../f"]
    for name in names:
        p = Path(tmp_path) / name
        s = P.join(str(tmp_path), name)
        assert s == str(p)
        assert P.is_file(s) == p.is_file(), name
        assert P.is_dir(s) == p.is_dir(), name
        assert P.is_symlink(s) == p.is_symlink(), name
        assert P.exists(s) == p.exists(), name
        if name not in ("loop", "nul\0name"):
            assert P.resolve(s) == str(p.resolve()), name
    with pytest.raises(RuntimeError):
        Path(tmp_path / "loop").resolve()
    with pytest.raises(RuntimeError):
        P.resolve(str(tmp_path / "loop"))

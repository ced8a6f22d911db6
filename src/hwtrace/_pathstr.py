"""Path strings as :mod:`pathlib` gives them, without importing it.

pathlib's import (urllib.parse, ipaddress, fnmatch: ~17 M instructions,
~2.5 ms) was half of what opening a bundle added to a small ``decode
--quiet --stat DIR`` or ``coverage --edges DIR``.  The bundle reader
(:class:`hwtrace.bundle.Bundle`) works on these strings instead: each
function answers what the pathlib expression in its doc answers -- the
same text, True/False in the same cases, the same exceptions (Python
3.11's pathlib on POSIX) -- so names in messages and outputs do not change.
"""

from __future__ import annotations

import errno
import os
import stat

#: the errors pathlib's exists()/is_file()/is_dir()/is_symlink() answer
#: False to (any other OSError is raised)
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def norm(path) -> str:
    """``str(Path(path))``: empty and '.' components dropped, one root
    slash (two if the path starts with exactly two), '.' for nothing."""
    s = os.fspath(path)
    if not isinstance(s, str):
        raise TypeError("argument should be a str object or an os.PathLike "
                        f"object returning str, not {type(s)!r}")
    root = ""
    if s.startswith("/"):
        root = "//" if len(s) - len(s.lstrip("/")) == 2 else "/"
    rel = "/".join(x for x in s.split("/") if x and x != ".")
    return root + rel or "."


def join(base: str, name: str) -> str:
    """``str(Path(base) / name)``."""
    return norm(os.path.join(base, name))


def parent(path: str) -> str:
    """``str(Path(path).parent)`` of a :func:`norm` path."""
    return os.path.dirname(path) or "."


def parts(path: str) -> list[str]:
    """``list(Path(path).parts)`` of a :func:`norm` path."""
    root = ""
    if path.startswith("/"):
        root = "//" if path.startswith("//") and path[2:3] != "/" else "/"
    rest = path[len(root):]
    return ([root] if root else []) + \
        (rest.split("/") if rest and rest != "." else [])


def is_relative_to(path: str, other: str) -> bool:
    """``Path(path).is_relative_to(other)`` of :func:`norm` paths."""
    want = parts(other)
    return parts(path)[:len(want)] == want


def mode(path: str, follow: bool = True) -> int | None:
    """``path``'s st_mode (of the link itself unless ``follow``); None
    where pathlib's exists() answers False (nothing there, a name the
    system refuses); other errors are raised, as there."""
    try:
        return (os.stat if follow else os.lstat)(path).st_mode
    except OSError as e:
        if e.errno not in _MISSING:
            raise
        return None
    except ValueError:
        return None


def exists(path: str) -> bool:
    """``Path(path).exists()``."""
    return mode(path) is not None


def is_file(path: str) -> bool:
    """``Path(path).is_file()``."""
    m = mode(path)
    return m is not None and stat.S_ISREG(m)


def is_dir(path: str) -> bool:
    """``Path(path).is_dir()``."""
    m = mode(path)
    return m is not None and stat.S_ISDIR(m)


def is_symlink(path: str) -> bool:
    """``Path(path).is_symlink()``."""
    m = mode(path, follow=False)
    return m is not None and stat.S_ISLNK(m)


def resolve(path: str) -> str:
    """``str(Path(path).resolve())``: a symbolic link loop raises
    RuntimeError, as there."""
    def check_eloop(e):
        if e.errno == errno.ELOOP:
            raise RuntimeError("Symlink loop from %r" % e.filename)
    try:
        s = os.path.realpath(path)
    except OSError as e:
        check_eloop(e)
        raise
    s = norm(s)
    try:
        os.stat(s)
    except OSError as e:
        check_eloop(e)
    return s

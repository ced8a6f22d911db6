"""The emulated engine's helper programs, compiled with gcc at first use.

The QEMU plugin, the ptrace stepper and the compiled PT generator are C
sources shipped in the package and built on the user's machine into
``$XDG_CACHE_HOME/hwtrace`` (default ``~/.cache/hwtrace``), named by a
digest of their sources so an update never runs a stale build.  A build
goes to a temporary file in that directory and is renamed into place, so
concurrent first uses never see half a file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence


class BuildError(Exception):
    """gcc is missing (``missing_gcc``) or the build failed (the message is
    the compiler's last line)."""

    def __init__(self, message: str, missing_gcc: bool = False):
        super().__init__(message)
        self.missing_gcc = missing_gcc


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hwtrace"


def build(name: str, hashed: Sequence[Path], argv: Sequence[str], suffix: str = "") -> Path:
    """The cached build of ``name`` from the files ``hashed`` (compiled by
    ``gcc <argv> -o OUT``).  Raises BuildError, or OSError when the cache
    directory can't be read or written."""
    h = hashlib.sha256()
    for src in hashed:
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    out = cache_dir() / f"{name}-{h.hexdigest()[:16]}{suffix}"
    if out.exists():
        return out
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BuildError("no gcc", missing_gcc=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=suffix, dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([gcc, *argv, "-o", tmp], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError((r.stderr.strip().splitlines() or ["gcc failed"])[-1])
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out

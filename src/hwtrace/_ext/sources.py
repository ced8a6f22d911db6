"""Which files a compiled core is built from, and their fingerprint.

Shared by ``setup.py`` (which loads this file by path, before hwtrace is
installed: standard library only) and :mod:`hwtrace._ext` (the staleness
check), so both hash exactly the same files the same way.

The extension ``hwtrace.<pkg>._c_<name>`` is built from
``<pkg>/_c_<name>.c`` and, if the package has a ``core/`` directory, every
``core/*.c`` (one extension per such package).  Its fingerprint is a
SHA-256 over those sources, the ``*.h`` headers next to the main file and
in ``core/``, and every file they include with a relative
``#include "..."`` (e.g. ``pt/_pt_packets.h`` from ``flow/core``), each
named by its path relative to the package directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(src: Path) -> list[Path]:
    """The C files compiled into the extension whose main file is ``src``."""
    src = Path(src)
    core = src.parent / "core"
    return [src, *(sorted(core.glob("*.c")) if core.is_dir() else [])]


def inputs(src: Path) -> list[Path]:
    """Every file the build of ``src``'s extension reads: its sources, the
    headers beside them, and what they include (relative includes)."""
    src = Path(src)
    pkg = src.parent
    files = list(sources(src)) + sorted(pkg.glob("*.h"))
    core = pkg / "core"
    if core.is_dir():
        files += sorted(core.glob("*.h"))
    seen = {os.path.normpath(f) for f in files}
    i = 0
    while i < len(files):
        f = files[i]
        i += 1
        for m in _INCLUDE.finditer(f.read_bytes()):
            p = Path(os.path.normpath(f.parent / m.group(1).decode()))
            if p.is_file() and str(p) not in seen:
                seen.add(str(p))
                files.append(p)
    return files


def fingerprint(src: Path) -> str:
    """SHA-256 over :func:`inputs`, in a fixed order."""
    src = Path(src)
    pkg = src.parent
    h = hashlib.sha256()
    for f in sorted(inputs(src), key=lambda p: os.path.relpath(p, pkg)):
        h.update(os.path.relpath(f, pkg).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()

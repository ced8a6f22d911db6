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

import os
import re
import sys


def _sha256():
    """A new SHA-256 hash: CPython's own (no OpenSSL to load, ~3 ms), its
    module by version (looking for a missing module costs a path
    search).  Imported when the sources are hashed, not with this module:
    every command's start-up imports it for the staleness check, which a
    build's stamp answers without hashing (the module is an extension
    file to load: ~0.2 ms)."""
    try:
        if sys.version_info >= (3, 12):
            from _sha2 import sha256
        else:
            from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
    return sha256()


# a relative #include: the directive at a line's start (after blanks only;
# scanned for from the '#', the start checked by _at_line_start -- many
# times faster than a ^-anchored multi-line pattern).  Compiled (re's cache)
# when the sources are read (_read), not at import: every command's start-up
# imports this module for the staleness check, which a build's stamp
# answers without reading a source (~0.13 ms of the compile saved).
_INCLUDE = rb'#\s*include\s+"([^"]+)"'
_BLANKS = b" \t\n\r\f\v"


def _at_line_start(data: bytes, pos: int) -> bool:
    """Whether only blanks lie between a line start and ``pos`` (what
    ``^\\s*`` matches under re.M: a blank run that reaches the text's
    start or crosses a newline)."""
    before = data[:pos]
    rest = before.rstrip(_BLANKS)
    return not rest or b"\n" in before[len(rest):]


# Paths are handled as strings (os.path), and pathlib is imported only by
# the functions that return Path objects (for setup.py): the staleness
# check runs at every command's start-up, where importing pathlib costs
# ~3 ms.

def _pkg(src) -> str:
    """The directory of ``src`` (``str(Path(src).parent)``)."""
    return os.path.dirname(os.fspath(src)) or "."


def sources(src) -> list:
    """The C files compiled into the extension whose main file is ``src``
    (Path objects)."""
    from pathlib import Path
    src = Path(src)
    core = src.parent / "core"
    return [src, *(sorted(core.glob("*.c")) if core.is_dir() else [])]


def _listed(src) -> list[str]:
    """The inputs found by listing directories (normalized paths): the
    main file, ``core/*.c``, and the ``*.h`` beside them; :func:`_read`
    adds what these include."""
    pkg = _pkg(src)
    core = os.path.join(pkg, "core")
    has_core = os.path.isdir(core)

    def listed(d: str, ext: str) -> list[str]:
        return sorted(os.path.join(d, n) for n in os.listdir(d)
                      if n.endswith(ext))

    files = [os.fspath(src), *(listed(core, ".c") if has_core else []),
             *listed(pkg, ".h"), *(listed(core, ".h") if has_core else [])]
    return [os.path.normpath(f) for f in files]


def _read(src, stats: dict | None = None) -> dict[str, bytes]:
    """:func:`inputs` as {normalized path: contents}, in its order (each
    file read once); ``stats`` gets each file's (size, mtime_ns), taken
    before it is read (an edit while it is read then shows as a change)."""
    out: dict[str, bytes] = {}
    for f in _listed(src):
        out.setdefault(f, b"")
    todo = list(out)
    while todo:
        f = todo.pop(0)
        with open(f, "rb") as fh:
            if stats is not None:
                st = os.fstat(fh.fileno())
                stats[f] = (st.st_size, st.st_mtime_ns)
            data = out[f] = fh.read()
        base = os.path.dirname(f)
        for m in re.finditer(_INCLUDE, data):
            if not _at_line_start(data, m.start()):
                continue
            p = os.path.normpath(os.path.join(base, m.group(1).decode()))
            if p not in out and os.path.isfile(p):
                out[p] = b""
                todo.append(p)
    return out


def inputs(src) -> list:
    """Every file the build of ``src``'s extension reads: its sources, the
    headers beside them, and what they include (relative includes); Path
    objects."""
    from pathlib import Path
    return [Path(f) for f in _read(src)]


def fingerprint(src) -> str:
    """SHA-256 over :func:`inputs`, in a fixed order."""
    return _digest(src, _read(src))


def _digest(src, files: dict[str, bytes]) -> str:
    pkg = _pkg(src)
    h = _sha256()
    for rel, f in sorted((os.path.relpath(f, pkg), f) for f in files):
        h.update(rel.encode() + b"\0" + files[f])
    return h.hexdigest()


# -- the stamp: the fingerprint without reading the sources ---------------------
#
# Hashing every source at every start-up costs a few milliseconds (~300 KB
# for the flow core).  The build writes, next to the extension, a stamp:
# the fingerprint it compiled in and each input's size and modification
# time (ns) as they were when it was hashed.  While every input still has
# its recorded size and time and no new input has appeared, the sources
# are those the fingerprint was taken of, and the stamp's fingerprint
# stands for them -- the rule CPython's own bytecode cache uses (source
# size and mtime).  Any difference, or no stamp, and the sources are
# hashed as before.

STAMP_SUFFIX = ".stamp"


def stamp_path(src):
    """Where the stamp of the extension built from ``src`` lives (a
    Path)."""
    from pathlib import Path
    return Path(stamp_file(src))


def stamp_file(src) -> str:
    """:func:`stamp_path` as a string."""
    stem = os.path.splitext(os.path.basename(os.fspath(src)))[0]
    return os.path.join(_pkg(src), stem + STAMP_SUFFIX)


def stamp_text(src) -> tuple[str, str]:
    """(fingerprint, stamp file text) of the sources as they are now."""
    pkg = _pkg(src)
    stats: dict = {}
    files = _read(src, stats)
    digest = _digest(src, files)
    lines = [f"sha256 {digest}"]
    for f in files:
        size, mtime = stats[f]
        lines.append(f"{size} {mtime} {os.path.relpath(f, pkg)}")
    return digest, "\n".join(lines) + "\n"


def stamped_fingerprint(src, text: str) -> str | None:
    """The fingerprint a stamp (:func:`stamp_text`) records if the
    sources are still the ones it describes (same files, each of the
    recorded size and modification time); None otherwise."""
    pkg = _pkg(src)
    lines = text.splitlines()
    if not lines or not lines[0].startswith("sha256 "):
        return None
    recorded = set()
    try:
        for line in lines[1:]:
            size, mtime, rel = line.split(" ", 2)
            f = os.path.normpath(os.path.join(pkg, rel))
            st = os.stat(f)
            if st.st_size != int(size) or st.st_mtime_ns != int(mtime):
                return None
            recorded.add(f)
        if not set(_listed(src)) <= recorded:
            return None         # a source or header added since
    except (OSError, ValueError):
        return None
    return lines[0][7:]

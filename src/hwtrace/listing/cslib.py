"""capstone's x86 text, without importing the capstone package.

``import capstone`` runs the package's ``__init__``, which imports the
Python modules of all its architectures (~20 of them, their constants
tables included): ~110 ms of every listing's start-up on this machine,
where loading the shared library it ships takes ~1.5 ms.  What hwtrace
asks of capstone is one thing -- an instruction's mnemonic and operand
text (capstone's ``disasm_lite``) -- so this module calls the package's
``libcapstone`` through :mod:`ctypes` for that (``cs_open``,
``cs_option``, ``cs_disasm``, ``cs_free``), with the C API's layout of
``cs_insn`` for capstone 5.  Another major version, or no library where
the package keeps it, falls back to the package itself: the same text,
slower to start.

:func:`engine` gives an object with ``disasm_lite(code, address, count)``
(tuples of address, size, mnemonic, operands, as capstone's).
"""

from __future__ import annotations

import importlib.util
import os
import weakref

#: capstone 5's C API (capstone.h): the architecture, the x86 modes and
#: the syntax option
_ARCH_X86 = 3
_MODE = {16: 1 << 1, 32: 1 << 2, 64: 1 << 3}
_OPT_SYNTAX, _SYNTAX_ATT = 1, 2
_MAJOR = 5

_lib = None             # the library (False: not usable: the package instead)
_types = None           # (cs_insn, its pointer type)


def _package_dir() -> str | None:
    try:
        spec = importlib.util.find_spec("capstone")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def available() -> bool:
    """Whether capstone is installed (nothing is loaded)."""
    return _package_dir() is not None


def _load():
    """The library with its prototypes set, or False."""
    global _lib, _types     # noqa: PLW0603 - a cache of the loaded library
    if _lib is not None:
        return _lib
    _lib = False
    d = _package_dir()
    path = None if d is None else os.path.join(d, "lib", "libcapstone.so")
    if path is None or not os.path.isfile(path):
        return _lib
    import ctypes as C
    try:
        lib = C.CDLL(path)
    except OSError:
        return _lib
    major, minor = C.c_int(), C.c_int()
    lib.cs_version.restype = C.c_uint
    lib.cs_version.argtypes = (C.POINTER(C.c_int), C.POINTER(C.c_int))
    lib.cs_version(C.byref(major), C.byref(minor))
    if major.value != _MAJOR:
        return _lib

    class Insn(C.Structure):
        _fields_ = (("id", C.c_uint), ("address", C.c_uint64), ("size", C.c_uint16),
                    ("bytes", C.c_ubyte * 24), ("mnemonic", C.c_char * 32),
                    ("op_str", C.c_char * 160), ("detail", C.c_void_p))

    p_insn = C.POINTER(Insn)
    lib.cs_open.restype = C.c_int
    lib.cs_open.argtypes = (C.c_int, C.c_int, C.POINTER(C.c_size_t))
    lib.cs_option.restype = C.c_int
    lib.cs_option.argtypes = (C.c_size_t, C.c_int, C.c_size_t)
    lib.cs_disasm.restype = C.c_size_t
    lib.cs_disasm.argtypes = (C.c_size_t, C.c_char_p, C.c_size_t, C.c_uint64, C.c_size_t,
                              C.POINTER(p_insn))
    lib.cs_free.restype = None
    lib.cs_free.argtypes = (p_insn, C.c_size_t)
    lib.cs_close.restype = C.c_int
    lib.cs_close.argtypes = (C.POINTER(C.c_size_t),)
    _types = (Insn, p_insn)
    _lib = lib
    return _lib


class _Engine:
    """One capstone handle (x86, a mode, a syntax) over the library."""

    def __init__(self, lib, bits: int, att: bool):
        import ctypes as C
        self._C = C
        self._lib = lib
        self._h = C.c_size_t()
        err = lib.cs_open(_ARCH_X86, _MODE[bits], C.byref(self._h))
        if err:
            raise OSError(f"capstone: cs_open failed ({err})")
        if att:
            lib.cs_option(self._h, _OPT_SYNTAX, _SYNTAX_ATT)
        self._out = _types[1]()
        # (closed when the engine goes, or at exit while ctypes is whole)
        weakref.finalize(self, lib.cs_close, C.byref(self._h))

    def disasm_lite(self, code: bytes, address: int, count: int = 0) -> list:
        lib = self._lib
        n = lib.cs_disasm(self._h, bytes(code), len(code), address, count,
                          self._C.byref(self._out))
        if not n:
            return []
        p = self._out
        try:
            return [(i.address, i.size, i.mnemonic.decode("ascii"),
                     i.op_str.decode("ascii")) for i in p[:n]]
        finally:
            lib.cs_free(p, n)


class _Package:
    """The capstone package's own engine (another major version)."""

    def __init__(self, bits: int, att: bool):
        import capstone
        m = {16: capstone.CS_MODE_16, 32: capstone.CS_MODE_32}.get(bits, capstone.CS_MODE_64)
        self._cs = capstone.Cs(capstone.CS_ARCH_X86, m)
        if att:
            self._cs.syntax = capstone.CS_OPT_SYNTAX_ATT

    def disasm_lite(self, code: bytes, address: int, count: int = 0) -> list:
        return list(self._cs.disasm_lite(code, address, count))


def engine(bits: int = 64, att: bool = False):
    """An x86 disassembler for ``bits`` (16, 32 or 64) in Intel syntax
    (``att``: AT&T's); ImportError where capstone is not installed."""
    lib = _load()
    if lib:
        return _Engine(lib, bits, att)
    return _Package(bits, att)

"""Build hwtrace's compiled cores (metadata lives in pyproject.toml).

Every ``src/hwtrace/**/_c_<name>.c`` is a C extension ``hwtrace.<pkg>._c_<name>``
(see hwtrace/_ext/__init__.py for the pattern and the selection rules),
compiled together with the ``core/*.c`` files of its package if it has a
``core/`` directory; hwtrace/_ext/sources.py says which files and computes
the fingerprint the staleness check compares.  A
compiler failure only warns -- the pure-Python twins then run -- unless
HWTRACE_REQUIRE_EXTENSIONS=1, which makes it fail the build.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _required() -> bool:
    v = os.environ.get("HWTRACE_REQUIRE_EXTENSIONS", "")
    return v.strip().lower() not in ("", "0", "no", "false", "off")


def _load_sources():
    """hwtrace/_ext/sources.py, loaded by path (hwtrace is not installed
    yet when this runs)."""
    spec = importlib.util.spec_from_file_location(
        "_hwtrace_sources", HERE / "src" / "hwtrace" / "_ext" / "sources.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SOURCES = _load_sources()


#: extension name -> the text of its sources' stamp (hwtrace._ext.sources)
STAMPS: dict[str, str] = {}


def _extensions() -> list[Extension]:
    exts = []
    for src in sorted((HERE / "src").glob("hwtrace/**/_c_*.c")):
        rel = src.relative_to(HERE / "src")
        name = ".".join(rel.with_suffix("").parts)
        # the fingerprint and the stamp of the sources as hashed
        # (sources.stamp_text), written next to the built extension
        digest, stamp = SOURCES.stamp_text(src)
        srcs = SOURCES.sources(src)
        deps = [f for f in SOURCES.inputs(src) if f not in srcs]
        STAMPS[name] = stamp
        exts.append(Extension(
            name, [f.relative_to(HERE).as_posix() for f in srcs],
            depends=[os.path.relpath(f, HERE) for f in deps],
            define_macros=[("HWTRACE_SOURCE_SHA256", f'"{digest}"')],
            extra_compile_args=["-O2", "-std=c11", "-Wall",
                                "-fvisibility=hidden", *LTO],
            extra_link_args=["-O2", *LTO]))
    return exts


#: Link-time optimization: a core's files (flow/core/*.c) are optimized
#: as one program, so the walk (walk.c) inlines and specializes what it
#: calls in other files (chain.c's lookups, icache.c's runs, query.c's
#: packets): ~10% fewer instructions in the flow core's edge walk on a gzip
#: recording.  A compiler or linker that refuses it builds without it
#: (OptionalBuildExt.build_extension); the results are the same either way.
LTO = ["-flto=auto"]         # auto: LTRANS jobs as the machine has cores, no warning


def _without_lto(ext: Extension) -> bool:
    """Drop :data:`LTO` from ``ext``'s flags; whether it had them."""
    had = any(f in ext.extra_compile_args for f in LTO)
    ext.extra_compile_args = [f for f in ext.extra_compile_args
                              if f not in LTO]
    ext.extra_link_args = [f for f in ext.extra_link_args if f not in LTO]
    return had


class OptionalBuildExt(build_ext):
    """build_ext that lets the install go on without a compiler."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all, e.g. DistutilsPlatformError
            self._failed("all extensions", e)

    def build_extension(self, ext):
        try:
            try:
                super().build_extension(ext)
            except Exception:   # CompileError, LinkError, ...
                if not _without_lto(ext):
                    raise
                print(f"note: {ext.name}: building without link-time "
                      "optimization", file=sys.stderr)
                super().build_extension(ext)
        except Exception as e:  # CompileError, LinkError, ...
            self._failed(ext.name, e)
            return
        self._write_stamp(ext)

    def copy_extensions_to_source(self):
        # --inplace / editable: the extensions are built in build/ and
        # copied into the source tree; their stamps go with them
        super().copy_extensions_to_source()
        for ext in self.extensions:
            self._write_stamp(ext)

    def _write_stamp(self, ext):
        """The sources' stamp next to the extension: at start-up it
        stands for the fingerprint while the sources are unchanged (no
        hashing them); a stamp that does not match means a hash."""
        stamp = STAMPS.get(ext.name)
        if stamp is None:
            return
        so = Path(self.get_ext_fullpath(ext.name))
        if not so.is_file():
            return              # not built: nothing to stamp
        out = so.with_name(ext.name.rpartition(".")[2]
                           + SOURCES.STAMP_SUFFIX)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(stamp)
        os.replace(tmp, out)

    def _failed(self, what, exc):
        if _required():
            raise exc
        print(f"WARNING: could not build {what} ({exc}); hwtrace will use "
              "its pure-Python twins", file=sys.stderr)


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})

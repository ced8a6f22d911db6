"""Build hwtrace's compiled cores (metadata lives in pyproject.toml).

Every ``src/hwtrace/**/_c_<name>.c`` is a C extension ``hwtrace.<pkg>._c_<name>``
(see hwtrace/_ext/__init__.py for the pattern and the selection rules); the
``*.h`` files next to it are its headers.  A
compiler failure only warns -- the pure-Python twins then run -- unless
HWTRACE_REQUIRE_EXTENSIONS=1, which makes it fail the build.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _required() -> bool:
    v = os.environ.get("HWTRACE_REQUIRE_EXTENSIONS", "")
    return v.strip().lower() not in ("", "0", "no", "false", "off")


def fingerprint(src: Path) -> str:
    """SHA-256 over the C source and the headers next to it (the same
    computation as hwtrace._ext's staleness check)."""
    h = hashlib.sha256()
    for f in [src, *sorted(src.parent.glob("*.h"))]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _extensions() -> list[Extension]:
    exts = []
    for src in sorted((HERE / "src").glob("hwtrace/**/_c_*.c")):
        rel = src.relative_to(HERE / "src")
        name = ".".join(rel.with_suffix("").parts)
        digest = fingerprint(src)
        exts.append(Extension(
            name, [src.relative_to(HERE).as_posix()],
            depends=[h.relative_to(HERE).as_posix()
                     for h in sorted(src.parent.glob("*.h"))],
            define_macros=[("HWTRACE_SOURCE_SHA256", f'"{digest}"')],
            extra_compile_args=["-O2", "-std=c11"]))
    return exts


class OptionalBuildExt(build_ext):
    """build_ext that lets the install go on without a compiler."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all, e.g. DistutilsPlatformError
            self._failed("all extensions", e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # CompileError, LinkError, ...
            self._failed(ext.name, e)

    def _failed(self, what, exc):
        if _required():
            raise exc
        print(f"WARNING: could not build {what} ({exc}); hwtrace will use "
              "its pure-Python twins", file=sys.stderr)


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})

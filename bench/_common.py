"""Shared helpers for the benchmarks: the reference oracle, a multi-megabyte
stream made of a real capture, best-of-N timing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
BUILD = REPO / "build"
REAL_CAPTURE = REPO / "examples" / "real-capture.pt"


def ptoracle() -> Path | None:
    """The oracle binary (built into build/ on first use), or None."""
    exe = BUILD / "ptoracle"
    if not exe.exists():
        BUILD.mkdir(exist_ok=True)
        build = SHARED / "oracle" / "build.sh"
        if not build.exists() or shutil.which("cc") is None:
            return None
        r = subprocess.run(["sh", str(build), str(exe)], capture_output=True)
        if r.returncode != 0:
            return None
    return exe


def big_stream(min_bytes: int = 4 << 20, src: Path = REAL_CAPTURE) -> bytes:
    """``src`` repeated until at least ``min_bytes`` long."""
    data = src.read_bytes()
    reps = -(-min_bytes // len(data))
    return data * reps


def best_of(n: int, fn):
    """Smallest wall time of ``n`` runs of ``fn()``, and its last result."""
    best, result = float("inf"), None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6 if seconds > 0 else float("inf")


def python() -> str:
    return sys.executable

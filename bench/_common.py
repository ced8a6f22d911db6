"""Shared helpers for the benchmarks: the reference oracle, a multi-megabyte
stream made of a real capture, best-of-N timing, and how the timed hwtrace
processes run (CPU time, bytecode cache)."""

from __future__ import annotations

import os
import resource
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


# -- how timed hwtrace processes run -----------------------------------------

def child_env(cold: bool, cache: Path) -> dict:
    """The environment of the timed ``python -m hwtrace`` children.

    Warm (the default): Python's bytecode cache on, as an installed hwtrace
    has it (pip compiles the .pyc files at install; a venv keeps them):
    ``PYTHONDONTWRITEBYTECODE`` dropped and the cache kept under ``cache``
    (``PYTHONPYCACHEPREFIX``: the source tree is not written), filled by an
    untimed first run of each timed command (:func:`warm_up`).  Cold: the
    environment as it is; where it sets ``PYTHONDONTWRITEBYTECODE=1`` (this
    machine does) every process compiles every hwtrace module it imports
    (~0.03 s more per command)."""
    env = dict(os.environ)
    if not cold:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def bytecode_note(cold: bool) -> str:
    """What the bench output says about bytecode caching."""
    if cold:
        how = ("cold: PYTHONDONTWRITEBYTECODE=1, every hwtrace module compiled "
               "in every process" if os.environ.get("PYTHONDONTWRITEBYTECODE")
               else "as this environment has it (the cache is not disabled)")
    else:
        how = ("warm, as an installed hwtrace has it (a private "
               "PYTHONPYCACHEPREFIX filled by an untimed first run; "
               "--cold-bytecode: compile every time)")
    return f"hwtrace children's bytecode cache: {how}"


def warm_up(cmd, env: dict) -> None:
    """Run ``cmd`` once, untimed, so that its bytecode is cached."""
    subprocess.run([str(c) for c in cmd], capture_output=True, env=env)


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def best_cpu_of(n: int, fn):
    """Least CPU time (user + sys, this process's and its children's) of
    ``n`` runs of ``fn()``, and its last result."""
    best, result = float("inf"), None
    for _ in range(n):
        t0 = time.process_time() + child_cpu()
        result = fn()
        best = min(best, time.process_time() + child_cpu() - t0)
    return best, result


def best_cpu(n: int, cmd, env: dict | None = None) -> tuple[float, str]:
    """Least CPU time (user + sys) of ``n`` runs of the process ``cmd``
    (its start-up included), and its stdout; exits if it fails."""
    t, out = None, ""
    for _ in range(n):
        before = child_cpu()
        r = subprocess.run([str(c) for c in cmd], capture_output=True,
                           text=True, env=env)
        spent = child_cpu() - before
        if r.returncode != 0:
            sys.exit(f"bench: {' '.join(map(str, cmd[:5]))}...: "
                     f"{r.stderr.strip()[-400:]}")
        t = spent if t is None else min(t, spent)
        out = r.stdout
    return t, out


def hwtrace_command() -> list[str]:
    """How the timed children run hwtrace: as a user does, the
    ``hwtrace`` script pip installed beside this interpreter (its console
    script, whose first line names this interpreter: it imports hwtrace
    from the same path, PYTHONPATH included), else ``python -m hwtrace``
    (runpy's start-up too)."""
    script = Path(sys.executable).parent / "hwtrace"
    try:
        with open(script, "rb") as f:
            first = f.readline().strip()
    except OSError:
        first = b""
    if first == b"#!" + os.fsencode(sys.executable):
        return [str(script)]
    return [sys.executable, "-m", "hwtrace"]


def startup_floor(env: dict, n: int) -> str:
    """The CPU seconds no command goes below here: the interpreter alone
    (with whatever this machine's site imports) and ``hwtrace --version``
    (:func:`hwtrace_command`, which is named)."""
    tp, _ = best_cpu(n, [sys.executable, "-c", "pass"], env)
    version = [*hwtrace_command(), "--version"]
    warm_up(version, env)
    tv, _ = best_cpu(n, version, env)
    return (f"start-up floor: python -c pass {tp:.3f} s CPU, "
            f"hwtrace --version {tv:.3f} s CPU (hwtrace: "
            f"{' '.join(hwtrace_command())})")

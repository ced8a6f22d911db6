"""What the command line does to its own process around a command
(:mod:`hwtrace.cli._blas`, :mod:`hwtrace.cli._gc`): numpy loads OpenBLAS
with one thread, and the environment the programs hwtrace starts inherit
is the user's; the collector leaves alone what the input holds while a
command runs, and is as it was after.  Each numpy check runs in a fresh
interpreter (numpy loads once per process).  No timing."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

from hwtrace.cli import _gc

PROBE = r"""
import json, os, sys
import hwtrace.cli
import numpy
print(json.dumps({"threads": len(os.listdir("/proc/self/task")),
                  "env": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "ok": float(numpy.arange(4).sum()),
                  "finders": [type(f).__name__ if not isinstance(f, type)
                              else f.__name__ for f in sys.meta_path]}))
"""


def probe(**env) -> dict:
    e = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True,
                       text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_numpy_loads_without_blas_threads_and_the_environment_is_the_users():
    p = probe()
    assert p["ok"] == 6.0
    assert p["threads"] == 1            # no OpenBLAS worker spinning
    assert p["env"] is None             # what a started program inherits
    assert "_Finder" not in p["finders"]     # gone after numpy's import


def test_a_users_own_blas_threads_are_kept():
    p = probe(OPENBLAS_NUM_THREADS="2")
    assert p["env"] == "2"
    assert p["ok"] == 6.0


def test_settle_acts_only_inside_a_command_and_is_undone_after():
    old = gc.get_threshold()
    _gc.settle()                        # the library, a test: nothing
    assert gc.get_threshold() == old and gc.get_freeze_count() == 0
    held = [object() for _ in range(3)]
    with _gc.command():
        _gc.settle()
        assert gc.get_threshold() == _gc.THRESHOLD
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == old
    assert gc.get_freeze_count() == 0
    assert len(held) == 3


def test_the_collector_is_restored_when_a_command_fails():
    from hwtrace.cli import main
    old = gc.get_threshold()
    assert main(["summary", "/nonexistent/bundle"]) != 0
    assert gc.get_threshold() == old and gc.get_freeze_count() == 0

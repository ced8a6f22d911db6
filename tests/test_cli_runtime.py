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


def test_a_commands_start_up_is_frozen_and_undone_after(tmp_path):
    """What is alive when a command starts (the modules imported so far)
    is out of the collector's scans while it runs; called in process
    (argv given) the collector is as it was after."""
    from hwtrace.cli import main
    old = gc.get_threshold()
    with _gc.command():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == old
    t = tmp_path / "t.pt"
    t.write_bytes(_TRACE)
    assert main(["dump", "--stat", str(t)]) == 0
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == old


#: a trace of one PSB (dump --stat counts its packets)
_TRACE = bytes.fromhex("02820282028202820282028202820282") + bytes.fromhex("0223")

PROGRAM = r"""
import gc, json, sys
from hwtrace.cli import main
sys.argv = ["hwtrace", "dump", "--stat", sys.argv[1]]
status = main()
print(json.dumps({"status": status, "frozen": gc.get_freeze_count(),
                  "after": gc.get_count()[0] >= 0}))
"""


def test_the_processs_own_command_line_stays_frozen_for_the_exit(tmp_path):
    """main() run on the process's own command line (the hwtrace script,
    python -m hwtrace): the interpreter exits after it, so what is alive
    stays frozen -- the shutdown's collections do not go over it again --
    and the command's output is complete."""
    t = tmp_path / "t.pt"
    t.write_bytes(_TRACE)
    r = subprocess.run([sys.executable, "-c", PROGRAM, str(t)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("packets: ")
    got = json.loads(lines[-1])
    assert got["status"] == 0 and got["frozen"] > 0
    r = subprocess.run([sys.executable, "-m", "hwtrace", "dump", "--stat",
                        str(t)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "\n".join(lines[:-1]) + "\n"


# -- leaving without the interpreter's shutdown (hwtrace.cli._exit) ----------

LEAVE = r"""
import atexit, sys, threading
from hwtrace.cli import _exit
sys.stdout.write("x" * 100000 + "\n")       # buffered: flushed by leave
sys.stderr.write("note\n")
if sys.argv[1] == "atexit":
    atexit.register(lambda: print("atexit ran"))
elif sys.argv[1] == "thread":
    done = threading.Event()
    threading.Thread(target=done.wait, args=(0.2,)).start()
_exit.leave(3)
print("returned")
"""


def _bare(*args) -> subprocess.CompletedProcess:
    """``python -S -c ...`` with this process's import path: no site
    start-up, whose .pth files may register atexit callbacks of their own
    (an interpreter's sandbox or tooling) -- with one registered, leave
    rightly returns."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path
                                                      if p))
    return subprocess.run([sys.executable, "-S", "-c", *args],
                          capture_output=True, text=True, timeout=120,
                          env=env)


def _leave(how: str):
    return _bare(LEAVE, how)


def test_leave_ends_the_process_with_the_status_and_the_output_flushed():
    r = _leave("plain")
    assert r.returncode == 3
    assert r.stdout == "x" * 100000 + "\n" and r.stderr == "note\n"


def test_leave_returns_where_the_shutdown_has_work_to_do():
    """An atexit callback registered or another thread alive: the process
    goes on, and its exit is the interpreter's as always."""
    r = _leave("atexit")
    assert r.returncode == 0
    assert r.stdout.splitlines()[1:] == ["returned", "atexit ran"]
    r = _leave("thread")
    assert r.returncode == 0
    assert r.stdout.splitlines()[1:] == ["returned"]


COVERAGE = r"""
import sys
from hwtrace.cli import main
in_process = len(sys.argv) > 3
sys.argv = ["hwtrace", "coverage", "--pt", sys.argv[1], "--raw",
            sys.argv[2] + ":0x1000"]
if in_process:
    print(main(sys.argv[1:]))       # in process: returns
else:
    main()                          # the process's own: ends it
print("after main")
"""


def test_coverage_ends_its_own_process_but_not_a_callers(tmp_path):
    """``coverage`` leaves its own process at once (quick_exit), with the
    same output and status as when called in process, where main()
    returns."""
    from hwtrace.pt import encoder as E
    t = tmp_path / "t.pt"
    t.write_bytes(E.psb() + E.mode_exec(csl=1) + E.psbend() +
                  E.tip_pge(0x1000) + E.tip_pgd())
    code = tmp_path / "code.bin"
    code.write_bytes(bytes.fromhex("9090900f05"))   # 3 nops, a syscall
    own = _bare(COVERAGE, str(t), str(code))
    assert own.returncode == 0, own.stderr[-2000:]
    assert own.stdout.endswith("insns: 4.\n")       # nothing after main()
    called = _bare(COVERAGE, str(t), str(code), "in-process")
    assert called.stdout == own.stdout + "0\nafter main\n"



_MALLOC_PROBE = r"""
import sys
from hwtrace.cli import _malloc, main
main(sys.argv[1:])
print(_malloc._done)
"""


def _malloc_done(*argv) -> str:
    r = subprocess.run([sys.executable, "-c", _MALLOC_PROBE, *map(str, argv)],
                       capture_output=True, text=True, timeout=600)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr


def test_a_view_keeps_freed_memory_for_its_next_chunks(tmp_path):
    """glibc's thresholds (:mod:`hwtrace.cli._malloc`) are set once a
    view's input is open, inside the command; not before, not elsewhere."""
    import platform

    import pytest
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    from conftest import record_static_program
    b = record_static_program(tmp_path, "int main(void) { return 0; }\n")
    if b is None:
        pytest.skip("no static program recorded here")
    assert _malloc_done("summary", tmp_path / "none") == "False"   # no input
    assert _malloc_done("summary", b) == "True"

"""Stop a recording any time (issue 17): Ctrl-C (SIGINT to the whole
process group, as a terminal sends it), SIGTERM or the end of --duration
end a never-ending program and write a complete bundle that libipt decodes
to exactly the instructions observed; --pid attaches (ptrace) and detaches,
leaving the program running; a SIGKILLed hwtrace leaves what ``hwtrace
recover`` needs. Working files live in the output directory and are gone
once the bundle is written: nothing is left in $TMPDIR."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_hwtrace
from test_faults import SOURCES, _alive, _gone, _wait_pid_file
from test_record import decode_bundle

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v qemu-x86_64 && command -v gcc"],
                   capture_output=True).returncode != 0, reason="needs qemu-user and gcc")

BUNDLE_FILES = {"manifest.json", "sideband.jsonl"}


# handles SIGINT (and goes on), writes its pid to argv[1], computes forever
STUBBORN = r"""
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static volatile int hits;
__attribute__((noinline)) static void on_int(int s) { hits++; }
int main(int argc, char **argv) {
  signal(SIGINT, on_int);
  FILE *f = fopen(argv[1], "w"); fprintf(f, "%d\n", getpid()); fclose(f);
  volatile unsigned long s = 0;
  for (;;) { for (int i = 0; i < 20000; i++) s += i % 7; usleep(2000); }
}
"""


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    d = tmp_path_factory.mktemp("stopprogs")
    for name, src in (("loop", SOURCES["loop"]), ("stubborn", STUBBORN)):
        (d / f"{name}.c").write_text(src)
        subprocess.run(["gcc", "-O1", "-o", str(d / name), str(d / f"{name}.c")], check=True)
    return d


@pytest.fixture(scope="module")
def loop(progs):
    """Writes its pid to argv[1], then computes forever."""
    return progs / "loop"


@pytest.fixture
def tmpdir_env(tmp_path):
    t = tmp_path / "tmpdir"
    t.mkdir()
    return t, {**os.environ, "TMPDIR": str(t)}


def _start(args, env, **kw):
    """hwtrace in a process group of its own, as a shell runs a job."""
    return subprocess.Popen([sys.executable, "-m", "hwtrace", *map(str, args)], cwd=REPO,
                            env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _finish(rec, timeout=300):
    try:
        out, err = rec.communicate(timeout=timeout)
    finally:
        if rec.poll() is None:
            os.killpg(rec.pid, signal.SIGKILL)
            rec.wait()
    return out, err


def _only_bundle(b: Path, man) -> None:
    """The bundle's files and nothing else (no buffers, logs, device file)."""
    want = BUNDLE_FILES | {s["file"] for s in man["streams"]}
    if man.get("images"):
        want.add("images")          # e.g. the [vdso] the stepper saved
    assert {p.name for p in b.iterdir()} == want


@pytest.mark.parametrize("engine", ["qemu", "ptrace"])
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stop_a_never_ending_program(tmp_path, tmpdir_env, loop, ptoracle, engine, how):
    tmpdir, env = tmpdir_env
    b, pidf = tmp_path / "b", tmp_path / "pid"
    rec = _start(["record", "--engine", engine, "-o", b, "--", loop, pidf], env)
    pid = None
    try:
        pid = _wait_pid_file(pidf, rec)
        if how == "ctrl-c":
            os.killpg(rec.pid, signal.SIGINT)       # hwtrace and the program: the job
        else:
            os.kill(rec.pid, signal.SIGTERM)        # hwtrace only
        out, err = _finish(rec)
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert rec.returncode == (130 if how == "ctrl-c" else 143), err
    assert _gone(pid), "the traced program outlived the recording"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hwtrace: wrote {b}: ") \
        and "nothing lost" in lines[0] and "stopped by SIG" in lines[0], err
    man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 10_000
    assert man["recording"]["stop"] == ("SIGINT" if how == "ctrl-c" else "SIGTERM")
    _only_bundle(b, man)
    assert list(tmpdir.iterdir()) == []


@pytest.mark.parametrize("secs", ["0.5", "0"])
def test_duration_ends_the_recording(tmp_path, tmpdir_env, loop, ptoracle, secs):
    """--duration under QEMU: the clock starts when QEMU has loaded the
    program and its first thread is traced, so even a zero duration (or a
    QEMU start-up slower than the duration, on a loaded machine) records
    the program's start rather than an empty bundle."""
    tmpdir, env = tmpdir_env
    b, pidf = tmp_path / "b", tmp_path / "pid"
    rec = _start(["record", "--duration", secs, "--mode", "thread", "-o", b, "--", loop, pidf],
                 env)
    out, err = _finish(rec)
    assert rec.returncode == 0, err
    assert "stopped after --duration: the program was killed" in err
    man, res = decode_bundle(ptoracle, b)
    assert man["recording"]["stop"] == "duration"
    _only_bundle(b, man)
    assert list(tmpdir.iterdir()) == []
    # the program's one stream and pid from the bundle (the pid file too, if
    # the program got that far before the duration's end)
    assert len(man["streams"]) == 1
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 0
    pids = {s["pid"] for s in man["streams"]}
    if pidf.exists():
        assert int(pidf.read_text()) in pids
    assert all(_gone(p) for p in pids)


def test_attach_with_ptrace_and_detach(tmp_path, tmpdir_env, loop, ptoracle):
    """record --pid: the ptrace engine attaches, --duration's end detaches,
    and the program runs on; the QEMU engine says in one line it can't."""
    tmpdir, env = tmpdir_env
    pidf = tmp_path / "pid"
    prog = subprocess.Popen([str(loop), str(pidf)])
    try:
        pid = _wait_pid_file(pidf, prog)
        r = run_hwtrace("record", "--engine", "qemu", "--pid", pid, "-o", tmp_path / "q", env=env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "qemu engine cannot attach" in r.stderr and "--engine ptrace" in r.stderr
        assert not (tmp_path / "q").exists()
        r = run_hwtrace("record", "--pid", pid, "--duration", "0.5", "-o", tmp_path / "b",
                        env=env)
        assert r.returncode == 0, r.stderr
        assert f"detached from pid {pid}, which runs on" in r.stderr
        assert _alive(pid) and prog.poll() is None
        man, res = decode_bundle(ptoracle, tmp_path / "b")
        assert man["engine_info"] == {"source": "ptrace"}
        assert sum(v[0]["instructions_observed"] for v in res.values()) > 1000
        _only_bundle(tmp_path / "b", man)
    finally:
        prog.kill()
        prog.wait()
    assert list(tmpdir.iterdir()) == []


def test_sigkilled_recorder_leaves_what_recover_needs(tmp_path, tmpdir_env, loop, ptoracle):
    tmpdir, env = tmpdir_env
    b, pidf = tmp_path / "b", tmp_path / "pid"
    rec = _start(["record", "-o", b, "--", loop, pidf], env)
    pid = None
    try:
        pid = _wait_pid_file(pidf, rec)
        rec.kill()
        _finish(rec)
        assert _gone(pid), "the traced program outlived its recorder"
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert list(tmpdir.iterdir()) == []            # all of it is in -o
    assert not (b / "manifest.json").exists()
    assert list(b.glob("hwtrace-xlog-*/exec.xlog"))
    r = run_hwtrace("record", "-o", b, "--", "/bin/true", env=env)
    assert r.returncode == 2 and "unfinished recording" in r.stderr and "recover" in r.stderr
    r = run_hwtrace("info", b, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "unfinished recording" in r.stderr and f"hwtrace recover {b}" in r.stderr
    r = run_hwtrace("recover", b, env=env)
    assert r.returncode == 0, r.stderr
    man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 10_000
    assert not (b / "device.json").exists() and not list(b.glob("buf-*"))
    assert list(tmpdir.iterdir()) == []


def test_failed_start_leaves_nothing(tmp_path, tmpdir_env):
    tmpdir, env = tmpdir_env
    r = run_hwtrace("record", "-o", tmp_path / "b", "--", tmp_path / "nope", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "b").exists()
    assert list(tmpdir.iterdir()) == []


def test_ctrl_c_at_a_terminal(tmp_path, progs, ptoracle):
    """A real terminal's Ctrl-C (a pty: the tty driver signals the whole
    foreground process group) on a program that handles SIGINT and goes on:
    hwtrace stops, the program is killed, and the trace ends where Ctrl-C
    was pressed -- the program's handler, run after it, is not in it."""
    import pty
    import select
    from test_record import symbol
    b, pidf = tmp_path / "b", tmp_path / "pid"
    pid = None
    child, fd = pty.fork()
    if child == 0:                          # hwtrace, as a shell would run it
        try:
            os.chdir(REPO)
            os.execv(sys.executable, [sys.executable, "-m", "hwtrace", "record", "-o", str(b),
                                      "--", str(progs / "stubborn"), str(pidf)])
        finally:
            os._exit(127)
    said = b""
    try:
        end = time.monotonic() + 300
        while not (pidf.exists() and pidf.read_text().endswith("\n")):
            assert time.monotonic() < end, "the traced program never started"
            if select.select([fd], [], [], 0.1)[0]:
                said += os.read(fd, 4096)
        pid = int(pidf.read_text())
        os.write(fd, b"\x03")                 # Ctrl-C
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            said += data
        _, st = os.waitpid(child, 0)
        child = None
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        os.close(fd)
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert os.waitstatus_to_exitcode(st) == 130, said
    assert _gone(pid)
    assert b"stopped by SIGINT: the program was killed" in said
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    assert man["recording"]["stop"] == "SIGINT"
    from test_record import load_base
    handler = load_base(b, progs / "stubborn") + symbol(progs / "stubborn", "on_int")[0]
    ips = [ip for v in res.values() for ip in v[1]]
    assert len(ips) > 10_000 and handler not in ips


def test_signal_sent_like_timeout_to_a_program_with_a_handler(tmp_path, tmpdir_env, progs, ptoracle):
    """``timeout -s INT`` (or a ``kill`` of the job) signals hwtrace, then
    its whole process group: an ordinary kill, not the terminal's, reaches a
    program that handles SIGINT. The plugin stops logging before the
    handler runs (the trace holds no signal delivery: the compiled
    generator applies), and the duplicate signal hwtrace gets is the same
    stop, not a second one abandoning the bundle."""
    from test_record import load_base, symbol
    _, env = tmpdir_env
    b, pidf = tmp_path / "b", tmp_path / "pid"
    rec = _start(["record", "-o", b, "--", progs / "stubborn", pidf], env)
    pid = None
    try:
        pid = _wait_pid_file(pidf, rec)
        os.kill(rec.pid, signal.SIGINT)             # timeout: the child...
        os.killpg(rec.pid, signal.SIGINT)           # ... then the whole group
        out, err = _finish(rec)
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert rec.returncode == 130, err
    assert _gone(pid)
    assert "stopped by SIGINT: the program was killed" in err, err
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    assert man["recording"]["stop"] == "SIGINT"
    if os.environ.get("HWTRACE_NO_EXTENSIONS") != "1":
        assert man["recording"]["generator"] == "compiled"   # no signal delivery in the log
    handler = load_base(b, progs / "stubborn") + symbol(progs / "stubborn", "on_int")[0]
    ips = [ip for v in res.values() for ip in v[1]]
    assert len(ips) > 10_000 and handler not in ips



# sends itself SIGINT with kill(2) (SI_USER, like an outside kill) and handles it
SELF_KILL = r"""
#include <signal.h>
#include <unistd.h>
static volatile int hits;
__attribute__((noinline)) static void on_int(int s) { hits++; }
int main(void) {
  signal(SIGINT, on_int);
  kill(getpid(), SIGINT);
  return hits == 1 ? 0 : 3;
}
"""


def test_a_signal_the_program_sends_itself_is_traced(tmp_path, ptoracle):
    """Only a kill from outside the program stops the logging: one a
    process of the program sends is the program's, recorded with its
    handler, and the recording runs to the program's end."""
    from test_record import load_base, symbol
    src, exe, b = tmp_path / "selfkill.c", tmp_path / "selfkill", tmp_path / "b"
    src.write_text(SELF_KILL)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    r = run_hwtrace("record", "-o", b, "--", exe, cwd=REPO)
    assert r.returncode == 0, r.stderr
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    assert "stop" not in man["recording"] or man["recording"]["stop"] is None, man["recording"]
    handler = load_base(b, exe) + symbol(exe, "on_int")[0]
    assert handler in [ip for v in res.values() for ip in v[1]]

class _Dev:
    def __init__(self):
        self.stop_reason = None

    def request_stop(self, reason):
        self.stop_reason = reason


def test_steering_takes_a_prompt_duplicate_signal_as_the_same_stop():
    from hwtrace.cli._stop import DUPLICATE_WINDOW, Steering
    now = [100.0]
    st = Steering(_Dev(), can_snapshot=True)
    st.clock = lambda: now[0]
    st._handle(signal.SIGINT, None)
    assert st._dev.stop_reason == "SIGINT"
    now[0] += DUPLICATE_WINDOW / 10
    st._handle(signal.SIGINT, None)                 # the group-wide copy
    with pytest.raises(KeyboardInterrupt):          # another signal: a second request
        st._handle(signal.SIGTERM, None)
    now[0] += DUPLICATE_WINDOW
    with pytest.raises(KeyboardInterrupt):          # a person's second Ctrl-C
        st._handle(signal.SIGINT, None)


def test_steering_takes_the_signal_the_engine_reported_as_the_same_stop():
    # the plugin saw the SIGINT reach the program and the engine asked for
    # the stop before hwtrace's own handler ran
    from hwtrace.cli._stop import Steering
    dev = _Dev()
    dev.request_stop("SIGINT")
    st = Steering(dev, can_snapshot=True)
    st._handle(signal.SIGINT, None)
    st.writing()
    with pytest.raises(KeyboardInterrupt):
        st._handle(signal.SIGTERM, None)

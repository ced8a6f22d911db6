"""Faults while recording (``hwtrace record``, QEMU engine): what was
captured until the fault is on disk and decodes with libipt (ptoracle),
and no traced process is left stopped or orphaned.

Covered here: the traced program segfaults (no handler), dies of SIGFPE,
SIGILL or abort(); it is SIGKILLed from outside mid-trace (and keeps every
record up to the kill); the recorder itself is SIGKILLed mid-trace.
Covered in other files (not repeated): a program that SIGKILLs itself
(test_record.py::test_killed_program_keeps_its_trace), forks and execs
(test_record.py::test_fork_exec), threads starting/exiting mid-trace
(test_record.py::test_threads), a handled fault
(test_record.py::test_faulting_instruction_retires_once), stop-on-full
never overwritten (test_record_buffers.py, test_control_emulated.py), a
SIGKILLed collector recovered with ``hwtrace recover``
(test_recover.py), the stepper killed with its tracee
(test_stepper.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, build_programs, run_hwtrace
from test_record import decode_bundle, load_base

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")

SOURCES = {
    "segv": r"""
        #include <stdio.h>
        __attribute__((noinline)) int f(int *p, int n) { int s = 0; for (int i = 0; i < n; i++) s += i; return s + *p; }
        int main(void) { printf("%d\n", f(0, 1000)); return 0; }
    """,
    # divides by zero (argc - 1 == 0): a guest CPU exception, no host fault
    "fpe": r"""
        #include <stdio.h>
        __attribute__((noinline)) int f(int d, int n) { int s = 0; for (int i = 0; i < n; i++) s += i; return s / d; }
        int main(int argc, char **argv) { printf("%d\n", f(argc - 1, 1000)); return 0; }
    """,
    # ud2 (__builtin_trap) after the loop: SIGILL, a guest CPU exception
    "ill": r"""
        #include <stdio.h>
        __attribute__((noinline)) int f(int n) { int s = 0; for (int i = 0; i < n; i++) s += i; if (n > 5) __builtin_trap(); return s; }
        int main(int argc, char **argv) { printf("%d\n", f(1000 + argc)); return 0; }
    """,
    # abort() after the loop: SIGABRT raised by the program itself
    "abrt": r"""
        #include <stdio.h>
        #include <stdlib.h>
        __attribute__((noinline)) int f(int n) { int s = 0; for (int i = 0; i < n; i++) s += i; if (n > 5) abort(); return s; }
        int main(int argc, char **argv) { printf("%d\n", f(1000 + argc)); return 0; }
    """,
    # counts its iterations in a shared file (a store, no system call:
    # nothing makes the plugin flush), sleeping between them
    "counter": r"""
        #include <fcntl.h>
        #include <stdio.h>
        #include <sys/mman.h>
        #include <unistd.h>
        volatile unsigned long sink;
        __attribute__((noinline)) void tick(unsigned long i) { for (int k = 0; k < 50; k++) sink += i ^ k; }
        int main(int argc, char **argv) {
          int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
          if (fd < 0 || ftruncate(fd, 4096) != 0) return 1;
          volatile unsigned long *done = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          if (done == MAP_FAILED) return 1;
          FILE *f = fopen(argv[2], "w"); fprintf(f, "%d\n", getpid()); fclose(f);
          for (unsigned long i = 1;; i++) { tick(i); *done = i; usleep(500); }
        }
    """,
    # writes its pid, then computes forever (killed by the test)
    "loop": r"""
        #include <stdio.h>
        #include <unistd.h>
        int main(int argc, char **argv) {
          FILE *f = fopen(argv[1], "w"); fprintf(f, "%d\n", getpid()); fclose(f);
          volatile unsigned long s = 0;
          for (;;) { for (int i = 0; i < 20000; i++) s += i % 7; usleep(2000); }
        }
    """,
}


@pytest.fixture(scope="module")
def fprogs(tmp_path_factory):
    return build_programs(tmp_path_factory.mktemp("faultprogs"), SOURCES)


def _wait_pid_file(p: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.exists() and p.read_text().endswith("\n"):
            return int(p.read_text())
        if proc.poll() is not None:
            raise AssertionError(f"recorder ended early: {proc.returncode}")
        time.sleep(0.1)
    raise AssertionError("the traced program never started")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int, timeout: float = 30) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_program_segfault_keeps_its_trace(tmp_path, ptoracle, fprogs):
    """An unhandled SIGSEGV ends the program (status 128+11); every
    instruction up to the fault is in the bundle and decodes."""
    b = tmp_path / "segv"
    r = run_hwtrace("record", "-o", b, "--", fprogs["segv"])
    assert r.returncode == 128 + signal.SIGSEGV, r.stderr
    man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 1000


def _insn_in(exe: Path, func: str, mnemonic: str) -> int:
    """The link-time address of the first ``mnemonic`` instruction of
    ``func`` (objdump's view)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-w", str(exe)],
                         capture_output=True, text=True, check=True).stdout
    inside = False
    for line in out.splitlines():
        if line.endswith(">:"):
            inside = line.endswith(f"<{func}>:")
        elif inside and ":" in line:
            addr, _, text = line.partition(":")
            if text.split() and text.split()[0] == mnemonic:
                return int(addr, 16)
    raise AssertionError(f"no {mnemonic} in {func}")


@pytest.mark.parametrize("prog,sig", [
    (pytest.param("fpe", signal.SIGFPE, id="fpe")),     # divide error
    (pytest.param("ill", signal.SIGILL, id="ill")),     # ud2: #UD, a fault
    (pytest.param("abrt", signal.SIGABRT, id="abrt")),  # abort(): raise -> tgkill
])
def test_program_fatal_signal_keeps_its_trace(tmp_path, ptoracle, fprogs, prog, sig):
    """An uncaught fatal signal that involves no host fault in QEMU ends
    the program (status 128+sig) with QEMU killing itself, without the
    plugin's exit callback: the trace up to the instruction that raised it
    is in the bundle (the buffered records came from the buffer file) and
    decodes exactly."""
    b = tmp_path / prog
    exe = fprogs[prog]
    r = run_hwtrace("record", "--mode", "thread", "-o", b, "--", exe)
    assert r.returncode == 128 + sig, r.stderr
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    ((s, ips, events),) = res.values()
    assert s["instructions_observed"] > 1000
    base = load_base(b, exe)
    loop = base + _insn_in(exe, "f", "add")
    assert ips.count(loop) == 1000 + (prog != "fpe")    # f's loop, whole
    ends = [e["at"] for e in events if e.get("event") == "async_disabled"]
    if prog == "fpe":
        # the divide error is in the middle of a block (cltd; idiv; ret):
        # the trace ends where it happened, FUP at the idiv, which did not
        # retire, after the cltd before it
        idiv = base + _insn_in(exe, "f", "idiv")
        assert ips[-1] == base + _insn_in(exe, "f", "cltd") and idiv not in ips
        assert ends[-1] == idiv
    elif prog == "ill":
        # ud2 faults (#UD) and does not retire: the trace ends before it
        assert ips[-1] == base + _insn_in(exe, "f", "jg")
        assert base + _insn_in(exe, "f", "ud2") not in ips
        assert ends[-1] == base + _insn_in(exe, "f", "ud2")
    else:
        assert base + _insn_in(exe, "f", "call") in ips


def test_program_sigkilled_keeps_every_record(tmp_path, ptoracle, fprogs):
    """SIGKILL from outside while the program computes and sleeps (no
    system call that makes the plugin flush): every record up to the kill
    is kept, so each iteration the program finished (its count, stored in
    a shared file) entered tick() in the trace, and at most one more did."""
    b = tmp_path / "killed"
    pidf, countf = tmp_path / "pid", tmp_path / "count"
    exe = fprogs["counter"]

    def counted():
        end = time.monotonic() + 120
        while _count(countf) < 300 and time.monotonic() < end:
            time.sleep(0.05)

    _record_and_kill_program(b, "--mode", "thread", argv=[exe, countf, pidf], pid_file=pidf,
                             until=counted)
    done = _count(countf)
    assert done >= 300
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    ((s, ips, _),) = res.values()
    tick = load_base(b, exe) + _symbol(exe, "tick")
    assert done <= ips.count(tick) <= done + 1


def _record_and_kill_program(b: Path, *options, argv, pid_file: Path, until) -> None:
    """``hwtrace record *options -o b -- *argv``; once the program has
    written its pid to ``pid_file`` and ``until()`` has returned, SIGKILL
    it from outside: the recorder exits as the program did, and the
    program is gone."""
    rec = subprocess.Popen([sys.executable, "-m", "hwtrace", "record", *options, "-o", str(b),
                            "--", *map(str, argv)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        pid = _wait_pid_file(pid_file, rec)
        until()
        os.kill(pid, signal.SIGKILL)
        _out, err = rec.communicate(timeout=300)
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    assert rec.returncode == 128 + signal.SIGKILL, err
    assert _gone(pid)


def _count(p: Path) -> int:
    try:
        return int.from_bytes(p.read_bytes()[:8], "little")
    except FileNotFoundError:
        return 0


def _symbol(exe: Path, name: str) -> int:
    from elftools.elf.elffile import ELFFile
    with open(exe, "rb") as f:
        (sym,) = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name(name)
        return sym["st_value"]


def test_program_sigkilled_from_outside_keeps_its_trace(tmp_path, ptoracle, fprogs):
    b = tmp_path / "killed"
    pidf = tmp_path / "pid"
    _record_and_kill_program(b, argv=[fprogs["loop"], pidf], pid_file=pidf,
                             until=lambda: time.sleep(0.5))
    man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 20_000


def test_recorder_sigkilled_mid_trace(tmp_path, ptoracle, fprogs):
    """The recorder dies mid-trace: the traced program does not outlive it,
    and what was captured is on disk and decodes after ``hwtrace recover``."""
    b = tmp_path / "rk"
    pidf = tmp_path / "pid"
    rec = subprocess.Popen([sys.executable, "-m", "hwtrace", "record", "-o", str(b), "--",
                            str(fprogs["loop"]), str(pidf)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    pid = None
    xlog = None
    try:
        pid = _wait_pid_file(pidf, rec)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        xlog = next((Path(a.split(b"out=", 1)[1].decode()).parent for a in cmd
                     if b"out=" in a), None)
        time.sleep(0.5)
        rec.kill()
        rec.wait()
        orphan = not _gone(pid, timeout=2)
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)        # clean up what the recorder left
            _gone(pid)
            if xlog is not None and xlog.name.startswith("hwtrace-xlog-"):
                shutil.rmtree(xlog, ignore_errors=True)   # the orphan's growing log
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    assert not orphan, "traced program left running after the recorder died"
    if not (b / "manifest.json").exists():
        r = run_hwtrace("recover", b)
        assert r.returncode == 0, r.stderr
    man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 20_000


def test_recorder_sigkilled_leaves_no_orphan(tmp_path, fprogs):
    """The recorder is SIGKILLed mid-trace: the traced QEMU dies with it
    (it does not keep running and growing its log), and the execution log
    written so far is inside the -o directory, not lost in /tmp."""
    b = tmp_path / "rk"
    pidf = tmp_path / "pid"
    rec = subprocess.Popen([sys.executable, "-m", "hwtrace", "record", "-o", str(b), "--",
                            str(fprogs["loop"]), str(pidf)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    pid = None
    try:
        pid = _wait_pid_file(pidf, rec)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        logs = [Path(a.split(b"out=", 1)[1].decode()) for a in cmd if b"out=" in a]
        time.sleep(0.5)
        rec.kill()
        rec.wait()
        gone = _gone(pid, timeout=10)
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
            _gone(pid)
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    assert gone, "traced program left running after the recorder died"
    assert len(logs) == 1
    assert logs[0].parent.parent == b and logs[0].parent.name.startswith("hwtrace-xlog-")
    assert logs[0].is_file() and logs[0].stat().st_size > 0


def test_record_success_leaves_no_execution_log(tmp_path, fprogs):
    """On success the temporary execution log kept in -o is removed."""
    b = tmp_path / "ok"
    r = run_hwtrace("record", "-o", b, "--", "/bin/true")
    assert r.returncode == 0, r.stderr
    assert (b / "manifest.json").is_file()
    assert not list(b.glob("hwtrace-xlog-*"))


def test_output_path_unusable_is_one_line(tmp_path):
    """An -o whose parent is a file (stat fails): one line, exit 2."""
    f = tmp_path / "afile"
    f.write_text("x")
    r = run_hwtrace("record", "-o", f / "out", "--", "/bin/true")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr == f"hwtrace: {f / 'out'}: Not a directory\n"


@pytest.mark.parametrize("engine,what", [("qemu", "QEMU plugin"), ("ptrace", "ptrace stepper")])
def test_build_cache_unusable_is_one_line(tmp_path, engine, what):
    """The plugin/stepper build cache can't be created: one line, exit 2."""
    f = tmp_path / "cachefile"
    f.write_text("x")
    r = run_hwtrace("record", "--engine", engine, "-o", tmp_path / "out", "--", "/bin/true",
                    env={"XDG_CACHE_HOME": str(f)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"hwtrace: the {what} cache {f / 'hwtrace'}: "), r.stderr

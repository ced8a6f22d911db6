"""Snapshots (issue 17): ``record --trigger FUNC`` records into circular
buffers and saves them when FUNC is first entered -- the trace ends with
FUNC's first instruction, as libipt decodes it, and the program runs on to
its own end untraced; FUNC may be in a shared library (resolved when it
loads). SIGUSR2 to hwtrace takes a snapshot of a running program; a
program that dies of a signal leaves the path that led to the crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_hwtrace
from test_faults import SOURCES, _alive, _gone, _wait_pid_file
from test_record import decode_bundle, load_base, symbol

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v qemu-x86_64 && command -v gcc"],
                   capture_output=True).returncode != 0, reason="needs qemu-user and gcc")

# a long loop, then a NULL dereference: more trace than the ring holds
SEGV = r"""
#include <stdio.h>
__attribute__((noinline)) int f(int *p, int n) { int s = 0; for (int i = 0; i < n; i++) s += i; return s + *p; }
int main(void) { printf("%d\n", f(0, 100000)); return 0; }
"""

FIB = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) static unsigned long fib(unsigned n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
__attribute__((noinline)) static void report(unsigned n, unsigned long v) { printf("fib(%u) = %lu\n", n, v); }
int main(int argc, char **argv) { unsigned n = atoi(argv[1]); report(n, fib(n)); return 0; }
"""


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    d = tmp_path_factory.mktemp("trig")
    out = {}
    for name, src in (("fib", FIB), ("segv", SEGV), ("counter", SOURCES["counter"])):
        (d / f"{name}.c").write_text(src)
        subprocess.run(["gcc", "-O1", "-o", str(d / name), str(d / f"{name}.c")], check=True)
        out[name] = d / name
    return out


def _last_ip(ptoracle, b):
    """(stream entry, last decoded IP) of the stream that holds instructions
    after the others' last ones (by its TSC-ordered end: the trigger's)."""
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    ends = [(v[1][-1], v[0]) for v in res.values() if v[1]]
    return man, res, ends


def _elf_symbol_in(bundle, path_end, name):
    """The address ``name`` (a function of the mapped file ending in
    ``path_end``) had in the traced process."""
    from elftools.elf.elffile import ELFFile
    for line in (bundle / "sideband.jsonl").read_text().splitlines():
        o = json.loads(line)
        if o["type"] == "mmap" and o["file"].endswith(path_end):
            path = o["file"]
            break
    else:
        raise AssertionError(f"no mapping of *{path_end}")
    from pathlib import Path
    base = load_base(bundle, Path(path))
    with open(path, "rb") as f:
        e = ELFFile(f)
        for sec in (".symtab", ".dynsym"):
            s = e.get_section_by_name(sec)
            if s is not None:
                for sym in s.get_symbol_by_name(name) or ():
                    if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"]:
                        return base + sym["st_value"]
    raise AssertionError(f"no function {name} in {path}")


def test_trigger_ends_the_trace_at_the_function_entry(tmp_path, progs, ptoracle):
    b = tmp_path / "b"
    r = run_hwtrace("record", "--trigger", "fib", "-o", b, "--", progs["fib"], "25")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "fib(25) = 75025\n"          # the program ran on to its end
    assert "snapshot: trigger fib entered" in r.stderr
    man, res, ends = _last_ip(ptoracle, b)          # exactly instructions_observed each
    entry = load_base(b, progs["fib"]) + symbol(progs["fib"], "fib")[0]
    assert [ip for ip, _ in ends] == [entry]        # only one stream ran: it ends at fib
    (s,) = [s for _, s in ends]
    assert s["config"]["is_circular"] and not s["wrapped"]
    # fib's first instruction appears once: the trace ends at its first entry
    assert sum(v[1].count(entry) for v in res.values()) == 1
    assert man["recording"]["snapshot"].startswith("trigger fib entered")
    assert man["recording"]["status"] == 0


def test_trigger_in_a_shared_library(tmp_path, progs, ptoracle):
    b = tmp_path / "b"
    r = run_hwtrace("record", "--trigger", "printf", "--mode", "thread", "-o", b, "--",
                    progs["fib"], "20")
    assert r.returncode == 0 and r.stdout == "fib(20) = 6765\n", r.stderr
    man, res, ends = _last_ip(ptoracle, b)
    ((ip, s),) = ends
    assert ip == _elf_symbol_in(b, "/libc.so.6", "printf")
    # fib ran before printf was entered: all of it is in the trace
    fib = load_base(b, progs["fib"]) + symbol(progs["fib"], "fib")[0]
    assert res[s["file"]][1].count(fib) == 2 * 10946 - 1


def test_sigusr2_takes_a_snapshot_and_the_program_runs_on(tmp_path, progs, ptoracle):
    b, pidf, done = tmp_path / "b", tmp_path / "pid", tmp_path / "done"
    rec = subprocess.Popen([sys.executable, "-m", "hwtrace", "record", "-o", str(b), "--",
                            str(progs["counter"]), str(done), str(pidf)], cwd=REPO,
                           start_new_session=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = _wait_pid_file(pidf, rec)
        os.kill(rec.pid, signal.SIGUSR2)
        end = time.monotonic() + 300
        while not (b / "manifest.json").exists() and rec.poll() is None \
                and time.monotonic() < end:
            time.sleep(0.05)
        assert (b / "manifest.json").exists(), "no snapshot"
        snap = {s["file"]: (b / s["file"]).read_bytes()
                for s in json.loads((b / "manifest.json").read_text())["streams"]}
        # the program goes on (untraced) after the snapshot: its counter moves
        at = int.from_bytes(done.read_bytes()[:8], "little")
        while int.from_bytes(done.read_bytes()[:8], "little") == at and _alive(pid):
            time.sleep(0.05)
        assert _alive(pid) and rec.poll() is None
        os.killpg(rec.pid, signal.SIGINT)
        out, err = rec.communicate(timeout=300)
    finally:
        if rec.poll() is None:
            os.killpg(rec.pid, signal.SIGKILL)
            rec.wait()
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert rec.returncode == 130, err
    assert _gone(pid)
    man, res = decode_bundle(ptoracle, b)
    assert {f: (b / f).read_bytes() for f in snap} == snap     # unchanged since
    assert man["recording"]["snapshot"] == "SIGUSR2" and man["recording"]["stop"] == "SIGINT"
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 1000
    assert err.count("hwtrace: wrote") == 1 and "snapshot: SIGUSR2" in err


def test_a_crash_is_the_end_of_the_ring(tmp_path, progs, ptoracle):
    """No trigger entered, the program dies of SIGSEGV: the ring holds the
    path that led to the crash, ending in the crashing function."""
    b = tmp_path / "b"
    r = run_hwtrace("record", "--trigger", "never_called", "--buffer-size", "8K",
                    "--mode", "thread", "-o", b, "--", progs["segv"])
    assert r.returncode == 128 + signal.SIGSEGV, r.stderr
    assert "the program died of SIGSEGV" in r.stderr and "never entered" in r.stderr
    (s,) = json.loads((b / "manifest.json").read_text())["streams"]
    assert s["wrapped"] and "circular buffer wrapped" in r.stderr
    images = run_hwtrace("images", b, "--pt", s["file"]).stdout.split()
    o = subprocess.run([str(ptoracle), "insn", str(b / s["file"]), *images],
                       capture_output=True, text=True, check=True).stdout.splitlines()
    assert not [x for x in o if '"error"' in x]
    ips = [json.loads(x)["ip"] for x in o if x.startswith('{"ip"')]
    f, size = symbol(progs["segv"], "f")
    f += load_base(b, progs["segv"])
    assert len(ips) > 1000 and f <= ips[-1] < f + size


def test_trigger_needs_the_qemu_engine(tmp_path, progs):
    r = run_hwtrace("record", "--engine", "ptrace", "--trigger", "fib", "-o", tmp_path / "b",
                    "--", progs["fib"], "3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "qemu engine" in r.stderr
    assert not (tmp_path / "b").exists()

"""Processes a program leaves behind: a child it killed and never waited
for, and children that still run when it exits.  The ptrace engine follows
every traced process to its end; the QEMU engine waited for the first
process only, so a child that outlived it was missing from the recording,
and a child a signal killed, if nobody waited for it, had ``status 0``
("exit status 0" in ``info``).  Now the recorder is the subreaper of the
QEMU run: the orphans are handed to it, it waits for them, and it sees how
each ended; a stop meanwhile kills them."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from conftest import build_programs, run_hwtrace
from test_faults import _alive, _gone, _wait_pid_file
from test_record import decode_bundle
from test_record_stop import _finish, _start

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v qemu-x86_64 && command -v gcc"],
                   capture_output=True).returncode != 0, reason="needs qemu-user and gcc")

# kills its child (once it runs) and exits without waiting for it
KILLED_C = r"""
#include <signal.h>
#include <unistd.h>
int main(void) {
    int p[2];
    char c;
    if (pipe(p)) return 1;
    pid_t k = fork();
    if (k == 0) { write(p[1], "x", 1); for (;;) pause(); }
    read(p[0], &c, 1);
    kill(k, SIGKILL);
    return 3;
}
"""

# exits at once; its child, handed on, sleeps, works, and exits 5
LEFT_C = r"""
#include <unistd.h>
__attribute__((noinline)) int work(int i) { return i * 7 + 1; }
int main(void) {
    if (fork() == 0) {
        usleep(300000);
        volatile int s = 0;
        for (int i = 0; i < 1000; i++) s += work(i);
        return 5;
    }
    return 3;
}
"""

# exits at once; its child writes its pid to argv[1] and sleeps forever
# (not computing: a recorder that lost it would leave it logging, and a
# computing one logs hundreds of MB a second)
FOREVER_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (fork() == 0) {
        FILE *f = fopen(argv[1], "w");
        fprintf(f, "%d\n", getpid());
        fclose(f);
        for (;;) sleep(1);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    return build_programs(tmp_path_factory.mktemp("orphans"),
                          {"killed": KILLED_C, "left": LEFT_C, "forever": FOREVER_C})


def _statuses(b) -> list:
    d = json.loads(run_hwtrace("info", b, "--json", check=True).stdout)
    return sorted(p["exit_status"] for p in d["processes"])


@pytest.mark.parametrize("engine", ["qemu", "ptrace"])
def test_a_child_killed_and_never_waited_for_was_killed(tmp_path, progs, engine):
    b = tmp_path / "b"
    r = run_hwtrace("record", "--engine", engine, "-o", b, "--", progs["killed"])
    assert r.returncode == 3, r.stderr
    assert _statuses(b) == [-9, 3]
    assert "killed by SIGKILL" in run_hwtrace("info", b, check=True).stdout


@pytest.mark.parametrize("engine", ["qemu", "ptrace"])
def test_a_child_that_outlives_the_program_is_traced_to_its_end(tmp_path, progs,
                                                               ptoracle, engine):
    b = tmp_path / "b"
    r = run_hwtrace("record", "--engine", engine, "-o", b, "--", progs["left"])
    assert r.returncode == 3, r.stderr
    assert _statuses(b) == [3, 5]
    # its work, after its parent was gone, is in the trace: libipt agrees
    _man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 10_000
    text = run_hwtrace("summary", b, check=True).stdout
    work = [ln.split() for ln in text.splitlines() if ln.startswith("work ")]
    assert work and work[0][1] == "1,000", text


def test_a_stop_kills_the_children_left_running(tmp_path, progs):
    """SIGTERM to the recorder while it waits for a child the program left
    running: the child is killed (no traced process outlives its
    recorder), and the bundle says so."""
    b, pidf = tmp_path / "b", tmp_path / "pid"
    rec = _start(["record", "-o", b, "--", progs["forever"], pidf], dict(os.environ))
    pid = None
    try:
        pid = _wait_pid_file(pidf, rec)
        os.kill(rec.pid, signal.SIGTERM)
        _out, err = _finish(rec, timeout=120)
        gone = _gone(pid)
    finally:
        # whatever happened, nothing of it runs on
        try:
            os.killpg(rec.pid, signal.SIGKILL)      # its process group
        except ProcessLookupError:
            pass
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert rec.returncode == 143, err
    assert gone, "the program's child outlived the recording"
    assert "stopped by SIGTERM" in err, err
    assert _statuses(b) == [-9, 0]

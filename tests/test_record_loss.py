"""Loss is always said (issue 17, the record side): ``hwtrace record`` says
in one line what it wrote -- streams, instructions, bytes, lost data -- and
warns when a stop-on-full buffer filled or a circular one wrapped; the
manifest carries per stream what views need to say so too (lost bytes,
stopped/wrapped, the bytes generated)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import run_hwtrace
from hwtrace.cli._record_report import _bytes

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")

FIB = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) static unsigned long fib(unsigned n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int argc, char **argv) { printf("fib=%lu\n", fib(atoi(argv[1]))); return 0; }
"""


@pytest.fixture(scope="module")
def fib(tmp_path_factory):
    d = tmp_path_factory.mktemp("loss")
    (d / "fib.c").write_text(FIB)
    subprocess.run(["gcc", "-O1", "-o", str(d / "fib"), str(d / "fib.c")], check=True)
    return d / "fib"


def _streams(b):
    return json.loads((b / "manifest.json").read_text())["streams"]


def _libipt_count(ptoracle, b, s):
    images = run_hwtrace("images", b, "--pt", s["file"]).stdout.split()
    o = subprocess.run([str(ptoracle), "insn", str(b / s["file"]), *images, "--summary"],
                       capture_output=True, text=True, check=True)
    return json.loads(o.stdout.splitlines()[-1])


def _on_cpu0(*args):
    """``hwtrace ARGS`` pinned to the first CPU this test may use (the
    traced program inherits the affinity)."""
    cpu = min(os.sched_getaffinity(0))
    return subprocess.run([sys.executable, "-m", "hwtrace", *map(str, args)], capture_output=True,
                          text=True, timeout=600, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def test_stop_on_full_is_said(tmp_path, fib, ptoracle):
    b = tmp_path / "b"
    # on one host CPU: run on two, the program may move and fill both
    # CPUs' buffers (CI saw it once); one filled buffer is what this tests
    r = _on_cpu0("record", "--buffer-size", "4K", "-o", b, "--", fib, "20")
    assert r.returncode == 0 and r.stdout == "fib=6765\n", r.stderr
    (full,) = [s for s in _streams(b) if s["stopped"]]
    assert full["size"] == full["capture_end"] == 4096 and full["lost_bytes"] > 0
    assert full["generated_bytes"] == full["capture_end"] + full["lost_bytes"]
    summary, *warnings = r.stderr.splitlines()
    assert summary.startswith(f"hwtrace: wrote {b}: 2 stream(s), ")
    assert f"{_bytes(full['lost_bytes'])} lost (1 buffer(s) filled)" in summary
    (w,) = warnings
    assert w.startswith(f"hwtrace: warning: {full['file']}: its stop-on-full buffer filled")
    assert f"{_bytes(full['lost_bytes'])} after it were lost" in w
    # what the warning says: a decoder finds fewer instructions than observed
    got = _libipt_count(ptoracle, b, full)
    assert got["errors"] == 0 and 0 < got["insns"] < full["instructions_observed"]


def test_wrapped_circular_buffer_is_said(tmp_path, fib, ptoracle):
    b = tmp_path / "b"
    r = run_hwtrace("record", "--buffer-size", "4K", "--circular", "--mode", "thread",
                    "-o", b, "--", fib, "20")
    assert r.returncode == 0, r.stderr
    (s,) = _streams(b)
    assert s["wrapped"] and not s["stopped"] and s["lost_bytes"] == 0
    assert s["generated_bytes"] > 4096 >= s["size"]
    summary, w = r.stderr.splitlines()
    assert "overwritten (1 circular buffer(s) wrapped)" in summary
    assert w.startswith(f"hwtrace: warning: {s['file']}: its circular buffer wrapped")
    got = _libipt_count(ptoracle, b, s)
    assert got["errors"] == 0 and 0 < got["insns"] < s["instructions_observed"]


def test_a_complete_recording_says_nothing_lost(tmp_path, fib, ptoracle):
    b = tmp_path / "b"
    r = run_hwtrace("record", "-o", b, "--", fib, "15")
    assert r.returncode == 0, r.stderr
    (line,) = r.stderr.splitlines()
    streams = _streams(b)
    insns = sum(s["instructions_observed"] for s in streams)
    assert re.fullmatch(rf"hwtrace: wrote {re.escape(str(b))}: {len(streams)} stream\(s\), "
                        rf"{insns:,} instructions observed, [\d,.]+ (bytes|KiB|MiB); nothing "
                        rf"lost; the program exited with status 0", line), line
    for s in streams:
        assert not (s["stopped"] or s["wrapped"] or s["lost_bytes"])
        assert s["generated_bytes"] == s["size"]
        got = _libipt_count(ptoracle, b, s)
        assert got["errors"] == 0 and got["insns"] == s["instructions_observed"]


def test_decode_of_a_lossy_stream_says_so(tmp_path, fib):
    """``decode DIR`` (and ``branches DIR``) of a stream whose buffer filled (or wrapped) just
    ended (or began) its listing there, and said nothing -- the views and
    coverage say it; decode now warns once per such stream, after its
    output."""
    b = tmp_path / "b"
    run_hwtrace("record", "--buffer-size", "4K", "--mode", "thread", "-o", b, "--", fib, "20",
                check=True)
    (s,) = _streams(b)
    assert s["stopped"]
    want = (f"hwtrace: warning: {s['file']}: recorded with loss: buffer full, tracing "
            f"stopped, {s['lost_bytes']:,} bytes lost\n")
    for cmd in (["decode"], ["decode", "--quiet", "--stat"], ["decode", "--format", "jsonl"],
                ["branches"], ["branches", "--kinds", "all", "--format", "jsonl"]):
        r = run_hwtrace(*cmd, b)
        assert r.returncode == 0 and r.stderr == want, (cmd, r.stderr)
    c = tmp_path / "c"
    run_hwtrace("record", "-o", c, "--", fib, "10", check=True)
    assert run_hwtrace("decode", c, "--quiet", "--stat").stderr == ""
    assert run_hwtrace("branches", c).stderr == ""

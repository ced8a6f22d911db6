"""hwtrace.streams: a bundle's (or a raw trace's) streams with what the
recorder said about them, decoded into batches through the pipeline --
the same counts as ``hwtrace decode --quiet --stat``, both producers."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import IN_CI, run_hwtrace

from hwtrace import streams as S
from hwtrace.flow import batches as B

PROG = r"""
#include <stdio.h>
#include <stdlib.h>
static long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int argc, char **argv) { printf("%ld\n", fib(atoi(argv[1]))); return 0; }
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("streams")
    src = d / "fib.c"
    src.write_text(PROG)
    exe = d / "fib"
    r = subprocess.run(["gcc", "-O1", "-g", "-o", str(exe), str(src)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.fail(r.stderr) if IN_CI else pytest.skip("no gcc")
    out = d / "rec"
    r = run_hwtrace("record", "--mode", "thread", "--config",
                    "branch;user;retc;tsc;mtc;cyc", "-o", out, "--",
                    exe, "12")
    assert r.returncode == 0, r.stderr
    return out


def _stat_counts(bundle):
    r = run_hwtrace("decode", "--quiet", "--stat", bundle)
    assert r.returncode == 0, r.stderr
    return [int(x) for x in re.findall(r"insn: (\d+)\.", r.stdout)]


@pytest.mark.parametrize("impl", ["python", None])
def test_bundle_streams_decode_to_the_cli_counts(bundle, impl):
    ts = S.open_bundle(bundle)
    assert ts.mode == "thread" and ts.streams
    counts = []
    for st in ts.streams:
        assert st.info.tid is not None and st.info.pid is not None
        assert st.entry.size > 0 and not st.entry.lossy
        n = sum(b.ninsn for b in st.batches(impl=impl))
        assert n == st.entry.instructions_observed
        counts.append(n)
    assert counts == _stat_counts(bundle)


def test_view_batches_end_every_branch(bundle):
    ts = S.open_bundle(bundle)
    for st in ts.streams:
        blocks, insns, _items = B.flatten(st.batches(view=True,
                                                     want_insns=True,
                                                     impl="python"))
        counts = blocks["ninsn"].astype("int64")
        ends = counts.cumsum() - 1
        inner = insns["iclass"].copy()
        inner[ends] = 1
        assert (inner == 1).all()


def test_symbols_come_from_the_sideband(bundle):
    ts = S.open_bundle(bundle)
    names = set()
    for st in ts.streams:
        blocks, _i, _items = B.flatten(st.batches(view=True, impl="python"))
        calls = blocks[blocks["iclass"] == 2]
        for ip in set(calls["end_ip"].tolist()):
            r = ts.symbolizer.lookup(int(ip))
            if r:
                names.add(r[1])
    assert "fib" in names and "main" in names


def test_errors_are_one_line(tmp_path):
    with pytest.raises(S.StreamsError, match="nothing: not a directory$"):
        S.open_bundle(tmp_path / "nothing")
    with pytest.raises(S.StreamsError, match="not a directory"):
        S.open_bundle(tmp_path, image_path=[str(tmp_path / "x")])

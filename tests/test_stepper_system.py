"""The stepper's logs through the PT generator: `hwtrace record --engine
ptrace` on real programs gives streams that Debian's libipt (ptoracle)
decodes with zero errors into exactly the instructions the stepper saw."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_hwtrace

sys.path.insert(0, str(Path(__file__).parent))
import test_stepper as T  # noqa: E402  (the test programs)


@pytest.fixture(scope="module")
def progs(tmp_path_factory) -> Path:
    T._gcc()
    d = tmp_path_factory.mktemp("stepsys")
    T.build(d, "tiny", T.TINY, "-nostdlib", "-static", suffix=".S")
    T.build(d, "signals", T.SIGNALS_C, "-O1")
    T.build(d, "threads", T.THREADS_C, "-O1", "-pthread")
    T.build(d, "forkexec", T.FORKEXEC_C, "-O1")
    return d


def _decode_all(bundle: Path, ptoracle: Path) -> int:
    from hwtrace.bundle import Bundle
    b = Bundle(bundle)
    total = 0
    for s in b.streams:
        r = run_hwtrace("images", bundle, "--pt", s.file)
        assert r.returncode == 0, r.stderr
        o = subprocess.run([str(ptoracle), "insn", str(bundle / s.file), *r.stdout.split(),
                            *b.decoder_args(), "--summary"],
                           capture_output=True, text=True, timeout=600)
        summary = json.loads(o.stdout.splitlines()[-1])
        assert summary["errors"] == 0, [line for line in o.stdout.splitlines() if "error" in line][:5]
        assert summary["insns"] == s.instructions_observed, s.file
        total += summary["insns"]
    return total


@pytest.mark.parametrize("prog,args,status,mode,config", [
    ("tiny", [], 3, "thread", None),
    ("signals", [], 42, "cpu", None),
    ("signals", [], 42, "thread", "branch;user;tsc;mtc;cyc"),
    ("threads", [], 0, "cpu", None),
    ("forkexec", ["tiny"], 5, "thread", None),
])
def test_recorded_streams_decode_exactly(progs, ptoracle, tmp_path, prog, args, status, mode, config):
    out = tmp_path / "b"
    argv = [str(progs / prog), *[str(progs / a) for a in args]]
    cfg = ["--config", config] if config else []
    r = run_hwtrace("record", "--engine", "ptrace", "--mode", mode, *cfg, "-o", out, "--", *argv)
    assert r.returncode == status, r.stderr
    total = _decode_all(out, ptoracle)
    if prog == "tiny":
        assert total == T.TINY_INSNS
    else:
        assert total > 10000

"""Short, seeded, deterministic runs of the fuzz harnesses (fuzz/).

Each target runs its seeds (built from ../shared at run time) and a few
hundred seeded mutations in a subprocess under the runner's limits (1 s of
CPU per 64 KiB of input, +1 GiB address space); the run must report the
exact number of inputs and no finding.  The long runs (1,000,000 inputs)
are made by hand: ``nice python fuzz/run.py TARGET --mutate 1000000`` or
``--atheris``; their figures are in the README's reliability section.

The runner's own guards are tested too, so a harness that stops checking
can't pass silently.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest



ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
sys.path.insert(0, str(FUZZ))
import run as fuzz_run  # noqa: E402
import targets  # noqa: E402

SEED = 20261129
MUTATIONS = 150


def _short_run(target: str) -> dict:
    r = subprocess.run([sys.executable, str(FUZZ / "run.py"), target,
                        "--mutate", str(MUTATIONS), "--seed", str(SEED),
                        "--max-len", "16384"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target", targets.TARGETS)
def test_short_fuzz_run(target, corpus, hardware, request):
    if target == "libiptdiff":
        request.getfixturevalue("ptoracle")     # libipt is the other side
    nseeds = len(targets.make(target)[1]())
    assert nseeds > 0
    res = _short_run(target)
    assert res["findings"] == {}
    assert res["seeds"] == nseeds
    assert res["inputs"] == nseeds + MUTATIONS


def test_mutations_are_deterministic():
    rng1, rng2 = fuzz_run.random.Random(7), fuzz_run.random.Random(7)
    pool = [b"\x02\x82" * 8 + b"\x23", b"hello world"]
    a = [fuzz_run.mutate(rng1, pool[i % 2], pool, 64) for i in range(200)]
    b = [fuzz_run.mutate(rng2, pool[i % 2], pool, 64) for i in range(200)]
    assert a == b
    assert all(len(x) <= 64 for x in a)
    assert len(set(a)) > 150


def test_guard_interrupts_an_endless_loop():
    """A check far over its CPU budget is interrupted with Hang."""
    def spin(data):
        while True:
            pass
    with pytest.raises(fuzz_run.Hang, match="interrupted"):
        fuzz_run.guarded(spin, lambda d: 0.05)(b"x" * 10)


def test_guard_reports_an_overrun_after_the_fact():
    """A check that finishes but used more CPU than its budget is a Hang
    naming that input; the next, quick input is not blamed."""
    import time

    def burn(data):
        t = time.process_time()
        while time.process_time() - t < len(data) * 0.01:
            pass
    g = fuzz_run.guarded(burn, lambda d: 0.05)
    with pytest.raises(fuzz_run.Hang, match=r"s of CPU for 20 bytes"):
        g(b"x" * 20)
    g(b"")


def test_budget_is_one_second_per_64k_per_pass():
    assert targets.budget("packets")(b"x" * 65537) == 6
    assert targets.budget("bundle")(b"") == 1
    assert targets.budget("flow")(b"") == 1 + 10_000 / 100_000
    assert fuzz_run.budget_seconds(0) == 1
    assert fuzz_run.budget_seconds(65536) == 1
    assert fuzz_run.budget_seconds(65537) == 2
    assert fuzz_run.budget_seconds(4 << 20) == 64


def test_memory_limit_turns_runaway_allocation_into_a_finding():
    """Under the runner's RLIMIT_AS, allocating far beyond the input is a
    MemoryError (a finding), not an OOM kill of the machine."""
    code = ("import sys; sys.path.insert(0, %r); import run; run.limit_memory(64)\n"
            "try:\n    b = bytearray(1 << 30)\nexcept MemoryError:\n    print('capped')\n"
            % str(FUZZ))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "capped", r.stderr


def test_findings_are_saved_once_per_signature(tmp_path, monkeypatch):
    monkeypatch.setattr(fuzz_run, "OUT", tmp_path)
    f = fuzz_run.Findings("t")

    def boom(x):
        raise KeyError(x)
    for i in range(3):
        try:
            boom(i)
        except KeyError as e:
            f.add(bytes([i]), e)
    assert list(f.seen.values()) == [3]
    assert len(list((tmp_path / "t").glob("finding-*.txt"))) == 1


def test_flow_harness_stops_an_endless_loop():
    """``jmp .`` traced once decodes forever without another packet; the
    harness's output budget ends it (a budget, not a hang)."""
    # psb, psbend, tip.pge to 0x1000 (full 48-bit ip), then nothing.
    psb = b"\x02\x82" * 8
    psbend = b"\x02\x23"
    tip_pge = bytes([0x71]) + (0x1000).to_bytes(6, "little")
    data = targets.flow_input(b"\xeb\xfe", 0x1000, psb + psbend + tip_pge)
    targets.check_flow(data)        # returns (StopDecoding is caught)


def test_atheris_mode_runs(tmp_path, corpus, hardware):
    """The coverage-guided mode (atheris/libFuzzer) starts from the seeds
    and runs a few inputs without a finding (skipped where atheris isn't
    installed: it is needed only for long runs)."""
    pytest.importorskip("atheris")
    env = dict(__import__("os").environ, HWTRACE_FUZZ_OUT=str(tmp_path))
    r = subprocess.run([sys.executable, str(FUZZ / "run.py"), "perfdata", "--atheris",
                        "-runs=40", "-max_len=4096", "-seed=1"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Done 40 runs" in r.stderr
    assert len(list((tmp_path / "perfdata" / "seeds").iterdir())) == \
        len(set(targets.seeds_perfdata()))
    assert not list((tmp_path / "perfdata").glob("finding-*"))

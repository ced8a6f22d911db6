"""The compiled counts path on several cores (hwtrace.flow.fast_parallel):
the same instruction and block counts as the sequential compiled decode
and the Python decoders, on emulated recordings cut at (nearly) every PSB,
with and without MTC/CYC timing; None where the sequential core bails or
there is no core; the checkpoint key covers the whole live state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _need, run_hwtrace, sample_text
from test_flow_fast import second_tma

from hwtrace.flow import fast, fast_parallel as FP, parallel
from hwtrace.flow.config import FlowConfig
from hwtrace.pt.decoder import PacketDecoder


def _core():
    if fast.CORE is None:
        probe = __import__("hwtrace._ext", fromlist=["probe"]).probe(
            fast.NAME, fast.ABI)
        if probe.module is None:
            pytest.skip(f"compiled flow core unavailable: {probe.reason}")
        return probe.module
    return fast.CORE


@pytest.fixture(autouse=True)
def core(monkeypatch):
    """The compiled core, also where HWTRACE_NO_EXTENSIONS=1 selected the
    twin (these tests are about the core)."""
    c = _core()
    monkeypatch.setattr(fast, "CORE", c)
    return c


def _record(tmp: Path, config: str):
    """gzip -9 of 16 KiB of text in thread mode (the whole run in one
    stream) with a PSB every 2 KiB: (trace path, image pairs, config)."""
    (tmp / "in.txt").write_bytes(sample_text(16 << 10))
    out = tmp / "b"
    r = run_hwtrace("record", "--mode", "thread", "--copy-images", "--config",
                    config, "-o", out, "--", "/usr/bin/gzip", "-9", "-k", "-f",
                    tmp / "in.txt", timeout=300)
    if r.returncode != 0:
        _need("emulated engine", r.stderr.strip()[-300:])
    m = json.loads((out / "manifest.json").read_text())
    stream = max(m["streams"], key=lambda s: s.get("size", 0))["file"]
    img = run_hwtrace("images", "--pt", stream, out, check=True).stdout.split()
    pairs = [(img[i].lstrip("-"), img[i + 1]) for i in range(0, len(img), 2)]
    cfg = FlowConfig(mtc_freq=m.get("mtc_freq", 0),
                     nom_freq=m.get("nom_freq", 0),
                     cpuid_0x15_eax=m.get("cpuid_0x15_eax", 0),
                     cpuid_0x15_ebx=m.get("cpuid_0x15_ebx", 0))
    return str(out / stream), pairs, cfg


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("plain"),
                   "branch;user;retc;tsc;psb-freq=0")


@pytest.fixture(scope="module")
def timing(tmp_path_factory):
    """MTC every 2**9 CTC and CYC: a job synchronized at a PSB has the
    sequential decoder's calibration only after two MTCs, one or two PSBs
    later."""
    return _record(tmp_path_factory.mktemp("timing"),
                   "branch;user;tsc;retc;cyc;mtc;mtc-freq=9;psb-freq=0")


def _sequential(path, pairs, cfg, block):
    data = Path(path).read_bytes()
    image = parallel.load_image(pairs)
    dec = "block" if block else "insn"
    c = fast.count(data, image, cfg, dec, impl="compiled")
    p = fast.count(data, image, cfg, dec, impl="python")
    assert c.compiled and not p.compiled
    assert (c.insns, c.blocks, p.errors) == (p.insns, p.blocks, 0)
    return c


@pytest.mark.parametrize("which", ["plain", "timing"])
def test_counts_identical(which, request):
    """Cut at every PSB (and in 3): the sequential counts, for both
    decoders; segments meet at their first checkpoint (plain) or at their
    second and third (timing: the calibration needs two MTCs)."""
    path, pairs, cfg = request.getfixturevalue(which)
    npsb = len(parallel.psb_offsets(Path(path).read_bytes()))
    assert npsb >= 15
    for block in (True, False):
        seq = _sequential(path, pairs, cfg, block)
        assert seq.insns > 1000000
        c, st = FP.count_stats(path, 0, None, pairs, cfg, block, 2,
                               segments=npsb, min_segment=0)
        assert c == seq
        assert st["segments"] >= npsb - 1
        if which == "plain":
            assert st["reruns"] == [] and set(st["merged_at"]) == {0}
            assert len(st["merged_at"]) >= npsb - 4
        else:
            # (a segment may need a re-run: no MTC pair before the third
            # PSB of its tail -- how many varies between recordings)
            assert len(st["reruns"]) <= npsb // 8
            assert {1, 2} <= set(st["merged_at"]) <= {0, 1, 2}
            assert len(st["merged_at"]) >= npsb - 8
        assert FP.count(path, 0, None, pairs, cfg, block, 2, segments=3,
                        min_segment=0) == seq


def test_reruns_when_states_do_not_meet(timing, monkeypatch):
    """With a tail of one checkpoint most timing segments cannot prove
    their start (they meet at the second): the earlier job decodes on, and
    the counts are still the sequential ones."""
    path, pairs, cfg = timing
    monkeypatch.setattr(FP, "TAIL", 1)      # inherited by the forked jobs
    npsb = len(parallel.psb_offsets(Path(path).read_bytes()))
    for block in (True, False):
        seq = _sequential(path, pairs, cfg, block)
        c, st = FP.count_stats(path, 0, None, pairs, cfg, block, 2,
                               segments=npsb // 2, min_segment=0)
        assert c == seq
        assert len(st["reruns"]) >= 2


def test_job_bail_is_rerun_not_none(plain, tmp_path):
    """A PSB+ without its MODE.exec (padded out): the sequential decode
    knows the mode from before, a job synchronized there does not and
    bails.  That job's bail is a stop marker after its last checkpoint,
    the job before it decodes its segment again, and the counts are the
    sequential ones (not None)."""
    path, pairs, cfg = plain
    data = bytearray(Path(path).read_bytes())
    psbs = parallel.psb_offsets(data)
    k = len(psbs) // 2
    d = PacketDecoder(bytes(data))
    d.sync_set(psbs[k])
    p = d.next()
    while p.type != "mode.exec":
        assert p.type != "psbend"
        p = d.next()
    data[p.offset:p.offset + p.size] = bytes(p.size)     # PADs
    m = tmp_path / "nomode.pt"
    m.write_bytes(data)
    job = FP.run_segment(FP.SegmentJob(str(m), 0, len(data), tuple(pairs),
                                       cfg, True, psbs[k], psbs[k + 1]))
    assert job.underflows == [len(job.checkpoints)] and not job.stopped
    for block in (True, False):
        seq = _sequential(str(m), pairs, cfg, block)
        c, st = FP.count_stats(str(m), 0, None, pairs, cfg, block, 2,
                               segments=len(psbs), min_segment=0)
        assert c == seq
        assert (psbs[k - 1], psbs[k + 1]) in st["reruns"]


def test_trace_range(plain):
    """``--pt FILE:FROM-TO``: the counts of that range decoded alone."""
    path, pairs, cfg = plain
    data = Path(path).read_bytes()
    psbs = parallel.psb_offsets(data)
    lo, hi = psbs[3], psbs[-3]
    image = parallel.load_image(pairs)
    for block in (True, False):
        seq = fast.count(data[lo:hi], image, cfg,
                         "block" if block else "insn", impl="compiled")
        assert seq.compiled and seq.insns > 100000
        got = FP.count(path, lo, hi - lo, pairs, cfg, block, 0, segments=5,
                       min_segment=0)          # jobs=0: every core
        assert got == seq


@pytest.mark.parametrize("where", [0, 1, 2])
def test_bail_is_none(timing, tmp_path, where):
    """Where the sequential core bails (here: at the start, in the middle,
    near the end -- in a later job's segment) the parallel path returns
    None, whatever job sees it first."""
    path, pairs, cfg = timing
    data = Path(path).read_bytes()
    psbs = parallel.psb_offsets(data)
    at = psbs[[0, len(psbs) // 2, len(psbs) - 3][where]]
    bad = second_tma(data, at)
    image = parallel.load_image(pairs)
    assert fast.compiled_decode(bad, image, cfg, "block")[0] is not None
    m = tmp_path / "bad.pt"
    m.write_bytes(bad)
    for segments in (2, 7, len(psbs)):
        assert FP.count(str(m), 0, None, pairs, cfg, True, 2,
                        segments=segments, min_segment=0) is None


def test_seeded_mutations_match_the_sequential_core(plain, tmp_path):
    """Flipped bytes, cut-out and duplicated runs anywhere: the parallel
    path returns the sequential core's counts, and None exactly where that
    one bails."""
    import random
    path, pairs, cfg = plain
    data = Path(path).read_bytes()
    image = parallel.load_image(pairs)
    npsb = len(parallel.psb_offsets(data))
    rng = random.Random(8)
    seen = set()
    for n in range(10):
        b = bytearray(data)
        at = rng.randrange(len(b) // 8, len(b))
        what = n % 3
        if what == 0:
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b) // 8, len(b))] = rng.randrange(256)
        elif what == 1:
            del b[at:at + rng.randint(1, 16)]
        else:
            b[at:at] = b[at:at + rng.randint(1, 64)]
        m = tmp_path / f"m{n}.pt"
        m.write_bytes(b)
        block = bool(n % 2)
        seq = fast.compiled_count(bytes(b), image, cfg,
                                  "block" if block else "insn")
        got = FP.count(str(m), 0, None, pairs, cfg, block, 2,
                       segments=npsb, min_segment=0)
        assert got == seq, n
        seen.add(seq is None)
    assert True in seen     # the core bails on (nearly) every corrupt trace
    # Which random mutations still decode depends on the recording (made
    # fresh each run), so a valid change is made on purpose too: PADs
    # before a PSB in the middle change no count.
    psbs = parallel.psb_offsets(data)
    at = psbs[len(psbs) // 2]
    padded = data[:at] + b"\0" * 7 + data[at:]
    m = tmp_path / "padded.pt"
    m.write_bytes(padded)
    for block in (True, False):
        want = fast.compiled_count(data, image, cfg,
                                   "block" if block else "insn")
        assert want is not None
        assert fast.compiled_count(padded, image, cfg,
                                   "block" if block else "insn") == want
        assert FP.count(str(m), 0, None, pairs, cfg, block, 2,
                        segments=npsb + 1, min_segment=0) == want


def _dies_later(job):
    """run_segment, except that a job after the first kills its worker."""
    import os
    if job.start is not None:
        os._exit(3)
    return _RUN_SEGMENT(job)


_RUN_SEGMENT = FP.run_segment


def test_dead_worker_is_none(plain, monkeypatch):
    """A worker that dies (killed, out of memory) is no traceback: None,
    and the caller takes its usual path."""
    path, pairs, cfg = plain
    monkeypatch.setattr(FP, "run_segment", _dies_later)
    c, st = FP.count_stats(path, 0, None, pairs, cfg, True, 2, segments=4,
                           min_segment=0)
    assert c is None and st["broken"]


def test_no_core_is_none(plain, monkeypatch):
    path, pairs, cfg = plain
    monkeypatch.setattr(fast, "CORE", None)
    assert FP.count(path, 0, None, pairs, cfg, True, 2) is None


def test_no_extensions_is_none(plain):
    """HWTRACE_NO_EXTENSIONS=1: this path steps aside (the Python parallel
    decode handles the trace)."""
    path, pairs, cfg = plain
    code = ("import sys; from hwtrace.flow import fast_parallel as F; "
            f"print(F.count({path!r}, 0, None, {pairs!r}, None, True, 2))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env={**__import__("os").environ,
                                       "HWTRACE_NO_EXTENSIONS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "None\n"


def test_pipe_is_none(plain, tmp_path):
    """A FIFO has no size to cut and cannot be mapped: None (the caller
    reads it), not the counts of an empty trace."""
    import os
    path, pairs, cfg = plain
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert FP.count(str(fifo), 0, None, pairs, cfg, True, 2) is None


@pytest.mark.parametrize("data", [b"", b"\x00" * 64])
def test_no_sync_point(tmp_path, data):
    p = tmp_path / "t.pt"
    p.write_bytes(data)
    assert FP.count(str(p), 0, None, [], None, True, 2) == (0, 0, 0, True)


# -- the checkpoint key ---------------------------------------------------------

def _segment(path, pairs, cfg, start, stop_at, head):
    data = Path(path).read_bytes()
    return fast.compiled_segment(data, parallel.load_image(pairs), cfg, True,
                                 start, stop_at, 3, head)


@pytest.mark.parametrize("which", ["plain", "timing"])
def test_equal_keys_at_the_same_psb(which, request):
    """The sequential decode and a decode synchronized at a PSB reach the
    same key there (timing: a PSB or two later), with the fresh one's return
    stack a suffix of the sequential one's; two decodes from the same PSB
    record identical checkpoints."""
    path, pairs, cfg = request.getfixturevalue(which)
    psbs = parallel.psb_offsets(Path(path).read_bytes())
    at = psbs[len(psbs) // 2]
    seq = _segment(path, pairs, cfg, -1, at, 0)
    fresh = _segment(path, pairs, cfg, at, -1, 3)
    again = _segment(path, pairs, cfg, at, -1, 3)
    assert seq[0] is None and seq[4] and fresh[0] is None
    assert fresh[3] == again[3] and fresh[1:3] == again[1:3]
    assert [c[0] for c in seq[3]] == psbs[len(psbs) // 2:][:3]
    assert [c[0] for c in fresh[3][:3]] == psbs[len(psbs) // 2:][:3]
    meet = next(i for i in range(3) if seq[3][i][1] == fresh[3][i][1])
    s, f = seq[3][meet], fresh[3][meet]
    assert s[2][len(s[2]) - len(f[2]):] == f[2]
    assert seq[3][0][1] != seq[3][1][1]       # the position, at least
    # timing: the calibration (two MTCs, 2**9 CTC apart) is not equal yet
    assert meet == 0 if which == "plain" else meet >= 1


def test_every_state_field_changes_the_key(plain, core):
    """state_probe flips each field of the key's state table and of a live
    event in each queue: every flip changes the key."""
    path, pairs, cfg = plain
    data = Path(path).read_bytes()
    psbs = parallel.psb_offsets(data)
    flags, pflags = fast._flags(cfg, True)
    r = core.state_probe(data, fast._run_filler(parallel.load_image(pairs)),
                         flags, pflags, fast._timing(cfg), psbs[4])
    names = [n for n, _ in r]
    assert {"pos", "lip", "tnt_bits", "ip", "mode", "enabled", "tm.fc",
            "tc.fcr", "dis_ip", "async_from", "ipev.ip",
            "psbq[0].type", "ev[ev_i].mode"} <= set(names)
    assert len(names) == len(set(names)) >= 50
    assert [n for n, changed in r if not changed] == []


@pytest.mark.parametrize("which", ["plain", "timing"])
@pytest.mark.parametrize("opts", [[], ["--insn-decoder"]])
def test_cli_jobs_counts_identical(which, opts, request):
    """``hwtrace decode --quiet --stat --jobs 2`` (the CLI's way into this
    path, cut at every PSB) prints exactly the sequential counts."""
    path, pairs, _ = request.getfixturevalue(which)
    images = [a for k, v in pairs for a in (f"--{k}", v)]
    base = ["decode", "--pt", path, *images, "--quiet", "--stat", *opts]
    seq = run_hwtrace(*base, check=True).stdout
    assert seq.startswith("insn: ") and "insn: 0." not in seq
    par = run_hwtrace(*base, "--jobs", "2", check=True,
                      env={"HWTRACE_PARALLEL_MIN_SEGMENT": "0",
                           "HWTRACE_PARALLEL_SEGMENTS": "6"}).stdout
    assert par == seq

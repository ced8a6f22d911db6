"""The compiled core's segment jobs (hwtrace.flow.fast_parallel, run by
hwtrace.jobs): the same counts and errors as the sequential compiled
decode and the Python decoders, and batches flatten()-equal to the
sequential ones, on emulated recordings cut at (nearly) every PSB, with
and without MTC/CYC timing, and on corrupted ones; None where there is no
core; the checkpoint key covers the whole live state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _need, compiled_flow_core, run_hwtrace, sample_text
from test_flow_fast import second_tma

from hwtrace import jobs
from hwtrace.flow import batches as B
from hwtrace.flow import fast, fast_parallel as FP, parallel
from hwtrace.flow.config import FlowConfig
from hwtrace.pt.decoder import PacketDecoder




@pytest.fixture(autouse=True)
def core(monkeypatch):
    """The compiled core, also where HWTRACE_NO_EXTENSIONS=1 selected the
    twin (these tests are about the core)."""
    c = compiled_flow_core()
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
    image = jobs.load_image(pairs)
    dec = "block" if block else "insn"
    c = fast.count(data, image, cfg, dec, impl="compiled")
    p = fast.count(data, image, cfg, dec, impl="python")
    assert c.compiled and not p.compiled
    assert c[:2] + c[4:] == p[:2] + p[4:]
    return c


def _merged_psbs(path, st) -> list:
    """For each stitched job, the index among its PSBs (0: the one it
    started at) of the PSB whose checkpoint it merged at."""
    psbs = parallel.psb_offsets(Path(path).read_bytes())
    return [psbs.index(max(p for p in psbs if p <= pos)) - psbs.index(start)
            for start, pos in st["merged_pos"]]


@pytest.mark.parametrize("which", ["plain", "timing"])
def test_counts_identical(which, request):
    """Cut at every PSB (and in 3): the sequential counts, for both
    decoders; segments meet at a checkpoint of their first PSB (plain) or
    of their second or third (timing: the calibration needs two MTCs)."""
    path, pairs, cfg = request.getfixturevalue(which)
    npsb = len(parallel.psb_offsets(Path(path).read_bytes()))
    assert npsb >= 15
    for block in (True, False):
        seq = _sequential(path, pairs, cfg, block)
        assert seq.insns > 1000000
        c, st = jobs.count_stats(path, 0, None, pairs, cfg, block, 2,
                               segments=npsb, min_segment=0)
        assert c == seq
        assert st["segments"] >= npsb - 1
        if which == "plain":
            assert st["reruns"] == [] and set(st["merged_at"]) == {0}
            assert set(_merged_psbs(path, st)) == {0}
            assert len(st["merged_at"]) >= npsb - 4
        else:
            # (a segment may need a re-run: no MTC pair before the third
            # PSB of its tail -- how many varies between recordings; a PSB+
            # whose FUP is inside a block checkpoints twice: count PSBs)
            assert len(st["reruns"]) <= npsb // 8
            merged = set(_merged_psbs(path, st))
            assert 1 in merged and merged <= {0, 1, 2}
            assert len(st["merged_at"]) >= npsb - 8
        assert jobs.count(path, 0, None, pairs, cfg, block, 2, segments=3,
                        min_segment=0) == seq


def test_reruns_when_states_do_not_meet(timing, monkeypatch):
    """With a tail of one PSB most timing segments cannot prove their
    start (they meet at their second PSB): the earlier job decodes on, and
    the counts are still the sequential ones."""
    path, pairs, cfg = timing
    monkeypatch.setattr(FP, "TAIL", 1)      # inherited by the forked jobs
    npsb = len(parallel.psb_offsets(Path(path).read_bytes()))
    for block in (True, False):
        seq = _sequential(path, pairs, cfg, block)
        c, st = jobs.count_stats(path, 0, None, pairs, cfg, block, 2,
                               segments=npsb // 2, min_segment=0)
        assert c == seq
        assert len(st["reruns"]) >= 2


def test_fresh_start_without_mode_is_not_taken(plain, tmp_path):
    """A PSB+ without its MODE.exec (padded out): the sequential decode
    knows the mode from before, a job synchronized there does not and
    reports errors until its next PSB.  Its state meets the sequential one
    only past them, so none of its errors are taken: the counts and errors
    are the sequential ones."""
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
    job = jobs.run_segment(jobs.SegmentJob(str(m), 0, len(data),
                                           tuple(pairs), cfg, True,
                                           psbs[k], psbs[k + 1]))
    assert job.output and job.output[0][3] == "unknown instruction"
    for block in (True, False):
        seq = _sequential(str(m), pairs, cfg, block)
        c, st = jobs.count_stats(str(m), 0, None, pairs, cfg, block, 2,
                                 segments=len(psbs), min_segment=0)
        assert c == seq and c.errors == 0


def test_trace_range(plain):
    """``--pt FILE:FROM-TO``: the counts of that range decoded alone."""
    path, pairs, cfg = plain
    data = Path(path).read_bytes()
    psbs = parallel.psb_offsets(data)
    lo, hi = psbs[3], psbs[-3]
    image = jobs.load_image(pairs)
    for block in (True, False):
        seq = fast.count(data[lo:hi], image, cfg,
                         "block" if block else "insn", impl="compiled")
        assert seq.compiled and seq.insns > 100000
        got = jobs.count(path, lo, hi - lo, pairs, cfg, block, 0, segments=5,
                       min_segment=0)          # jobs=0: every core
        assert got == seq


@pytest.mark.parametrize("where", [0, 1, 2])
def test_timing_error_counted(timing, tmp_path, where):
    """A timing error of the sequential decode (a second TMA; at the
    start, in the middle, near the end -- in a later job's segment): the
    parallel counts report it, where it is, as the sequential ones do."""
    path, pairs, cfg = timing
    data = Path(path).read_bytes()
    psbs = parallel.psb_offsets(data)
    at = psbs[[0, len(psbs) // 2, len(psbs) - 3][where]]
    bad = second_tma(data, at)
    image = jobs.load_image(pairs)
    want = fast.count(bad, image, cfg, "block")
    assert want.errors >= 1
    m = tmp_path / "bad.pt"
    m.write_bytes(bad)
    for segments in (2, 7, len(psbs)):
        assert jobs.count(str(m), 0, None, pairs, cfg, True, 2,
                          segments=segments, min_segment=0) == want


def test_seeded_mutations_match_the_sequential_core(plain, tmp_path):
    """Flipped bytes, cut-out and duplicated runs anywhere: the parallel
    path returns the sequential core's counts and errors (with and without
    resync), which are the twin's."""
    import random
    path, pairs, cfg = plain
    data = Path(path).read_bytes()
    image = jobs.load_image(pairs)
    npsb = len(parallel.psb_offsets(data))
    rng = random.Random(8)
    errors = 0
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
        resync = n % 4 == 1
        dec = "block" if block else "insn"
        seq = fast.count(bytes(b), image, cfg, dec, resync=resync)
        assert seq == fast.count(bytes(b), image, cfg, dec, impl="python",
                                 resync=resync)._replace(compiled=True)
        got = jobs.count(str(m), 0, None, pairs, cfg, block, 2,
                         resync=resync, segments=npsb, min_segment=0)
        assert got == seq, n
        errors += seq.errors
    assert errors > 0
    # PADs before a PSB in the middle change no count
    psbs = parallel.psb_offsets(data)
    at = psbs[len(psbs) // 2]
    padded = data[:at] + b"\0" * 7 + data[at:]
    m = tmp_path / "padded.pt"
    m.write_bytes(padded)
    for block in (True, False):
        dec = "block" if block else "insn"
        want = fast.count(data, image, cfg, dec)
        assert fast.count(padded, image, cfg, dec) == want
        assert jobs.count(str(m), 0, None, pairs, cfg, block, 2,
                          segments=npsb + 1, min_segment=0) == want


@pytest.mark.parametrize("which", ["plain", "timing"])
@pytest.mark.parametrize("decoder", ["block", "insn"])
def test_batches_flatten_to_the_sequential_ones(which, decoder, request):
    """Batches from segment jobs (cut at every PSB, and in 3) are the
    sequential compiled batches once flattened, instructions included."""
    path, pairs, cfg = request.getfixturevalue(which)
    data = Path(path).read_bytes()
    image = jobs.load_image(pairs)
    want = B.flatten(B.batches(data, image, cfg, decoder=decoder,
                               want_insns=True, impl="compiled"))
    npsb = len(parallel.psb_offsets(data))
    for segments in (npsb, 3):
        st = {}
        got = B.flatten(jobs.batches(path, 0, None, pairs, cfg, decoder,
                                     want_insns=True, jobs=2,
                                     segments=segments, min_segment=0,
                                     stats=st))
        assert st["segments"] >= min(segments, npsb) - 1
        assert (got[0] == want[0]).all() and len(got[0]) == len(want[0])
        assert (got[1] == want[1]).all() and len(got[1]) == len(want[1])
        assert [(i, o, repr(x)) for i, o, x in got[2]] == \
            [(i, o, repr(x)) for i, o, x in want[2]]


def _dies_later(job):
    """run_segment, except that a job after the first kills its worker."""
    import os
    if job.start is not None:
        os._exit(3)
    return _RUN_SEGMENT(job)


_RUN_SEGMENT = jobs.run_segment


def test_dead_worker_is_none(plain, monkeypatch):
    """A worker that dies (killed, out of memory) is no traceback: None,
    and the caller takes its usual path."""
    path, pairs, cfg = plain
    monkeypatch.setattr(jobs, "run_segment", _dies_later)
    c, st = jobs.count_stats(path, 0, None, pairs, cfg, True, 2, segments=4,
                           min_segment=0)
    assert c is None and st["broken"]


def test_no_core_is_none(plain, monkeypatch):
    path, pairs, cfg = plain
    monkeypatch.setattr(fast, "CORE", None)
    assert jobs.count(path, 0, None, pairs, cfg, True, 2) is None


def test_no_extensions_is_none(plain):
    """HWTRACE_NO_EXTENSIONS=1: this path steps aside (the Python parallel
    decode handles the trace)."""
    path, pairs, cfg = plain
    code = ("import sys; from hwtrace import jobs; "
            f"print(jobs.count({path!r}, 0, None, {pairs!r}, None, True, 2))")
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
    assert jobs.count(str(fifo), 0, None, pairs, cfg, True, 2) is None


@pytest.mark.parametrize("data", [b"", b"\x00" * 64])
def test_no_sync_point(tmp_path, data):
    p = tmp_path / "t.pt"
    p.write_bytes(data)
    assert jobs.count(str(p), 0, None, [], None, True, 2) == \
        (0, 0, 0, True, 0, ())


# -- the checkpoint key ---------------------------------------------------------

def _segment(path, pairs, cfg, start, stop_at, head):
    """(insns, blocks, events, errors, checkpoints, underflows, stopped)
    of a counts job from ``start`` (-1: the trace start)."""
    data = Path(path).read_bytes()
    dec = fast.core_decoder(data, jobs.load_image(pairs), cfg, block=True)
    return dec.segment(start, stop_at, 3, head)


def _distinct_psbs(checkpoints) -> list:
    return list(dict.fromkeys(c[0] for c in checkpoints))


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
    assert seq[6] and not seq[3] and not fresh[3]
    assert fresh[4] == again[4] and fresh[:4] == again[:4]
    # (a PSB+ whose FUP is inside a block checkpoints twice: once per
    # status group; both decodes take the same points)
    assert _distinct_psbs(seq[4]) == psbs[len(psbs) // 2:][:3]
    assert _distinct_psbs(fresh[4])[:3] == psbs[len(psbs) // 2:][:3]
    s, f = next((s, f) for s in seq[4] for f in fresh[4]
                if s[0] == f[0] and s[1] == f[1])
    assert s[2][len(s[2]) - len(f[2]):] == f[2]
    assert seq[4][0][1] != seq[4][1][1]       # the position, at least
    # timing: the calibration (two MTCs, 2**9 CTC apart) is not equal yet
    meet = psbs.index(s[0]) - psbs.index(at)
    assert meet == 0 if which == "plain" else meet >= 1


def test_every_state_field_changes_the_key(plain):
    """state_probe flips each field of the key's state table, of the
    event being processed, of the injected one and of a queued one in
    each queue: every flip changes the key."""
    path, pairs, cfg = plain
    data = Path(path).read_bytes()
    psbs = parallel.psb_offsets(data)
    r = fast.state_probe(data, jobs.load_image(pairs), cfg, True, psbs[4])
    names = [n for n, _ in r]
    assert {"d.q.pos", "d.q.ip", "d.q.tnt_bits", "d.ip", "d.mode",
            "d.enabled", "d.q.time.time.fc", "d.q.time.tcal.fcr",
            "d.icount", "ev.ip", "ev.type", "evq1[0].mode",
            "evt.fup[0].bind", "inj_ev.status_update"} <= set(names)
    assert len(names) == len(set(names)) >= 300
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


def test_dask_counts_and_batches(plain):
    """The compiled core's segment jobs on a Dask cluster (threads of this
    process): the sequential counts and flatten()-equal batches; the CLI's
    ``decode --quiet --stat --dask`` prints the sequential output."""
    distributed = pytest.importorskip("distributed")
    path, pairs, cfg = plain
    data = Path(path).read_bytes()
    image = jobs.load_image(pairs)
    want = fast.count(data, image, cfg, "block")
    want_b = B.flatten(B.batches(data, image, cfg, want_insns=True,
                                 impl="compiled"))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                                  processes=False, dashboard_address=None,
                                  protocol="tcp") as cluster:
        addr = cluster.scheduler_address
        st = {}
        c, st = jobs.count_stats(path, 0, None, pairs, cfg, True, 2,
                                 segments=4, min_segment=0, dask=addr)
        assert c == want and st["segments"] == 4
        got = B.flatten(jobs.batches(path, 0, None, pairs, cfg,
                                     want_insns=True, segments=4,
                                     min_segment=0, dask=addr))
        assert len(got[0]) == len(want_b[0]) and (got[0] == want_b[0]).all()
        assert (got[1] == want_b[1]).all()
        assert [(i, o, repr(x)) for i, o, x in got[2]] == \
            [(i, o, repr(x)) for i, o, x in want_b[2]]
        images = [a for k, v in pairs for a in (f"--{k}", v)]
        base = ["decode", "--pt", path, *images, "--quiet", "--stat"]
        seq = run_hwtrace(*base, check=True).stdout
        par = run_hwtrace(*base, "--dask", addr, check=True,
                          env={"HWTRACE_PARALLEL_MIN_SEGMENT": "0",
                               "HWTRACE_PARALLEL_SEGMENTS": "4"}).stdout
        assert par == seq


@pytest.mark.parametrize("spooled", [False, True])
def test_spooled_listing_joins_a_character_split_across_chunks(tmp_path, spooled):
    """A job's listing is copied out a chunk at a time: a multibyte
    character (a symbol's, a path's) that a chunk boundary cuts in two
    comes out whole, not as a decoding error."""
    text = "fn_caf\u00e9+0x4 \u2192 \U0001f600 done\n" * 3
    data = text.encode()
    out = data
    if spooled:
        out = tmp_path / "spool"
        out.write_bytes(data)
        out = str(out)
    for chunk in (1, 2, 3, 7):
        got = []
        jobs._copy_out(out, 0, len(data), got.append, chunk)
        assert "".join(got) == text
    got = []
    jobs._copy_out(out, 4, len(data) - 1, got.append, 5)
    assert "".join(got) == data[4:-1].decode()

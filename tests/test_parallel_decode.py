"""Parallel decoding (hwtrace.flow.parallel, run by hwtrace.jobs): the output of ``--jobs N``
and of a Dask cluster is byte for byte the sequential decode's, on a real
program's recording, on the libipt corpus traces with several PSBs and on
seeded mutations of the recording (errors at the same offsets)."""

from __future__ import annotations

import contextlib
import io
import os
import random
import shlex
import shutil

import pytest
from conftest import run_hwtrace, sample_text

from hwtrace import jobs as J
from hwtrace.flow import parallel

GZIP = shutil.which("gzip") or "/usr/bin/gzip"


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """gzip -9 of 10 KiB of text, recorded by the emulated engine with a
    PSB every 2 KiB of trace: (trace path, image arguments).  (A directory
    of this run's own: others may run the suite at the same time.)"""
    d = tmp_path_factory.mktemp("parallel")
    (d / "in.txt").write_bytes(sample_text(10 << 10))
    # thread mode: the whole run in one stream (cpu mode splits it between
    # CPUs as the host schedules QEMU)
    r = run_hwtrace("record", "--mode", "thread", "--copy-images", "--config",
                    "branch;user;retc;tsc;psb-freq=0", "-o", d / "b", "--",
                    GZIP, "-9", "-k", "-f", d / "in.txt")
    assert r.returncode == 0, r.stderr
    pt = max((d / "b").glob("*.pt"), key=lambda p: p.stat().st_size)
    img = run_hwtrace("images", "--pt", pt.name, d / "b")
    assert img.returncode == 0, img.stderr
    return pt, shlex.split(img.stdout)


def decode(*args, jobs=1, env_extra=None):
    env = dict(os.environ, HWTRACE_PARALLEL_MIN_SEGMENT="0")
    env.update(env_extra or {})
    extra = [] if jobs == 1 else ["--jobs", str(jobs)]
    r = run_hwtrace("decode", *map(str, args), *extra, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return r.stdout


OUTPUTS = (["--quiet", "--stat"], ["--format", "jsonl", "--offset"],
           ["--insn-decoder", "--offset", "--event:ip"],
           ["--block-decoder", "--block:show-blocks"])


@pytest.mark.slow
def test_real_program_identical(recording):
    pt, images = recording
    assert len(parallel.psb_offsets(pt.read_bytes())) >= 8
    for opts in OUTPUTS:
        seq = decode("--pt", pt, *images, *opts)
        assert seq.startswith("insn: ") or seq.count("\n") > 1000
        for jobs in (2, 3):
            assert decode("--pt", pt, *images, *opts, jobs=jobs) == seq, \
                (opts, jobs)


def _api_decode(pt, images, *, jobs=2, dask=None, block=True, segments=6):
    from hwtrace.flow import sinks
    from hwtrace.flow.config import FlowConfig

    out = io.StringIO()
    sink = sinks.JsonSink(out.write, print_offset=True)
    pairs = [(images[i].lstrip("-"), images[i + 1])
             for i in range(0, len(images), 2)]
    stats = J.decode(parallel.Source(str(pt)), pairs, FlowConfig(),
                     sink, out.write, block=block, jobs=jobs,
                     dask=dask, segments=segments, min_segment=0)
    return out.getvalue(), (sink.insns, sink.events, sink.errors), stats


def test_segments_stitched_without_redecoding(recording):
    # A valid trace: each segment's state meets the previous one's within
    # its tail, so every segment contributes and nothing is decoded twice.
    pt, images = recording
    out, counts, stats = _api_decode(pt, images, segments=6)
    assert stats["segments"] == 6
    # (a job whose tail reaches the end of the trace makes the last
    # segment's job unnecessary: it ran to the end like the sequential one)
    assert stats["pieces"] >= 4
    assert stats["reruns"] == []
    seq = decode("--pt", pt, *images, "--format", "jsonl", "--offset")
    assert out == seq
    assert counts[0] == sum(1 for line in seq.splitlines()
                            if line.startswith('{"ip"'))


@pytest.mark.slow
def test_seeded_mutations_identical(recording, tmp_path):
    pt, images = recording
    data = pt.read_bytes()
    for seed in range(4):
        rng = random.Random(seed)
        buf = bytearray(data)
        for _ in range(3 + seed * 4):
            at = rng.randrange(len(buf))
            buf[at] = rng.randrange(256)
        if seed % 3 == 2:           # a cut-out run of bytes
            at = rng.randrange(len(buf) - 64)
            del buf[at:at + rng.randrange(1, 64)]
        m = tmp_path / f"m{seed}.pt"
        m.write_bytes(bytes(buf))
        for opts in (["--offset", "--event:ip"] if seed % 2 else
                     ["--insn-decoder", "--resync-on-error", "--offset"],):
            seq = decode("--pt", m, *images, *opts)
            assert decode("--pt", m, *images, *opts, jobs=3) == seq, \
                (seed, opts)
            if seed:
                assert "error" in seq


def _corpus_cases():
    from ptxed_corpus import argv_for, ptxed_variants
    seen = set()
    for d, v, meta in ptxed_variants():
        pt = d / v["pt"]
        family = pt.name.split("-cpu_")[0]
        if family in seen:
            continue
        if len(parallel.psb_offsets(pt.read_bytes())) < 2:
            continue
        seen.add(family)
        yield family, d, v, argv_for


def _run_cli(argv):
    from hwtrace.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    assert rc == 0
    return out.getvalue()


def test_corpus_traces_with_several_psbs(monkeypatch, corpus):
    monkeypatch.setenv("HWTRACE_PARALLEL_MIN_SEGMENT", "0")
    cases = list(_corpus_cases())
    assert len(cases) >= 10
    for family, d, v, argv_for in cases:
        for decoder in ("insn", "block"):
            argv = argv_for(d, v, decoder)
            seq = _run_cli(argv)
            for jobs in ("2", "3"):
                got = _run_cli(argv + ["--jobs", jobs])
                assert got == seq, (family, decoder, jobs)


def test_bad_jobs_is_a_one_line_error(recording):
    pt, images = recording
    r = run_hwtrace("decode", "--pt", pt, *images, "--jobs", "-2")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--jobs: bad argument: -2" in r.stderr


def test_dask_local_cluster_same_output(recording):
    distributed = pytest.importorskip("distributed")
    pt, images = recording
    # The first PSB segments only: the workers are threads of this process.
    psbs = parallel.psb_offsets(pt.read_bytes())
    ranged = f"{pt}:0-{psbs[5]:#x}"
    seq = decode("--pt", ranged, *images, "--offset")
    plain = decode("--pt", ranged, *images, "--offset", "--no-inst")
    assert plain.count("\n") > 1000
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                                  processes=False, dashboard_address=None,
                                  protocol="tcp") as cluster:
        from hwtrace.flow import sinks
        from hwtrace.flow.config import FlowConfig
        out = io.StringIO()
        sink = sinks.PtxedSink(out.write, print_offset=True)
        pairs = [(images[i].lstrip("-"), images[i + 1])
                 for i in range(0, len(images), 2)]
        stats = J.decode(parallel.Source(str(pt), 0, psbs[5]), pairs,
                                FlowConfig(), sink, out.write, block=True,
                                dask=cluster.scheduler_address, segments=4,
                                min_segment=0)
        assert stats["segments"] == 4 and stats["reruns"] == []
        assert out.getvalue() == plain
        # the CLI path, as a user runs it (the listing: each worker
        # disassembles and symbolizes with the same images)
        r = run_hwtrace("decode", "--pt", ranged, *images, "--offset",
                        "--dask", cluster.scheduler_address,
                        env=dict(os.environ,
                                 HWTRACE_PARALLEL_MIN_SEGMENT="0"))
        assert r.returncode == 0, r.stderr
        assert r.stdout == seq


# -- the stitch's rules, on made-up job results ---------------------------------
def _cp(pos, key, stack=(), out=0):
    from hwtrace.flow.checkpoint import Checkpoint
    return Checkpoint(pos, key, tuple(stack), out, (out, 0, 0, 0))


def _res(start, end, cps, underflows=(), stopped=True, size=1000):
    return parallel.Result(start, end, list(cps), list(underflows),
                           (size, 0, 0, 0), size, stopped, b"")


def test_stitch_takes_the_first_common_state():
    a = _res(None, 100, [_cp(50, b"a", out=10), _cp(120, b"x", (1, 2), 20),
                         _cp(140, b"y", (1, 2), 30)])
    b = _res(100, None, [_cp(110, b"w"), _cp(120, b"x", (2,), 5),
                         _cp(140, b"y", (2,), 9)], stopped=False)
    pieces = parallel.stitch([a, b], rerun=None)
    assert [(p.result is a, p.first, p.last, p.exact) for p in pieces] == \
        [(True, -1, 1, True), (False, 1, None, False)]
    assert [parallel.piece_range(p)[:2] for p in pieces] == [(0, 20), (5, 1000)]


def test_stitch_needs_a_suffix_stack():
    a = _res(None, 100, [_cp(120, b"x", (1, 2)), _cp(140, b"y", (1, 2))])
    b = _res(100, None, [_cp(120, b"x", (3,)), _cp(140, b"y", (2,))],
             stopped=False)
    pieces = parallel.stitch([a, b], rerun=None)
    assert [(p.first, p.last) for p in pieces] == [(-1, 1), (1, None)]


def test_stitch_redecodes_when_no_state_meets():
    a = _res(None, 100, [_cp(120, b"x")])
    b = _res(100, 200, [_cp(120, b"z"), _cp(220, b"q")])
    c = _res(200, None, [_cp(220, b"q")], stopped=False)
    whole = _res(None, 200, [_cp(120, b"x"), _cp(220, b"q")])
    calls = []

    def rerun(start, end):
        calls.append((start, end))
        return whole
    pieces = parallel.stitch([a, b, c], rerun)
    assert calls == [(None, 200)]
    assert [(p.result, p.first, p.last) for p in pieces] == \
        [(whole, -1, 1), (c, 0, None)]


def test_stitch_refuses_an_underflow_after_an_inexact_start():
    # b met a with a shorter stack, then popped past its bottom: the piece
    # of b is not taken; a decodes b's segment too.
    a = _res(None, 100, [_cp(120, b"x", (7, 8))])
    b = _res(100, None, [_cp(120, b"x", (8,))], underflows=[1], stopped=False)
    a2 = _res(None, None, [_cp(120, b"x", (7, 8))], stopped=False)
    calls = []

    def rerun(start, end):
        calls.append((start, end))
        return a2
    pieces = parallel.stitch([a, b], rerun)
    assert calls == [(None, None)]
    assert [(p.result, p.first, p.last) for p in pieces] == [(a2, -1, None)]


def test_stitch_keeps_an_underflow_after_an_exact_start():
    a = _res(None, 100, [_cp(120, b"x", (8,))])
    b = _res(100, None, [_cp(120, b"x", (8,))], underflows=[1], stopped=False)
    pieces = parallel.stitch([a, b], rerun=None)
    assert [(p.first, p.last, p.exact) for p in pieces] == \
        [(-1, 0, True), (0, None, True)]


def test_segment_starts_are_psbs_of_similar_spacing():
    psbs = list(range(0, 100_000, 1000))
    assert parallel.segment_starts(psbs, 100_000, 4, min_size=0) == \
        [25_000, 50_000, 75_000]
    assert parallel.segment_starts(psbs, 100_000, 4, min_size=40_000) == \
        [50_000]
    assert parallel.segment_starts([0], 100_000, 4, min_size=0) == []


def test_stitch_goes_sequential_after_two_misses_in_a_row():
    a = _res(None, 100, [_cp(120, b"x")])
    b = _res(100, 200, [_cp(120, b"z")])
    c = _res(200, 300, [_cp(220, b"r")])
    d = _res(300, None, [_cp(320, b"s")], stopped=False)
    ab = _res(None, 200, [_cp(120, b"x"), _cp(220, b"q")])
    rest = _res(None, None, [_cp(120, b"x"), _cp(220, b"q")], stopped=False)
    calls = []

    def rerun(start, end):
        calls.append((start, end))
        return ab if end == 200 else rest
    pieces = parallel.stitch([a, b, c, d], rerun)
    assert calls == [(None, 200), (None, None)]
    assert [(p.result, p.first, p.last) for p in pieces] == [(rest, -1, None)]


def test_timing_state_that_never_meets_still_identical(tmp_path):
    # MTC/CYC timing: a decoder synchronized at a later PSB never reaches
    # the calibration state of the one that ran from the start, so no
    # boundary can be proven; the output is still the sequential one.
    d = tmp_path
    (d / "in.txt").write_bytes(sample_text(3 << 10))
    r = run_hwtrace("record", "--mode", "thread", "--copy-images", "--config",
                    "branch;user;retc;tsc;mtc;mtc-freq=0;cyc;psb-freq=0",
                    "-o", d / "b", "--", GZIP, "-9", "-k", "-f", d / "in.txt")
    assert r.returncode == 0, r.stderr
    pt = max((d / "b").glob("*.pt"), key=lambda p: p.stat().st_size)
    images = shlex.split(run_hwtrace("images", "--pt", pt.name,
                                     d / "b").stdout)
    opts = ["--format", "jsonl", "--offset", "--nom-freq", "22",
            "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "176"]
    seq = decode("--pt", pt, *images, *opts)
    assert '"lost_mtc"' in seq
    assert decode("--pt", pt, *images, *opts, jobs=2) == seq


def test_segment_starts_never_repeat_a_psb():
    assert parallel.segment_starts([0, 1000, 2000], 3000, 8, min_size=0) == \
        [1000, 2000]


def test_psb_after_counts_psbs():
    from hwtrace.pt import encoder as P
    buf = (P.psb() + P.psbend() + P.pad() * 5) * 4
    step = 16 + 2 + 5
    assert parallel.psb_after(buf, 0, 1) == step
    assert parallel.psb_after(buf, step, 2) == 3 * step
    assert parallel.psb_after(buf, step, 3) is None


# -- jobs and their checkpoints ----------------------------------------------
def _pairs(images):
    return tuple((images[i].lstrip("-"), images[i + 1])
                 for i in range(0, len(images), 2))


def _run_jobs(pt, pairs, starts, block, size=None):
    """The jobs of a decode cut at ``starts`` (as jobs.decode runs
    them, output in memory) and their stitched output."""
    from hwtrace.flow import sinks
    from hwtrace.flow.config import FlowConfig
    template = sinks.PtxedSink(None, print_offset=True)
    bounds, ends = [None] + starts, starts + [None]
    results = [J.run_job(parallel.Job(
        parallel.Source(str(pt), 0, size), pairs, FlowConfig(), block,
        template,
        False, s, e, None)) for s, e in zip(bounds, ends)]
    return results


def _stitched(results, rerun=None):
    out = []
    for piece in parallel.stitch(results, rerun):
        a, b, _, _ = parallel.piece_range(piece)
        out.append(piece.result.output[a:b].decode())
    return "".join(out)


@pytest.mark.parametrize("decoder", ["block", "insn"])
def test_each_job_stops_at_the_first_psb_of_the_next_segment(recording,
                                                             decoder):
    # A job's checkpoints in the next segment are those of that segment's
    # first PSB+, and the job stops at the one where the next job takes its
    # first, in the same state: it learns so from its probe.  (A PSB+ whose
    # FUP is inside a block, as hardware writes most of them, publishes its
    # status in two groups: the first before the flow reaches the FUP's IP,
    # each with a checkpoint; a job synchronized there starts at that IP,
    # so it meets the second.)
    pt, images = recording
    data = pt.read_bytes()
    psbs = parallel.psb_offsets(data)
    starts = [psbs[2], psbs[6]]
    results = _run_jobs(pt, _pairs(images), starts, decoder == "block",
                        size=psbs[9])
    for cur, nxt in zip(results, results[1:]):
        tail = [i for i, cp in enumerate(cur.checkpoints)
                if cp.pos >= nxt.start]
        after = parallel.psb_after(data, nxt.start, 1)
        assert cur.stopped and tail and tail[-1] == len(cur.checkpoints) - 1
        assert all(cur.checkpoints[i].pos < after for i in tail)
        assert parallel._merge(cur, 0, nxt)[:2] == (tail[-1], 0)
        assert nxt.checkpoints[0].pos < after
    # the head window: checkpoints at each of the first HEAD PSBs of a job
    # and one past them (job 0 needs none)
    first = [cp.pos for cp in results[0].checkpoints]
    assert first and all(starts[0] < p < psbs[3] for p in first)
    at = [max(p for p in psbs if p < cp.pos) for cp in results[1].checkpoints]
    assert list(dict.fromkeys(at))[:parallel.HEAD + 1] == \
        psbs[2:2 + parallel.HEAD + 1]
    seq = decode("--pt", f"{pt}:0-{psbs[9]:#x}", *images,
                 f"--{decoder}-decoder", "--offset", "--no-inst")
    assert _stitched(results) == seq


# A call in a loop, a hand-made trace (64-bit code at 0x1000):
#   0x1000: call 0x1010      0x1005: jmp 0x1000
#   0x1010: jz 0x1012        0x1012: ret (compressed: a taken TNT bit)
_LOOP = b"\xe8\x0b\x00\x00\x00\xeb\xf9" + b"\x90" * 9 + b"\x74\x00\xc3"


def _psb(ip=None):
    from hwtrace.pt import encoder as P
    return P.psb() + (P.fup(ip, ipc=6) if ip is not None else b"") + \
        P.mode_exec(csl=1) + P.psbend()


def _loops(n: int) -> bytes:
    from hwtrace.pt import encoder as P
    bits = "".join(("t" if i % 3 else "n") + "t" for i in range(n))
    return b"".join(P.tnt8(bits[i:i + 6]) for i in range(0, len(bits), 6))


def _loop_trace(second_psb_at: str) -> bytes:
    """Four PSBs; the second (where a 2-way cut falls) stands at the
    loop's top, at the jz (the return address pushed before it) or at the
    ret (its jz done before it)."""
    from hwtrace.pt import encoder as P

    def psb(ip):
        return P.psb() + P.fup(ip, ipc=6) + P.mode_exec(csl=1) + P.psbend()

    def tnt(bits):
        return b"".join(P.tnt8(bits[i:i + 6]) for i in range(0, len(bits), 6))

    def loops(n):
        return "".join(("t" if i % 3 else "n") + "t" for i in range(n))

    ip, before, after = {"top": (0x1000, "", ""), "jz": (0x1010, "", "nt"),
                         "ret": (0x1012, "n", "t")}[second_psb_at]
    return (psb(0x1000) + tnt(loops(300) + before) + psb(ip) +
            tnt(after + loops(20)) + psb(0x1000) + tnt(loops(20)) +
            psb(0x1000) + tnt(loops(20)) + P.fup(0x1000, ipc=6) +
            P.tip_pgd())


@pytest.mark.parametrize("decoder", ["block", "insn"])
@pytest.mark.parametrize("second_psb_at, reruns, pieces", [
    ("top", [], 2),
    # job 1 meets job 0 at the jz with an empty return stack, then pops
    # past its bottom at the ret: its piece is refused, job 0 decodes on
    ("jz", [(None, None)], 1),
    # job 1 fails at the ret, resynchronizes at the next PSB and meets
    # job 0 there (past the error: its piece is taken)
    ("ret", [], 2)])
def test_return_stack_across_the_cut(tmp_path, decoder, second_psb_at,
                                     reruns, pieces):
    from hwtrace.flow import sinks
    from hwtrace.flow.config import FlowConfig
    pt = tmp_path / "t.pt"
    pt.write_bytes(_loop_trace(second_psb_at))
    (tmp_path / "c.bin").write_bytes(_LOOP)
    pairs = (("raw", f"{tmp_path / 'c.bin'}:0x1000"),)
    opts = ["--raw", f"{tmp_path / 'c.bin'}:0x1000",
            f"--{decoder}-decoder", "--format", "jsonl", "--offset"]
    seq = decode("--pt", pt, *opts)
    assert '"error"' not in seq and seq.count('"ip"') > 1400
    psbs = parallel.psb_offsets(pt.read_bytes())
    assert parallel.segment_starts(psbs, len(pt.read_bytes()), 2, 0) == \
        [psbs[1]]
    out = io.StringIO()
    sink = sinks.JsonSink(out.write, print_offset=True)
    stats = J.decode(parallel.Source(str(pt)), pairs, FlowConfig(),
                            sink, out.write, block=decoder == "block",
                            jobs=2, segments=2, min_segment=0)
    assert (stats["reruns"], stats["pieces"]) == (reruns, pieces)
    assert out.getvalue() == seq
    assert decode("--pt", pt, *opts, jobs=2) == seq
    job0, job1 = _run_jobs(pt, pairs, [psbs[1]], decoder == "block")
    i, j, same = parallel._merge(job0, 0, job1)
    if second_psb_at == "ret":
        assert job1.underflows == [0] and job1.checkpoints[j].pos > psbs[2]
        assert job0.checkpoints[i].pos > psbs[2]
    else:
        assert job0.checkpoints[i].pos < psbs[2] and j == 0
        assert job1.underflows == ([1] if second_psb_at == "jz" else [])
    # the same return stack, except where job 1 lacks the pushed entry
    assert same == (second_psb_at != "jz")


def test_dead_tnt_values_are_never_read(recording, tmp_path):
    # The digest leaves out the TNT cache's bits while it is empty and the
    # query decoder's tnt_end while no bits are cached; scrambling them at
    # every step of a decode changes nothing (offsets of errors included).
    from hwtrace.flow import session, sinks
    from hwtrace.flow.block import BlockDecoder
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.insn import InsnDecoder
    pt, images = recording
    data = pt.read_bytes()
    data = data[:parallel.psb_offsets(data)[6]]
    image = J.load_image(_pairs(images))
    rng = random.Random(1)
    mutated = bytearray(data)
    for _ in range(12):
        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
    for buf in (data, bytes(mutated)):
        for plain in (InsnDecoder, BlockDecoder):
            class Scrambling(plain):
                def _scramble(self):
                    q = getattr(self, "insn", self).query
                    if not q.tnt.index:
                        q.tnt.bits = rng.randrange(1 << 47)
                        q.tnt_end = rng.randrange(len(buf))

                def next(self):
                    self._scramble()
                    return plain.next(self)

                def event(self):
                    self._scramble()
                    return plain.event(self)
            outs = []
            for cls in (plain, Scrambling):
                out = io.StringIO()
                run = session.run_blocks if plain is BlockDecoder else \
                    session.run_insn
                run(cls(buf, image, FlowConfig()),
                    sinks.PtxedSink(out.write, print_offset=True),
                    resync=True)
                outs.append(out.getvalue())
            assert outs[0] == outs[1] and outs[0].count("\n") > 1000
            if buf is not data:
                assert "error" in outs[0]


@pytest.mark.parametrize("decoder", ["block", "insn"])
def test_tracing_off_across_the_cut(tmp_path, decoder):
    # Tracing is off from before the cut to a few PSBs past the end of the
    # tail window: no item, so no checkpoint, until it is on again; job 0
    # decodes on through the PSB+s (no instructions: cheap) and meets job 1
    # at the first instruction after them.
    from hwtrace.flow import sinks
    from hwtrace.flow.config import FlowConfig
    from hwtrace.pt import encoder as P
    trace = (_psb(0x1000) + _loops(600) + P.tip_pgd() + _psb() * 8 +
             P.tip_pge(0x1000, ipc=6) + _loops(20) + _psb(0x1000) +
             _loops(20) + P.fup(0x1000, ipc=6) + P.tip_pgd())
    pt = tmp_path / "t.pt"
    pt.write_bytes(trace)
    (tmp_path / "c.bin").write_bytes(_LOOP)
    pairs = (("raw", f"{tmp_path / 'c.bin'}:0x1000"),)
    psbs = parallel.psb_offsets(trace)
    cut = parallel.segment_starts(psbs, len(trace), 2, 0)
    assert psbs[1] <= cut[0] and \
        parallel.psb_after(trace, cut[0], parallel.TAIL) < psbs[-3]
    seq = decode("--pt", pt, "--raw", f"{tmp_path / 'c.bin'}:0x1000",
                 f"--{decoder}-decoder", "--format", "jsonl", "--offset")
    assert seq.count('"disabled"') >= 7 and seq.count('"ip"') > 1400
    out = io.StringIO()
    sink = sinks.JsonSink(out.write, print_offset=True)
    stats = J.decode(parallel.Source(str(pt)), pairs, FlowConfig(),
                            sink, out.write, block=decoder == "block",
                            jobs=2, segments=2, min_segment=0)
    assert (stats["reruns"], stats["pieces"]) == ([], 2)
    assert out.getvalue() == seq
    job0, job1 = _run_jobs(pt, pairs, cut, decoder == "block")
    assert [cp.pos for cp in job0.checkpoints] == \
        [job1.checkpoints[0].pos] and job0.stopped
    assert psbs[-2] < job1.checkpoints[0].pos < psbs[-1]

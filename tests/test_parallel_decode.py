"""Parallel decoding (hwtrace.flow.parallel): the output of ``--jobs N``
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
from conftest import BUILD, CORPUS, run_hwtrace

from hwtrace.flow import parallel

GZIP = shutil.which("gzip") or "/usr/bin/gzip"


@pytest.fixture(scope="module")
def recording():
    """gzip -9 of 10 KiB of text, recorded by the emulated engine with a
    PSB every 2 KiB of trace: (trace path, image arguments)."""
    d = BUILD / "test-parallel"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    text = b"".join(p.read_bytes() for p in sorted(CORPUS.glob("*/*.ptt")))
    (d / "in.txt").write_bytes(text[:10 << 10])
    r = run_hwtrace("record", "--copy-images", "--config",
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
    stats = parallel.decode(parallel.Source(str(pt)), pairs, FlowConfig(),
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


def test_seeded_mutations_identical(recording, tmp_path):
    pt, images = recording
    data = pt.read_bytes()
    for seed in range(6):
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
        for opts in (["--format", "jsonl", "--offset"],
                     ["--insn-decoder", "--resync-on-error", "--offset"]):
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


def test_corpus_traces_with_several_psbs(monkeypatch):
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
    seq = decode("--pt", pt, *images, "--format", "jsonl", "--offset")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                                  processes=False, dashboard_address=None,
                                  protocol="tcp") as cluster:
        out, _, stats = _api_decode(pt, images, dask=cluster.scheduler_address,
                                    segments=4)
        assert stats["segments"] == 4
        assert out == seq
        # the CLI path, as a user runs it
        r = run_hwtrace("decode", "--pt", pt, *images, "--format", "jsonl",
                        "--offset", "--dask", cluster.scheduler_address,
                        env=dict(os.environ,
                                 HWTRACE_PARALLEL_MIN_SEGMENT="0"))
        assert r.returncode == 0, r.stderr
        assert r.stdout == seq

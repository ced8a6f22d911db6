"""``hwtrace decode DIR --jobs N`` / ``--dask``: a bundle's streams (and
the PSB segments of a one-process stream whose jobs can meet) decode on N
workers and print exactly what ``--jobs 1`` prints
(hwtrace.cli._bundle_jobs)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess

import pytest

from conftest import run_hwtrace

#: hops between CPU 0 and 1 (sched_setaffinity): a cpu-mode recording
#: with two streams of one process
HOP_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
static volatile long sink;
__attribute__((noinline)) void leaf(int i) { for (int k = 0; k < 20000; k++) sink += k ^ i; }
__attribute__((noinline)) void hop(int cpu) {
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s); leaf(cpu);
}
int main(void) { for (int i = 0; i < 6; i++) { hop(i & 1); leaf(i); }
                 printf("%ld\n", sink); return 0; }
"""

#: MTC without CYC (hwtrace record's default): jobs of a later PSB never
#: meet the sequential state (fast_parallel.jobs_can_meet)
MTC = "branch;user;retc;tsc;mtc"
#: no MTC: segment jobs meet at their first checkpoints
PLAIN = "branch;user;retc;tsc"


def _record(d, config):
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("gcc is needed")
    src = d / "hop.c"
    src.write_text(HOP_C)
    exe = d / "hop"
    subprocess.run([gcc, "-O1", "-static", "-o", str(exe), str(src)],
                   check=True)
    b = d / "b"
    r = run_hwtrace("record", "--copy-images", "--config", config, "-o", b,
                    "--", exe)
    if r.returncode != 0:
        pytest.skip(f"recording failed: {r.stderr.strip()}")
    streams = sorted(p.name for p in b.glob("*.pt") if p.stat().st_size > 1000)
    assert len(streams) >= 2, streams       # the premise: two CPUs' streams
    return b


@pytest.fixture(scope="module")
def hop_mtc(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("hop-mtc"), MTC)


@pytest.fixture(scope="module")
def hop_plain(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("hop-plain"), PLAIN)


def _decode(argv, monkeypatch):
    """``hwtrace decode *argv`` in this process: (stdout, stderr, the jobs
    handed to workers as (stream, kind, start, end))."""
    from hwtrace import jobs
    from hwtrace.cli import main
    handed = []
    submit = getattr(jobs.Executor, "submit", None)

    def spy(self, fn, job):
        handed.append((job.stream, job.kind, job.start, job.end))
        return submit(self, fn, job)
    if submit is not None:
        monkeypatch.setattr(jobs.Executor, "submit", spy)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["decode", *argv]) == 0
    monkeypatch.undo()
    return out.getvalue(), err.getvalue(), handed


OPTIONS = [[], ["--format", "jsonl", "--annotate"], ["--quiet", "--stat"],
           ["--offset", "--stat", "--insn-decoder"]]


@pytest.mark.parametrize("opts", OPTIONS, ids=" ".join)
def test_streams_on_workers_print_the_sequential_output(hop_mtc, opts,
                                                        monkeypatch):
    """Each stream is a job of its own (MTC without CYC: not cut, however
    small the segments may be), the largest decoded by the command itself,
    the others by workers, and the output is --jobs 1's."""
    seq = _decode([str(hop_mtc), *opts], monkeypatch)
    monkeypatch.setenv("HWTRACE_PARALLEL_MIN_SEGMENT", "0")
    monkeypatch.setenv("HWTRACE_PARALLEL_SEGMENTS", "4")
    par = _decode([str(hop_mtc), *opts, "--jobs", "2"], monkeypatch)
    assert par[:2] == seq[:2]
    streams = sorted(p.name for p in hop_mtc.glob("*.pt"))
    largest = max(hop_mtc.glob("*.pt"), key=lambda p: p.stat().st_size).name
    assert sorted(s for s, _k, _a, _b in par[2]) == \
        [s for s in streams if s != largest]
    assert all(k == "whole" for _s, k, _a, _b in par[2])
    assert seq[0].count("[stream ") + seq[0].count('{"stream":') == len(streams)


@pytest.mark.parametrize("opts", OPTIONS, ids=" ".join)
def test_segments_of_a_stream_stitched(hop_plain, opts, monkeypatch):
    """Without MTC a one-process stream is cut at PSBs: its jobs' counts
    (--quiet --stat) or listings (walked in the workers) are stitched
    where their states meet -- at once here (no job runs twice) -- into
    the sequential output."""
    seq = _decode([str(hop_plain), *opts], monkeypatch)
    monkeypatch.setenv("HWTRACE_PARALLEL_MIN_SEGMENT", "0")
    monkeypatch.setenv("HWTRACE_PARALLEL_SEGMENTS", "4")
    par = _decode([str(hop_plain), *opts, "--jobs", "2"], monkeypatch)
    assert par[:2] == seq[:2]
    kind = "count" if "--quiet" in opts else "list"
    big = sorted(p.name for p in hop_plain.glob("*.pt")
                 if p.stat().st_size > 1000)
    for name in big:
        mine = [j for j in par[2] if j[0] == name]
        assert len(mine) == 4 and {k for _s, k, _a, _b in mine} == {kind}
        assert [a for _s, _k, a, _b in mine][0] is None
        assert [b for _s, _k, _a, b in mine][-1] is None


@pytest.mark.parametrize("opts", [[], ["--quiet", "--stat"]], ids=" ".join)
def test_on_two_workers_streams_are_not_cut(hop_plain, opts, monkeypatch):
    """Without the test knobs, on two workers a stream is one job even
    where its segments could meet: a counts job decodes ~3 times slower
    than the sequential count, and a listing job holds its whole output
    (measured: both lose to one job)."""
    seq = _decode([str(hop_plain), *opts], monkeypatch)
    monkeypatch.delenv("HWTRACE_PARALLEL_SEGMENTS", raising=False)
    monkeypatch.delenv("HWTRACE_PARALLEL_MIN_SEGMENT", raising=False)
    par = _decode([str(hop_plain), *opts, "--jobs", "2"], monkeypatch)
    assert par[:2] == seq[:2]
    assert par[2] and all(k == "whole" for _s, k, _a, _b in par[2])


def test_listings_past_the_spool_limit_are_decoded_by_the_command(
        hop_mtc, monkeypatch):
    """What workers would spool past SPOOL_LIMIT is decoded by the
    command itself, in order (here: everything, so no worker is asked);
    counts spool nothing and still go to the workers."""
    from hwtrace.cli import _bundle_jobs as BJ
    seq = _decode([str(hop_mtc)], monkeypatch)
    monkeypatch.setattr(BJ, "SPOOL_LIMIT", 0)
    par = _decode([str(hop_mtc), "--jobs", "2"], monkeypatch)
    assert par[:2] == seq[:2] and par[2] == []
    monkeypatch.setattr(BJ, "SPOOL_LIMIT", 0)
    par = _decode([str(hop_mtc), "--quiet", "--stat", "--jobs", "2"],
                  monkeypatch)
    assert par[2]


def test_one_stream_and_one_job_is_the_sequential_decode(hop_plain,
                                                          monkeypatch):
    """--stream NAME of a stream too small to cut: nothing to share out,
    no workers started."""
    name = sorted(p.name for p in hop_plain.glob("*.pt"))[0]
    seq = _decode([str(hop_plain), "--stream", name], monkeypatch)
    par = _decode([str(hop_plain), "--stream", name, "--jobs", "0"],
                  monkeypatch)
    assert par[:2] == seq[:2] and par[2] == []


def _die(job):
    os._exit(3)             # a worker killed (out of memory, a signal)


@pytest.mark.parametrize("config", ["mtc", "plain"])
def test_a_dead_worker_leaves_its_streams_to_the_command(config, request,
                                                         monkeypatch):
    """Workers that die: their streams are decoded by the command itself,
    and the output is still the sequential one."""
    from hwtrace.cli import _bundle_jobs as BJ
    b = request.getfixturevalue(f"hop_{config}")
    seq = _decode([str(b), "--stat"], monkeypatch)
    monkeypatch.setenv("HWTRACE_PARALLEL_MIN_SEGMENT", "0")
    monkeypatch.setenv("HWTRACE_PARALLEL_SEGMENTS", "3")
    monkeypatch.setattr(BJ, "run_job", _die)
    par = _decode([str(b), "--stat", "--jobs", "2"], monkeypatch)
    assert par[:2] == seq[:2] and par[2]


def test_jobs_on_a_bundle_from_the_command_line(hop_mtc):
    """As a user runs it: the same bytes; a bad --jobs is a one-line
    error."""
    for opts in ([], ["--quiet", "--stat"]):
        a = run_hwtrace("decode", hop_mtc, *opts)
        b = run_hwtrace("decode", hop_mtc, *opts, "--jobs", "2")
        assert a.returncode == b.returncode == 0, b.stderr
        assert (a.stdout, a.stderr) == (b.stdout, b.stderr)
    r = run_hwtrace("decode", hop_mtc, "--jobs", "-1")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "hwtrace: --jobs: bad argument: -1\n"


def test_dask_local_cluster(hop_plain, monkeypatch):
    """--dask: the workers open the bundle themselves (at the same
    path); the output is the sequential one."""
    distributed = pytest.importorskip("distributed")
    seq = _decode([str(hop_plain), "--format", "jsonl"], monkeypatch)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                                  processes=True, dashboard_address=None) \
            as cluster:
        monkeypatch.setenv("HWTRACE_PARALLEL_MIN_SEGMENT", "0")
        monkeypatch.setenv("HWTRACE_PARALLEL_SEGMENTS", "3")
        par = _decode([str(hop_plain), "--format", "jsonl", "--dask",
                       cluster.scheduler_address], monkeypatch)
    assert par[:2] == seq[:2]


def test_dask_scheduler_not_there_is_one_line(hop_mtc, tmp_path):
    """--dask at an address no scheduler can be at: one line, exit status
    2, for a bundle and for a raw trace (a bundle's said nothing useful in
    a traceback; a raw trace's said it could not read the trace)."""
    pytest.importorskip("distributed")
    pt = next(p for p in sorted(hop_mtc.iterdir()) if p.suffix == ".pt")
    for args in ([hop_mtc], ["--pt", pt, "--quiet", "--stat"]):
        r = run_hwtrace("decode", *args, "--dask", "nope://x")
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("hwtrace: decode: --dask nope://x: no scheduler there:"), \
            r.stderr

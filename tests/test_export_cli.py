"""``hwtrace export`` and ``hwtrace summary`` as a user runs them: on a flow
file (gdb-stepped fib) and on a real Intel PT recording (hase's loopy,
imported with ``hwtrace import``)."""

from __future__ import annotations

import io
import sys
import json
from collections import Counter

import pytest

from conftest import FIXTURES, IN_CI, run_hwtrace

from hwtrace.export.drcov import read_drcov
from hwtrace.export.progress import Progress

from test_export_formats import expected_folded, real_fib_flow, slices_from_perfetto

LOOPY = FIXTURES / "hase_loopy"


@pytest.fixture(scope="module")
def fib_jsonl(tmp_path_factory):
    flow = real_fib_flow()
    p = tmp_path_factory.mktemp("fib") / "fib.jsonl"
    with open(p, "w") as f:
        for it in flow.items:
            f.write(json.dumps(it) + "\n")
    return p, f"{flow.exe}:{flow.bias:#x}", flow


def one_line_error(r):
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr.strip()


def test_export_all_formats_from_flow_file(fib_jsonl, tmp_path):
    path, elf, flow = fib_jsonl
    o = {k: tmp_path / f"out.{k}" for k in ("json", "pftrace", "folded", "drcov", "info")}
    r = run_hwtrace("export", path, "--elf", elf, "--chrome", o["json"],
                    "--perfetto", o["pftrace"], "--folded", o["folded"],
                    "--drcov", o["drcov"], "--lcov", o["info"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    # not a terminal: no progress bar, just the one summary line
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"hwtrace export: 1 stream(s), {len(flow.items):,} instructions, "
                               f"268 activations, no gaps")
    ev = json.loads(o["json"].read_text())["traceEvents"]
    assert Counter(e["name"] for e in ev if e["ph"] == "X") == \
        Counter({"fib": 177, "leaf": 90, "main": 1})
    try:
        slices, _, _ = slices_from_perfetto(o["pftrace"].read_bytes())
    except pytest.skip.Exception:
        slices = None
    if slices is not None:
        assert Counter(s[0] for s in slices)["fib"] == 177
    folded = Counter()
    for line in o["folded"].read_text().splitlines():
        stack, w = line.rsplit(" ", 1)
        folded[stack.split(";")[-1]] += int(w)
    assert sum(folded.values()) == len(flow.items)
    mods, bbs = read_drcov(o["drcov"].read_bytes())
    assert [m[3] for m in mods] == [str(flow.exe)] and bbs
    assert "FNDA:177,fib" in o["info"].read_text()


def test_folded_time_weight_option(fib_jsonl, tmp_path):
    path, elf, flow = fib_jsonl
    out = tmp_path / "t.folded"
    r = run_hwtrace("export", path, "--elf", elf, "--folded", out, "--weight", "time")
    assert r.returncode == 0, r.stderr
    total = sum(int(l.rsplit(" ", 1)[1]) for l in out.read_text().splitlines())
    assert total == len(flow.items)          # no timing: time = instructions


def test_summary_of_flow_file(fib_jsonl):
    path, elf, flow = fib_jsonl
    r = run_hwtrace("summary", path, "--elf", elf)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[1] == f"1 stream(s), {len(flow.items):,} instructions, 268 activations, clock: instructions"
    assert out[2] == "lost data / errors: none"
    rows = {l.split()[0]: l.split() for l in out[4:] if l.strip()}
    assert rows["fib"][1] == "177" and rows["leaf"][1] == "90" and rows["main"][1] == "1"
    # fib's inclusive instructions: the top-level call's, not the sum over
    # the recursion; checked against the independent stack model
    model = expected_folded(flow)
    assert rows["fib"][4] == f"{sum(w for k, w in model.items() if k.startswith('main;fib')):,}"
    assert rows["fib"][2] == f"{sum(w for k, w in model.items() if k.endswith('fib')):,}"
    # main's inclusive instructions are the whole flow
    assert rows["main"][4] == f"{len(flow.items):,}"
    assert len(out) <= 25                    # one screen
    assert len(r.stderr.strip().splitlines()) == 1


def test_user_errors_are_one_line(fib_jsonl, tmp_path):
    path, elf, _ = fib_jsonl
    assert "nothing to write" in one_line_error(run_hwtrace("export", path))
    assert "no such bundle or file" in one_line_error(
        run_hwtrace("export", tmp_path / "nope", "--chrome", tmp_path / "x.json"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ip": 1, "size": 1, "iclass": "other"}\nnot json\n')
    assert f"{bad}:2: not JSON" in one_line_error(
        run_hwtrace("export", bad, "--chrome", tmp_path / "x.json"))
    assert "cannot write" in one_line_error(
        run_hwtrace("export", path, "--chrome", tmp_path / "no" / "dir" / "x.json"))
    assert "--elf" in one_line_error(
        run_hwtrace("export", path, "--elf", tmp_path / "nope.elf", "--chrome", tmp_path / "x.json"))
    notbundle = tmp_path / "empty"
    notbundle.mkdir()
    one_line_error(run_hwtrace("summary", notbundle))
    assert "--top" in one_line_error(run_hwtrace("summary", path, "--top", "0"))


_INTERRUPTED = """
import os, signal, sys
# a Ctrl-C reaches a process that takes it (one started in the background
# by a non-interactive shell, as a CI job may be, inherits SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
from hwtrace.cli import main
from hwtrace.export import chrome
seen = chrome.ChromeTraceWriter.add_slices
def add_slices(self, chunk, ctx):
    seen(self, chunk, ctx)
    self._fp.flush()                    # bytes on disk, as a long export has them
    os.kill(os.getpid(), signal.SIGINT) # the user's Ctrl-C, half-way
chrome.ChromeTraceWriter.add_slices = add_slices
sys.exit(main(sys.argv[1:]))
"""


def _leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


def test_an_interrupted_export_leaves_the_old_files(fib_jsonl, tmp_path):
    # Ctrl-C half-way: no file cut anywhere (a JSON no viewer opens) over the
    # good one of an earlier run, and no temporary file left behind
    import subprocess
    path, elf, _ = fib_jsonl
    out = {k: tmp_path / f"t.{k}" for k in ("json", "folded")}
    for p in out.values():
        p.write_text("earlier run\n")
    r = subprocess.run([sys.executable, "-c", _INTERRUPTED, "export", str(path),
                        "--elf", elf, "--chrome", str(out["json"]),
                        "--folded", str(out["folded"])],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "hwtrace: interrupted"
    assert "Traceback" not in r.stderr
    assert all(p.read_text() == "earlier run\n" for p in out.values())
    assert _leftovers(tmp_path) == []


def test_export_replaces_a_file_whole_and_keeps_what_it_is(fib_jsonl, tmp_path):
    import os
    import stat
    path, elf, _ = fib_jsonl
    old = tmp_path / "t.json"
    old.write_text("earlier run\n")
    os.chmod(old, 0o640)
    link = tmp_path / "link.folded"
    real = tmp_path / "real.folded"
    real.write_text("")
    link.symlink_to(real.name)
    r = run_hwtrace("export", path, "--elf", elf, "--chrome", old, "--folded", link,
                    "--perfetto", "/dev/null")
    assert r.returncode == 0, r.stderr
    assert json.loads(old.read_text())["traceEvents"]
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert link.is_symlink() and "fib" in real.read_text()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert _leftovers(tmp_path) == []
    # an error after the outputs were opened: none of them written
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ip": 1, "size": 1, "iclass": "other"}\nnot json\n')
    r = run_hwtrace("export", bad, "--chrome", old, "--folded", tmp_path / "new.folded")
    assert r.returncode == 2 and "not JSON" in r.stderr
    assert json.loads(old.read_text())["traceEvents"]
    assert not (tmp_path / "new.folded").exists() and _leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def loopy_bundle(tmp_path_factory, hardware):
    out = tmp_path_factory.mktemp("loopy") / "bundle"
    r = run_hwtrace("import", LOOPY / "loopy-20180404T162955.perf", "-o", out,
                    "--image", LOOPY / "loopy")
    if r.returncode != 0:
        if IN_CI:
            pytest.fail(f"hwtrace import failed: {r.stderr.strip()}")
        pytest.skip(f"hwtrace import not usable yet: {r.stderr.strip()}")
    return out


def test_real_recording_summary(loopy_bundle):
    # loopy (argc 6) loops 5 times over a write syscall, then exits:
    # 1 + 5 * 10 + 6 instructions, 7 syscalls; `again` is entered by the
    # loop's jne (a jump to a symbol start), the exit path falls through
    r = run_hwtrace("summary", loopy_bundle)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[1].startswith("1 stream(s), 57 instructions, 9 activations, clock: ns")
    rows = {l.split()[0]: l.split() for l in out[4:] if l.strip()}
    assert rows["again"][1:5] == ["1", "46", "80.7%", "46"]
    assert rows["_start"][1:5] == ["1", "11", "19.3%", "11"]
    assert rows["[syscall]"][1] == "7"


def test_real_recording_export(loopy_bundle, tmp_path):
    cj, fo = tmp_path / "t.json", tmp_path / "t.folded"
    r = run_hwtrace("export", loopy_bundle, "--chrome", cj, "--folded", fo)
    assert r.returncode == 0, r.stderr
    ev = json.loads(cj.read_text())["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert Counter(e["name"] for e in xs) == Counter({"[syscall]": 7, "_start": 1, "again": 1})
    # cpu mode: the CPU's stream follows its thread by the sideband's
    # context switches, so the slices are on loopy's own thread track
    assert {(e["pid"], e["tid"]) for e in xs} == {(19233, 19233)}
    names = {e["args"]["name"] for e in ev if e["ph"] == "M"}
    # the process is named by what it ran, as perf recorded it: perf's
    # workload wrapper (its comm), then the exec'd loopy
    assert names == {".perf-wrapped -> loopy", "thread 19233"}
    assert sorted(fo.read_text().splitlines()) == ["_start 11", "again 46"]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_only_on_a_terminal():
    quiet = io.StringIO()
    p = Progress("x", stream=quiet)
    for _ in range(5):
        p(1000)
    p.done("x: done")
    assert quiet.getvalue().startswith("x: done (") and quiet.getvalue().count("\n") == 1
    tty = _Tty()
    p = Progress("decoding", total=4000, stream=tty)
    p._last = -1.0
    p(1000)
    assert "\r" in tty.getvalue() and "25%" in tty.getvalue()
    p.done("decoding: done")
    assert tty.getvalue().endswith("\n") and "decoding: done" in tty.getvalue()


def test_a_warning_never_lands_on_the_progress_bar(monkeypatch):
    """A warning (or an error) while the bar shows erases the bar first:
    the warning is a line of its own; the bar comes back at its next
    redraw, and the summary line ends the output."""
    from hwtrace.cli import warn
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    p = Progress("decoding", total=4000, stream=tty)
    p._last = -1.0
    p(1000)
    warn("something the trace does not tell")
    p._last = -1.0
    p(1000)
    p.done("decoding: done")
    lines = [ln.split("\r")[-1] for ln in tty.getvalue().split("\n")]
    assert lines[0] == "hwtrace: warning: something the trace does not tell"
    assert lines[1].startswith("decoding: done (") and lines[2] == ""
    assert tty.getvalue().count("50%") == 1         # redrawn after the warning
    warn("with no bar")                             # nothing to erase: as is
    assert tty.getvalue().endswith("\nhwtrace: warning: with no bar\n")


def test_branch_records_file_one_track_per_thread(tmp_path):
    # spec/branch-trace.md records of two threads, interleaved: main calls f
    # which calls g; times are TSC-like counts
    recs = []
    for tid, t0 in ((11, 100), (12, 105)):
        recs += [
            {"pid": 1, "tid": tid, "kind": "call", "from": 0x401010, "to": 0x402000, "time": t0},
            {"pid": 1, "tid": tid, "kind": "call", "from": 0x402008, "to": 0x403000, "time": t0 + 10},
            {"pid": 1, "tid": tid, "kind": "return", "from": 0x403020, "to": 0x40200d, "time": t0 + 30},
            {"pid": 1, "tid": tid, "kind": "return", "from": 0x402044, "to": 0x401015, "time": t0 + 50},
        ]
    recs = [recs[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)]
    src = tmp_path / "branches.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "b.json"
    r = run_hwtrace("export", src, "--chrome", out)
    assert r.returncode == 0, r.stderr
    assert "2 stream(s)" in r.stderr
    ev = json.loads(out.read_text())["traceEvents"]
    xs = [(e["tid"], e["name"], e["ts"], e["dur"], e.get("args", {}).get("flags"))
          for e in ev if e["ph"] == "X"]
    # times relative to the first record (100), in us (1 tick shown as 1 ns)
    # on the writer's 2**-10 us grid: compare (begin, end) in grid units
    g = lambda us: round(us * 1024)
    got = [(t, n, g(ts), g(ts + d), f) for t, n, ts, d, f in xs]
    want = [(11, "0x403000", 0.01, 0.03, None), (11, "0x402000", 0.0, 0.05, None),
            (11, "0x401010", 0.0, 0.05, "begin_unknown|truncated"),
            (12, "0x403000", 0.015, 0.035, None), (12, "0x402000", 0.005, 0.055, None),
            (12, "0x401010", 0.005, 0.055, "begin_unknown|truncated")]
    assert got == [(t, n, g(b), g(e), f) for t, n, b, e, f in want]

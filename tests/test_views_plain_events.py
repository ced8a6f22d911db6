"""The call-stack views take a system call's disable/enable and a PSB+'s
status events as rows of the compiled core (``Batch.plain``,
hwtrace.flow.plain), not one Python Event each: the rows tell exactly the
events the core would have made, and the views' output over a program
full of system calls is the twin's (which makes Events, one at a time),
in cpu and thread mode."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest

from conftest import build_programs, compiled_flow_core, run_hwtrace

SYSCALLS = r"""
#include <fcntl.h>
#include <unistd.h>
static volatile long sink;
__attribute__((noinline)) long work(int i) {
    long s = 0;
    for (int k = 0; k < 40; k++) s += k ^ i;
    return s;
}
__attribute__((noinline)) void one(int fd, int i) {
    sink += getppid();
    sink += work(i);
    char c = 'x';
    if (i % 3 == 0) write(fd, &c, 1);
}
int main(void) {
    int fd = open("/dev/null", O_WRONLY);
    for (int i = 0; i < 1500; i++) one(fd, i);
    close(fd);
    return 0;
}
"""

VIEWS = {
    "summary": lambda b, o: ["summary", b],
    "calls": lambda b, o: ["calls", b],
    "folded": lambda b, o: ["export", b, "--folded", o],
    "chrome": lambda b, o: ["export", b, "--chrome", o],
}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    d = tmp_path_factory.mktemp("plain")
    exe = build_programs(d, {"sys": SYSCALLS})["sys"]
    out = {}
    # on one CPU: a process the host moves between CPUs is followed from
    # CPU to CPU, and while a switch is left to apply the round trips are
    # taken one at a time (as they are without rows)
    cpu = min(os.sched_getaffinity(0))
    for mode in ("cpu", "thread"):
        b = d / mode
        r = subprocess.run([sys.executable, "-m", "hwtrace", "record", "--mode", mode,
                            "-o", str(b), "--", str(exe)], capture_output=True, text=True,
                           timeout=600, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        assert r.returncode == 0, r.stderr
        out[mode] = b
    return out


def _key(item):
    """An item as comparable values (an Event: every attribute it has)."""
    from hwtrace.flow.events import Event
    j, off, x = item
    if type(x) is Event:
        return j, off, tuple((a, getattr(x, a)) for a in x.__slots__ if hasattr(x, a))
    return j, off, type(x).__name__, getattr(x, "offset", None)


@pytest.mark.parametrize("mode", ["cpu", "thread"])
def test_rows_tell_the_events_the_core_makes(bundles, mode):
    """Batches with plain_events: the same records; the items and the
    rows made Events are the items without it, in order; the rows are
    what flow.plain.split (the twin of the core's choice) takes out."""
    compiled_flow_core()
    from hwtrace.flow import plain
    from hwtrace.streams import open_bundle
    from hwtrace.flow import fast
    if fast.STATUS.module is None:
        pytest.skip("the compiled flow core is not in use")
    nrows = 0
    for st in open_bundle(bundles[mode]).streams:
        a = list(st.batches(view=True, space_items=True))
        b = list(st.batches(view=True, space_items=True, plain_events=True))
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.plain is None and y.plain is not None
            assert x.blocks.tobytes() == y.blocks.tobytes()
            assert [_key(i) for i in plain.merged(y.items, y.plain)] == \
                [_key(i) for i in x.items]
            kept, rows = plain.split(x.items)
            assert rows.tolist() == y.plain.tolist()
            assert [_key(i) for i in kept] == [_key(i) for i in y.items]
            assert plain.count(y) == len(x.items)
            nrows += len(y.plain)
    assert nrows >= 2 * 2000        # a disable and an enable per system call


def _in_process(argv) -> str:
    from hwtrace.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main([str(a) for a in argv]) == 0
    return out.getvalue()


@pytest.mark.parametrize("mode", ["cpu", "thread"])
def test_views_find_round_trips_on_rows(bundles, mode, monkeypatch, tmp_path):
    """The compiled views find the system calls' round trips on the rows
    (roundtrips.find_rows), no Event made for them."""
    compiled_flow_core()
    from hwtrace.analysis import roundtrips
    from hwtrace.flow import fast, plain
    if fast.STATUS.module is None:
        pytest.skip("the compiled flow core is not in use")
    seen = {"trips": 0, "made": 0}
    find_rows, event = roundtrips.find_rows, plain.event

    def spy(*a, **kw):
        keep, g = find_rows(*a, **kw)
        if g is not None:
            seen["trips"] += int(g.trips().size)
        return keep, g

    def made(row):
        seen["made"] += 1
        return event(row)
    monkeypatch.setattr(roundtrips, "find_rows", spy)
    monkeypatch.setattr(plain, "event", made)
    _in_process(["summary", bundles[mode]])
    from hwtrace.bundle import Bundle
    if len(Bundle.open(bundles[mode]).sideband().switches) > 1:
        pytest.skip("the program moved between CPUs while recorded")
    assert seen["trips"] >= 1900
    assert seen["made"] < 100


@pytest.mark.parametrize("mode", ["cpu", "thread"])
@pytest.mark.parametrize("view", list(VIEWS))
def test_views_over_system_calls_are_the_twins(bundles, mode, view, tmp_path):
    """summary, calls, export --folded and --chrome: the compiled core's
    rows and the twin's Events give the same bytes."""
    outs = []
    for env in ({}, {"HWTRACE_NO_EXTENSIONS": "1"}):
        o = tmp_path / f"out{len(outs)}"
        r = run_hwtrace(*VIEWS[view](bundles[mode], o), env=env)
        assert r.returncode == 0, r.stderr
        outs.append(o.read_bytes() if view in ("folded", "chrome")
                    else r.stdout.encode())
    assert outs[0] == outs[1]
    assert b"getppid" in outs[0]

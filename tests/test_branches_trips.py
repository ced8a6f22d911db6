"""The compiled system-call round trips of the decoded branch source
(``trips`` in hwtrace/branches/core/trips.c): the same records as the
twin (``_Consumer.feed_batch`` one event at a time, with the compiled
transfers or numpy's), on recordings full of system calls -- threads
taking turns on one CPU, a signal handler entered on the way back from
one, a fork -- in cpu and thread mode, with and without a mask."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import build_programs, have
from hwtrace.branches import MaskSpec, TriggerSpec, _impl, decoded
from hwtrace.branches.decoded import decoded_records

_TRIPS = getattr(decoded._Consumer, "_trips", None)
ENV = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

SYSCALLS_C = r"""
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile long hits;
static void on_usr1(int sig) { (void)sig; hits++; }
__attribute__((noinline)) static long calls(long n)
{
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += getppid();                  /* a plain round trip */
        if (i % 50 == 49)
            raise(SIGUSR1);              /* a handler on the way back */
    }
    return s;
}
static void *worker(void *arg)
{
    (void)arg;
    for (int r = 0; r < 4; r++) {
        calls(300);
        sched_yield();
    }
    return 0;
}
int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    calls(1000);
    pthread_join(t, 0);
    pid_t p = fork();
    if (p == 0) {
        calls(200);
        _exit(0);
    }
    waitpid(p, 0, 0);
    return hits > 0 ? 0 : 1;
}
"""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    if not (have("gcc") and have("qemu-x86_64")):
        pytest.skip("needs gcc and qemu-x86_64")
    d = tmp_path_factory.mktemp("trips")
    exe = build_programs(d, {"syscalls": SYSCALLS_C}, "-pthread")["syscalls"]
    out = {}
    for mode, pre in (("cpu", ["taskset", "-c", "0"] if have("taskset") else []),
                      ("thread", [])):
        b = d / mode
        r = subprocess.run([*pre, sys.executable, "-m", "hwtrace", "record", "--mode", mode,
                            "-o", str(b), "--", str(exe)],
                           capture_output=True, text=True, env=ENV, timeout=600)
        assert r.returncode == 0, r.stderr
        out[mode] = b
    return out


def _records(monkeypatch, bundle, how: str, mask: MaskSpec) -> bytes:
    """The bundle's records as bytes: ``how`` is "trips" (the compiled
    round trips and transfers), "compiled" (the compiled transfers only,
    round trips one event at a time) or "python" (the twin)."""
    monkeypatch.setattr(decoded._Consumer, "impl", "python" if how == "python" else "compiled")
    if _TRIPS is not None:
        monkeypatch.setattr(decoded._Consumer, "_trips",
                            _TRIPS if how == "trips" else lambda self, *a: None)
    t = decoded_records(bundle, TriggerSpec(), mask)
    return b"".join(a.tobytes() for a in t.arrays())


def _compiled_or_skip():
    if _impl.core_for(None) is None:
        pytest.skip("the compiled branch core is not in use")


@pytest.mark.parametrize("mode", ["cpu", "thread"])
@pytest.mark.parametrize("mask", [
    MaskSpec(), MaskSpec(frozenset({"syscall", "sysret", "call", "return"})),
    MaskSpec(frozenset({"sysret", "iret", "indirect_jump"}))],
    ids=["all", "calls", "resumes"])
def test_trips_give_the_twins_records(monkeypatch, bundles, mode, mask):
    _compiled_or_skip()
    got = {how: _records(monkeypatch, bundles[mode], how, mask)
           for how in ("trips", "compiled", "python")}
    assert got["trips"] == got["compiled"] == got["python"]
    a = np.frombuffer(got["trips"], decoded._DT)
    from hwtrace.branches.records import KIND_CODE
    kinds = set(a["kind"].tolist())
    if "sysret" in mask.kinds:
        assert KIND_CODE["sysret"] in kinds
    if "iret" in mask.kinds:        # the signal handlers' way in and out
        assert KIND_CODE["iret"] in kinds


def test_trips_do_the_plain_round_trips(monkeypatch, bundles):
    """Most system calls of a system-call loop never reach the
    one-at-a-time path: the compiled round trips took their disables
    (the old code had none).  Counted are the disables, not all events:
    how many asynchronous disables (and their CBRs) the recording holds
    depends on how the machine scheduled it (0 to 66 of them here, over
    150 on a loaded CI machine), and those rightly go one at a time."""
    _compiled_or_skip()
    seen = []
    orig = decoded._Consumer._event

    def counting(self, ev, *a):
        seen.append(ev)
        return orig(self, ev, *a)
    monkeypatch.setattr(decoded._Consumer, "_event", counting)
    monkeypatch.setattr(decoded._Consumer, "impl", "compiled")
    a = np.concatenate(list(decoded_records(bundles["thread"]).arrays()))
    from hwtrace.branches.records import KIND_CODE
    syscalls = int((a["kind"] == KIND_CODE["syscall"]).sum())
    assert syscalls > 2000
    # those taken here: a signal's way in and out, a few per batch
    disables = seen.count("disabled")
    assert disables < syscalls / 8, collections.Counter(seen)


def _records_fed(monkeypatch, bundle, how: str, rows: bool, mask: MaskSpec) -> tuple:
    """:func:`_records` with the plain events as rows (``Batch.plain``)
    or all as Event items; and how many rows the batches fed carried."""
    monkeypatch.setattr(decoded.DecodedTrace, "plain_events", rows)
    fed = []
    orig = decoded._Consumer.feed_batch

    def feed_batch(self, batch):
        fed.append(0 if batch.plain is None else len(batch.plain))
        return orig(self, batch)
    monkeypatch.setattr(decoded._Consumer, "feed_batch", feed_batch)
    got = _records(monkeypatch, bundle, how, mask)
    monkeypatch.setattr(decoded._Consumer, "feed_batch", orig)
    return got, sum(fed)


@pytest.mark.parametrize("mode", ["cpu", "thread"])
@pytest.mark.parametrize("mask", [
    MaskSpec(), MaskSpec(frozenset({"syscall", "sysret", "iret", "indirect_jump"}))],
    ids=["all", "resumes"])
def test_rows_give_the_items_records(monkeypatch, bundles, mode, mask):
    """The plain events as rows (the compiled round trips reading their
    columns, and the one-at-a-time loop reading a row's fields) give the
    same records as the same events as Event items -- two threads taking
    turns on one CPU, a signal handler, a fork; the rows path is the
    branches view's (the old code decoded no rows)."""
    _compiled_or_skip()
    got = {}
    for how in ("trips", "compiled", "python"):
        for rows in (True, False):
            got[how, rows], n = _records_fed(monkeypatch, bundles[mode], how, rows, mask)
            assert (n > 2000) if rows else n == 0
    assert len(set(got.values())) == 1
    assert len(got["trips", True]) > 0


def test_trips_rows_out_of_place_is_an_error():
    """A row whose place is behind the items already gone through is a
    broken batch, not a round trip."""
    _compiled_or_skip()
    from hwtrace.flow.plain import PLAIN
    core = _impl.core_for("compiled")
    rows = np.zeros(1, PLAIN)
    z8 = np.zeros(2, np.uint64)
    with pytest.raises(ValueError, match="out of place"):
        core.trips([(0, 0, object())], 1, rows, 0, 0, z8, z8, z8, np.zeros(2, np.uint8), z8,
                   np.zeros(3, np.int64), decoded._KLUT, decoded._FARLUT8, decoded._DELTA,
                   {}, lambda a: -2, lambda a: -1, lambda r, t: -2, decoded._ALL_ALLOWED,
                   decoded._NO_RANGES, True, 1, 1, decoded._TRIP_CODES, decoded._LAYOUT,
                   decoded._PLAIN_LAYOUT, (0, None, None))

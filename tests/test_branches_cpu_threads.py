"""Branch records of threads taking turns on one CPU (a cpu-mode
recording): a new thread's first instructions resume where its creator's
``clone`` returns, and belong to the new thread (as ``hwtrace diff``
pairs them: ``SwitchTimeline.resumes`` with the sideband's creators)."""

from __future__ import annotations


def test_a_new_thread_begins_at_its_creators_clone_return():
    """The rule itself, on one CPU's events: the creator made a system
    call (clone) at 0x1000 and tracing resumes at its fall-through; the
    switch to the new thread is due by the estimate of now, not by the
    last known time.  The creator stopped right there -- and so did the
    new thread, which begins where its creator left off: with the
    sideband's creators the new thread runs; without them (nothing known
    of it) the creator goes on."""
    from hwtrace.analysis.switches import SwitchTimeline
    from hwtrace.branches.decoded import CodeReader, _Consumer
    from hwtrace.branches.mask import Mask
    from hwtrace.branches.records import KINDS
    from hwtrace.branches.tracker import Tracker
    from hwtrace.bundle import Switch
    r = CodeReader()
    r._files["mem"] = b"\x0f\x05\x90\x90"          # syscall; nop; nop
    r.add(0x1000, 4, "mem", 0)
    sw = [Switch(0, 10, -1, -1, 1, 1), Switch(0, 130, 1, 1, 1, 2)]
    for born, runs in (({}, 1), ({2: 1}, 2)):
        t = Tracker(None, Mask(frozenset(KINDS)))
        c = _Consumer(t, None, r, per_cpu=True,
                      follow=SwitchTimeline(sw, 0, 1.0, exact=True), born=born)
        c._event("enabled", 10, False, 0x1000, None)
        assert c.th.tid == 1
        c.insn(0x1000, 2, "far_call")
        c.n = 100
        c._event("disabled", 100, False, None, None)
        c.n = 130
        c._event("enabled", None, False, 0x1002, None)
        assert c.th.tid == runs
        assert [(b.tid, b.kind, b.to) for b in t.out][-1] == (runs, "sysret", 0x1002)


def test_thread_creators_from_the_sideband():
    """Who made each thread: its parent_tid, or for a forked process's
    first thread the parent process (as diff pairs them)."""
    from hwtrace.bundle import Process, Thread
    from hwtrace.streams import thread_creators
    recs = [Process(pid=10, cr3=0x1000, comm="a", exe="/a", ppid=1, time=0),
            Thread(tid=10, pid=10, time=0, parent_tid=0),
            Thread(tid=11, pid=10, time=5, parent_tid=10),
            Process(pid=12, cr3=0x2000, comm="a", exe="/a", ppid=10, time=7),
            Thread(tid=12, pid=12, time=7, parent_tid=0),
            Thread(tid=13, pid=12, time=9, parent_tid=12)]
    assert thread_creators(recs) == ((11, 10), (12, 10), (13, 12))

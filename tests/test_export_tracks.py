"""Tracks and markers: several threads (and CPUs) each get a track in
Chrome JSON and Perfetto; gaps, overflows and errors become instant events."""

from __future__ import annotations

import io
import json
from collections import Counter

from hwtrace.analysis import StreamInfo
from hwtrace.analysis.synth import FlowSynth, fib_calls, fib_flow
from hwtrace.export.chrome import CPU_PID, ChromeTraceWriter
from hwtrace.export.folded import FoldedWriter
from hwtrace.export.perfetto import PerfettoTraceWriter
from hwtrace.export.pipeline import Stream, export_streams

from test_export_formats import (slices_from_chrome, slices_from_perfetto,
                                 assert_chrome_depths)


def lossy_flow():
    """main -> a -> b, overflow, resume in c; then a decode error."""
    s = FlowSynth(["main", "a", "b", "c"])
    s.start("main")
    s.body(3); s.call("a"); s.body(2); s.call("b"); s.body(2)
    items = s.take()
    items.append({"event": "overflow", "offset": 0x1234, "ip_suppressed": False,
                  "ip": s.addr["c"] + 8})
    s.ip = s.addr["c"] + 8
    s.body(4)
    items += s.take()
    items.append({"error": "no memory mapped", "kind": "error", "offset": 0x2000,
                  "ip": 0})
    s.start("a", 4, enabled=False)
    s.body(2)
    items += s.take()
    return s, items


def export(streams, lookup, writers):
    return export_streams(streams, writers, lookup=lookup)


def test_threads_get_their_own_tracks():
    s1, f1 = fib_flow(5)
    s2, f2 = fib_flow(6)
    cj, pf = io.StringIO(), io.BytesIO()
    wc, wp = ChromeTraceWriter(cj), PerfettoTraceWriter(pf)
    export([Stream(StreamInfo(100, 101), f1), Stream(StreamInfo(100, 102), f2)],
           s1.lookup, [wc, wp])
    wc.close()
    ev = json.loads(cj.getvalue())["traceEvents"]
    per_tid = Counter((e["tid"], e["name"]) for e in ev if e["ph"] == "X")
    assert per_tid[(101, "fib")] == fib_calls(5)
    assert per_tid[(102, "fib")] == fib_calls(6)
    meta = {(e["name"], e["tid"], e["args"]["name"]) for e in ev if e["ph"] == "M"}
    assert meta == {("process_name", 101, "process 100"),
                    ("thread_name", 101, "thread 101"),
                    ("thread_name", 102, "thread 102")}
    slices, tracks, _ = slices_from_perfetto(pf.getvalue())
    threads = {t.uuid: t.thread.tid for t in tracks.values() if t.HasField("thread")}
    procs = [t for t in tracks.values() if t.HasField("process")]
    assert [p.process.pid for p in procs] == [100]
    assert all(t.parent_uuid == procs[0].uuid for t in tracks.values() if t.HasField("thread"))
    got = Counter((threads[s[4]], s[0]) for s in slices)
    assert got[(101, "fib")] == fib_calls(5) and got[(102, "fib")] == fib_calls(6)


def test_cpu_mode_tracks():
    s, f = fib_flow(3)
    cj, pf = io.StringIO(), io.BytesIO()
    wc, wp = ChromeTraceWriter(cj), PerfettoTraceWriter(pf)
    export([Stream(StreamInfo(cpu=3), f)], s.lookup, [wc, wp])
    wc.close()
    ev = json.loads(cj.getvalue())["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M"}
    assert names == {"CPUs", "cpu 3"}
    assert {(e["pid"], e["tid"]) for e in ev if e["ph"] == "X"} == {(CPU_PID, 3)}
    slices, tracks, _ = slices_from_perfetto(pf.getvalue())
    procs = [t.process for t in tracks.values() if t.HasField("process")]
    threads = [t.thread for t in tracks.values() if t.HasField("thread")]
    assert [(p.pid, p.process_name) for p in procs] == [(CPU_PID, "CPUs")]
    assert [(t.tid, t.thread_name) for t in threads] == [(3, "cpu 3")]
    assert Counter(x[0] for x in slices)["fib"] == fib_calls(3)


def test_gaps_are_instant_events_and_frames_are_closed():
    s, items = lossy_flow()
    cj, pf, fo = io.StringIO(), io.BytesIO(), io.StringIO()
    wc, wp, wf = ChromeTraceWriter(cj), PerfettoTraceWriter(pf), FoldedWriter(fo)
    totals = export([Stream(StreamInfo(1, 1), iter(items))], s.lookup, [wc, wp, wf])
    wc.close(); wf.close()
    assert totals["markers"] == {"overflow": 1, "error": 1}
    ev = json.loads(cj.getvalue())["traceEvents"]
    inst = [(e["name"], e["args"]["offset"], e["args"]["detail"]) for e in ev if e["ph"] == "i"]
    assert inst == [("overflow", 0x1234, "trace overflow: data lost"),
                    ("error", 0x2000, "no memory mapped")]
    # no staircase: after each gap the stack restarts at depth 0
    sl = slices_from_chrome(ev)
    assert Counter(sl) == Counter({("main", 0): 1, ("a", 1): 1, ("b", 2): 1,
                                   ("c", 0): 1, ("a", 0): 1})
    flags = {e["name"] + str(e["ts"]): e.get("args", {}).get("flags") for e in ev if e["ph"] == "X"}
    assert all(f and "truncated" in f for f in flags.values())
    slices, _, instants = slices_from_perfetto(pf.getvalue())
    assert instants == ["overflow", "error"]
    assert_chrome_depths(slices, ev)
    folded = dict(l.rsplit(" ", 1) for l in fo.getvalue().splitlines())
    # the call instructions count in the caller
    assert folded == {"main": "4", "main;a": "3", "main;a;b": "2", "c": "4", "a": "2"}


def test_folded_per_thread_and_deep_recursion():
    # a 3000-deep recursion: one stack per depth, weights exact
    s = FlowSynth(["main", "r"])
    s.start("main")
    s.body(1)
    depth = 3000
    for _ in range(depth):
        s.call("r")
        s.body(2)
    for _ in range(depth):
        s.ret()
    items = s.take()
    fo = io.StringIO()
    fb = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    wf, wb = FoldedWriter(fo, per_thread=True), FoldedWriter(fb, per_thread=True)
    export([Stream(StreamInfo(5, 6), iter(items))], s.lookup, [wf, wb])
    wf.close(impl="python")
    wb.close()              # the compiled core's where it loaded: the same
    fb.flush()
    assert fb.buffer.getvalue() == fo.getvalue().encode()
    lines = fo.getvalue().splitlines()
    assert len(lines) == depth + 1
    w = {k: int(v) for k, v in (l.rsplit(" ", 1) for l in lines)}
    assert w["thread 6;main"] == 2                       # body + the call
    assert w["thread 6;main;" + ";".join(["r"] * depth)] == 3   # 2 + ret
    assert w["thread 6;main;r"] == 4                     # 2 + call + ret
    assert sum(w.values()) == s.insns

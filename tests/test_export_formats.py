"""Exports of a real program's instruction flow, checked against its known
call tree: Chrome JSON, Perfetto protobuf, folded stacks, drcov, lcov.

Recording is not this layer's job, so the flow is taken honestly from the
real binary: gdb single-steps ``fib.c`` from ``main``'s first instruction
to its return and disassembles every instruction executed (address, size,
mnemonic -> iclass).  ``fib(10)`` calls fib 177 times; 89 of those reach
``leaf``, and main calls ``leaf`` once more.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import BUILD, IN_CI, _need

from hwtrace.analysis import StreamInfo
from hwtrace.analysis.coverage import CoverageCollector
from hwtrace.analysis.symbols import Symbolizer
from hwtrace.export.chrome import ChromeTraceWriter
from hwtrace.export.drcov import read_drcov, write_drcov
from hwtrace.export.folded import FoldedWriter
from hwtrace.export.lcov import write_lcov
from hwtrace.export.perfetto import PerfettoTraceWriter
from hwtrace.export.pipeline import Stream, export_streams

FIB_C = r"""
volatile int sink;
__attribute__((noinline)) int leaf(int x)
{
    return x * 3;
}
__attribute__((noinline)) int fib(int n)
{
    if (n < 2)
        return leaf(n);
    return fib(n - 1) + fib(n - 2);
}
int main(void)
{
    sink = fib(10);
    sink += leaf(1);
    return 0;
}
"""
FIB_N = 10
LEAF_LINE, FIB_LINE, MAIN_LINE = 5, 9, 15      # a line of each body

GDB_STEP = r'''
import gdb, json, os
out = open(os.environ["FLOW_OUT"], "w")
gdb.execute("set pagination off")
gdb.execute("set startup-with-shell off")
gdb.execute("break *main")
gdb.execute("run", to_string=True)
arch = gdb.selected_frame().architecture()
main = int(gdb.parse_and_eval("(long)&main"))
ret = int(gdb.parse_and_eval("*(unsigned long*)$rsp"))
out.write(json.dumps({"main": main, "ret": ret}) + "\n")
if os.environ.get("FLOW_START"):
    # record from there on only (skip what runs before without stepping)
    gdb.execute("tbreak *" + os.environ["FLOW_START"])
    gdb.execute("continue", to_string=True)
while True:
    pc = int(gdb.parse_and_eval("$pc"))
    if pc == ret:
        break
    d = arch.disassemble(pc)[0]
    out.write(json.dumps([pc, d["length"], d["asm"]]) + "\n")
    gdb.execute("stepi", to_string=True)
out.close()
gdb.execute("kill")
'''


def iclass_of(asm: str) -> str:
    m = asm.split()[0]
    if m in ("bnd", "notrack", "rep", "repz") and len(asm.split()) > 1:
        m = asm.split()[1]
    if m.startswith("call"):
        return "call"
    if m.startswith("ret"):
        return "return"
    if m.startswith("jmp"):
        return "jump"
    if m.startswith("j"):
        return "cond_jump"
    if m in ("syscall", "int", "int3", "sysenter"):
        return "far_call"
    return "other"


def fib_tree_depths(n: int, depth: int = 1, out: Counter | None = None):
    """{depth: number of fib activations} of main -> fib(n)."""
    out = Counter() if out is None else out
    out[depth] += 1
    if n >= 2:
        fib_tree_depths(n - 1, depth + 1, out)
        fib_tree_depths(n - 2, depth + 1, out)
    return out


def fib_leaf_depths(n: int, depth: int = 1, out: Counter | None = None):
    """{depth: number of fib(0)/fib(1) activations}."""
    out = Counter() if out is None else out
    if n < 2:
        out[depth] += 1
    else:
        fib_leaf_depths(n - 1, depth + 1, out)
        fib_leaf_depths(n - 2, depth + 1, out)
    return out


class RealFlow:
    def __init__(self, exe: Path, items: list, main: int):
        self.exe = exe
        self.items = items
        self.main = main
        self.sym = Symbolizer()
        probe = Symbolizer().add_image(exe)
        self.bias = main - probe.address_of("main")
        self.image = self.sym.add_image(exe, self.bias)


@lru_cache(maxsize=1)
def _real_flow_cached(build_dir: str):
    d = Path(build_dir)
    d.mkdir(parents=True, exist_ok=True)
    src = d / "fib.c"
    src.write_text(FIB_C)
    exe = d / "fib"
    subprocess.run(["gcc", "-g", "-O0", "-fno-inline", "-o", str(exe), str(src)],
                   check=True, capture_output=True)
    script = d / "step.py"
    script.write_text(GDB_STEP)
    flow = d / "flow.jsonl"
    env = dict(os.environ, FLOW_OUT=str(flow))
    subprocess.run(["gdb", "-q", "-nx", "-batch", "-x", str(script), str(exe)],
                   check=True, capture_output=True, env=env, timeout=300)
    lines = flow.read_text().splitlines()
    head = json.loads(lines[0])
    items = []
    for ln in lines[1:]:
        pc, size, asm = json.loads(ln)
        items.append({"ip": pc, "size": size, "iclass": iclass_of(asm),
                      "mode": "64bit", "speculative": False})
    return exe, items, head["main"]


def real_fib_flow() -> RealFlow:
    """The instruction flow of fib.c's main, from gdb single-stepping."""
    if not (shutil.which("gdb") and shutil.which("gcc")):
        _need("gdb and gcc", "needed to take a real program's flow")
    exe, items, main = _real_flow_cached(str(BUILD / "test-export-fib"))
    return RealFlow(exe, items, main)


@pytest.fixture(scope="module")
def flow():
    return real_fib_flow()


def run_export(flow, writers, coverage=None, info=StreamInfo(pid=7, tid=7)):
    return export_streams([Stream(info, iter(flow.items))], writers,
                          lookup=flow.sym.lookup, coverage=coverage)


def slices_from_chrome(events):
    """(name, depth) of every X slice, depth recomputed from containment."""
    xs = sorted((e for e in events if e["ph"] == "X"),
                key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    out = []
    stack = []
    for e in xs:
        # in the writer's exact grid (2**-10 us), as a viewer adds them
        ts = round(e["ts"] * 1024)
        end = round((e["ts"] + e["dur"]) * 1024)
        while stack and not (ts >= stack[-1][0] and end <= stack[-1][1]):
            stack.pop()
        out.append((e["name"], len(stack)))
        stack.append((ts, end))
    return out


def chrome_depth_choices(events):
    """(name, depths) of every X slice: the depths the Trace Event Format
    allows.  A zero-width slice that starts where the slice around it
    starts may be that slice's first child or a sibling ending where the
    next one begins (a sub-grid PLT stub before its tail call): the
    format cannot say which, so every such depth is allowed."""
    xs = sorted((e for e in events if e["ph"] == "X"),
                key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    out = []
    stack = []
    for e in xs:
        ts = round(e["ts"] * 1024)
        end = round((e["ts"] + e["dur"]) * 1024)
        while stack and not (ts >= stack[-1][0] and end <= stack[-1][1]):
            stack.pop()
        d = len(stack)
        low = d
        if ts == end:
            while low and stack[low - 1][0] == ts:
                low -= 1
        out.append((e["name"], tuple(range(d, low - 1, -1))))
        stack.append((ts, end))
    return out


def assert_chrome_depths(perfetto_slices, events):
    """The perfetto slices' (name, depth) are the chrome slices', where
    chrome's nesting is ambiguous any depth it allows."""
    want = Counter((n, d) for n, d, *_ in perfetto_slices)
    loose = []
    for name, depths in chrome_depth_choices(events):
        if len(depths) == 1:
            want[(name, depths[0])] -= 1
        else:
            loose.append((name, depths))
    for name, depths in loose:
        d = next((d for d in depths if want[(name, d)] > 0), depths[0])
        want[(name, d)] -= 1
    assert +want == Counter() and -want == Counter(), \
        f"perfetto-only {+want}, chrome-only {-want}"


def test_flow_is_the_program(flow):
    c = Counter(i["iclass"] for i in flow.items)
    assert c["call"] == 177 + 90
    assert c["return"] == 177 + 90 + 1          # + main's own return


def test_chrome_slices_equal_call_tree(flow, tmp_path):
    out = tmp_path / "t.json"
    with open(out, "w") as fp:
        w = ChromeTraceWriter(fp, args=True)
        totals = run_export(flow, [w])
        w.close()
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    names = Counter(e["name"] for e in xs)
    assert names == Counter({"fib": 177, "leaf": 90, "main": 1})
    assert totals["insns"] == len(flow.items)
    # nesting equals the call tree: fib at depths 1..10 as fib(10) recurses
    sl = slices_from_chrome(ev)
    fib_depths = Counter(d for n, d in sl if n == "fib")
    assert fib_depths == fib_tree_depths(FIB_N)
    # leaf hangs off every fib(1)/fib(0) (depth + 1) and off main (depth 1)
    leaf_depths = Counter(d for n, d in sl if n == "leaf")
    want = Counter({1: 1})
    for d, k in fib_leaf_depths(FIB_N).items():
        want[d + 1] += k
    assert leaf_depths == want
    assert ("main", 0) in sl
    # every slice is on the thread's track, timed in instructions
    assert {(e["pid"], e["tid"]) for e in xs} == {(7, 7)}
    main = next(e for e in xs if e["name"] == "main")
    assert main["args"]["insns"] == len(flow.items)
    assert main["dur"] == round(len(flow.items) / 1000 * 1024) / 1024
    assert doc["otherData"]["clock"] == "insns"
    meta = [e for e in ev if e["ph"] == "M" and e["name"] == "thread_name"]
    assert meta[0]["args"]["name"] == "thread 7"


def perfetto_pb2():
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError:
        if IN_CI:
            pytest.fail("perfetto (PyPI) missing in CI")
        pytest.skip("perfetto (PyPI) not installed")
    return perfetto_trace_pb2


def slices_from_perfetto(data: bytes):
    pb = perfetto_pb2()
    trace = pb.Trace.FromString(data)
    names: dict = {}
    tracks = {}
    stacks: dict = {}
    out = []
    instants = []
    last_ts: dict = {}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
            continue
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            names[seq] = {}
        for en in p.interned_data.event_names:
            names[seq][en.iid] = en.name
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        assert p.timestamp >= last_ts.get(seq, 0)
        last_ts[seq] = p.timestamp
        st = stacks.setdefault(te.track_uuid, [])
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            st.append((names[seq][te.name_iid], p.timestamp))
        elif te.type == pb.TrackEvent.TYPE_SLICE_END:
            name, ts = st.pop()
            out.append((name, len(st), ts, p.timestamp, te.track_uuid))
        elif te.type == pb.TrackEvent.TYPE_INSTANT:
            instants.append(names[seq][te.name_iid])
    assert all(not s for s in stacks.values())
    return out, tracks, instants


def test_perfetto_field_numbers_match_pb2():
    pb = perfetto_pb2()
    from hwtrace.export import perfetto as P
    num = lambda m, f: m.DESCRIPTOR.fields_by_name[f].number
    assert num(pb.TracePacket, "timestamp") == P._PKT_TS
    assert num(pb.TracePacket, "trusted_packet_sequence_id") == P._PKT_SEQ
    assert num(pb.TracePacket, "track_event") == P._PKT_TRACK_EVENT
    assert num(pb.TracePacket, "interned_data") == P._PKT_INTERNED
    assert num(pb.TracePacket, "sequence_flags") == P._PKT_FLAGS
    assert num(pb.TracePacket, "track_descriptor") == P._PKT_TRACK_DESC
    assert num(pb.TrackEvent, "type") == P._TE_TYPE
    assert num(pb.TrackEvent, "name_iid") == P._TE_NAME_IID
    assert num(pb.TrackEvent, "track_uuid") == P._TE_TRACK
    assert num(pb.InternedData, "event_names") == P._ID_EVENT_NAMES
    assert pb.TrackEvent.TYPE_SLICE_BEGIN == P.SLICE_BEGIN


def test_perfetto_holds_the_same_slices(flow, tmp_path):
    pf = io.BytesIO()
    cj = io.StringIO()
    wp = PerfettoTraceWriter(pf)
    wc = ChromeTraceWriter(cj)
    run_export(flow, [wp, wc])
    wc.close()
    slices, tracks, instants = slices_from_perfetto(pf.getvalue())
    assert Counter(s[0] for s in slices) == Counter({"fib": 177, "leaf": 90, "main": 1})
    assert_chrome_depths(slices, json.loads(cj.getvalue())["traceEvents"])
    # one thread track under one process track
    threads = [t for t in tracks.values() if t.HasField("thread")]
    assert [(t.thread.pid, t.thread.tid) for t in threads] == [(7, 7)]
    assert {s[4] for s in slices} == {threads[0].uuid}
    main = next(s for s in slices if s[0] == "main")
    assert main[3] - main[2] == len(flow.items)
    assert instants == []


def expected_folded(flow):
    """Independent model: walk the flow, calls push the callee's name and
    returns pop; weight every instruction to the current stack."""
    lookup = flow.sym.lookup
    stack = ["main"]
    weights = Counter()
    pend = None
    for it in flow.items:
        if pend == "call":
            stack.append(lookup(it["ip"])[1])
        elif pend == "return":
            stack.pop()
        weights[";".join(stack)] += 1
        pend = it["iclass"] if it["iclass"] in ("call", "return") else None
    return weights


def parse_folded(text: str) -> Counter:
    c = Counter()
    for line in text.splitlines():
        stack, w = line.rsplit(" ", 1)
        c[stack] += int(w)
    return c


def test_folded_insns_match_independent_model(flow):
    buf = io.StringIO()
    w = FoldedWriter(buf, weight="insns")
    run_export(flow, [w])
    w.close()
    got = parse_folded(buf.getvalue())
    assert got == expected_folded(flow)
    assert sum(got.values()) == len(flow.items)
    assert got["main;" + ";".join(["fib"] * FIB_N)] > 0
    assert "main;" + ";".join(["fib"] * (FIB_N + 1)) not in got


def test_folded_time_weight_equals_insns_without_timing(flow):
    a, b = io.StringIO(), io.StringIO()
    wa, wb = FoldedWriter(a, "insns"), FoldedWriter(b, "time")
    run_export(flow, [wa, wb])
    wa.close(); wb.close()
    assert parse_folded(a.getvalue()) == parse_folded(b.getvalue())


@pytest.mark.parametrize("kw", [{}, {"weight": "time"}, {"root": "fib"},
                                {"per_thread": True}])
def test_folded_compiled_lines_match_twin(flow, kw):
    """The compiled core's lines (written to the file's byte buffer),
    from weights the analysis core's table summed, are the twin's, byte
    for byte and in the same order."""
    files = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2)]
    ws = [FoldedWriter(f, impl=i, **kw) for f, i in zip(files, ("compiled", "python"))]
    run_export(flow, ws)
    ws[0].close(impl="compiled")
    ws[1].close(impl="python")
    got = [f.flush() or f.buffer.getvalue() for f in files]
    assert got[0] == got[1] and got[0].count(b"\n") > 3
    if "root" in kw:
        assert all(line.startswith(b"fib") for line in got[0].splitlines())


def test_folded_compiled_lends_its_buffer_only_for_the_call(flow):
    """The core hands ``write`` a view of its own buffer (no bytes copy):
    a writer that keeps the chunk finds it released, not overwritten."""
    from hwtrace.export import _textcols_impl
    core = _textcols_impl.core_for("compiled")
    w = FoldedWriter(io.StringIO())
    run_export(flow, [w])
    kept, copied = [], []

    def write(chunk):
        kept.append(chunk)
        copied.append(bytes(chunk))
    w._write_compiled(core, "strict", write)
    assert kept and b"".join(copied).count(b"\n") > 3
    for chunk in kept:
        with pytest.raises(ValueError):
            bytes(chunk)


def test_perfetto_compiled_packets_match_twin(flow):
    """The compiled slice packets are the twin's, byte for byte."""
    bufs = [io.BytesIO(), io.BytesIO()]
    ws = [PerfettoTraceWriter(bufs[0], impl="compiled"),
          PerfettoTraceWriter(bufs[1], impl="python")]
    run_export(flow, ws)
    for w in ws:
        w.close()
    assert bufs[0].getvalue() == bufs[1].getvalue()
    assert ws[0].slices > 100


@pytest.mark.parametrize("args", [False, True])
def test_chrome_compiled_events_match_twin(flow, args):
    """The compiled "X" events (and, with args, the compiled Lines) are
    the twin's, byte for byte."""
    bufs = [io.StringIO(), io.StringIO()]
    ws = [ChromeTraceWriter(bufs[0], args=args, impl="compiled"),
          ChromeTraceWriter(bufs[1], args=args, impl="python")]
    run_export(flow, ws)
    for w in ws:
        w.close()
    assert bufs[0].getvalue() == bufs[1].getvalue()
    assert ws[0].slices > 100


def independent_blocks(items):
    """Distinct basic blocks: start after a branch; end at a branch."""
    blocks = set()
    start = None
    nxt = None
    for it in items:
        if start is not None and it["ip"] != nxt:
            blocks.add((start, nxt - start))
            start = None
        if start is None:
            start = it["ip"]
        nxt = it["ip"] + it["size"]
        if it["iclass"] != "other":
            blocks.add((start, nxt - start))
            start = None
    if start is not None:
        blocks.add((start, nxt - start))
    return blocks


def test_drcov_blocks_and_modules(flow, tmp_path):
    cov = CoverageCollector()
    run_export(flow, [], coverage=cov)
    blocks = cov.finish()
    want = independent_blocks(flow.items)
    assert set(blocks) == want
    img = flow.image
    out = tmp_path / "cov.drcov"
    with open(out, "wb") as fp:
        written, skipped = write_drcov(fp, blocks, [(str(flow.exe), img.low, img.high)])
    assert (written, skipped) == (len(want), 0)
    data = out.read_bytes()
    # an independent parse of the layout: text header, then 8-byte records
    head, _, rest = data.partition(b"BB Table: ")
    lines = head.decode().splitlines()
    assert lines[0] == "DRCOV VERSION: 2"
    assert lines[2] == "Module Table: version 2, count 1"
    assert lines[4].split(", ")[-1] == str(flow.exe)
    n = int(rest.split(b" ", 1)[0])
    table = rest.split(b"\n", 1)[1]
    assert n == len(want) and len(table) == 8 * n
    recs = {(img.low + s, sz) for s, sz, mid in struct.iter_unpack("<IHH", table)}
    assert recs == want
    modules, bbs = read_drcov(data)
    assert modules == [(0, img.low, img.high, str(flow.exe))]
    assert {(img.low + off, sz) for _m, off, sz in bbs} == want
    # fib's entry block is in there, at fib's offset in the module
    fib = img.address_of("fib")
    assert any(img.low + off == fib for _m, off, _s in bbs)


def test_lcov_line_counts(flow, tmp_path):
    cov = CoverageCollector()
    run_export(flow, [], coverage=cov)
    buf = io.StringIO()
    res = write_lcov(buf, cov.finish(), flow.sym)
    text = buf.getvalue()
    src = str(flow.exe.parent / "fib.c")
    assert src in res
    da = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("SF:"):
            cur = line[3:]
        elif line.startswith("DA:") and cur == src:
            ln, c = map(int, line[3:].split(","))
            da[ln] = c
    assert da[LEAF_LINE] == 90
    assert da[FIB_LINE] == 177
    assert da[MAIN_LINE] == 1
    assert da[FIB_LINE + 1] == 89            # return leaf(n): n < 2
    assert da[FIB_LINE + 2] == 88            # return fib(n-1) + fib(n-2)
    assert da[FIB_LINE + 3] == 177           # the closing brace: every call
    assert "FNDA:177,fib" in text and "FNDA:90,leaf" in text
    # a reader from PyPI agrees
    try:
        from lcov_cobertura import LcovCobertura
    except ImportError:
        if IN_CI:
            pytest.fail("lcov_cobertura missing in CI")
        pytest.skip("lcov_cobertura not installed")
    parsed = LcovCobertura(text, base_dir="/").parse()
    files = {c: v for p in parsed["packages"].values() for c, v in p["classes"].items()}
    f = files[os.path.relpath(src, "/")]
    assert f["lines"][FIB_LINE]["hits"] == "177"
    assert f["lines"][LEAF_LINE]["hits"] == "90"
    assert f["lines-covered"] == f["lines-total"]       # every line ran

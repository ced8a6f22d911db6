"""``hwtrace import`` of LLDB's saved Intel PT traces (``trace save``):
the three real captures of LLDB's test suite (../shared/fixtures/hardware/
lldb_intelpt) import into bundles that decode, through the default path,
to the instructions libipt decodes (live ``ptoracle``: 61,825 + 19,521 on
the two CPUs of the multi-core trace, 21, and 45), whose sideband puts
each CPU's instructions on the thread that ran them, and hostile
trace.json files get one line and exit 2.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import subprocess

import pytest

from conftest import FIXTURES, IN_CI, run_hwtrace

LLDB = FIXTURES / "lldb_intelpt"
pytestmark = pytest.mark.usefixtures("hardware")   # every test reads them
MULTI = LLDB / "intelpt-multi-core-trace"
SINGLE = LLDB / "intelpt-trace"
MULTIFILE = LLDB / "intelpt-trace-multi-file"
THREADS = {3497234, 3497496, 3497497}

# LLDB's own description of the multi-file capture (its test suite's
# multi-file-no-ld.json, with the pre-2022 "traceBuffer" key): the fixture
# directory saves the files only.
MULTIFILE_JSON = {
    "type": "intel-pt",
    "cpuInfo": {"vendor": "GenuineIntel", "family": 6, "model": 79,
                "stepping": 1},
    "processes": [{
        "pid": 815455, "triple": "x86_64-*-linux",
        "threads": [{"tid": 815455, "traceBuffer": "multi-file.trace"}],
        "modules": [
            {"file": "a.out", "systemPath": "a.out", "loadAddress": 4194304,
             "uuid": "D2414468-7112-B7C5-408D-FF07E30D5B17-A5BFD2C4"},
            {"file": "libfoo.so", "systemPath": "libfoo.so",
             "loadAddress": 140737349783552,
             "uuid": "B30FFEDA-8BB2-3D08-4580-C5937ED11E2B-21BE778C"},
            {"file": "libbar.so", "systemPath": "libbar.so",
             "loadAddress": 140737347678208,
             "uuid": "6633B038-EA73-D1A6-FF9A-7D0C0EDF733D-95FEA2CC"}]}]}


def _need_fixture():
    if not (MULTI / "trace.json").is_file():
        if IN_CI:
            pytest.fail("lldb_intelpt fixtures missing in CI")
        pytest.skip("lldb_intelpt fixtures missing")


def _import(src, out):
    r = run_hwtrace("import", src, "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return r.stdout


def _stat(bundle, *extra):
    r = run_hwtrace("decode", "--quiet", "--stat", bundle, *extra)
    assert r.returncode == 0, r.stderr
    counts, errors, stream = {}, {}, None
    for line in r.stdout.splitlines():
        if line.startswith("[stream "):
            stream = line[8:-1]
            errors[stream] = []
        elif line.startswith("insn: "):
            counts[stream] = int(line[6:-1])
        elif line.startswith("["):
            errors[stream].append(line)
    return counts, errors


def _oracle(ptoracle, pt, *args):
    r = subprocess.run([str(ptoracle), "insn", str(pt), *map(str, args)],
                       capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    return (sum(1 for x in lines if "iclass" in x and "error" not in x),
            [(x["offset"], x["error"]) for x in lines if "error" in x])


def _ptxed_errors(errors):
    """[offset, ip: error: msg] lines as (offset, msg)."""
    out = []
    for line in errors:
        where, msg = line[1:-1].split(": error: ")
        out.append((int(where.split(", ")[0], 16), msg))
    return out


@pytest.fixture(scope="module")
def multi_core(tmp_path_factory):
    _need_fixture()
    out = tmp_path_factory.mktemp("lldb") / "multi"
    _import(MULTI / "trace.json", out)
    return out


def test_multi_core_trace_decodes_like_libipt(multi_core, ptoracle):
    counts, errors = _stat(multi_core, "--error-offsets", "2.0")
    assert counts == {"cpu45.pt": 61825, "cpu51.pt": 19521}
    assert sum(counts.values()) == 81346
    for cpu in (45, 51):
        want = _oracle(ptoracle, MULTI / "cores" / f"{cpu}.intelpt_trace",
                       "--elf", MULTI / "modules" / "m.out", "--cpu", "6/85/4")
        assert (counts[f"cpu{cpu}.pt"], _ptxed_errors(errors[f"cpu{cpu}.pt"])) \
            == want
    # the Python twin agrees with the default (compiled) path
    py = run_hwtrace("decode", "--quiet", "--stat", multi_core,
                     env={"HWTRACE_NO_EXTENSIONS": "1"})
    assert py.returncode == 0 and py.stdout == run_hwtrace(
        "decode", "--quiet", "--stat", multi_core).stdout


def test_multi_core_bundle_manifest_and_sideband(multi_core):
    from hwtrace.bundle import Bundle, Mmap, Process, Switch, Thread
    b = Bundle(multi_core)
    m = b.manifest
    assert (m["engine"], m["mode"]) == ("lldb", "cpu")
    assert m["cpu"] == {"vendor": "GenuineIntel", "family": 6, "model": 85,
                        "stepping": 4}
    # perf's TSC rate: 10^9 << timeShift / timeMult
    assert m["tsc_hz"] == (10**9 << 31) // 1076264588
    assert [(s.file, s.cpu, s.size) for s in b.streams] == [
        ("cpu45.pt", 45, 2897), ("cpu51.pt", 51, 5738)]
    # the module's copy, its GNU build-id LLDB's uuid
    assert b.manifest["images"][0]["build_id"] == \
        "AEFB0D59233F80FF6D3C4DED498534CF11017B3B".lower()
    sb = list(b.iter_sideband())
    assert [r for r in sb if isinstance(r, Process)] == [
        Process(pid=3497234, cr3=0, comm="m.out", exe="/tmp/m.out")]
    assert {r.tid for r in sb if isinstance(r, Thread)} == THREADS
    maps = [r for r in sb if isinstance(r, Mmap)]
    assert any(r.start == 0x400000 and r.offset == 0 and "x" in r.prot
               for r in maps)
    sw = [r for r in sb if isinstance(r, Switch)]
    # one Switch per switch: a logged OUT and its IN are one record
    assert {r.cpu for r in sw} == {45, 51} and len(sw) > 100
    assert all(a.time <= b.time for a, b in zip(sw, sw[1:]))
    assert {r.next_tid for r in sw} >= THREADS - {3497234}


class _TimedBlocks:
    """A session sink that notes each block's time stamp (TSC)."""

    needs_offset = False

    def __init__(self):
        self.dec = None
        self.blocks = []

    def block(self, block, offset):
        self.blocks.append((block.ip, block.ninsn, self.dec.time()[0]))

    def insn(self, insn, offset):
        pass

    def event(self, ev, offset):
        pass

    def error(self, kind, offset, ip, code):
        pass

    def status(self, name, offset):
        pass


def test_multi_core_sideband_puts_instructions_on_their_threads(multi_core):
    """Each CPU's instructions, by time stamp, fall where the context
    switches say a thread of the traced process ran: bar's thread on CPU
    45, foo's on CPU 51 (the records' pid/tid in cpu-mode views come from
    these Switch records)."""
    from hwtrace.bundle import Bundle, Switch
    from hwtrace.flow import session
    from hwtrace.flow.block import BlockDecoder
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    from hwtrace.flow.loaders import load_elf
    from hwtrace.pt import cpu as cpumod

    b = Bundle(multi_core)
    image = Image()
    load_elf(image, str(b.find_image("/tmp/m.out")))
    cfg = FlowConfig()
    cfg.errata = cpumod.errata(cpumod.Cpu.parse("6/85"))
    switches = [r for r in b.iter_sideband() if isinstance(r, Switch)]
    ran = {}
    for s in b.streams:
        sw = [r for r in switches if r.cpu == s.cpu]
        times = [r.time for r in sw]
        sink = _TimedBlocks()
        dec = BlockDecoder(b.read_stream(s), image, cfg)
        sink.dec = dec
        session.run_blocks(dec, sink)
        for ip, n, t in sink.blocks:
            i = bisect.bisect_right(times, t) - 1
            assert i >= 0
            key = (s.cpu, sw[i].next_pid, sw[i].next_tid)
            ran[key] = ran.get(key, 0) + n
    assert ran == {(45, 3497234, 3497497): 61825,
                   (51, 3497234, 3497496): 19521}


def test_branch_records_carry_the_trace_threads(multi_core):
    """Every record in the traced program's code carries the thread the
    context switches say ran it: bar's on CPU 45, foo's on CPU 51 (the
    trace is CPU-wide: the few records at other processes' addresses,
    which have no code here, go to whoever the sideband says ran then)."""
    r = run_hwtrace("branches", "--format", "jsonl", "--kinds", "all",
                    multi_core)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(recs) > 1000
    ours = [x for x in recs if "from_sym" in x or "to_sym" in x]
    assert len(ours) >= len(recs) - 4
    by_fn = {}
    for x in ours:
        fn = (x.get("from_sym") or x.get("to_sym")).split("()")[0]
        by_fn.setdefault(fn, set()).add((x["pid"], x["tid"]))
    assert by_fn == {"bar": {(3497234, 3497497)}, "foo": {(3497234, 3497496)}}


def test_call_stacks_carry_the_trace_threads(multi_core, tmp_path):
    """The call stacks of the same CPU streams carry the same threads as
    the branch records: each CPU resynchronizes with status updates only
    (a PSB+ whose FUP says tracing is on, no TIP.PGE), and there, as at a
    TIP.PGE, the sideband says who runs -- the activations were on the
    CPUs' tracks, with no pid/tid, while the records had them."""
    out = tmp_path / "t.json"
    r = run_hwtrace("export", multi_core, "--chrome", out)
    assert r.returncode == 0, r.stderr
    ev = json.loads(out.read_text())["traceEvents"]
    by_fn = {}
    for e in ev:
        if e["ph"] == "X":
            by_fn.setdefault(e["name"].split("()")[0], set()).add((e["pid"], e["tid"]))
    assert by_fn["bar"] == {(3497234, 3497497)}
    assert by_fn["foo"] == {(3497234, 3497496)}


def test_single_thread_trace(tmp_path, ptoracle):
    _need_fixture()
    out = _import(SINGLE / "trace.json", tmp_path / "b")
    assert "thread mode" in out
    counts, errors = _stat(tmp_path / "b")
    assert counts == {"tid3842849.pt": 21} and errors["tid3842849.pt"] == []
    assert _oracle(ptoracle, SINGLE / "3842849.trace", "--elf",
                   SINGLE / "a.out", "--cpu", "6/79/1") == (21, [])
    # the directory works as well as its trace.json
    _import(SINGLE, tmp_path / "c")
    assert _stat(tmp_path / "c")[0] == counts


def test_multi_file_trace(tmp_path, ptoracle):
    _need_fixture()
    d = tmp_path / "saved"
    d.mkdir()
    for f in ("a.out", "libfoo.so", "libbar.so", "multi-file.trace"):
        shutil.copy(MULTIFILE / f, d / f)
    (d / "trace.json").write_text(json.dumps(MULTIFILE_JSON))
    _import(d / "trace.json", tmp_path / "b")
    counts, errors = _stat(tmp_path / "b", "--error-offsets", "2.0")
    want = _oracle(ptoracle, MULTIFILE / "multi-file.trace",
                   "--elf", MULTIFILE / "a.out",
                   "--elf", f"{MULTIFILE / 'libfoo.so'}:0x7ffff7bd9000",
                   "--elf", f"{MULTIFILE / 'libbar.so'}:0x7ffff79d7000",
                   "--cpu", "6/79/1")
    assert want == (45, [(0xe10, "no memory mapped at this address")])
    assert errors["tid815455.pt"] == [
        "[e10, 7ffff7df1950: error: no memory mapped at this address]"]
    assert (counts["tid815455.pt"], _ptxed_errors(errors["tid815455.pt"])) \
        == want


# -- hostile trace.json ------------------------------------------------------

def _saved(tmp_path, desc=None):
    """A copy of the single-thread capture with ``desc`` as trace.json."""
    d = tmp_path / "saved"
    d.mkdir(exist_ok=True)
    for f in ("3842849.trace", "a.out"):
        if not (d / f).exists():
            shutil.copy(SINGLE / f, d / f)
    if desc is not None:
        (d / "trace.json").write_text(desc if isinstance(desc, str)
                                      else json.dumps(desc))
    return d


def _good():
    return json.loads((SINGLE / "trace.json").read_text())


def _fails(src, tmp_path, match):
    r = run_hwtrace("import", src, "-o", tmp_path / "out", timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert match in lines[0], lines[0]
    assert not (tmp_path / "out" / "manifest.json").exists()
    return lines[0]


def _edit(path, value):
    def apply(d):
        *keys, last = path
        for k in keys:
            d = d[k]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value
    return apply


P0 = ("processes", 0)
T0 = P0 + ("threads", 0)
M0 = P0 + ("modules", 0)


@pytest.mark.parametrize("edit,match", [
    (_edit(("type",), "intel-bts"), "type: not \"intel-pt\""),
    (_edit(("type",), KeyError), "type: missing"),
    (_edit(("cpuInfo",), KeyError), "cpuInfo: missing"),
    (_edit(("cpuInfo", "family"), "six"), "family: not a number"),
    (_edit(("cpuInfo", "model"), 4096), "model: out of range"),
    (_edit(("cpuInfo", "stepping"), True), "stepping: not a number"),
    (_edit(("processes",), {"pid": 1}), "processes: not a list"),
    (_edit(P0 + ("pid",), -1), "pid: out of range"),
    (_edit(P0 + ("pid",), 2**70), "pid: out of range"),
    (_edit(P0 + ("threads",), KeyError), "threads: missing"),
    (_edit(T0 + ("tid",), [1]), "tid: not a number"),
    (_edit(T0 + ("iptTrace",), 7), "iptTrace: not a string"),
    (_edit(T0 + ("iptTrace",), "../outside"), "outside the trace directory"),
    (_edit(T0 + ("iptTrace",), "/etc/passwd"), "an absolute path"),
    (_edit(T0 + ("iptTrace",), "missing.trace"), "No such file"),
    (_edit(T0 + ("iptTrace",), "a\0b"), "holds a NUL"),
    (_edit(M0 + ("loadAddress",), "0xzz"), "loadAddress: not a number"),
    (_edit(M0 + ("loadAddress",), "0x1" + "0" * 16), "out of range"),
    (_edit(M0 + ("loadAddress",), 1e30), "loadAddress: not a number"),
    (_edit(M0 + ("file",), "3842849.trace"), "not an ELF file"),
    (_edit(M0 + ("systemPath",), KeyError), "systemPath: missing"),
    (_edit(("cpus",), []), "tscPerfZeroConversion\" is required"),
    (_edit(("kernel",), {"file": "a.out"}), "must be empty with \"kernel\""),
])
def test_hostile_descriptions_are_one_line_errors(tmp_path, edit, match):
    _need_fixture()
    desc = _good()
    edit(desc)
    d = _saved(tmp_path, desc)
    _fails(d / "trace.json", tmp_path, match)


@pytest.mark.parametrize("text,match", [
    ("{", "not JSON"), ("[1, 2]", "trace.json: not an object"),
    ('{"type": "intel-pt"}', "cpuInfo: missing"),
    ("{" * 100000, "JSON"), ("{\"a\": 1e999999}", ""),
])
def test_malformed_json_is_a_one_line_error(tmp_path, text, match):
    _need_fixture()
    d = _saved(tmp_path, text)
    _fails(d / "trace.json", tmp_path, match)


def test_duplicate_threads_and_cpus(tmp_path):
    _need_fixture()
    desc = _good()
    desc["processes"][0]["threads"].append({"tid": 3842849})
    _fails(_saved(tmp_path, desc) / "trace.json", tmp_path, "tid 3842849 twice")
    desc = json.loads((MULTI / "trace.json").read_text())
    desc["cpus"].append(dict(desc["cpus"][0]))
    d = tmp_path / "multi"
    shutil.copytree(MULTI, d)
    os.chmod(d, 0o755)
    os.chmod(d / "trace.json", 0o644)
    (d / "trace.json").write_text(json.dumps(desc))
    _fails(d / "trace.json", tmp_path, "cpu id 45 twice")


def test_symlinks_out_of_the_trace_directory_are_refused(tmp_path):
    _need_fixture()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    d = _saved(tmp_path)
    os.symlink(outside / "secret", d / "link.trace")
    desc = _good()
    desc["processes"][0]["threads"][0]["iptTrace"] = "link.trace"
    (d / "trace.json").write_text(json.dumps(desc))
    _fails(d / "trace.json", tmp_path, "symbolic link")
    os.symlink(outside, d / "sub")
    desc["processes"][0]["threads"][0]["iptTrace"] = "sub/secret"
    (d / "trace.json").write_text(json.dumps(desc))
    _fails(d / "trace.json", tmp_path, "symbolic link")


def test_fifos_do_not_hang(tmp_path):
    _need_fixture()
    d = _saved(tmp_path)
    os.mkfifo(d / "fifo.trace")
    desc = _good()
    desc["processes"][0]["threads"][0]["iptTrace"] = "fifo.trace"
    (d / "trace.json").write_text(json.dumps(desc))
    _fails(d / "trace.json", tmp_path, "not a regular file")
    # a FIFO as the module
    desc = _good()
    desc["processes"][0]["modules"][0]["file"] = "fifo.trace"
    (d / "trace.json").write_text(json.dumps(desc))
    _fails(d / "trace.json", tmp_path, "not a regular file")


def test_bad_context_switch_traces(tmp_path):
    _need_fixture()
    d = tmp_path / "multi"
    shutil.copytree(MULTI, d)
    for p in [d, *d.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    cs = d / "cores" / "45.perf_context_switch_trace"
    good = cs.read_bytes()
    for data, match in ((good[:-4], "runs past the end"),
                        (good[:32] + b"\x0f\0\0\0\0\0\0\0", "record of 0 bytes"),
                        (good[:32] + b"\x0f\0\0\0\0\0\x10\0" + b"\0" * 8,
                         "switch record of 16 bytes"),
                        (good + b"\x01\x02", "truncated record header")):
        cs.write_bytes(data)
        _fails(d / "trace.json", tmp_path, match)
